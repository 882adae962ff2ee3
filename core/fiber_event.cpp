// SPDX-License-Identifier: Apache-2.0
#include "core/fiber_event.h"

namespace spindle {

void FiberEvent::set() noexcept {
    const uint64_t v = sequencer_.value();
    if ((v & 1) != 0) { return; }
    // If the counter moved meanwhile, another set() (and maybe a reset()) came in between and this call
    // takes effect before them: advance() then leaves the counter alone.
    sequencer_.advance(v + 1);
}

void FiberEvent::reset() noexcept {
    const uint64_t v = sequencer_.value();
    if ((v & 1) == 0) { return; }
    sequencer_.advance(v + 1);
}

void FiberEvent::wait() noexcept {
    const uint64_t v = sequencer_.value();
    if ((v & 1) != 0) { return; }
    (void)sequencer_.wait(v + 1);
}

void FiberEvent::wait(Future* future) noexcept {
    // The next odd value: this one when set now (the future is then set at once), else the next set().
    sequencer_.wait(sequencer_.value() | 1, future);
}

}  // namespace spindle
