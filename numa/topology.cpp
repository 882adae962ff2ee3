// SPDX-License-Identifier: Apache-2.0
#include "numa/topology.h"

#include <fmt/format.h>
#include <hwloc.h>
#include <sched.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <map>
#include <new>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <utility>

#include "base/inject.h"
#include "base/log.h"

namespace spindle::numa {
namespace {

// OS indexes above this are refused rather than sized into the OS-index table; real
// machines stay far below it, so only a damaged XML file reaches it.
constexpr unsigned kMaxOsIndex = 1u << 20;

struct TopologyDeleter {
    void operator()(hwloc_topology* t) const noexcept { hwloc_topology_destroy(t); }
};
using TopologyPtr = std::unique_ptr<hwloc_topology, TopologyDeleter>;

struct BitmapDeleter {
    void operator()(hwloc_bitmap_s* b) const noexcept { hwloc_bitmap_free(b); }
};
using BitmapPtr = std::unique_ptr<hwloc_bitmap_s, BitmapDeleter>;

std::string errnoText(int err) { return std::system_category().message(err); }

// hwloc documents errno on failure but not for every path; never turn a failure into
// "success" (0) because errno happened to be clear.
int errnoOr(int fallback) noexcept { return errno != 0 ? errno : fallback; }

// Logs which hwloc call failed, on what, and why; returns the error to hand back.
Error hwlocFailed(std::string_view call, std::string_view about, int err) noexcept {
    log::warn("numa: {}({}) failed: {} (errno {})", call, about, errnoText(err), err);
    return Error{err};
}

// Says once per process, per kind of topology, that allocOnNode hands out unbound memory
// and why. Kept apart so a synthetic topology's note never hides the live machine's.
void noteUnboundMemory(bool live, std::string_view why, bool unexpected) noexcept {
    static std::atomic<bool> saidLive{false};
    static std::atomic<bool> saidSynthetic{false};
    if ((live ? saidLive : saidSynthetic).exchange(true, std::memory_order_relaxed)) { return; }
    if (unexpected) {
        log::warn("numa: node-local memory unavailable ({}); allocOnNode falls back to plain mmap", why);
    } else {
        log::info("numa: node-local memory unavailable ({}); allocOnNode falls back to plain mmap", why);
    }
}

// The runtime is built against one hwloc ABI; a different major version at run time
// would read hwloc's structures with the wrong layout.
Result<TopologyPtr> initTopology() noexcept {
    unsigned runtime = hwloc_get_api_version();
    if ((runtime >> 16) != (HWLOC_API_VERSION >> 16)) {
        log::warn("numa: built against hwloc API {:#x} but running with {:#x}", HWLOC_API_VERSION, runtime);
        return Error{ENOTSUP};
    }
    hwloc_topology_t raw = nullptr;
    errno = 0;
    if (hwloc_topology_init(&raw) != 0) { return hwlocFailed("hwloc_topology_init", "", errnoOr(ENOMEM)); }
    return TopologyPtr(raw);
}

// Drops from the topology every PU the calling thread may not run on. hwloc already
// left out what the cgroup cpuset forbids; this adds the affinity mask (taskset, numactl).
// NUMA nodes are kept even when they lose all their PUs, so their memory stays reachable.
Result<void> restrictToThreadAffinity(hwloc_topology_t topo) noexcept {
    BitmapPtr mask(hwloc_bitmap_alloc());
    if (!mask) { return hwlocFailed("hwloc_bitmap_alloc", "affinity mask", ENOMEM); }
    errno = 0;
    if (hwloc_get_cpubind(topo, mask.get(), HWLOC_CPUBIND_THREAD) != 0) {
        int err = errnoOr(ENOSYS);
        log::info("numa: hwloc_get_cpubind(THREAD) failed: {}; using every PU hwloc reports", errnoText(err));
        return {};
    }
    hwloc_const_cpuset_t all = hwloc_topology_get_topology_cpuset(topo);
    if (hwloc_bitmap_and(mask.get(), mask.get(), all) != 0) {
        return hwlocFailed("hwloc_bitmap_and", "affinity mask", ENOMEM);
    }
    if (hwloc_bitmap_iszero(mask.get())) {
        log::warn("numa: the thread's affinity mask holds no PU of the topology; using every PU hwloc reports");
        return {};
    }
    if (hwloc_bitmap_isequal(mask.get(), all)) { return {}; }
    errno = 0;
    if (hwloc_topology_restrict(topo, mask.get(), 0) != 0) {
        return hwlocFailed("hwloc_topology_restrict", "affinity mask", errnoOr(EINVAL));
    }
    return {};
}

// The NUMA node local to `pu`: the first node among the memory children of its nearest
// ancestor that has any (looking through memory-side caches).
hwloc_obj_t localNode(hwloc_obj_t pu) noexcept {
    for (hwloc_obj_t o = pu; o != nullptr; o = o->parent) {
        for (hwloc_obj_t m = o->memory_first_child; m != nullptr; m = m->next_sibling) {
            hwloc_obj_t n = m;
            while (n != nullptr && n->type != HWLOC_OBJ_NUMANODE) { n = n->memory_first_child; }
            if (n != nullptr) { return n; }
        }
    }
    return nullptr;
}

// The largest data (or unified) cache above `pu`, or null. Caches nest, so two PUs share
// some data cache exactly when their outermost ones are the same object.
hwloc_obj_t outermostCache(hwloc_obj_t pu) noexcept {
    hwloc_obj_t found = nullptr;
    for (hwloc_obj_t o = pu->parent; o != nullptr; o = o->parent) {
        if (hwloc_obj_type_is_dcache(o->type) != 0) { found = o; }
    }
    return found;
}

std::string plural(size_t n, std::string_view one, std::string_view many) {
    return fmt::format("{} {}", n, n == 1 ? one : many);
}

}  // namespace

struct Topology::Hw {
    TopologyPtr topo;
    std::vector<hwloc_obj_t> puObj;     // parallel to Topology::pus_
    std::vector<hwloc_obj_t> cacheObj;  // indexed by the ids in Topology::cacheOf_
};

const char* toString(Distance d) noexcept {
    switch (d) {
        case Distance::kSamePu: return "same-pu";
        case Distance::kSameCore: return "same-core";
        case Distance::kSameCache: return "same-cache";
        case Distance::kSameNode: return "same-node";
        case Distance::kSamePackage: return "same-package";
        case Distance::kRemotePackage: return "remote-package";
    }
    return "unknown";
}

Topology::Topology(std::unique_ptr<Hw> hw, Source source) noexcept : hw_(std::move(hw)), source_(source) {}

Topology::Topology(Topology&& other) noexcept
    : hw_(std::move(other.hw_)),
      pus_(std::move(other.pus_)),
      slotOfOs_(std::move(other.slotOfOs_)),
      cacheOf_(std::move(other.cacheOf_)),
      nodeHasMemory_(std::move(other.nodeHasMemory_)),
      memNodeOf_(std::move(other.memNodeOf_)),
      distances_(std::move(other.distances_)),
      coreCount_(std::exchange(other.coreCount_, 0)),
      nodeCount_(std::exchange(other.nodeCount_, 0)),
      source_(other.source_) {
    other.pus_.clear();
    other.slotOfOs_.clear();
    other.cacheOf_.clear();
    other.nodeHasMemory_.clear();
    other.memNodeOf_.clear();
    other.distances_.clear();
}

Topology& Topology::operator=(Topology&& other) noexcept {
    if (this != &other) {
        hw_ = std::move(other.hw_);
        pus_ = std::move(other.pus_);
        slotOfOs_ = std::move(other.slotOfOs_);
        cacheOf_ = std::move(other.cacheOf_);
        nodeHasMemory_ = std::move(other.nodeHasMemory_);
        memNodeOf_ = std::move(other.memNodeOf_);
        distances_ = std::move(other.distances_);
        coreCount_ = std::exchange(other.coreCount_, 0);
        nodeCount_ = std::exchange(other.nodeCount_, 0);
        source_ = other.source_;
        other.pus_.clear();
        other.slotOfOs_.clear();
        other.cacheOf_.clear();
        other.nodeHasMemory_.clear();
        other.memNodeOf_.clear();
        other.distances_.clear();
    }
    return *this;
}

Topology::~Topology() = default;

Result<Topology> Topology::machine() {
    auto built = create(Source::kMachine, "");
    if (built) {
        log::debug("numa: machine topology: {}", built->describe());
        return built;
    }
    // ENOTSUP: the hwloc library does not match the headers; its synthetic backend is no safer.
    if (built.errorCode() == ENOTSUP) { return built; }
    auto flat = fallback();
    if (!flat) {
        log::warn("numa: the fallback topology failed too ({})", flat.error().message());
        return built;
    }
    log::warn("numa: hwloc could not read this machine ({}); falling back to a flat topology: {}",
              built.error().message(), flat->describe());
    return flat;
}

Result<Topology> Topology::fallback() {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (::sched_getaffinity(0, sizeof(set), &set) != 0) {
        int err = errno;
        log::warn("numa: sched_getaffinity failed: {}", errnoText(err));
        return Error{err};
    }
    std::string indexes;
    unsigned count = 0;
    for (unsigned cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
        if (CPU_ISSET(cpu, &set)) {
            indexes += fmt::format("{}{}", count == 0 ? "" : ",", cpu);
            ++count;
        }
    }
    if (count == 0) { return Error{EINVAL}; }
    // One package, one node, one core per allowed CPU, each PU carrying the CPU's OS index.
    std::string description = fmt::format("pack:1 numa:1 core:{} pu:1(indexes={})", count, indexes);
    auto topo = initTopology();
    if (!topo) { return Error{topo.errorCode()}; }
    hwloc_topology_t raw = topo->get();
    errno = 0;
    if (hwloc_topology_set_synthetic(raw, description.c_str()) != 0) {
        return hwlocFailed("hwloc_topology_set_synthetic", description, errnoOr(EINVAL));
    }
    // The CPUs are this host's, so hwloc may bind threads to them with the OS's calls.
    if (hwloc_topology_set_flags(raw, HWLOC_TOPOLOGY_FLAG_IS_THISSYSTEM) != 0) {
        return hwlocFailed("hwloc_topology_set_flags", "IS_THISSYSTEM", errnoOr(EINVAL));
    }
    errno = 0;
    if (hwloc_topology_load(raw) != 0) { return hwlocFailed("hwloc_topology_load", description, errnoOr(EINVAL)); }
    auto hw = std::unique_ptr<Hw>(new (std::nothrow) Hw{});
    if (!hw) { return Error{ENOMEM}; }
    hw->topo = std::move(*topo);
    return build(std::move(hw), Source::kFallback);
}

Result<Topology> Topology::fromSpec(const std::string& spec) {
    if (spec.empty() || spec == "machine") { return machine(); }
    if (spec.rfind("synthetic:", 0) == 0) { return fromSynthetic(spec.substr(10)); }
    if (spec.rfind("xml:", 0) == 0) { return fromXml(spec.substr(4)); }
    log::warn("numa: a topology is \"machine\", \"synthetic:<hwloc string>\" or \"xml:<path>\", not \"{}\"", spec);
    return Error{EINVAL};
}

Result<Topology> Topology::restricted(const std::vector<unsigned>& allowedOs) const {
    if (allowedOs.empty() || !hw_) {
        log::warn("numa: restricted() needs at least one PU");
        return Error{EINVAL};
    }
    BitmapPtr set(hwloc_bitmap_alloc());
    if (!set) { return Error{ENOMEM}; }
    for (unsigned os : allowedOs) {
        if (slotOf(os) < 0) {
            log::warn("numa: restricted(): PU P#{} is not one of the {} PUs of the topology", os, pus_.size());
            return Error{EINVAL};
        }
        if (hwloc_bitmap_set(set.get(), os) != 0) { return Error{ENOMEM}; }
    }
    hwloc_topology_t copy = nullptr;
    errno = 0;
    if (hwloc_topology_dup(&copy, hw_->topo.get()) != 0) {
        return hwlocFailed("hwloc_topology_dup", "restricted()", errnoOr(ENOMEM));
    }
    TopologyPtr owned(copy);
    errno = 0;
    if (hwloc_topology_restrict(copy, set.get(), 0) != 0) {
        return hwlocFailed("hwloc_topology_restrict", "restricted()", errnoOr(EINVAL));
    }
    auto hw = std::unique_ptr<Hw>(new (std::nothrow) Hw{});
    if (!hw) { return Error{ENOMEM}; }
    hw->topo = std::move(owned);
    return build(std::move(hw), source_);
}

Result<Topology> Topology::fromSynthetic(const std::string& description) {
    return create(Source::kSynthetic, description);
}

Result<Topology> Topology::fromXml(const std::string& path) { return create(Source::kXml, path); }

Result<Topology> Topology::create(Source source, const std::string& spec) {
    auto topo = initTopology();
    if (!topo) { return Error{topo.errorCode()}; }
    hwloc_topology_t raw = topo->get();
    std::string about = source == Source::kMachine ? std::string("this machine") : fmt::format("\"{}\"", spec);
    errno = 0;
    if (source == Source::kSynthetic && hwloc_topology_set_synthetic(raw, spec.c_str()) != 0) {
        return hwlocFailed("hwloc_topology_set_synthetic", about, errnoOr(EINVAL));
    }
    // hwloc reads the file here: a missing or unreadable file fails with fopen's errno,
    // one that does not parse with EINVAL.
    if (source == Source::kXml && hwloc_topology_set_xml(raw, spec.c_str()) != 0) {
        return hwlocFailed("hwloc_topology_set_xml", about, errnoOr(EINVAL));
    }
    if (source == Source::kMachine) {
        SPINDLE_INJECT(inject::Point::kHwlocLoad, {
            return hwlocFailed("hwloc_topology_load (injected)", about, injectedErrno);
        });
    }
    errno = 0;
    if (hwloc_topology_load(raw) != 0) { return hwlocFailed("hwloc_topology_load", about, errnoOr(EINVAL)); }

    if (source == Source::kMachine) {
        if (hwloc_topology_is_thissystem(raw) == 0) {
            // HWLOC_XMLFILE, HWLOC_SYNTHETIC or HWLOC_FSROOT redirected discovery: what was
            // loaded describes another machine, so binding must not pretend to work.
            log::info("numa: the hwloc environment points discovery elsewhere; treating the topology as synthetic");
            source = Source::kSynthetic;
        } else if (auto r = restrictToThreadAffinity(raw); !r) {
            return Error{r.errorCode()};
        }
    }
    auto hw = std::unique_ptr<Hw>(new (std::nothrow) Hw{});
    if (!hw) { return Error{ENOMEM}; }
    hw->topo = std::move(*topo);
    return build(std::move(hw), source);
}

Result<Topology> Topology::build(std::unique_ptr<Hw> hw, Source source) {
    try {
        hwloc_topology_t topo = hw->topo.get();
        Topology t(std::move(hw), source);
        Hw& h = *t.hw_;

        struct Entry {
            Pu pu;
            unsigned rank;  // how many PUs of the same core come before it
            hwloc_obj_t obj;
            int32_t cache;
        };
        std::vector<Entry> entries;
        std::vector<unsigned> pusSeenInCore;
        std::unordered_map<hwloc_obj_t, int32_t> cacheIds;
        int cores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
        unsigned nextLoneCore = cores > 0 ? static_cast<unsigned>(cores) : 0u;
        unsigned maxOs = 0;

        // Logical order is depth-first, so the first PU of each core appears in core order.
        for (hwloc_obj_t pu = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_PU, nullptr); pu != nullptr;
             pu = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_PU, pu)) {
            if (pu->os_index == HWLOC_UNKNOWN_INDEX || pu->os_index > kMaxOsIndex) {
                log::warn("numa: PU L#{} has no usable OS index ({})", pu->logical_index, pu->os_index);
                return Error{EINVAL};
            }
            hwloc_obj_t core = hwloc_get_ancestor_obj_by_type(topo, HWLOC_OBJ_CORE, pu);
            hwloc_obj_t package = hwloc_get_ancestor_obj_by_type(topo, HWLOC_OBJ_PACKAGE, pu);
            hwloc_obj_t node = localNode(pu);
            hwloc_obj_t cache = outermostCache(pu);
            unsigned coreIndex = core != nullptr ? core->logical_index : nextLoneCore++;
            if (coreIndex >= pusSeenInCore.size()) { pusSeenInCore.resize(coreIndex + 1, 0); }
            int32_t cacheId = -1;
            if (cache != nullptr) {
                auto [it, added] = cacheIds.try_emplace(cache, static_cast<int32_t>(h.cacheObj.size()));
                if (added) { h.cacheObj.push_back(cache); }
                cacheId = it->second;
            }
            unsigned nodeIndex = node != nullptr ? node->logical_index : 0u;
            entries.push_back(Entry{Pu{pu->os_index, coreIndex, nodeIndex,
                                       package != nullptr ? package->logical_index : 0u, nodeIndex},
                                    pusSeenInCore[coreIndex]++, pu, cacheId});
            maxOs = std::max(maxOs, pu->os_index);
        }
        if (entries.empty()) {
            log::warn("numa: the topology holds no PU");
            return Error{EINVAL};
        }

