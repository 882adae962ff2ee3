// SPDX-License-Identifier: Apache-2.0
#include "core/internal/owner_returns.h"

#include <sched.h>

#include "base/check.h"
#include "core/fiber.h"
#include "core/internal/carrier.h"

namespace spindle::detail {

void OwnerReturns::init(unsigned count, Carrier* owner, DrainFn fn, void* ctx) {
    next_.reset(new std::atomic<uint32_t>[count]);
    count_ = count;
    owner_ = owner;
    fn_ = fn;
    ctx_ = ctx;
    msg_.target = this;
    msg_.run = &OwnerReturns::onMessage;
}

bool OwnerReturns::onOwner() const noexcept { return owner_ != nullptr && Carrier::current() == owner_; }

void OwnerReturns::push(uint16_t id) noexcept {
    SPINDLE_CHECK_MSG(id < count_, "an id given back that is not one of its owner's (not out)");
    uint32_t head = head_.load(std::memory_order_relaxed);
    do {
        next_[id].store(head, std::memory_order_relaxed);
    } while (!head_.compare_exchange_weak(head, id, std::memory_order_seq_cst, std::memory_order_relaxed));
    if (owner_ == nullptr) { return; }
    // The first push since the owner last went idle posts the message; a push during a drain is seen
    // by that drain before it goes idle (onMessage).
    if (state_.exchange(kQueued, std::memory_order_seq_cst) != kIdle) { return; }
    if (owner_->exited()) {
        state_.store(kIdle, std::memory_order_release);
        return;
    }
    owner_->post(&msg_);
}

unsigned OwnerReturns::drain() noexcept {
    uint32_t id = head_.exchange(kEmpty, std::memory_order_seq_cst);
    // The stack holds the newest first: reverse it, so that the callback sees the returns in the order
    // they were made (a free stack then hands out the most recently returned first, as it would have).
    uint32_t oldest = kEmpty;
    unsigned n = 0;
    while (id != kEmpty) {
        SPINDLE_CHECK_MSG(++n <= count_, "an id returned twice to its owner (given back while not out)");
        const uint32_t next = next_[id].load(std::memory_order_relaxed);
        next_[id].store(oldest, std::memory_order_relaxed);
        oldest = id;
        id = next;
    }
    for (id = oldest; id != kEmpty;) {
        const uint32_t next = next_[id].load(std::memory_order_relaxed);
        fn_(ctx_, static_cast<uint16_t>(id));
        id = next;
    }
    return n;
}

void OwnerReturns::onMessage(Message* m) noexcept {
    auto* self = static_cast<OwnerReturns*>(m->target);
    for (;;) {
        self->state_.store(kRunning, std::memory_order_seq_cst);
        (void)self->drain();
        uint8_t expected = kRunning;
        if (self->state_.compare_exchange_strong(expected, kIdle, std::memory_order_seq_cst)) { return; }
        // A push came during the drain (it saw kRunning and posted nothing): drain again.
    }
}

void OwnerReturns::settle() const noexcept {
    while (owner_ != nullptr && state_.load(std::memory_order_acquire) != kIdle && !owner_->exited()) {
        if (this_fiber::inFiber()) {
            this_fiber::yield();
        } else {
            ::sched_yield();
        }
    }
}

}  // namespace spindle::detail
