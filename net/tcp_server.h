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
/// Keep-alive waits and parking: a handler that waits between requests with no deadline of its own
/// brackets the wait with TcpConnection::beginIdleWait() / endIdleWait(). Each carrier's idle sweep
/// (a pinned fiber "<name>-idle", started when idleTimeout, idleRelease or carrierTick asks for one)
/// shuts down a connection whose idle wait has lasted idleTimeout (its receive sees end of stream;
/// counted in idleTimeouts), and asks one whose wait has lasted idleRelease to park: it cancels the
/// connection's fiber, whose receive ends with ECANCELED; the handler learns why from
/// takeParkRequest(), and then either calls park() and returns, or refusePark() and waits on. A parked
/// connection has no fiber and no handler state: the server keeps a record of some 230 bytes in the
/// carrier's list with one poll for input armed on the socket. Input, the end of the stream or an error
/// starts a fiber again, pinned to the same carrier, which calls the handler anew with
/// TcpConnection::resumed() true; the handler finds the bytes in the socket. The idle sweep still
/// closes a parked connection after idleTimeout, and the drain closes parked connections at once
/// (without a fiber: they are idle). After a burst of parks (kTrimAfterParks or more, then a sweep
/// with none) the sweep calls malloc_trim(3), so that the handlers' freed state leaves the resident
/// set (glibc keeps freed chunks below a live one).
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
/// Errors: start() returns EINVAL for a null handler or a negative timeout, ENOMEM/ECANCELED when a
/// carrier's idle sweep cannot be spawned, the errno of a listener that
/// could not bind (EADDRINUSE, EACCES, EADDRNOTAVAIL, EMFILE, ...) and spawn's errors (ENOMEM,
/// ECANCELED); a handler's failures are its own. A connection for which no fiber can be made is closed
/// and counted in acceptErrors. A park that cannot be made (no memory for the record, a poll the
/// driver refuses because input is there already) is not an error: the handler is called again at
/// once on the same fiber, with resumed() true. A parked connection for which no fiber can be made when
/// its input comes is closed and counted in closed.
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

namespace spindle {
struct MultishotCompletion;
}

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
    // An idle wait (TcpConnection::beginIdleWait) this long is ended by shutting the connection down;
    // 0: never. The sweep runs every idleTimeout / 8 (1 ms to 1 s), so up to that much later.
    std::chrono::milliseconds idleTimeout{0};
    // An idle wait this long is asked to park (see the file comment); 0: never. The sweep then runs at
    // least every idleRelease / 2.
    std::chrono::milliseconds idleRelease{0};
    // Per-carrier housekeeping, called on each carrier's idle sweep after every pass, and once more at
    // the end of the carrier's drain, when its last connection has ended (final = true). Must not
    // throw. Empty: none.
    std::function<void(unsigned carrier, bool final)> carrierTick;
};

/// Counters summed over the carriers (read racily; exact after wait()).
struct TcpServerStats {
    uint64_t accepted = 0;      // connections accepted
    uint64_t active = 0;        // connections open: a handler runs or the connection is parked
    uint64_t closed = 0;        // connections whose handler returned and whose stream was closed
    uint64_t acceptErrors = 0;  // accept failures other than the stop itself, and connections without a fiber
    uint64_t drainClosed = 0;   // connections the drain shut down (idle at once, busy after drainTimeout)
    uint64_t idleTimeouts = 0;  // idle waits the sweep ended after idleTimeout
    uint64_t parked = 0;        // connections parked now (no fiber)
    uint64_t parks = 0;         // times a connection parked
};

namespace detail {
/// A connection as its carrier's list sees it: in the TcpConnection while a handler runs, in the
/// server's parked record while it is parked.
/// Invariant: linked in exactly one carrier's list while the connection is open; read and written on
/// that carrier only.
struct TcpConnectionNode {
    TcpConnectionNode* prev = nullptr;
    TcpConnectionNode* next = nullptr;
    spindle::detail::Fiber* fiber = nullptr;  // the handler's fiber; null when parked
    uint64_t idleSinceNs = 0;                 // CLOCK_MONOTONIC_COARSE when the idle wait began
    int fd = -1;
    uint32_t carrier = 0;         // the carrier whose list holds it (in the padding: a parked record stays small)
    bool idle = false;            // the drain may close it at once
    bool idleWait = false;        // in an idle wait: what the sweep looks at
    bool timedOut = false;        // the sweep or the drain shut it down (counted once)
    bool parkAsked = false;       // the sweep cancelled the fiber to ask for a park
    bool parkRefused = false;     // the handler cannot park in this idle wait: ask no more
};
}  // namespace detail

class TcpServer;

