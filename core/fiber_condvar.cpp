// SPDX-License-Identifier: Apache-2.0
#include "core/fiber_condvar.h"

#include "base/check.h"

namespace spindle {

FiberCondVar::~FiberCondVar() { SPINDLE_ASSERT(waiters_.empty() && "FiberCondVar destroyed with waiters"); }

void FiberCondVar::enqueue(Waiter* w) noexcept {
    lock_.lock();
    waiters_.pushBack(w);
    w->inList = true;
    lock_.unlock();
}

void FiberCondVar::unlink(Waiter* w) noexcept {
    SPINDLE_ASSERT(w->inList);
    waiters_.unlink(w);
    w->inList = false;
}

void FiberCondVar::notify_one() noexcept {
    lock_.lock();
    Waiter* w = waiters_.front();
    if (w != nullptr) { unlink(w); }
    lock_.unlock();
    // Outside the spin lock: set() may post to another carrier or a thread's semaphore. Once inList is
    // false nobody but us touches w until its future is set, so the node stays alive until then.
    if (w != nullptr) { w->woken.set(0); }
}

void FiberCondVar::notify_all() noexcept {
    lock_.lock();
    Waiter* w = waiters_.takeAll();
    for (Waiter* p = w; p != nullptr; p = p->next) { p->inList = false; }
    lock_.unlock();
    while (w != nullptr) {
        // Read the link first: once set, the waiter may return and its node (on its stack) is gone.
        Waiter* next = w->next;
        w->woken.set(0);
        w = next;
    }
}

bool FiberCondVar::awaitFor(Waiter* w, std::chrono::nanoseconds timeout) noexcept {
    // -ETIMEDOUT, or -ECANCELED when the runtime is shutting down: either way, no notify arrived yet.
    if (FiberFuture::waitWithTimeout(&w->woken, timeout, detail::WaitKind::kCondVar, this) >= 0) { return true; }
    lock_.lock();
    const bool withdrawn = w->inList;
    if (withdrawn) { unlink(w); }
    lock_.unlock();
    if (withdrawn) { return false; }
    // A notify took the node just as the deadline passed and its set() is on the way: the wake-up is ours,
    // and the node must stay alive until that set() has landed. waitWithTimeout left the future armed.
    (void)w->woken.wait(detail::WaitKind::kCondVar, this);
    return true;
}

}  // namespace spindle
