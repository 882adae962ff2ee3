#include "net/socket.h"

#include <unistd.h>

#include <cerrno>

#include "net/internal/ops.h"

namespace spindle::net {

Socket& Socket::operator=(Socket&& o) noexcept {
    if (this != &o) {
        if (fd_ >= 0) { ::close(fd_); }
        fd_ = o.release();
    }
    return *this;
}

Socket::~Socket() {
    if (fd_ >= 0) { ::close(fd_); }
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
