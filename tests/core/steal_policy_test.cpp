// SPDX-License-Identifier: Apache-2.0
// Steal policies on synthetic topologies (carriers run unbound, "simulation mode"): the victim order each
// carrier gets, the threshold rule of kNuma against kRandom's free crossing, kLocalOnly and kNone, and
// pinned fibers under every policy. No verdict here depends on timing: every assertion is on a counter or a
// placement that must be zero or non-zero by construction (see each test's comment for why).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/fiber.h"
#include "core/runtime.h"
#include "numa/topology.h"
#include "tests/core/with_runtime.h"

namespace spindle {
namespace {

using numa::Distance;
using testing_support::settledLiveFibers;

RuntimeOptions simulated(const std::string& shape, unsigned carriers, StealPolicy policy, unsigned threshold = 2) {
    RuntimeOptions o;
    o.topology = "synthetic:" + shape;
    o.carriers = carriers;
    o.stealPolicy = policy;
    o.crossNodeStealThreshold = threshold;
    o.fixedBufferCount = 0;  // many carriers on a small VM: no pinned buffer pools needed here
    o.fixedFileSlots = 0;
    return o;
}

std::optional<Runtime> startOrFail(const RuntimeOptions& o) {
    auto rt = Runtime::start(o);
    if (!rt) {
        ADD_FAILURE() << "runtime did not start on '" << o.topology << "': " << rt.error().message();
        return std::nullopt;
    }
    return std::optional<Runtime>(std::move(*rt));
}

// A slice of CPU work between yields, counted in loop iterations (never in time): it keeps a fiber's
// fellows queued long enough for an idle thief to find them, as real work would.
void burn() {
    volatile uint64_t sink = 0;
    for (int i = 0; i < 20000; ++i) { sink = sink + static_cast<uint64_t>(i); }
}

uint64_t crossNodeSteals(const std::vector<CarrierStats>& stats) {
    uint64_t n = 0;
    for (const CarrierStats& s : stats) { n += s.crossNodeSteals(); }
    return n;
}

uint64_t totalSteals(const std::vector<CarrierStats>& stats) {
    uint64_t n = 0;
    for (const CarrierStats& s : stats) { n += s.steals; }
    return n;
}

// Checks carrier c's victim order against `expected(c, v)`, the class the topology's shape implies (computed
// by the test from the shape, not by numa::Topology): every other carrier once, classes non-decreasing, and
// ties in index order starting after c.
template <class ExpectedClass>
void expectVictimOrder(const Runtime& rt, ExpectedClass expected) {
    const unsigned n = rt.carrierCount();
    for (unsigned c = 0; c < n; ++c) {
        auto order = rt.victimOrder(c);
        ASSERT_TRUE(order) << order.error().message();
        ASSERT_EQ(order->size(), n - 1) << "carrier " << c;
        std::vector<bool> seen(n, false);
        for (size_t i = 0; i < order->size(); ++i) {
            const Victim& v = (*order)[i];
            ASSERT_LT(v.carrier, n);
            EXPECT_NE(v.carrier, c) << "a carrier never steals from itself";
            EXPECT_FALSE(seen[v.carrier]) << "victim " << v.carrier << " twice for carrier " << c;
            seen[v.carrier] = true;
            EXPECT_EQ(v.distance, expected(c, v.carrier))
                << "carrier " << c << " -> " << v.carrier << ": " << numa::toString(v.distance);
            if (i > 0) {
                const Victim& prev = (*order)[i - 1];
                EXPECT_LE(prev.distance, v.distance) << "carrier " << c << ": victims nearest first";
                if (prev.distance == v.distance) {
                    EXPECT_LT((prev.carrier + n - c) % n, (v.carrier + n - c) % n)
                        << "carrier " << c << ": ties in index order after the thief";
                }
            }
        }
    }
}

// ---- options and introspection ---------------------------------------------------------------------

TEST(StealPolicy, ParsesEveryNameAndRejectsOthers) {
    for (StealPolicy p : {StealPolicy::kNuma, StealPolicy::kRandom, StealPolicy::kLocalOnly, StealPolicy::kNone}) {
        auto parsed = parseStealPolicy(toString(p));
        ASSERT_TRUE(parsed) << toString(p);
        EXPECT_EQ(*parsed, p);
    }
    for (const char* bad : {"", "NUMA", "local", "localonly", "random ", "all"}) {
        auto parsed = parseStealPolicy(bad);
        ASSERT_FALSE(parsed) << "'" << bad << "'";
        EXPECT_EQ(parsed.errorCode(), EINVAL);
    }
}

TEST(StealPolicy, InvalidOptionsAreEinval) {
    RuntimeOptions o = simulated("pack:1 core:2 pu:1", 2, StealPolicy::kNuma);
    o.stealPolicy = static_cast<StealPolicy>(4);
    auto rt = Runtime::start(o);
    ASSERT_FALSE(rt);
    EXPECT_EQ(rt.errorCode(), EINVAL);

    o.stealPolicy = StealPolicy::kNuma;
    o.crossNodeStealThreshold = 1'000'001;
    rt = Runtime::start(o);
    ASSERT_FALSE(rt);
    EXPECT_EQ(rt.errorCode(), EINVAL);

    o.crossNodeStealThreshold = 1'000'000;  // the largest allowed
    rt = Runtime::start(o);
    ASSERT_TRUE(rt) << rt.error().message();
}

TEST(StealPolicy, VictimOrderOfAMissingCarrierIsEinval) {
    auto rt = startOrFail(simulated("pack:1 core:2 pu:1", 2, StealPolicy::kNuma));
    ASSERT_TRUE(rt);
    auto order = rt->victimOrder(2);
    ASSERT_FALSE(order);
    EXPECT_EQ(order.errorCode(), EINVAL);
}

// ---- victim orders -----------------------------------------------------------------------------------

// One node, 4 cores x 2 PUs, 8 carriers: the topology's PU order puts carrier c on core c % 4, so c and
// c ^ 4 are SMT siblings; no cache is described, so every other carrier is merely kSameNode.
TEST(StealPolicy, VictimOrderOneNode) {
    auto rt = startOrFail(simulated("pack:1 numa:1 core:4 pu:2", 8, StealPolicy::kNuma));
    ASSERT_TRUE(rt);
    expectVictimOrder(*rt, [](unsigned c, unsigned v) {
        return c % 4 == v % 4 ? Distance::kSameCore : Distance::kSameNode;
    });
    for (const CarrierStats& s : rt->stats()) { EXPECT_EQ(s.node, 0u); }
}

// 2 packages x 2 nodes x 4 cores x 2 PUs (32 PUs, 16 cores). With 32 carriers, carrier c sits on core
// c % 16 (first PUs of every core, then the second ones); core k is on node k / 4 and package k / 8.
TEST(StealPolicy, VictimOrderTwoPackagesTwoNodes) {
    auto rt = startOrFail(simulated("pack:2 numa:2 core:4 pu:2", 32, StealPolicy::kNuma));
    ASSERT_TRUE(rt);
    expectVictimOrder(*rt, [](unsigned c, unsigned v) {
        const unsigned kc = c % 16, kv = v % 16;
        if (kc == kv) { return Distance::kSameCore; }
        if (kc / 4 == kv / 4) { return Distance::kSameNode; }
        if (kc / 8 == kv / 8) { return Distance::kSamePackage; }
        return Distance::kRemotePackage;
    });
    for (const CarrierStats& s : rt->stats()) { EXPECT_EQ(s.node, (s.index % 16) / 4) << "carrier " << s.index; }
    // The counts per class for one carrier: 1 sibling, 6 on its node, 8 on the other node of its package,
    // 16 on the other package.
    auto order = rt->victimOrder(5);
    ASSERT_TRUE(order);
    size_t perClass[numa::kDistanceClassCount] = {};
    for (const Victim& v : *order) { ++perClass[static_cast<size_t>(v.distance)]; }
    EXPECT_EQ(perClass[static_cast<size_t>(Distance::kSameCore)], 1u);
    EXPECT_EQ(perClass[static_cast<size_t>(Distance::kSameNode)], 6u);
    EXPECT_EQ(perClass[static_cast<size_t>(Distance::kSamePackage)], 8u);
    EXPECT_EQ(perClass[static_cast<size_t>(Distance::kRemotePackage)], 16u);
}

// An L3 per node: the other core of a node shares the L3 (kSameCache), the other node is kSamePackage.
TEST(StealPolicy, VictimOrderSharedCache) {
    auto rt = startOrFail(simulated("pack:1 numa:2 l3:1 core:2 pu:1", 4, StealPolicy::kNuma));
    ASSERT_TRUE(rt);
    expectVictimOrder(*rt, [](unsigned c, unsigned v) {
        return c / 2 == v / 2 ? Distance::kSameCache : Distance::kSamePackage;
    });
}

// Packages without memory of their own: the only NUMA node hangs off the machine, so the two packages'
// PUs share node 0 and no steal between them crosses a node (kSameNode, never kRemotePackage).
TEST(StealPolicy, VictimOrderMemorylessPackages) {
    auto rt = startOrFail(simulated("[numa] pack:2 core:2 pu:1", 4, StealPolicy::kNuma));
    ASSERT_TRUE(rt);
    expectVictimOrder(*rt, [](unsigned, unsigned) { return Distance::kSameNode; });
    for (const CarrierStats& s : rt->stats()) { EXPECT_EQ(s.node, 0u); }
}

// Each package has a second, CPU-less node (memory only: HBM, CXL). It holds no carrier and changes no
// distance: PUs belong to the first node of their package.
TEST(StealPolicy, VictimOrderWithCpulessNodes) {
    auto rt = startOrFail(simulated("pack:2 [numa] [numa] core:2 pu:1", 4, StealPolicy::kNuma));
    ASSERT_TRUE(rt);
    ASSERT_NE(rt->topology(), nullptr);
    EXPECT_EQ(rt->topology()->nodeCount(), 4u);
    expectVictimOrder(*rt, [](unsigned c, unsigned v) {
        return c / 2 == v / 2 ? Distance::kSameNode : Distance::kRemotePackage;
    });
    auto stats = rt->stats();
    EXPECT_EQ(stats[0].node, stats[1].node);
    EXPECT_EQ(stats[2].node, stats[3].node);
    EXPECT_NE(stats[0].node, stats[2].node);
}

// ---- the threshold rule ----------------------------------------------------------------------------

// Two carriers, one per node. `kFibers` == threshold unpinned fibers start on carrier 0 and keep yielding;
// nothing else runs. So carrier 0 never has more than `threshold` fibers queued, and the only possible
// steal crosses a node: kNuma must never take one (by construction), kRandom must (each fiber yields until
// one of them has run on carrier 1; while carrier 1 idles, carrier 0 keeps handing both to its deque and
// waking it, so under kRandom the loop ends with probability 1; the cap only turns a bug into a failure).
constexpr const char* kTwoNodes = "pack:1 numa:2 core:1 pu:1";
constexpr unsigned kThreshold = 2;
constexpr unsigned kFibers = kThreshold;

struct SmallSkew {
    std::atomic<bool> moved{false};        // a fiber ran on a carrier other than 0
    std::atomic<uint64_t> foreignRuns{0};  // slices run on a carrier other than 0
    std::atomic<uint64_t> migrations{0};   // yields that came back on another carrier than they left
};

uint64_t migrated(const std::vector<CarrierStats>& stats) {
    uint64_t n = 0;
    for (const CarrierStats& s : stats) { n += s.fibersMigrated; }
    return n;
}

void runSmallSkew(Runtime& rt, SmallSkew& s, uint64_t yieldsUntilDone, bool stopWhenMoved) {
    std::vector<FiberHandle<void>> handles;
    for (unsigned i = 0; i < kFibers; ++i) {
        auto h = rt.spawn(
            [&s, yieldsUntilDone, stopWhenMoved] {
                for (uint64_t k = 0; k < yieldsUntilDone; ++k) {
                    const int before = this_fiber::carrierIndex();
                    if (before != 0) {
                        s.foreignRuns.fetch_add(1, std::memory_order_relaxed);
                        s.moved.store(true, std::memory_order_relaxed);
                    }
                    if (stopWhenMoved && s.moved.load(std::memory_order_relaxed)) { return; }
                    burn();
                    this_fiber::yield();
                    if (this_fiber::carrierIndex() != before) { s.migrations.fetch_add(1, std::memory_order_relaxed); }
                }
            },
            SpawnOptions{.name = "skew", .carrier = 0});
        ASSERT_TRUE(h) << h.error().message();
        handles.push_back(std::move(*h));
    }
    for (auto& h : handles) { h.join(); }
}

TEST(StealPolicy, NumaDoesNotCrossForABacklogWithinTheThreshold) {
    auto rt = startOrFail(simulated(kTwoNodes, 2, StealPolicy::kNuma, kThreshold));
    ASSERT_TRUE(rt);
    ASSERT_EQ(rt->victimOrder(0)->front().distance, Distance::kSamePackage);
    SmallSkew s;
    runSmallSkew(*rt, s, testing_support::kSanitized ? 500 : 2000, /*stopWhenMoved=*/false);
    EXPECT_EQ(settledLiveFibers(*rt), 0u);
    rt->shutdown();
    rt->join();  // idle time is added when a spell ends: after join, carrier 1's last park has ended
    auto stats = rt->stats();
    EXPECT_EQ(crossNodeSteals(stats), 0u);
    EXPECT_EQ(totalSteals(stats), 0u);
    EXPECT_EQ(s.foreignRuns.load(), 0u) << "no fiber may run on node 1";
    EXPECT_EQ(migrated(stats), 0u);
    EXPECT_EQ(s.migrations.load(), 0u);
    EXPECT_EQ(stats[1].fibersRun, 0u);
    EXPECT_EQ(stats[1].stealAttempts[static_cast<size_t>(Distance::kSamePackage)], 0u)
        << "a victim within the threshold is not even tried";
    if (stats[1].parks > 0) { EXPECT_GT(stats[1].idleNs, 0u) << "a carrier that parked counts idle time"; }
}

TEST(StealPolicy, RandomCrossesForTheSameBacklog) {
    auto rt = startOrFail(simulated(kTwoNodes, 2, StealPolicy::kRandom, kThreshold));
    ASSERT_TRUE(rt);
    SmallSkew s;
    runSmallSkew(*rt, s, /*cap=*/200'000, /*stopWhenMoved=*/true);
    ASSERT_TRUE(s.moved.load()) << "under kRandom no fiber reached node 1 in 200k slices";
    auto stats = rt->stats();
    EXPECT_GT(crossNodeSteals(stats), 0u);
    EXPECT_GT(stats[1].stealSuccesses[static_cast<size_t>(Distance::kSamePackage)], 0u);
    EXPECT_GE(stats[1].stealAttempts[static_cast<size_t>(Distance::kSamePackage)],
              stats[1].stealSuccesses[static_cast<size_t>(Distance::kSamePackage)]);
    // A fiber suspends only in yield(), so every migration the runtime counts is one a fiber saw.
    EXPECT_EQ(migrated(stats), s.migrations.load());
    uint64_t sum = 0;
    for (uint64_t v : stats[1].stealSuccesses) { sum += v; }
    EXPECT_EQ(sum, stats[1].steals);
    EXPECT_EQ(settledLiveFibers(*rt), 0u);
}

// ---- a larger skew on two nodes of two carriers each ----------------------------------------------------

constexpr const char* kFourCarriers = "pack:1 numa:2 core:2 pu:1";  // carriers 0,1 on node 0; 2,3 on node 1

// 64 fibers start on carrier 0. Each yields until every carrier has run one of them (a bitmask), so the
// test ends only once the work has spread to all four; it can spread to carriers 2 and 3 only through a
// kNuma cross-node steal, which needs a backlog above the threshold, which 64 fibers on node 0 provide.
TEST(StealPolicy, NumaSpreadsAHeavySkewOverBothNodes) {
    auto rt = startOrFail(simulated(kFourCarriers, 4, StealPolicy::kNuma, kThreshold));
    ASSERT_TRUE(rt);
    std::atomic<unsigned> seen{0};
    std::atomic<bool> capped{false};
    std::atomic<uint64_t> migrations{0};
    std::vector<FiberHandle<void>> handles;
    for (int i = 0; i < 64; ++i) {
        auto h = rt->spawn(
            [&] {
                for (uint64_t k = 0; seen.load(std::memory_order_relaxed) != 0xF; ++k) {
                    if (k == 200'000) {
                        capped.store(true);
                        return;
                    }
                    const int before = this_fiber::carrierIndex();
                    seen.fetch_or(1u << before, std::memory_order_relaxed);
                    burn();
                    this_fiber::yield();
                    if (this_fiber::carrierIndex() != before) { migrations.fetch_add(1, std::memory_order_relaxed); }
                }
            },
            SpawnOptions{.name = "heavy", .carrier = 0});
        ASSERT_TRUE(h);
        handles.push_back(std::move(*h));
    }
    for (auto& h : handles) { h.join(); }
    EXPECT_FALSE(capped.load()) << "the work never reached every carrier";
    EXPECT_EQ(seen.load(), 0xFu);
    auto stats = rt->stats();
    EXPECT_GT(crossNodeSteals(stats), 0u);
    EXPECT_EQ(migrated(stats), migrations.load()) << "fibers suspend only in yield(): each migration is seen";
    for (const CarrierStats& st : stats) {
        EXPECT_GT(st.fibersRun, 0u) << "carrier " << st.index;
        if (st.index < 2) { EXPECT_EQ(st.crossNodeSteals(), 0u) << "carrier " << st.index << " has nothing to cross for"; }
    }
    EXPECT_EQ(settledLiveFibers(*rt), 0u);
}

// ---- a burst behind a busy carrier -----------------------------------------------------------------

// Fibers spawned from outside the runtime reach their carrier through its inbox and its deque at its next
// maintenance, which offers them with one wake-up, however many there are. Here carrier 0 takes a burst
// of four such fibers while the three others are parked, and each of the four spins, without yielding
// (so carrier 0 runs no maintenance again), until all four run at once or 10 s pass. That needs a
// thief for each of three fibers; the one woken must pass the wake-up on while the backlog lasts. Before
// thieves did (on a 16-core machine, spindle-topo's skewed experiment ran no faster on 16 carriers than
// on 8), two of the four ran and the others waited out the deadline. Nothing here depends on timing but
// the deadline, which only a failure reaches.
void burstBehindABusyCarrier(StealPolicy policy) {
    constexpr unsigned kThieves = 3;
    auto rt = startOrFail(simulated("pack:1 numa:1 core:4 pu:1", kThieves + 1, policy));
    ASSERT_TRUE(rt);
    std::atomic<bool> gateUp{false}, posted{false};
    auto gate = rt->spawn(
        [&] {
            gateUp.store(true);
            while (!posted.load()) { std::this_thread::yield(); }  // keeps carrier 0 from its maintenance
        },
        SpawnOptions{.name = "gate", .carrier = 0, .pinned = true});
    ASSERT_TRUE(gate) << gate.error().message();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    // The thieves park once they find nothing: only a wake-up brings them back.
    for (bool allParked = false; !allParked && std::chrono::steady_clock::now() < deadline;) {
        allParked = gateUp.load();
        for (const CarrierStats& st : rt->stats()) { allParked = allParked && (st.index == 0 || st.parks > 0); }
        if (!allParked) { std::this_thread::sleep_for(std::chrono::milliseconds(1)); }
    }
    std::atomic<unsigned> running{0};
    std::atomic<unsigned> carriersSeen{0};
    std::vector<FiberHandle<void>> burst;
    for (unsigned i = 0; i <= kThieves; ++i) {
        auto h = rt->spawn(
            [&] {
                carriersSeen.fetch_or(1u << this_fiber::carrierIndex());
                running.fetch_add(1);
                while (running.load() <= kThieves && std::chrono::steady_clock::now() < deadline) {
                    std::this_thread::yield();  // the OS's: on a small machine the carriers share CPUs
                }
            },
            SpawnOptions{.name = "burst", .carrier = 0});
        ASSERT_TRUE(h) << h.error().message();
        burst.push_back(std::move(*h));
    }
    posted.store(true);
    gate->join();
    for (auto& h : burst) { h.join(); }
    EXPECT_EQ(carriersSeen.load(), 0xFu) << "the burst did not reach every carrier before the deadline";
    rt->shutdown();
    rt->join();
    uint64_t steals = 0;
    for (const CarrierStats& st : rt->stats()) { steals += st.steals; }
    EXPECT_GE(steals, kThieves);
    EXPECT_EQ(settledLiveFibers(*rt), 0u);
}

TEST(StealPolicy, NumaThievesPassTheWakeUpOnWhileABacklogLasts) { burstBehindABusyCarrier(StealPolicy::kNuma); }

TEST(StealPolicy, RandomThievesPassTheWakeUpOnWhileABacklogLasts) { burstBehindABusyCarrier(StealPolicy::kRandom); }

// The same heavy skew for a fixed number of yields: kLocalOnly never leaves node 0, kNone never steals.
void runFixedSkew(Runtime& rt, std::atomic<unsigned>& seen) {
    std::vector<FiberHandle<void>> handles;
    for (int i = 0; i < 64; ++i) {
        auto h = rt.spawn(
            [&seen] {
                for (int k = 0; k < 50; ++k) {
                    seen.fetch_or(1u << this_fiber::carrierIndex(), std::memory_order_relaxed);
                    burn();
                    this_fiber::yield();
                }
            },
            SpawnOptions{.name = "fixed", .carrier = 0});
        ASSERT_TRUE(h);
        handles.push_back(std::move(*h));
    }
    for (auto& h : handles) { h.join(); }
}

TEST(StealPolicy, LocalOnlyNeverLeavesTheNode) {
    auto rt = startOrFail(simulated(kFourCarriers, 4, StealPolicy::kLocalOnly, kThreshold));
    ASSERT_TRUE(rt);
    std::atomic<unsigned> seen{0};
    runFixedSkew(*rt, seen);
    EXPECT_EQ(seen.load() & 0xCu, 0u) << "a fiber ran on node 1";
    auto stats = rt->stats();
    EXPECT_EQ(crossNodeSteals(stats), 0u);
    for (const CarrierStats& st : stats) {
        for (size_t k = 0; k < numa::kDistanceClassCount; ++k) {
            if (numa::crossesNode(static_cast<Distance>(k))) { EXPECT_EQ(st.stealAttempts[k], 0u); }
        }
    }
    EXPECT_EQ(settledLiveFibers(*rt), 0u);
}

TEST(StealPolicy, NoneNeverSteals) {
    auto rt = startOrFail(simulated(kFourCarriers, 4, StealPolicy::kNone, kThreshold));
    ASSERT_TRUE(rt);
    std::atomic<unsigned> seen{0};
    runFixedSkew(*rt, seen);
    EXPECT_EQ(seen.load(), 1u) << "every fiber runs on carrier 0, where it was spawned";
    auto stats = rt->stats();
    EXPECT_EQ(totalSteals(stats), 0u);
    for (const CarrierStats& st : stats) {
        EXPECT_EQ(st.fibersMigrated, 0u);
        for (uint64_t a : st.stealAttempts) { EXPECT_EQ(a, 0u); }
        if (st.index != 0) { EXPECT_EQ(st.fibersRun, 0u) << "carrier " << st.index; }
    }
    EXPECT_EQ(settledLiveFibers(*rt), 0u);
}

// ---- pinned fibers ----------------------------------------------------------------------------------------

class PinnedUnderPolicy : public ::testing::TestWithParam<StealPolicy> {};

// Pinned fibers on carrier 0 keep yielding while unpinned "bait" fibers, also on
// carrier 0, give the thieves a reason to steal. The bait runs until the thieves have taken one of them
// (kNone: for a fixed number of yields, since nothing may move), so the pinned fibers were exposed to live
// stealing; each pinned fiber checks its carrier after every yield.
TEST_P(PinnedUnderPolicy, PinnedFibersNeverMove) {
    const StealPolicy policy = GetParam();
    auto rt = startOrFail(simulated(kFourCarriers, 4, policy, /*threshold=*/0));
    ASSERT_TRUE(rt);
    std::atomic<bool> baitDone{false};
    std::atomic<bool> baitMoved{false};
    std::atomic<uint64_t> pinnedMoves{0};
    std::vector<FiberHandle<void>> pinned;
    // All on carrier 0: a pinned fiber that never waits would keep its own carrier busy, and a busy
    // carrier does not steal.
    constexpr int home = 0;
    for (unsigned i = 0; i < 12; ++i) {
        auto h = rt->spawn(
            [&] {
                if (this_fiber::carrierIndex() != home) { pinnedMoves.fetch_add(1); }
                while (!baitDone.load(std::memory_order_relaxed)) {
                    this_fiber::yield();
                    if (this_fiber::carrierIndex() != home) { pinnedMoves.fetch_add(1); }
                }
            },
            SpawnOptions{.name = "pinned", .carrier = home, .pinned = true});
        ASSERT_TRUE(h);
        pinned.push_back(std::move(*h));
    }
    const bool expectMove = policy != StealPolicy::kNone;
    std::vector<FiberHandle<void>> bait;
    for (int i = 0; i < 16; ++i) {
        auto h = rt->spawn(
            [&, expectMove] {
                for (uint64_t k = 0; k < (expectMove ? 200'000u : 50u); ++k) {
                    if (this_fiber::carrierIndex() != 0) { baitMoved.store(true); }
                    if (expectMove && baitMoved.load(std::memory_order_relaxed)) { return; }
                    burn();
                    this_fiber::yield();
                }
            },
            SpawnOptions{.name = "bait", .carrier = 0});
        ASSERT_TRUE(h);
        bait.push_back(std::move(*h));
    }
    for (auto& h : bait) { h.join(); }
    baitDone.store(true);
    for (auto& h : pinned) { h.join(); }
    EXPECT_EQ(baitMoved.load(), expectMove) << "the thieves " << (expectMove ? "never stole" : "stole");
    EXPECT_EQ(pinnedMoves.load(), 0u) << "a pinned fiber ran away from its carrier under " << toString(policy);
    EXPECT_EQ(settledLiveFibers(*rt), 0u);
}

INSTANTIATE_TEST_SUITE_P(AllPolicies, PinnedUnderPolicy,
                         ::testing::Values(StealPolicy::kNuma, StealPolicy::kRandom, StealPolicy::kLocalOnly,
                                           StealPolicy::kNone),
                         [](const ::testing::TestParamInfo<StealPolicy>& param) {
                             std::string name = toString(param.param);
                             std::erase(name, '-');
                             return name;
                         });

}  // namespace
}  // namespace spindle
