// SPDX-License-Identifier: Apache-2.0
// Tests for FiberMutex (core/fiber_mutex.h): try_lock and try_lock_shared against every kind of holder, shared
// holders together, writer preference (a waiting writer keeps new readers out), unlock and unlock_shared waking
// parked fibers and threads, the standard lock wrappers, a thread and fibers on two carriers sharing one mutex,
// and the unlock-versus-park race looped many times under a watchdog.
//
// No verdict depends on timing: where a test must know that a waiter is parked, it polls the waiter table.

#include "core/fiber_mutex.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <vector>

#include "core/fiber.h"
#include "core/internal/waiter_table.h"
#include "core/runtime.h"
#include "tests/core/with_runtime.h"

namespace spindle {
namespace {

using namespace std::chrono_literals;
using namespace testing_support;
using detail::WaiterTable;

constexpr int kRaceRounds = kSanitized ? 20'000 : 100'000;

// The keys FiberMutex documents: exclusive waiters under the mutex, shared ones under the byte after it.
const void* exclusiveKey(const FiberMutex& m) { return &m; }
const void* sharedKey(const FiberMutex& m) { return reinterpret_cast<const char*>(&m) + 1; }

using FiberMutexTest = WithRuntime;

// ---- try_lock and try_lock_shared ----------------------------------------------------------------------------

TEST(FiberMutex, TryLockFailsWhileHeldInEitherMode) {
    FiberMutex m;
    ASSERT_TRUE(m.try_lock());
    std::thread([&] {
        EXPECT_FALSE(m.try_lock());
        EXPECT_FALSE(m.try_lock_shared());
    }).join();
    m.unlock();

    ASSERT_TRUE(m.try_lock_shared());
    std::thread([&] {
        EXPECT_FALSE(m.try_lock()) << "a reader holds it";
        EXPECT_TRUE(m.try_lock_shared()) << "readers share";
        m.unlock_shared();
    }).join();
    m.unlock_shared();

    EXPECT_TRUE(m.try_lock()) << "free again";
    m.unlock();
}

TEST(FiberMutex, SharedHoldsAreCounted) {
    FiberMutex m;
    for (int i = 0; i < 100; ++i) { ASSERT_TRUE(m.try_lock_shared()); }
    for (int i = 0; i < 99; ++i) {
        m.unlock_shared();
        EXPECT_FALSE(m.try_lock()) << "still " << 99 - i << " readers";
    }
    m.unlock_shared();
    EXPECT_TRUE(m.try_lock());
    m.unlock();
}

TEST(FiberMutex, WorksWithTheStandardWrappers) {
    FiberMutex m;
    FiberMutex other;
    {
        std::lock_guard guard(m);
        EXPECT_FALSE(m.try_lock_shared());
    }
    {
        std::unique_lock lock(m, std::try_to_lock);
        EXPECT_TRUE(lock.owns_lock());
        lock.unlock();
        EXPECT_TRUE(m.try_lock_shared());
        m.unlock_shared();
        lock.lock();
        EXPECT_TRUE(lock.owns_lock());
    }
    {
        std::unique_lock a(m, std::defer_lock);
        std::unique_lock b(other, std::defer_lock);
        std::lock(a, b);  // needs try_lock
        EXPECT_TRUE(a.owns_lock() && b.owns_lock());
    }
    {
        std::scoped_lock both(m, other);
        EXPECT_FALSE(other.try_lock_shared());
    }
    {
        std::shared_lock r1(m);
        std::shared_lock r2(m, std::try_to_lock);
        EXPECT_TRUE(r1.owns_lock() && r2.owns_lock());
        EXPECT_FALSE(m.try_lock());
    }
    EXPECT_TRUE(m.try_lock());
    m.unlock();
}

// ---- parking and waking -------------------------------------------------------------------------------------------

TEST_F(FiberMutexTest, SharedHoldersCoexist) {
    // Every reader holds the mutex until all of them are inside: only possible if they share it.
    constexpr int kFibers = 6;
    constexpr int kThreads = 2;
    FiberMutex m;
    std::atomic<int> inside{0};
    auto reader = [&] {
        std::shared_lock lock(m);
        inside.fetch_add(1);
        while (inside.load() < kFibers + kThreads) { this_fiber::yield(); }
    };
    std::vector<FiberHandle<void>> fibers;
    for (int i = 0; i < kFibers; ++i) { fibers.push_back(onUnpinned(i % 2, reader)); }
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i) { threads.emplace_back(reader); }
    for (auto& f : fibers) { f.join(); }
    for (auto& t : threads) { t.join(); }
    EXPECT_TRUE(m.try_lock());
    m.unlock();
}

TEST_F(FiberMutexTest, UnlockWakesAParkedFiberAndAParkedThread) {
    FiberMutex m;
    int shared = 0;  // plain memory handed over by the mutex
    m.lock();        // held by this thread's proxy
    auto fiber = onUnpinned(0, [&] {
        std::lock_guard guard(m);
        shared += 1;
    });
    std::thread thread([&] {
        std::lock_guard guard(m);
        shared += 10;
    });
    awaitWaiters(exclusiveKey(m), 2);
    shared = 100;
    m.unlock();
    fiber.join();
    thread.join();
    EXPECT_EQ(shared, 111);
    EXPECT_EQ(WaiterTable::instance().countWaiters(exclusiveKey(m)), 0u);
}

TEST_F(FiberMutexTest, AFiberHolderWakesAThreadAcrossCarriers) {
    FiberMutex m;
    std::atomic<bool> held{false};
    std::atomic<bool> release{false};
    auto holder = onUnpinned(1, [&] {
        m.lock();
        held = true;
        while (!release.load()) { this_fiber::yield(); }
        m.unlock();
    });
    while (!held.load()) { std::this_thread::yield(); }
    std::thread waiter([&] {
        m.lock();
        m.unlock();
    });
    awaitWaiters(exclusiveKey(m), 1);
    release = true;
    waiter.join();
    holder.join();
}

TEST_F(FiberMutexTest, LastReaderOutWakesAWriter) {
    FiberMutex m;
    ASSERT_TRUE(m.try_lock_shared());
    ASSERT_TRUE(m.try_lock_shared());
    std::atomic<bool> written{false};
    auto writer = onUnpinned(0, [&] {
        std::lock_guard guard(m);
        written = true;
    });
    awaitWaiters(exclusiveKey(m), 1);
    m.unlock_shared();
    EXPECT_FALSE(written.load()) << "one reader is still inside";
    EXPECT_EQ(WaiterTable::instance().countWaiters(exclusiveKey(m)), 1u);
    m.unlock_shared();
    writer.join();
    EXPECT_TRUE(written.load());
}

TEST_F(FiberMutexTest, AWaitingWriterKeepsNewReadersOut) {
    FiberMutex m;
    ASSERT_TRUE(m.try_lock_shared());  // the first reader: this thread
    std::atomic<int> step{0};
    auto writer = onUnpinned(0, [&] {
        m.lock();
        step.fetch_add(1);
        m.unlock();
    });
    awaitWaiters(exclusiveKey(m), 1);
    // A writer waits behind a reader: readers that come now must queue, although only readers hold the mutex.
    EXPECT_FALSE(m.try_lock_shared());
    std::atomic<bool> lateReaderIn{false};
    auto lateReader = onUnpinned(1, [&] {
        std::shared_lock lock(m);
        lateReaderIn = true;
    });
    std::thread lateThread([&] {
        std::shared_lock lock(m);
    });
    awaitWaiters(sharedKey(m), 2);
    EXPECT_FALSE(lateReaderIn.load());
    EXPECT_EQ(step.load(), 0);

    m.unlock_shared();  // the last reader inside leaves: everyone gets a turn
    writer.join();
    lateReader.join();
    lateThread.join();
    EXPECT_EQ(step.load(), 1);
    EXPECT_TRUE(lateReaderIn.load());
    EXPECT_TRUE(m.try_lock());
    m.unlock();
}

TEST_F(FiberMutexTest, AWriterWaitsForAWriterAndReadersQueueBehindBoth) {
    FiberMutex m;
    m.lock();
    auto w1 = onUnpinned(0, [&] { std::lock_guard g(m); });
    auto w2 = onUnpinned(1, [&] { std::lock_guard g(m); });
    awaitWaiters(exclusiveKey(m), 2);
    auto r = onUnpinned(0, [&] { std::shared_lock l(m); });
    awaitWaiters(sharedKey(m), 1);
    m.unlock();
    w1.join();
    w2.join();
    r.join();
    EXPECT_EQ(WaiterTable::instance().countWaiters(exclusiveKey(m)), 0u);
    EXPECT_EQ(WaiterTable::instance().countWaiters(sharedKey(m)), 0u);
}

// ---- the unlock-versus-park race -------------------------------------------------------------------------------

TEST_F(FiberMutexTest, AnUnlockBetweenTheCheckAndTheParkIsNeverLost) {
    // Two fibers per carrier and a thread take the mutex with short holds, so that a waiter often arms its bit
    // just as the holder unlocks. Every few rounds the holder yields while holding: the fiber that then runs on
    // its carrier finds an owner that is not running, so it parks instead of spinning.
    FiberMutex m;
    uint64_t counter = 0;  // guarded by m
    std::atomic<uint64_t> progress{0};
    Watchdog dog("mutex hand-off", progress, 60s);
    auto worker = [&] {
        for (int i = 0; i < kRaceRounds; ++i) {
            m.lock();
            ++counter;
            if (i % 8 == 0) { this_fiber::yield(); }
            m.unlock();
            progress.fetch_add(1, std::memory_order_relaxed);
        }
    };
    std::vector<FiberHandle<void>> fibers;
    for (int i = 0; i < 4; ++i) { fibers.push_back(onUnpinned(i % 2, worker)); }
    std::thread t([&] {
        for (int i = 0; i < kRaceRounds / 4; ++i) {
            if (m.try_lock()) {
                ++counter;
                m.unlock();
            } else {
                std::lock_guard g(m);
                ++counter;
            }
        }
    });
    for (auto& f : fibers) { f.join(); }
    t.join();
    EXPECT_EQ(counter, 4u * kRaceRounds + kRaceRounds / 4);
}

TEST_F(FiberMutexTest, ReadersAndWritersHandOffWithoutLosingAWakeUp) {
    FiberMutex m;
    uint64_t value = 0;  // written under lock(), read under lock_shared()
    std::atomic<uint64_t> progress{0};
    std::atomic<bool> stop{false};
    Watchdog dog("reader/writer hand-off", progress, 60s);
    auto writer = onUnpinned(0, [&] {
        for (int i = 0; i < kRaceRounds; ++i) {
            std::lock_guard g(m);
            ++value;
            progress.fetch_add(1, std::memory_order_relaxed);
        }
        stop = true;
    });
    auto reader = onUnpinned(1, [&] {
        uint64_t last = 0;
        bool monotonic = true;
        while (!stop.load()) {
            std::shared_lock l(m);
            monotonic = monotonic && value >= last;
            last = value;
        }
        return monotonic;
    });
    std::thread threadReader([&] {
        while (!stop.load()) { std::shared_lock l(m); }
    });
    writer.join();
    EXPECT_TRUE(reader.join());
    threadReader.join();
    EXPECT_EQ(value, static_cast<uint64_t>(kRaceRounds));
}

}  // namespace
}  // namespace spindle
