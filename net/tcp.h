// SPDX-License-Identifier: Apache-2.0
#pragma once
/// TCP on the carrier's io_uring ring: TcpListener accepts, TcpStream carries bytes.
///
/// Every call that can block is a fiber-blocking call of core/io.h's kind: it fills an SQE,
/// parks the fiber, and returns when the CQE arrived; from a plain thread it runs on that
/// thread's private ring. Each takes a Deadline last (ETIMEDOUT when it expired; an operation
/// that completed first keeps its result, so no byte is lost) and honours
/// FiberHandle::cancel() (ECANCELED). Shutdown of the runtime makes them return ECANCELED.
///
/// Errors: a Result carrying the kernel's errno: ECONNREFUSED, ECONNRESET (peer reset),
/// EPIPE (writing after the peer closed: an error, never SIGPIPE: sends carry MSG_NOSIGNAL),
/// ETIMEDOUT, ECANCELED, EBADF (a closed object), ENOTCONN. Nothing throws.
/// Thread-safety: one object may be used by one fiber at a time, except that one fiber may
/// receive while another sends on the same TcpStream. close() must not race another call.
/// Ownership: each object owns its descriptor and closes it in its destructor (synchronously,
/// close(2), when close() was not called).

#include <sys/socket.h>
#include <sys/uio.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "base/result.h"
#include "core/deadline.h"
#include "net/address.h"
#include "net/socket.h"

namespace spindle::net {

class TcpStream;

struct ListenOptions {
    int backlog = 4096;          // listen(2)'s backlog (the kernel caps it at net.core.somaxconn)
    bool reuseAddress = true;    // SO_REUSEADDR: rebind at once after a restart
    bool reusePort = false;      // SO_REUSEPORT: several listeners (one per carrier) share the port and
                                 // the kernel spreads connections across them (share-nothing accept)
    bool reusePortAfterBind = false; // bind without SO_REUSEPORT (a port any socket holds fails with
                                 // EADDRINUSE), then set it before listen(2) so that this process's further
                                 // reusePort listeners can join (net::TcpServer's exclusive first listener)
    bool v6Only = false;         // IPV6_V6ONLY for an IPv6 address (false: also accepts IPv4)
    bool multishot = true;       // IORING_ACCEPT_MULTISHOT (5.19) where the kernel has it; else one-shot
    // EMFILE/ENFILE/ENOBUFS/ENOMEM from accept: the listener sleeps (doubling from min to max) and
    // retries, instead of spinning on a ready socket or failing; each backoff is counted and the first
    // of a run is logged.
    std::chrono::milliseconds backoffMin{1};
    std::chrono::milliseconds backoffMax{200};
};

/// Counters of one listener (read racily).
struct ListenerStats {
    uint64_t accepted = 0;         // connections handed to accept()'s callers
    uint64_t multishotArms = 0;    // multishot accepts armed (1 while it keeps running; more after errors)
    uint64_t resourceBackoffs = 0; // sleeps after EMFILE, ENFILE, ENOBUFS or ENOMEM
};

/// A listening TCP (or Unix stream) socket.
/// Accept: with multishot, the first accept() arms one IORING_OP_ACCEPT on the caller's carrier
/// that keeps producing connections; they queue in the listener until accept() takes them, from
/// any fiber or thread. The queue is unbounded (the kernel's backlog would otherwise hold them).
class TcpListener {
public:
    TcpListener() noexcept;
    TcpListener(TcpListener&&) noexcept;
    TcpListener& operator=(TcpListener&&) noexcept;
    ~TcpListener();

    /// socket + options + bind + listen. Port 0 picks a free port (see localAddress()).
    /// Errors: EADDRINUSE, EACCES, EAFNOSUPPORT, EINVAL (AF_UNSPEC), EMFILE, as the kernel gives them.
    [[nodiscard]] static Result<TcpListener> bind(const SocketAddress& address, const ListenOptions& options = {}) noexcept;

    /// The next connection. `peer`, when given, receives the peer's address.
    /// Errors: ETIMEDOUT, ECANCELED, EBADF after close(); EMFILE and its kin are not returned but
    /// backed off (see ListenOptions) until the deadline.
    [[nodiscard]] Result<TcpStream> accept(SocketAddress* peer = nullptr, Deadline deadline = {}) noexcept;
    [[nodiscard]] Result<TcpStream> accept(Deadline deadline) noexcept;

    /// The bound address (with the port the kernel chose for port 0).
    [[nodiscard]] SocketAddress localAddress() const noexcept;
    [[nodiscard]] int fd() const noexcept;
    [[nodiscard]] bool isOpen() const noexcept;
    [[nodiscard]] ListenerStats stats() const noexcept;

