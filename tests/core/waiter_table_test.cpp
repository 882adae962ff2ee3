// SPDX-License-Identifier: Apache-2.0
// Tests for the waiter table (core/internal/waiter_table.h): its shape (power of two, at least 64 and 4 per PU,
// groups of 4 on their PU's node), release of every waiter of a key and of the oldest one, FIFO order, keys that
// share a bucket, removal racing with release, and fibers on two carriers and plain threads parked in it.
//
// No verdict depends on timing: where a test must know that waiters are parked, it polls countWaiters().

#include "core/internal/waiter_table.h"

#include <gtest/gtest.h>
#include <sys/sysinfo.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "core/fiber.h"
#include "core/runtime.h"
#include "numa/topology.h"
#include "tests/core/with_runtime.h"

namespace spindle::detail {
namespace {

using namespace std::chrono_literals;
using namespace testing_support;

constexpr int kChurnRounds = kSanitized ? 5'000 : 20'000;

size_t expectedShards(size_t pus) {
    pus = std::max<size_t>(pus, static_cast<size_t>(::get_nprocs()));
    return std::bit_ceil(std::max<size_t>(WaiterTable::kMinShards, WaiterTable::kShardsPerPu * pus));
}

// ---- shape --------------------------------------------------------------------------------------------------

TEST(WaiterTableShape, TheInstanceHasAPowerOfTwoShardsAtLeastFourPerPu) {
    WaiterTable& table = WaiterTable::instance();
    EXPECT_EQ(&table, &WaiterTable::instance());
    const size_t shards = table.shardCount();
    EXPECT_TRUE(std::has_single_bit(shards)) << shards;
    EXPECT_GE(shards, WaiterTable::kMinShards);
    EXPECT_GE(shards, WaiterTable::kShardsPerPu * static_cast<size_t>(::get_nprocs()));
    auto machine = numa::Topology::machine();
    if (machine) {
        EXPECT_GE(shards, WaiterTable::kShardsPerPu * machine->pus().size());
        EXPECT_TRUE(table.nodeLocal()) << "hwloc read the machine, so the buckets should come from allocOnNode";
    }
}

TEST(WaiterTableShape, GroupsOfFourLieOnTheirPusNode) {
    // Four nodes of 8 single-PU cores: 32 PUs, so at least 128 shards in 32 or more groups.
    const char* description = "numa:4 core:8 pu:1";
    auto forTable = numa::Topology::fromSynthetic(description);
    auto expected = numa::Topology::fromSynthetic(description);
    ASSERT_TRUE(forTable && expected);
    const std::vector<numa::Pu> pus = expected->pus();
    ASSERT_EQ(pus.size(), 32u);
    ASSERT_EQ(expected->nodeCount(), 4u);

    WaiterTable table(std::move(*forTable));
    EXPECT_EQ(table.shardCount(), expectedShards(pus.size()));
    EXPECT_TRUE(table.nodeLocal());
    std::vector<size_t> perNode(4, 0);
    for (size_t shard = 0; shard < table.shardCount(); ++shard) {
        const size_t group = shard / WaiterTable::kShardsPerPu;
        EXPECT_EQ(table.shardNode(shard), expected->nodeOf(pus[group % pus.size()].os)) << "shard " << shard;
        ++perNode[table.shardNode(shard)];
    }
    for (size_t n : perNode) { EXPECT_EQ(n, table.shardCount() / 4) << "every node holds a quarter of the shards"; }
}

TEST(WaiterTableShape, WithoutATopologyItUsesTheHeapAndStillWorks) {
    WaiterTable table(std::nullopt);
    EXPECT_FALSE(table.nodeLocal());
    EXPECT_EQ(table.shardCount(), expectedShards(1));
    int key = 0;
    Waiter w;
    table.enqueueWaiter(&key, &w);
    EXPECT_EQ(table.countWaiters(&key), 1u);
    EXPECT_EQ(table.releaseWaiters(&key), 1u);
    EXPECT_TRUE(w.ready.isSet());
}

TEST(WaiterTableShape, NeighbouringKeysSpreadOverShards) {
    // A primitive's two keys are adjacent bytes, and primitives sit next to each other in arrays.
    WaiterTable& table = WaiterTable::instance();
    std::vector<char> bytes(4096);
    std::vector<bool> used(table.shardCount(), false);
    for (char& b : bytes) { used[table.shardOf(&b)] = true; }
    const auto hit = static_cast<size_t>(std::count(used.begin(), used.end(), true));
    EXPECT_GE(hit, std::min<size_t>(table.shardCount(), bytes.size()) / 2) << "4096 adjacent keys in " << hit
                                                                          << " of " << table.shardCount() << " shards";
}

// ---- release and removal, single-threaded -----------------------------------------------------------------------

TEST(WaiterTable, ReleaseWaitersWakesEveryWaiterOfTheKeyAndOnlyThose) {
    WaiterTable table(std::nullopt);
    // Two keys that share a bucket, so the release must pick its own out of a mixed list.
    std::vector<char> bytes(4096);
    const void* a = &bytes[0];
    const void* b = nullptr;
    for (size_t i = 1; i < bytes.size() && b == nullptr; ++i) {
        if (table.shardOf(&bytes[i]) == table.shardOf(a)) { b = &bytes[i]; }
    }
    ASSERT_NE(b, nullptr);

    Waiter wa[4];
    Waiter wb[2];
    table.enqueueWaiter(a, &wa[0]);
    table.enqueueWaiter(b, &wb[0]);
    table.enqueueWaiter(a, &wa[1]);
    table.enqueueWaiter(a, &wa[2]);
    table.enqueueWaiter(b, &wb[1]);
    table.enqueueWaiter(a, &wa[3]);
    EXPECT_EQ(table.countWaiters(a), 4u);
    EXPECT_EQ(table.countWaiters(b), 2u);

    EXPECT_EQ(table.releaseWaiters(a), 4u);
    for (Waiter& w : wa) { EXPECT_TRUE(w.ready.isSet()); EXPECT_EQ(w.ready.result(), 0); }
    for (Waiter& w : wb) { EXPECT_FALSE(w.ready.isSet()); }
    EXPECT_EQ(table.countWaiters(a), 0u);
    EXPECT_EQ(table.countWaiters(b), 2u);
    EXPECT_EQ(table.releaseWaiters(a), 0u) << "nothing left on the key";

    EXPECT_EQ(table.releaseWaiters(b), 2u);
    for (Waiter& w : wb) { EXPECT_TRUE(w.ready.isSet()); }
}

TEST(WaiterTable, ReleaseOneTakesTheOldestFirst) {
    WaiterTable table(std::nullopt);
    int key = 0;
    Waiter w[3];
    for (Waiter& x : w) { table.enqueueWaiter(&key, &x); }
    EXPECT_EQ(table.releaseOne(&key), 1u);
    EXPECT_TRUE(w[0].ready.isSet());
    EXPECT_FALSE(w[1].ready.isSet());
    EXPECT_EQ(table.releaseOne(&key), 1u);
    EXPECT_TRUE(w[1].ready.isSet());
    EXPECT_FALSE(w[2].ready.isSet());
    EXPECT_EQ(table.releaseOne(&key), 1u);
    EXPECT_TRUE(w[2].ready.isSet());
    EXPECT_EQ(table.releaseOne(&key), 0u);
}

TEST(WaiterTable, RemoveWaiterTakesAQueuedWaiterOutAndKeepsTheOrder) {
    WaiterTable table(std::nullopt);
    int key = 0;
    Waiter w[4];
    for (Waiter& x : w) { table.enqueueWaiter(&key, &x); }
    // Out of the middle, the head and the tail.
    EXPECT_TRUE(table.removeWaiter(&key, &w[1]));
    EXPECT_TRUE(table.removeWaiter(&key, &w[0]));
    EXPECT_TRUE(table.removeWaiter(&key, &w[3]));
    EXPECT_FALSE(table.removeWaiter(&key, &w[3])) << "removing twice";
    EXPECT_EQ(table.countWaiters(&key), 1u);
    EXPECT_EQ(table.releaseOne(&key), 1u);
    EXPECT_TRUE(w[2].ready.isSet());
    for (int i : {0, 1, 3}) { EXPECT_FALSE(w[i].ready.isSet()) << i; }

    // Enqueue again after removal: the node is reusable.
    table.enqueueWaiter(&key, &w[0]);
    table.enqueueWaiter(&key, &w[1]);
    EXPECT_EQ(table.releaseOne(&key), 1u);
    EXPECT_TRUE(w[0].ready.isSet());
    EXPECT_TRUE(table.removeWaiter(&key, &w[1]));
}

TEST(WaiterTable, RemoveWaiterAfterAReleaseSaysSo) {
    WaiterTable table(std::nullopt);
    int key = 0;
    Waiter w;
    table.enqueueWaiter(&key, &w);
    EXPECT_EQ(table.releaseWaiters(&key), 1u);
    EXPECT_FALSE(table.removeWaiter(&key, &w)) << "released first: the caller must take the wake-up";
    EXPECT_EQ(w.ready.wait(), 0);
}

// ---- parked fibers and threads ------------------------------------------------------------------------------------

using WaiterTableRuntime = WithRuntime;

TEST_F(WaiterTableRuntime, ReleaseWakesParkedFibersOnBothCarriersAndThreads) {
    WaiterTable& table = WaiterTable::instance();
    constexpr int kFibers = 16;
    constexpr int kThreads = 3;
    int key = 0;
    std::atomic<int> woken{0};
    auto park = [&] {
        Waiter w;
        table.enqueueWaiter(&key, &w);
        if (w.ready.wait() == 0) { woken.fetch_add(1); }
    };
    std::vector<FiberHandle<void>> fibers;
    for (int i = 0; i < kFibers; ++i) { fibers.push_back(onUnpinned(i % 2, park)); }
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i) { threads.emplace_back(park); }

