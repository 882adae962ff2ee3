// SPDX-License-Identifier: Apache-2.0
#pragma once
/// UdpSocket: datagrams on the carrier's io_uring ring.
///
/// Calls block the fiber (or, off-fiber, the thread) as TcpStream's do, take a Deadline last and
/// honour FiberHandle::cancel(). Datagram semantics: a receive takes one datagram; a buffer too
/// small for it truncates it (recvmsg reports MSG_TRUNC in msg_flags), and the rest is lost, as
/// with recvfrom(2).
/// Errors: the kernel's errno (EMSGSIZE for a datagram over the path MTU with DF, ECONNREFUSED
/// after an ICMP port unreachable on a connected socket, EAFNOSUPPORT for a destination of
/// another family), ETIMEDOUT, ECANCELED, EBADF after close(). Sends carry MSG_NOSIGNAL.
/// Thread-safety: one fiber receiving and one sending at a time.

#include <sys/socket.h>

#include <cstddef>

#include "base/result.h"
#include "core/deadline.h"
#include "net/address.h"
#include "net/socket.h"

namespace spindle::net {

/// Owns its descriptor as a Socket (net/socket.h: close(), localAddress(), fd(), release()).
class UdpSocket : public Socket {
public:
    UdpSocket() noexcept = default;
    explicit UdpSocket(int fd) noexcept : Socket(fd) {}

    /// A socket bound to `address` (port 0: the kernel picks; see localAddress()). `reusePort`
    /// sets SO_REUSEPORT. Errors: EADDRINUSE, EACCES, EINVAL (AF_UNSPEC or a Unix address).
    [[nodiscard]] static Result<UdpSocket> bind(const SocketAddress& address, bool reusePort = false) noexcept;
    /// An unbound socket of `family` (AF_INET or AF_INET6). Errors: EAFNOSUPPORT.
    [[nodiscard]] static Result<UdpSocket> open(int family) noexcept;

    /// Sets the default destination (and filters what arrives to it); connect(2), synchronous.
    [[nodiscard]] Result<void> connect(const SocketAddress& peer) noexcept;

    /// One datagram to `to`; returns the bytes sent (all, for UDP).
    [[nodiscard]] Result<size_t> sendTo(const void* buf, size_t len, const SocketAddress& to, Deadline deadline = {}) noexcept;
    /// One datagram; `from`, when given, receives its source. Returns its length, at most `len`.
    [[nodiscard]] Result<size_t> recvFrom(void* buf, size_t len, SocketAddress* from = nullptr, Deadline deadline = {}) noexcept;
    /// To the connected peer.
    [[nodiscard]] Result<size_t> send(const void* buf, size_t len, Deadline deadline = {}) noexcept;
    [[nodiscard]] Result<size_t> recv(void* buf, size_t len, Deadline deadline = {}) noexcept;
    /// sendmsg(2)/recvmsg(2) through the ring; `msg` (and what it points to) must stay valid until
    /// the call returns. MSG_NOSIGNAL is added to send flags.
    [[nodiscard]] Result<size_t> sendMsg(const msghdr* msg, int flags = 0, Deadline deadline = {}) noexcept;
    [[nodiscard]] Result<size_t> recvMsg(msghdr* msg, int flags = 0, Deadline deadline = {}) noexcept;
};

}  // namespace spindle::net