        // First PUs of every core, then second PUs, ...: carriers fill cores before siblings.
        std::stable_sort(entries.begin(), entries.end(),
                         [](const Entry& a, const Entry& b) { return a.rank < b.rank; });

        t.slotOfOs_.assign(static_cast<size_t>(maxOs) + 1, -1);
        t.pus_.reserve(entries.size());
        t.cacheOf_.reserve(entries.size());
        h.puObj.reserve(entries.size());
        for (const Entry& e : entries) {
            if (t.slotOfOs_[e.pu.os] != -1) {
                log::warn("numa: two PUs claim OS index {}", e.pu.os);
                return Error{EINVAL};
            }
            t.slotOfOs_[e.pu.os] = static_cast<int32_t>(t.pus_.size());
            t.pus_.push_back(e.pu);
            t.cacheOf_.push_back(e.cache);
            h.puObj.push_back(e.obj);
        }
        t.coreCount_ = static_cast<unsigned>(
            std::count_if(pusSeenInCore.begin(), pusSeenInCore.end(), [](unsigned n) { return n > 0; }));
        int nodes = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
        t.nodeCount_ = nodes > 0 ? static_cast<unsigned>(nodes) : 1u;
        t.indexNodes();
        for (Pu& pu : t.pus_) { pu.memNode = t.memoryNode(pu.node); }
        return t;
    } catch (const std::bad_alloc&) {
        log::warn("numa: out of memory while indexing the topology");
        return Error{ENOMEM};
    }
}

