// SPDX-License-Identifier: Apache-2.0
#include "core/fiber_futex.h"

#include <cerrno>

#include "base/relax.h"
#include "core/internal/sync_support.h"
#include "core/internal/waiter_table.h"

namespace spindle {

void FiberFutex::wait(uint64_t target) noexcept { (void)waitUntil(target, nullptr); }

int FiberFutex::waitFor(uint64_t target, std::chrono::nanoseconds timeout) noexcept {
    const auto deadline = std::chrono::steady_clock::now() + detail::clampTimeout(timeout);  // no wrap-round
    return waitUntil(target, &deadline);
}

void FiberFutex::post() noexcept {
    uint64_t old = state_.load(std::memory_order_relaxed);
    // One CAS counts the post and clears the waiter bit: a waiter that armed the bit before it is
    // released below, and one that arms it afterwards re-reads the counter and sees this post.
    while (!state_.compare_exchange_weak(old, (old & ~kHasWaiters) + kOne, std::memory_order_release,
                                         std::memory_order_relaxed)) {}
    if ((old & kHasWaiters) != 0) { (void)detail::WaiterTable::instance().releaseWaiters(this); }
}

int FiberFutex::waitUntil(uint64_t target, const std::chrono::steady_clock::time_point* deadline) noexcept {
    detail::WaiterTable& table = detail::WaiterTable::instance();
    unsigned spins = 0;
    for (;;) {
        uint64_t s = state_.load(std::memory_order_acquire);
        if ((s >> kCounterShift) >= target) { return 0; }
        // Nobody is queued: a post may be imminent, and parking costs far more than a short spin.
        if ((s & kHasWaiters) == 0 && spins < kSpinLimit) {
            ++spins;
            cpuRelax();
            continue;
        }
        std::chrono::nanoseconds left{0};
        if (deadline != nullptr) {
            left = *deadline - std::chrono::steady_clock::now();
            if (left.count() <= 0) { return -ETIMEDOUT; }
        }
        if ((s & kHasWaiters) == 0 &&
            !state_.compare_exchange_weak(s, s | kHasWaiters, std::memory_order_relaxed, std::memory_order_relaxed)) {
            continue;  // a post (or another waiter) got in first: look again
        }

        detail::Waiter node;
        table.enqueueWaiter(this, &node);
        // A post() may have taken the bit between our arming it and our enqueueing, and released the
        // table without us. Then the bit is clear (or the counter moved) now: leave and look again.
        s = state_.load(std::memory_order_acquire);
        if ((s >> kCounterShift) >= target || (s & kHasWaiters) == 0) {
            if (!table.removeWaiter(this, &node)) { (void)node.ready.wait(detail::WaitKind::kFutex, this); }  // a release beat us to it
            continue;
        }
        if (deadline == nullptr) {
            (void)node.ready.wait(detail::WaitKind::kFutex, this);
            continue;
        }
        const int32_t r = FiberFuture::waitWithTimeout(&node.ready, left, detail::WaitKind::kFutex, this);
        if (r >= 0) { continue; }  // released: re-check the counter
        if (!table.removeWaiter(this, &node)) {
            // Released at the deadline: its set() is on the way. Take it, then re-check (the loop
            // returns 0 if the counter made it, -ETIMEDOUT otherwise).
            (void)node.ready.wait(detail::WaitKind::kFutex, this);
            continue;
        }
        return (state_.load(std::memory_order_acquire) >> kCounterShift) >= target ? 0 : r;
    }
}

}  // namespace spindle
