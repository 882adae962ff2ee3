// SPDX-License-Identifier: Apache-2.0
#pragma once
/// FiberEvent: a manual-reset event; set() releases every waiter, and the event stays set until reset().
///
/// It is a FiberSequencer whose counter carries the state in its lowest bit: odd is set, even is unset.
/// set() moves an even counter up by one and reset() an odd one, so each state change is one step of the
/// counter, and a waiter that finds the event unset at counter v waits for v + 1, the next set(). Because
/// the counter never comes back down, that waiter is released even when a reset() follows the set() at
/// once: a short pulse is never missed.
///
/// Thread-safety: every member may be called from any fiber or plain thread, concurrently. Concurrent set()
/// and reset() calls take effect in some order; a set() that finds the event set (or one whose change
/// another set() already made) does nothing.
///
/// Memory ordering: what a thread wrote before set() is visible to every waiter that set() releases, and
/// to any thread that then sees isSet() return true.
///
/// Fairness: set() releases all current waiters together; they resume in no promised order.
///
/// Cancellation: wait(Future*) registers a FiberSequencer::Future, which may be cancel()ed: it is then set
/// with -ECANCELED, or with 0 if the event was set first. The blocking wait() cannot be cancelled.
///
/// Cost: isSet(), and wait() on a set event, are one load. set() on a set event and reset() on an unset
/// one are one load; a change of state adds one compare-and-swap, plus the sequencer's combining when
/// someone is registered.
///
/// Lifetime: the event must outlive every call on it, with one exception that makes it usable as a
/// one-shot completion signal: when the only other call still running is the set() that released a waiter
/// (or that made isSet() true for it), that waiter may destroy the event (see FiberSequencer).

#include <cstdint>

#include "core/fiber_sequencer.h"

namespace spindle {

class FiberEvent {
public:
    using Future = FiberSequencer::Future;

    FiberEvent() noexcept = default;
    FiberEvent(const FiberEvent&) = delete;
    FiberEvent& operator=(const FiberEvent&) = delete;

    [[nodiscard]] bool isSet() const noexcept { return (sequencer_.value() & 1) != 0; }

    /// Sets the event, releasing every waiter. A no-op when it is set already.
    void set() noexcept;

    /// Clears the event; later waiters wait for the next set(). A no-op when it is not set.
    void reset() noexcept;

    /// Returns at once if the event is set; otherwise parks the calling fiber (or blocks the calling
    /// thread) until the next set().
    void wait() noexcept;

    /// Registers `future` to be set with 0 by the next set(), or right away if the event is set now.
    /// Precondition: `future` is not registered now (see FiberSequencer::wait).
    void wait(Future* future) noexcept;

private:
    FiberSequencer sequencer_;  // Invariant: value() is odd exactly while the event is set.
};

}  // namespace spindle
