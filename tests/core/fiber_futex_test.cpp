// SPDX-License-Identifier: Apache-2.0
// Tests for FiberFutex (core/fiber_futex.h): the counter, wait() returning at once when the counter is already
// there, post() waking every waiter (fibers on two carriers and plain threads), waits for several posts, waitFor
// timing out with -ETIMEDOUT and leaving the waiter table, waitFor woken in time, and the post-versus-park race
// looped many times, under a watchdog so that a lost wake-up fails loudly instead of hanging.
//
// No verdict depends on timing: where a test must know that waiters are parked, it polls the waiter table; a
// timeout is only ever expected where nothing can post.

#include "core/fiber_futex.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
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

using FiberFutexTest = WithRuntime;

// ---- the counter and waits that need not park -----------------------------------------------------------------

TEST(FiberFutex, CountsPosts) {
    FiberFutex f;
    EXPECT_EQ(f.get(), 0u);
    f.post();
    f.post();
    EXPECT_EQ(f.get(), 2u);
    for (int i = 0; i < 1000; ++i) { f.post(); }
    EXPECT_EQ(f.get(), 1002u);
}

TEST(FiberFutex, WaitReturnsAtOnceWhenTheCounterIsThere) {
    FiberFutex f;
    f.wait(0);  // any counter is at least 0
    f.post();
    f.wait(1);
    f.wait(0);
    EXPECT_EQ(f.waitFor(1, 0ns), 0) << "no time needed when the counter is there";
    EXPECT_EQ(f.waitFor(1, -1s), 0);
    EXPECT_EQ(WaiterTable::instance().countWaiters(&f), 0u);
}

TEST(FiberFutex, WaitForTimesOutOnAPlainThreadAndLeavesTheTable) {
    FiberFutex f;
    EXPECT_EQ(f.waitFor(1, 0ns), -ETIMEDOUT);
    EXPECT_EQ(f.waitFor(1, 2ms), -ETIMEDOUT);
    EXPECT_EQ(WaiterTable::instance().countWaiters(&f), 0u);
    // The futex still works afterwards: the stale waiter bit costs the next post a look at an empty list.
    f.post();
    EXPECT_EQ(f.waitFor(1, 0ns), 0);
    EXPECT_EQ(f.get(), 1u);
}

// ---- waking ----------------------------------------------------------------------------------------------------

TEST_F(FiberFutexTest, PostWakesEveryWaiterOnBothCarriersAndThreads) {
    constexpr int kFibers = 12;
    constexpr int kThreads = 3;
    FiberFutex f;
    int payload = 0;  // written before post(), read after wait()
    std::atomic<int> sawPayload{0};
    auto waiter = [&] {
        f.wait(1);
        if (payload == 99) { sawPayload.fetch_add(1); }
    };
    std::vector<FiberHandle<void>> fibers;
    for (int i = 0; i < kFibers; ++i) { fibers.push_back(onUnpinned(i % 2, waiter)); }
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i) { threads.emplace_back(waiter); }

    awaitWaiters(&f, kFibers + kThreads);  // all parked: only a post can release them
    payload = 99;
    f.post();
    for (auto& h : fibers) { h.join(); }
    for (auto& t : threads) { t.join(); }
    EXPECT_EQ(sawPayload.load(), kFibers + kThreads);
    EXPECT_EQ(WaiterTable::instance().countWaiters(&f), 0u);
}

TEST_F(FiberFutexTest, AWaitForSeveralPostsReturnsOnlyAfterTheLast) {
    FiberFutex f;
    std::atomic<uint64_t> seenOnReturn{0};
    auto h = onUnpinned(0, [&] {
        f.wait(3);
        seenOnReturn = f.get();
    });
    for (int i = 0; i < 2; ++i) {
        awaitWaiters(&f, 1);  // parked (again): the post before this one did not satisfy it
        f.post();
    }
    awaitWaiters(&f, 1);
    EXPECT_EQ(seenOnReturn.load(), 0u) << "returned after 2 of 3 posts";
    f.post();
    h.join();
    EXPECT_GE(seenOnReturn.load(), 3u);
}

TEST_F(FiberFutexTest, WaitWithNoArgumentWaitsForTheNextPost) {
    FiberFutex f;
    f.post();
    f.post();  // earlier posts do not count
    std::atomic<bool> returned{false};
    auto h = onUnpinned(1, [&] {
        f.wait();
        returned = true;
    });
    awaitWaiters(&f, 1);
    EXPECT_FALSE(returned.load());
    f.post();
    h.join();
    EXPECT_TRUE(returned.load());
}

