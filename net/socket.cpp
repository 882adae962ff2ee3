// SPDX-License-Identifier: Apache-2.0
#include "net/socket.h"

#include <unistd.h>

#include <cerrno>

#include "core/driver/epoll_driver.h"
#include "net/internal/ops.h"

namespace spindle::net {

namespace {

// close(2) without the driver: tell the epoll backend the number's file is gone, so no carrier trusts
// what it knew of it (core/driver/epoll_driver.h); a no-op cost on io_uring (one relaxed increment).
void closeRaw(int fd) noexcept {
    spindle::detail::bumpCloseGeneration(fd);
    ::close(fd);
}

}  // namespace

Socket& Socket::operator=(Socket&& o) noexcept {
    if (this != &o) {
        if (fd_ >= 0) { closeRaw(fd_); }
        fd_ = o.release();
    }
    return *this;
}

Socket::~Socket() {
    if (fd_ >= 0) { closeRaw(fd_); }
}

Result<void> Socket::close() noexcept {
    if (fd_ < 0) { return {}; }
    return detail::closeDescriptor(release());
}

Result<SocketAddress> Socket::localAddress() const noexcept { return address(false); }

Result<SocketAddress> Socket::address(bool peer) const noexcept {
    if (fd_ < 0) { return Error{EBADF}; }
    SocketAddress a;
    socklen_t len = SocketAddress::capacity();
    if (auto r = detail::sockName(fd_, peer, a.data(), &len); !r) { return Error{r.errorCode()}; }
    a.setSize(len);
    return a;
}

}  // namespace spindle::net