void Topology::indexNodes() {
    hwloc_topology_t topo = hw_->topo.get();
    const unsigned n = nodeCount_;
    // The latency matrix, if hwloc has one over every node (from the OS or from an XML file).
    unsigned nr = 1;
    hwloc_distances_s* d = nullptr;
    const unsigned long kind =
        HWLOC_DISTANCES_KIND_FROM_OS | HWLOC_DISTANCES_KIND_FROM_USER | HWLOC_DISTANCES_KIND_MEANS_LATENCY;
    if (hwloc_distances_get_by_type(topo, HWLOC_OBJ_NUMANODE, &nr, &d, kind, 0) == 0 && nr >= 1 && d != nullptr) {
        if (d->nbobjs == n) {
            distances_.assign(static_cast<size_t>(n) * n, 0);
            for (unsigned i = 0; i < n; ++i) {
                for (unsigned j = 0; j < n; ++j) {
                    distances_[static_cast<size_t>(d->objs[i]->logical_index) * n + d->objs[j]->logical_index] =
                        d->values[static_cast<size_t>(i) * n + j];
                }
            }
        } else {
            log::info("numa: hwloc's distance matrix covers {} of {} NUMA nodes; ignored", d->nbobjs, n);
        }
        hwloc_distances_release(topo, d);
    }

    // Which nodes have memory; a topology that reports none anywhere is taken as all having some.
    nodeHasMemory_.assign(n, true);
    std::vector<unsigned> packageOf(n, 0);
    bool any = false;
    for (unsigned i = 0; i < n; ++i) {
        hwloc_obj_t obj = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, i);
        if (obj == nullptr) { continue; }
        nodeHasMemory_[i] = obj->attr->numanode.local_memory > 0;
        any = any || nodeHasMemory_[i];
        if (hwloc_obj_t pack = hwloc_get_ancestor_obj_by_type(topo, HWLOC_OBJ_PACKAGE, obj)) {
            packageOf[i] = pack->logical_index;
        }
    }
    if (!any) { nodeHasMemory_.assign(n, true); }

    memNodeOf_.resize(n);
    for (unsigned i = 0; i < n; ++i) {
        memNodeOf_[i] = i;
        if (nodeHasMemory_[i]) { continue; }
        // Nearest by latency; without a matrix, a node of the same package; else the first with memory.
        auto cost = [&](unsigned j) -> uint64_t {
            if (!distances_.empty()) { return distances_[static_cast<size_t>(i) * n + j]; }
            return packageOf[j] == packageOf[i] ? 0 : 1;
        };
        unsigned best = n;
        for (unsigned j = 0; j < n; ++j) {
            if (nodeHasMemory_[j] && (best == n || cost(j) < cost(best))) { best = j; }
        }
        memNodeOf_[i] = best;
        log::warn("numa: NUMA node {} has no memory; memory for its PUs comes from node {} ({})", i, best,
                  distances_.empty() ? (packageOf[best] == packageOf[i] ? "same package" : "first node with memory")
                                     : "nearest by the distance matrix");
    }
}