TEST_F(FiberFutexTest, WaitForTimesOutOnAFiberAndLeavesTheTable) {
    FiberFutex f;
    auto h = onUnpinned(0, [&] { return f.waitFor(1, 2ms); });
    EXPECT_EQ(h.join(), -ETIMEDOUT);
    EXPECT_EQ(WaiterTable::instance().countWaiters(&f), 0u);
    EXPECT_EQ(f.get(), 0u);
}

TEST_F(FiberFutexTest, WaitForReturnsZeroWhenPostedInTime) {
    FiberFutex f;
    auto fiber = onUnpinned(0, [&] { return f.waitFor(1, 60s); });
    int threadResult = 1;
    std::thread thread([&] { threadResult = f.waitFor(1, 60s); });
    awaitWaiters(&f, 2);
    f.post();
    EXPECT_EQ(fiber.join(), 0);
    thread.join();
    EXPECT_EQ(threadResult, 0);
    EXPECT_EQ(WaiterTable::instance().countWaiters(&f), 0u);
}

TEST_F(FiberFutexTest, TimedAndUntimedWaitersMix) {
    // Timed waiters that give up leave the untimed ones parked and wakeable.
    FiberFutex f;
    std::atomic<int> timedOut{0};
    std::vector<FiberHandle<void>> timed;
    for (int i = 0; i < 4; ++i) {
        timed.push_back(onUnpinned(i % 2, [&] {
            if (f.waitFor(1, 1ms) == -ETIMEDOUT) { timedOut.fetch_add(1); }
        }));
    }
    auto untimed = onUnpinned(1, [&] { f.wait(1); });
    for (auto& h : timed) { h.join(); }  // nothing posts until they are gone, so each timed out
    EXPECT_EQ(timedOut.load(), 4);
    awaitWaiters(&f, 1);
    f.post();
    untimed.join();
}

// ---- the post-versus-park race -------------------------------------------------------------------------------

TEST_F(FiberFutexTest, APostBetweenTheCheckAndTheParkIsNeverLost) {
    // Ping-pong: each side waits for the other's post with the get()-check-wait idiom. A post that lands after
    // the waiter read the counter but before it parked must still wake it.
    FiberFutex ping;
    FiberFutex pong;
    std::atomic<uint64_t> progress{0};
    Watchdog dog("futex ping-pong", progress, 60s);
    auto a = onUnpinned(0, [&] {
        for (int i = 0; i < kRaceRounds; ++i) {
            ping.post();
            pong.wait(static_cast<uint64_t>(i) + 1);
            progress.fetch_add(1, std::memory_order_relaxed);
        }
    });
    auto b = onUnpinned(1, [&] {
        for (int i = 0; i < kRaceRounds; ++i) {
            ping.wait(static_cast<uint64_t>(i) + 1);
            pong.post();
        }
    });
    a.join();
    b.join();
    EXPECT_EQ(ping.get(), static_cast<uint64_t>(kRaceRounds));
    EXPECT_EQ(pong.get(), static_cast<uint64_t>(kRaceRounds));
}

TEST_F(FiberFutexTest, ThreadsAndFibersPingPong) {
    FiberFutex toThread;
    FiberFutex toFiber;
    std::atomic<uint64_t> progress{0};
    Watchdog dog("futex thread/fiber ping-pong", progress, 60s);
    const int rounds = kRaceRounds / 4;
    auto fiber = onUnpinned(0, [&] {
        for (int i = 0; i < rounds; ++i) {
            toThread.post();
            toFiber.wait(static_cast<uint64_t>(i) + 1);
        }
    });
    for (int i = 0; i < rounds; ++i) {
        toThread.wait(static_cast<uint64_t>(i) + 1);
        toFiber.post();
        progress.fetch_add(1, std::memory_order_relaxed);
    }
    fiber.join();
}

TEST_F(FiberFutexTest, TimedWaitsRacingWithPostsNeverLoseOne) {
    // waitFor with a long limit in the race: a lost post would show as -ETIMEDOUT after a minute.
    FiberFutex f;
    FiberFutex ack;
    std::atomic<uint64_t> progress{0};
    Watchdog dog("timed futex race", progress, 90s);
    const int rounds = kRaceRounds / 4;
    auto waiter = onUnpinned(0, [&] {
        int bad = 0;
        for (int i = 0; i < rounds; ++i) {
            if (f.waitFor(static_cast<uint64_t>(i) + 1, 60s) != 0) { ++bad; }
            ack.post();
        }
        return bad;
    });
    auto poster = onUnpinned(1, [&] {
        for (int i = 0; i < rounds; ++i) {
            f.post();
            ack.wait(static_cast<uint64_t>(i) + 1);
            progress.fetch_add(1, std::memory_order_relaxed);
        }
    });
    EXPECT_EQ(waiter.join(), 0);
    poster.join();
    EXPECT_EQ(WaiterTable::instance().countWaiters(&f), 0u);
}

}  // namespace
}  // namespace spindle
