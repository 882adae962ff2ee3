// SPDX-License-Identifier: Apache-2.0
#include "base/inject.h"

#include <atomic>

#include "base/check.h"

namespace spindle::inject {

namespace detail {
std::atomic<uint32_t> gArmedMask{0};
}  // namespace detail

namespace {

struct Slot {
    std::atomic<uint32_t> skip{0};
    std::atomic<uint32_t> count{0};
    std::atomic<int> err{0};
};

Slot gSlots[static_cast<size_t>(Point::kCount)];

Slot& slotOf(Point p) noexcept { return gSlots[static_cast<size_t>(p)]; }

// Decrements `v` if it is positive; true if it did.
bool takeOne(std::atomic<uint32_t>& v) noexcept {
    uint32_t cur = v.load(std::memory_order_relaxed);
    while (cur != 0) {
        if (v.compare_exchange_weak(cur, cur - 1, std::memory_order_acq_rel, std::memory_order_relaxed)) {
            return true;
        }
    }
    return false;
}

}  // namespace

void arm(Point point, int err, uint32_t count, uint32_t skip) noexcept {
    SPINDLE_CHECK_MSG(err > 0, "inject::arm needs a positive param: take() reads 0 as 'go ahead'");
    Slot& s = slotOf(point);
    s.count.store(0, std::memory_order_relaxed);
    s.err.store(err, std::memory_order_relaxed);
    s.skip.store(skip, std::memory_order_relaxed);
    s.count.store(count, std::memory_order_release);
    detail::gArmedMask.fetch_or(bit(point), std::memory_order_release);
}

void disarm(Point point) noexcept {
    Slot& s = slotOf(point);
    s.count.store(0, std::memory_order_release);
    s.skip.store(0, std::memory_order_relaxed);
    detail::gArmedMask.fetch_and(~bit(point), std::memory_order_release);
}

int take(Point point) noexcept {
    Slot& s = slotOf(point);
    if (s.count.load(std::memory_order_relaxed) == 0) { return 0; }  // the disarmed fast path
    if (takeOne(s.skip)) { return 0; }
    if (!takeOne(s.count)) { return 0; }
    return s.err.load(std::memory_order_relaxed);
}

uint32_t remaining(Point point) noexcept { return slotOf(point).count.load(std::memory_order_acquire); }

}  // namespace spindle::inject
