// SPDX-License-Identifier: Apache-2.0
// Tests for FiberMultiLock (core/fiber_multilock.h): the ScopedLock life cycle, try_lock, per-key FIFO
// hand-off (with the queue moving intact from holder to holder), distinct keys proceeding independently,
// many keys held at once (the treap), 64 keys under many contending fibers and threads with a per-key
// holder counter that must never exceed one, and (debug builds) the assertion against re-locking a held key.
//
// No verdict depends on timing: sleeps only make the interesting interleaving likely.

#include "core/fiber_multilock.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "core/fiber.h"
#include "core/runtime.h"
#include "tests/core/with_runtime.h"

namespace spindle {
namespace {

using namespace std::chrono_literals;
using namespace testing_support;

constexpr int kContendRounds = kSanitized ? 1'500 : 4'000;
constexpr int kTreapKeys = kSanitized ? 5'000 : 20'000;

using FiberMultiLockTest = WithRuntime;

// ---- basics -----------------------------------------------------------------------------------------------------

TEST_F(FiberMultiLockTest, ScopedLockHoldsUntilUnlockOrDestruction) {
    FiberMultiLock ml;
    {
        FiberMultiLock::ScopedLock a;
        EXPECT_FALSE(a.owns_lock());
        ml.lock(7, &a);
        EXPECT_TRUE(a.owns_lock());
        EXPECT_EQ(a.key(), 7u);
        FiberMultiLock::ScopedLock b;
        EXPECT_FALSE(ml.try_lock(7, &b)) << "the key is held";
        EXPECT_FALSE(b.owns_lock());
        EXPECT_TRUE(ml.try_lock(8, &b)) << "another key is free";
        ml.unlock(&a);
        EXPECT_FALSE(a.owns_lock());
        EXPECT_TRUE(ml.try_lock(7, &a)) << "unlock() freed it, and the ScopedLock can be reused";
    }  // both destructors unlock
    FiberMultiLock::ScopedLock c;
    FiberMultiLock::ScopedLock d;
    EXPECT_TRUE(ml.try_lock(7, &c));
    EXPECT_TRUE(ml.try_lock(8, &d));
    // Keys at the edges of the range are ordinary keys.
    FiberMultiLock::ScopedLock lo;
    FiberMultiLock::ScopedLock hi;
    EXPECT_TRUE(ml.try_lock(0, &lo));
    EXPECT_TRUE(ml.try_lock(UINT64_MAX, &hi));
}

TEST_F(FiberMultiLockTest, ThreadAndFiberExcludeEachOther) {
    for (int round = 0; round < 20; ++round) {
        FiberMultiLock ml;
        int shared = 0;  // guarded by key 1
        std::atomic<bool> held{false};
        auto fiber = on(round % 2, [&] {
            FiberMultiLock::ScopedLock s;
            ml.lock(1, &s);
            held.store(true);
            if (round % 2 == 0) { (void)this_fiber::sleep_for(300us); }
            shared = 1;
        });
        yieldUntil([&] { return held.load(); });
        {
            FiberMultiLock::ScopedLock s;
            ml.lock(1, &s);  // a plain thread parks until the fiber's ScopedLock goes
            EXPECT_EQ(shared, 1) << "round " << round;
            shared = 2;
        }
        fiber.join();
    }
}

// ---- FIFO -------------------------------------------------------------------------------------------------------

TEST_F(FiberMultiLockTest, EachKeyIsGrantedInArrivalOrder) {
    // Everything pinned on carrier 0, so the waiters queue in spawn order. Two keys are queued for at once,
    // interleaved, to show that each key keeps its own order.
    constexpr int kWaiters = 8;
    auto driver = on(0, [] {
        FiberMultiLock ml;
        std::atomic<int> entered{0};
        std::vector<int> order[2];  // carrier 0 only
        std::vector<FiberHandle<void>> waiters;
        auto first = std::make_unique<FiberMultiLock::ScopedLock[]>(2);
        ml.lock(100, &first[0]);
        ml.lock(200, &first[1]);
        for (int i = 0; i < kWaiters; ++i) {
            const int k = i % 2;
            waiters.push_back(spindle::spawn(
                                  [&, i, k] {
                                      FiberMultiLock::ScopedLock s;
                                      entered.fetch_add(1);
                                      ml.lock(k == 0 ? 100 : 200, &s);  // parks without yielding first
                                      order[k].push_back(i);
                                      // Yield while holding: the next waiter must still wait for us.
                                      this_fiber::yield();
                                  },
                                  SpawnOptions{.carrier = 0, .pinned = true})
                                  .value());
            yieldUntil([&] { return entered.load() == i + 1; });
        }
        // A try_lock while waiters are queued fails, and so does one right after the hand-off.
        FiberMultiLock::ScopedLock probe;
        bool ok = !ml.try_lock(100, &probe);
        ml.unlock(&first[0]);
        ok = ok && !ml.try_lock(100, &probe);
        ml.unlock(&first[1]);
        for (auto& w : waiters) { w.join(); }
        ok = ok && ml.try_lock(100, &probe) && ml.try_lock(200, &first[1]);
        for (int k = 0; k < 2; ++k) {
            for (int j = 0; j < kWaiters / 2; ++j) {
                ok = ok && order[k].size() == kWaiters / 2 && order[k][static_cast<size_t>(j)] == 2 * j + k;
            }
        }
        return ok;
    });
    EXPECT_TRUE(driver.join());
}

TEST_F(FiberMultiLockTest, FifoHoldsWhenKeysAreHandedOnFromOtherCarriersAndThreads) {
    // The waiters queue in a known order on carrier 0, but each holder has its key unlocked by someone else:
    // a fiber on carrier 1 or a plain thread. So every hand-off starts away from the waiters' carrier and
    // wakes the successor across threads; the queue must still move intact, in order.
    constexpr int kWaiters = 9;
    auto driver = on(0, [] {
        FiberMultiLock ml;
        std::atomic<int> entered{0};
        std::vector<int> order;  // guarded by key 5
        std::vector<FiberHandle<void>> waiters;
        FiberMultiLock::ScopedLock gate;
        ml.lock(5, &gate);
        for (int i = 0; i < kWaiters; ++i) {
            waiters.push_back(spindle::spawn(
                                  [&, i] {
                                      FiberMultiLock::ScopedLock s;
                                      entered.fetch_add(1);
                                      ml.lock(5, &s);
                                      order.push_back(i);
                                      if (i % 3 == 2) {
                                          std::thread([&] { ml.unlock(&s); }).join();
                                      } else {
                                          spindle::spawn([&] { ml.unlock(&s); },
                                                         SpawnOptions{.carrier = 1, .pinned = true})
                                              .value()
                                              .join();
                                      }
                                  },
                                  SpawnOptions{.carrier = 0, .pinned = true})
                                  .value());
            yieldUntil([&] { return entered.load() == i + 1; });
        }
        ml.unlock(&gate);
        for (auto& w : waiters) { w.join(); }
        bool ok = order.size() == static_cast<size_t>(kWaiters);
        for (int i = 0; ok && i < kWaiters; ++i) { ok = order[static_cast<size_t>(i)] == i; }
        return ok;
    });
    EXPECT_TRUE(driver.join());
}

// ---- independence -----------------------------------------------------------------------------------------------

TEST_F(FiberMultiLockTest, DistinctKeysProceedIndependently) {
    // A holds key 1 and a waiter queues behind it; B must still get key 2 (and key 3 by try_lock) while
    // key 1 stays held. A waits for B's word before it lets go, so if B were held up by key 1 both would
    // hang (a correct lock never does; the test has no deadline to meet).
    FiberMultiLock ml;
    std::atomic<bool> aHolds{false};
    std::atomic<bool> bDone{false};
    std::atomic<bool> waiterGot{false};
    auto a = on(0, [&] {
        FiberMultiLock::ScopedLock s;
        ml.lock(1, &s);
        aHolds.store(true);
        yieldUntil([&] { return bDone.load(); });
    });
    yieldUntil([&] { return aHolds.load(); });
    auto waiter = on(1, [&] {
        FiberMultiLock::ScopedLock s;
        ml.lock(1, &s);
        waiterGot.store(true);
    });
    auto b = on(1, [&] {
        FiberMultiLock::ScopedLock s2;
        FiberMultiLock::ScopedLock s3;
        ml.lock(2, &s2);
        const bool got3 = ml.try_lock(3, &s3);
        const bool key1Busy = !waiterGot.load();
        bDone.store(true);
        return got3 && key1Busy;
    });
    EXPECT_TRUE(b.join());
    a.join();
    waiter.join();
    EXPECT_TRUE(waiterGot.load());
}

TEST_F(FiberMultiLockTest, ManyKeysHeldAtOnce) {
    // Exercises the treap: thousands of keys held together (dense, sparse and adversarially ordered), each
    // exactly once, then released in a shuffled order, with lookups in between.
    std::mt19937_64 rng(7);
    std::vector<uint64_t> keys;
    for (int i = 0; i < kTreapKeys / 2; ++i) { keys.push_back(static_cast<uint64_t>(i)); }    // ascending run
    for (int i = 0; i < kTreapKeys / 2; ++i) { keys.push_back(rng() | (uint64_t{1} << 63)); }  // sparse
    std::sort(keys.begin() + kTreapKeys / 2, keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
    FiberMultiLock ml;
    auto held = std::make_unique<FiberMultiLock::ScopedLock[]>(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) { ASSERT_TRUE(ml.try_lock(keys[i], &held[i])) << keys[i]; }
    FiberMultiLock::ScopedLock probe;
    for (size_t i = 0; i < keys.size(); i += 97) { EXPECT_FALSE(ml.try_lock(keys[i], &probe)) << keys[i]; }
    EXPECT_TRUE(ml.try_lock(uint64_t{1} << 40, &probe)) << "a key never taken";
    ml.unlock(&probe);

    std::vector<size_t> idx(keys.size());
    for (size_t i = 0; i < idx.size(); ++i) { idx[i] = i; }
    std::shuffle(idx.begin(), idx.end(), rng);
    for (size_t n = 0; n < idx.size(); ++n) {
        ml.unlock(&held[idx[n]]);
        if (n % 101 == 0) {
            // The key just freed is free; one still held is still held.
            EXPECT_TRUE(ml.try_lock(keys[idx[n]], &probe));
            ml.unlock(&probe);
            if (n + 1 < idx.size()) { EXPECT_FALSE(ml.try_lock(keys[idx[n + 1]], &probe)); }
        }
    }
    for (size_t i = 0; i < keys.size(); i += 53) {
        EXPECT_TRUE(ml.try_lock(keys[i], &probe));
        ml.unlock(&probe);
    }
}

// ---- contention -------------------------------------------------------------------------------------------------

TEST_F(FiberMultiLockTest, SixtyFourKeysManyContendersNeverTwoHolders) {
    constexpr int kKeys = 64;
    FiberMultiLock ml;
    std::vector<std::atomic<int>> holders(kKeys);
    std::vector<int64_t> perKey(kKeys, 0);  // each slot guarded by its key: a lost exclusion loses counts
    std::atomic<int> violations{0};
    std::atomic<int64_t> entries{0};
    auto worker = [&](unsigned seed) {
        std::minstd_rand rng(seed);
        for (int r = 0; r < kContendRounds; ++r) {
            // Skewed: half the traffic on 4 hot keys, so queues form; the rest spread over all 64.
            const auto key = static_cast<uint64_t>(rng() % 2 == 0 ? rng() % 4 : rng() % kKeys);
            FiberMultiLock::ScopedLock s;
            if (rng() % 8 == 0) {
                if (!ml.try_lock(key, &s)) { continue; }
            } else {
                ml.lock(key, &s);
            }
            if (holders[key].fetch_add(1) != 0) { violations.fetch_add(1); }
            ++perKey[key];
            if (rng() % 4 == 0) { this_fiber::yield(); }
            if (holders[key].fetch_sub(1) != 1) { violations.fetch_add(1); }
            entries.fetch_add(1, std::memory_order_relaxed);
        }
    };
    std::vector<FiberHandle<void>> fibers;
    for (unsigned i = 0; i < 16; ++i) { fibers.push_back(anywhere([&, i] { worker(i); })); }
    std::vector<std::thread> threads;
    for (unsigned i = 0; i < 3; ++i) { threads.emplace_back([&, i] { worker(1000 + i); }); }
    for (auto& f : fibers) { f.join(); }
    for (auto& t : threads) { t.join(); }
    EXPECT_EQ(violations.load(), 0);
    int64_t sum = 0;
    for (int64_t c : perKey) { sum += c; }
    EXPECT_EQ(sum, entries.load()) << "an increment under a key was lost: two holders at once";
    // Every key is free again.
    for (int k = 0; k < kKeys; ++k) {
        FiberMultiLock::ScopedLock s;
        EXPECT_TRUE(ml.try_lock(static_cast<uint64_t>(k), &s)) << k;
    }
}

#ifndef NDEBUG
// ---- misuse (debug builds) --------------------------------------------------------------------------------------

void relockAHeldKey() {
    FiberMultiLock ml;
    FiberMultiLock::ScopedLock a;
    FiberMultiLock::ScopedLock b;
    ml.lock(1, &a);
    ml.lock(1, &b);  // would park forever behind ourselves
}

TEST(FiberMultiLockDeathTest, LockingAKeyTheCallerHoldsAsserts) {
    // Unless the environment chose (the aarch64 flavour under qemu-user sets "fast": threadsafe re-executes
    // the binary, which qemu-user cannot do for a foreign one).
    if (std::getenv("GTEST_DEATH_TEST_STYLE") == nullptr) { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
    EXPECT_DEATH(relockAHeldKey(), "not reentrant");
}
#endif

}  // namespace
}  // namespace spindle
