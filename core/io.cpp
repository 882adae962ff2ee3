// SPDX-License-Identifier: Apache-2.0
#include "core/io.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <new>
#include <thread>

#include "base/inject.h"
#include "base/log.h"
#include "core/fiber.h"
#include "core/fiber_future.h"
#include "core/offload.h"
#include "core/internal/carrier.h"
#include "core/driver/backend.h"
#include "core/driver/buffer_group.h"
#include "core/driver/epoll_driver.h"
#include "core/driver/splice_ends.h"
#include "core/driver/uring_driver.h"
#include "core/internal/io_submit.h"
#include "core/ring_ops.h"
#include "core/internal/runtime_impl.h"
#include "uring/ring.h"

namespace spindle {
namespace detail {
namespace {

// The answer to a call whose operation the kernel cancelled: ETIMEDOUT when its own deadline did
// it, not a FiberHandle::cancel() (`cancelled`) or shutdown.
int32_t mapCancelled(int32_t res, Deadline deadline, bool cancelled) noexcept {
    if ((res == -ECANCELED || res == -EINTR) && !cancelled && deadline.isSet() && deadline.expired()) {
        return -ETIMEDOUT;
    }
    return res;
}

// A call that a cancel interrupted while it blocked in an io_uring worker (a splice or tee waiting
// on a pipe or socket) completes with the kernel's internal -ERESTARTSYS family (512-516), which
// io_uring translates for reads and writes but not for those: ECANCELED for a cancel, else EINTR.
int32_t fromRestart(int32_t res, bool cancelled) noexcept {
    if (res <= -512 && res >= -516) [[unlikely]] { return cancelled ? -ECANCELED : -EINTR; }
    return res;
}

constexpr size_t kMaxRw = 0x7ffff000;  // what read(2)/write(2) transfer at most

int32_t threadSubmitAndWait(const op::Op& o, Deadline deadline, uint32_t* cqeFlags) noexcept {
    if (deadline.expired()) { return -ETIMEDOUT; }
    if (threadBackend() == Backend::kUring) {
        const int32_t res = UringDriver::runOnThreadRing(o, deadline, cqeFlags);
        if (res != kPending) { return mapCancelled(fromRestart(res, false), deadline, false); }
        // No ring for this thread after all (a seccomp filter installed since): the system calls.
    }
    return EpollDriver::performBlocking(o, deadline);
}

// The fiber's side of one operation: the request, the future its completion sets, and the flags.
struct FiberIo : op::IoRequest {
    explicit FiberIo(const op::Op& o) noexcept : IoRequest(&o, &FiberIo::onComplete) {}

    FiberFuture done;
    uint32_t flags = 0;

