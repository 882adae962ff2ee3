// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The echo server and the ping-pong load generator behind spindle-echo, as a library so that tests
/// can run both in one process over loopback.
///
/// EchoServer: one TcpListener per carrier sharing the port with SO_REUSEPORT (the kernel spreads
/// connections, share-nothing), or one listener whose acceptor hands connections round robin to
/// the carriers. Each acceptor is a fiber pinned to its carrier; each connection is a fiber pinned
/// to the carrier that accepted it (or was handed it), which receives into its own buffer and
/// writes back exactly what arrived, with TCP_NODELAY on.
///
/// runClient: opens `connections` streams spread round robin over the runtime's carriers; each is a
/// pinned fiber that sends `messageSize` bytes, reads exactly as many back, checks them byte for
/// byte against what it sent, and records the round trip in its carrier's histogram. Round trips
/// that end inside [start + warmup, start + warmup + duration] are measured; every one is counted
/// in totalMessages (for CPU per message over the whole run).
///
/// Errors: EchoServer::start() returns the errors of TcpListener::bind and Runtime::spawn. The
/// client returns a report in any case; what went wrong on a connection is counted in it by kind
/// (ClientReport::ok() is false when anything was).

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/histogram.h"
#include "base/result.h"
#include "core/fiber.h"
#include "core/runtime.h"
#include "net/address.h"
#include "net/provided_buffers.h"
#include "net/tcp.h"
#include "net/tcp_server.h"

namespace spindle::echo {

struct ServerOptions {
    net::SocketAddress address = net::SocketAddress::ipv4Loopback(7000);  // port 0: the kernel picks one
    bool reusePort = true;        // a listener per carrier (SO_REUSEPORT); false: one listener for all
    size_t bufferSize = 16 * 1024;  // receive buffer per connection
    bool noDelay = true;          // TCP_NODELAY on every accepted connection
    // Echo with one send(2) with MSG_DONTWAIT from the fiber, and go through the ring (writeAll) only for
    // what the socket did not take at once. Saves an SQE, a CQE and a park per message; a full socket
    // costs the failed syscall. false: every send goes through the ring.
    bool inlineSend = false;
    // Echo each multishot receive with a net::PostedSend: the fiber goes back to waiting for the next
    // message without waiting for the send's completion, which the carrier takes without resuming it
    // (one resume per message instead of two). The buffer stays leased until the send has ended.
    // false (or inlineSend, or without multishot receive): every send is waited for.
    bool postedSend = true;
    // Receive with one multishot receive per connection into a ProvidedBufferPool of
    // `providedBuffers` buffers of `providedBufferSize` bytes per carrier (net::MultishotReceiver): an
    // idle connection holds no buffer, and a message costs no receive SQE. false: one receive per
    // message into a `bufferSize` buffer of the connection's own.
    bool multishotRecv = true;
    unsigned providedBuffers = 1024;   // a power of two, 1..32768
    size_t providedBufferSize = 4096;  // 1..1 MiB
};

/// Counters of a server (read racily while it runs; exact after stop()).
struct ServerStats {
    uint64_t accepted = 0;        // connections accepted
    uint64_t closed = 0;          // connection fibers that have ended
    uint64_t bytesEchoed = 0;     // bytes written back
    uint64_t connectionErrors = 0;  // connections that ended on an error other than the peer's close
    uint64_t acceptErrors = 0;    // accept() failures other than the stop itself
    uint64_t ringExhausted = 0;   // multishot receives a carrier's buffer ring ran dry under (ENOBUFS)
};

/// An echo server running on a Runtime's carriers, on net::TcpServer's skeleton.
/// Thread-safety: start(), localAddress() and stats() may be called from any thread or fiber; stop()
/// and the destructor only from a plain thread (they wait for the server's fibers).
/// Lifetime: the Runtime must outlive the server. If the runtime shuts down first, every fiber of the
/// server ends with ECANCELED and stop() only waits for them.
class EchoServer {
public:
    /// Binds the listener(s) and starts one pinned acceptor fiber per carrier.
    /// Errors: EINVAL for a zero bufferSize; bind's (EADDRINUSE, also when another process holds the
    /// port, EACCES, EMFILE, ...); spawn's (ENOMEM, ECANCELED); the buffer pool's.
    [[nodiscard]] static Result<std::unique_ptr<EchoServer>> start(Runtime& runtime, const ServerOptions& options);

    EchoServer(const EchoServer&) = delete;
    EchoServer& operator=(const EchoServer&) = delete;
    /// stop()s when still running.
    ~EchoServer();

