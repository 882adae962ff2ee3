// SPDX-License-Identifier: Apache-2.0
#pragma once
/// FiberCondVar: a condition variable on which fibers and plain threads wait together, under any lock.
///
/// It is the fiber counterpart of std::condition_variable_any: wait() releases the caller's lock, parks
/// the fiber (a plain thread sleeps on its proxy fiber's semaphore) until a notify_one()/notify_all() or
/// the deadline, and takes the lock again before it returns, on every path, timeouts included. The lock
/// may be anything with lock() and unlock(): a FiberMutex, a std::unique_lock of one, a std::mutex held
/// only by code that does not park while holding it.
///
/// Each waiter is a node on its own stack, holding a FiberFuture; the condition variable keeps them in an
/// intrusive FIFO list guarded by a small spin lock. Nothing is allocated.
///
/// Thread-safety: every member may be called concurrently from any fiber or thread. notify_*() need not
/// hold the user's lock, but a notify that must not be missed has to follow a change of the condition
/// made under that lock (the usual rule: otherwise it can fall between a waiter's check and its wait).
/// Destroy the FiberCondVar only once no call on it can still be running. Note that this is stronger than
/// std's "every waiter was notified": a timed waiter whose deadline expires as it is being notified still
/// takes the internal spin lock once on its way out.
/// Memory ordering: a notify happens before the return of each wait it ends; the caller's lock gives the
/// usual ordering for the condition itself.
/// Fairness: waiters are kept in arrival order; notify_one() wakes the one waiting longest, notify_all()
/// wakes exactly those waiting when it takes the list (later arrivals stay queued for the next notify).
/// A woken waiter then competes for the user's lock like anyone else, so its condition may be false
/// again by the time it returns. This implementation has no spurious wake-ups of its own, but callers must
/// still re-check the condition: use the predicate forms, or a loop.
/// Cancellation/timeouts: wait_for()/wait_until() return std::cv_status::timeout when the deadline passed
/// before a notify reached the waiter, and no_timeout when a notify did, even at the same instant: a
/// notify_one() that picked a waiter always counts as that waiter's wake-up, so none is lost or doubled.
/// A deadline already past returns timeout at once without releasing the lock. On a fiber, runtime
/// shutdown ends a timed wait early with timeout (shutdown fires every timer, and arms no new ones); an
/// untimed wait stays parked until notified. Durations are clamped (hours::max() waits practically
/// forever). wait_until() takes std::chrono::steady_clock deadlines only.
/// Cost: notify_one()/notify_all() with nobody waiting is one spin lock round trip; waking a waiter adds
/// one FiberFuture::set() (an exchange and a run-queue push, or a semaphore post for a thread), done after
/// the spin lock is released. wait() is one spin lock round trip to enqueue, plus the park. A timed wait
/// also arms a carrier timer, and one more spin lock round trip if the deadline wins.

#include <chrono>
#include <condition_variable>
#include <utility>

#include "core/fiber_future.h"
#include "core/internal/sync_support.h"

namespace spindle {

class FiberCondVar {
public:
    FiberCondVar() noexcept = default;
    FiberCondVar(const FiberCondVar&) = delete;
    FiberCondVar& operator=(const FiberCondVar&) = delete;
    /// Precondition: nobody waits (checked in debug builds).
    ~FiberCondVar();

    /// Wakes the waiter that has waited longest, if any.
    void notify_one() noexcept;
    /// Wakes every current waiter.
    void notify_all() noexcept;

    /// Releases `lock`, parks until notified, re-acquires `lock`.
    /// Precondition: the caller holds `lock`. An exception from lock.lock() on the way out terminates
    /// (as with std::condition_variable_any): the waiter cannot return without its lock.
    template <class Lock>
    void wait(Lock& lock) noexcept;

    /// Waits until pred() holds; pred() runs with `lock` held. Exceptions from pred() propagate.
    template <class Lock, class Predicate>
    void wait(Lock& lock, Predicate pred);

    /// As wait(), for at most `timeout`.
    template <class Lock, class Rep, class Period>
    std::cv_status wait_for(Lock& lock, const std::chrono::duration<Rep, Period>& timeout) noexcept;

