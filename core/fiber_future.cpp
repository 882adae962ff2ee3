// SPDX-License-Identifier: Apache-2.0
#include "core/fiber_future.h"

#include <time.h>

#include <cerrno>

#include "base/check.h"
#include "base/relax.h"
#include "core/fiber.h"
#include "core/internal/carrier.h"
#include "core/internal/sync_support.h"
#include "core/internal/fiber.h"
#include "core/internal/proxy_fiber.h"
#include "core/internal/runtime_impl.h"

namespace spindle {
namespace detail {

/// The shared state of one waitForMultiple call; lives in the waiter's frame.
/// Invariant: word_ is 0, kSignalled, or the waiter's Fiber* once it parked.
struct MultiWaitState {
    static constexpr uint64_t kSignalled = 1;
    std::atomic<uint64_t> word{0};
    std::atomic<uint32_t> signals{0};  // set() calls that are done touching this state

    void signal() noexcept {
        const uint64_t old = word.exchange(kSignalled, std::memory_order_acq_rel);
        if (old > kSignalled) { makeRunnable(reinterpret_cast<Fiber*>(old)); }
        signals.fetch_add(1, std::memory_order_release);  // the last touch
    }
};

}  // namespace detail

void FiberFuture::set(int32_t res) noexcept {
    res_ = res;
    const uint64_t old = state_.exchange(kSet, std::memory_order_acq_rel);
    if (old == 0) { return; }
    SPINDLE_ASSERT((old & kSet) == 0 && "FiberFuture set twice");
    if ((old & kMulti) != 0) {
        reinterpret_cast<detail::MultiWaitState*>(old & ~kTagBits)->signal();
        return;
    }
    detail::makeRunnable(reinterpret_cast<detail::Fiber*>(old));
}

int32_t FiberFuture::wait(detail::WaitKind kind, const void* object, uint64_t deadlineNs) noexcept {
    if ((state_.load(std::memory_order_acquire) & kSet) != 0) { return res_; }
    detail::Fiber* self = detail::currentFiber();
    detail::noteWait(self, kind, object, deadlineNs);
    // Runs once the fiber is switched out: publish it as the waiter, unless set()
    // came first, in which case it goes straight back on the run queue.
    auto publish = [this](detail::Fiber* f) {
        uint64_t expected = 0;
        if (!state_.compare_exchange_strong(expected, reinterpret_cast<uint64_t>(f), std::memory_order_acq_rel,
                                            std::memory_order_acquire)) {
            detail::makeRunnable(f);
        }
    };
    detail::suspendWith(self, publish);
    SPINDLE_ASSERT((state_.load(std::memory_order_acquire) & kSet) != 0);
    (void)state_.load(std::memory_order_acquire);
    return res_;
}

int32_t FiberFuture::waitLocal() noexcept {
    if ((state_.load(std::memory_order_relaxed) & kSet) != 0) { return res_; }
    detail::Carrier* c = detail::Carrier::current();
    SPINDLE_ASSERT(c != nullptr && c->running() != nullptr);
    // Publish before switching: only this thread can set the future, and only
    // after we have switched away.
    state_.store(reinterpret_cast<uint64_t>(c->running()), std::memory_order_relaxed);
    detail::Carrier::suspendRunning(detail::SuspendAction{});
    return res_;
}

void FiberFuture::setLocal(int32_t res) noexcept {
    res_ = res;
    const uint64_t old = state_.load(std::memory_order_relaxed);
    state_.store(kSet, std::memory_order_relaxed);
    SPINDLE_ASSERT(old != 0 && (old & kTagBits) == 0);
    auto* fiber = reinterpret_cast<detail::Fiber*>(old);
    fiber->waitOn_.store(nullptr, std::memory_order_relaxed);  // its I/O wait ends here, on the owner
    detail::makeRunnable(fiber);
}

size_t FiberFuture::waitForMultiple(FiberFuture* const* futures, size_t count) noexcept {
    return waitForMultipleNoted(futures, count, detail::WaitKind::kFuture, futures[0], 0);
}

size_t FiberFuture::waitForMultipleNoted(FiberFuture* const* futures, size_t count, detail::WaitKind kind,
                                         const void* object, uint64_t deadlineNs) noexcept {
    SPINDLE_CHECK(count > 0);
    detail::MultiWaitState ms;
    const uint64_t tagged = reinterpret_cast<uint64_t>(&ms) | kMulti;
    size_t attached = 0;
    bool ready = false;
    for (; attached < count; ++attached) {
        uint64_t expected = 0;
        if (!futures[attached]->state_.compare_exchange_strong(expected, tagged, std::memory_order_acq_rel,
                                                               std::memory_order_acquire)) {
            SPINDLE_ASSERT((expected & kSet) != 0 && "a future may have only one waiter");
            ready = true;
            break;
        }
    }
    if (!ready) {
        detail::Fiber* self = detail::currentFiber();
        detail::noteWait(self, kind, object, deadlineNs);
        auto publish = [&ms](detail::Fiber* f) {
            uint64_t expected = 0;
            if (!ms.word.compare_exchange_strong(expected, reinterpret_cast<uint64_t>(f), std::memory_order_acq_rel,
                                                 std::memory_order_acquire)) {
                detail::makeRunnable(f);
            }
        };
        detail::suspendWith(self, publish);
    }
    // Detach. A future we cannot detach was set meanwhile: its set() is inside
    // (or about to enter) ms.signal(), and ms must outlive that call.
    uint32_t racing = 0;
    for (size_t i = 0; i < attached; ++i) {
        uint64_t expected = tagged;
        if (!futures[i]->state_.compare_exchange_strong(expected, 0, std::memory_order_acq_rel,
                                                        std::memory_order_acquire)) {
            ++racing;
        }
    }
    for (unsigned spins = 0; ms.signals.load(std::memory_order_acquire) < racing; ++spins) {
        if (spins < 256) {
            cpuRelax();
        } else {
            this_fiber::yield();
        }
    }
    for (size_t i = 0; i < count; ++i) {
        if (futures[i]->isSet()) { return i; }
    }
    SPINDLE_CHECK_MSG(false, "waitForMultiple woke with no future set");
    return 0;
}

int32_t FiberFuture::waitWithTimeout(FiberFuture* future, std::chrono::nanoseconds timeout, detail::WaitKind kind,
                                     const void* object) noexcept {
    if (future->isSet()) { return future->res_; }
    if (timeout.count() <= 0) { return -ETIMEDOUT; }
    const std::chrono::nanoseconds clamped = detail::clampTimeout(timeout);
    // No limit: a timer that never comes due (UINT64_MAX), there only for a cancel to fire. The carrier
    // parks without a timeout for it, as for no timer at all; with a finite one every park would cost
    // the kernel a timer armed and cancelled.
    const uint64_t deadline = clamped == detail::kMaxTimeout
                                  ? UINT64_MAX
                                  : detail::nowNs() + static_cast<uint64_t>(clamped.count());
    detail::Fiber* self = detail::currentFiber();

    if (self->proxy_) {
        // A plain thread: a timed sleep on its semaphore, then withdraw if still unset.
        auto* proxy = static_cast<detail::ProxyFiber*>(self);
        uint64_t expected = 0;
        if (!future->state_.compare_exchange_strong(expected, reinterpret_cast<uint64_t>(proxy),
                                                    std::memory_order_acq_rel, std::memory_order_acquire)) {
            return future->res_;
        }
        const timespec ts{static_cast<time_t>(deadline / 1000000000u), static_cast<long>(deadline % 1000000000u)};
        if (deadline == UINT64_MAX) {
            proxy->block();  // a plain thread cannot be cancelled: only the set ends this wait
        } else if (!proxy->blockUntil(ts)) {
            expected = reinterpret_cast<uint64_t>(proxy);
            if (future->state_.compare_exchange_strong(expected, 0, std::memory_order_acq_rel,
                                                       std::memory_order_acquire)) {
                return -ETIMEDOUT;
            }
            proxy->block();  // set() won the race: its post is on the way
        }
        (void)future->state_.load(std::memory_order_acquire);
        return future->res_;
    }

    detail::Carrier* c = detail::Carrier::current();
    FiberFuture fired;
    detail::TimerEntry entry;
    entry.fired = &fired;
    entry.waiter = self;
    // FiberHandle::cancel() ends the wait by firing the timer early with -ECANCELED.
    if (!detail::beginCancellableWait(self, c, detail::CancelPoint::Kind::kTimer, &entry)) {
        return future->isSet() ? future->res_ : -ECANCELED;
    }
    if (const int err = c->addTimer(&entry, deadline); err != 0) {
        self->waitOn_.store(nullptr, std::memory_order_relaxed);
        return future->isSet() ? future->res_ : -err;
    }
    FiberFuture* both[2] = {future, &fired};
    (void)waitForMultipleNoted(both, 2, kind, object, deadline);
    if (!fired.isSet()) { detail::Carrier::cancelTimer(&entry); }
    SPINDLE_ASSERT(fired.isSet());
    if (future->isSet()) { return future->res_; }
    return fired.res_ == -ECANCELED ? -ECANCELED : -ETIMEDOUT;
}

}  // namespace spindle
