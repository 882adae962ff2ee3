// SPDX-License-Identifier: Apache-2.0
// The runtime's NUMA wiring: each placement policy on a synthetic topology shows up as each
// carrier's logicalPu in Runtime::stats(); SPINDLE_TOPOLOGY picks the topology when the option
// is empty; bad placements fail start(); node-local memory on this machine, and its fallbacks
// (synthetic topology, injected hwloc failure, injected membind refusal).
#include <gtest/gtest.h>
#include <sched.h>
#include <stdlib.h>

#include <atomic>
#include <cerrno>
#include <optional>
#include <string>
#include <vector>

#include "base/inject.h"
#include "core/runtime.h"
#include "numa/topology.h"
#include "testing/scoped_env.h"

namespace spindle {
namespace {

// 2 packages x 1 NUMA node x 2 cores x 2 PUs: OS index os is on core os/2, node os/4.
constexpr const char* kSmallTwoNodes = "synthetic:pack:2 numa:1 core:2 pu:2";

RuntimeOptions lean(const std::string& topology, numa::Placement placement, unsigned carriers = 0,
                    std::vector<unsigned> explicitPus = {}) {
    RuntimeOptions o;
    o.topology = topology;
    o.placement = placement;
    o.carriers = carriers;
    o.explicitPus = std::move(explicitPus);
    o.fixedBufferCount = 0;  // no pinned memory: these runtimes can be wide
    o.fixedFileSlots = 0;
    o.ringEntries = 8;
    return o;
}

std::vector<int> logicalPus(const Runtime& rt) {
    std::vector<int> out;
    for (const CarrierStats& s : rt.stats()) { out.push_back(s.logicalPu); }
    return out;
}

// Runs one fiber per carrier so that every carrier maps a stack.
void touchEveryCarrier(Runtime& rt) {
    std::atomic<unsigned> ran{0};
    std::vector<FiberHandle<void>> hs;
    for (unsigned c = 0; c < rt.carrierCount(); ++c) {
        auto h = rt.spawn([&] { ran.fetch_add(1); }, SpawnOptions{.carrier = static_cast<int>(c)});
        ASSERT_TRUE(h) << h.error().message();
        hs.push_back(std::move(*h));
    }
    for (auto& h : hs) { h.join(); }
    EXPECT_EQ(ran.load(), rt.carrierCount());
}

using testing_support::ScopedEnv;

using inject::ArmedFault;

struct PlacementCase {
    const char* name;
    numa::Placement placement;
    unsigned carriers;
    std::vector<unsigned> explicitPus;
    std::vector<int> expected;
};

class RuntimePlacement : public testing::TestWithParam<PlacementCase> {};

TEST_P(RuntimePlacement, StatsReportThePlacedPuOfEveryCarrier) {
    const PlacementCase& c = GetParam();
    auto rt = Runtime::start(lean(kSmallTwoNodes, c.placement, c.carriers, c.explicitPus));
    ASSERT_TRUE(rt) << rt.error().message();
    EXPECT_EQ(logicalPus(*rt), c.expected);
    touchEveryCarrier(*rt);
    for (const CarrierStats& s : rt->stats()) {
        EXPECT_EQ(s.pu, -1) << "simulation mode: a synthetic topology's carriers run unbound";
        EXPECT_EQ(s.node, static_cast<unsigned>(s.logicalPu / 4)) << s.index;
        EXPECT_FALSE(s.stacksNodeBound) << s.index;
        EXPECT_FALSE(s.threadMemoryBound) << s.index;
    }
    rt->shutdown();
    rt->join();
}

INSTANTIATE_TEST_SUITE_P(
    Policies, RuntimePlacement,
    testing::Values(PlacementCase{"per_core", numa::Placement::kPerCore, 0, {}, {0, 2, 4, 6}},
                    PlacementCase{"per_pu", numa::Placement::kPerPu, 0, {}, {0, 2, 4, 6, 1, 3, 5, 7}},
                    PlacementCase{"compact", numa::Placement::kCompact, 0, {}, {0, 1, 2, 3, 4, 5, 6, 7}},
                    PlacementCase{"compact_three", numa::Placement::kCompact, 3, {}, {0, 1, 2}},
                    PlacementCase{"scatter", numa::Placement::kScatter, 0, {}, {0, 4, 2, 6}},
                    PlacementCase{"explicit", numa::Placement::kExplicit, 0, {7, 0, 5}, {7, 0, 5}},
                    PlacementCase{"explicit_two", numa::Placement::kExplicit, 2, {7, 0, 5}, {7, 0}}),
    [](const testing::TestParamInfo<PlacementCase>& p) { return std::string(p.param.name); });

TEST(RuntimePlacementErrors, ABadPlacementFailsStartWithEinval) {
    for (const auto& o : {lean(kSmallTwoNodes, numa::Placement::kExplicit, 0, {}),
                          lean(kSmallTwoNodes, numa::Placement::kExplicit, 0, {8}),
                          lean(kSmallTwoNodes, numa::Placement::kExplicit, 0, {1, 1}),
                          lean(kSmallTwoNodes, numa::Placement::kExplicit, 3, {1, 2}),
                          lean(kSmallTwoNodes, static_cast<numa::Placement>(9))}) {
        auto rt = Runtime::start(o);
        ASSERT_FALSE(rt);
        EXPECT_EQ(rt.errorCode(), EINVAL);
    }
}

TEST(RuntimeTopologyEnv, TheVariableIsUsedWhenTheOptionIsEmpty) {
    ScopedEnv env(numa::kTopologyEnv, kSmallTwoNodes);
    auto rt = Runtime::start(lean("", numa::Placement::kScatter));
    ASSERT_TRUE(rt) << rt.error().message();
    EXPECT_EQ(logicalPus(*rt), (std::vector<int>{0, 4, 2, 6}));
    EXPECT_NE(rt->describe().find("[synthetic]"), std::string::npos) << rt->describe();
}

TEST(RuntimeTopologyEnv, TheOptionWinsOverTheVariable) {
    ScopedEnv env(numa::kTopologyEnv, kSmallTwoNodes);
    auto rt = Runtime::start(lean("synthetic:core:3 pu:1", numa::Placement::kPerCore));
    ASSERT_TRUE(rt) << rt.error().message();
    EXPECT_EQ(logicalPus(*rt), (std::vector<int>{0, 1, 2}));
}

TEST(RuntimeTopologyEnv, ABadVariableFailsStart) {
    for (const char* bad : {"nonsense", "synthetic:pack:0", "xml:/nonexistent/spindle.xml"}) {
        ScopedEnv env(numa::kTopologyEnv, bad);
        auto rt = Runtime::start(lean("", numa::Placement::kPerCore));
        ASSERT_FALSE(rt) << bad;
        EXPECT_EQ(rt.errorCode(), std::string(bad).starts_with("xml:") ? ENOENT : EINVAL) << bad;
    }
}

TEST(RuntimeTopologyEnv, MachineNamesThisHost) {
    ScopedEnv env(numa::kTopologyEnv, "machine");
    auto rt = Runtime::start(lean("", numa::Placement::kPerCore, 1));
    ASSERT_TRUE(rt) << rt.error().message();
    EXPECT_EQ(rt->describe().find("[synthetic]"), std::string::npos) << rt->describe();
}

// On this machine, with the default options (bound carriers, one per core): each carrier's thread may run
// on its PU alone, and runs there. Read on the carrier's own thread, from the kernel (sched_getaffinity,
// sched_getcpu), not from what the runtime believes.
TEST(RuntimeBinding, OnThisMachineEachCarrierRunsOnItsPuAlone) {
    auto rt = Runtime::start();
    ASSERT_TRUE(rt) << rt.error().message();
    const auto stats = rt->stats();
    ASSERT_EQ(stats.size(), rt->carrierCount());
    for (const CarrierStats& s : stats) {
        if (s.pu < 0) { GTEST_SKIP() << "carrier " << s.index << " runs unbound here (the log says why)"; }
        cpu_set_t set;
        CPU_ZERO(&set);
        int affinityErr = -1;
        int cpu = -1;
        ASSERT_TRUE(rt->runOnCarrier(s.index, [&] {
            affinityErr = ::sched_getaffinity(0, sizeof(set), &set) == 0 ? 0 : errno;
            cpu = ::sched_getcpu();
        }));
        ASSERT_EQ(affinityErr, 0);
        EXPECT_EQ(CPU_COUNT(&set), 1) << "carrier " << s.index;
        EXPECT_TRUE(CPU_ISSET(static_cast<unsigned>(s.pu), &set)) << "carrier " << s.index << " pu " << s.pu;
        EXPECT_EQ(cpu, s.pu) << "carrier " << s.index;
    }
    // One per core: no two carriers share a PU.
    for (size_t i = 0; i < stats.size(); ++i) {
        for (size_t j = i + 1; j < stats.size(); ++j) { EXPECT_NE(stats[i].pu, stats[j].pu); }
    }
}

// Whether this machine lets hwloc bind memory (mbind may be refused, e.g. by seccomp).
bool machineBindsMemory() {
    auto t = numa::Topology::machine();
    if (!t || t->isFallback()) { return false; }
    auto p = t->allocOnNode(4096, 0);
    if (!p) { return false; }
    bool ok = t->bindArea(*p, 4096, 0).ok();
    t->freeOnNode(*p, 4096);
    return ok;
}

TEST(RuntimeNodeMemory, OnThisMachineStacksAndPinnedThreadsAreNodeBound) {
    if (!machineBindsMemory()) { GTEST_SKIP() << "no memory binding on this machine (hwloc membind refused)"; }
    auto rt = Runtime::start(lean("", numa::Placement::kPerCore, 2));
    ASSERT_TRUE(rt) << rt.error().message();
    touchEveryCarrier(*rt);
    auto topo = numa::Topology::machine();
    ASSERT_TRUE(topo);
    for (const CarrierStats& s : rt->stats()) {
        ASSERT_GE(s.logicalPu, 0);
        EXPECT_EQ(s.memoryNode, static_cast<int>(topo->memoryNodeOf(static_cast<unsigned>(s.logicalPu))));
        EXPECT_TRUE(s.stacksNodeBound) << s.index;
        EXPECT_EQ(s.threadMemoryBound, s.pu >= 0) << s.index;  // only a pinned carrier prefers a node
    }
}

TEST(RuntimeNodeMemory, ARefusedBindingIsAFallbackNotAFailure) {
    if (!machineBindsMemory()) { GTEST_SKIP() << "no memory binding on this machine (hwloc membind refused)"; }
    ArmedFault f(inject::Point::kMembind, EPERM, 1000);
    auto rt = Runtime::start(lean("", numa::Placement::kPerCore, 2));
    ASSERT_TRUE(rt) << rt.error().message();
    touchEveryCarrier(*rt);
    for (const CarrierStats& s : rt->stats()) {
        EXPECT_FALSE(s.stacksNodeBound) << s.index;
        EXPECT_FALSE(s.threadMemoryBound) << s.index;
    }
}

TEST(RuntimeNodeMemory, HwlocLoadFailureRunsOnTheFlatFallback) {
    ArmedFault f(inject::Point::kHwlocLoad, EIO);
    auto rt = Runtime::start(lean("", numa::Placement::kPerCore, 0));
    ASSERT_TRUE(rt) << rt.error().message();
    EXPECT_EQ(inject::remaining(inject::Point::kHwlocLoad), 0u);
    touchEveryCarrier(*rt);
    const auto stats = rt->stats();
    ASSERT_FALSE(stats.empty());
    for (const CarrierStats& s : stats) {
        EXPECT_GE(s.logicalPu, 0) << s.index;
        EXPECT_EQ(s.node, 0u) << s.index;
        EXPECT_EQ(s.memoryNode, 0) << s.index;
        EXPECT_FALSE(s.stacksNodeBound) << s.index;  // the fallback knows no NUMA node
        EXPECT_FALSE(s.threadMemoryBound) << s.index;
    }
    EXPECT_NE(rt->describe().find("1 NUMA node"), std::string::npos) << rt->describe();
}

}  // namespace
}  // namespace spindle
