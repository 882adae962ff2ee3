// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Per-carrier pool of fiber stacks: one size class per power of two from 16 KiB to 8 MiB, each
/// stack below a guard page, stacks carved from slabs that share one mapping.
///
/// Mapping. A slab holds a few dozen stacks of one class (about 2 MiB, at least 4 stacks) under
/// one mmap. Each stack's guard page is a guard region (madvise MADV_GUARD_INSTALL, Linux 6.13),
/// which does not split the mapping, so a million stacks cost a few thousand mappings, not two
/// million; the kernel merges neighbouring slabs as well. Where guard regions are missing (an
/// older kernel; qemu-user, which accepts the call and ignores it: the probe checks that the
/// kernel refuses to read a guard) each guard is a PROT_NONE page as before, two mappings per
/// stack, and the first mapping refused past vm.max_map_count is logged once with that name.
///
/// Reuse. Stacks a fiber has given back are "warm" (their pages are still there): they sit in a
/// per-class list, most recently used first, and acquire() takes the most recent one. Stacks
/// never used or given back to the kernel are "cold" and are tracked by their slab. A warm stack
/// becomes cold only in scavenge(): once per period (500 ms), the warm stacks that stayed unused
/// for the whole period (those below the list's low-water mark) lose their pages with
/// MADV_DONTNEED, least recently used first, except the `keepWarm` most recent (1 MiB worth per
/// class, at least 2 stacks). A slab whose stacks are all cold is unmapped. So a fiber's exit
/// never makes a system call, and a burst's stacks go back to the kernel one period after the
/// burst, even on a carrier that has since parked (park() waits no longer than nextScavengeNs()).
///
/// Thread-safety: acquire(), scavenge(), maintain() on the owner thread only. release() from any
/// thread: a stranger's release goes through a lock-free list the owner files at maintain().
/// acquireForeign() from any thread: it takes one of a few stacks the owner sets aside in
/// maintain() for other threads (spares, refilled on demand), else maps one stack alone.
/// A size above the largest class is mapped alone and unmapped on release, as acquireForeign()'s
/// misses are.
/// Errors: acquire() and acquireForeign() return ENOMEM (or the errno of the refusal) when the
/// kernel refuses the mapping or its guards; the first refusal is logged with its reason.
///
/// Memory: after bindToNode(), each slab the pool maps is bound to the carrier's NUMA node
/// (numa::Topology::bindArea), so a fiber's stack stays node-local even when the fiber is
/// stolen and first touches it on another node. A refused binding is logged once and the
/// pool maps unbound slabs from then on; acquire() never fails because of it.

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "base/counter.h"
#include "base/result.h"
#include "core/internal/fiber.h"
#include "core/internal/mpsc_queue.h"

namespace spindle::numa {
class Topology;
}  // namespace spindle::numa

namespace spindle::detail {

class StackPool {
public:
    static constexpr size_t kMinClassSize = 16 * 1024;
    static constexpr unsigned kClassCount = 10;  // 16 KiB .. 8 MiB
    static constexpr size_t kMaxClassSize = kMinClassSize << (kClassCount - 1);
    static constexpr size_t kKeepWarmBytes = 1024 * 1024;  // per class, at least kMinKeepWarm stacks
    static constexpr size_t kMinKeepWarm = 2;
    static constexpr uint64_t kDefaultScavengeNs = 500'000'000;
    static constexpr unsigned kSpares = 8;  // per class, set aside for acquireForeign()

    explicit StackPool(uint64_t scavengePeriodNs = kDefaultScavengeNs) noexcept;
    ~StackPool();
    StackPool(const StackPool&) = delete;
    StackPool& operator=(const StackPool&) = delete;

    /// Binds the pool to the calling thread (the carrier's).
    void claimForThisThread() noexcept;
    [[nodiscard]] bool ownedByThisThread() const noexcept;

    /// From now on, binds each slab it maps to NUMA node `node` of `topology` (which must
    /// outlive the pool). A topology that is not this machine (synthetic, XML, fallback) is
    /// not asked: that is logged once per process (info) and stacks stay unbound.
    /// Precondition: on the owner thread, before acquire().
    void bindToNode(const numa::Topology* topology, unsigned node) noexcept;
    /// Whether the stacks it maps are being bound to a node: bindToNode() was given this
    /// machine's topology and no binding has been refused. Any thread (racy read).
    [[nodiscard]] bool nodeBound() const noexcept { return nodeBound_.load(std::memory_order_relaxed); }

    /// A stack of at least `usableSize` bytes (its class's size, classSize()). Owner thread.
    /// No system call when the class has a warm or cold stack; maps a slab otherwise.
    Result<Stack> acquire(size_t usableSize) noexcept;
    /// The same from any thread: a spare of the class if one is set aside, else a stack mapped
    /// alone (bound to the pool's node; unmapped on release). A miss asks the owner for spares.
    Result<Stack> acquireForeign(size_t usableSize) noexcept;
    /// Takes a stack back (any thread). A stack mapped alone (pool == nullptr) is unmapped.
    static void release(const Stack& stack) noexcept;

