// SPDX-License-Identifier: Apache-2.0
// Unit tests of the steal policy written once (core/internal/steal_policy.h): stealAllowed() for each
// policy and distance, and the order in which stealPass() visits victims, which victims it never reads,
// and where it stops. Fake victims (index-only carriers) and queue lengths; no runtime.

#include "core/internal/steal_policy.h"

#include <gtest/gtest.h>

#include <array>
#include <cstddef>
#include <vector>

namespace spindle::detail {
namespace {

using numa::Distance;

TEST(StealAllowed, EachPolicyAsDocumented) {
    // kNone never; kRandom any non-empty victim; kLocalOnly non-empty victims on this node only.
    for (bool crosses : {false, true}) {
        EXPECT_FALSE(stealAllowed(StealPolicy::kNone, crosses, 100, 2));
        EXPECT_FALSE(stealAllowed(StealPolicy::kRandom, crosses, 0, 2));
        EXPECT_TRUE(stealAllowed(StealPolicy::kRandom, crosses, 1, 2));
    }
    EXPECT_TRUE(stealAllowed(StealPolicy::kLocalOnly, false, 1, 2));
    EXPECT_FALSE(stealAllowed(StealPolicy::kLocalOnly, false, 0, 2));
    EXPECT_FALSE(stealAllowed(StealPolicy::kLocalOnly, true, 100, 2));
    // kNuma: any non-empty local victim; a remote one only above the threshold (strictly).
    EXPECT_TRUE(stealAllowed(StealPolicy::kNuma, false, 1, 2));
    EXPECT_FALSE(stealAllowed(StealPolicy::kNuma, false, 0, 2));
    EXPECT_FALSE(stealAllowed(StealPolicy::kNuma, true, 2, 2));
    EXPECT_TRUE(stealAllowed(StealPolicy::kNuma, true, 3, 2));
    EXPECT_TRUE(stealAllowed(StealPolicy::kNuma, true, 1, 0)) << "threshold 0: any non-empty remote victim";
    EXPECT_FALSE(stealAllowed(StealPolicy::kNuma, true, 0, 0));
}

/// Four victims nearest first: two on the thief's node, two on another. The Carrier* is only an index
/// (aligned as a Carrier is, never dereferenced).
struct Victims {
    std::array<StealVictim, 4> v{{{reinterpret_cast<Carrier*>(64), Distance::kSameCore},
                                  {reinterpret_cast<Carrier*>(128), Distance::kSameNode},
                                  {reinterpret_cast<Carrier*>(192), Distance::kSamePackage},
                                  {reinterpret_cast<Carrier*>(256), Distance::kRemotePackage}}};
    std::array<size_t, 4> queued{};
    static constexpr size_t kLocal = 2;
    static size_t index(const StealVictim& x) { return reinterpret_cast<size_t>(x.carrier) / 64 - 1; }

    /// Runs one pass and returns the victims it read, in order, and the one it took (or 4: none).
    std::pair<std::vector<size_t>, size_t> pass(StealPolicy policy, unsigned threshold, size_t randomValue = 0,
                                                bool takeSucceeds = true) {
        std::vector<size_t> read;
        size_t taken = 4;
        const bool found = stealPass(
            policy, threshold, std::span<const StealVictim>(v), kLocal,
            [&](const StealVictim& x) {
                read.push_back(index(x));
                return queued[index(x)];
            },
            [&] { return randomValue; },
            [&](const StealVictim& x) {
                if (!takeSucceeds) { return false; }
                taken = index(x);
                return true;
            });
        EXPECT_EQ(found, taken != 4);
        return {read, taken};
    }
};

TEST(StealPass, NumaTriesLocalVictimsFirstAndCrossesOnlyForABacklog) {
    Victims s;
    s.queued = {0, 1, 5, 5};
    auto [read, taken] = s.pass(StealPolicy::kNuma, 2);
    EXPECT_EQ(read, (std::vector<size_t>{0, 1}));
    EXPECT_EQ(taken, 1u) << "the nearest non-empty local victim";

    s.queued = {0, 0, 2, 3};  // both local empty; remote 2 is not above the threshold, remote 3 is
    std::tie(read, taken) = s.pass(StealPolicy::kNuma, 2);
    EXPECT_EQ(read, (std::vector<size_t>{0, 1, 2, 3}));
    EXPECT_EQ(taken, 3u);

    s.queued = {0, 0, 1, 2};
    std::tie(read, taken) = s.pass(StealPolicy::kNuma, 2);
    EXPECT_EQ(taken, 4u) << "no remote victim has a backlog above the threshold";
}

TEST(StealPass, LocalOnlyNeverReadsAVictimOnAnotherNode) {
    Victims s;
    s.queued = {0, 0, 9, 9};
    auto [read, taken] = s.pass(StealPolicy::kLocalOnly, 2);
    EXPECT_EQ(read, (std::vector<size_t>{0, 1}));
    EXPECT_EQ(taken, 4u);
}

TEST(StealPass, RandomStartsWhereTheRandomValueSaysAndWrapsAround) {
    Victims s;
    s.queued = {1, 0, 0, 0};
    auto [read, taken] = s.pass(StealPolicy::kRandom, 2, /*randomValue=*/6);  // 6 % 4 = 2
    EXPECT_EQ(read, (std::vector<size_t>{2, 3, 0}));
    EXPECT_EQ(taken, 0u);
}

TEST(StealPass, NoneReadsNothingAndAFailedTakeMovesOn) {
    Victims s;
    s.queued = {1, 1, 9, 9};
    auto [read, taken] = s.pass(StealPolicy::kNone, 2);
    EXPECT_TRUE(read.empty());
    EXPECT_EQ(taken, 4u);
    // Every take fails (the victim emptied under us): each allowed victim is tried once, none twice.
    std::tie(read, taken) = s.pass(StealPolicy::kNuma, 2, 0, /*takeSucceeds=*/false);
    EXPECT_EQ(read, (std::vector<size_t>{0, 1, 2, 3}));
    EXPECT_EQ(taken, 4u);
}

}  // namespace
}  // namespace spindle::detail
