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

struct BufArgs {
    int fd;
    void* buf;
    size_t len;
    int flags;
};

struct MsgArgs {
    int fd;
    const msghdr* msg;
    int flags;
};

struct AddrArgs {
    int fd;
    const sockaddr* addr;
    socklen_t len;
    socklen_t* outLen;
};

// How a send goes out:
// - When the fiber is all its carrier has to do (carrierOtherwiseIdle), one send(2) with MSG_DONTWAIT
//   straight away: through the ring it would cost the carrier an io_uring_enter all the same, plus a
//   park, a CQE and a resume. With other fibers ready or SQEs queued, the ring batches it with them.
// - A send with a deadline tries first without one, with MSG_DONTWAIT: a socket with room in its
//   send buffer (nearly always) completes it at once, and the linked timeout (an extra SQE, a timer
//   armed and cancelled, its own CQE awaited) is paid only when the kernel answers EAGAIN.
// The direct calls are raw system calls: the descriptor may come from an accept on the ring, which
// ThreadSanitizer's interceptors cannot see.
template <class Args>
int32_t sendOp(PrepareSqe prepare, Args& a, Deadline deadline, long (*direct)(const Args&)) noexcept {
    if ((a.flags & MSG_DONTWAIT) != 0) { return submitOp(prepare, &a, deadline).res; }
    if (carrierOtherwiseIdle()) {
        if (this_fiber::cancellationRequested()) { return -ECANCELED; }
        if (deadline.expired()) { return -ETIMEDOUT; }
        const long n = direct(a);
        if (n >= 0) { return static_cast<int32_t>(n); }  // all of it, or what the socket took
        if (n != -EAGAIN && n != -EINTR) { return static_cast<int32_t>(n); }
        return submitOp(prepare, &a, deadline).res;  // full: the ring waits for room
    }
    if (deadline.isSet()) {
        if (deadline.expired()) { return -ETIMEDOUT; }
        a.flags |= MSG_DONTWAIT;
        const int32_t res = submitOp(prepare, &a).res;
        a.flags &= ~MSG_DONTWAIT;
        if (res != -EAGAIN) { return res; }
    }
    return submitOp(prepare, &a, deadline).res;
}

long rawResult(long r) noexcept { return r < 0 ? -errno : r; }

long directSend(const BufArgs& a) noexcept {
    return rawResult(::syscall(SYS_sendto, a.fd, a.buf, a.len, a.flags | MSG_DONTWAIT, nullptr, 0));
}

long directSendmsg(const MsgArgs& a) noexcept {
    return rawResult(::syscall(SYS_sendmsg, a.fd, a.msg, a.flags | MSG_DONTWAIT));
}

}  // namespace

Result<size_t> recv(int fd, void* buf, size_t len, int flags, Deadline deadline) noexcept {
    const BufArgs a{fd, buf, std::min(len, kMaxIo), flags};
    return sizeOrError(submitOp(
        [](io_uring_sqe* sqe, const void* ctx) {
            const auto* x = static_cast<const BufArgs*>(ctx);
            io_uring_prep_recv(sqe, x->fd, x->buf, x->len, x->flags);
        },
        &a, deadline).res);
}

Result<size_t> send(int fd, const void* buf, size_t len, int flags, Deadline deadline) noexcept {
    BufArgs a{fd, const_cast<void*>(buf), std::min(len, kMaxIo), flags | MSG_NOSIGNAL};
    return sizeOrError(sendOp<BufArgs>(
        [](io_uring_sqe* sqe, const void* ctx) {
            const auto* x = static_cast<const BufArgs*>(ctx);
            io_uring_prep_send(sqe, x->fd, x->buf, x->len, x->flags);
        },
        a, deadline, &directSend));
}

Result<size_t> sendmsg(int fd, const msghdr* msg, int flags, Deadline deadline) noexcept {
    MsgArgs a{fd, msg, flags | MSG_NOSIGNAL};
    return sizeOrError(sendOp<MsgArgs>(
        [](io_uring_sqe* sqe, const void* ctx) {
            const auto* x = static_cast<const MsgArgs*>(ctx);
            io_uring_prep_sendmsg(sqe, x->fd, x->msg, static_cast<unsigned>(x->flags));
        },
        a, deadline, &directSendmsg));
}

Result<size_t> recvmsg(int fd, msghdr* msg, int flags, Deadline deadline) noexcept {
    const MsgArgs a{fd, msg, flags};
    return sizeOrError(submitOp(
        [](io_uring_sqe* sqe, const void* ctx) {
            const auto* x = static_cast<const MsgArgs*>(ctx);
            io_uring_prep_recvmsg(sqe, x->fd, const_cast<msghdr*>(x->msg), static_cast<unsigned>(x->flags));
        },
        &a, deadline).res);
}

Result<int> accept(int fd, sockaddr* addr, socklen_t* len, Deadline deadline) noexcept {
    const AddrArgs a{fd, addr, 0, len};
    const int32_t res = submitOp(
        [](io_uring_sqe* sqe, const void* ctx) {
            const auto* x = static_cast<const AddrArgs*>(ctx);
            io_uring_prep_accept(sqe, x->fd, const_cast<sockaddr*>(x->addr), x->outLen, SOCK_CLOEXEC);
        },
        &a, deadline).res;
    if (res < 0) { return Error{-res}; }
    return static_cast<int>(res);
}

Result<void> connect(int fd, const sockaddr* addr, socklen_t len, Deadline deadline) noexcept {
    const AddrArgs a{fd, addr, len, nullptr};
    const int32_t res = submitOp(
        [](io_uring_sqe* sqe, const void* ctx) {
            const auto* x = static_cast<const AddrArgs*>(ctx);
            io_uring_prep_connect(sqe, x->fd, x->addr, x->len);
        },
        &a, deadline).res;
    if (res < 0) { return Error{-res}; }
    return {};
}

Result<void> shutdown(int fd, int how, Deadline deadline) noexcept {
    const BufArgs a{fd, nullptr, 0, how};
    const int32_t res = submitOp(
        [](io_uring_sqe* sqe, const void* ctx) {
            const auto* x = static_cast<const BufArgs*>(ctx);
            io_uring_prep_shutdown(sqe, x->fd, x->flags);
        },
        &a, deadline).res;
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
