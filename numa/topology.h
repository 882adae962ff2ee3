// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The machine's shape as the runtime needs it: which PUs a carrier may run on, how far
/// apart two PUs are, which NUMA node a PU belongs to; plus thread binding and
/// node-local memory. A thin owner of one hwloc topology.
///
/// A Topology comes from this host (machine()), from a synthetic hwloc description
/// (fromSynthetic()) or from an XML file written by `lstopo file.xml` (fromXml()); fromSpec()
/// picks one from a string ("machine", "synthetic:<desc>", "xml:<path>"). The last two
/// describe some other machine: they answer every query, but cannot bind threads, and the
/// memory they hand out is not bound to any node.
///
/// What breaks detection in practice, and what happens then (each is logged, warn):
/// - hwloc cannot load this machine: machine() falls back to a flat topology of the CPUs
///   the thread may run on (one package, one NUMA node, one core per CPU; isFallback()).
///   It binds threads to those CPUs, but knows no NUMA node, so memory stays unbound.
/// - a NUMA node without memory (its CPUs allocate from elsewhere): Pu::memNode and
///   memoryNodeOf() name the nearest node that has memory (by the distance matrix when
///   hwloc has one, else a node of the same package, else the first node with memory);
///   the node-local allocators use that node.
/// - a cpuset smaller than the machine: machine() keeps only the allowed PUs (and every
///   NUMA node, so memory-only nodes stay reachable); restricted() does the same on demand.
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
#include <optional>
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
    unsigned memNode;  // logical index of the node its memory comes from: `node`, or the nearest node
                       // with memory when `node` has none
};

/// The environment variable that names a topology when RuntimeOptions::topology is empty;
/// same syntax as Topology::fromSpec.
inline constexpr const char* kTopologyEnv = "SPINDLE_TOPOLOGY";

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

    /// A topology named by `spec`: "" or "machine" (machine()), "synthetic:<hwloc string>"
    /// (fromSynthetic) or "xml:<path>" (fromXml).
    /// Errors: EINVAL for any other text (logged); otherwise those of the call it picks.
    [[nodiscard]] static Result<Topology> fromSpec(const std::string& spec);

    /// A copy of this topology keeping only the PUs with these OS indexes (what a smaller
    /// cpuset does to machine()); NUMA nodes stay, even those left without PUs.
    /// Errors: EINVAL for an empty list or an OS index not among pus() (logged); ENOMEM;
    /// hwloc's errno when it cannot copy or restrict the topology.
    [[nodiscard]] Result<Topology> restricted(const std::vector<unsigned>& allowedOs) const;

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
    [[nodiscard]] bool isSynthetic() const noexcept {
        return source_ == Source::kSynthetic || source_ == Source::kXml;
    }
    /// True when machine() could not load hwloc's view of this host and built the flat
    /// fallback (see the class comment). Such a topology binds threads but not memory.
    [[nodiscard]] bool isFallback() const noexcept { return source_ == Source::kFallback; }

    /// hwloc's NUMA latency matrix (from the OS, e.g. the ACPI SLIT, or from an XML file),
    /// indexed [from][to] by logical node index, nodeCount() x nodeCount(); nullopt when
    /// hwloc has none that covers every node (typical of 1-node machines and synthetic
    /// topologies). Values are relative: 10 means local on Linux.
    [[nodiscard]] std::optional<std::vector<std::vector<uint64_t>>> nodeDistances() const;
    /// Whether NUMA node `node` (logical index) reports memory. False for a node index out of range.
    [[nodiscard]] bool nodeHasMemory(unsigned node) const noexcept;

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
    /// The node that memory for PU `os` should come from: Pu::memNode; 0 for an OS index not
    /// among pus().
    [[nodiscard]] unsigned memoryNodeOf(unsigned os) const noexcept;

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
    /// A node without memory is replaced by the node its PUs allocate from (Pu::memNode).
    /// Errors: ENOMEM; EINVAL for bytes == 0 or node >= nodeCount().
    /// Free with freeOnNode(p, bytes).
    [[nodiscard]] Result<void*> allocOnNode(size_t bytes, unsigned node) const;

    /// Binds the pages of an existing mapping [p, p + bytes) to node `node` as allocOnNode
    /// does (not strict; a node without memory is replaced as there). Pages already touched
    /// stay where they are. For memory the caller maps itself (fiber stacks).
    /// Errors: EINVAL for a null p, bytes == 0 or node >= nodeCount(); ENOTSUP when this
    /// topology cannot bind memory (synthetic, XML, fallback, or no hwloc support); otherwise
    /// the errno of the refused binding (EPERM under a seccomp profile, ENOSYS, ...).
    /// Not logged: the caller decides whether its fallback deserves a line.
    [[nodiscard]] Result<void> bindArea(void* p, size_t bytes, unsigned node) const;

    /// Sets the calling thread's memory policy to prefer node `node` (hwloc_set_membind,
    /// HWLOC_MEMBIND_BIND | HWLOC_MEMBIND_THREAD, not strict), so that what the kernel
    /// allocates for it from now on, io_uring rings included, lands on that node while it
    /// has room. A node without memory is replaced as in allocOnNode.
    /// Errors: as bindArea (no p and bytes); not logged.
    [[nodiscard]] Result<void> bindCurrentThreadMemory(unsigned node) const;

    /// Releases memory from allocOnNode; `bytes` is the size that was asked for.
    /// A null `p` is ignored.
    void freeOnNode(void* p, size_t bytes) const noexcept;

    /// One line, e.g. "1 package, 1 NUMA node, 2 cores, 2 PUs (L3 shared by 2)", counting
    /// only allowed PUs and what holds them; a synthetic/XML topology ends in
    /// " [synthetic]" / " [xml]". Used by the tour and the topology tool.
    [[nodiscard]] std::string describe() const;

private:
    enum class Source : uint8_t { kMachine, kSynthetic, kXml, kFallback };
    struct Hw;  // the hwloc handle and the hwloc objects behind pus_ (topology.cpp)

    // Loads hwloc's view of `source` (`spec`: the description or the path), then indexes it.
    static Result<Topology> create(Source source, const std::string& spec);
    static Result<Topology> build(std::unique_ptr<Hw> hw, Source source);
    // Fills nodeHasMemory_, memNodeOf_ and distances_ from hw_ (nodeCount_ already set).
    void indexNodes();
    // The flat topology machine() falls back to when hwloc cannot load this host.
    static Result<Topology> fallback();
    // The node memory for `node` comes from (memNodeOf_), `node` itself when out of range.
    unsigned memoryNode(unsigned node) const noexcept {
        return node < memNodeOf_.size() ? memNodeOf_[node] : node;
    }
    // 0 when [p, bytes) (or the thread, p == nullptr) now prefers `node`; else the errno.
    int membind(void* p, size_t bytes, unsigned node) const noexcept;
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
    // Per logical node: whether it reports memory, and the node its memory comes from.
    std::vector<bool> nodeHasMemory_;
    std::vector<unsigned> memNodeOf_;
    // nodeCount_ * nodeCount_ latencies, row-major [from][to]; empty when hwloc has no matrix.
    std::vector<uint64_t> distances_;
    unsigned coreCount_ = 0;
    unsigned nodeCount_ = 0;
    Source source_ = Source::kMachine;
};

}  // namespace spindle::numa