std::optional<std::vector<std::vector<uint64_t>>> Topology::nodeDistances() const {
    if (distances_.empty()) { return std::nullopt; }
    std::vector<std::vector<uint64_t>> out(nodeCount_);
    for (unsigned i = 0; i < nodeCount_; ++i) {
        out[i].assign(distances_.begin() + static_cast<ptrdiff_t>(i) * nodeCount_,
                      distances_.begin() + static_cast<ptrdiff_t>(i + 1) * nodeCount_);
    }
    return out;
}

bool Topology::nodeHasMemory(unsigned node) const noexcept {
    return node < nodeHasMemory_.size() && nodeHasMemory_[node];
}

unsigned Topology::memoryNodeOf(unsigned os) const noexcept {
    int32_t s = slotOf(os);
    return s < 0 ? 0u : pus_[static_cast<size_t>(s)].memNode;
}

Distance Topology::distance(unsigned osA, unsigned osB) const noexcept {
    if (osA == osB) { return Distance::kSamePu; }
    int32_t a = slotOf(osA);
    int32_t b = slotOf(osB);
    if (a < 0 || b < 0) { return Distance::kRemotePackage; }
    const Pu& pa = pus_[static_cast<size_t>(a)];
    const Pu& pb = pus_[static_cast<size_t>(b)];
    if (pa.core == pb.core) { return Distance::kSameCore; }
    if (pa.node != pb.node) { return pa.package == pb.package ? Distance::kSamePackage : Distance::kRemotePackage; }
    int32_t cache = cacheOf_[static_cast<size_t>(a)];
    if (cache >= 0 && cache == cacheOf_[static_cast<size_t>(b)]) { return Distance::kSameCache; }
    return Distance::kSameNode;
}

