// SPDX-License-Identifier: Apache-2.0
// base/counter.h: a counter with one writer, read from another thread while it counts.
#include "base/counter.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <thread>

namespace spindle {
namespace {

TEST(OwnerCounter, AddsAndSubtracts) {
    std::atomic<uint64_t> c{0};
    ownerAdd(c);
    ownerAdd(c, 41);
    EXPECT_EQ(c.load(), 42u);
    ownerSub(c);
    ownerSub(c, 40);
    EXPECT_EQ(c.load(), 1u);
    ownerSub(c, 2);  // unsigned: a gauge moved below zero wraps, as std::atomic<uint64_t>::fetch_sub would
    EXPECT_EQ(c.load(), UINT64_MAX);
}

// One writer, one reader: the reader sees each value at most once and never one going backwards, and
// the last is exact (nothing lost without a locked instruction while only one thread writes).
TEST(OwnerCounter, OneWriterLosesNothingAndAReaderSeesItOnlyGrow) {
    constexpr uint64_t kCounts = 2'000'000;
    std::atomic<uint64_t> c{0};
    std::atomic<bool> done{false};
    uint64_t backwards = 0, last = 0;
    std::thread reader([&] {
        while (!done.load(std::memory_order_acquire)) {
            const uint64_t v = c.load(std::memory_order_relaxed);
            if (v < last) { ++backwards; }
            last = v;
        }
    });
    for (uint64_t i = 0; i < kCounts; ++i) { ownerAdd(c); }
    done.store(true, std::memory_order_release);
    reader.join();
    EXPECT_EQ(c.load(), kCounts);
    EXPECT_EQ(backwards, 0u);
    EXPECT_LE(last, kCounts);
}

}  // namespace
}  // namespace spindle
