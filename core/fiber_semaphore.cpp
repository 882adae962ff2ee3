// SPDX-License-Identifier: Apache-2.0
#include "core/fiber_semaphore.h"

#include "base/check.h"
#include "core/fiber_future.h"

namespace spindle {

/// One parked acquire, on the waiter's stack.
/// Invariant: inList is true exactly while the node is linked into the queue; both are read and written
/// only under lock_. Whoever turns inList false owns the outcome: a release() that unlinks the node has
/// given it a permit and sets `granted`; a waiter that unlinks itself after its deadline took nothing.
struct FiberSemaphore::Waiter {
    FiberFuture granted;
    Waiter* prev = nullptr;
    Waiter* next = nullptr;
    bool inList = false;
};

FiberSemaphore::FiberSemaphore(int64_t initial) noexcept : count_(initial) {
    SPINDLE_CHECK_MSG(initial >= 0, "FiberSemaphore: negative initial count");
}

FiberSemaphore::~FiberSemaphore() { SPINDLE_ASSERT(waiters_.empty() && "FiberSemaphore destroyed with waiters"); }

bool FiberSemaphore::tryTake() noexcept {
    int64_t c = count_.load(std::memory_order_relaxed);
    while (c > 0) {
        if (count_.compare_exchange_weak(c, c - 1, std::memory_order_acquire, std::memory_order_relaxed)) {
            return true;
        }
    }
    return false;
}

bool FiberSemaphore::try_acquire() noexcept { return tryTake(); }

bool FiberSemaphore::takeOrEnqueue(Waiter* w) noexcept {
    lock_.lock();
    // Under lock_ nothing can raise count_, so a zero seen here stays zero until we are queued; and a
    // positive count means nobody is queued, so taking it passes nobody.
    if (tryTake()) {
        lock_.unlock();
        return true;
    }
    waiters_.pushBack(w);
    w->inList = true;
    lock_.unlock();
    return false;
}

void FiberSemaphore::acquire() noexcept {
    if (tryTake()) { return; }
    Waiter w;
    if (takeOrEnqueue(&w)) { return; }
    (void)w.granted.wait(detail::WaitKind::kSemaphore, this);
}

bool FiberSemaphore::acquireFor(std::chrono::nanoseconds timeout) noexcept {
    if (tryTake()) { return true; }
    if (timeout <= std::chrono::nanoseconds::zero()) { return false; }
    Waiter w;
    if (takeOrEnqueue(&w)) { return true; }
    // -ETIMEDOUT, or -ECANCELED during shutdown: no permit has reached us yet, but one may be on its way.
    if (FiberFuture::waitWithTimeout(&w.granted, timeout, detail::WaitKind::kSemaphore, this) >= 0) { return true; }
    lock_.lock();
    const bool withdrawn = w.inList;
    if (withdrawn) {
        waiters_.unlink(&w);
        w.inList = false;
    }
    lock_.unlock();
    if (withdrawn) { return false; }
    // A release() unlinked us as the deadline passed, so the permit is ours: keep it rather than lose it.
    // Wait for its set() to land, since the node must outlive it (the future stays armed after a timeout).
    (void)w.granted.wait(detail::WaitKind::kSemaphore, this);
    return true;
}

void FiberSemaphore::release(int64_t n) noexcept {
    SPINDLE_ASSERT(n >= 0);
    if (n <= 0) { return; }
    lock_.lock();
    Waiter* first = waiters_.front();
    Waiter* last = nullptr;
    while (n > 0 && !waiters_.empty()) {
        last = waiters_.popFront();  // stays chained to the ones popped after it
        last->inList = false;
        --n;
    }
    // Only what is left after serving the queue becomes free; with waiters still queued n is 0 here.
    if (n > 0) { count_.fetch_add(n, std::memory_order_release); }
    lock_.unlock();
    if (last == nullptr) { return; }
    // Wake the served waiters outside the spin lock, oldest first. Read each link before set(): once set,
    // the waiter may return and its node is gone.
    for (Waiter* w = first;;) {
        const bool wasLast = w == last;
        Waiter* next = wasLast ? nullptr : w->next;
        w->granted.set(0);
        if (wasLast) { break; }
        w = next;
    }
}

}  // namespace spindle