std::vector<unsigned> Topology::victimOrder(unsigned os, const std::vector<unsigned>& candidates) const {
    std::vector<std::pair<Distance, unsigned>> keyed;
    keyed.reserve(candidates.size());
    for (unsigned c : candidates) {
        if (c != os) { keyed.emplace_back(distance(os, c), c); }
    }
    std::stable_sort(keyed.begin(), keyed.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<unsigned> out;
    out.reserve(keyed.size());
    for (const auto& k : keyed) { out.push_back(k.second); }
    return out;
}

unsigned Topology::nodeOf(unsigned os) const noexcept {
    int32_t s = slotOf(os);
    return s < 0 ? 0u : pus_[static_cast<size_t>(s)].node;
}

Result<void> Topology::bindCurrentThread(unsigned os) const {
    if (isSynthetic()) {
        log::warn("numa: cannot bind to PU P#{}: the topology is {}, not this machine", os,
                  source_ == Source::kXml ? "from an XML file" : "synthetic");
        return Error{ENOTSUP};
    }
    int32_t s = slotOf(os);
    if (s < 0) {
        log::warn("numa: cannot bind to PU P#{}: not one of the {} PUs this process may use", os, pus_.size());
        return Error{EINVAL};
    }
    errno = 0;
    if (hwloc_set_cpubind(hw_->topo.get(), hw_->puObj[static_cast<size_t>(s)]->cpuset, HWLOC_CPUBIND_THREAD) != 0) {
        return hwlocFailed("hwloc_set_cpubind", fmt::format("PU P#{}, THREAD", os), errnoOr(EINVAL));
    }
    return {};
}

Result<void*> Topology::allocOnNode(size_t bytes, unsigned node) const {
    if (bytes == 0 || node >= nodeCount_) {
        log::warn("numa: allocOnNode({} bytes, node {}): {}", bytes, node,
                  bytes == 0 ? "zero bytes" : "no such node, there are " + plural(nodeCount_, "NUMA node", "NUMA nodes"));
        return Error{EINVAL};
    }
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        int err = errno;
        log::warn("numa: mmap({} bytes) for node {} failed: {}", bytes, node, errnoText(err));
        return Error{err != 0 ? err : ENOMEM};
    }
    if (isSynthetic()) {
        noteUnboundMemory(false, "the topology is not this machine", false);
        return p;
    }
    int err = membind(p, bytes, node);
    if (err == ENOMEM) {
        ::munmap(p, bytes);
        return hwlocFailed("hwloc_set_area_membind", fmt::format("{} bytes, node {}", bytes, node), ENOMEM);
    }
    if (err == ENOTSUP && isFallback()) {
        noteUnboundMemory(true, "hwloc could not read this machine, so no NUMA node is known", true);
    } else if (err == ENOTSUP) {
        noteUnboundMemory(true, "hwloc reports no memory binding on this system", false);
    } else if (err != 0) {
        // ENOSYS/EXDEV: no support; EPERM: mbind refused, e.g. by a container's seccomp profile.
        bool unexpected = err != ENOSYS && err != EXDEV && err != EPERM;
        noteUnboundMemory(true, fmt::format("hwloc_set_area_membind failed: {}", errnoText(err)), unexpected);
    }
    return p;
}

