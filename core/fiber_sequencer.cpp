// SPDX-License-Identifier: Apache-2.0
#include "core/fiber_sequencer.h"

#include <cerrno>
#include <utility>

#include "base/check.h"

namespace spindle {

// ---- Future ------------------------------------------------------------------------------------------------

void FiberSequencer::Future::cancel() noexcept {
    SPINDLE_ASSERT(sequencer_ != nullptr && "cancel() of a future that was never registered");
    const uint32_t old = flags_.fetch_or(kCancelled, std::memory_order_acq_rel);
    // Only a future the combiner holds in its heap goes through the cancel stack. One still in the
    // request stack is seen as cancelled when the combiner takes it in; one already woken (or set at
    // registration) needs nothing.
    if ((old & (kInTable | kCancelled)) != kInTable) { return; }
    FiberSequencer* s = sequencer_;
    push(s->cancels_, this);
    s->drain();
}

// ---- the counter -------------------------------------------------------------------------------------------

FiberSequencer::~FiberSequencer() {
    SPINDLE_ASSERT(heap_ == nullptr && "FiberSequencer destroyed with a registered future");
    SPINDLE_ASSERT(requests_.load(std::memory_order_relaxed) == nullptr);
    SPINDLE_ASSERT(cancels_.load(std::memory_order_relaxed) == nullptr);
    SPINDLE_ASSERT(combiner_.load(std::memory_order_relaxed) == kFree);
}

void FiberSequencer::wait(uint64_t token, Future* future) noexcept {
    future->reset();
    future->sequencer_ = this;
    future->token_ = token;
    future->flags_.store(0, std::memory_order_relaxed);
    future->inHeap_ = false;
    if (value() >= token) {
        future->set(0);
        return;
    }
    push(requests_, future);
    drain();
}

int32_t FiberSequencer::wait(uint64_t token) noexcept {
    if (value() >= token) { return 0; }
    Future future;
    wait(token, &future);
    return future.wait(detail::WaitKind::kSequencer, this);
}

void FiberSequencer::increment() noexcept {
    const uint64_t old = word_.fetch_add(kOne, std::memory_order_acq_rel);
    SPINDLE_ASSERT((old >> kValueShift) < kMaxValue && "FiberSequencer counter overflow");
    if ((old & kHasWaiters) != 0) { drain(); }
}

void FiberSequencer::advance(uint64_t target) noexcept {
    SPINDLE_CHECK(target <= kMaxValue);
    uint64_t old = word_.load(std::memory_order_relaxed);
    while ((old >> kValueShift) < target) {
        const uint64_t raised = (target << kValueShift) | (old & kHasWaiters);
        if (word_.compare_exchange_weak(old, raised, std::memory_order_acq_rel, std::memory_order_relaxed)) {
            if ((old & kHasWaiters) != 0) { drain(); }
            return;
        }
    }
}

void FiberSequencer::push(std::atomic<Future*>& stack, Future* future) noexcept {
    Future* head = stack.load(std::memory_order_relaxed);
    do {
        future->next_ = head;
    } while (!stack.compare_exchange_weak(head, future, std::memory_order_release, std::memory_order_relaxed));
}

// ---- combining ---------------------------------------------------------------------------------------------

void FiberSequencer::drain() noexcept {
    uint32_t state = combiner_.load(std::memory_order_acquire);
    for (;;) {
        if (state == kPending) { return; }  // the combiner will run another pass for us
        const uint32_t next = state == kFree ? kBusy : kPending;
        if (combiner_.compare_exchange_weak(state, next, std::memory_order_acq_rel, std::memory_order_acquire)) {
            if (next == kPending) { return; }
            break;
        }
    }

    Future* done = nullptr;
    Future** doneTail = &done;
    for (;;) {
        combinePass(doneTail);
        uint32_t busy = kBusy;
        if (combiner_.compare_exchange_strong(busy, kFree, std::memory_order_acq_rel, std::memory_order_acquire)) {
            break;
        }
        // kPending: work arrived during the pass. Only the combiner leaves kPending, so a store will do;
        // the failed exchange above acquired what the others published before marking it.
        combiner_.store(kBusy, std::memory_order_relaxed);
    }
    *doneTail = nullptr;

    // Set outside the combiner: set() may wake a fiber that calls straight back into this sequencer.
    // From here on `this` is not touched: a woken waiter may be destroying the sequencer already.
    while (done != nullptr) {
        Future* f = done;
        done = f->next_;  // read before set(): the future may die as soon as it is set
        f->set(f->outcome_);
    }
}

void FiberSequencer::combinePass(Future**& doneTail) noexcept {
    Future* cancels = cancels_.load(std::memory_order_relaxed) != nullptr
                          ? cancels_.exchange(nullptr, std::memory_order_acquire)
                          : nullptr;
    Future* requests = requests_.load(std::memory_order_relaxed) != nullptr
                           ? requests_.exchange(nullptr, std::memory_order_acquire)
                           : nullptr;
    uint64_t now = value();  // enough for deciding cancellations and registrations; step 3 reads it again

    auto complete = [&doneTail](Future* f, int32_t res) {
        f->outcome_ = res;
        *doneTail = f;
        doneTail = &f->next_;
    };

    // 1. Cancellations of futures that are (or were, until a wake that saw the cancel) in the heap.
    while (cancels != nullptr) {
        Future* f = cancels;
        cancels = f->next_;
        if (f->inHeap_) {
            heapRemove(f);
            f->inHeap_ = false;
        }
        complete(f, f->token_ <= now ? 0 : -ECANCELED);
    }

    // 2. New registrations: satisfied ones complete at once (they never enter the heap, so a cancel()
    // of theirs is a no-op); a cancelled one completes here, since its cancel() saw no kInTable.
    while (requests != nullptr) {
        Future* f = requests;
        requests = f->next_;
        if (f->token_ <= now) {
            complete(f, 0);
            continue;
        }
        const uint32_t old = f->flags_.fetch_or(Future::kInTable, std::memory_order_acq_rel);
        if ((old & Future::kCancelled) != 0) {
            complete(f, -ECANCELED);
            continue;
        }
        heapInsert(f);
        f->inHeap_ = true;
    }

    // 3. Wake everything the counter has reached, lowest token first. Raising the flag and reading the
    // counter are one read-modify-write, so every raise is either counted in `now` or finds the flag set
    // and combines after us. A future whose cancel() got in first is left to the cancel stack (it is
    // there, or its canceller is about to push it).
    if (heap_ != nullptr) {
        now = word_.fetch_or(kHasWaiters, std::memory_order_acq_rel) >> kValueShift;
        while (heap_ != nullptr && heap_->token_ <= now) {
            Future* f = heapPopMin();
            f->inHeap_ = false;
            const uint32_t old = f->flags_.fetch_and(~Future::kInTable, std::memory_order_acq_rel);
            if ((old & Future::kCancelled) != 0) { continue; }
            complete(f, 0);
        }
    }
    // Nobody is registered: raises need not combine. A registration pushed meanwhile combines by itself
    // (its caller calls drain()) and raises the flag again in that pass.
    if (heap_ == nullptr && (word_.load(std::memory_order_relaxed) & kHasWaiters) != 0) {
        word_.fetch_and(~kHasWaiters, std::memory_order_acq_rel);
    }
}

// ---- pairing heap ------------------------------------------------------------------------------------------

FiberSequencer::Future* FiberSequencer::meld(Future* a, Future* b) noexcept {
    if (a == nullptr) { return b; }
    if (b == nullptr) { return a; }
    if (b->token_ < a->token_) { std::swap(a, b); }
    // b becomes a's leftmost child; a stays a root.
    b->prev_ = a;
    b->sibling_ = a->child_;
    if (a->child_ != nullptr) { a->child_->prev_ = b; }
    a->child_ = b;
    return a;
}

FiberSequencer::Future* FiberSequencer::mergePairs(Future* first) noexcept {
    // Left to right: meld neighbours in pairs, stacking each result (linked through sibling_).
    Future* pairs = nullptr;
    while (first != nullptr) {
        Future* a = first;
        Future* b = a->sibling_;
        first = b != nullptr ? b->sibling_ : nullptr;
        a->prev_ = nullptr;
        a->sibling_ = nullptr;
        if (b != nullptr) {
            b->prev_ = nullptr;
            b->sibling_ = nullptr;
            a = meld(a, b);
        }
        a->sibling_ = pairs;
        pairs = a;
    }
    // Right to left (the stack's order): meld the pairs into one root.
    Future* root = nullptr;
    while (pairs != nullptr) {
        Future* next = pairs->sibling_;
        pairs->sibling_ = nullptr;
        root = meld(root, pairs);
        pairs = next;
    }
    return root;
}

void FiberSequencer::heapInsert(Future* f) noexcept {
    f->child_ = nullptr;
    f->sibling_ = nullptr;
    f->prev_ = nullptr;
    heap_ = meld(heap_, f);
}

FiberSequencer::Future* FiberSequencer::heapPopMin() noexcept {
    Future* root = heap_;
    heap_ = mergePairs(root->child_);
    root->child_ = nullptr;
    return root;
}

void FiberSequencer::heapRemove(Future* f) noexcept {
    if (f == heap_) {
        (void)heapPopMin();
        return;
    }
    // Unlink f (with its subtree) from its parent or left sibling. A leftmost child's prev_ is its parent,
    // and only then does prev_->child_ point back at f.
    if (f->prev_->child_ == f) {
        f->prev_->child_ = f->sibling_;
    } else {
        f->prev_->sibling_ = f->sibling_;
    }
    if (f->sibling_ != nullptr) { f->sibling_->prev_ = f->prev_; }
    f->prev_ = nullptr;
    f->sibling_ = nullptr;
    Future* subtree = mergePairs(f->child_);
    f->child_ = nullptr;
    heap_ = meld(heap_, subtree);
}

}  // namespace spindle
