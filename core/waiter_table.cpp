// SPDX-License-Identifier: Apache-2.0
#include "core/internal/waiter_table.h"

#include <sys/sysinfo.h>

#include <algorithm>
#include <bit>
#include <new>

#include "base/log.h"
#include "core/internal/sync_support.h"

namespace spindle::detail {

/// One shard: a TTAS spinlock and an intrusive FIFO of waiters, in one cache line.
/// Invariant: every node in the list has kQueued set and its `key` hashes here; `head` is the oldest.
struct alignas(64) WaiterTable::Bucket {
    SpinLock spin;
    IntrusiveFifo<Waiter> list;

    void lock() noexcept { spin.lock(); }
    void unlock() noexcept { spin.unlock(); }

    void append(Waiter* w) noexcept {
        list.pushBack(w);
        w->flags |= Waiter::kQueued;
    }
    void unlink(Waiter* w) noexcept {
        list.unlink(w);
        w->flags &= ~Waiter::kQueued;
    }
};

namespace {

// Sets the futures of a list that was unlinked under the lock (linked through `next`).
size_t wakeList(Waiter* w) noexcept {
    size_t n = 0;
    while (w != nullptr) {
        Waiter* next = w->next;  // read before set(): the node may die right after it
        w->ready.set(0);
        w = next;
        ++n;
    }
    return n;
}

std::optional<numa::Topology> machineTopology() noexcept {
    auto topo = numa::Topology::machine();
    if (!topo) {
        log::info("waiter table: hwloc could not read this machine ({}); its buckets come from the heap",
                  topo.error().message());
        return std::nullopt;
    }
    return std::optional<numa::Topology>(std::move(*topo));
}

}  // namespace

WaiterTable& WaiterTable::instance() noexcept {
    // Never destroyed: a thread may still lock a mutex while static destructors run at exit.
    static WaiterTable* const table = new WaiterTable(machineTopology());
    return *table;
}

WaiterTable::WaiterTable(std::optional<numa::Topology> topology) noexcept : topology_(std::move(topology)) {
    static_assert(sizeof(Bucket) == 64, "one bucket per cache line");
    const size_t topoPus = topology_ ? topology_->pus().size() : 0;
    const size_t pus = std::max<size_t>({topoPus, static_cast<size_t>(::get_nprocs()), 1});
    shardCount_ = std::bit_ceil(std::max(kMinShards, kShardsPerPu * pus));
    shift_ = 64u - static_cast<unsigned>(std::countr_zero(shardCount_));
    const size_t groups = shardCount_ / kShardsPerPu;

    // Group g belongs to the PU at position g of the topology's list (wrapping round when the table has
    // more groups than the topology has PUs).
    nodeOfGroup_.assign(groups, 0);
    if (topoPus > 0) {
        for (size_t g = 0; g < groups; ++g) { nodeOfGroup_[g] = topology_->memoryNodeOf(topology_->pus()[g % topoPus].os); }
    }
    buckets_ = std::make_unique<Bucket*[]>(shardCount_);

    if (topology_) {
        // One mapping per node, holding that node's groups in group order.
        const unsigned nodes = topology_->nodeCount();
        std::vector<size_t> groupsOn(nodes, 0);
        for (unsigned node : nodeOfGroup_) { ++groupsOn[node]; }
        std::vector<Bucket*> next(nodes, nullptr);
        bool failed = false;
        for (unsigned node = 0; node < nodes && !failed; ++node) {
            if (groupsOn[node] == 0) { continue; }
            const size_t bytes = groupsOn[node] * kShardsPerPu * sizeof(Bucket);
            auto memory = topology_->allocOnNode(bytes, node);
            if (!memory) {
                log::info("waiter table: no node-local memory for node {} ({}); its buckets come from the heap", node,
                          memory.error().message());
                failed = true;
                break;
            }
            chunks_.push_back(Chunk{*memory, bytes});
            next[node] = static_cast<Bucket*>(*memory);
        }
        if (!failed) {
            for (size_t shard = 0; shard < shardCount_; ++shard) {
                buckets_[shard] = new (next[shardNode(shard)]++) Bucket();  // the mapping is page-aligned
            }
            return;
        }
        for (const Chunk& c : chunks_) { topology_->freeOnNode(c.memory, c.bytes); }
        chunks_.clear();
    }
    heapBuckets_ = std::make_unique<Bucket[]>(shardCount_);
    for (size_t shard = 0; shard < shardCount_; ++shard) { buckets_[shard] = &heapBuckets_[shard]; }
}

WaiterTable::~WaiterTable() {
    for (size_t shard = 0; shard < shardCount_; ++shard) {
        SPINDLE_ASSERT(buckets_[shard]->list.empty() && "a WaiterTable destroyed with waiters in it");
    }
    for (const Chunk& c : chunks_) { topology_->freeOnNode(c.memory, c.bytes); }  // Bucket is trivially destructible
}

void WaiterTable::enqueueWaiter(const void* key, Waiter* waiter) noexcept {
    SPINDLE_ASSERT((waiter->flags & Waiter::kQueued) == 0);
    Bucket& b = bucketOf(key);
    waiter->key = key;
    b.lock();
    b.append(waiter);
    b.unlock();
}

size_t WaiterTable::releaseWaiters(const void* key) noexcept {
    Bucket& b = bucketOf(key);
    Waiter* first = nullptr;
    Waiter* last = nullptr;
    b.lock();
    for (Waiter* w = b.list.front(); w != nullptr;) {
        Waiter* next = w->next;
        if (w->key == key) {
            b.unlink(w);
            if (last != nullptr) { last->next = w; } else { first = w; }
            last = w;
        }
        w = next;
    }
    b.unlock();
    return wakeList(first);
}

size_t WaiterTable::releaseOne(const void* key) noexcept {
    Bucket& b = bucketOf(key);
    Waiter* found = nullptr;
    b.lock();
    for (Waiter* w = b.list.front(); w != nullptr; w = w->next) {
        if (w->key == key) {
            b.unlink(w);
            found = w;
            break;
        }
    }
    b.unlock();
    return wakeList(found);
}

bool WaiterTable::removeWaiter(const void* key, Waiter* waiter) noexcept {
    SPINDLE_ASSERT(waiter->key == key);
    Bucket& b = bucketOf(key);
    b.lock();
    const bool queued = (waiter->flags & Waiter::kQueued) != 0;
    if (queued) { b.unlink(waiter); }
    b.unlock();
    return queued;
}

size_t WaiterTable::countWaiters(const void* key) const noexcept {
    Bucket& b = bucketOf(key);
    size_t n = 0;
    b.lock();
    for (const Waiter* w = b.list.front(); w != nullptr; w = w->next) { n += w->key == key ? 1 : 0; }
    b.unlock();
    return n;
}

}  // namespace spindle::detail