    /// The bound address, with the port the kernel chose when the options asked for port 0.
    [[nodiscard]] net::SocketAddress localAddress() const noexcept { return server_->localAddress(); }
    [[nodiscard]] unsigned listenerCount() const noexcept { return server_->listenerCount(); }
    [[nodiscard]] ServerStats stats() const noexcept;

    /// Stops accepting (each acceptor is cancelled and closes its listener), shuts down every open
    /// connection (the peer sees end of stream), and waits until every fiber of the server has ended.
    /// Idempotent. Precondition: called from a plain thread, not a fiber.
    void stop();

private:
    explicit EchoServer(const ServerOptions& options) noexcept;
    void serve(net::TcpConnection& connection) noexcept;

    ServerOptions options_;
    std::unique_ptr<net::ProvidedBufferPool> pool_;  // with multishotRecv; outlives every connection
    std::unique_ptr<net::TcpServer> server_;         // declared after pool_: its connections go first
    std::atomic<uint64_t> bytesEchoed_{0};
    std::atomic<uint64_t> connectionErrors_{0};
};

inline constexpr size_t kMaxMessageSize = 64 * 1024;

struct ClientOptions {
    net::SocketAddress address = net::SocketAddress::ipv4Loopback(7000);
    unsigned connections = 1;
    // Bytes per message, 1 .. kMaxMessageSize. A round trip writes the whole message before reading it
    // back, so a message must fit in the loopback socket buffers the server's echo passes through.
    size_t messageSize = 64;
    std::chrono::nanoseconds warmup{std::chrono::seconds(1)};
    std::chrono::nanoseconds duration{std::chrono::seconds(5)};
    // > 0: each connection makes exactly this many round trips and stops; all of them are measured,
    // warmup and duration are ignored, and the report's seconds is the run's wall time. Tests use it
    // so that what they check does not depend on the machine's speed.
    uint64_t messagesPerConnection = 0;
    std::chrono::milliseconds connectTimeout{5000};
    std::chrono::milliseconds ioTimeout{10000};    // one send or one readExact taking longer is an error
    bool noDelay = true;
};

/// What a client run saw. Latencies in nanoseconds.
struct ClientReport {
    unsigned connections = 0;          // asked for
    unsigned connected = 0;            // connections that were established
    unsigned failedConnections = 0;    // connections that ended on an error (or never connected)
    uint64_t messages = 0;             // round trips completed inside the measured window
    uint64_t totalMessages = 0;        // every round trip completed, warm-up and overrun included
    double seconds = 0;                // the measured window (the whole run with messagesPerConnection)
    size_t messageSize = 0;
    LogLinearHistogram latency;        // ns, round trips of the measured window
    // Errors by kind, one per failed connection.
    uint64_t refused = 0;              // ECONNREFUSED at connect
    uint64_t connectErrors = 0;        // any other connect failure (ETIMEDOUT, EMFILE, ...)
    uint64_t earlyCloses = 0;          // the server closed or reset the stream before the end of the run
    uint64_t mismatches = 0;           // an echoed message differed from the one sent
    uint64_t timeouts = 0;             // a send or receive exceeded ioTimeout
    uint64_t otherErrors = 0;          // anything else (ECANCELED at runtime shutdown, ...)
    std::string firstError;            // the first error seen, in words ("" when none)

    [[nodiscard]] bool ok() const noexcept { return failedConnections == 0 && connected == connections; }
    [[nodiscard]] double messagesPerSecond() const noexcept {
        return seconds > 0 ? static_cast<double>(messages) / seconds : 0.0;
    }
    /// Echoed payload (one direction) in MB (10^6 bytes) per second.
    [[nodiscard]] double megabytesPerSecond() const noexcept {
        return messagesPerSecond() * static_cast<double>(messageSize) / 1e6;
    }
};

/// Runs the load described by `options` on `runtime`'s carriers and waits for it to end: warm-up,
/// then the measured duration; each connection then finishes its round trip in flight and closes.
/// Errors: EINVAL for zero connections, a message size outside 1 .. kMaxMessageSize or a zero duration;
/// spawn's errors. Connection failures are not errors of the call: they are counted in the report.
/// Precondition: called from a plain thread (it joins the client's fibers).
[[nodiscard]] Result<ClientReport> runClient(Runtime& runtime, const ClientOptions& options);

/// One line of `key=value` pairs (the parseable text form of a report), without a newline.
[[nodiscard]] std::string formatReport(const ClientReport& report);
/// The report as one JSON object, without a newline.
[[nodiscard]] std::string formatReportJson(const ClientReport& report);

}  // namespace spindle::echo