    /// Waits until pred() holds or `timeout` passed; returns pred() as last evaluated.
    template <class Lock, class Rep, class Period, class Predicate>
    bool wait_for(Lock& lock, const std::chrono::duration<Rep, Period>& timeout, Predicate pred);

    /// As wait(), until `deadline`.
    template <class Lock, class Duration>
    std::cv_status wait_until(Lock& lock,
                              const std::chrono::time_point<std::chrono::steady_clock, Duration>& deadline) noexcept;

    /// Waits until pred() holds or `deadline` passed; returns pred() as last evaluated.
    template <class Lock, class Duration, class Predicate>
    bool wait_until(Lock& lock, const std::chrono::time_point<std::chrono::steady_clock, Duration>& deadline,
                    Predicate pred);

private:
    /// One waiting call, on the waiter's stack.
    /// Invariant: inList is true exactly while the node is linked into the list; both are read and
    /// written only under lock_. Whoever turns inList false (a notify, or the waiter withdrawing after its
    /// deadline) owns the wake-up: a notify then sets `woken`, a withdrawing waiter leaves it unset.
    struct Waiter {
        FiberFuture woken;
        Waiter* prev = nullptr;
        Waiter* next = nullptr;
        bool inList = false;
    };

    void enqueue(Waiter* w) noexcept;
    /// Parks until `w` is notified (true) or `timeout` passed and `w` was withdrawn from the list (false).
    bool awaitFor(Waiter* w, std::chrono::nanoseconds timeout) noexcept;
    template <class Lock>
    std::cv_status waitNs(Lock& lock, std::chrono::nanoseconds timeout) noexcept;
    void unlink(Waiter* w) noexcept;  // precondition: lock_ held, w->inList

    detail::SpinLock lock_;
    detail::IntrusiveFifo<Waiter> waiters_;  // the longest waiting first; guarded by lock_
};

// ---- template bodies -------------------------------------------------------------------------------------

template <class Lock>
void FiberCondVar::wait(Lock& lock) noexcept {
    Waiter w;
    enqueue(&w);
    // Enqueued before unlocking: a notify issued after the waiter's check of the condition, under the
    // same lock, finds the node in the list.
    lock.unlock();
    (void)w.woken.wait(detail::WaitKind::kCondVar, this);
    lock.lock();
}

template <class Lock, class Predicate>
void FiberCondVar::wait(Lock& lock, Predicate pred) {
    while (!pred()) { wait(lock); }
}

template <class Lock>
std::cv_status FiberCondVar::waitNs(Lock& lock, std::chrono::nanoseconds timeout) noexcept {
    if (timeout <= std::chrono::nanoseconds::zero()) { return std::cv_status::timeout; }
    Waiter w;
    enqueue(&w);
    lock.unlock();
    const bool notified = awaitFor(&w, timeout);
    lock.lock();
    return notified ? std::cv_status::no_timeout : std::cv_status::timeout;
}

template <class Lock, class Rep, class Period>
std::cv_status FiberCondVar::wait_for(Lock& lock, const std::chrono::duration<Rep, Period>& timeout) noexcept {
    return waitNs(lock, detail::clampTimeout(timeout));
}

template <class Lock, class Rep, class Period, class Predicate>
bool FiberCondVar::wait_for(Lock& lock, const std::chrono::duration<Rep, Period>& timeout, Predicate pred) {
    // One deadline for the whole loop, so that notifies that find pred() false do not extend the wait.
    const auto deadline = std::chrono::steady_clock::now() + detail::clampTimeout(timeout);
    return wait_until(lock, deadline, std::move(pred));
}

template <class Lock, class Duration>
std::cv_status FiberCondVar::wait_until(
    Lock& lock, const std::chrono::time_point<std::chrono::steady_clock, Duration>& deadline) noexcept {
    return waitNs(lock, detail::timeoutUntil(deadline));
}

template <class Lock, class Duration, class Predicate>
bool FiberCondVar::wait_until(Lock& lock,
                              const std::chrono::time_point<std::chrono::steady_clock, Duration>& deadline,
                              Predicate pred) {
    while (!pred()) {
        if (wait_until(lock, deadline) == std::cv_status::timeout) { return pred(); }
    }
    return true;
}

}  // namespace spindle