    static void onComplete(op::IoRequest* req, int32_t res, uint32_t flags) noexcept {
        auto* self = static_cast<FiberIo*>(req);
        self->flags = flags;
        self->done.setLocal(res);  // the fiber parked on this carrier, whose thread runs this
    }
};

}  // namespace

int32_t submitAndWait(const op::Op& o, Deadline deadline, uint32_t* cqeFlags) noexcept {
    if (cqeFlags != nullptr) { *cqeFlags = 0; }
    Carrier* c = Carrier::current();
    if (c == nullptr || c->running() == nullptr) { return threadSubmitAndWait(o, deadline, cqeFlags); }
    if (c->stopping()) { return -ECANCELED; }
    Fiber* self = c->running();
    FiberIo io(o);
    // Before the operation starts: a cancellation found here costs nothing to undo. The cancel point
    // is the request, which the driver's cancel matches.
    if (!beginCancellableWait(self, c, CancelPoint::Kind::kIo, static_cast<op::IoRequest*>(&io))) {
        return -ECANCELED;
    }
    if (deadline.isSet()) {
        if (deadline.expired()) {
            self->waitOn_.store(nullptr, std::memory_order_relaxed);
            return -ETIMEDOUT;
        }
        io.deadlineNs = deadline.ns();
    }
    int32_t res = c->startIo(&io);
    if (res == kBlocking) {
        // A file operation the epoll driver cannot wait for: a blocking call on the offload pool. Not
        // cancellable once there (like a regular-file read the kernel has begun); a cancellation stays
        // requested for the next call.
        self->waitOn_.store(nullptr, std::memory_order_relaxed);
        auto r = offload([&] { return EpollDriver::runBlocking(o); });
        res = r ? *r : -r.errorCode();
    } else if (res != kPending) {
        // Finished at once (a readiness driver's first try): no completion follows.
        self->waitOn_.store(nullptr, std::memory_order_relaxed);
        io.flags = io.inlineFlags;
        c->afterInlineCompletion();
    } else {
        noteWait(self, WaitKind::kIo, &o, deadline.isSet() ? deadline.ns() : 0);
        res = io.done.waitLocal();  // before the flag is read: a cancel came while it waited
        res = fromRestart(res, self->cancelRequested_.load(std::memory_order_relaxed));
    }
    if (cqeFlags != nullptr) { *cqeFlags = io.flags; }
    if (!deadline.isSet()) { return res; }
    return mapCancelled(res, deadline, self->cancelRequested_.load(std::memory_order_relaxed));
}

}  // namespace detail

OpResult submitOp(const op::Op& o, Deadline deadline) noexcept {
    OpResult r;
    r.res = detail::submitAndWait(o, deadline, &r.flags);
    return r;
}

namespace {

// Points `completion` at its copy of `o` and at `c`, the carrier whose driver will hold it, with a
// completion that calls its `fn`. 0, or the -errno for a caller off-carrier or during shutdown.
int prepareCompletion(detail::Carrier* c, const op::Op& o, MultishotCompletion* completion) noexcept {
    if (c == nullptr) { return -EPERM; }
    if (c->stopping()) { return -ECANCELED; }
    completion->opStorage = o;
    completion->op = &completion->opStorage;
    completion->deadlineNs = 0;
    completion->complete = [](op::IoRequest* req, int32_t res, uint32_t flags) noexcept {
        auto* m = static_cast<MultishotCompletion*>(req);
        m->fn(m, res, flags);
    };
    completion->owner = c;
    return 0;
}

}  // namespace

Result<unsigned> armMultishot(const op::Op& o, MultishotCompletion* completion) noexcept {
    detail::Carrier* c = detail::Carrier::current();
    if (const int err = prepareCompletion(c, o, completion); err != 0) { return Error{-err}; }
    // In flight until the completion without kMore.
    const int32_t res = c->startIo(completion);
    if (res != detail::kPending) { return Error{res < 0 ? -res : EINVAL}; }
    return c->index();
}

std::optional<int32_t> startDetached(const op::Op& o, MultishotCompletion* completion) noexcept {
    detail::Carrier* c = detail::Carrier::current();
    if (const int err = prepareCompletion(c, o, completion); err != 0) { return err; }
    const int32_t res = c->startIo(completion);
    if (res == detail::kPending) { return std::nullopt; }
    if (res == detail::kBlocking) {
        // The epoll driver could not wait for it (no readiness for this descriptor): the blocking
        // call on the offload pool, waited for here.
        auto r = offload([&] { return detail::EpollDriver::runBlocking(completion->opStorage); });
        return r ? *r : -r.errorCode();
    }
    c->afterInlineCompletion();
    return res;
}

Result<void> cancelMultishot(MultishotCompletion* completion) noexcept {
    auto* owner = static_cast<detail::Carrier*>(completion->owner);
    SPINDLE_CHECK_MSG(owner != nullptr, "cancelMultishot before armMultishot");
    if (detail::Carrier::current() == owner) {
        owner->cancelOpHere(completion);
        return {};
    }
    if (owner->exited()) { return {}; }  // it ended every operation it held on its way out
    // One message at a time: a cancel while one is queued (a pause and a stop) is folded into it.
    if (completion->cancelQueued.exchange(true, std::memory_order_acq_rel)) { return {}; }
    completion->cancelMsg.run = [](detail::Message* self) noexcept {
        auto* c = static_cast<MultishotCompletion*>(self->target);
        detail::Carrier::current()->cancelOpHere(c);
        // The last touch: once false, settleMultishot() lets the owner of `c` destroy it.
        c->cancelQueued.store(false, std::memory_order_release);
    };
    completion->cancelMsg.target = completion;
    owner->post(&completion->cancelMsg);
    return {};
}

void settleMultishot(MultishotCompletion* completion) noexcept {
    while (completion->cancelQueued.load(std::memory_order_acquire)) { this_fiber::yield(); }
}

int32_t waitMultishot(FiberFuture* future, MultishotCompletion* completion, Deadline deadline) noexcept {
    detail::Carrier* c = detail::Carrier::current();
    detail::Fiber* self = c != nullptr ? c->running() : nullptr;
    // The cheap wait needs the fiber to resume on this thread (pinned: never stolen), which is the
    // thread that handles a cancel for the wait: see the end of this function.
    if (self == nullptr || c != completion->owner || self->pinCount_ == 0 || deadline.isSet()) {
        std::chrono::nanoseconds left = FiberFuture::kNoTimeout;  // cancellable, but no timer comes due
        if (deadline.isSet()) {
            const uint64_t now = detail::nowNs();
            left = std::chrono::nanoseconds(deadline.ns() > now ? deadline.ns() - now : 0);
            if (left.count() == 0) { return future->isSet() ? future->result() : -ETIMEDOUT; }
        }
        return FiberFuture::waitWithTimeout(future, left);
    }
    // The cancel point is the operation: a cancel has the driver cancel it, and its last completion,
    // which the handler passes to the future, ends the wait.
    if (!detail::beginCancellableWait(self, c, detail::CancelPoint::Kind::kIo, static_cast<op::IoRequest*>(completion))) {
        return -ECANCELED;
    }
    const int32_t res = future->wait(detail::WaitKind::kMultishot, completion->op);
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

bool carrierSendsInline() noexcept {
    detail::Carrier* c = detail::Carrier::current();
    if (c == nullptr || c->running() == nullptr) { return false; }
    return !c->onRing() || c->otherwiseIdle();
}

void afterInlineSend() noexcept { detail::Carrier::current()->afterInlineCompletion(); }

uring::Ring* currentRing() noexcept {
    detail::Carrier* c = detail::Carrier::current();
    return c != nullptr ? c->ring() : nullptr;
}

Result<unsigned> registerBufferGroupHere(uint16_t id, detail::BufferGroup* group) noexcept {
    detail::Carrier* c = detail::Carrier::current();
    if (c == nullptr) { return Error{EPERM}; }
    try {
        group->bindOwner(c);  // its returns from other threads now come to this carrier's loop
    } catch (...) {
        return Error{ENOMEM};
    }
    if (auto r = c->driver().registerBufferGroup(id, group); !r) { return Error{r.errorCode()}; }
    return c->index();
}

Result<void> unregisterBufferGroupHere(uint16_t id) noexcept {
    detail::Carrier* c = detail::Carrier::current();
    if (c == nullptr) { return Error{EPERM}; }
    return c->driver().unregisterBufferGroup(id);
}

namespace {
Result<size_t> sizeFromRes(int32_t res) noexcept {
    if (res < 0) { return Error{-res}; }
    return static_cast<size_t>(res);
}

uint32_t capRw(size_t len) noexcept { return static_cast<uint32_t>(len < detail::kMaxRw ? len : detail::kMaxRw); }
}  // namespace

Result<void> nop(Deadline deadline) noexcept { return voidFromRes(detail::submitAndWait(op::nop(), deadline)); }

Result<size_t> read(int fd, void* buf, size_t len, uint64_t offset, Deadline deadline) noexcept {
    return sizeFromRes(detail::submitAndWait(op::read(fd, buf, capRw(len), offset), deadline));
}

Result<size_t> write(int fd, const void* buf, size_t len, uint64_t offset, Deadline deadline) noexcept {
    return sizeFromRes(detail::submitAndWait(op::write(fd, buf, capRw(len), offset), deadline));
}

Result<size_t> readv(int fd, const iovec* iov, int iovcnt, uint64_t offset, Deadline deadline) noexcept {
    if (iovcnt < 0) { return Error{EINVAL}; }
    return sizeFromRes(detail::submitAndWait(op::readv(fd, iov, static_cast<uint32_t>(iovcnt), offset), deadline));
}

Result<size_t> writev(int fd, const iovec* iov, int iovcnt, uint64_t offset, Deadline deadline) noexcept {
    if (iovcnt < 0) { return Error{EINVAL}; }
    return sizeFromRes(detail::submitAndWait(op::writev(fd, iov, static_cast<uint32_t>(iovcnt), offset), deadline));
}

Result<void> fsync(int fd, Deadline deadline) noexcept {
    return voidFromRes(detail::submitAndWait(op::fsync(fd, false), deadline));
}

Result<void> fdatasync(int fd, Deadline deadline) noexcept {
    return voidFromRes(detail::submitAndWait(op::fsync(fd, true), deadline));
}

Result<int> openat(int dirfd, const char* path, int flags, mode_t mode, Deadline deadline) noexcept {
    if (path == nullptr) { return Error{EFAULT}; }
    const int32_t res = detail::submitAndWait(op::openat(dirfd, path, flags | O_CLOEXEC, mode), deadline);
    if (res < 0) { return Error{-res}; }
    return static_cast<int>(res);
}

Result<int> openat2(int dirfd, const char* path, uint64_t flags, mode_t mode, uint64_t resolve, Deadline deadline) noexcept {
    if (path == nullptr) { return Error{EFAULT}; }
    // Read by the kernel when the operation starts; the call returns only after its completion.
    open_how how{.flags = flags | O_CLOEXEC, .mode = mode, .resolve = resolve};
    const int32_t res = detail::submitAndWait(op::openat2(dirfd, path, &how), deadline);
    if (res < 0) { return Error{-res}; }
    return static_cast<int>(res);
}

Result<void> close(int fd, Deadline deadline) noexcept {
    return voidFromRes(detail::submitAndWait(op::close(fd), deadline));
}

Result<void> statx(int dirfd, const char* path, int flags, unsigned mask, struct statx* out, Deadline deadline) noexcept {
    if (path == nullptr || out == nullptr) { return Error{EFAULT}; }
    return voidFromRes(detail::submitAndWait(op::statx(dirfd, path, flags, mask, out), deadline));
}

Result<void> ftruncate(int fd, uint64_t length) noexcept {
    if (length > static_cast<uint64_t>(INT64_MAX)) { return Error{EINVAL}; }
    auto r = offload([fd, length] { return ::ftruncate(fd, static_cast<off_t>(length)) == 0 ? 0 : errno; });
    if (!r) { return Error{r.errorCode()}; }
    if (*r != 0) { return Error{*r}; }
    return {};
}

Result<void> fallocate(int fd, int mode, uint64_t offset, uint64_t len, Deadline deadline) noexcept {
    return voidFromRes(detail::submitAndWait(op::fallocate(fd, mode, offset, len), deadline));
}

Result<void> unlinkat(int dirfd, const char* path, int flags, Deadline deadline) noexcept {
    if (path == nullptr) { return Error{EFAULT}; }
    return voidFromRes(detail::submitAndWait(op::unlinkat(dirfd, path, flags), deadline));
}

Result<void> renameat(int olddirfd, const char* oldpath, int newdirfd, const char* newpath, unsigned flags, Deadline deadline) noexcept {
    if (oldpath == nullptr || newpath == nullptr) { return Error{EFAULT}; }
    return voidFromRes(detail::submitAndWait(op::renameat(olddirfd, oldpath, newdirfd, newpath, flags), deadline));
}

Result<void> mkdirat(int dirfd, const char* path, mode_t mode, Deadline deadline) noexcept {
    if (path == nullptr) { return Error{EFAULT}; }
    return voidFromRes(detail::submitAndWait(op::mkdirat(dirfd, path, mode), deadline));
}

Result<short> poll(int fd, short events, Deadline deadline) noexcept {
    // The mask goes to the kernel as 32 bits: widened through unsigned short, so a negative short cannot
    // sign-extend into EPOLLONESHOT/EPOLLET/EPOLLEXCLUSIVE; bits that are not poll(2) events are refused.
    constexpr unsigned kPollEvents =
        POLLIN | POLLPRI | POLLOUT | POLLRDNORM | POLLRDBAND | POLLWRNORM | POLLWRBAND | POLLMSG | POLLRDHUP |
        POLLERR | POLLHUP;
    const unsigned mask = static_cast<unsigned short>(events);
    if ((mask & ~kPollEvents) != 0) { return Error{EINVAL}; }
    const int32_t res = detail::submitAndWait(op::poll(fd, mask), deadline);
    if (res < 0) { return Error{-res}; }
    return static_cast<short>(res);
}

namespace {

// Whether this call's operation goes to an io_uring ring (the carrier's, or the thread's own).
bool callGoesToRing() noexcept {
    const detail::Carrier* c = detail::Carrier::current();
    if (c != nullptr && c->running() != nullptr) { return c->onRing(); }
    return detail::threadBackend() == Backend::kUring;
}

// A splice or tee. io_uring runs every one in an io-wq worker (it has no non-blocking first try
// for them), and a worker whose call waits for bytes or room sleeps there until they come: one
// kernel thread per waiting call, so a server splicing files to N slow readers held N workers
// (issue 19: 8 of 8, measured). Here the call is made non-blocking (splice_ends.h), so the worker
// answers EAGAIN at once, and the fiber waits for the end that held it up with a poll on the ring,
// which holds no thread; then it tries again. A call with the caller's own SPLICE_F_NONBLOCK goes as
// given (splice(2)'s meaning, EAGAIN, no wait). The epoll driver waits the same way in its own loop (parkSplice).
int32_t spliceOrTee(op::Op o, Deadline deadline) noexcept {
    if ((o.opFlags & SPLICE_F_NONBLOCK) != 0 || !callGoesToRing()) { return detail::submitAndWait(o, deadline); }
    // One or two system calls before the SQE, against DESIGN.md's "no system call of its own": the
    // ring cannot tell a splice to give up where a socket is full, only the socket's flag can.
    if (const int32_t r = detail::makeSpliceEndsNonblocking(o); r < 0) { return r; }
    o.opFlags |= SPLICE_F_NONBLOCK;
    std::chrono::milliseconds backoff{1};
    for (int raced = 0;;) {
        bool again = false;  // the fault point kSpliceAgain: EAGAIN without the call
        SPINDLE_INJECT(inject::Point::kSpliceAgain, { again = true; });
        const int32_t r = again ? -EAGAIN : detail::submitAndWait(o, deadline);
        if (r != -EAGAIN) { return r; }
        int32_t end = detail::spliceBlockedEnd(o);
        if (end == -EAGAIN) {
            // Both ends look ready: a reader or a writer raced the call; again, a few times. An answer
            // that lasts (TCP's global memory limit refuses the send while the socket's own room says
            // ready) is waited out with a growing sleep, so the fiber does not spin on the ring.
            if (++raced < 3) { continue; }
            std::chrono::nanoseconds wait = backoff;
            if (deadline.isSet()) {  // never past it
                const uint64_t now = detail::nowNs();
                if (deadline.ns() <= now) { return -ETIMEDOUT; }
                wait = std::min(wait, std::chrono::nanoseconds(deadline.ns() - now));
            }
            if (this_fiber::inFiber()) {
                if (auto slept = this_fiber::sleep_for(wait); !slept) { return -slept.errorCode(); }
            } else {
                std::this_thread::sleep_for(wait);
            }
            backoff = std::min(backoff * 2, std::chrono::milliseconds{64});
            continue;
        }
        if (end < 0) { return end; }
        raced = 0;
        backoff = std::chrono::milliseconds{1};
        const bool out = end == detail::kSpliceOutput;
        const int32_t p = detail::submitAndWait(op::poll(out ? o.fd2 : o.fd, out ? POLLOUT : POLLIN), deadline);
        if (p < 0) { return p; }  // ETIMEDOUT, ECANCELED: nothing moved
    }
}

}  // namespace

Result<size_t> splice(int fdIn, int64_t offIn, int fdOut, int64_t offOut, size_t len, unsigned flags, Deadline deadline) noexcept {
    if ((flags & SPLICE_F_FD_IN_FIXED) != 0) { return Error{EINVAL}; }
    return sizeFromRes(spliceOrTee(op::splice(fdIn, offIn, fdOut, offOut, capRw(len), flags), deadline));
}

Result<size_t> tee(int fdIn, int fdOut, size_t len, unsigned flags, Deadline deadline) noexcept {
    if ((flags & SPLICE_F_FD_IN_FIXED) != 0) { return Error{EINVAL}; }
    return sizeFromRes(spliceOrTee(op::tee(fdIn, fdOut, capRw(len), flags), deadline));
}

Result<void> sleep(std::chrono::nanoseconds duration) noexcept { return this_fiber::sleep_for(duration); }

}  // namespace spindle
