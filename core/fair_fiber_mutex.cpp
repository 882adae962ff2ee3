// SPDX-License-Identifier: Apache-2.0
#include "core/fair_fiber_mutex.h"

#include "base/check.h"

namespace spindle {

// The ticket counter needs no ordering of its own: ownership passes through the sequencer, whose counter
// is released by unlock() and acquired by whoever sees it reach their ticket.
void FairFiberMutex::lock() noexcept {
    const uint64_t ticket = nextTicket_.fetch_add(1, std::memory_order_relaxed);
    (void)served_.wait(ticket);
}

void FairFiberMutex::lock(Future* future) noexcept {
    const uint64_t ticket = nextTicket_.fetch_add(1, std::memory_order_relaxed);
    served_.wait(ticket, future);
}

bool FairFiberMutex::try_lock() noexcept {
    uint64_t ticket = nextTicket_.load(std::memory_order_relaxed);
    // served == ticket: every ticket drawn so far has been unlocked, so nobody owns or waits. The served
    // counter cannot pass `ticket` before someone draws it, and then the exchange below fails.
    if (served_.value() != ticket) { return false; }
    return nextTicket_.compare_exchange_strong(ticket, ticket + 1, std::memory_order_acquire,
                                               std::memory_order_relaxed);
}

void FairFiberMutex::unlock() noexcept {
    SPINDLE_ASSERT(served_.value() < nextTicket_.load(std::memory_order_relaxed) && "unlock() of a free mutex");
    served_.increment();
}

}  // namespace spindle