    /// Owner maintenance: files the stacks other threads released, sets spares aside when asked,
    /// and scavenges when due (reads the clock only while some class has stacks to trim).
    void maintain() noexcept;
    /// When scavenge() next has work: UINT64_MAX while no class holds more warm stacks than it
    /// keeps. Owner thread.
    [[nodiscard]] uint64_t nextScavengeNs() const noexcept { return nextScavengeNs_; }
    /// Gives the pages of warm stacks unused for a whole period back to the kernel (see above)
    /// if `nowNs` is at or past nextScavengeNs(). Owner thread.
    void scavenge(uint64_t nowNs) noexcept;
    /// Scavenges as if every period had passed with nothing used: all warm stacks but the kept
    /// ones lose their pages now. Owner thread. Used by the tests; no runtime path calls it yet.
    void trimNow() noexcept;

    /// The usable size of the class for `usableSize`; 0 above kMaxClassSize.
    [[nodiscard]] static size_t classSize(size_t usableSize) noexcept;

    // Counters (any thread, racy reads).
    [[nodiscard]] uint64_t mapped() const noexcept { return mapped_.load(std::memory_order_relaxed); }
    [[nodiscard]] uint64_t trims() const noexcept { return trims_.load(std::memory_order_relaxed); }
    [[nodiscard]] uint64_t slabs() const noexcept { return slabs_.load(std::memory_order_relaxed); }
    [[nodiscard]] uint64_t warm() const noexcept { return warm_.load(std::memory_order_relaxed); }
    [[nodiscard]] uint64_t inUse() const noexcept { return inUse_.load(std::memory_order_relaxed); }

    /// Maps a stack of `usableSize` bytes (rounded up to pages) plus a guard page, alone.
    static Result<Stack> mapSingle(size_t usableSize) noexcept;
    static void unmapSingle(const Stack& stack) noexcept;
    static size_t pageSize() noexcept;
    /// Whether guard pages are guard regions here (probed once per process).
    [[nodiscard]] static bool guardRegions() noexcept;

private:
    struct Slab;
    struct FreeNode : MpscNode {
        Stack stack;
        FreeNode* prev = nullptr;  // warm list, towards the most recent; spares: unused
        FreeNode* nextFree = nullptr;
    };
    struct SizeClass {
        size_t usable = 0;
        size_t stride = 0;      // guard + usable
        unsigned perSlab = 0;
        size_t keepWarm = 0;
        FreeNode* head = nullptr;  // most recently released
        FreeNode* tail = nullptr;  // least recently released
        size_t warm = 0;
        size_t lowWater = 0;       // the fewest warm stacks since the last scavenge
        Slab* partial = nullptr;   // slabs with a cold stack
        std::atomic<FreeNode*> spares{nullptr};
    };

    static FreeNode* nodeOf(const Stack& stack) noexcept;
    Result<Stack> acquireOwned(SizeClass& c, unsigned cls) noexcept;
    Result<Slab*> mapSlab(SizeClass& c, unsigned cls) noexcept;
    void unmapSlab(SizeClass& c, Slab* slab) noexcept;
    void pushWarm(SizeClass& c, Stack stack) noexcept;  // by value: the node it writes may hold the caller's copy
    FreeNode* popWarm(SizeClass& c) noexcept;
    void makeCold(SizeClass& c, const Stack& stack) noexcept;
    void fileReleased(Stack stack) noexcept;
    void drainRemote() noexcept;
    void refillSpares() noexcept;
    void trim(bool all) noexcept;
    void armScavenge() noexcept;
    // Binds a freshly mapped area to node_; on refusal logs once and stops binding. Any thread.
    void bindMemory(char* p, size_t bytes) noexcept;

    std::array<SizeClass, kClassCount> classes_{};
    const void* ownerToken_ = nullptr;
    uint64_t scavengePeriodNs_;
    uint64_t nextScavengeNs_ = UINT64_MAX;
    bool scavengeWanted_ = false;   // some class went above keepWarm since the last scavenge
    unsigned maintainTurns_ = 0;
    Slab* slabList_ = nullptr;      // every slab, for the destructor
    std::atomic<uint32_t> sparesWanted_{0};  // bit per class, set by acquireForeign() misses
    std::atomic<uint64_t> mapped_{0};  // stacks obtained from mmap (slab capacity plus singles)
    std::atomic<uint64_t> trims_{0};   // madvise calls giving warm stacks' pages back
    std::atomic<uint64_t> slabs_{0};   // slabs mapped now
    std::atomic<uint64_t> warm_{0};    // warm stacks, all classes
    std::atomic<uint64_t> inUse_{0};   // stacks of its slabs out of the pool (spares count as out)
    // Written once by bindToNode() in the carrier's set-up, before any fiber is spawned on it.
    const numa::Topology* topology_ = nullptr;
    unsigned node_ = 0;
    // True from bindToNode() (with this machine's topology) until the first refused binding.
    std::atomic<bool> nodeBound_{false};
    IntrusiveMpscQueue remote_;
};

}  // namespace spindle::detail
