// SPDX-License-Identifier: Apache-2.0
// Tests for the carriers' poller hook (core/poller.h) and Runtime::runOnCarrier (core/runtime.h): a
// poller runs on its carrier's thread every loop turn, can wake a fiber that nothing else would, keeps
// its carrier from parking while it says so, and stops once removed; runOnCarrier runs on the carrier
// it names, from fibers and threads alike; and the error paths of both.

#include "core/poller.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <thread>

#include "core/fiber.h"
#include "core/fiber_future.h"
#include "core/io.h"
#include "core/runtime.h"
#include "tests/core/with_runtime.h"

namespace spindle {
namespace {

using namespace std::chrono_literals;
using namespace testing_support;

/// Counts its polls and the threads they ran on; sets `wake` on its `fireAt`-th poll; refuses parking
/// while `holdCarrier` is set.
struct CountingPoller : Poller {
    std::atomic<uint64_t> polls{0};
    std::atomic<std::thread::id> thread{};
    std::atomic<bool> holdCarrier{false};
    std::atomic<bool> otherThread{false};
    FiberFuture* wake = nullptr;
    uint64_t fireAt = 0;

    CountingPoller() {
        poll = [](Poller* self) noexcept {
            auto* p = static_cast<CountingPoller*>(self);
            const auto id = std::this_thread::get_id();
            if (p->thread.load() != std::thread::id{} && p->thread.load() != id) { p->otherThread.store(true); }
            p->thread.store(id);
            const uint64_t n = p->polls.fetch_add(1) + 1;
            if (p->wake != nullptr && n == p->fireAt) {
                p->wake->set(7);
                return true;
            }
            return false;
        };
        mayPark = [](Poller* self) noexcept { return !static_cast<CountingPoller*>(self)->holdCarrier.load(); };
    }
};

class PollerTest : public WithRuntime {};

TEST_F(PollerTest, APollerIsPolledOnItsCarrierUntilRemoved) {
    CountingPoller p;
    const auto result = on(1, [&] {
        auto added = addPoller(&p);
        EXPECT_TRUE(added);
        EXPECT_EQ(added.valueOr(99), 1u);
        // Sleeping lets the carrier idle: it polls before it parks and in every maintenance pass.
        for (int i = 0; i < 5; ++i) { (void)this_fiber::sleep_for(1ms); }
        const uint64_t seen = p.polls.load();
        EXPECT_TRUE(removePoller(&p));
        const uint64_t atRemoval = p.polls.load();
        for (int i = 0; i < 5; ++i) { (void)this_fiber::sleep_for(1ms); }
        EXPECT_EQ(p.polls.load(), atRemoval) << "polled after removePoller returned";
        return seen;
    }).join();
    EXPECT_GE(result, 5u);
    EXPECT_FALSE(p.otherThread.load()) << "a poller runs on its carrier's thread only";
}

TEST_F(PollerTest, APollerWakesAFiberNothingElseWouldAndKeepsTheCarrierAwakeMeanwhile) {
    // The way a DPDK queue is served: the fiber waits on a future only the poller sets. The poller holds
    // the carrier awake (no park: no kernel event would come), so it is polled until it delivers.
    CountingPoller p;
    FiberFuture delivered;
    p.wake = &delivered;
    p.fireAt = 1000;
    p.holdCarrier.store(true);
    const int32_t got = on(0, [&] {
        EXPECT_TRUE(addPoller(&p));
        const int32_t r = delivered.wait();
        EXPECT_TRUE(removePoller(&p));
        return r;
    }).join();
    EXPECT_EQ(got, 7);
    EXPECT_GE(p.polls.load(), 1000u);
}

TEST_F(PollerTest, AVetoKeepsTheCarrierFromParking) {
    CountingPoller p;
    p.holdCarrier.store(true);
    FiberFuture registered;
    FiberFuture release;
    auto h = on(1, [&] {
        EXPECT_TRUE(addPoller(&p));
        registered.set(0);
        (void)release.wait();
        EXPECT_TRUE(removePoller(&p));
    });
    (void)registered.wait();
    std::this_thread::sleep_for(5ms);  // let the carrier reach its idle path
    const uint64_t parksBefore = rt().stats()[1].parks;
    const uint64_t pollsBefore = p.polls.load();
    std::this_thread::sleep_for(30ms);
    EXPECT_EQ(rt().stats()[1].parks, parksBefore) << "a carrier whose poller refuses parking parked";
    EXPECT_GT(p.polls.load(), pollsBefore) << "a carrier held awake keeps polling";
    release.set(0);
    h.join();
}

TEST_F(PollerTest, ErrorsAreReported) {
    CountingPoller p;
    EXPECT_EQ(addPoller(&p).errorCode(), EPERM) << "off-fiber";
    EXPECT_EQ(removePoller(&p).errorCode(), EINVAL) << "never added";
    on(0, [&] {
        Poller empty;
        EXPECT_EQ(addPoller(&empty).errorCode(), EINVAL) << "no poll function";
        EXPECT_EQ(addPoller(nullptr).errorCode(), EINVAL);
        EXPECT_TRUE(addPoller(&p));
        EXPECT_EQ(addPoller(&p).errorCode(), EBUSY) << "added twice";
    }).join();
    on(1, [&] { EXPECT_EQ(removePoller(&p).errorCode(), EPERM) << "removed from another carrier"; }).join();
    EXPECT_EQ(removePoller(&p).errorCode(), EPERM) << "removed from a plain thread";
    on(0, [&] { EXPECT_TRUE(removePoller(&p)); }).join();
}

// ---- runOnCarrier ----------------------------------------------------------------------------------------

std::thread::id threadOf(Runtime& rt, int carrier) {
    return rt.spawn([] { return std::this_thread::get_id(); }, SpawnOptions{.carrier = carrier, .pinned = true})
        .value()
        .join();
}

TEST_F(PollerTest, RunOnCarrierRunsOnTheCarrierItNamesFromThreadsAndFibers) {
    const std::thread::id c0 = threadOf(rt(), 0);
    const std::thread::id c1 = threadOf(rt(), 1);
    ASSERT_NE(c0, c1);
    std::thread::id ran{};
    ASSERT_TRUE(rt().runOnCarrier(1, [&] { ran = std::this_thread::get_id(); }));  // from a plain thread
    EXPECT_EQ(ran, c1);
    on(0, [&] {
        std::thread::id fromFiber{};
        EXPECT_TRUE(rt().runOnCarrier(1, [&] { fromFiber = std::this_thread::get_id(); }));
        EXPECT_EQ(fromFiber, c1);
        // On the carrier it names: at once, on this very thread.
        std::thread::id here{};
        EXPECT_TRUE(rt().runOnCarrier(0, [&] { here = std::this_thread::get_id(); }));
        EXPECT_EQ(here, c0);
    }).join();
    // Many at once, from fibers on both carriers, each to the other: every call runs once.
    std::atomic<int> count{0};
    std::vector<FiberHandle<void>> hs;
    for (int i = 0; i < 200; ++i) {
        hs.push_back(onUnpinned(i % 2, [&, i] {
            EXPECT_TRUE(rt().runOnCarrier(static_cast<unsigned>((i + 1) % 2), [&] { count.fetch_add(1); }));
        }));
    }
    for (auto& h : hs) { h.join(); }
    EXPECT_EQ(count.load(), 200);
}

// A poller still registered when the runtime shuts down is unregistered by its carrier on the way
// out, on that carrier's thread, and told so; it is never called afterwards.
TEST_F(PollerTest, APollerLeftRegisteredIsDetachedOnItsCarrierAtShutdown) {
    struct Counting : Poller {
        std::atomic<int> polls{0};
        std::atomic<int> detaches{0};
        std::atomic<int> detachedOnCarrier{-2};
    } p;
    p.poll = [](Poller* self) noexcept {
        static_cast<Counting*>(self)->polls.fetch_add(1);
        return false;
    };
    p.detached = [](Poller* self) noexcept {
        auto* c = static_cast<Counting*>(self);
        c->detaches.fetch_add(1);
        c->detachedOnCarrier.store(this_fiber::carrierIndex());
    };
    on(1, [&] { ASSERT_TRUE(addPoller(&p)); }).join();
    rt().shutdown();
    rt().join();
    EXPECT_EQ(p.detaches.load(), 1);
    EXPECT_EQ(p.detachedOnCarrier.load(), 1);
    EXPECT_EQ(p.carrier, nullptr);
    const int polls = p.polls.load();
    EXPECT_GT(polls, 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    EXPECT_EQ(p.polls.load(), polls);
}

TEST_F(PollerTest, RunOnCarrierErrors) {
    bool ran = false;
    EXPECT_EQ(rt().runOnCarrier(2, [&] { ran = true; }).errorCode(), EINVAL);
    EXPECT_FALSE(ran);
    rt().shutdown();
    EXPECT_EQ(rt().runOnCarrier(0, [&] { ran = true; }).errorCode(), ECANCELED) << "a plain thread after shutdown";
    EXPECT_FALSE(ran);
}

}  // namespace
}  // namespace spindle
