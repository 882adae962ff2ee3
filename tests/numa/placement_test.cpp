// SPDX-License-Identifier: Apache-2.0
// Unit tests for numa/placement.h: every policy on synthetic shapes, the explicit list's
// errors, and the text form apps use.
#include "numa/placement.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <string>
#include <vector>

namespace spindle::numa {
namespace {

// 2 packages x 2 NUMA nodes x 4 cores x 2 PUs: OS index os is on core os/2 and node os/8.
constexpr const char* kFourNodes = "pack:2 numa:2 core:4 pu:2";

#define SPINDLE_SYNTHETIC(var, description)                                                  \
    auto var##Result = Topology::fromSynthetic(description);                                 \
    ASSERT_TRUE(var##Result.ok()) << (description) << ": " << var##Result.error().message(); \
    Topology& var = *var##Result

std::vector<unsigned> place(const Topology& t, Placement p, unsigned count, const std::vector<unsigned>& list = {}) {
    auto r = placeCarriers(t, p, count, list);
    EXPECT_TRUE(r.ok()) << toString(p) << " x" << count << ": " << r.error().message();
    return r.ok() ? *r : std::vector<unsigned>{};
}

std::vector<unsigned> range(unsigned from, unsigned to, unsigned step = 1) {
    std::vector<unsigned> out;
    for (unsigned i = from; i < to; i += step) { out.push_back(i); }
    return out;
}

TEST(Placement, PerCoreTakesTheFirstPuOfEveryCore) {
    SPINDLE_SYNTHETIC(t, kFourNodes);
    EXPECT_EQ(place(t, Placement::kPerCore, 0), range(0, 32, 2));
    EXPECT_EQ(place(t, Placement::kPerCore, 3), (std::vector<unsigned>{0, 2, 4}));
    // More carriers than cores: SMT siblings next, then around again.
    std::vector<unsigned> twenty = range(0, 32, 2);
    for (unsigned os : {1u, 3u, 5u, 7u}) { twenty.push_back(os); }
    EXPECT_EQ(place(t, Placement::kPerCore, 20), twenty);
}

TEST(Placement, PerPuTakesEveryPuCoresFirst) {
    SPINDLE_SYNTHETIC(t, kFourNodes);
    std::vector<unsigned> expected = range(0, 32, 2);
    for (unsigned os : range(1, 32, 2)) { expected.push_back(os); }
    EXPECT_EQ(place(t, Placement::kPerPu, 0), expected);
    std::vector<unsigned> wrapped = expected;
    wrapped.push_back(0);
    EXPECT_EQ(place(t, Placement::kPerPu, 33), wrapped);
}

TEST(Placement, CompactFillsACoreThenTheNextThenTheNextNode) {
    SPINDLE_SYNTHETIC(t, kFourNodes);
    EXPECT_EQ(place(t, Placement::kCompact, 0), range(0, 32));
    EXPECT_EQ(place(t, Placement::kCompact, 3), (std::vector<unsigned>{0, 1, 2}));
}

TEST(Placement, ScatterRoundRobinsOverNodes) {
    SPINDLE_SYNTHETIC(t, kFourNodes);
    std::vector<unsigned> expected;
    for (unsigned core = 0; core < 4; ++core) {
        for (unsigned node = 0; node < 4; ++node) { expected.push_back(node * 8 + core * 2); }
    }
    EXPECT_EQ(place(t, Placement::kScatter, 0), expected);
    auto four = place(t, Placement::kScatter, 4);
    EXPECT_EQ(four, (std::vector<unsigned>{0, 8, 16, 24}));
    for (size_t i = 0; i < four.size(); ++i) { EXPECT_EQ(t.nodeOf(four[i]), i); }
}

TEST(Placement, OnOneNodeScatterIsPerCore) {
    SPINDLE_SYNTHETIC(t, "core:4 pu:2");
    EXPECT_EQ(place(t, Placement::kScatter, 0), place(t, Placement::kPerCore, 0));
    EXPECT_EQ(place(t, Placement::kPerCore, 0), (std::vector<unsigned>{0, 2, 4, 6}));
    EXPECT_EQ(place(t, Placement::kCompact, 0), range(0, 8));
}

TEST(Placement, ExplicitKeepsTheListAndItsOrder) {
    SPINDLE_SYNTHETIC(t, kFourNodes);
    EXPECT_EQ(place(t, Placement::kExplicit, 0, {31, 7, 12}), (std::vector<unsigned>{31, 7, 12}));
    EXPECT_EQ(place(t, Placement::kExplicit, 2, {31, 7, 12}), (std::vector<unsigned>{31, 7}));
    // The list is read for kExplicit only.
    EXPECT_EQ(place(t, Placement::kCompact, 2, {31}), (std::vector<unsigned>{0, 1}));
}

TEST(Placement, ExplicitListErrorsAreEinval) {
    SPINDLE_SYNTHETIC(t, kFourNodes);
    EXPECT_EQ(placeCarriers(t, Placement::kExplicit, 0, {}).errorCode(), EINVAL);          // empty
    EXPECT_EQ(placeCarriers(t, Placement::kExplicit, 0, {3, 5, 3}).errorCode(), EINVAL);   // duplicate
    EXPECT_EQ(placeCarriers(t, Placement::kExplicit, 0, {3, 32}).errorCode(), EINVAL);     // not in the topology
    EXPECT_EQ(placeCarriers(t, Placement::kExplicit, 3, {3, 5}).errorCode(), EINVAL);      // more carriers than PUs
    EXPECT_EQ(placeCarriers(t, static_cast<Placement>(42), 0).errorCode(), EINVAL);       // no such policy
}

TEST(Placement, ExplicitPuOutsideARestrictedTopologyIsEinval) {
    SPINDLE_SYNTHETIC(t, kFourNodes);
    auto narrow = t.restricted({8, 9, 10, 11});
    ASSERT_TRUE(narrow.ok()) << narrow.error().message();
    EXPECT_EQ(placeCarriers(*narrow, Placement::kExplicit, 0, {0}).errorCode(), EINVAL);
    EXPECT_EQ(place(*narrow, Placement::kExplicit, 0, {11, 8}), (std::vector<unsigned>{11, 8}));
    EXPECT_EQ(place(*narrow, Placement::kPerCore, 0), (std::vector<unsigned>{8, 10}));
    EXPECT_EQ(place(*narrow, Placement::kScatter, 0), (std::vector<unsigned>{8, 10}));
}

TEST(Placement, EmptyTopologyIsEinval) {
    SPINDLE_SYNTHETIC(t, kFourNodes);
    Topology moved(std::move(t));
    EXPECT_EQ(placeCarriers(t, Placement::kPerCore, 0).errorCode(), EINVAL);  // NOLINT(bugprone-use-after-move)
    EXPECT_TRUE(placeCarriers(moved, Placement::kPerCore, 0).ok());
}

TEST(Placement, ParsesEveryName) {
    struct Case {
        const char* text;
        Placement policy;
    };
    for (const Case& c : {Case{"per-core", Placement::kPerCore}, Case{"per-pu", Placement::kPerPu},
                          Case{"compact", Placement::kCompact}, Case{"scatter", Placement::kScatter}}) {
        auto r = parsePlacement(c.text);
        ASSERT_TRUE(r.ok()) << c.text;
        EXPECT_EQ(r->policy, c.policy) << c.text;
        EXPECT_TRUE(r->pus.empty());
        EXPECT_EQ(std::string(toString(c.policy)), c.text);
    }
    auto list = parsePlacement("list:0,2,4");
    ASSERT_TRUE(list.ok());
    EXPECT_EQ(list->policy, Placement::kExplicit);
    EXPECT_EQ(list->pus, (std::vector<unsigned>{0, 2, 4}));
    auto one = parsePlacement("list:7");
    ASSERT_TRUE(one.ok());
    EXPECT_EQ(one->pus, (std::vector<unsigned>{7}));
    EXPECT_STREQ(toString(Placement::kExplicit), "list");
    EXPECT_STREQ(toString(static_cast<Placement>(42)), "unknown");
}

TEST(Placement, ParseRejectsWhatIsNotAPlacement) {
    for (const char* bad : {"", "diagonal", "Per-Core", "list:", "list:1,", "list:,1", "list:1,,2", "list:a",
                            "list:-1", "list:1 ,2", "list:99999999999", "list:2097152"}) {
        auto r = parsePlacement(bad);
        EXPECT_FALSE(r.ok()) << '"' << bad << '"';
        if (!r.ok()) { EXPECT_EQ(r.errorCode(), EINVAL) << bad; }
    }
}

// SQPOLL threads: never on a carrier's PU or another SQ thread's while a PU is free, nearest first.
TEST(Placement, SqThreadsGoToTheSiblingOfTheirCarrierWhenItIsFree) {
    SPINDLE_SYNTHETIC(t, kFourNodes);  // per-core carriers on the even PUs: each odd PU is a free sibling
    EXPECT_EQ(placeSqThreads(t, place(t, Placement::kPerCore, 3)), (std::vector<int>{1, 3, 5}));
}

TEST(Placement, SqThreadsAvoidEveryCarriersPuNotOnlyTheirOwn) {
    // One PU per core: before, the SQ thread of the carrier on PU 0 went to PU 1, the next carrier's.
    SPINDLE_SYNTHETIC(t, "pack:1 numa:1 core:4 pu:1");
    EXPECT_EQ(placeSqThreads(t, {0, 1}), (std::vector<int>{2, 3}));
    EXPECT_EQ(placeSqThreads(t, {0, 1, 2}), (std::vector<int>{3, -1, -1})) << "one free PU, one SQ thread";
    EXPECT_EQ(placeSqThreads(t, {3}), (std::vector<int>{0})) << "after the carrier's PU, cyclically";
}

TEST(Placement, SqThreadsStayOnTheCarriersNodeWhileItHasAFreePu) {
    SPINDLE_SYNTHETIC(t, "pack:1 numa:2 core:2 pu:1");  // PUs 0,1 on node 0; 2,3 on node 1
    EXPECT_EQ(placeSqThreads(t, {0, 2}), (std::vector<int>{1, 3}));
    EXPECT_EQ(placeSqThreads(t, {0, 1, 2}), (std::vector<int>{3, -1, -1})) << "node 0 is full: the nearest free PU";
}

TEST(Placement, SqThreadsTakeOneFreePuEach) {
    SPINDLE_SYNTHETIC(t, "pack:1 numa:1 core:8 pu:1");
    EXPECT_EQ(placeSqThreads(t, {0, 1, 2, 3}), (std::vector<int>{4, 5, 6, 7}));
}

TEST(Placement, SqThreadsAreLeftToTheKernelWhenEveryPuRunsACarrier) {
    SPINDLE_SYNTHETIC(t, "pack:1 numa:1 core:2 pu:1");
    EXPECT_EQ(placeSqThreads(t, {0, 1}), (std::vector<int>{-1, -1}));
    EXPECT_EQ(placeSqThreads(t, {0, 1, 0}), (std::vector<int>{-1, -1, -1})) << "more carriers than PUs";
    EXPECT_TRUE(placeSqThreads(t, {}).empty());
}

}  // namespace
}  // namespace spindle::numa