    awaitWaiters(table, &key, kFibers + kThreads);
    EXPECT_EQ(woken.load(), 0);
    EXPECT_EQ(table.releaseWaiters(&key), static_cast<size_t>(kFibers + kThreads));
    for (auto& f : fibers) { f.join(); }
    for (auto& t : threads) { t.join(); }
    EXPECT_EQ(woken.load(), kFibers + kThreads);
    EXPECT_EQ(table.countWaiters(&key), 0u);
}

TEST_F(WaiterTableRuntime, ReleaseOneWakesParkedWaitersOneAtATimeInOrder) {
    WaiterTable& table = WaiterTable::instance();
    int key = 0;
    std::vector<int> order;  // appended by each woken waiter; one runs at a time, since we wake them one by one
    std::atomic<int> done{0};
    std::vector<FiberHandle<void>> fibers;
    for (int i = 0; i < 6; ++i) {
        awaitWaiters(table, &key, static_cast<size_t>(i));  // enqueue in a known order
        fibers.push_back(onUnpinned(i % 2, [&, i] {
            Waiter w;
            table.enqueueWaiter(&key, &w);
            (void)w.ready.wait();
            order.push_back(i);
            done.fetch_add(1);
        }));
    }
    awaitWaiters(table, &key, 6);
    for (int i = 0; i < 6; ++i) {
        EXPECT_EQ(table.releaseOne(&key), 1u);
        while (done.load() != i + 1) { std::this_thread::yield(); }
    }
    for (auto& f : fibers) { f.join(); }
    EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4, 5}));
}

