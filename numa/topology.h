#pragma once
/// The machine's shape as the runtime needs it: which PUs a carrier may run on, how far
/// apart two PUs are, which NUMA node a PU belongs to; plus thread binding and
/// node-local memory. A thin owner of one hwloc topology.
///
/// A Topology comes from this host (machine()), from a synthetic hwloc description
/// (fromSynthetic()) or from an XML file written by `lstopo file.xml` (fromXml()). The
/// last two describe some other machine: they answer every query, but cannot bind
/// threads, and the memory they hand out is not bound to any node.
///
/// Indexes: `os` values are OS indexes (what sched_setaffinity and /proc use); core,
/// node and package numbers are hwloc logical indexes, dense from 0.
///
/// Thread-safety: every const member may run concurrently on any thread (hwloc allows
/// concurrent readers, and binding only reads the topology). Construction, move and
/// destruction need exclusive access.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/result.h"

namespace spindle::numa {

/// How far apart two PUs are, for steal order and for counting steals by class.
/// Ordered nearest first, so the enumerators compare as distances.
/// kSamePackage: different NUMA nodes of one package; kRemotePackage: different packages (or a PU
/// not in the topology). A steal "crosses a node" at kSamePackage and beyond.
enum class Distance : uint8_t {
    kSamePu = 0,
    kSameCore = 1,
    kSameCache = 2,
    kSameNode = 3,
    kSamePackage = 4,
    kRemotePackage = 5,
};
inline constexpr size_t kDistanceClassCount = 6;
/// Whether a move between PUs this far apart leaves the NUMA node.
[[nodiscard]] constexpr bool crossesNode(Distance d) noexcept { return d >= Distance::kSamePackage; }

/// "same-pu", "same-core", "same-cache", "same-node", "same-package", "remote-package"; "unknown" otherwise.
const char* toString(Distance d) noexcept;

/// One processing unit (hardware thread) the process may run on.
struct Pu {
    unsigned os;       // OS index (what sched_setaffinity / /proc use)
    unsigned core;     // logical index of its core (a PU with no core above it counts as a core of its own)
    unsigned node;     // logical index of its NUMA node (0 when the machine reports none)
    unsigned package;  // logical index of its package (0 when the machine reports none)
};

class Topology {
public:
    /// This host's topology, restricted to the CPUs the calling thread may run on
    /// (its affinity mask within the process's cgroup cpuset). Call it before pinning
    /// that thread.
    /// Errors: hwloc's errno (ENOMEM, ENOSYS, ...), logged with the call that failed;
    /// ENOTSUP when the hwloc library at run time has another major API than the headers.
    [[nodiscard]] static Result<Topology> machine();

    /// A synthetic topology in hwloc syntax, e.g. "pack:2 numa:1 l3:1 core:4 pu:2"
    /// (two packages, one NUMA node and one L3 each). For experiments and tests.
    /// Errors: EINVAL for a description hwloc rejects, logged with the text.
    [[nodiscard]] static Result<Topology> fromSynthetic(const std::string& description);

    /// A topology exported by `lstopo file.xml` (or hwloc_topology_export_xml).
    /// Errors: ENOENT or EACCES when the file cannot be read, EINVAL when it does not
    /// parse; hwloc's errno otherwise. Each is logged with the path.
    [[nodiscard]] static Result<Topology> fromXml(const std::string& path);

    Topology(Topology&& other) noexcept;
    Topology& operator=(Topology&& other) noexcept;
    Topology(const Topology&) = delete;
    Topology& operator=(const Topology&) = delete;
    ~Topology();

    /// Allowed PUs, ordered so that the first N spread over distinct cores before any SMT
    /// sibling is used: the first PU of every core in core order, then the second PUs, ...
    /// The carrier for index i runs on pus()[i % pus().size()]. Empty only after a move.
    [[nodiscard]] const std::vector<Pu>& pus() const noexcept { return pus_; }
    /// Cores that hold at least one allowed PU.
    [[nodiscard]] unsigned coreCount() const noexcept { return coreCount_; }
    /// NUMA nodes in the topology, including nodes without allowed PUs (memory-only
    /// nodes, or nodes outside the affinity mask), so allocOnNode can reach them.
    [[nodiscard]] unsigned nodeCount() const noexcept { return nodeCount_; }
    /// True when this is not the live machine: fromSynthetic, fromXml, or machine() when
    /// HWLOC_XMLFILE / HWLOC_SYNTHETIC in the environment redirected hwloc.
    [[nodiscard]] bool isSynthetic() const noexcept { return source_ != Source::kMachine; }

