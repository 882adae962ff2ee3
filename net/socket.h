// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Socket: the descriptor that TcpStream and UdpSocket own, and what they share (close, addresses).
///
/// Move-only; the destructor closes the descriptor with close(2) when close() was not called.
/// Errors: EBADF from every call on a closed or moved-from socket.

#include "base/result.h"
#include "net/address.h"

namespace spindle::net {

class Socket {
public:
    Socket() noexcept = default;
    /// Adopts `fd`.
    explicit Socket(int fd) noexcept : fd_(fd) {}
    Socket(Socket&& o) noexcept : fd_(o.release()) {}
    /// Closes the descriptor held, then takes `o`'s.
    Socket& operator=(Socket&& o) noexcept;
    Socket(const Socket&) = delete;
    Socket& operator=(const Socket&) = delete;
    ~Socket();

    /// Closes the descriptor through the ring (with close(2) where the ring refuses the call: during
    /// runtime shutdown, or while a cancellation is pending), so it never leaks. Idempotent: a closed
    /// socket returns ok.
    Result<void> close() noexcept;
    /// getsockname(2).
    [[nodiscard]] Result<SocketAddress> localAddress() const noexcept;
    [[nodiscard]] int fd() const noexcept { return fd_; }
    [[nodiscard]] bool isOpen() const noexcept { return fd_ >= 0; }
    /// Gives up ownership of the descriptor.
    int release() noexcept {
        const int fd = fd_;
        fd_ = -1;
        return fd;
    }

protected:
    /// getsockname(2) or, with `peer`, getpeername(2).
    [[nodiscard]] Result<SocketAddress> address(bool peer) const noexcept;
    int fd_ = -1;
};

}  // namespace spindle::net
