// SPDX-License-Identifier: Apache-2.0
#include "net/internal/ops.h"

#include <netinet/in.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <thread>

#include "core/fiber.h"
#include "core/io.h"

namespace spindle::net::detail {
namespace {

// How a send goes out:
// - One send(2) with MSG_DONTWAIT straight away when carrierSendsInline() says so: on the epoll
//   backend always (its driver would make the same call, after more bookkeeping); on io_uring when
//   the fiber is all its carrier has to do (carrierOtherwiseIdle), since through the ring it would cost
//   the carrier an io_uring_enter all the same, plus a park, a CQE and a resume. With other fibers
//   ready or SQEs queued, the ring batches it with them.
// - A send with a deadline tries first without one, with MSG_DONTWAIT: a socket with room in its
//   send buffer (nearly always) completes it at once, and the linked timeout (an extra SQE, a timer
//   armed and cancelled, its own CQE awaited) is paid only when the kernel answers EAGAIN.
// The direct calls are raw system calls: the descriptor may come from an accept on the ring, which
// ThreadSanitizer's interceptors cannot see.
int32_t sendOp(op::Op o, Deadline deadline) noexcept {
    const bool dontWait = (o.opFlags & MSG_DONTWAIT) != 0;
    if (carrierSendsInline()) {
        if (this_fiber::cancellationRequested()) { return -ECANCELED; }
        if (deadline.expired()) { return -ETIMEDOUT; }
        const long n = o.code == op::Code::kSend
                           ? ::syscall(SYS_sendto, o.fd, o.addr, o.len, o.opFlags | MSG_DONTWAIT, nullptr, 0)
                           : ::syscall(SYS_sendmsg, o.fd, o.addr, o.opFlags | MSG_DONTWAIT);
        if (n >= 0) {  // all of it, or what the socket took
            afterInlineSend();
            return static_cast<int32_t>(n);
        }
        if (errno != EAGAIN && errno != EINTR) { return -errno; }
        if (dontWait && errno == EAGAIN) { return -EAGAIN; }  // asked not to wait
        return submitOp(o, deadline).res;  // full: the driver waits for room
    }
    if (dontWait) { return submitOp(o, deadline).res; }
    if (deadline.isSet()) {
        if (deadline.expired()) { return -ETIMEDOUT; }
        op::Op now = o;
        now.opFlags |= MSG_DONTWAIT;
        const int32_t res = submitOp(now).res;
        if (res != -EAGAIN) { return res; }
    }
    return submitOp(o, deadline).res;
}

}  // namespace

Result<size_t> recv(int fd, void* buf, size_t len, int flags, Deadline deadline) noexcept {
    return sizeOrError(submitOp(op::recv(fd, buf, static_cast<uint32_t>(std::min(len, kMaxIo)), flags), deadline).res);
}

Result<size_t> send(int fd, const void* buf, size_t len, int flags, Deadline deadline) noexcept {
    return sizeOrError(sendOp(op::send(fd, buf, static_cast<uint32_t>(std::min(len, kMaxIo)), flags | MSG_NOSIGNAL),
                              deadline));
}

Result<size_t> sendmsg(int fd, const msghdr* msg, int flags, Deadline deadline) noexcept {
    return sizeOrError(sendOp(op::sendmsg(fd, msg, flags | MSG_NOSIGNAL), deadline));
}

Result<size_t> recvmsg(int fd, msghdr* msg, int flags, Deadline deadline) noexcept {
    return sizeOrError(submitOp(op::recvmsg(fd, msg, flags), deadline).res);
}

Result<int> accept(int fd, sockaddr* addr, socklen_t* len, Deadline deadline) noexcept {
    const int32_t res = submitOp(op::accept(fd, addr, len, SOCK_CLOEXEC), deadline).res;
    if (res < 0) { return Error{-res}; }
    return static_cast<int>(res);
}

Result<void> connect(int fd, const sockaddr* addr, socklen_t len, Deadline deadline) noexcept {
    const int32_t res = submitOp(op::connect(fd, addr, len), deadline).res;
    if (res < 0) { return Error{-res}; }
    return {};
}

Result<void> shutdown(int fd, int how, Deadline deadline) noexcept {
    const int32_t res = submitOp(op::shutdown(fd, how), deadline).res;
    if (res < 0) { return Error{-res}; }
    return {};
}

Result<void> closeDescriptor(int fd) noexcept {
    auto r = spindle::close(fd);
    if (!r && r.errorCode() == ECANCELED) {
        if (::close(fd) != 0 && errno != EINTR) { return Error{errno}; }
        return {};
    }
    return r;
}

Result<int> openSocket(int family, int type) noexcept {
    const int fd = ::socket(family, type | SOCK_CLOEXEC, 0);
    if (fd < 0) { return Error{errno}; }
    return fd;
}

Result<void> setIntOption(int fd, int level, int name, int value) noexcept {
    if (::setsockopt(fd, level, name, &value, sizeof(value)) != 0) { return Error{errno}; }
    return {};
}

Result<void> sockName(int fd, bool peer, sockaddr* addr, socklen_t* len) noexcept {
    const int r = peer ? ::getpeername(fd, addr, len) : ::getsockname(fd, addr, len);
    if (r != 0) { return Error{errno}; }
    return {};
}

Result<void> backoffSleep(uint64_t ns, Deadline deadline) noexcept {
    bool cut = false;
    if (deadline.isSet()) {
        timespec now{};
        ::clock_gettime(CLOCK_MONOTONIC, &now);
        const uint64_t nowNs = static_cast<uint64_t>(now.tv_sec) * 1000000000u + static_cast<uint64_t>(now.tv_nsec);
        if (deadline.ns() <= nowNs) { return Error{ETIMEDOUT}; }
        if (deadline.ns() - nowNs < ns) {
            ns = deadline.ns() - nowNs;
            cut = true;
        }
    }
    if (this_fiber::inFiber()) {
        auto r = spindle::sleep(std::chrono::nanoseconds(ns));
        if (!r) { return r; }
    } else {
        std::this_thread::sleep_for(std::chrono::nanoseconds(ns));
    }
    if (cut) { return Error{ETIMEDOUT}; }
    return {};
}

}  // namespace spindle::net::detail