    /// The distance class between two PUs. kSameCache: different cores that share a data
    /// cache (L2/L3) on the same NUMA node. PUs on different nodes are kSamePackage or kRemotePackage even
    /// when they share a cache (sub-NUMA clustering), because a steal between them moves
    /// a fiber away from the node its stack lives on.
    /// An OS index that is not among pus() is kRemotePackage from everything but itself.
    [[nodiscard]] Distance distance(unsigned osA, unsigned osB) const noexcept;

    /// `candidates` (OS indexes) stably sorted by distance from `os`, nearest first, with
    /// every occurrence of `os` removed. Unknown candidates sort as kRemotePackage.
    [[nodiscard]] std::vector<unsigned> victimOrder(unsigned os, const std::vector<unsigned>& candidates) const;

    /// Logical index of the NUMA node of PU `os`; 0 for an OS index not among pus().
    [[nodiscard]] unsigned nodeOf(unsigned os) const noexcept;

    /// Binds the calling thread to one PU (hwloc_set_cpubind, HWLOC_CPUBIND_THREAD).
    /// Errors: ENOTSUP on a synthetic/XML topology; EINVAL for an OS index not among
    /// pus(); otherwise hwloc's errno. Each is logged (warn) with the PU and the reason.
    [[nodiscard]] Result<void> bindCurrentThread(unsigned os) const;

    /// `bytes` of zeroed, page-aligned memory bound to NUMA node `node` (logical index):
    /// mmap, then hwloc_set_area_membind(HWLOC_MEMBIND_BIND, not strict), so pages land
    /// on the node when first touched, and spill to other nodes rather than fail when it
    /// is full (hwloc asks Linux >= 5.15 for MPOL_PREFERRED_MANY). Where binding is not
    /// available (synthetic/XML topology, no kernel support, seccomp refusing mbind) the
    /// memory is left unbound and that is logged once.
    /// Errors: ENOMEM; EINVAL for bytes == 0 or node >= nodeCount().
    /// Free with freeOnNode(p, bytes).
    [[nodiscard]] Result<void*> allocOnNode(size_t bytes, unsigned node) const;

    /// Releases memory from allocOnNode; `bytes` is the size that was asked for.
    /// A null `p` is ignored.
    void freeOnNode(void* p, size_t bytes) const noexcept;

    /// One line, e.g. "1 package, 1 NUMA node, 2 cores, 2 PUs (L3 shared by 2)", counting
    /// only allowed PUs and what holds them; a synthetic/XML topology ends in
    /// " [synthetic]" / " [xml]". Used by the tour and the topology tool.
    [[nodiscard]] std::string describe() const;

private:
    enum class Source : uint8_t { kMachine, kSynthetic, kXml };
    struct Hw;  // the hwloc handle and the hwloc objects behind pus_ (topology.cpp)

    // Loads hwloc's view of `source` (`spec`: the description or the path), then indexes it.
    static Result<Topology> create(Source source, const std::string& spec);
    static Result<Topology> build(std::unique_ptr<Hw> hw, Source source);
    Topology(std::unique_ptr<Hw> hw, Source source) noexcept;
    // Position of PU `os` in pus_, or -1 when it is not an allowed PU.
    int32_t slotOf(unsigned os) const noexcept {
        return os < slotOfOs_.size() ? slotOfOs_[os] : -1;
    }

    std::unique_ptr<Hw> hw_;  // null only in a moved-from Topology
    std::vector<Pu> pus_;
    // Invariant: slotOfOs_[pus_[i].os] == i; every other entry is -1.
    std::vector<int32_t> slotOfOs_;
    // Parallel to pus_: id of the outermost data cache above the PU, -1 when none.
    // Two PUs share some data cache exactly when these ids are equal and not -1.
    std::vector<int32_t> cacheOf_;
    unsigned coreCount_ = 0;
    unsigned nodeCount_ = 0;
    Source source_ = Source::kMachine;
};

}  // namespace spindle::numa