TEST_F(WaiterTableRuntime, RemovalRacingWithReleaseAccountsForEveryWaiter) {
    // Workers enqueue and then either park or take themselves out at once (as a timed-out waiter does); a
    // releaser sweeps the keys meanwhile. Every node must end up either removed by its owner or released
    // exactly once, and every parked worker must wake.
    WaiterTable& table = WaiterTable::instance();
    constexpr int kFibers = 4;
    constexpr int kThreads = 2;
    constexpr int kWorkers = kFibers + kThreads;
    char keys[4] = {};
    std::atomic<int> finished{0};
    std::atomic<uint64_t> removed{0};
    std::atomic<uint64_t> releasedSeen{0};  // wake-ups the workers received
    auto work = [&](int seed) {
        uint32_t x = static_cast<uint32_t>(seed) * 2654435761u + 1;
        for (int i = 0; i < kChurnRounds; ++i) {
            x = x * 1664525u + 1013904223u;
            const void* key = &keys[(x >> 8) % 4];
            Waiter w;
            table.enqueueWaiter(key, &w);
            if ((x >> 20) % 2 == 0 && table.removeWaiter(key, &w)) {
                removed.fetch_add(1, std::memory_order_relaxed);
                continue;
            }
            EXPECT_EQ(w.ready.wait(), 0);
            releasedSeen.fetch_add(1, std::memory_order_relaxed);
        }
        finished.fetch_add(1);
    };
    std::vector<FiberHandle<void>> fibers;
    for (int i = 0; i < kFibers; ++i) { fibers.push_back(onUnpinned(i % 2, [&, i] { work(i); })); }
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i) { threads.emplace_back(work, kFibers + i); }

    uint64_t released = 0;
    for (unsigned sweep = 0; finished.load() != kWorkers; ++sweep) {
        const void* key = &keys[sweep % 4];
        released += sweep % 3 == 0 ? table.releaseOne(key) : table.releaseWaiters(key);
        if (sweep % 64 == 0) { std::this_thread::yield(); }
    }
    for (auto& f : fibers) { f.join(); }
    for (auto& t : threads) { t.join(); }
    EXPECT_EQ(released, releasedSeen.load());
    EXPECT_EQ(removed.load() + releasedSeen.load(), static_cast<uint64_t>(kWorkers) * kChurnRounds);
    for (char& k : keys) { EXPECT_EQ(table.countWaiters(&k), 0u); }
}

}  // namespace
}  // namespace spindle::detail
