// SPDX-License-Identifier: Apache-2.0
#include "core/fiber_mutex.h"

#include "base/check.h"
#include "base/relax.h"
#include "core/internal/waiter_table.h"

namespace spindle {

static_assert(alignof(detail::Fiber) >= 8, "the owner's Fiber* leaves the low three bits of state_ free");

void FiberMutex::unlock() noexcept {
    SPINDLE_ASSERT((state_.load(std::memory_order_relaxed) & kValueMask) ==
                       reinterpret_cast<uint64_t>(detail::currentFiber()) &&
                   "FiberMutex::unlock() by a fiber or thread that does not hold it exclusively");
    const uint64_t old = state_.exchange(0, std::memory_order_seq_cst);
    if ((old & kWaiterBits) != 0) { wake(old); }
}

bool FiberMutex::try_lock_shared() noexcept {
    uint64_t s = state_.load(std::memory_order_relaxed);
    while ((s & (kExclusive | kExclusiveWaiters)) == 0) {
        if (state_.compare_exchange_weak(s, s + kOneReader, std::memory_order_acquire, std::memory_order_relaxed)) {
            return true;
        }
    }
    return false;
}

void FiberMutex::unlock_shared() noexcept {
    uint64_t s = state_.load(std::memory_order_relaxed);
    uint64_t next;
    do {
        SPINDLE_ASSERT((s & kExclusive) == 0 && (s >> kValueShift) > 0 &&
                       "FiberMutex::unlock_shared() without a shared hold");
        // The last reader out frees the mutex, which clears the waiter bits with it.
        next = (s >> kValueShift) == 1 ? 0 : s - kOneReader;
    } while (!state_.compare_exchange_weak(s, next, std::memory_order_release, std::memory_order_relaxed));
    if (next == 0 && (s & kWaiterBits) != 0) { wake(s); }
}

void FiberMutex::wake(uint64_t old) const noexcept {
    detail::WaiterTable& table = detail::WaiterTable::instance();
    // Writers first: they are made runnable before the readers, which gives them a head start.
    if ((old & kExclusiveWaiters) != 0) { (void)table.releaseWaiters(exclusiveKey()); }
    if ((old & kSharedWaiters) != 0) { (void)table.releaseWaiters(sharedKey()); }
}

bool FiberMutex::ownerRunning(uint64_t seen, const detail::Fiber* self) const noexcept {
    if ((seen & kExclusive) == 0) { return false; }  // readers leave no identity to look at
    const auto* owner = reinterpret_cast<const detail::Fiber*>(seen & kValueMask);
    SPINDLE_CHECK_MSG(owner != self, "FiberMutex taken again by its exclusive owner: it is not recursive");
    // The owner may unlock and end at any moment, so it is never read: only compared with what the
    // carriers say they run (a process-wide counter of such reads used to bounce between every
    // spinner and every fiber release).
    return detail::fiberRunsOnACarrier(owner);
}

void FiberMutex::park(const void* key, uint64_t bit) noexcept {
    detail::WaiterTable& table = detail::WaiterTable::instance();
    detail::Waiter node;
    table.enqueueWaiter(key, &node);
    // A release may have cleared the bit between our arming it and our enqueueing, and released the
    // table without us. If the bit is clear now, leave instead of parking; if it is still set, the
    // release that clears it will find us (see WaiterTable's Memory ordering).
    if ((state_.load(std::memory_order_acquire) & bit) == 0 && table.removeWaiter(key, &node)) { return; }
    (void)node.ready.wait(detail::WaitKind::kMutex, this);
}

void FiberMutex::lockSlow() noexcept {
    const detail::Fiber* self = detail::currentFiber();
    const uint64_t mine = reinterpret_cast<uint64_t>(self) | kExclusive;
    unsigned spins = 0;
    for (;;) {
        uint64_t s = state_.load(std::memory_order_relaxed);
        if (s == 0) {
            if (state_.compare_exchange_weak(s, mine, std::memory_order_acq_rel, std::memory_order_relaxed)) {
                return;
            }
            continue;
        }
        if ((s & kWaiterBits) == 0 && spins < kSpinLimit && ownerRunning(s, self)) {
            ++spins;
            cpuRelax();
            continue;
        }
        if ((s & kExclusiveWaiters) == 0 &&
            !state_.compare_exchange_weak(s, s | kExclusiveWaiters, std::memory_order_relaxed,
                                          std::memory_order_relaxed)) {
            continue;
        }
        park(exclusiveKey(), kExclusiveWaiters);
    }
}

void FiberMutex::lockSharedSlow() noexcept {
    const detail::Fiber* self = detail::currentFiber();
    unsigned spins = 0;
    for (;;) {
        uint64_t s = state_.load(std::memory_order_relaxed);
        if ((s & (kExclusive | kExclusiveWaiters)) == 0) {
            if (state_.compare_exchange_weak(s, s + kOneReader, std::memory_order_acquire,
                                             std::memory_order_relaxed)) {
                return;
            }
            continue;
        }
        if ((s & kWaiterBits) == 0 && spins < kSpinLimit && ownerRunning(s, self)) {
            ++spins;
            cpuRelax();
            continue;
        }
        if ((s & kSharedWaiters) == 0 &&
            !state_.compare_exchange_weak(s, s | kSharedWaiters, std::memory_order_relaxed,
                                          std::memory_order_relaxed)) {
            continue;
        }
        park(sharedKey(), kSharedWaiters);
    }
}

}  // namespace spindle
