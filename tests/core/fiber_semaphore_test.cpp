// SPDX-License-Identifier: Apache-2.0
// Tests for FiberSemaphore (core/fiber_semaphore.h): counting, FIFO hand-off to queued waiters with no
// barging by try_acquire, release(n) spread over several waiters, timed acquires that time out leaving no
// trace and losing no permit (also when they race releases, fibers and threads mixed), odd durations,
// bounding concurrency to K, and the check on a negative initial count.
//
// No verdict depends on timing: sleeps and short timeouts only make the interesting interleaving likely.

#include "core/fiber_semaphore.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

#include "core/fiber.h"
#include "core/runtime.h"
#include "tests/core/with_runtime.h"

namespace spindle {
namespace {

using namespace std::chrono_literals;
using namespace testing_support;

constexpr int kRaceAttempts = kSlowRounds ? 10'000 : 20'000;
constexpr int kBoundRounds = kSlowRounds ? 1'000 : 3'000;

using FiberSemaphoreTest = WithRuntime;

// ---- counting ---------------------------------------------------------------------------------------------------

TEST_F(FiberSemaphoreTest, CountsPermits) {
    auto check = [] {
        FiberSemaphore sem(3);
        int ok = 0;
        ok += sem.available() == 3;
        ok += sem.try_acquire();
        sem.acquire();
        ok += sem.try_acquire();
        ok += !sem.try_acquire();
        ok += sem.available() == 0;
        sem.release(2);
        ok += sem.available() == 2;
        sem.release();
        ok += sem.available() == 3;
        sem.release(0);
        ok += sem.available() == 3;
        ok += sem.try_acquire_for(0s);
        ok += sem.try_acquire_until(std::chrono::steady_clock::now() - 1s);  // a permit is free: no waiting
        ok += sem.available() == 1;
        return ok;
    };
    EXPECT_EQ(check(), 11) << "on a plain thread";
    EXPECT_EQ(on(0, check).join(), 11) << "on a fiber";
}

TEST_F(FiberSemaphoreTest, AcquireParksUntilARelease) {
    for (int round = 0; round < 20; ++round) {
        FiberSemaphore sem(0);
        int payload = 0;  // written before release(), read after acquire()
        auto waiter = on(round % 2, [&] {
            sem.acquire();
            return payload;
        });
        std::thread releaser([&] {
            if (round % 2 == 0) { std::this_thread::sleep_for(200us); }
            payload = round + 1;
            sem.release();
        });
        EXPECT_EQ(waiter.join(), round + 1);
        releaser.join();
        EXPECT_EQ(sem.available(), 0);
    }
    // And a thread waiting for a fiber.
    FiberSemaphore sem(0);
    auto releaser = on(1, [&] { sem.release(); });
    sem.acquire();
    releaser.join();
    EXPECT_EQ(sem.available(), 0);
}

// ---- FIFO -------------------------------------------------------------------------------------------------------

TEST_F(FiberSemaphoreTest, QueuedWaitersAreServedInArrivalOrderAndNobodyBarges) {
    // All pinned on carrier 0: the waiters queue in spawn order, and nothing runs while the driver runs.
    constexpr int kWaiters = 6;
    auto driver = on(0, [] {
        FiberSemaphore sem(0);
        std::atomic<int> entered{0};
        std::vector<int> order;  // carrier 0 only
        std::vector<FiberHandle<void>> waiters;
        for (int i = 0; i < kWaiters; ++i) {
            waiters.push_back(spindle::spawn(
                                  [&, i] {
                                      entered.fetch_add(1);
                                      sem.acquire();  // parks without yielding first
                                      order.push_back(i);
                                  },
                                  SpawnOptions{.carrier = 0, .pinned = true})
                                  .value());
            yieldUntil([&] { return entered.load() == i + 1; });
        }
        int ok = 0;
        // One permit goes straight to the oldest waiter: a try_acquire() right after must not take it.
        for (int k = 0; k < 2; ++k) {
            sem.release(1);
            ok += !sem.try_acquire();
            ok += sem.available() == 0;
            yieldUntil([&] { return order.size() == static_cast<size_t>(k + 1); });
            ok += order.back() == k;
        }
        // Three at once go to the next three (they run in whatever order the scheduler picks); the last
        // waiter stays queued, so nothing becomes free.
        sem.release(3);
        ok += !sem.try_acquire();
        yieldUntil([&] { return order.size() == 5; });
        std::sort(order.begin() + 2, order.end());
        for (int i = 2; i < 5; ++i) { ok += order[static_cast<size_t>(i)] == i; }
        // More than the queue needs: the last waiter gets one, the remainder becomes free.
        sem.release(5);
        yieldUntil([&] { return order.size() == static_cast<size_t>(kWaiters); });
        ok += order.back() == kWaiters - 1;
        ok += sem.available() == 4;
        for (auto& w : waiters) { w.join(); }
        return ok;
    });
    EXPECT_EQ(driver.join(), 2 * 3 + 1 + 3 + 2);
}

// ---- timed acquire ------------------------------------------------------------------------------------------------

TEST_F(FiberSemaphoreTest, TryAcquireForTimesOutAndLeavesNoTrace) {
    FiberSemaphore sem(0);
    auto check = [&] {
        const auto t0 = std::chrono::steady_clock::now();
        const bool got = sem.try_acquire_for(3ms);
        return !got && std::chrono::steady_clock::now() - t0 >= 3ms && sem.available() == 0;
    };
    EXPECT_TRUE(check()) << "on a plain thread";
    EXPECT_TRUE(on(0, check).join()) << "on a fiber";
    EXPECT_FALSE(sem.try_acquire_until(std::chrono::steady_clock::now() + 1ms));
    // Nobody is left queued: the next release is a free permit, not a hand-off to a stale waiter.
    sem.release();
    EXPECT_EQ(sem.available(), 1);
    EXPECT_TRUE(sem.try_acquire());
}

TEST_F(FiberSemaphoreTest, TimedAcquireGetsAPermitReleasedInTime) {
    for (int round = 0; round < 20; ++round) {
        FiberSemaphore sem(0);
        auto waiter = on(round % 2, [&] { return sem.try_acquire_for(60s); });
        auto releaser = on((round + 1) % 2, [&] {
            if (round % 2 == 0) { (void)this_fiber::sleep_for(200us); }
            sem.release();
        });
        EXPECT_TRUE(waiter.join()) << "round " << round;
        releaser.join();
        EXPECT_EQ(sem.available(), 0);
    }
}

TEST_F(FiberSemaphoreTest, HugeTimeoutsMeanForeverNotOverflow) {
    FiberSemaphore sem(0);
    std::atomic<int> stage{0};
    auto waiter = on(0, [&] {
        int got = 0;
        stage.store(1);
        got += sem.try_acquire_for(std::chrono::hours::max());
        stage.store(2);
        got += sem.try_acquire_for(std::chrono::duration<double>(INFINITY));
        stage.store(3);
        got += sem.try_acquire_until(std::chrono::steady_clock::time_point::max());
        return got;
    });
    for (int i = 1; i <= 3; ++i) {
        yieldUntil([&] { return stage.load() == i; });
        std::this_thread::sleep_for(100us);  // usually after the waiter queued; either way it gets the permit
        sem.release();
    }
    EXPECT_EQ(waiter.join(), 3);
    EXPECT_EQ(sem.available(), 0);
}

TEST_F(FiberSemaphoreTest, TimeoutsRacingReleasesLoseNoPermit) {
    // Timed acquirers (fibers on both carriers and threads) race releases of single permits. Whatever wins
    // each race, a permit is either taken by exactly one acquirer or still free at the end:
    // acquired + available() == released.
    constexpr int kReleases = kRaceAttempts / 2;
    FiberSemaphore sem(0);
    std::atomic<int64_t> acquired{0};
    std::atomic<int64_t> timedOut{0};
    auto acquirer = [&](unsigned seed, int attempts) {
        std::minstd_rand rng(seed);
        for (int i = 0; i < attempts; ++i) {
            if (sem.try_acquire_for(std::chrono::microseconds(rng() % 50))) {
                acquired.fetch_add(1, std::memory_order_relaxed);
            } else {
                timedOut.fetch_add(1, std::memory_order_relaxed);
            }
        }
    };
    auto releaser = [&](unsigned seed, int count) {
        std::minstd_rand rng(seed);
        for (int i = 0; i < count; ++i) {
            sem.release();
            const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(rng() % 30);
            while (std::chrono::steady_clock::now() < until) { this_fiber::yield(); }
        }
    };
    constexpr int kAcquirers = 6;  // 4 fibers, 2 threads
    const int attempts = kRaceAttempts / kAcquirers;
    std::vector<FiberHandle<void>> fibers;
    for (unsigned i = 0; i < 4; ++i) { fibers.push_back(anywhere([&, i] { acquirer(i, attempts); })); }
    fibers.push_back(anywhere([&] { releaser(50, kReleases / 2); }));
    std::vector<std::thread> threads;
    threads.emplace_back([&] { acquirer(10, attempts); });
    threads.emplace_back([&] { acquirer(11, attempts); });
    threads.emplace_back([&] { releaser(51, kReleases - kReleases / 2); });
    for (auto& f : fibers) { f.join(); }
    for (auto& t : threads) { t.join(); }
    EXPECT_EQ(acquired.load() + timedOut.load(), static_cast<int64_t>(attempts) * kAcquirers);
    EXPECT_EQ(acquired.load() + sem.available(), kReleases);
    std::printf("acquired %lld, timed out %lld, left free %lld\n", static_cast<long long>(acquired.load()),
                static_cast<long long>(timedOut.load()), static_cast<long long>(sem.available()));
}

TEST_F(FiberSemaphoreTest, ShutdownEndsATimedAcquireOnAFiber) {
    FiberSemaphore sem(0);
    std::atomic<bool> started{false};
    auto waiter = on(0, [&] {
        started.store(true);
        return sem.try_acquire_for(1h);
    });
    yieldUntil([&] { return started.load(); });
    // Usually parked by now (then shutdown fires its timer); if not, shutdown refuses its timer and it gives
    // up at once. False either way.
    std::this_thread::sleep_for(2ms);
    runtime_->shutdown();
    EXPECT_FALSE(waiter.join());
    EXPECT_EQ(sem.available(), 0);
    sem.release();
    EXPECT_EQ(sem.available(), 1) << "the waiter left the queue";
}

// ---- bounding concurrency -------------------------------------------------------------------------------------------

TEST_F(FiberSemaphoreTest, NeverMoreThanKInside) {
    constexpr int kLimit = 3;
    FiberSemaphore sem(kLimit);
    std::atomic<int> inside{0};
    std::atomic<int> maxInside{0};
    std::atomic<int64_t> entries{0};
    auto worker = [&](unsigned seed, bool timed) {
        std::minstd_rand rng(seed);
        for (int r = 0; r < kBoundRounds; ++r) {
            if (timed) {
                if (!sem.try_acquire_for(std::chrono::microseconds(rng() % 100))) { continue; }
            } else {
                sem.acquire();
            }
            const int now = inside.fetch_add(1) + 1;
            int seen = maxInside.load();
            while (now > seen && !maxInside.compare_exchange_weak(seen, now)) {}
            entries.fetch_add(1, std::memory_order_relaxed);
            if (rng() % 4 == 0) { this_fiber::yield(); }
            inside.fetch_sub(1);
            sem.release();
        }
    };
    std::vector<FiberHandle<void>> fibers;
    for (unsigned i = 0; i < 8; ++i) { fibers.push_back(anywhere([&, i] { worker(i, i % 2 == 1); })); }
    std::vector<std::thread> threads;
    for (unsigned i = 0; i < 2; ++i) { threads.emplace_back([&, i] { worker(100 + i, i == 1); }); }
    for (auto& f : fibers) { f.join(); }
    for (auto& t : threads) { t.join(); }
    EXPECT_LE(maxInside.load(), kLimit);
    EXPECT_GE(maxInside.load(), 1);
    EXPECT_EQ(sem.available(), kLimit) << "every permit came back";
    EXPECT_GE(entries.load(), static_cast<int64_t>(5) * kBoundRounds) << "the untimed workers all got in";
}

// ---- misuse ---------------------------------------------------------------------------------------------------------

TEST(FiberSemaphoreDeathTest, ANegativeInitialCountIsRejected) {
    // Unless the environment chose (the aarch64 flavour under qemu-user sets "fast": threadsafe re-executes
    // the binary, which qemu-user cannot do for a foreign one).
    if (std::getenv("GTEST_DEATH_TEST_STYLE") == nullptr) { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
    EXPECT_DEATH(FiberSemaphore(-1), "negative initial count");
}

}  // namespace
}  // namespace spindle