int Topology::membind(void* p, size_t bytes, unsigned node) const noexcept {
    if (isSynthetic() || isFallback()) { return ENOTSUP; }
    hwloc_topology_t topo = hw_->topo.get();
    const hwloc_topology_support* support = hwloc_topology_get_support(topo);
    const bool area = p != nullptr;
    if ((area ? support->membind->set_area_membind : support->membind->set_thisthread_membind) == 0 ||
        support->membind->bind_membind == 0) {
        return ENOTSUP;
    }
    // nodeCount_ is 1 when hwloc reports no node; then there is nothing to bind to.
    hwloc_obj_t target = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, memoryNode(node));
    if (target == nullptr) { return ENOTSUP; }
    SPINDLE_INJECT(inject::Point::kMembind, { return injectedErrno; });
    errno = 0;
    int rc = area ? hwloc_set_area_membind(topo, p, bytes, target->nodeset, HWLOC_MEMBIND_BIND,
                                           HWLOC_MEMBIND_BYNODESET)
                  : hwloc_set_membind(topo, target->nodeset, HWLOC_MEMBIND_BIND,
                                      HWLOC_MEMBIND_THREAD | HWLOC_MEMBIND_BYNODESET);
    return rc == 0 ? 0 : errnoOr(ENOSYS);
}

