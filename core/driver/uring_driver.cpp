// SPDX-License-Identifier: Apache-2.0
#include "core/driver/uring_driver.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/check.h"
#include "base/inject.h"
#include "base/log.h"
#include "core/internal/carrier.h"

namespace spindle::detail {

UringDriver::~UringDriver() { close(); }

void UringDriver::prepare(io_uring_sqe* sqe, const op::Op& o) noexcept {
    using op::Code;
    switch (o.code) {
        case Code::kNop:
            io_uring_prep_nop(sqe);
            break;
        case Code::kRead:
            if ((o.flags & op::kFixedBuffer) != 0) {
                io_uring_prep_read_fixed(sqe, o.fd, o.addr, o.len, o.off, o.bufIndex);
            } else {
                io_uring_prep_read(sqe, o.fd, o.addr, o.len, o.off);
            }
            break;
        case Code::kWrite:
            if ((o.flags & op::kFixedBuffer) != 0) {
                io_uring_prep_write_fixed(sqe, o.fd, o.addr, o.len, o.off, o.bufIndex);
            } else {
                io_uring_prep_write(sqe, o.fd, o.addr, o.len, o.off);
            }
            break;
        case Code::kReadv:
            io_uring_prep_readv(sqe, o.fd, static_cast<const iovec*>(o.addr), o.len, o.off);
            break;
        case Code::kWritev:
            io_uring_prep_writev(sqe, o.fd, static_cast<const iovec*>(o.addr), o.len, o.off);
            break;
        case Code::kFsync:
            io_uring_prep_fsync(sqe, o.fd, (o.opFlags & op::kDatasync) != 0 ? IORING_FSYNC_DATASYNC : 0);
            break;
        case Code::kOpenat:
            io_uring_prep_openat(sqe, o.fd, static_cast<const char*>(o.addr), static_cast<int>(o.opFlags), o.len);
            break;
        case Code::kOpenat2:
            io_uring_prep_openat2(sqe, o.fd, static_cast<const char*>(o.addr), static_cast<open_how*>(o.addr2));
            break;
        case Code::kClose:
            io_uring_prep_close(sqe, o.fd);
            break;
        case Code::kStatx:
            io_uring_prep_statx(sqe, o.fd, static_cast<const char*>(o.addr), static_cast<int>(o.opFlags), o.len,
                                static_cast<struct statx*>(o.addr2));
            break;
        case Code::kFallocate:
            // Values past INT64_MAX turn negative here, and the kernel answers EINVAL, as fallocate(2) does.
            io_uring_prep_fallocate(sqe, o.fd, static_cast<int>(o.opFlags), static_cast<off_t>(o.off),
                                    static_cast<off_t>(o.off2));
            break;
        case Code::kUnlinkat:
            io_uring_prep_unlinkat(sqe, o.fd, static_cast<const char*>(o.addr), static_cast<int>(o.opFlags));
            break;
        case Code::kRenameat:
            io_uring_prep_renameat(sqe, o.fd, static_cast<const char*>(o.addr), o.fd2, static_cast<const char*>(o.addr2),
                                   o.opFlags);
            break;
        case Code::kMkdirat:
            io_uring_prep_mkdirat(sqe, o.fd, static_cast<const char*>(o.addr), o.len);
            break;
        case Code::kPoll:
            io_uring_prep_poll_add(sqe, o.fd, o.len);
            break;
        case Code::kSplice:
            // io_uring reads an offset of -1 as "no offset": splice(2)'s NULL.
            io_uring_prep_splice(sqe, o.fd, static_cast<int64_t>(o.off), o.fd2, static_cast<int64_t>(o.off2), o.len,
                                 o.opFlags);
            break;
        case Code::kTee:
            io_uring_prep_tee(sqe, o.fd, o.fd2, o.len, o.opFlags);
            break;
        case Code::kAccept:
            io_uring_prep_accept(sqe, o.fd, static_cast<sockaddr*>(o.addr), static_cast<socklen_t*>(o.addr2),
                                 static_cast<int>(o.opFlags));
            break;
        case Code::kAcceptMultishot:
            io_uring_prep_multishot_accept(sqe, o.fd, nullptr, nullptr, static_cast<int>(o.opFlags));
            break;
        case Code::kConnect:
            io_uring_prep_connect(sqe, o.fd, static_cast<const sockaddr*>(o.addr), o.len);
            break;
        case Code::kRecv:
            io_uring_prep_recv(sqe, o.fd, o.addr, o.len, static_cast<int>(o.opFlags));
            break;
        case Code::kRecvMultishot:
            io_uring_prep_recv_multishot(sqe, o.fd, nullptr, 0, static_cast<int>(o.opFlags));
            break;
        case Code::kSend:
            io_uring_prep_send(sqe, o.fd, o.addr, o.len, static_cast<int>(o.opFlags));
            break;
        case Code::kRecvmsg:
            io_uring_prep_recvmsg(sqe, o.fd, static_cast<msghdr*>(o.addr), o.opFlags);
            break;
        case Code::kSendmsg:
            io_uring_prep_sendmsg(sqe, o.fd, static_cast<const msghdr*>(o.addr), o.opFlags);
            break;
        case Code::kShutdown:
            io_uring_prep_shutdown(sqe, o.fd, static_cast<int>(o.opFlags));
            break;
    }
    if ((o.flags & op::kFixedFile) != 0) { sqe->flags |= IOSQE_FIXED_FILE; }
    if ((o.flags & op::kBufferSelect) != 0) {
        sqe->flags |= IOSQE_BUFFER_SELECT;
        sqe->buf_group = o.bufIndex;
    }
}

Result<void> UringDriver::init(Carrier* owner) noexcept {
    owner_ = owner;
    if (auto r = ring_.init(options_, &UringDriver::onOverflowReap, this); !r) {
        log::error("carrier {}: io_uring set-up failed: {}", owner->index(), r.error().message());
        return r;
    }
    eventFd_ = ::eventfd(0, EFD_CLOEXEC);
    if (eventFd_ < 0) {
        const int err = errno;
        log::error("carrier {}: eventfd failed: {}", owner->index(), std::strerror(err));
        return Error{err};
    }
    eventOp_ = op::read(eventFd_, &eventBuf_, sizeof(eventBuf_), 0);
    eventRead_.op = &eventOp_;
    eventRead_.complete = &UringDriver::onEventFd;
    eventRead_.driver = this;
    armEventFd();
    (void)ring_.submit(false);
    return {};
}

void UringDriver::close() noexcept {
    // Only once every carrier thread has been joined (~Carrier): until then another thread may still
    // wake this one through its eventfd or ring fd, and a descriptor closed earlier could be reused.
    ring_.close();
    if (eventFd_ >= 0) {
        ::close(eventFd_);
        eventFd_ = -1;
    }
}

void UringDriver::armEventFd() noexcept {
    (void)start(&eventRead_);
    eventFdArmed_ = true;
}

void UringDriver::onEventFd(op::IoRequest* req, int32_t, uint32_t) noexcept {
    auto* self = static_cast<EventRead*>(req)->driver;
    self->eventFdArmed_ = false;
    if (!self->exiting_) { self->armEventFd(); }
}

int32_t UringDriver::startLinked(op::IoRequest* req) noexcept {
    if (req->op->code == op::Code::kSplice || req->op->code == op::Code::kTee) [[unlikely]] { return startTimed(req); }
    // The op and its IORING_OP_LINK_TIMEOUT leave in one submission; the request completes once both
    // CQEs came, so its frame is never reused while the timeout could still cancel by its user_data.
    ring_.reserveSqes(2);
    io_uring_sqe* sqe = ring_.acquireSqe();
    prepare(sqe, *req->op);
    sqe->flags |= IOSQE_IO_LINK;
    io_uring_sqe_set_data64(sqe, userData(req));
    req->uring.timeoutSpec[0] = static_cast<int64_t>(req->deadlineNs / 1000000000u);
    req->uring.timeoutSpec[1] = static_cast<int64_t>(req->deadlineNs % 1000000000u);
    static_assert(sizeof(req->uring.timeoutSpec) == sizeof(__kernel_timespec));
    io_uring_sqe* t = ring_.acquireSqe();
    io_uring_prep_link_timeout(t, reinterpret_cast<__kernel_timespec*>(req->uring.timeoutSpec), IORING_TIMEOUT_ABS);
    io_uring_sqe_set_data64(t, reinterpret_cast<uint64_t>(req) | kTimeoutBit);
    req->driverState = 2;
    inflight_ += 2;
    return kPending;
}

int32_t UringDriver::startTimed(op::IoRequest* req) noexcept {
    ring_.reserveSqes(2);
    io_uring_sqe* sqe = ring_.acquireSqe();
    prepare(sqe, *req->op);
    io_uring_sqe_set_data64(sqe, userData(req));  // kLinkedBit: its CQE's result is kept
    req->uring.timeoutSpec[0] = static_cast<int64_t>(req->deadlineNs / 1000000000u);
    req->uring.timeoutSpec[1] = static_cast<int64_t>(req->deadlineNs % 1000000000u);
    io_uring_sqe* t = ring_.acquireSqe();
    io_uring_prep_timeout(t, reinterpret_cast<__kernel_timespec*>(req->uring.timeoutSpec), 0, IORING_TIMEOUT_ABS);
    io_uring_sqe_set_data64(t, reinterpret_cast<uint64_t>(req) | kTimeoutBit);
    req->driverState = kOwnTimer | kOpDue | kTimerDue;
    inflight_ += 2;
    return kPending;
}

void UringDriver::onTimedCqe(op::IoRequest* req, TimedCqe which, int32_t res) noexcept {
    uint32_t& st = req->driverState;
    switch (which) {
        case TimedCqe::kOp:
            st &= ~kOpDue;
            break;
        case TimedCqe::kTimer:
            st &= ~kTimerDue;
            break;
        case TimedCqe::kControl:
            st &= ~kControlDue;
            break;
    }
    // The op done while the timeout waits: remove it. The timeout fired while the op waits: cancel it.
    const bool removeTimer = which == TimedCqe::kOp && (st & kTimerDue) != 0;
    const bool cancelOp = which == TimedCqe::kTimer && res == -ETIME && (st & kOpDue) != 0;
    if ((removeTimer || cancelOp) && (st & kControlSent) == 0) {
        io_uring_sqe* sqe = ring_.acquireSqe();
        if (removeTimer) {
            io_uring_prep_timeout_remove(sqe, reinterpret_cast<uint64_t>(req) | kTimeoutBit, 0);
        } else {
            io_uring_prep_cancel64(sqe, userData(req), 0);
        }
        io_uring_sqe_set_data64(sqe, reinterpret_cast<uint64_t>(req) | kControlBits);
        st |= kControlSent | kControlDue;
        ++inflight_;
    }
    if ((st & (kOpDue | kTimerDue | kControlDue)) == 0) { req->complete(req, req->uring.savedRes, req->uring.savedFlags); }
}

void UringDriver::cancel(op::IoRequest* req) noexcept {
    io_uring_sqe* sqe = ring_.acquireSqe();
    io_uring_prep_cancel64(sqe, userData(req), 0);
    io_uring_sqe_set_data64(sqe, 0);
}

void UringDriver::cancelAll() noexcept {
    if (inflight() > 0) {
        if (ring_.features().cancelAny) {
            io_uring_sqe* sqe = ring_.acquireSqe();
            io_uring_prep_cancel64(sqe, 0, IORING_ASYNC_CANCEL_ANY);
            io_uring_sqe_set_data64(sqe, 0);
        } else {
            log::warn("carrier {}: this kernel cannot cancel all I/O at once (IORING_ASYNC_CANCEL_ANY, 5.19); "
                      "shutdown waits for {} operations to finish", owner_->index(), inflight());
        }
    }
    (void)ring_.submit(false);
}

void UringDriver::dispatch(const io_uring_cqe* cqe) noexcept {
    const uint64_t ud = cqe->user_data;
    if (ud == 0) { return; }  // a cancel's: nobody waits for it
    if ((ud & kBits) == kWakeTag) [[unlikely]] {
        // A wake-up the kernel refused (a successful one posts no CQE here). Its target cleared its
        // parked flag for it, so no other waker will try: it must not be lost.
        auto* target = reinterpret_cast<UringDriver*>(ud & ~kBits);
        if (!wakeFailureLogged_) {
            wakeFailureLogged_ = true;
            log::warn("carrier {}: a MSG_RING wake-up failed ({}); waking through the eventfd instead",
                      owner_->index(), std::strerror(-cqe->res));
        }
        target->wakeByEventFd();
        return;
    }
    if ((cqe->flags & IORING_CQE_F_MORE) == 0) {
        SPINDLE_ASSERT(inflight_ > 0);
        --inflight_;
    }
    auto* req = reinterpret_cast<op::IoRequest*>(ud & ~kBits);
    if ((ud & (kTimeoutBit | kLinkedBit)) == 0) [[likely]] {
        req->complete(req, cqe->res, cqe->flags);
        return;
    }
    if ((ud & kControlBits) == kControlBits) [[unlikely]] {
        onTimedCqe(req, TimedCqe::kControl, cqe->res);
        return;
    }
    if ((ud & kLinkedBit) != 0) {
        req->uring.savedRes = cqe->res;
        req->uring.savedFlags = cqe->flags;
    }
    if ((req->driverState & kOwnTimer) != 0) [[unlikely]] {
        onTimedCqe(req, (ud & kTimeoutBit) != 0 ? TimedCqe::kTimer : TimedCqe::kOp, cqe->res);
        return;
    }
    if (--req->driverState == 0) { req->complete(req, req->uring.savedRes, req->uring.savedFlags); }
}

void UringDriver::onOverflowReap(void* self, const io_uring_cqe* cqe) { static_cast<UringDriver*>(self)->dispatch(cqe); }

void UringDriver::poll(bool getEvents) noexcept {
    const uint32_t ours = inflight();
    if (ring_.pending() == 0 && ours == 0 && !ring_.needsEnter()) {
        // Nothing of ours in flight; only the eventfd read, whose CQE a wait would show.
        if (!ring_.features().deferTaskrun) {
            ring_.reap([this](const io_uring_cqe* cqe) { dispatch(cqe); });
        }
        return;
    }
    const int r = ring_.submit(getEvents && ours > 0);
    if (r < 0) { log::warn("carrier {}: io_uring submit failed: {}", owner_->index(), std::strerror(-r)); }
    ring_.reap([this](const io_uring_cqe* cqe) { dispatch(cqe); });
}

void UringDriver::wait(int64_t timeoutNs) noexcept {
    __kernel_timespec ts{};
    if (timeoutNs > 0) {
        ts.tv_sec = timeoutNs / 1000000000;
        ts.tv_nsec = timeoutNs % 1000000000;
    }
    const int r = ring_.submitAndWait(timeoutNs > 0 ? &ts : nullptr);
    if (r < 0 && r != -ETIME && r != -EINTR) {
        log::warn("carrier {}: io_uring wait failed: {}", owner_->index(), std::strerror(-r));
    }
}

void UringDriver::sendWake(UringDriver& target) noexcept {
    int fd = target.ring_.fd();
    SPINDLE_INJECT(inject::Point::kWakeFail, { fd = -1; });  // the kernel then refuses it: EBADF
    io_uring_sqe* sqe = ring_.acquireSqe();
    io_uring_prep_msg_ring(sqe, fd, 0, 0, 0);  // the target's CQE has user_data 0: nothing to do
    sqe->flags |= IOSQE_CQE_SKIP_SUCCESS;      // ours comes only on failure (dispatch())
    io_uring_sqe_set_data64(sqe, reinterpret_cast<uint64_t>(&target) | kWakeTag);
    (void)ring_.submit(false);
}

void UringDriver::wakeByEventFd() noexcept {
    const uint64_t one = 1;
    ssize_t w;
    do {
        w = ::write(eventFd_, &one, sizeof(one));
    } while (w < 0 && errno == EINTR);
    SPINDLE_CHECK_MSG(w == sizeof(one), "eventfd write to wake a carrier failed");
}

void UringDriver::wakeFrom(Carrier* from) noexcept {
    if (from != nullptr && from != owner_ && from->driver().backend() == Backend::kUring) {
        auto& src = static_cast<UringDriver&>(from->driver());
        if (src.ring_.initialized() && src.ring_.features().msgRing && !src.exiting_) {
            // Carrier to carrier: a CQE on the target's ring, sent from our own (SINGLE_ISSUER).
            src.sendWake(*this);
            return;
        }
    }
    // A plain thread (or no MSG_RING): the eventfd whose read is always armed on the target's ring.
    wakeByEventFd();
}

void UringDriver::drainForExit() noexcept {
    exiting_ = true;
    // Take the eventfd read back so no completion can outlive the ring.
    if (eventFdArmed_) { cancel(&eventRead_); }
    while (inflight_ > 0) {
        const int r = ring_.submitAndWait(nullptr);
        if (r < 0 && r != -EINTR && r != -ETIME) {
            log::error("carrier {}: io_uring wait failed at exit: {}", owner_->index(), std::strerror(-r));
            break;
        }
        ring_.reap([this](const io_uring_cqe* cqe) { dispatch(cqe); });
    }
}

int32_t UringDriver::runOnThreadRing(const op::Op& o, Deadline deadline, uint32_t* cqeFlags) noexcept {
    struct ThreadRing {
        uring::Ring ring;
        int setupError = 0;
    };
    thread_local ThreadRing tr;
    if (!tr.ring.initialized()) {
        if (tr.setupError != 0) { return kPending; }
        uring::RingOptions opts;
        opts.entries = 8;
        if (auto r = tr.ring.init(opts, [](void*, const io_uring_cqe*) {}, nullptr); !r) {
            tr.setupError = r.errorCode();
            return kPending;
        }
    }
    // The operation's CQE carries user_data 8, a linked timeout's 16; both are awaited (see start()).
    // A splice or tee has a timeout of its own (see startTimed): its removal or the op's cancel,
    // whichever is needed, carries 24 and is awaited too.
    const bool ownTimer = o.code == op::Code::kSplice || o.code == op::Code::kTee;
    tr.ring.reserveSqes(2);
    io_uring_sqe* sqe = tr.ring.acquireSqe();
    prepare(sqe, o);
    io_uring_sqe_set_data64(sqe, 8);
    __kernel_timespec ts{};
    if (deadline.isSet()) {
        ts.tv_sec = static_cast<int64_t>(deadline.ns() / 1000000000u);
        ts.tv_nsec = static_cast<long long>(deadline.ns() % 1000000000u);
        io_uring_sqe* t = tr.ring.acquireSqe();
        if (ownTimer) {
            io_uring_prep_timeout(t, &ts, 0, IORING_TIMEOUT_ABS);
        } else {
            sqe->flags |= IOSQE_IO_LINK;
            io_uring_prep_link_timeout(t, &ts, IORING_TIMEOUT_ABS);
        }
        io_uring_sqe_set_data64(t, 16);
    }
    bool done = false;
    bool timeoutDone = !deadline.isSet();
    bool controlSent = false;
    bool controlDone = true;
    int32_t res = 0;
    // No return before both CQEs: the kernel may hold the caller's buffer (and `ts`) until then,
    // and an SQE left unsubmitted would go out with the thread's next call.
    while (!done || !timeoutDone || !controlDone) {
        const int w = tr.ring.submitAndWait(nullptr);
        if (w == -ENOMEM || w == -EAGAIN || w == -EBUSY) {
            ::usleep(1000);  // the kernel is short of memory: try again shortly
            continue;
        }
        SPINDLE_CHECK_MSG(w >= 0 || w == -EINTR || w == -ETIME,
                          "io_uring_enter failed on a plain thread's ring with an operation in flight");
        tr.ring.reap([&](const io_uring_cqe* cqe) {
            if (cqe->user_data == 8) {
                res = cqe->res;
                if (cqeFlags != nullptr) { *cqeFlags = cqe->flags; }
                done = true;
            } else if (cqe->user_data == 16) {
                timeoutDone = true;
            } else {
                controlDone = true;
            }
            const bool removeTimer = cqe->user_data == 8 && !timeoutDone;
            const bool cancelOp = cqe->user_data == 16 && !done && cqe->res == -ETIME;
            if (ownTimer && !controlSent && (removeTimer || cancelOp)) {
                io_uring_sqe* c = tr.ring.acquireSqe();
                if (removeTimer) {
                    io_uring_prep_timeout_remove(c, 16, 0);
                } else {
                    io_uring_prep_cancel64(c, 8, 0);
                }
                io_uring_sqe_set_data64(c, 24);
                controlSent = true;
                controlDone = false;
            }
        });
    }
    return res;
}

std::string UringDriver::describe() const { return "io_uring " + ring_.features().describe(); }

Driver::Counters UringDriver::counters() const noexcept {
    const uring::RingStats& s = ring_.stats();
    Counters c;
    c.enters = s.enters.load(std::memory_order_relaxed);
    c.submitted = s.sqesSubmitted.load(std::memory_order_relaxed);
    c.completed = s.cqesReaped.load(std::memory_order_relaxed);
    c.queueFull = s.sqFull.load(std::memory_order_relaxed);
    return c;
}

}  // namespace spindle::detail