    /// Stops accepting: a running multishot accept is ended (and awaited), queued connections are
    /// closed, and the descriptor is closed. Idempotent. An accept() blocked in another fiber
    /// returns EBADF.
    void close() noexcept;

    struct State;  // shared with the multishot completion; defined in tcp.cpp
private:
    explicit TcpListener(std::unique_ptr<State> state) noexcept;
    std::unique_ptr<State> state_;
};

struct KeepAlive {
    std::chrono::seconds idle{60};     // TCP_KEEPIDLE
    std::chrono::seconds interval{10}; // TCP_KEEPINTVL
    int count = 6;                     // TCP_KEEPCNT
};

/// A connected stream socket (TCP, or Unix stream from a Unix listener).
/// Owns its descriptor as a Socket (net/socket.h: close(), localAddress(), fd(), release()).
class TcpStream : public Socket {
public:
    TcpStream() noexcept = default;
    /// Adopts a connected stream socket descriptor.
    explicit TcpStream(int fd) noexcept : Socket(fd) {}

    /// socket + IORING_OP_CONNECT. Errors: ECONNREFUSED, ENETUNREACH, ETIMEDOUT, ECANCELED, EMFILE.
    [[nodiscard]] static Result<TcpStream> connect(const SocketAddress& address, Deadline deadline = {}) noexcept;

    /// Up to `len` bytes; 0 means the peer shut down its side (end of stream).
    [[nodiscard]] Result<size_t> recv(void* buf, size_t len, Deadline deadline = {}) noexcept;
    /// Up to `len` bytes sent (a short count is possible for a large buffer). `flags`: send(2)'s, added
    /// to MSG_NOSIGNAL (MSG_MORE: more follows at once, so the kernel holds a partial segment back
    /// until the next send, splice or a push, even with TCP_NODELAY).
    [[nodiscard]] Result<size_t> send(const void* buf, size_t len, Deadline deadline = {}, int flags = 0) noexcept;
    /// Gathers `iovcnt` buffers into one sendmsg (MSG_NOSIGNAL). Errors: EINVAL for iovcnt out of 1..IOV_MAX.
    [[nodiscard]] Result<size_t> writev(const iovec* iov, int iovcnt, Deadline deadline = {}) noexcept;

    /// Exactly `len` bytes, or an error: ENODATA when the stream ends first (`*got`, when given,
    /// says how many bytes arrived before the error).
    [[nodiscard]] Result<void> readExact(void* buf, size_t len, Deadline deadline = {}, size_t* got = nullptr) noexcept;
    /// All `len` bytes, resending after short sends. `*sent`, when given, counts what left. `flags` as
    /// for send(), on every send.
    [[nodiscard]] Result<void> writeAll(const void* buf, size_t len, Deadline deadline = {}, size_t* sent = nullptr,
                                        int flags = 0) noexcept;
    /// writeAll() with a limit on waiting rather than a deadline: the time starts when the socket first
    /// has no room (ETIMEDOUT once it has had none for `timeout`, as SO_SNDTIMEO counts). What fits at
    /// once is sent without reading the clock, which a Deadline built from a timeout does on every call
    /// (two clock reads per small response: 0.7 % of its CPU on the epoll backend).
    [[nodiscard]] Result<void> writeAllWithin(const void* buf, size_t len, std::chrono::nanoseconds timeout,
                                              size_t* sent = nullptr, int flags = 0) noexcept;
    /// All bytes of `iov[0..iovcnt)`; advances through `iov` (which it modifies) after short sends.
    [[nodiscard]] Result<void> writevAll(iovec* iov, int iovcnt, Deadline deadline = {}) noexcept;

    /// shutdown(2) through the ring: SHUT_WR sends FIN and leaves receiving open (half-close).
    [[nodiscard]] Result<void> shutdown(int how = SHUT_WR, Deadline deadline = {}) noexcept;

    [[nodiscard]] Result<void> setNoDelay(bool on = true) noexcept;
    /// SO_KEEPALIVE, with the probe timings when enabling.
    [[nodiscard]] Result<void> setKeepAlive(bool on, const KeepAlive& timings = {}) noexcept;
    /// SO_LINGER with a zero timeout: close() then sends RST instead of FIN (tests, load shedding).
    [[nodiscard]] Result<void> setResetOnClose() noexcept;

    [[nodiscard]] Result<SocketAddress> peerAddress() const noexcept { return address(true); }
};

}  // namespace spindle::net
