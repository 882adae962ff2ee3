// SPDX-License-Identifier: Apache-2.0
// numa::Topology where detection goes wrong or says more than the basics: the spec string,
// hwloc's distance matrix, memory-less NUMA nodes (from XML files written here), a smaller
// cpuset, hwloc failing to load (injected), and memory binding (area and thread).
#include <gtest/gtest.h>
#include <hwloc.h>
#include <linux/mempolicy.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "base/inject.h"
#include "base/log.h"
#include "numa/topology.h"

namespace spindle::numa {
namespace {

constexpr const char* kFourNodes = "pack:2 numa:2 core:4 pu:2";  // node n holds OS indexes 8n..8n+7

using inject::ArmedFault;

class LogAt {
public:
    explicit LogAt(log::Level level) : saved_(log::threshold()) { log::setThreshold(level); }
    ~LogAt() { log::setThreshold(saved_); }
    LogAt(const LogAt&) = delete;
    LogAt& operator=(const LogAt&) = delete;

private:
    log::Level saved_;
};

// Writes `description` (loaded by hwloc as a synthetic topology, then changed by `edit`) to an
// XML file under the test's temp dir; returns its path, or "" after a failed assertion.
std::string writeXml(const std::string& description, const std::function<bool(hwloc_topology_t)>& edit) {
    hwloc_topology_t raw = nullptr;
    EXPECT_EQ(hwloc_topology_init(&raw), 0);
    if (raw == nullptr) { return ""; }
    std::string path;
    if (hwloc_topology_set_synthetic(raw, description.c_str()) == 0 && hwloc_topology_load(raw) == 0 && edit(raw)) {
        static int serial = 0;
        path = testing::TempDir() + "spindle-numa-" + std::to_string(getpid()) + "-" + std::to_string(serial++) + ".xml";
        EXPECT_EQ(hwloc_topology_export_xml(raw, path.c_str(), 0), 0) << path;
    } else {
        ADD_FAILURE() << "could not build the XML for " << description;
    }
    hwloc_topology_destroy(raw);
    return path;
}

// Adds a NUMA latency matrix (row-major over nodes in logical order).
bool addDistances(hwloc_topology_t raw, const std::vector<hwloc_uint64_t>& values) {
    const unsigned n = static_cast<unsigned>(hwloc_get_nbobjs_by_type(raw, HWLOC_OBJ_NUMANODE));
    std::vector<hwloc_obj_t> objs;
    for (unsigned i = 0; i < n; ++i) { objs.push_back(hwloc_get_obj_by_type(raw, HWLOC_OBJ_NUMANODE, i)); }
    EXPECT_EQ(values.size(), size_t{n} * n);
    auto handle = hwloc_distances_add_create(
        raw, "test latency", HWLOC_DISTANCES_KIND_FROM_OS | HWLOC_DISTANCES_KIND_MEANS_LATENCY, 0);
    if (handle == nullptr) { return false; }
    std::vector<hwloc_uint64_t> copy = values;
    if (hwloc_distances_add_values(raw, handle, n, objs.data(), copy.data(), 0) != 0) { return false; }
    return hwloc_distances_add_commit(raw, handle, 0) == 0;
}

bool dropMemory(hwloc_topology_t raw, unsigned node) {
    hwloc_obj_t obj = hwloc_get_obj_by_type(raw, HWLOC_OBJ_NUMANODE, node);
    if (obj == nullptr) { return false; }
    obj->attr->numanode.local_memory = 0;
    for (unsigned i = 0; i < obj->attr->numanode.page_types_len; ++i) { obj->attr->numanode.page_types[i].count = 0; }
    return true;
}

Result<Topology> loadXml(const std::string& path) {
    auto t = Topology::fromXml(path);
    std::remove(path.c_str());
    return t;
}

std::set<unsigned> callingThreadAffinity() {
    cpu_set_t set;
    CPU_ZERO(&set);
    EXPECT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
    std::set<unsigned> out;
    for (unsigned cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
        if (CPU_ISSET(cpu, &set)) { out.insert(cpu); }
    }
    return out;
}

// ---- fromSpec --------------------------------------------------------------------------

TEST(TopologySpec, PicksTheSourceTheTextNames) {
    auto syn = Topology::fromSpec(std::string("synthetic:") + kFourNodes);
    ASSERT_TRUE(syn.ok()) << syn.error().message();
    EXPECT_TRUE(syn->isSynthetic());
    EXPECT_EQ(syn->pus().size(), 32u);
    EXPECT_EQ(syn->nodeCount(), 4u);

    auto missing = Topology::fromSpec("xml:/nonexistent/spindle-topology.xml");
    ASSERT_FALSE(missing.ok());
    EXPECT_EQ(missing.errorCode(), ENOENT);

    for (const char* bad : {"bogus", "synthetic", "xml", "Machine", "synthetic:pack:0"}) {
        auto r = Topology::fromSpec(bad);
        ASSERT_FALSE(r.ok()) << bad;
        EXPECT_EQ(r.errorCode(), EINVAL) << bad;
    }
    for (const char* live : {"", "machine"}) {
        auto m = Topology::fromSpec(live);
        if (!m.ok()) { GTEST_SKIP() << "machine topology: " << m.error().message(); }
        EXPECT_FALSE(m->isSynthetic()) << '"' << live << '"';
        EXPECT_FALSE(m->pus().empty());
    }
}

// ---- distances ---------------------------------------------------------------------------

TEST(TopologyDistances, SyntheticHasNoMatrix) {
    auto t = Topology::fromSynthetic(kFourNodes);
    ASSERT_TRUE(t.ok());
    EXPECT_FALSE(t->nodeDistances().has_value());
}

TEST(TopologyDistances, MatrixFromAnXmlFileIsIndexedByLogicalNode) {
    const std::vector<hwloc_uint64_t> m = {10, 16, 32, 33,  //
                                           16, 10, 31, 34,  //
                                           32, 31, 10, 17,  //
                                           33, 34, 17, 10};
    std::string path = writeXml(kFourNodes, [&](hwloc_topology_t raw) { return addDistances(raw, m); });
    ASSERT_FALSE(path.empty());
    auto t = loadXml(path);
    ASSERT_TRUE(t.ok()) << t.error().message();
    auto d = t->nodeDistances();
    ASSERT_TRUE(d.has_value());
    ASSERT_EQ(d->size(), 4u);
    for (unsigned i = 0; i < 4; ++i) {
        ASSERT_EQ((*d)[i].size(), 4u);
        for (unsigned j = 0; j < 4; ++j) { EXPECT_EQ((*d)[i][j], m[i * 4 + j]) << i << "->" << j; }
    }
    // Every node has memory here, so memory comes from each PU's own node.
    for (const Pu& pu : t->pus()) { EXPECT_EQ(pu.memNode, pu.node) << pu.os; }
}

TEST(TopologyDistances, MachineMatrixIsSquareWhenPresent) {
    auto t = Topology::machine();
    if (!t.ok()) { GTEST_SKIP() << "machine topology: " << t.error().message(); }
    auto d = t->nodeDistances();
    if (!d) { GTEST_SKIP() << "hwloc reports no NUMA distance matrix on this machine"; }
    ASSERT_EQ(d->size(), t->nodeCount());
    for (unsigned i = 0; i < t->nodeCount(); ++i) {
        ASSERT_EQ((*d)[i].size(), t->nodeCount());
        for (unsigned j = 0; j < t->nodeCount(); ++j) { EXPECT_LE((*d)[i][i], (*d)[i][j]); }
    }
}

// ---- memory-less nodes -----------------------------------------------------------------

TEST(TopologyMemorylessNode, PusAllocateFromTheSamePackageWithoutAMatrix) {
    std::string path = writeXml(kFourNodes, [](hwloc_topology_t raw) { return dropMemory(raw, 3); });
    ASSERT_FALSE(path.empty());
    LogAt warn(log::Level::kWarn);
    testing::internal::CaptureStderr();
    auto t = loadXml(path);
    std::string said = testing::internal::GetCapturedStderr();
    ASSERT_TRUE(t.ok()) << t.error().message();
    EXPECT_EQ(t->nodeCount(), 4u);
    EXPECT_FALSE(t->nodeHasMemory(3));
    EXPECT_TRUE(t->nodeHasMemory(2));
    EXPECT_FALSE(t->nodeHasMemory(4));  // no such node
    for (const Pu& pu : t->pus()) {
        EXPECT_EQ(pu.node, pu.os / 8) << pu.os;  // the PU still belongs to its own node
        EXPECT_EQ(pu.memNode, pu.node == 3 ? 2u : pu.node) << pu.os;
        EXPECT_EQ(t->memoryNodeOf(pu.os), pu.memNode);
    }
    EXPECT_NE(said.find("node 3 has no memory"), std::string::npos) << said;
    // Allocating "on" the memory-less node works (here unbound: the topology is an XML file).
    auto p = t->allocOnNode(4096, 3);
    ASSERT_TRUE(p.ok()) << p.error().message();
    static_cast<char*>(*p)[0] = 1;
    t->freeOnNode(*p, 4096);
}

TEST(TopologyMemorylessNode, PusAllocateFromTheNearestNodeByTheMatrix) {
    // Node 0 has no memory; by latency node 3 (another package) is nearer than node 1.
    const std::vector<hwloc_uint64_t> m = {10, 30, 40, 20,  //
                                           30, 10, 40, 40,  //
                                           40, 40, 10, 30,  //
                                           20, 40, 30, 10};
    std::string path = writeXml(kFourNodes, [&](hwloc_topology_t raw) { return dropMemory(raw, 0) && addDistances(raw, m); });
    ASSERT_FALSE(path.empty());
    auto t = loadXml(path);
    ASSERT_TRUE(t.ok()) << t.error().message();
    ASSERT_TRUE(t->nodeDistances().has_value());
    EXPECT_EQ(t->memoryNodeOf(0), 3u);
    EXPECT_EQ(t->memoryNodeOf(7), 3u);
    EXPECT_EQ(t->memoryNodeOf(8), 1u);
    EXPECT_EQ(t->memoryNodeOf(1000), 0u);  // not a PU
}

TEST(TopologyMemorylessNode, WhenNoNodeReportsMemoryEachKeepsItsOwn) {
    std::string path = writeXml("pack:2 numa:1 core:1 pu:1",
                                [](hwloc_topology_t raw) { return dropMemory(raw, 0) && dropMemory(raw, 1); });
    ASSERT_FALSE(path.empty());
    auto t = loadXml(path);
    ASSERT_TRUE(t.ok()) << t.error().message();
    EXPECT_TRUE(t->nodeHasMemory(0));
    EXPECT_TRUE(t->nodeHasMemory(1));
    EXPECT_EQ(t->memoryNodeOf(0), 0u);
    EXPECT_EQ(t->memoryNodeOf(1), 1u);
}

// ---- a smaller cpuset --------------------------------------------------------------------

TEST(TopologyRestricted, KeepsTheAllowedPusAndEveryNode) {
    auto t = Topology::fromSynthetic(kFourNodes);
    ASSERT_TRUE(t.ok());
    auto r = t->restricted({1, 0, 17});
    ASSERT_TRUE(r.ok()) << r.error().message();
    std::vector<unsigned> os;
    for (const Pu& pu : r->pus()) { os.push_back(pu.os); }
    EXPECT_EQ(os, (std::vector<unsigned>{0, 17, 1}));  // the first allowed PU of each core, then siblings
    EXPECT_EQ(r->coreCount(), 2u);
    EXPECT_EQ(r->nodeCount(), 4u);  // nodes without allowed PUs stay reachable
    EXPECT_EQ(r->nodeOf(17), 2u);
    EXPECT_TRUE(r->isSynthetic());
    EXPECT_EQ(t->pus().size(), 32u);  // the original is untouched
}

TEST(TopologyRestricted, BadListsAreEinval) {
    auto t = Topology::fromSynthetic(kFourNodes);
    ASSERT_TRUE(t.ok());
    EXPECT_EQ(t->restricted({}).errorCode(), EINVAL);
    EXPECT_EQ(t->restricted({0, 32}).errorCode(), EINVAL);
    auto narrow = t->restricted({4, 5});
    ASSERT_TRUE(narrow.ok());
    EXPECT_EQ(narrow->restricted({6}).errorCode(), EINVAL);  // removed by the first restriction
}

// ---- hwloc failing to load (injected) ----------------------------------------------------

TEST(TopologyFallback, HwlocLoadFailureGivesAFlatTopologyOfTheAllowedCpus) {
    LogAt warn(log::Level::kWarn);
    testing::internal::CaptureStderr();
    Result<Topology> t = Error{EINVAL};
    {
        ArmedFault f(inject::Point::kHwlocLoad, EIO);
        t = Topology::machine();
        EXPECT_EQ(inject::remaining(inject::Point::kHwlocLoad), 0u);
    }
    std::string said = testing::internal::GetCapturedStderr();
    ASSERT_TRUE(t.ok()) << t.error().message();
    EXPECT_TRUE(t->isFallback());
    EXPECT_FALSE(t->isSynthetic());
    EXPECT_NE(said.find("falling back to a flat topology"), std::string::npos) << said;
    EXPECT_NE(said.find("(injected)"), std::string::npos) << said;

    std::set<unsigned> allowed = callingThreadAffinity();
    std::set<unsigned> os;
    for (const Pu& pu : t->pus()) {
        os.insert(pu.os);
        EXPECT_EQ(pu.node, 0u);
        EXPECT_EQ(pu.package, 0u);
    }
    EXPECT_EQ(os, allowed);
    EXPECT_EQ(t->coreCount(), allowed.size());
    EXPECT_EQ(t->nodeCount(), 1u);
    EXPECT_FALSE(t->nodeDistances().has_value());

    // It binds threads (the CPUs are this host's) but not memory (no node is known).
    const unsigned target = t->pus().back().os;
    std::thread([&] {
        ASSERT_TRUE(t->bindCurrentThread(target).ok());
        EXPECT_EQ(callingThreadAffinity(), std::set<unsigned>{target});
        EXPECT_EQ(t->bindCurrentThreadMemory(0).errorCode(), ENOTSUP);
    }).join();
    auto p = t->allocOnNode(8192, 0);
    ASSERT_TRUE(p.ok()) << p.error().message();
    static_cast<char*>(*p)[8191] = 1;
    EXPECT_EQ(t->bindArea(*p, 8192, 0).errorCode(), ENOTSUP);
    t->freeOnNode(*p, 8192);

    // Disarmed, the machine loads as usual.
    auto again = Topology::machine();
    if (again.ok()) { EXPECT_FALSE(again->isFallback()); }
}

// ---- memory binding ----------------------------------------------------------------------

TEST(TopologyMembind, BadArgumentsAndNonMachineTopologies) {
    auto syn = Topology::fromSynthetic(kFourNodes);
    ASSERT_TRUE(syn.ok());
    char buf[64];
    EXPECT_EQ(syn->bindArea(buf, sizeof(buf), 0).errorCode(), ENOTSUP);
    EXPECT_EQ(syn->bindArea(nullptr, 4096, 0).errorCode(), EINVAL);
    EXPECT_EQ(syn->bindArea(buf, 0, 0).errorCode(), EINVAL);
    EXPECT_EQ(syn->bindArea(buf, sizeof(buf), 4).errorCode(), EINVAL);
    EXPECT_EQ(syn->bindCurrentThreadMemory(0).errorCode(), ENOTSUP);
    EXPECT_EQ(syn->bindCurrentThreadMemory(4).errorCode(), EINVAL);
}

// Skips, naming why, when this machine cannot bind memory at all.
#define SPINDLE_MEMBIND_OR_SKIP(t, p, bytes)                                                                 \
    if (auto probe = (t).bindArea((p), (bytes), 0); !probe.ok()) {                                          \
        ::munmap((p), (bytes));                                                                              \
        GTEST_SKIP() << "no memory binding here: " << probe.error().message();                             \
    }

TEST(TopologyMembind, AreaAndThreadBindingOnThisMachine) {
    auto t = Topology::machine();
    if (!t.ok()) { GTEST_SKIP() << "machine topology: " << t.error().message(); }
    const size_t bytes = 1 << 16;
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(p, MAP_FAILED);
    SPINDLE_MEMBIND_OR_SKIP(*t, p, bytes);
    int mode = -1;
    unsigned long mask[16] = {};
    ASSERT_EQ(syscall(SYS_get_mempolicy, &mode, mask, sizeof(mask) * 8, p, MPOL_F_ADDR), 0);
    EXPECT_NE(mode, MPOL_DEFAULT);
    ::munmap(p, bytes);

    std::thread([&] {
        int before = -1;
        ASSERT_EQ(syscall(SYS_get_mempolicy, &before, nullptr, 0, nullptr, 0), 0);
        auto r = t->bindCurrentThreadMemory(t->memoryNodeOf(t->pus()[0].os));
        ASSERT_TRUE(r.ok()) << r.error().message();
        int after = -1;
        unsigned long nodes[16] = {};
        ASSERT_EQ(syscall(SYS_get_mempolicy, &after, nodes, sizeof(nodes) * 8, nullptr, 0), 0);
        EXPECT_TRUE(after == MPOL_PREFERRED_MANY || after == MPOL_BIND || after == MPOL_PREFERRED) << after;
        int set = 0;
        for (unsigned long w : nodes) { set += __builtin_popcountl(w); }
        EXPECT_EQ(set, 1);
    }).join();
}

TEST(TopologyMembind, InjectedRefusalComesBackAsItsErrno) {
    auto t = Topology::machine();
    if (!t.ok()) { GTEST_SKIP() << "machine topology: " << t.error().message(); }
    const size_t bytes = 1 << 16;
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(p, MAP_FAILED);
    SPINDLE_MEMBIND_OR_SKIP(*t, p, bytes);
    {
        ArmedFault f(inject::Point::kMembind, EPERM, 2);
        EXPECT_EQ(t->bindArea(p, bytes, 0).errorCode(), EPERM);
        std::thread([&] { EXPECT_EQ(t->bindCurrentThreadMemory(0).errorCode(), EPERM); }).join();
    }
    {
        // allocOnNode keeps going with unbound memory; only ENOMEM fails it.
        ArmedFault f(inject::Point::kMembind, EPERM);
        auto q = t->allocOnNode(bytes, 0);
        ASSERT_TRUE(q.ok()) << q.error().message();
        t->freeOnNode(*q, bytes);
    }
    {
        ArmedFault f(inject::Point::kMembind, ENOMEM);
        EXPECT_EQ(t->allocOnNode(bytes, 0).errorCode(), ENOMEM);
    }
    EXPECT_TRUE(t->bindArea(p, bytes, 0).ok());
    ::munmap(p, bytes);
}

}  // namespace
}  // namespace spindle::numa
