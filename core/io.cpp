#include "core/io.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <new>

#include "base/log.h"
#include "core/fiber.h"
#include "core/fiber_future.h"
#include "core/offload.h"
#include "core/internal/carrier.h"
#include "core/internal/io_submit.h"
#include "core/internal/runtime_impl.h"
#include "uring/ring.h"

namespace spindle {
namespace detail {
namespace {

// A ring for plain threads that call fiber-blocking functions: one operation at
// a time, waited for synchronously.
struct ThreadRing {
    uring::Ring ring;
    int setupError = 0;
};

// The answer to a call whose operation the kernel cancelled: ETIMEDOUT when its own deadline did
// it, not a FiberHandle::cancel() (`cancelled`) or shutdown.
int32_t mapCancelled(int32_t res, Deadline deadline, bool cancelled) noexcept {
    if ((res == -ECANCELED || res == -EINTR) && !cancelled && deadline.isSet() && deadline.expired()) {
        return -ETIMEDOUT;
    }
    return res;
}

int32_t threadSubmitAndWait(PrepareSqe prepare, const void* ctx, Deadline deadline, uint32_t* cqeFlags) noexcept {
    thread_local ThreadRing tr;
    if (!tr.ring.initialized()) {
        if (tr.setupError != 0) { return -tr.setupError; }
        uring::RingOptions opts;
        opts.entries = 8;
        auto r = tr.ring.init(opts, [](void*, const io_uring_cqe*) {}, nullptr);
        if (!r) {
            tr.setupError = r.errorCode();
            return -tr.setupError;
        }
    }
    if (deadline.expired()) { return -ETIMEDOUT; }
    // The operation's CQE carries kFuture, a linked timeout's kIgnore; both are awaited (see the
    // fiber path below for why the timeout's matters).
    tr.ring.reserveSqes(2);
    io_uring_sqe* sqe = tr.ring.acquireSqe();
    prepare(sqe, ctx);
    io_uring_sqe_set_data64(sqe, uring::encodeUserData(nullptr, uring::Tag::kFuture));
    __kernel_timespec ts{};
    if (deadline.isSet()) {
        sqe->flags |= IOSQE_IO_LINK;
        ts = toKernelTimespec(deadline.ns());
        io_uring_sqe* t = tr.ring.acquireSqe();
        io_uring_prep_link_timeout(t, &ts, IORING_TIMEOUT_ABS);
        io_uring_sqe_set_data64(t, uring::encodeUserData(nullptr, uring::Tag::kIgnore));
    }
    bool done = false;
    bool timeoutDone = !deadline.isSet();
    int32_t res = 0;
    while (!done || !timeoutDone) {
        int w = tr.ring.submitAndWait(nullptr);
        if (w < 0 && w != -EINTR && w != -ETIME) { return w; }
        tr.ring.reap([&](const io_uring_cqe* cqe) {
            if (uring::tagOf(cqe->user_data) == uring::Tag::kFuture) {
                res = cqe->res;
                if (cqeFlags != nullptr) { *cqeFlags = cqe->flags; }
                done = true;
            } else {
                timeoutDone = true;
            }
        });
    }
    return mapCancelled(res, deadline, false);
}

constexpr size_t kMaxRw = 0x7ffff000;  // what read(2)/write(2) transfer at most

}  // namespace

int32_t submitAndWait(PrepareSqe prepare, const void* ctx, Deadline deadline, uint32_t* cqeFlags) noexcept {
    if (cqeFlags != nullptr) { *cqeFlags = 0; }
    Carrier* c = Carrier::current();
    if (c == nullptr || c->running() == nullptr) { return threadSubmitAndWait(prepare, ctx, deadline, cqeFlags); }
    if (c->stopping()) { return -ECANCELED; }
    Fiber* self = c->running();
    // With cqeFlags the dispatch also stores the CQE's flags beside the future (kLocalFutureFlags).
    FlaggedFuture slot;
    FiberFuture& done = slot.future;
    const uint64_t ud = cqeFlags != nullptr ? uring::encodeUserData(&slot, uring::Tag::kLocalFutureFlags)
                                            : uring::encodeUserData(&done, uring::Tag::kLocalFuture);
    // Before the SQE exists: a cancellation found here costs nothing to undo. The cancel point is the
    // whole user_data, which the carrier's IORING_OP_ASYNC_CANCEL must match.
    if (!beginCancellableWait(self, c, CancelPoint::Kind::kIo, reinterpret_cast<void*>(ud))) { return -ECANCELED; }
    if (!deadline.isSet()) {
        io_uring_sqe* sqe = c->acquireSqe();
        prepare(sqe, ctx);
        io_uring_sqe_set_data64(sqe, ud);
        self->waitReason_ = "io";
        const int32_t res = done.waitLocal();
        if (cqeFlags != nullptr) { *cqeFlags = slot.flags; }
        return res;
    }
    if (deadline.expired()) {
        self->waitOn_.store(nullptr, std::memory_order_relaxed);
        return -ETIMEDOUT;
    }
    // The kernel copies the timespec when it takes the SQE, during the carrier's next submission,
    // while this frame is parked and alive.
    __kernel_timespec ts = toKernelTimespec(deadline.ns());
    // The call also waits for the timeout's own CQE. The kernel's linked timeout cancels its operation
    // by user_data, and this frame's next call reuses the same user_data (the same stack address): a
    // timeout that fired just as its operation completed could otherwise cancel the next operation.
    // Usually both CQEs come in one batch. The timeout's future is a general one (set() from the
    // owner's dispatch), since the fiber may wait for it on another carrier.
    FiberFuture timeoutDone;
    c->ring().reserveSqes(2);
    io_uring_sqe* sqe = c->acquireSqe();
    prepare(sqe, ctx);
    sqe->flags |= IOSQE_IO_LINK;
    io_uring_sqe_set_data64(sqe, ud);
    io_uring_sqe* t = c->acquireSqe();
    io_uring_prep_link_timeout(t, &ts, IORING_TIMEOUT_ABS);
    io_uring_sqe_set_data64(t, uring::encodeUserData(&timeoutDone, uring::Tag::kFuture));
    self->waitReason_ = "io";
    const int32_t res = done.waitLocal();
    self->waitReason_ = "io (linked timeout)";
    (void)timeoutDone.wait();
    if (cqeFlags != nullptr) { *cqeFlags = slot.flags; }
    return mapCancelled(res, deadline, self->cancelRequested_.load(std::memory_order_relaxed));
}

}  // namespace detail

OpResult submitOp(PrepareSqe prepare, const void* ctx, Deadline deadline) noexcept {
    OpResult r;
    r.res = detail::submitAndWait(prepare, ctx, deadline, &r.flags);
    return r;
}

Result<unsigned> armMultishot(PrepareSqe prepare, const void* ctx, MultishotCompletion* completion) noexcept {
    detail::Carrier* c = detail::Carrier::current();
    if (c == nullptr || c->running() == nullptr) { return Error{EPERM}; }
    if (c->stopping()) { return Error{ECANCELED}; }
    io_uring_sqe* sqe = c->acquireSqe();  // in flight until the CQE without F_MORE (Carrier::dispatch)
    prepare(sqe, ctx);
    io_uring_sqe_set_data64(sqe, uring::encodeUserData(completion, uring::Tag::kMultishot));
    completion->owner = c;
    return c->index();
}

Result<void> cancelMultishot(MultishotCompletion* completion) noexcept {
    auto* owner = static_cast<detail::Carrier*>(completion->owner);
    SPINDLE_CHECK_MSG(owner != nullptr, "cancelMultishot before armMultishot");
    const uint64_t ud = uring::encodeUserData(completion, uring::Tag::kMultishot);
    if (detail::Carrier::current() == owner) {
        owner->cancelOpHere(ud);
        return {};
    }
    auto* m = new (std::nothrow) detail::Message;
    if (m == nullptr) { return Error{ENOMEM}; }
    m->kind = detail::Message::Kind::kCancelOp;
    m->target = reinterpret_cast<void*>(ud);
    owner->post(m);
    return {};
}

int32_t waitMultishot(FiberFuture* future, MultishotCompletion* completion, Deadline deadline) noexcept {
    detail::Carrier* c = detail::Carrier::current();
    detail::Fiber* self = c != nullptr ? c->running() : nullptr;
    // The cheap wait needs the fiber to resume on this thread (pinned: never stolen), which is the
    // thread that handles a cancel for the wait: see the end of this function.
    if (self == nullptr || c != completion->owner || self->pinCount_ == 0 || deadline.isSet()) {
        std::chrono::nanoseconds left = std::chrono::hours(24 * 365);
        if (deadline.isSet()) {
            const uint64_t now = detail::nowNs();
            left = std::chrono::nanoseconds(deadline.ns() > now ? deadline.ns() - now : 0);
            if (left.count() == 0) { return future->isSet() ? future->result() : -ETIMEDOUT; }
        }
        for (;;) {
            const int32_t r = FiberFuture::waitWithTimeout(future, left);
            // -ETIMEDOUT with the future set is the operation's (TCP_USER_TIMEOUT, keep-alive), not the
            // stand-in year running out: return it rather than wait again on a future already set.
            if (r != -ETIMEDOUT || deadline.isSet() || future->isSet()) { return r; }
        }
    }
    // The cancel point is the operation: a cancel issues IORING_OP_ASYNC_CANCEL for it on this ring,
    // and its last CQE, which the handler passes to the future, ends the wait.
    const uint64_t ud = uring::encodeUserData(completion, uring::Tag::kMultishot);
    if (!detail::beginCancellableWait(self, c, detail::CancelPoint::Kind::kIo, reinterpret_cast<void*>(ud))) {
        return -ECANCELED;
    }
    self->waitReason_ = "multishot";
    const int32_t res = future->wait();
    // Cleared by the waiter rather than in the handler's step, but on the same thread (the fiber is
    // pinned here): a cancel the carrier handles in between finds the operation still there (the
    // completion outlives this call) and cancels it, which is what a sticky cancellation asks for.
    self->waitOn_.store(nullptr, std::memory_order_relaxed);
    return res;
}

bool carrierOtherwiseIdle() noexcept {
    detail::Carrier* c = detail::Carrier::current();
    return c != nullptr && c->running() != nullptr && c->otherwiseIdle();
}

uring::Ring* currentRing() noexcept {
    detail::Carrier* c = detail::Carrier::current();
    if (c == nullptr || c->running() == nullptr) { return nullptr; }
    return &c->ring();
}

namespace {
Result<size_t> sizeFromRes(int32_t res) noexcept {
    if (res < 0) { return Error{-res}; }
    return static_cast<size_t>(res);
}

struct RwArgs {
    int fd;
    void* buf;
    unsigned len;
    uint64_t offset;
};
struct VecArgs {
    int fd;
    const iovec* iov;
    int iovcnt;
    uint64_t offset;
};
}  // namespace

Result<void> nop(Deadline deadline) noexcept {
    return voidFromRes(detail::submitAndWait([](io_uring_sqe* sqe, const void*) { io_uring_prep_nop(sqe); }, nullptr, deadline));
}

Result<size_t> read(int fd, void* buf, size_t len, uint64_t offset, Deadline deadline) noexcept {
    const RwArgs a{fd, buf, static_cast<unsigned>(len < detail::kMaxRw ? len : detail::kMaxRw), offset};
    return sizeFromRes(detail::submitAndWait(
        [](io_uring_sqe* sqe, const void* p) {
            auto* x = static_cast<const RwArgs*>(p);
            io_uring_prep_read(sqe, x->fd, x->buf, x->len, x->offset);
        },
        &a, deadline));
}

Result<size_t> write(int fd, const void* buf, size_t len, uint64_t offset, Deadline deadline) noexcept {
    const RwArgs a{fd, const_cast<void*>(buf), static_cast<unsigned>(len < detail::kMaxRw ? len : detail::kMaxRw),
                   offset};
    return sizeFromRes(detail::submitAndWait(
        [](io_uring_sqe* sqe, const void* p) {
            auto* x = static_cast<const RwArgs*>(p);
            io_uring_prep_write(sqe, x->fd, x->buf, x->len, x->offset);
        },
        &a, deadline));
}

Result<size_t> readv(int fd, const iovec* iov, int iovcnt, uint64_t offset, Deadline deadline) noexcept {
    if (iovcnt < 0) { return Error{EINVAL}; }
    const VecArgs a{fd, iov, iovcnt, offset};
    return sizeFromRes(detail::submitAndWait(
        [](io_uring_sqe* sqe, const void* p) {
            auto* x = static_cast<const VecArgs*>(p);
            io_uring_prep_readv(sqe, x->fd, x->iov, static_cast<unsigned>(x->iovcnt), x->offset);
        },
        &a, deadline));
}

Result<size_t> writev(int fd, const iovec* iov, int iovcnt, uint64_t offset, Deadline deadline) noexcept {
    if (iovcnt < 0) { return Error{EINVAL}; }
    const VecArgs a{fd, iov, iovcnt, offset};
    return sizeFromRes(detail::submitAndWait(
        [](io_uring_sqe* sqe, const void* p) {
            auto* x = static_cast<const VecArgs*>(p);
            io_uring_prep_writev(sqe, x->fd, x->iov, static_cast<unsigned>(x->iovcnt), x->offset);
        },
        &a, deadline));
}

Result<void> fsync(int fd, Deadline deadline) noexcept {
    return voidFromRes(detail::submitAndWait(
        [](io_uring_sqe* sqe, const void* p) { io_uring_prep_fsync(sqe, *static_cast<const int*>(p), 0); }, &fd, deadline));
}

Result<void> fdatasync(int fd, Deadline deadline) noexcept {
    return voidFromRes(detail::submitAndWait(
        [](io_uring_sqe* sqe, const void* p) {
            io_uring_prep_fsync(sqe, *static_cast<const int*>(p), IORING_FSYNC_DATASYNC);
        },
        &fd, deadline));
}

Result<int> openat(int dirfd, const char* path, int flags, mode_t mode, Deadline deadline) noexcept {
    if (path == nullptr) { return Error{EFAULT}; }
    struct Args {
        int dirfd;
        const char* path;
        int flags;
        mode_t mode;
    } a{dirfd, path, flags | O_CLOEXEC, mode};
    const int32_t res = detail::submitAndWait(
        [](io_uring_sqe* sqe, const void* p) {
            auto* x = static_cast<const Args*>(p);
            io_uring_prep_openat(sqe, x->dirfd, x->path, x->flags, x->mode);
        },
        &a, deadline);
    if (res < 0) { return Error{-res}; }
    return static_cast<int>(res);
}

Result<void> close(int fd, Deadline deadline) noexcept {
    return voidFromRes(detail::submitAndWait(
        [](io_uring_sqe* sqe, const void* p) { io_uring_prep_close(sqe, *static_cast<const int*>(p)); }, &fd, deadline));
}

Result<void> statx(int dirfd, const char* path, int flags, unsigned mask, struct statx* out, Deadline deadline) noexcept {
    if (path == nullptr || out == nullptr) { return Error{EFAULT}; }
    struct Args {
        int dirfd;
        const char* path;
        int flags;
        unsigned mask;
        struct statx* out;
    } a{dirfd, path, flags, mask, out};
    return voidFromRes(detail::submitAndWait(
        [](io_uring_sqe* sqe, const void* p) {
            auto* x = static_cast<const Args*>(p);
            io_uring_prep_statx(sqe, x->dirfd, x->path, x->flags, x->mask, x->out);
        },
        &a, deadline));
}

Result<void> ftruncate(int fd, uint64_t length) noexcept {
    if (length > static_cast<uint64_t>(INT64_MAX)) { return Error{EINVAL}; }
    auto r = offload([fd, length] { return ::ftruncate(fd, static_cast<off_t>(length)) == 0 ? 0 : errno; });
    if (!r) { return Error{r.errorCode()}; }
    if (*r != 0) { return Error{*r}; }
    return {};
}

Result<void> fallocate(int fd, int mode, uint64_t offset, uint64_t len, Deadline deadline) noexcept {
    struct Args {
        int fd;
        int mode;
        uint64_t offset;
        uint64_t len;
    } a{fd, mode, offset, len};
    return voidFromRes(detail::submitAndWait(
        [](io_uring_sqe* sqe, const void* p) {
            auto* x = static_cast<const Args*>(p);
            // Values past INT64_MAX turn negative here, and the kernel answers EINVAL, as fallocate(2) does.
            io_uring_prep_fallocate(sqe, x->fd, x->mode, static_cast<off_t>(x->offset), static_cast<off_t>(x->len));
        },
        &a, deadline));
}

Result<void> unlinkat(int dirfd, const char* path, int flags, Deadline deadline) noexcept {
    if (path == nullptr) { return Error{EFAULT}; }
    struct Args {
        int dirfd;
        const char* path;
        int flags;
    } a{dirfd, path, flags};
    return voidFromRes(detail::submitAndWait(
        [](io_uring_sqe* sqe, const void* p) {
            auto* x = static_cast<const Args*>(p);
            io_uring_prep_unlinkat(sqe, x->dirfd, x->path, x->flags);
        },
        &a, deadline));
}

Result<void> renameat(int olddirfd, const char* oldpath, int newdirfd, const char* newpath, unsigned flags, Deadline deadline) noexcept {
    if (oldpath == nullptr || newpath == nullptr) { return Error{EFAULT}; }
    struct Args {
        int olddirfd;
        const char* oldpath;
        int newdirfd;
        const char* newpath;
        unsigned flags;
    } a{olddirfd, oldpath, newdirfd, newpath, flags};
    return voidFromRes(detail::submitAndWait(
        [](io_uring_sqe* sqe, const void* p) {
            auto* x = static_cast<const Args*>(p);
            io_uring_prep_renameat(sqe, x->olddirfd, x->oldpath, x->newdirfd, x->newpath, x->flags);
        },
        &a, deadline));
}

Result<void> mkdirat(int dirfd, const char* path, mode_t mode, Deadline deadline) noexcept {
    if (path == nullptr) { return Error{EFAULT}; }
    struct Args {
        int dirfd;
        const char* path;
        mode_t mode;
    } a{dirfd, path, mode};
    return voidFromRes(detail::submitAndWait(
        [](io_uring_sqe* sqe, const void* p) {
            auto* x = static_cast<const Args*>(p);
            io_uring_prep_mkdirat(sqe, x->dirfd, x->path, x->mode);
        },
        &a, deadline));
}

Result<short> poll(int fd, short events, Deadline deadline) noexcept {
    // The mask goes to the kernel as 32 bits: widened through unsigned short, so a negative short cannot
    // sign-extend into EPOLLONESHOT/EPOLLET/EPOLLEXCLUSIVE; bits that are not poll(2) events are refused.
    constexpr unsigned kPollEvents =
        POLLIN | POLLPRI | POLLOUT | POLLRDNORM | POLLRDBAND | POLLWRNORM | POLLWRBAND | POLLMSG | POLLRDHUP |
        POLLERR | POLLHUP;
    const unsigned mask = static_cast<unsigned short>(events);
    if ((mask & ~kPollEvents) != 0) { return Error{EINVAL}; }
    struct Args {
        int fd;
        unsigned mask;
    } a{fd, mask};
    const int32_t res = detail::submitAndWait(
        [](io_uring_sqe* sqe, const void* p) {
            auto* x = static_cast<const Args*>(p);
            io_uring_prep_poll_add(sqe, x->fd, x->mask);
        },
        &a, deadline);
    if (res < 0) { return Error{-res}; }
    return static_cast<short>(res);
}

Result<size_t> splice(int fdIn, int64_t offIn, int fdOut, int64_t offOut, size_t len, unsigned flags, Deadline deadline) noexcept {
    if ((flags & SPLICE_F_FD_IN_FIXED) != 0) { return Error{EINVAL}; }
    struct Args {
        int fdIn;
        int64_t offIn;
        int fdOut;
        int64_t offOut;
        unsigned len;
        unsigned flags;
    } a{fdIn, offIn, fdOut, offOut, static_cast<unsigned>(len < detail::kMaxRw ? len : detail::kMaxRw), flags};
    return sizeFromRes(detail::submitAndWait(
        [](io_uring_sqe* sqe, const void* p) {
            auto* x = static_cast<const Args*>(p);
            // io_uring reads an offset of -1 as "no offset": splice(2)'s NULL.
            io_uring_prep_splice(sqe, x->fdIn, x->offIn, x->fdOut, x->offOut, x->len, x->flags);
        },
        &a, deadline));
}

Result<size_t> tee(int fdIn, int fdOut, size_t len, unsigned flags, Deadline deadline) noexcept {
    if ((flags & SPLICE_F_FD_IN_FIXED) != 0) { return Error{EINVAL}; }
    struct Args {
        int fdIn;
        int fdOut;
        unsigned len;
        unsigned flags;
    } a{fdIn, fdOut, static_cast<unsigned>(len < detail::kMaxRw ? len : detail::kMaxRw), flags};
    return sizeFromRes(detail::submitAndWait(
        [](io_uring_sqe* sqe, const void* p) {
            auto* x = static_cast<const Args*>(p);
            io_uring_prep_tee(sqe, x->fdIn, x->fdOut, x->len, x->flags);
        },
        &a, deadline));
}

Result<void> sleep(std::chrono::nanoseconds duration) noexcept { return this_fiber::sleep_for(duration); }

}  // namespace spindle
