// SPDX-License-Identifier: Apache-2.0
#pragma once
/// FiberSemaphore: a counting semaphore for fibers and plain threads, mostly to bound how many callers
/// are inside some section at once.
///
/// acquire() takes one permit, parking the fiber (or blocking the thread) while none is available;
/// release(n) returns n permits. Waiters queue in arrival order, and release() hands permits straight to
/// queued waiters, oldest first, before anything is added to the free count.
///
/// Thread-safety: every member may be called concurrently from any fiber or thread. A permit is not
/// owned: any caller may release() it (unlike a mutex). Destroy the semaphore only once no call on it can
/// still be running (a timed acquire racing a release takes the internal spin lock once more on its way
/// out).
/// Memory ordering: a release() happens before the acquire that obtains one of its permits (directly by
/// hand-off, or through the free count), so a permit can carry data like a lock does.
/// Fairness: strictly FIFO among waiters. Invariant: while anyone is queued the free count is zero, and
/// release() serves the queue first, so a newcomer (try_acquire() included) cannot take a permit that a
/// queued waiter is owed. A caller that finds permits free takes one without queueing; nobody can be
/// queued then. There are no spurious wake-ups: a parked acquire returns only holding a permit, or (timed
/// forms) after its deadline. The price of strict hand-off: under contention a released permit is idle
/// until its waiter is scheduled, so a FiberSemaphore(1) used as a busy mutex convoys. It is meant for
/// bounding concurrency; FiberMutex is the mutex.
/// Cancellation/timeouts: try_acquire_for()/try_acquire_until() return false only after withdrawing from
/// the queue, having taken nothing. If a release() picks the waiter just as its deadline expires, the
/// waiter keeps that permit and returns true; a permit is never dropped on the floor. A zero or past
/// deadline makes one try_acquire(). On a fiber, runtime shutdown ends a timed acquire early with false
/// (shutdown fires every timer, and arms no new ones); an untimed acquire stays parked until released.
/// Durations are clamped (hours::max() waits practically forever); deadlines are steady_clock.
/// Cost: with a permit free, acquire() and try_acquire() are one CAS; release() with nobody queued is one
/// spin lock round trip and one atomic add. Parking costs one spin lock round trip plus the switch; each
/// hand-off is one FiberFuture::set(), made after the spin lock is released. available() is one load.

#include <atomic>
#include <chrono>
#include <cstdint>

#include "core/internal/sync_support.h"

namespace spindle {

class FiberSemaphore {
public:
    /// Precondition: initial >= 0.
    explicit FiberSemaphore(int64_t initial) noexcept;
    FiberSemaphore(const FiberSemaphore&) = delete;
    FiberSemaphore& operator=(const FiberSemaphore&) = delete;
    /// Precondition: nobody waits (checked in debug builds).
    ~FiberSemaphore();

    /// Takes one permit, parking until one is handed over.
    void acquire() noexcept;
    /// Takes one permit if one is free right now. Never queues, never takes a queued waiter's permit.
    [[nodiscard]] bool try_acquire() noexcept;
    /// Takes one permit, waiting at most `timeout`; false (and nothing taken) on timeout.
    template <class Rep, class Period>
    [[nodiscard]] bool try_acquire_for(const std::chrono::duration<Rep, Period>& timeout) noexcept {
        return acquireFor(detail::clampTimeout(timeout));
    }
    /// Takes one permit, waiting until `deadline` at the latest; false (and nothing taken) on timeout.
    template <class Duration>
    [[nodiscard]] bool try_acquire_until(
        const std::chrono::time_point<std::chrono::steady_clock, Duration>& deadline) noexcept {
        return acquireFor(detail::timeoutUntil(deadline));
    }

    /// Returns `n` permits: queued waiters get them first, in order; the rest become free.
    /// Precondition: n >= 0, and the free count stays below INT64_MAX.
    void release(int64_t n = 1) noexcept;

    /// The permits free right now (0 while anyone is queued). A snapshot: it may be stale on return.
    [[nodiscard]] int64_t available() const noexcept { return count_.load(std::memory_order_relaxed); }

private:
    struct Waiter;

    bool tryTake() noexcept;
    bool acquireFor(std::chrono::nanoseconds timeout) noexcept;
    /// Takes a free permit, or queues `w`; false: queued. Takes lock_ itself.
    bool takeOrEnqueue(Waiter* w) noexcept;

    // Invariant: count_ >= 0, and a non-empty waiters_ implies count_ == 0. count_ grows only under lock_;
    // outside it only tryTake()'s CAS shrinks it, and only from a positive value.
    std::atomic<int64_t> count_;
    detail::SpinLock lock_;
    detail::IntrusiveFifo<Waiter> waiters_;  // the oldest first; guarded by lock_
};

}  // namespace spindle