Result<void> Topology::bindArea(void* p, size_t bytes, unsigned node) const {
    if (p == nullptr || bytes == 0 || node >= nodeCount_) { return Error{EINVAL}; }
    if (int err = membind(p, bytes, node); err != 0) { return Error{err}; }
    return {};
}

Result<void> Topology::bindCurrentThreadMemory(unsigned node) const {
    if (node >= nodeCount_) { return Error{EINVAL}; }
    if (int err = membind(nullptr, 0, node); err != 0) { return Error{err}; }
    return {};
}

void Topology::freeOnNode(void* p, size_t bytes) const noexcept {
    if (p == nullptr) { return; }
    if (::munmap(p, bytes) != 0) {
        int err = errno;
        log::warn("numa: munmap({}, {} bytes) failed: {}", p, bytes, errnoText(err));
    }
}

std::string Topology::describe() const {
    if (pus_.empty()) { return "empty topology"; }
    std::vector<unsigned> packages;
    for (const Pu& pu : pus_) { packages.push_back(pu.package); }
    std::sort(packages.begin(), packages.end());
    size_t packageCount = static_cast<size_t>(std::unique(packages.begin(), packages.end()) - packages.begin());

    std::string line = fmt::format("{}, {}, {}, {}", plural(packageCount, "package", "packages"),
                                   plural(nodeCount_, "NUMA node", "NUMA nodes"), plural(coreCount_, "core", "cores"),
                                   plural(pus_.size(), "PU", "PUs"));

    // How many allowed PUs share each outermost cache, grouped by cache type.
    std::vector<size_t> sharers(hw_->cacheObj.size(), 0);
    for (int32_t id : cacheOf_) {
        if (id >= 0) { ++sharers[static_cast<size_t>(id)]; }
    }
    std::map<std::string, std::pair<size_t, size_t>> byType;  // type -> (fewest, most) sharers
    for (size_t id = 0; id < sharers.size(); ++id) {
        char type[32];
        hwloc_obj_type_snprintf(type, sizeof(type), hw_->cacheObj[id], 0);
        auto [it, added] = byType.try_emplace(type, sharers[id], sharers[id]);
        if (!added) {
            it->second.first = std::min(it->second.first, sharers[id]);
            it->second.second = std::max(it->second.second, sharers[id]);
        }
    }
    std::string caches;
    for (auto it = byType.rbegin(); it != byType.rend(); ++it) {  // L3 before L2
        auto [fewest, most] = it->second;
        caches += caches.empty() ? " (" : ", ";
        caches += fewest == most ? fmt::format("{} shared by {}", it->first, most)
                                 : fmt::format("{} shared by {}-{}", it->first, fewest, most);
    }
    if (!caches.empty()) { line += caches + ")"; }

    if (source_ == Source::kSynthetic) { line += " [synthetic]"; }
    if (source_ == Source::kXml) { line += " [xml]"; }
    return line;
}

}  // namespace spindle::numa
