// SPDX-License-Identifier: Apache-2.0
#pragma once
/// WaiterTable: the process-wide table of parked waiters, keyed by address, on which FiberFutex and
/// FiberMutex are built, as the kernel's futex hash is for pthreads.
///
/// A waiter is a Waiter node in the waiting fiber's (or thread's) own frame. It names a key, the
/// address of a primitive or an address derived from one, and embeds the FiberFuture it parks on.
/// enqueueWaiter() links the node into the bucket its key hashes to; releaseWaiters() unlinks every
/// node of a key and sets their futures; releaseOne() does that for the oldest one; removeWaiter()
/// takes a node back out (a timeout, or a waiter that finds it need not park after all). Nothing is
/// allocated per wait, and the table never touches the memory at a key.
///
/// Layout: shardCount() buckets, a power of two, at least 64 and at least 4 per PU of the machine.
/// Each bucket fills one cache line: a test-and-test-and-set spinlock and the head and tail of an
/// intrusive doubly linked list. Groups of 4 consecutive buckets belong to one PU and lie on that PU's
/// NUMA node (numa::Topology::allocOnNode, one mapping per node); where hwloc cannot read the machine
/// the buckets come from the heap, which is said once at info level. A key's bucket is its address,
/// Fibonacci-hashed, so neighbouring keys (a primitive's two keys, `this` and `this + 1`) spread out.
///
/// Thread-safety: every member may be called at once from any fiber or plain thread, of any runtime.
/// A bucket's lock is held only for list surgery, never across a wake-up or a park, so no carrier
/// waits on it for long; a spinner yields its CPU if the holder seems to be preempted.
/// Memory ordering: the bucket lock (acquire on lock, release on unlock) orders every change to a
/// list. A waker sets each future after it released the lock, and FiberFuture::set()/wait() carry
/// release/acquire to the woken waiter. Primitives rely on this handshake, which needs no fence: the
/// waiter (1) publishes in its own state word that it is about to queue, (2) enqueues, (3) re-reads
/// the state word; the waker (a) changes the state word, then (b) calls releaseWaiters(). If (b) took
/// the lock before (2) did, the lock carries (a) to (3); otherwise (b) finds the node.
/// Fairness: first in, first out per key: releaseWaiters() sets a key's futures in the order they
/// were enqueued and releaseOne() takes the oldest. In what order the woken waiters then run is up to
/// the carriers; primitives that wake all and let them retry guarantee nothing beyond that.
/// Cost: enqueueWaiter() and removeWaiter(): one bucket lock round trip (two locked instructions when
/// uncontended) and O(1) list work. releaseWaiters() and releaseOne(): the same plus a walk of the
/// bucket's list, which holds every key that hashes there (short: waiters are spread over at least
/// 64 buckets), plus one FiberFuture::set() per woken waiter outside the lock. Unrelated keys that
/// share a bucket contend for its lock.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "base/check.h"
#include "core/fiber_future.h"
#include "numa/topology.h"

namespace spindle::detail {

/// One parked (or about to park) waiter; lives in the waiter's frame.
/// Precondition: it stays alive until it is out of the table, that is until removeWaiter() returned
/// true or `ready` was set (wait() on it returned).
struct Waiter {
    // The table's bookkeeping, guarded by the bucket lock of `key`.
    static constexpr uint32_t kQueued = 1;  // linked into a bucket

    Waiter() noexcept = default;
    Waiter(const Waiter&) = delete;
    Waiter& operator=(const Waiter&) = delete;
    ~Waiter() { SPINDLE_ASSERT((flags & kQueued) == 0 && "a Waiter died while still in the WaiterTable"); }

    const void* key = nullptr;
    Waiter* next = nullptr;
    Waiter* prev = nullptr;
    FiberFuture ready;  // set(0) by releaseWaiters() or releaseOne()
    uint32_t flags = 0;
};

class WaiterTable {
public:
    static constexpr size_t kMinShards = 64;
    static constexpr size_t kShardsPerPu = 4;  // also the size of a group that lives on one node

    /// The process-wide table, built on first use from this machine's topology and never destroyed, so
    /// that threads still running at exit can use it. Runtime::start() builds it before pinning its
    /// carriers, so the topology it reads is the process's, not one carrier's PU.
    static WaiterTable& instance() noexcept;

    /// A table shaped by `topology` (node placement; its PU count or the online CPU count, whichever
    /// is larger, sets the size), or by the online CPU count on the heap when there is none.
    explicit WaiterTable(std::optional<numa::Topology> topology) noexcept;
    ~WaiterTable();
    WaiterTable(const WaiterTable&) = delete;
    WaiterTable& operator=(const WaiterTable&) = delete;

    /// Queues `waiter` on `key`, behind the waiters already there.
    /// Precondition: `waiter` is not in the table and its future is unset and has no waiter.
    void enqueueWaiter(const void* key, Waiter* waiter) noexcept;

    /// Takes every waiter of `key` out of the table and sets their futures, oldest first; returns how
    /// many. A woken waiter may destroy its node as soon as its future is set, so nothing is read from a
    /// node after its set().
    size_t releaseWaiters(const void* key) noexcept;

    /// Takes the oldest waiter of `key` out of the table and sets its future; returns 1, or 0 if none.
    size_t releaseOne(const void* key) noexcept;

    /// Takes `waiter` back out of the table. Returns false if a release took it first: its future is
    /// then set, or about to be, and the caller must wait() for it before the node may die.
    /// Precondition: `waiter` was enqueued on `key`.
    [[nodiscard]] bool removeWaiter(const void* key, Waiter* waiter) noexcept;

    /// Waiters queued on `key` right now (takes the bucket lock; for tests and introspection).
    [[nodiscard]] size_t countWaiters(const void* key) const noexcept;

    [[nodiscard]] size_t shardCount() const noexcept { return shardCount_; }
    /// The bucket `key` hashes to, in [0, shardCount()).
    [[nodiscard]] size_t shardOf(const void* key) const noexcept {
        return static_cast<size_t>((reinterpret_cast<uintptr_t>(key) * kFibonacci) >> shift_);
    }
    /// The logical NUMA node the shard's memory was asked to live on (0 without a topology).
    [[nodiscard]] unsigned shardNode(size_t shard) const noexcept { return nodeOfGroup_[shard / kShardsPerPu]; }
    /// Whether the buckets came from numa::Topology::allocOnNode (false: from the heap).
    [[nodiscard]] bool nodeLocal() const noexcept { return !chunks_.empty(); }

private:
    struct Bucket;
    struct Chunk {  // one allocOnNode mapping: every group of one node
        void* memory;
        size_t bytes;
    };
    static constexpr uint64_t kFibonacci = 0x9E3779B97F4A7C15ull;  // 2^64 / golden ratio, odd

    [[nodiscard]] Bucket& bucketOf(const void* key) const noexcept { return *buckets_[shardOf(key)]; }

    size_t shardCount_ = 0;                    // invariant: a power of two, >= kMinShards
    unsigned shift_ = 0;                       // 64 - log2(shardCount_)
    std::unique_ptr<Bucket*[]> buckets_;       // shard index -> its bucket, wherever it lives
    std::vector<unsigned> nodeOfGroup_;        // group (shard / kShardsPerPu) -> logical node
    std::optional<numa::Topology> topology_;   // frees the chunks
    std::vector<Chunk> chunks_;                // node-local memory (empty: heapBuckets_ holds them)
    std::unique_ptr<Bucket[]> heapBuckets_;
};

}  // namespace spindle::detail
