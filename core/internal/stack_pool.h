#pragma once
/// Per-carrier pool of fiber stacks of one size, each with a PROT_NONE guard page.
///
/// acquire() and release() on the owner thread touch only a free list threaded
/// through the cached stacks themselves: no system call and no allocation on
/// a warm pool. The first `hotCount` cached stacks are kept as they are; the
/// rest are handed back to the kernel with MADV_DONTNEED (the mapping and its
/// guard stay, the pages go), so a burst of fibers does not pin memory for
/// ever. Past `maxCached` a released stack is unmapped.
///
/// Thread-safety: acquire() on the owner thread only. release() from any
/// thread: a stranger's release goes through a lock-free list the owner drains.
/// Errors: acquire() returns ENOMEM when mmap or mprotect fail.
///
/// Memory: after bindToNode(), each stack the pool maps is bound to the carrier's NUMA node
/// (numa::Topology::bindArea), so a fiber's stack stays node-local even when the fiber is
/// stolen and first touches it on another node. A refused binding is logged once and the
/// pool maps unbound stacks from then on; acquire() never fails because of it.

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "base/result.h"
#include "core/internal/fiber.h"
#include "core/internal/mpsc_queue.h"

namespace spindle::numa {
class Topology;
}  // namespace spindle::numa

namespace spindle::detail {

class StackPool {
public:
    static constexpr size_t kDefaultHotCount = 16;
    static constexpr size_t kDefaultMaxCached = 1024;

    explicit StackPool(size_t usableSize, size_t hotCount = kDefaultHotCount,
                       size_t maxCached = kDefaultMaxCached) noexcept;
    ~StackPool();
    StackPool(const StackPool&) = delete;
    StackPool& operator=(const StackPool&) = delete;

    /// Binds the pool to the calling thread (the carrier's).
    void claimForThisThread() noexcept;
    [[nodiscard]] bool ownedByThisThread() const noexcept;

    /// From now on, binds each stack it maps to NUMA node `node` of `topology` (which must
    /// outlive the pool). A topology that is not this machine (synthetic, XML, fallback) is
    /// not asked: that is logged once per process (info) and stacks stay unbound.
    /// Precondition: on the owner thread, before acquire().
    void bindToNode(const numa::Topology* topology, unsigned node) noexcept;
    /// Whether the stacks it maps are being bound to a node: bindToNode() was given this
    /// machine's topology and no binding has been refused. Any thread (racy read).
    [[nodiscard]] bool nodeBound() const noexcept { return nodeBound_.load(std::memory_order_relaxed); }

    /// A stack of usableSize() bytes. Precondition: on the owner thread.
    Result<Stack> acquire() noexcept;
    /// Takes a stack back (any thread).
    void release(Stack stack) noexcept;
    /// Files the stacks other threads released into the free list (or unmaps
    /// them past the cap). Owner thread; one relaxed load when there are none.
    void reclaimRemote() noexcept { drainRemote(); }

    [[nodiscard]] size_t usableSize() const noexcept { return usableSize_; }
    [[nodiscard]] size_t cached() const noexcept { return cachedCount_; }
    [[nodiscard]] uint64_t mapped() const noexcept { return mappedCount_.load(std::memory_order_relaxed); }

    /// map(), then binds the stack to the pool's node as acquire() does (see bindToNode()).
    /// Any thread: for a stack mapped for this pool's carrier off its thread, or of another size.
    Result<Stack> mapBound(size_t usableSize) noexcept;
    /// Maps a stack of `usableSize` bytes (rounded up to pages) plus a guard page.
    static Result<Stack> map(size_t usableSize) noexcept;
    static void unmap(const Stack& stack) noexcept;
    static size_t pageSize() noexcept;

private:
    struct FreeNode : MpscNode {
        Stack stack;
        FreeNode* nextFree = nullptr;
    };
    static FreeNode* nodeOf(const Stack& stack) noexcept;
    void pushLocal(Stack stack) noexcept;
    void drainRemote() noexcept;
    // Binds a freshly mapped stack to node_; on refusal logs once and stops binding. Any thread.
    void bindStack(const Stack& stack) noexcept;

    size_t usableSize_;
    size_t hotCount_;
    size_t maxCached_;
    const void* ownerToken_ = nullptr;
    FreeNode* freeList_ = nullptr;
    size_t cachedCount_ = 0;
    std::atomic<uint64_t> mappedCount_{0};  // written by the owner, read by anyone
    // Written once by bindToNode() in the carrier's set-up, before any fiber is spawned on it.
    const numa::Topology* topology_ = nullptr;
    unsigned node_ = 0;
    // True from bindToNode() (with this machine's topology) until the first refused binding.
    std::atomic<bool> nodeBound_{false};
    IntrusiveMpscQueue remote_;
};

}  // namespace spindle::detail