/// What a handler gets: the stream, and the server's view of the connection.
/// Thread-safety: used by the connection's own fiber only.
class TcpConnection {
public:
    [[nodiscard]] TcpStream& stream() noexcept { return stream_; }
    /// Marks the connection as waiting for its next request (true) or working on one (false). The
    /// drain shuts an idle connection down at once; a busy one gets until drainTimeout.
    void setIdle(bool idle) noexcept { node_.idle = idle; }
    /// Begins a wait for the next request with no deadline of the handler's own: the connection is idle
    /// (setIdle(true)), the sweep closes it after idleTimeout and asks it to park after idleRelease
    /// (see the file comment). Cost: a coarse clock read.
    void beginIdleWait() noexcept;
    /// Ends the idle wait (input came, or the wait failed): setIdle(false), and the sweep leaves it be.
    void endIdleWait() noexcept {
        node_.idle = false;
        node_.idleWait = false;
    }
    /// For a receive of the idle wait that ended (typically with ECANCELED): whether the sweep cancelled
    /// the fiber to ask for a park. When true the cancellation is acknowledged here, so that the fiber's
    /// calls work again, and the handler either parks (park(), then return) or calls refusePark() and
    /// waits on. A receive that completed before the cancel keeps its bytes; the handler serves them.
    [[nodiscard]] bool takeParkRequest() noexcept;
    /// The handler cannot park in this idle wait (its receive holds state the park would lose): the
    /// sweep asks no more until the next beginIdleWait().
    void refusePark() noexcept { node_.parkRefused = true; }
    /// Asks the server to keep the connection open without a fiber once the handler returns, until the
    /// socket is readable; then the handler is called again on a new fiber, with resumed() true.
    /// Precondition: the handler keeps no state the next call needs (bytes read and not served, a
    /// receive armed on the stream), and leaves the stream open. While the server drains, the
    /// connection is closed instead. The idle timeout goes on counting from the start of the idle
    /// wait (from the park, without one).
    void park() noexcept { parkRequested_ = true; }
    /// Whether this call of the handler follows a park (the connection is not new).
    [[nodiscard]] bool resumed() const noexcept { return resumed_; }
    /// The server is stopping: finish the request in hand and end (say so to the client if the
    /// protocol can).
    [[nodiscard]] bool draining() const noexcept;
    /// The carrier the connection runs on (its fiber is pinned there).
    [[nodiscard]] unsigned carrier() const noexcept { return node_.carrier; }
    /// The server's number for this connection, unique for the server's life (starts at 1).
    [[nodiscard]] uint64_t id() const noexcept { return id_; }
    [[nodiscard]] TcpServer& server() noexcept { return *server_; }

    TcpConnection(const TcpConnection&) = delete;
    TcpConnection& operator=(const TcpConnection&) = delete;

private:
    friend class TcpServer;
    TcpConnection(TcpServer& server, int fd, unsigned carrier, uint64_t id) noexcept
        : server_(&server), stream_(fd), id_(id) {
        node_.fd = fd;
        node_.carrier = carrier;
    }

    TcpServer* server_;
    TcpStream stream_;
    uint64_t id_;
    bool resumed_ = false;
    bool parkRequested_ = false;
    // Invariant: linked in the carrier's list (Carrier::connections) exactly while the handler runs.
    detail::TcpConnectionNode node_;
};

class TcpServer {
public:
    using Handler = std::function<void(TcpConnection&)>;
    /// Parks in a burst before the sweep trims the heap (see the file comment).
    static constexpr uint64_t kTrimAfterParks = 256;

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
    struct Parked;
    struct alignas(64) Carrier {
        TcpListener listener;  // open only on carriers that accept
        bool accepts = false;
        detail::TcpConnectionNode* connections = nullptr;  // running handlers and parked connections
        FiberHandle<void> sweeper;                          // the idle sweep, when one runs
        std::atomic<uint64_t> accepted{0};
        std::atomic<uint64_t> active{0};
        std::atomic<uint64_t> closed{0};
        std::atomic<uint64_t> acceptErrors{0};
        std::atomic<uint64_t> drainClosed{0};
        std::atomic<uint64_t> idleTimeouts{0};
        std::atomic<uint64_t> parked{0};
        std::atomic<uint64_t> parks{0};

        void link(detail::TcpConnectionNode* n) noexcept;
        void unlink(detail::TcpConnectionNode* n) noexcept;
    };

    TcpServer(Runtime& runtime, const TcpServerOptions& options, Handler handler);
    void acceptLoop(unsigned carrier) noexcept;
    void sweepLoop(unsigned carrier) noexcept;
    void drain(unsigned carrier) noexcept;
    void spawnConnection(unsigned carrier, int fd, uint64_t id, bool resumed) noexcept;
    void runConnection(unsigned carrier, int fd, uint64_t id, bool resumed) noexcept;
    bool park(Carrier& c, TcpConnection& conn) noexcept;
    static void onParkedReady(MultishotCompletion* done, int32_t res, uint32_t flags) noexcept;
    void closeWithoutFiber(Carrier& c, int fd) noexcept;
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

// Inline: a handler asks once per request.
inline bool TcpConnection::draining() const noexcept { return server_->draining(); }

}  // namespace spindle::net
