// SPDX-License-Identifier: Apache-2.0
#pragma once
/// net::TcpServer: the skeleton the daemons share (listeners, pinned acceptors, a connection registry,
/// graceful drain), with the per-connection work left to a handler.
///
/// Listening: with listenerPerCarrier (the default) every carrier gets its own listener on the same
/// address and the kernel spreads new connections over them (SO_REUSEPORT, share-nothing accept);
/// otherwise one listener on carrier 0 deals connections out to the carriers in turn. Either way the
/// address is held exclusively unless shareAddress asks otherwise: the first listener binds without
/// SO_REUSEPORT, so a port that any socket holds fails with EADDRINUSE (a second instance of a daemon
/// no longer silently splits the traffic with the first), and only then turns SO_REUSEPORT on for the
/// process's own further listeners. shareAddress binds every listener with SO_REUSEPORT from the
/// start, so that several processes may share the port on purpose.
///
/// Connections: each accepted connection runs `handler(connection)` in a fiber pinned to the carrier
/// that accepted it (or was dealt it), registered in that carrier's list while the handler runs; the
/// stream is closed when the handler returns. A handler marks the times it waits for the next request
/// with TcpConnection::setIdle(), so that the drain can close it without losing work.
///
/// Accept errors: EMFILE and its kin are backed off inside TcpListener; any other error is logged,
/// counted, and retried after a pause that doubles from acceptBackoffMin up to acceptBackoffMax (reset by
/// the next success), so a persistent error never spins a carrier.
///
/// Drain: stop() stops accepting at once (each acceptor closes its listener), shuts down the idle
/// connections (their pending receive sees end of stream), and lets the busy ones finish what they
/// are doing (TcpConnection::draining() is true, so a handler can say it closes) until drainTimeout,
/// after which every connection left is shut down. wait() returns when every connection has ended.
///
/// A handler must not throw (an exception escaping a connection's fiber aborts the process).
/// Errors: start() returns EINVAL for a null handler or a negative timeout, the errno of a listener that
/// could not bind (EADDRINUSE, EACCES, EADDRNOTAVAIL, EMFILE, ...) and spawn's errors (ENOMEM,
/// ECANCELED); a handler's failures are its own. A connection for which no fiber can be made is closed
/// and counted in acceptErrors.
/// Thread-safety: stop(), stats(), localAddress() from any thread or fiber; wait() and the destructor
/// from a plain thread only (they wait for the server's fibers). The Runtime must outlive the server;
/// if it shuts down first, every fiber of the server ends with ECANCELED and wait() only collects them.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/result.h"
#include "core/fiber.h"
#include "core/runtime.h"
#include "net/address.h"
#include "net/tcp.h"

namespace spindle::net {

struct TcpServerOptions {
    SocketAddress address = SocketAddress::ipv4Loopback(0);  // port 0: the kernel picks one
    bool listenerPerCarrier = true;  // one SO_REUSEPORT listener per carrier; false: one listener, dealt round robin
    bool shareAddress = false;       // SO_REUSEPORT from the first bind: other processes may bind the port too
    int backlog = 4096;
    std::string name = "tcp";        // fiber names ("<name>-accept", "<name>-conn") and log lines
    size_t connectionStackSize = 0;  // 0: the runtime's default
    std::chrono::milliseconds acceptBackoffMin{10};
    std::chrono::milliseconds acceptBackoffMax{1000};
    std::chrono::milliseconds drainTimeout{10'000};  // after stop(), how long busy connections may take
};

/// Counters summed over the carriers (read racily; exact after wait()).
struct TcpServerStats {
    uint64_t accepted = 0;      // connections accepted
    uint64_t active = 0;        // connections whose handler has not returned
    uint64_t closed = 0;        // connections whose handler returned and whose stream was closed
    uint64_t acceptErrors = 0;  // accept failures other than the stop itself, and connections without a fiber
    uint64_t drainClosed = 0;   // connections the drain shut down (idle at once, busy after drainTimeout)
};

class TcpServer;

/// What a handler gets: the stream, and the server's view of the connection.
/// Thread-safety: used by the connection's own fiber only.
class TcpConnection {
public:
    [[nodiscard]] TcpStream& stream() noexcept { return stream_; }
    /// Marks the connection as waiting for its next request (true) or working on one (false). The
    /// drain shuts an idle connection down at once; a busy one gets until drainTimeout.
    void setIdle(bool idle) noexcept { idle_ = idle; }
    /// The server is stopping: finish the request in hand and end (say so to the client if the
    /// protocol can).
    [[nodiscard]] bool draining() const noexcept;
    /// The carrier the connection runs on (its fiber is pinned there).
    [[nodiscard]] unsigned carrier() const noexcept { return carrier_; }
    /// The server's number for this connection, unique for the server's life (starts at 1).
    [[nodiscard]] uint64_t id() const noexcept { return id_; }
    [[nodiscard]] TcpServer& server() noexcept { return *server_; }

