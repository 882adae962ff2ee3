// SPDX-License-Identifier: Apache-2.0
// Unit tests for numa::Topology: synthetic shapes for everything that must not depend
// on the host, the live machine for binding and node-local memory.
#include "numa/topology.h"

#include <gtest/gtest.h>
#include <hwloc.h>
#include <linux/mempolicy.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "base/log.h"

namespace spindle::numa {
namespace {

// Two packages, each one NUMA node and one L3 over 4 cores of 2 PUs: OS index os sits on
// core os/2, node and package os/8.
constexpr const char* kTwoNodes = "pack:2 numa:1 l3:1 core:4 pu:2";

std::vector<unsigned> osIndexes(const Topology& t) {
    std::vector<unsigned> out;
    for (const Pu& pu : t.pus()) { out.push_back(pu.os); }
    return out;
}

std::set<unsigned> callingThreadAffinity() {
    cpu_set_t set;
    CPU_ZERO(&set);
    EXPECT_EQ(sched_getaffinity(0, sizeof(set), &set), 0) << std::strerror(errno);
    std::set<unsigned> out;
    for (unsigned cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
        if (CPU_ISSET(cpu, &set)) { out.insert(cpu); }
    }
    return out;
}

// Keeps log lines at warn for the tests that read them, whatever SPINDLE_LOG says.
class LogAtWarn {
public:
    LogAtWarn() : saved_(log::threshold()) { log::setThreshold(log::Level::kWarn); }
    ~LogAtWarn() { log::setThreshold(saved_); }
    LogAtWarn(const LogAtWarn&) = delete;
    LogAtWarn& operator=(const LogAtWarn&) = delete;

private:
    log::Level saved_;
};

// Declares `Topology& var` from a synthetic description; the test fails if hwloc rejects it.
#define SPINDLE_SYNTHETIC(var, description)                                                       \
    auto var##Result = Topology::fromSynthetic(description);                                      \
    ASSERT_TRUE(var##Result.ok()) << (description) << ": " << var##Result.error().message();      \
    Topology& var = *var##Result

// Declares `Topology& var` for this host, or skips naming why there is none (e.g. hwloc
// cannot read /sys in this sandbox).
#define SPINDLE_MACHINE_OR_SKIP(var)                                                              \
    auto var##Result = Topology::machine();                                                       \
    if (!var##Result) { GTEST_SKIP() << "machine topology: " << var##Result.error().message(); }  \
    Topology& var = *var##Result

TEST(Topology, SyntheticCounts) {
    SPINDLE_SYNTHETIC(t, kTwoNodes);
    EXPECT_TRUE(t.isSynthetic());
    EXPECT_EQ(t.pus().size(), 16u);
    EXPECT_EQ(t.coreCount(), 8u);
    EXPECT_EQ(t.nodeCount(), 2u);
    EXPECT_EQ(t.describe(), "2 packages, 2 NUMA nodes, 8 cores, 16 PUs (L3 shared by 8) [synthetic]");
}

TEST(Topology, PusSpreadOverCoresBeforeSmtSiblings) {
    SPINDLE_SYNTHETIC(t, kTwoNodes);
    EXPECT_EQ(osIndexes(t), (std::vector<unsigned>{0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15}));
    for (size_t i = 0; i < t.pus().size(); ++i) {
        const Pu& pu = t.pus()[i];
        EXPECT_EQ(pu.core, pu.os / 2) << "PU " << pu.os;
        EXPECT_EQ(pu.node, pu.os / 8) << "PU " << pu.os;
        EXPECT_EQ(pu.package, pu.os / 8) << "PU " << pu.os;
        EXPECT_EQ(pu.core, i % 8) << "the first 8 carriers land on 8 distinct cores, in core order";
    }
}

TEST(Topology, PusWithoutCoresCountAsCoresOfTheirOwn) {
    SPINDLE_SYNTHETIC(t, "pack:2 pu:2");  // hwloc makes no Core objects here
    EXPECT_EQ(t.pus().size(), 4u);
    EXPECT_EQ(t.coreCount(), 4u);
    EXPECT_EQ(t.nodeCount(), 1u);
    EXPECT_EQ(osIndexes(t), (std::vector<unsigned>{0, 1, 2, 3}));
    EXPECT_EQ(t.distance(0, 1), Distance::kSameNode);
    EXPECT_EQ(t.distance(0, 2), Distance::kSameNode);
    EXPECT_EQ(t.describe(), "2 packages, 1 NUMA node, 4 cores, 4 PUs [synthetic]");
}

TEST(Topology, DistanceClasses) {
    SPINDLE_SYNTHETIC(t, kTwoNodes);
    EXPECT_EQ(t.distance(3, 3), Distance::kSamePu);
    EXPECT_EQ(t.distance(2, 3), Distance::kSameCore);
    EXPECT_EQ(t.distance(0, 7), Distance::kSameCache);
    EXPECT_EQ(t.distance(1, 8), Distance::kRemotePackage);
    for (unsigned a = 0; a < 16; ++a) {
        for (unsigned b = 0; b < 16; ++b) { EXPECT_EQ(t.distance(a, b), t.distance(b, a)) << a << " " << b; }
    }

    // Two L3s per node: cores under different L3s of one node are only kSameNode.
    SPINDLE_SYNTHETIC(split, "pack:2 numa:1 l3:2 core:2 pu:2");
    EXPECT_EQ(split.distance(0, 2), Distance::kSameCache);
    EXPECT_EQ(split.distance(0, 4), Distance::kSameNode);
    EXPECT_EQ(split.distance(0, 8), Distance::kRemotePackage);

    // No caches at all: same node is as close as two cores get.
    SPINDLE_SYNTHETIC(bare, "pack:2 numa:1 core:2 pu:2");
    EXPECT_EQ(bare.distance(0, 1), Distance::kSameCore);
    EXPECT_EQ(bare.distance(0, 2), Distance::kSameNode);
    EXPECT_EQ(bare.distance(0, 4), Distance::kRemotePackage);

    // Sub-NUMA clustering: one L3 over two nodes. Crossing the node boundary stays remote.
    SPINDLE_SYNTHETIC(snc, "pack:1 l3:1 numa:2 core:2 pu:1");
    EXPECT_EQ(snc.nodeCount(), 2u);
    EXPECT_EQ(snc.distance(0, 1), Distance::kSameCache);
    EXPECT_EQ(snc.distance(0, 2), Distance::kSamePackage);
}

TEST(Topology, DistanceToUnknownPuIsRemote) {
    SPINDLE_SYNTHETIC(t, kTwoNodes);
    EXPECT_EQ(t.distance(0, 99999), Distance::kRemotePackage);
    EXPECT_EQ(t.distance(99999, 0), Distance::kRemotePackage);
    EXPECT_EQ(t.distance(16, 16), Distance::kSamePu);
}

TEST(Topology, VictimOrderIsNearestFirstAndStable) {
    SPINDLE_SYNTHETIC(t, kTwoNodes);
    // Shuffled, with `os` itself and an unknown PU mixed in.
    std::vector<unsigned> candidates = {15, 7, 9, 2, 99999, 0, 1, 12, 5, 0, 3, 8};
    EXPECT_EQ(t.victimOrder(0, candidates), (std::vector<unsigned>{1, 7, 2, 5, 3, 15, 9, 99999, 12, 8}));
    EXPECT_EQ(t.victimOrder(9, candidates), (std::vector<unsigned>{8, 15, 12, 7, 2, 99999, 0, 1, 5, 0, 3}));
    EXPECT_TRUE(t.victimOrder(4, {}).empty());
    EXPECT_TRUE(t.victimOrder(4, {4, 4}).empty());

    std::vector<unsigned> all = osIndexes(t);
    for (unsigned os : all) {
        std::vector<unsigned> order = t.victimOrder(os, all);
        ASSERT_EQ(order.size(), all.size() - 1);
        for (size_t i = 1; i < order.size(); ++i) {
            EXPECT_LE(t.distance(os, order[i - 1]), t.distance(os, order[i])) << "from " << os;
        }
    }
}

TEST(Topology, NodeOf) {
    SPINDLE_SYNTHETIC(t, kTwoNodes);
    for (unsigned os = 0; os < 16; ++os) { EXPECT_EQ(t.nodeOf(os), os / 8) << "PU " << os; }
    EXPECT_EQ(t.nodeOf(99999), 0u);
}

TEST(Topology, DistanceNames) {
    EXPECT_STREQ(toString(Distance::kSamePu), "same-pu");
    EXPECT_STREQ(toString(Distance::kSameCore), "same-core");
    EXPECT_STREQ(toString(Distance::kSameCache), "same-cache");
    EXPECT_STREQ(toString(Distance::kSameNode), "same-node");
    EXPECT_STREQ(toString(Distance::kSamePackage), "same-package");
    EXPECT_STREQ(toString(Distance::kRemotePackage), "remote-package");
    EXPECT_STREQ(toString(static_cast<Distance>(42)), "unknown");
}

TEST(Topology, BadSyntheticStringIsEinval) {
    LogAtWarn warn;
    for (const char* bad : {"", "pack:2 banana:3", "core:0", "pu:", "pack:2 core:x pu:2", "   "}) {
        testing::internal::CaptureStderr();
        auto t = Topology::fromSynthetic(bad);
        std::string said = testing::internal::GetCapturedStderr();
        ASSERT_FALSE(t.ok()) << '"' << bad << '"';
        EXPECT_EQ(t.errorCode(), EINVAL) << '"' << bad << '"';
        EXPECT_NE(said.find("hwloc_topology_set_synthetic"), std::string::npos) << said;
    }
}

TEST(Topology, FromXmlMissingFileIsEnoent) {
    LogAtWarn warn;
    testing::internal::CaptureStderr();
    auto t = Topology::fromXml("/nonexistent/spindle-topology.xml");
    std::string said = testing::internal::GetCapturedStderr();
    ASSERT_FALSE(t.ok());
    EXPECT_EQ(t.errorCode(), ENOENT);
    EXPECT_NE(said.find("hwloc_topology_set_xml"), std::string::npos) << said;
    EXPECT_NE(said.find("/nonexistent/spindle-topology.xml"), std::string::npos) << said;
}

TEST(Topology, FromXmlThatDoesNotParseIsAnError) {
    std::string path = testing::TempDir() + "spindle-garbage-" + std::to_string(getpid()) + ".xml";
    { std::ofstream(path) << "this is not a topology\n"; }
    auto t = Topology::fromXml(path);
    std::remove(path.c_str());
    ASSERT_FALSE(t.ok());
    EXPECT_GT(t.errorCode(), 0);
}

TEST(Topology, FromXmlRoundTrip) {
    // Export this machine (unrestricted, as lstopo would) and read it back.
    hwloc_topology_t raw = nullptr;
    ASSERT_EQ(hwloc_topology_init(&raw), 0);
    ASSERT_EQ(hwloc_topology_load(raw), 0);
    std::string path = testing::TempDir() + "spindle-topology-" + std::to_string(getpid()) + ".xml";
    ASSERT_EQ(hwloc_topology_export_xml(raw, path.c_str(), 0), 0) << std::strerror(errno);
    std::set<unsigned> rawPus;
    for (hwloc_obj_t pu = hwloc_get_next_obj_by_type(raw, HWLOC_OBJ_PU, nullptr); pu != nullptr;
         pu = hwloc_get_next_obj_by_type(raw, HWLOC_OBJ_PU, pu)) {
        rawPus.insert(pu->os_index);
    }
    int rawCores = hwloc_get_nbobjs_by_type(raw, HWLOC_OBJ_CORE);
    int rawNodes = hwloc_get_nbobjs_by_type(raw, HWLOC_OBJ_NUMANODE);
    hwloc_topology_destroy(raw);

    auto loaded = Topology::fromXml(path);
    std::remove(path.c_str());
    ASSERT_TRUE(loaded.ok()) << loaded.error().message();
    Topology& t = *loaded;
    EXPECT_TRUE(t.isSynthetic());
    std::vector<unsigned> os = osIndexes(t);
    EXPECT_EQ(std::set<unsigned>(os.begin(), os.end()), rawPus);
    EXPECT_EQ(os.size(), rawPus.size());
    if (rawCores > 0) { EXPECT_EQ(t.coreCount(), static_cast<unsigned>(rawCores)); }
    EXPECT_EQ(t.nodeCount(), static_cast<unsigned>(std::max(rawNodes, 1)));
    EXPECT_TRUE(t.describe().ends_with(" [xml]")) << t.describe();

    // Same shape as the live machine when nothing restricts this process.
    auto live = Topology::machine();
    ASSERT_TRUE(live.ok()) << live.error().message();
    if (live->pus().size() == t.pus().size()) {
        EXPECT_EQ(osIndexes(*live), os);
        for (unsigned a : os) {
            for (unsigned b : os) { EXPECT_EQ(live->distance(a, b), t.distance(a, b)) << a << " " << b; }
        }
    }
}

TEST(Topology, BindOnXmlOrSyntheticIsEnotsup) {
    SPINDLE_SYNTHETIC(t, kTwoNodes);
    std::thread([&] {
        auto r = t.bindCurrentThread(t.pus()[0].os);
        EXPECT_EQ(r.errorCode(), ENOTSUP);
    }).join();
}

TEST(Topology, MachineMatchesCallingThreadAffinity) {
    SPINDLE_MACHINE_OR_SKIP(t);
    ASSERT_FALSE(t.pus().empty());
    EXPECT_GE(t.coreCount(), 1u);
    EXPECT_LE(t.coreCount(), t.pus().size());
    EXPECT_GE(t.nodeCount(), 1u);
    if (std::getenv("HWLOC_XMLFILE") == nullptr && std::getenv("HWLOC_SYNTHETIC") == nullptr &&
        std::getenv("HWLOC_FSROOT") == nullptr) {
        EXPECT_FALSE(t.isSynthetic());
        std::vector<unsigned> os = osIndexes(t);
        EXPECT_EQ(std::set<unsigned>(os.begin(), os.end()), callingThreadAffinity());
    }
    for (const Pu& pu : t.pus()) {
        EXPECT_LT(pu.node, t.nodeCount());
        EXPECT_EQ(t.nodeOf(pu.os), pu.node);
    }
    EXPECT_FALSE(t.describe().empty());
}

TEST(Topology, MachineFollowsANarrowerAffinityMask) {
    SPINDLE_MACHINE_OR_SKIP(full);
    if (full.isSynthetic()) { GTEST_SKIP() << "hwloc environment redirects discovery"; }
    if (full.pus().size() < 2) { GTEST_SKIP() << "needs 2 PUs"; }
    unsigned only = full.pus().back().os;
    std::thread([&] {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(only, &set);
        ASSERT_EQ(sched_setaffinity(0, sizeof(set), &set), 0) << std::strerror(errno);
        auto narrow = Topology::machine();
        ASSERT_TRUE(narrow.ok()) << narrow.error().message();
        EXPECT_EQ(osIndexes(*narrow), std::vector<unsigned>{only});
        EXPECT_EQ(narrow->coreCount(), 1u);
        EXPECT_EQ(narrow->nodeCount(), full.nodeCount()) << "nodes stay reachable for memory";
    }).join();
}

TEST(Topology, BindCurrentThreadPinsToOnePu) {
    SPINDLE_MACHINE_OR_SKIP(t);
    if (t.isSynthetic()) { GTEST_SKIP() << "hwloc environment redirects discovery"; }
    unsigned target = t.pus()[0].os;
    std::thread([&] {  // the test runner itself stays unpinned
        auto r = t.bindCurrentThread(target);
        ASSERT_TRUE(r.ok()) << r.error().message();
        EXPECT_EQ(callingThreadAffinity(), std::set<unsigned>{target});
        // The kernel moves a thread off a CPU it may no longer use before setaffinity returns.
        EXPECT_EQ(sched_getcpu(), static_cast<int>(target));
    }).join();
}

TEST(Topology, BindFromManyThreadsAtOnce) {
    SPINDLE_MACHINE_OR_SKIP(t);
    if (t.isSynthetic()) { GTEST_SKIP() << "hwloc environment redirects discovery"; }
    size_t n = std::min<size_t>(t.pus().size() * 2, 64);
    std::vector<std::thread> threads;
    for (size_t i = 0; i < n; ++i) {
        threads.emplace_back([&t, i] {
            unsigned target = t.pus()[i % t.pus().size()].os;
            auto r = t.bindCurrentThread(target);
            EXPECT_TRUE(r.ok()) << r.error().message();
            EXPECT_EQ(callingThreadAffinity(), std::set<unsigned>{target});
        });
    }
    for (auto& th : threads) { th.join(); }
}

TEST(Topology, BindUnknownPuIsEinval) {
    LogAtWarn warn;
    SPINDLE_MACHINE_OR_SKIP(t);
    if (t.isSynthetic()) { GTEST_SKIP() << "hwloc environment redirects discovery"; }
    std::set<unsigned> before = callingThreadAffinity();
    testing::internal::CaptureStderr();
    auto r = t.bindCurrentThread(99999);
    std::string said = testing::internal::GetCapturedStderr();
    EXPECT_EQ(r.errorCode(), EINVAL);
    EXPECT_NE(said.find("99999"), std::string::npos) << said;
    EXPECT_EQ(callingThreadAffinity(), before);
}

TEST(Topology, AllocOnNodeGivesWritableZeroedMemory) {
    SPINDLE_MACHINE_OR_SKIP(t);
    constexpr size_t kBytes = 1 << 20;
    for (unsigned node = 0; node < t.nodeCount(); ++node) {
        auto p = t.allocOnNode(kBytes, node);
        ASSERT_TRUE(p.ok()) << "node " << node << ": " << p.error().message();
        auto* bytes = static_cast<unsigned char*>(*p);
        EXPECT_EQ(reinterpret_cast<uintptr_t>(bytes) % static_cast<uintptr_t>(sysconf(_SC_PAGESIZE)), 0u);
        for (size_t i = 0; i < kBytes; i += 4096) { ASSERT_EQ(bytes[i], 0) << i; }
        std::memset(bytes, 0xA5, kBytes);
        EXPECT_EQ(bytes[0], 0xA5);
        EXPECT_EQ(bytes[kBytes - 1], 0xA5);
        // Where the kernel lets us look, the range carries a policy naming exactly one node:
        // MPOL_PREFERRED_MANY on kernels that have it (hwloc's non-strict bind), else BIND or
        // PREFERRED. (Where we cannot look, e.g. seccomp without CAP_SYS_NICE, mbind was
        // refused too and allocOnNode fell back to unbound memory.)
        int mode = -1;
        unsigned long mask[16] = {};
        if (!t.isSynthetic() && syscall(SYS_get_mempolicy, &mode, mask, sizeof(mask) * 8, bytes, MPOL_F_ADDR) == 0) {
            EXPECT_TRUE(mode == MPOL_PREFERRED_MANY || mode == MPOL_BIND || mode == MPOL_PREFERRED)
                << "node " << node << " policy " << mode;
            int nodesInMask = 0;
            for (unsigned long word : mask) { nodesInMask += __builtin_popcountl(word); }
            EXPECT_EQ(nodesInMask, 1) << "node " << node;
        }
        t.freeOnNode(*p, kBytes);
    }
    t.freeOnNode(nullptr, kBytes);  // ignored
}

TEST(Topology, AllocOnNodeRejectsBadArguments) {
    SPINDLE_MACHINE_OR_SKIP(t);
    EXPECT_EQ(t.allocOnNode(4096, t.nodeCount()).errorCode(), EINVAL);
    EXPECT_EQ(t.allocOnNode(0, 0).errorCode(), EINVAL);
    EXPECT_EQ(t.allocOnNode(~size_t{0} - 4095, 0).errorCode(), ENOMEM);
}

TEST(Topology, AllocOnSyntheticNodeIsUnboundButUsable) {
    constexpr size_t kBytes = 64 * 1024;
    SPINDLE_SYNTHETIC(t, kTwoNodes);
    auto p = t.allocOnNode(kBytes, 1);  // node 1 exists only in the description
    ASSERT_TRUE(p.ok()) << p.error().message();
    std::memset(*p, 1, kBytes);
    t.freeOnNode(*p, kBytes);
}

TEST(Topology, MovedFromIsEmpty) {
    SPINDLE_SYNTHETIC(a, kTwoNodes);
    Topology b = std::move(a);
    EXPECT_EQ(b.pus().size(), 16u);
    EXPECT_EQ(b.distance(0, 8), Distance::kRemotePackage);
    EXPECT_TRUE(a.pus().empty());  // NOLINT(bugprone-use-after-move): the moved-from state is specified
    EXPECT_EQ(a.coreCount(), 0u);
    EXPECT_EQ(a.nodeCount(), 0u);
    EXPECT_EQ(a.describe(), "empty topology");
    EXPECT_EQ(a.allocOnNode(4096, 0).errorCode(), EINVAL);

    SPINDLE_SYNTHETIC(c, "pack:1 numa:1 core:2 pu:1");
    c = std::move(b);
    EXPECT_EQ(c.pus().size(), 16u);
    EXPECT_EQ(c.nodeOf(9), 1u);
    EXPECT_TRUE(b.pus().empty());  // NOLINT(bugprone-use-after-move)
}

}  // namespace
}  // namespace spindle::numa
