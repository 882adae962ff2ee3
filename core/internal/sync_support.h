// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Pieces shared by the blocking primitives (the waiter table's buckets, FiberCondVar, FiberMultiLock,
/// FiberSemaphore): a tiny spin lock that guards their waiter lists, and the clamping of a user's timeout
/// to what FiberFuture takes.
///
/// Thread-safety: SpinLock is a mutex for fibers and threads alike, with one rule: never park (wait on a
/// future, take a fiber lock, do I/O) while holding it. Its critical sections are a few pointer writes.
/// Memory ordering: lock() is an acquire, unlock() a release; everything written inside one critical
/// section is visible inside the next.
/// Cost: an uncontended lock()/unlock() pair is one exchange and one store. A contended lock() spins on a
/// plain load (test-and-test-and-set, so waiting does not bounce the cache line) with a pause per probe,
/// and after kSpinsBeforeYield probes yields the OS thread: the holder may be a preempted thread, and on
/// an oversubscribed machine spinning then only burns the holder's CPU.

#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdint>

#include "base/relax.h"

namespace spindle::detail {

/// An intrusive FIFO of waiter nodes that carry `Node* next` and `Node* prev`,
/// guarded by its owner's lock. No allocation; every operation is O(1).
/// unlink() clears the node's links; popFront() and takeAll() leave the links of
/// what they return untouched, so the nodes they hand out stay chained through
/// `next`, oldest first (the owner wakes them after dropping its lock).
template <class Node>
class IntrusiveFifo {
public:
    [[nodiscard]] bool empty() const noexcept { return head_ == nullptr; }
    [[nodiscard]] Node* front() const noexcept { return head_; }

    void pushBack(Node* n) noexcept {
        n->next = nullptr;
        n->prev = tail_;
        if (tail_ != nullptr) {
            tail_->next = n;
        } else {
            head_ = n;
        }
        tail_ = n;
    }
    /// Precondition: n is in this list.
    void unlink(Node* n) noexcept {
        if (n->prev != nullptr) { n->prev->next = n->next; } else { head_ = n->next; }
        if (n->next != nullptr) { n->next->prev = n->prev; } else { tail_ = n->prev; }
        n->next = nullptr;
        n->prev = nullptr;
    }
    /// The oldest node, removed (its `next` still names the new front); nullptr when empty.
    Node* popFront() noexcept {
        Node* n = head_;
        if (n != nullptr) {
            head_ = n->next;
            if (head_ != nullptr) { head_->prev = nullptr; } else { tail_ = nullptr; }
        }
        return n;
    }
    /// Empties the list and returns its old front; the nodes stay chained through `next`.
    Node* takeAll() noexcept {
        Node* n = head_;
        head_ = tail_ = nullptr;
        return n;
    }

private:
    Node* head_ = nullptr;
    Node* tail_ = nullptr;
};

class SpinLock {
public:
    SpinLock() noexcept = default;
    SpinLock(const SpinLock&) = delete;
    SpinLock& operator=(const SpinLock&) = delete;

    void lock() noexcept {
        if (!locked_.exchange(true, std::memory_order_acquire)) { return; }
        lockSlow();
    }
    [[nodiscard]] bool try_lock() noexcept {
        return !locked_.load(std::memory_order_relaxed) && !locked_.exchange(true, std::memory_order_acquire);
    }
    void unlock() noexcept { locked_.store(false, std::memory_order_release); }

private:
    static constexpr unsigned kSpinsBeforeYield = 128;

    [[gnu::noinline]] void lockSlow() noexcept {
        for (;;) {
            for (unsigned spins = 0; locked_.load(std::memory_order_relaxed); ++spins) {
                if (spins < kSpinsBeforeYield) {
                    cpuRelax();
                } else {
                    ::sched_yield();
                    spins = 0;
                }
            }
            if (!locked_.exchange(true, std::memory_order_acquire)) { return; }
        }
    }

    std::atomic<bool> locked_{false};
};

/// The longest timeout a primitive passes on (about 146 years): far enough that it never fires, near
/// enough that now + timeout cannot overflow the 64-bit nanosecond clock.
inline constexpr std::chrono::nanoseconds kMaxTimeout{int64_t{1} << 62};

/// `d` as whole nanoseconds, rounded up (a wait never ends early) and clamped to [0, kMaxTimeout], so that
/// durations like hours::max() or a floating-point infinity mean "practically forever", not an overflow.
template <class Rep, class Period>
[[nodiscard]] std::chrono::nanoseconds clampTimeout(const std::chrono::duration<Rep, Period>& d) noexcept {
    using namespace std::chrono;
    // Compare in floating point: converting a huge integral duration to nanoseconds would overflow.
    const double ns = duration<double, std::nano>(d).count();
    if (!(ns > 0.0)) { return nanoseconds::zero(); }  // also NaN
    if (ns >= static_cast<double>(kMaxTimeout.count())) { return kMaxTimeout; }
    return ceil<nanoseconds>(d);
}

/// The time left until `deadline` on the steady clock, clamped as clampTimeout() does.
template <class Duration>
[[nodiscard]] std::chrono::nanoseconds timeoutUntil(
    const std::chrono::time_point<std::chrono::steady_clock, Duration>& deadline) noexcept {
    using namespace std::chrono;
    const auto now = steady_clock::now();
    // Subtract in floating point first: a far deadline (time_point::max()) in nanoseconds would overflow.
    const double ns = duration<double, std::nano>(deadline.time_since_epoch()).count() -
                      duration<double, std::nano>(now.time_since_epoch()).count();
    if (!(ns > 0.0)) { return nanoseconds::zero(); }
    if (ns >= static_cast<double>(kMaxTimeout.count())) { return kMaxTimeout; }
    return ceil<nanoseconds>(deadline - now);
}

}  // namespace spindle::detail
