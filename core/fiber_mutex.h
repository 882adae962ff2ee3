// SPDX-License-Identifier: Apache-2.0
#pragma once
/// FiberMutex: a reader-writer lock for fibers and plain threads that parks waiters instead of blocking
/// their carrier, and prefers writers.
///
/// lock()/try_lock()/unlock() take it exclusively, lock_shared()/try_lock_shared()/unlock_shared() in
/// shared mode; so it meets Lockable and SharedLockable and works with std::lock_guard,
/// std::unique_lock, std::scoped_lock and std::shared_lock. A plain thread may hold it, wait for it
/// and release it like a fiber: it parks its proxy fiber (see core/internal/proxy_fiber.h). It is not
/// recursive in either mode, and the holder must release it itself (exclusive ownership belongs to the
/// fiber, or the thread, that took it; a debug build checks). A fiber must not end holding it.
///
/// Thread-safety: every member may be called at once from any fiber or plain thread, of any runtime.
/// unlock() and unlock_shared() use the mutex's address only as a waiter-table key after releasing,
/// so the next holder may destroy the mutex once nobody waits for it (a primitive built at the same
/// address later may then get a spurious wake-up, which every primitive tolerates).
/// Memory ordering: acquiring (in either mode) is an acquire operation and releasing a release one:
/// what a holder wrote before its unlock is visible to every later holder. Spinning waiters read the
/// owner's Fiber* out of the word but never dereference it (detail::fiberRunsOnACarrier compares it
/// with what each carrier runs), so the owner may end at any time.
/// Fairness: writers are preferred, best effort. Once a writer waits, new readers see it on their
/// fast path and queue behind it instead of joining the readers inside. But a release wakes every
/// waiter (writers first) and they race for the lock: a reader may win and the writer re-queues, and
/// a reader arriving in the instant between the release and the writer's retry may slip in. So
/// writers get in ahead of a stream of readers in practice, yet nobody is promised FIFO order or
/// freedom from starvation. Woken waiters that lose the race park again; lock() never returns without
/// the lock. A holder that unlocks and locks again without yielding in between takes the lock back
/// every time (the woken waiters have not run yet): where hand-off order matters, use FairFiberMutex. A reader that re-enters lock_shared() while a writer waits deadlocks, as with any
/// writer-preferring lock.
/// Cost: uncontended lock() and unlock() are one CAS and one exchange, plus a look at the thread's
/// carrier for the current fiber; lock_shared() and unlock_shared() one CAS each. A contended lock() spins up to 16 PAUSEs (about half a microsecond)
/// but only while the exclusive owner is running on another carrier of the spinner's runtime and nobody
/// is queued (spinning behind readers, an owner that is parked, or a plain thread's hold, which a
/// spinner cannot see running, does not pay; nor does a spinner that is a plain thread, which has no
/// carriers to look at); each look reads one word per carrier; then it arms a waiter bit (one
/// CAS), queues in the WaiterTable (one bucket lock) and parks. A release that finds a waiter bit set
/// adds one WaiterTable::releaseWaiters() per mode waiting.
/// Keys: exclusive waiters queue in the WaiterTable under `this`, shared waiters under the byte after
/// it (`reinterpret_cast<const char*>(this) + 1`).

#include <atomic>
#include <cstdint>

#include "core/internal/fiber.h"

namespace spindle {

class FiberMutex {
public:
    FiberMutex() noexcept = default;
    FiberMutex(const FiberMutex&) = delete;
    FiberMutex& operator=(const FiberMutex&) = delete;

    /// Takes the mutex exclusively, parking until it is free.
    void lock() noexcept {
        uint64_t expected = 0;
        if (!state_.compare_exchange_strong(expected, ownerWord(), std::memory_order_acq_rel,
                                            std::memory_order_relaxed)) {
            lockSlow();
        }
    }
    /// Takes the mutex exclusively if nobody holds it in either mode; never parks.
    [[nodiscard]] bool try_lock() noexcept {
        uint64_t expected = 0;
        return state_.compare_exchange_strong(expected, ownerWord(), std::memory_order_acq_rel,
                                              std::memory_order_relaxed);
    }
    /// Releases exclusive ownership. Precondition: the caller holds it exclusively.
    void unlock() noexcept;

    /// Takes the mutex in shared mode, parking while a writer holds it or waits for it.
    void lock_shared() noexcept {
        uint64_t s = state_.load(std::memory_order_relaxed);
        if ((s & (kExclusive | kExclusiveWaiters)) != 0 ||
            !state_.compare_exchange_strong(s, s + kOneReader, std::memory_order_acquire, std::memory_order_relaxed)) {
            lockSharedSlow();
        }
    }
    /// Takes the mutex in shared mode unless a writer holds it or waits for it; never parks.
    [[nodiscard]] bool try_lock_shared() noexcept;
    /// Releases one shared hold. Precondition: the caller holds the mutex in shared mode.
    void unlock_shared() noexcept;

private:
    // Whether spinning on the exclusive owner named in `seen` could pay: it still holds the mutex and
    // is running (on another carrier or thread, since `self`, the caller, is running here).
    bool ownerRunning(uint64_t seen, const detail::Fiber* self) const noexcept;
    void lockSlow() noexcept;
    void lockSharedSlow() noexcept;
    // Queues under `key` unless `bit` was cleared meanwhile, and parks. Returns when the caller should
    // retry: after a wake-up, or at once if a release already went by.
    void park(const void* key, uint64_t bit) noexcept;
    // Wakes the modes whose waiter bits were set in `old`, the state a release replaced.
    void wake(uint64_t old) const noexcept;
    // What state_ holds while the caller (its fiber, or its thread's proxy) owns the mutex.
    static uint64_t ownerWord() noexcept { return reinterpret_cast<uint64_t>(detail::currentFiber()) | kExclusive; }
    const void* exclusiveKey() const noexcept { return this; }
    const void* sharedKey() const noexcept { return reinterpret_cast<const char*>(this) + 1; }

    // state_, from the top: value:61, exclusive:1, hasExclusiveWaiters:1, hasSharedWaiters:1.
    // Invariant: 0 means free, and is the only free state (every release clears both waiter bits).
    // With kExclusive set, state_ & kValueMask is the owner's Fiber* (fibers are 64-byte aligned, so
    // the low three bits are free); with it clear, state_ >> kValueShift counts the shared holders.
    // A waiter bit is set only while the mutex is held; waiters of that mode may be queued under its key.
    static constexpr uint64_t kSharedWaiters = 1;
    static constexpr uint64_t kExclusiveWaiters = 2;
    static constexpr uint64_t kExclusive = 4;
    static constexpr uint64_t kWaiterBits = kSharedWaiters | kExclusiveWaiters;
    static constexpr unsigned kValueShift = 3;
    static constexpr uint64_t kValueMask = ~uint64_t{7};
    static constexpr uint64_t kOneReader = uint64_t{1} << kValueShift;
    static constexpr unsigned kSpinLimit = 16;  // PAUSEs while the owner runs and nobody is queued

    std::atomic<uint64_t> state_{0};
};

static_assert(sizeof(FiberMutex) == 8, "FiberMutex is one word");

}  // namespace spindle
