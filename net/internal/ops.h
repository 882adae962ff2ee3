// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The socket operations net/ submits through the carrier's driver, shared by TcpStream, TcpListener and UdpSocket.

#include <sys/socket.h>

#include <cstddef>
#include <cstdint>

#include "base/result.h"
#include "core/deadline.h"
#include "core/ring_ops.h"

namespace spindle::net::detail {

inline constexpr size_t kMaxIo = 0x7ffff000;  // what one read(2)/send(2) moves at most

inline Result<size_t> sizeOrError(int32_t res) noexcept {
    if (res < 0) { return Error{-res}; }
    return static_cast<size_t>(res);
}

/// recv(2) (`flags` as for recv) through the ring.
Result<size_t> recv(int fd, void* buf, size_t len, int flags, Deadline deadline) noexcept;
/// send(2) through the ring; MSG_NOSIGNAL is always added.
Result<size_t> send(int fd, const void* buf, size_t len, int flags, Deadline deadline) noexcept;
/// sendmsg(2)/recvmsg(2) through the ring; sendmsg adds MSG_NOSIGNAL.
Result<size_t> sendmsg(int fd, const msghdr* msg, int flags, Deadline deadline) noexcept;
Result<size_t> recvmsg(int fd, msghdr* msg, int flags, Deadline deadline) noexcept;
/// One IORING_OP_ACCEPT (SOCK_CLOEXEC); `addr`/`len` may be null.
Result<int> accept(int fd, sockaddr* addr, socklen_t* len, Deadline deadline) noexcept;
Result<void> connect(int fd, const sockaddr* addr, socklen_t len, Deadline deadline) noexcept;
Result<void> shutdown(int fd, int how, Deadline deadline) noexcept;
/// Closes `fd` through the ring; where the ring refuses the call (ECANCELED: runtime shutdown, or a
/// cancellation the fiber has not acknowledged) with close(2) instead, so the descriptor never leaks.
/// Errors: the kernel's close errors (EIO, say); the descriptor is gone either way.
Result<void> closeDescriptor(int fd) noexcept;
/// socket(2) with SOCK_CLOEXEC.
Result<int> openSocket(int family, int type) noexcept;
Result<void> setIntOption(int fd, int level, int name, int value) noexcept;
/// getsockname/getpeername into a SocketAddress-shaped buffer.
Result<void> sockName(int fd, bool peer, sockaddr* addr, socklen_t* len) noexcept;
/// Sleeps for `d` (a fiber: cancellable; a thread: nanosleep), but not past `deadline`.
/// Errors: ETIMEDOUT when the deadline came first, ECANCELED.
Result<void> backoffSleep(uint64_t ns, Deadline deadline) noexcept;

}  // namespace spindle::net::detail