    TcpConnection(const TcpConnection&) = delete;
    TcpConnection& operator=(const TcpConnection&) = delete;

private:
    friend class TcpServer;
    TcpConnection(TcpServer& server, int fd, unsigned carrier, uint64_t id) noexcept
        : server_(&server), stream_(fd), carrier_(carrier), id_(id) {}

    TcpServer* server_;
    TcpStream stream_;
    unsigned carrier_;
    uint64_t id_;
    bool idle_ = false;
    // Invariant: linked in the carrier's list (Carrier::connections) exactly while the handler runs;
    // touched on that carrier only.
    TcpConnection* prev_ = nullptr;
    TcpConnection* next_ = nullptr;
};

class TcpServer {
public:
    using Handler = std::function<void(TcpConnection&)>;

    /// Binds the listener(s) (see the class comment) and starts one pinned acceptor per carrier.
    /// Errors: see the file comment.
    [[nodiscard]] static Result<std::unique_ptr<TcpServer>> start(Runtime& runtime, const TcpServerOptions& options,
                                                                Handler handler);

    TcpServer(const TcpServer&) = delete;
    TcpServer& operator=(const TcpServer&) = delete;
    /// stop(), then wait().
    ~TcpServer();

    /// The bound address, with the port the kernel chose when the options asked for port 0.
    [[nodiscard]] SocketAddress localAddress() const noexcept { return address_; }
    [[nodiscard]] unsigned listenerCount() const noexcept { return listeners_; }
    [[nodiscard]] TcpServerStats stats() const noexcept;
    [[nodiscard]] bool draining() const noexcept { return draining_.load(std::memory_order_relaxed); }
    [[nodiscard]] Runtime& runtime() noexcept { return runtime_; }

    /// Begins the drain described in the file comment and returns at once. Idempotent.
    void stop() noexcept;
    /// Blocks until stop() is called (by anyone) and every fiber of the server has ended. Only the first
    /// caller waits for the fibers; a later (or concurrent) one returns once stop() was called.
    /// Precondition: a plain thread, not a fiber of the runtime.
    void wait() noexcept;

private:
    struct alignas(64) Carrier {
        TcpListener listener;  // open only on carriers that accept
        bool accepts = false;
        TcpConnection* connections = nullptr;
        std::atomic<uint64_t> accepted{0};
        std::atomic<uint64_t> active{0};
        std::atomic<uint64_t> closed{0};
        std::atomic<uint64_t> acceptErrors{0};
        std::atomic<uint64_t> drainClosed{0};
    };

    TcpServer(Runtime& runtime, const TcpServerOptions& options, Handler handler);
    void acceptLoop(unsigned carrier) noexcept;
    void drain(Carrier& c) noexcept;
    void spawnConnection(unsigned carrier, int fd) noexcept;
    void runConnection(unsigned carrier, int fd, uint64_t id) noexcept;
    void connectionEnded() noexcept;

    Runtime& runtime_;
    TcpServerOptions options_;
    Handler handler_;
    SocketAddress address_;
    unsigned listeners_ = 0;
    std::vector<std::unique_ptr<Carrier>> carriers_;
    std::vector<FiberHandle<void>> acceptors_;
    std::atomic<bool> draining_{false};
    std::atomic<uint64_t> nextId_{1};
    std::atomic<unsigned> nextCarrier_{0};  // round robin with one listener

    // Invariant: live_ counts the connection fibers spawned and not yet finished, under mutex_; wait()
    // sleeps on drained_ until stopped_, then until live_ reaches 0 after the acceptors were joined.
    std::mutex mutex_;
    std::condition_variable drained_;
    uint64_t live_ = 0;
    bool stopped_ = false;  // under mutex_
    bool waited_ = false;   // under mutex_
};

}  // namespace spindle::net
