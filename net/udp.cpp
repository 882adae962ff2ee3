// SPDX-License-Identifier: Apache-2.0
#include "net/udp.h"

#include <unistd.h>

#include <cerrno>

#include "core/io.h"
#include "net/internal/ops.h"

namespace spindle::net {

Result<UdpSocket> UdpSocket::open(int family) noexcept {
    if (family != AF_INET && family != AF_INET6) { return Error{EAFNOSUPPORT}; }
    auto fd = detail::openSocket(family, SOCK_DGRAM);
    if (!fd) { return Error{fd.errorCode()}; }
    return UdpSocket(*fd);
}

Result<UdpSocket> UdpSocket::bind(const SocketAddress& address, bool reusePort) noexcept {
    if (!address.isIp()) { return Error{EINVAL}; }
    auto s = open(address.family());
    if (!s) { return s; }
    if (reusePort) {
        if (auto r = detail::setIntOption(s->fd(), SOL_SOCKET, SO_REUSEPORT, 1); !r) { return Error{r.errorCode()}; }
    }
    if (::bind(s->fd(), address.data(), address.size()) != 0) { return Error{errno}; }
    return s;
}

Result<void> UdpSocket::connect(const SocketAddress& peer) noexcept {
    if (fd_ < 0) { return Error{EBADF}; }
    if (::connect(fd_, peer.data(), peer.size()) != 0) { return Error{errno}; }
    return {};
}

Result<size_t> UdpSocket::sendTo(const void* buf, size_t len, const SocketAddress& to, Deadline deadline) noexcept {
    if (fd_ < 0) { return Error{EBADF}; }
    iovec iov{const_cast<void*>(buf), len};
    msghdr msg{};
    msg.msg_name = const_cast<sockaddr*>(to.data());
    msg.msg_namelen = to.size();
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    return detail::sendmsg(fd_, &msg, 0, deadline);
}

Result<size_t> UdpSocket::recvFrom(void* buf, size_t len, SocketAddress* from, Deadline deadline) noexcept {
    if (fd_ < 0) { return Error{EBADF}; }
    iovec iov{buf, len};
    msghdr msg{};
    SocketAddress source;
    msg.msg_name = source.data();
    msg.msg_namelen = SocketAddress::capacity();
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    auto r = detail::recvmsg(fd_, &msg, 0, deadline);
    if (r && from != nullptr) {
        source.setSize(msg.msg_namelen);
        *from = source;
    }
    return r;
}

Result<size_t> UdpSocket::send(const void* buf, size_t len, Deadline deadline) noexcept {
    if (fd_ < 0) { return Error{EBADF}; }
    return detail::send(fd_, buf, len, 0, deadline);
}

Result<size_t> UdpSocket::recv(void* buf, size_t len, Deadline deadline) noexcept {
    if (fd_ < 0) { return Error{EBADF}; }
    return detail::recv(fd_, buf, len, 0, deadline);
}

Result<size_t> UdpSocket::sendMsg(const msghdr* msg, int flags, Deadline deadline) noexcept {
    if (fd_ < 0) { return Error{EBADF}; }
    if (msg == nullptr) { return Error{EFAULT}; }
    return detail::sendmsg(fd_, msg, flags, deadline);
}

Result<size_t> UdpSocket::recvMsg(msghdr* msg, int flags, Deadline deadline) noexcept {
    if (fd_ < 0) { return Error{EBADF}; }
    if (msg == nullptr) { return Error{EFAULT}; }
    return detail::recvmsg(fd_, msg, flags, deadline);
}

}  // namespace spindle::net
