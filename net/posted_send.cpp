// SPDX-License-Identifier: Apache-2.0
#include "net/posted_send.h"

#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "core/fiber.h"
#include "net/internal/ops.h"

namespace spindle::net {

PostedSend::PostedSend(int fd) noexcept : fd_(fd) { completion_.fn = &PostedSend::onComplete; }

PostedSend::~PostedSend() {
    if (!inFlight_) { return; }
    (void)cancelMultishot(&completion_);  // no effect on a send that has completed
    (void)completion_.done.wait();
    settleMultishot(&completion_);
}

void PostedSend::onComplete(MultishotCompletion* self, int32_t res, uint32_t /*flags*/) noexcept {
    auto* c = static_cast<Completion*>(self);
    if (c->hook != nullptr && c->last && res >= 0 && static_cast<uint32_t>(res) == c->opStorage.len) {
        c->hook(c->hookArg);
    }
    c->done.set(res);
}

Result<void> PostedSend::post(const void* buf, size_t len) noexcept {
    if (error_ == 0 && inFlight_) { (void)settle(Deadline{}, /*cancellable=*/false); }
    if (error_ != 0) { return Error{error_}; }
    if (len == 0) { return {}; }
    rest_ = static_cast<const char*>(buf);
    restLen_ = len;
    ++stats_.posted;
    if (!this_fiber::inFiber()) {
        // A plain thread (or a function a carrier runs outside a fiber, which must not wait for its
        // own carrier's completion): everything now.
        error_ = finishSynchronously(Deadline{});
    } else {
        start();
    }
    if (error_ != 0) { return Error{error_}; }
    return {};
}

Result<void> PostedSend::flush(Deadline deadline) noexcept {
    if (error_ == 0 && inFlight_) { (void)settle(deadline, /*cancellable=*/true); }
    if (error_ != 0) { return Error{error_}; }
    return {};
}

void PostedSend::start() noexcept {
    if (carrierSendsInline()) {
        // The carrier has nothing else to do (or is on epoll, whose driver would make this call): the
        // socket takes the bytes now, and the driver sees only what it did not take. One try: a
        // socket that took part of a large buffer is full, and looping here would hold the carrier.
        const auto n = std::min(restLen_, detail::kMaxIo);
        const long r = ::syscall(SYS_sendto, fd_, rest_, n, MSG_DONTWAIT | MSG_NOSIGNAL, nullptr, 0);
        if (r >= 0) {
            afterInlineSend();
            rest_ += r;
            restLen_ -= static_cast<size_t>(r);
        } else if (errno != EAGAIN && errno != EINTR) {
            error_ = errno;
            return;
        }
    }
    while (restLen_ > 0) {
        const auto n = static_cast<uint32_t>(std::min(restLen_, detail::kMaxIo));
        // MSG_WAITALL: io_uring goes on after a short send on a stream socket until every byte left
        // or the send failed, so a completion is nearly always the whole buffer.
        completion_.last = n == restLen_;
        const std::optional<int32_t> r = startDetached(op::send(fd_, rest_, n, MSG_NOSIGNAL | MSG_WAITALL), &completion_);
        if (!r) {
            inFlight_ = true;
            ++stats_.detached;
            return;
        }
        if (*r < 0) {
            error_ = -*r;
            return;
        }
        rest_ += *r;
        restLen_ -= static_cast<size_t>(*r);
    }
}

int PostedSend::settle(Deadline deadline, bool cancellable) noexcept {
    FiberFuture& done = completion_.done;
    int32_t waited = 0;
    if (!done.isSet()) {
        ++stats_.waited;
        waited = cancellable ? waitMultishot(&done, &completion_, deadline) : done.wait();
        if (!done.isSet()) {
            // A timeout or a cancel while the send was in flight: end it before its buffer is let go.
            (void)cancelMultishot(&completion_);
            (void)done.wait();
        }
    }
    int32_t res = done.result();
    done.reset();
    settleMultishot(&completion_);
    inFlight_ = false;
    if (res == -ECANCELED && waited < 0) { res = waited; }  // the wait's reason (ETIMEDOUT) ended it
    if (res < 0) {
        error_ = -res;
        return error_;
    }
    rest_ += res;
    restLen_ -= std::min(restLen_, static_cast<size_t>(res));
    if (restLen_ > 0) {
        // A short send (interrupted, or cancelled after a part left). The deadline, or the reason
        // the wait ended, still holds for the rest.
        error_ = waited < 0 ? -waited : finishSynchronously(deadline);
    }
    return error_;
}

int PostedSend::finishSynchronously(Deadline deadline) noexcept {
    while (restLen_ > 0) {
        const Result<size_t> r = detail::send(fd_, rest_, restLen_, 0, deadline);
        if (!r) { return r.errorCode(); }
        rest_ += *r;
        restLen_ -= *r;
    }
    return 0;
}

}  // namespace spindle::net
