// SPDX-License-Identifier: Apache-2.0
#pragma once
/// spindle::ownerAdd(): one more (or `by` more) on a counter that a single thread writes and any thread
/// reads, the shape of nearly every statistic here (a carrier's, a ring's, a queue's, a server's).
///
/// A relaxed load and a relaxed store, not fetch_add: no locked instruction (tens of cycles on x86 and
/// an exclusive cache line on every count), and the compiler may keep the two together with the code
/// around them. A reader on another thread sees some recent value, never a torn one. Correct only while
/// one thread at a time writes the counter: two writers would lose counts (use fetch_add there; the
/// writer may change over time, a carrier's fibers moving to another carrier's thread included, when
/// the handover synchronises, as a queue's or a lock's does). ownerSub() is the same the other way, for
/// a gauge that its one writer moves both ways.

#include <atomic>
#include <cstdint>

namespace spindle {

inline void ownerAdd(std::atomic<uint64_t>& counter, uint64_t by = 1) noexcept {
    counter.store(counter.load(std::memory_order_relaxed) + by, std::memory_order_relaxed);
}

inline void ownerSub(std::atomic<uint64_t>& counter, uint64_t by = 1) noexcept {
    counter.store(counter.load(std::memory_order_relaxed) - by, std::memory_order_relaxed);
}

}  // namespace spindle
