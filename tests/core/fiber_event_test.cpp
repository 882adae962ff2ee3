// SPDX-License-Identifier: Apache-2.0
// Tests for FiberEvent (core/fiber_event.h): set/reset/isSet, waiters that arrive after set() return at once
// and after reset() block, set() releasing fibers on both carriers and plain threads together, a set/reset
// pulse not being missed, the async form with cancel() and waitWithTimeout(), ping-pong over two events, and
// a released waiter destroying the event.
//
// No verdict depends on timing: sleeps and timeouts only make an interleaving likely, and a watchdog turns
// a lost wake-up into a loud abort instead of a hang.

#include "core/fiber_event.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "core/fiber.h"
#include "core/fiber_future.h"
#include "core/runtime.h"
#include "tests/core/with_runtime.h"

namespace spindle {
namespace {

using namespace std::chrono_literals;
using namespace testing_support;

constexpr int kPingPongRounds = kSanitized ? 1'000 : 10'000;
constexpr int kDestroyRounds = kSanitized ? 500 : 2'000;

using FiberEventTest = WithRuntime;

TEST_F(FiberEventTest, SetAndResetAreIdempotent) {
    FiberEvent e;
    EXPECT_FALSE(e.isSet());
    e.reset();
    EXPECT_FALSE(e.isSet());
    e.set();
    EXPECT_TRUE(e.isSet());
    e.set();
    EXPECT_TRUE(e.isSet());
    e.reset();
    EXPECT_FALSE(e.isSet());
    e.reset();
    EXPECT_FALSE(e.isSet());
    e.set();
    EXPECT_TRUE(e.isSet());
}

TEST_F(FiberEventTest, WaitersAfterSetReturnAtOnce) {
    FiberEvent e;
    e.set();
    e.wait();  // plain thread
    FiberEvent::Future f;
    e.wait(&f);
    ASSERT_TRUE(f.isSet());
    EXPECT_EQ(f.result(), 0);
    EXPECT_TRUE(on(0, [&e] {
                    e.wait();
                    FiberEvent::Future g;
                    e.wait(&g);
                    return g.isSet() && g.result() == 0 && e.isSet();
                }).join());
}

TEST_F(FiberEventTest, WaitersAfterResetBlockUntilTheNextSet) {
    FiberEvent e;
    e.set();
    e.reset();
    FiberEvent::Future f;
    e.wait(&f);
    EXPECT_FALSE(f.isSet()) << "reset() makes later waiters wait";
    EXPECT_EQ(FiberFuture::waitWithTimeout(&f, 1ms), -ETIMEDOUT);
    EXPECT_FALSE(f.isSet());

    std::atomic<bool> waiting{false};
    auto fiber = on(1, [&] {
        waiting.store(true);
        e.wait();
        return e.isSet();
    });
    while (!waiting.load()) { std::this_thread::sleep_for(1ms); }
    std::this_thread::sleep_for(1ms);  // most likely parked by now; either way it must wait for set()
    EXPECT_FALSE(fiber.done());
    e.set();
    EXPECT_TRUE(fiber.join()) << "nothing reset the event after set()";
    EXPECT_EQ(f.wait(), 0);
}

TEST_F(FiberEventTest, SetReleasesEveryWaiterOnBothCarriersAndThreads) {
    constexpr int kFibers = 64;
    constexpr int kThreads = 3;
    FiberEvent e;
    std::atomic<int> waiting{0};
    std::atomic<int> released{0};
    std::vector<FiberHandle<void>> fibers;
    for (int i = 0; i < kFibers; ++i) {
        fibers.push_back(on(i % 2, [&] {
            waiting.fetch_add(1);
            e.wait();
            released.fetch_add(1);
        }));
    }
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i) {
        threads.emplace_back([&] {
            waiting.fetch_add(1);
            e.wait();
            released.fetch_add(1);
        });
    }
    while (waiting.load() != kFibers + kThreads) { std::this_thread::sleep_for(1ms); }
    EXPECT_EQ(released.load(), 0) << "nobody passes an unset event";
    e.set();
    for (auto& h : fibers) { h.join(); }
    for (auto& t : threads) { t.join(); }
    EXPECT_EQ(released.load(), kFibers + kThreads);
    EXPECT_TRUE(e.isSet());
}

TEST_F(FiberEventTest, APulseIsNotMissed) {
    // set() then reset() at once: a waiter registered before the set() is released even though the event
    // is unset again by the time it runs.
    FiberEvent e;
    FiberEvent::Future registered;
    e.wait(&registered);
    std::atomic<bool> parked{false};
    auto fiber = on(0, [&] {
        FiberEvent::Future f;
        e.wait(&f);
        parked.store(true);
        return f.wait();
    });
    while (!parked.load()) { std::this_thread::sleep_for(1ms); }
    e.set();
    e.reset();
    EXPECT_FALSE(e.isSet());
    EXPECT_EQ(fiber.join(), 0);
    EXPECT_EQ(registered.wait(), 0);
    FiberEvent::Future late;
    e.wait(&late);
    EXPECT_FALSE(late.isSet()) << "a waiter after the reset waits for the next set()";
    late.cancel();
    EXPECT_EQ(late.wait(), -ECANCELED);
}

TEST_F(FiberEventTest, AsyncWaitCanBeCancelledOrTimedOut) {
    EXPECT_TRUE(on(1, [] {
                    FiberEvent e;
                    FiberEvent::Future f;
                    e.wait(&f);
                    const int32_t timedOut = FiberFuture::waitWithTimeout(&f, 2ms);
                    f.cancel();
                    const bool cancelled = f.wait() == -ECANCELED;
                    e.set();
                    return timedOut == -ETIMEDOUT && cancelled && f.result() == -ECANCELED;
                }).join());

    FiberEvent e;
    FiberEvent::Future f;
    e.wait(&f);
    e.set();
    f.cancel();  // too late: set first
    EXPECT_EQ(f.wait(), 0);
}

TEST_F(FiberEventTest, PingPongOverTwoEvents) {
    // Each side waits for its event, resets it, and sets the other's: many park/wake hand-offs between a
    // fiber and a plain thread.
    FiberEvent ping;
    FiberEvent pong;
    std::atomic<uint64_t> progress{0};
    Watchdog dog("PingPongOverTwoEvents", progress, 30s);
    auto fiber = on(0, [&] {
        for (int i = 0; i < kPingPongRounds; ++i) {
            ping.wait();
            ping.reset();
            pong.set();
            progress.fetch_add(1);
        }
    });
    for (int i = 0; i < kPingPongRounds; ++i) {
        ping.set();
        pong.wait();
        pong.reset();
    }
    fiber.join();
    EXPECT_EQ(progress.load(), static_cast<uint64_t>(kPingPongRounds));
    EXPECT_FALSE(ping.isSet());
    EXPECT_FALSE(pong.isSet());
}

TEST_F(FiberEventTest, AReleasedWaiterMayDestroyTheEvent) {
    // A one-shot completion signal: the waiter frees the event as soon as it passes it, while the set()
    // that let it through may still be returning. ASan reports any touch after the release.
    std::atomic<uint64_t> progress{0};
    Watchdog dog("AReleasedWaiterMayDestroyTheEvent", progress, 30s);
    for (int r = 0; r < kDestroyRounds; ++r) {
        auto* e = new FiberEvent;
        auto waiter = anywhere([e] {
            e->wait();
            delete e;
        });
        if (r % 2 == 0) { std::this_thread::yield(); }
        e->set();
        waiter.join();
        progress.fetch_add(1);
    }
}

}  // namespace
}  // namespace spindle
