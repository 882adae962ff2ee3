// SPDX-License-Identifier: Apache-2.0
#pragma once
/// FiberFutex: a 63-bit event counter that fibers and plain threads wait on until it reaches a value.
///
/// post() adds one to the counter and wakes every waiter. wait(target) returns once the counter is at
/// least `target`. The idiom is the Linux futex's: read `seen = get()`, test the condition the counter
/// guards, and if it does not hold yet, `wait(seen + 1)`. That returns as soon as any post() made
/// after the get() has happened, so a post() that lands between the test and the park is never lost.
/// wait() with no argument is wait(get() + 1): it waits for a post() that comes after the call.
///
/// The counter starts at 0 and never goes back; after 2^63 posts it would wrap round to 0, which at a
/// billion posts a second takes three centuries.
///
/// Thread-safety: every member may be called at once from any fiber or plain thread, of any runtime.
/// The futex must outlive every call on it. After its atomic update, post() uses the futex's address
/// only as a waiter-table key, so a waiter may destroy the futex once its wait returned (a primitive
/// built at the same address later may then get a spurious wake-up, which every primitive tolerates).
/// Memory ordering: post() is a release operation and get() and every wait return an acquire: what a
/// thread wrote before post() is visible to anyone who then sees the counter at or past that post's
/// value, including a wait() that returned because of it.
/// Fairness: post() wakes all waiters; which of them runs first is up to the carriers. Waits do not
/// return spuriously: a waiter that is woken (by a post that did not bring the counter to its
/// target, or by the internal race below) re-checks and parks again. No waiter is starved, because
/// each one leaves as soon as the counter reaches its target.
/// Cost: post() with nobody queued is one CAS. wait() on a counter already at its target is one
/// load; otherwise it spins up to 16 PAUSEs (about half a microsecond) while nobody is queued, then
/// arms the waiter bit (one CAS), queues in the WaiterTable (one bucket lock) and parks. post() with
/// the waiter bit set adds one WaiterTable::releaseWaiters(): a bucket lock, a list walk and one
/// FiberFuture::set() per waiter.

#include <atomic>
#include <chrono>
#include <cstdint>

namespace spindle {

class FiberFutex {
public:
    FiberFutex() noexcept = default;
    FiberFutex(const FiberFutex&) = delete;
    FiberFutex& operator=(const FiberFutex&) = delete;

    /// The counter (acquire).
    [[nodiscard]] uint64_t get() const noexcept { return state_.load(std::memory_order_acquire) >> kCounterShift; }

    /// Returns once the counter is at least `target`; parks the fiber (or blocks the thread) until then.
    void wait(uint64_t target) noexcept;
    /// wait(get() + 1): returns after a post() that happens after this call began.
    void wait() noexcept { wait(get() + 1); }

    /// wait(target), giving up after `timeout`. Returns 0 once the counter is at least `target`,
    /// -ETIMEDOUT when the time ran out first, or -ECANCELED on a fiber whose runtime is shutting down
    /// (no timer can be armed any more). Either way the waiter has left the waiter table.
    [[nodiscard]] int waitFor(uint64_t target, std::chrono::nanoseconds timeout) noexcept;

    /// Adds one to the counter and wakes every waiter.
    void post() noexcept;

private:
    // Shared by wait() (deadline null) and waitFor().
    int waitUntil(uint64_t target, const std::chrono::steady_clock::time_point* deadline) noexcept;

    // state_ = counter << 1 | kHasWaiters.
    // Invariant: while a waiter is parked in the WaiterTable under `this`, kHasWaiters is set, or a
    // post() that cleared it is about to release the table (it clears the bit first, then releases).
    // The bit may stay set with nobody queued (a waiter timed out); the next post() then finds nobody.
    static constexpr uint64_t kHasWaiters = 1;
    static constexpr unsigned kCounterShift = 1;
    static constexpr uint64_t kOne = uint64_t{1} << kCounterShift;
    static constexpr unsigned kSpinLimit = 16;  // PAUSEs before parking while nobody is queued

    std::atomic<uint64_t> state_{0};
};

static_assert(sizeof(FiberFutex) == 8, "FiberFutex is one word");

}  // namespace spindle
