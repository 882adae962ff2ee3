// SPDX-License-Identifier: Apache-2.0
#include "core/deadline.h"

#include <limits>

#include "core/internal/runtime_impl.h"

namespace spindle {

uint64_t Deadline::fromNow(int64_t deltaNs) noexcept {
    if (deltaNs <= 0) { return 1; }  // already passed: the earliest representable point
    const uint64_t now = detail::nowNs();
    constexpr auto kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    const auto delta = static_cast<uint64_t>(deltaNs);
    return delta >= kMax - now ? kMax : now + delta;
}

bool Deadline::expired() const noexcept { return isSet() && detail::nowNs() >= ns_; }

}  // namespace spindle
