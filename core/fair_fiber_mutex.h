// SPDX-License-Identifier: Apache-2.0
#pragma once
/// FairFiberMutex: a first-come, first-served mutex for fibers and threads, a ticket lock over a
/// FiberSequencer.
///
/// lock() draws the next ticket from an issue counter and waits until the sequencer's counter (the ticket
/// being served) reaches it; unlock() moves the served counter on by one, which hands the lock straight
/// to the holder of the next ticket. It meets the standard BasicLockable and Lockable requirements, so
/// std::lock_guard, std::unique_lock and std::scoped_lock work with it. It is not recursive.
///
/// Thread-safety: every member may be called from any fiber or plain thread. unlock() must be called by
/// the current owner, which may be on another carrier or thread than the one that locked (a fiber may
/// migrate while it holds the lock).
///
/// Memory ordering: what the owner wrote before unlock() is visible to the next owner once its lock()
/// returns, its lock(Future*) future is set, or its try_lock() returns true.
///
/// Fairness: strict FIFO in ticket order, that is, in the order the callers' lock() calls drew a ticket.
/// Nobody barges: try_lock() succeeds only when no ticket is outstanding at all. The price is paid under
/// contention: every hand-off wakes one particular waiter, and the lock stays unused until that waiter
/// runs, so throughput follows wake-up latency (a lock convoy). Prefer FiberMutex where fairness is not
/// needed.
///
/// Cancellation: not supported. A ticket, once drawn, is served in its turn; if its holder walked away the
/// counter would never move past it and every later ticket would wait forever. So FairFiberMutex::Future
/// hides cancel(), and a caller whose waitWithTimeout() on a lock future returned -ETIMEDOUT must still
/// wait for the future and then unlock().
///
/// Cost: without contention, lock() is one locked read-modify-write and one load, unlock() one locked
/// read-modify-write, try_lock() two loads and a compare-and-swap. A contended lock() parks the caller;
/// the unlock() that serves it then pays the sequencer's combining and one wake-up.
///
/// Lifetime: as for a pthread mutex, the owner may destroy an unlocked mutex when the only other call
/// still running on it is the unlock() that handed it the lock: that unlock() touches nothing of the
/// mutex once the new owner can see it has the lock (see FiberSequencer).

#include <atomic>
#include <cstdint>

#include "core/fiber_sequencer.h"

namespace spindle {

class FairFiberMutex {
public:
    /// A queued lock request (see lock(Future*)). A FiberFuture, so it works with waitForMultiple() and
    /// waitWithTimeout(); cancel() is hidden because a ticket cannot be given back.
    class Future : public FiberSequencer::Future {
    private:
        using FiberSequencer::Future::cancel;
    };

    FairFiberMutex() noexcept = default;
    FairFiberMutex(const FairFiberMutex&) = delete;
    FairFiberMutex& operator=(const FairFiberMutex&) = delete;

    /// Draws a ticket and parks the calling fiber (or blocks the calling thread) until it is served.
    void lock() noexcept;

    /// Draws a ticket and returns at once. `future` is set with 0 when the ticket is served (before
    /// returning, if the lock is free): from then on the caller owns the lock and must unlock() it.
    /// This lets a caller announce that it is queued (or do other work) before it waits.
    /// Precondition: `future` is not registered now.
    void lock(Future* future) noexcept;

    /// Takes the lock only if it is free and nobody is queued for it. Never waits.
    [[nodiscard]] bool try_lock() noexcept;

    /// Releases the lock to the next ticket, if any. Precondition: the caller owns the lock.
    void unlock() noexcept;

private:
    // Invariant: served_.value() <= nextTicket_; the lock is held (or being handed over) exactly while
    // they differ, and the owner holds ticket served_.value().
    std::atomic<uint64_t> nextTicket_{0};
    FiberSequencer served_;
};

}  // namespace spindle
