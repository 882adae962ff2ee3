// SPDX-License-Identifier: Apache-2.0
// Tests for FiberFuture (core/fiber_future.h): set before and after wait, from the same carrier, the other
// carrier and a plain thread; a thread waiting (proxy fiber); reset and reuse; waitForMultiple and the
// detaching of the futures it did not return; waitWithTimeout on fibers and threads; and the set-versus-park
// race, under a watchdog so that a lost wake-up fails loudly instead of hanging.
//
// No verdict depends on timing: sleeps only make the interesting interleaving likely.

#include "core/fiber_future.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <thread>
#include <tuple>
#include <vector>

#include "core/fiber.h"
#include "core/runtime.h"
#include "tests/core/with_runtime.h"

namespace spindle {
namespace {

using namespace std::chrono_literals;
using namespace testing_support;

constexpr int kRaceIterations = kSlowRounds ? 10'000 : 100'000;
constexpr int kMultiRaceIterations = kSlowRounds ? 1'000 : 10'000;
constexpr int kPingPongRounds = kSlowRounds ? 1'000 : 10'000;

using FiberFutureTest = WithRuntime;

// ---- set and wait ------------------------------------------------------------------------------------------

TEST_F(FiberFutureTest, SetBeforeWaitReturnsAtOnce) {
    // On a plain thread.
    FiberFuture f;
    EXPECT_FALSE(f.isSet());
    f.set(-EIO);
    EXPECT_TRUE(f.isSet());
    EXPECT_EQ(f.result(), -EIO);
    EXPECT_EQ(f.wait(), -EIO);
    EXPECT_EQ(f.wait(), -EIO) << "waiting again on a set future returns the same result";

    // On a fiber.
    auto h = on(0, [] {
        FiberFuture g;
        g.set(123);
        return g.wait();
    });
    EXPECT_EQ(h.join(), 123);
}

TEST_F(FiberFutureTest, WaitThenSetFromAFiberOnTheSameCarrier) {
    // The waiter spawns the setter on its own carrier and then waits: the setter cannot run before the waiter
    // has parked, so this always takes the parked-waiter path.
    auto waiter = on(0, [] {
        FiberFuture f;
        int payload = 0;  // plain memory written before set(), read after wait()
        auto setter = spindle::spawn(
            [&f, &payload] {
                payload = 4242;
                f.set(7);
            },
            SpawnOptions{.name = "setter", .carrier = 0, .pinned = true});
        if (!setter) { return -1; }
        const int32_t r = f.wait();
        setter->join();
        return r == 7 && payload == 4242 ? 1 : 0;
    });
    EXPECT_EQ(waiter.join(), 1);
}

TEST_F(FiberFutureTest, WaitThenSetFromAFiberOnTheOtherCarrier) {
    for (int round = 0; round < 50; ++round) {
        FiberFuture f;
        int payload = 0;
        auto waiter = on(0, [&] {
            const int32_t r = f.wait();
            return r == round && payload == round + 1000;
        });
        auto setter = on(1, [&] {
            if (round % 2 == 0) { (void)this_fiber::sleep_for(200us); }  // usually after the waiter parked
            payload = round + 1000;
            f.set(round);
        });
        EXPECT_TRUE(waiter.join()) << "round " << round;
        setter.join();
    }
}

TEST_F(FiberFutureTest, WaitThenSetFromAPlainThread) {
    for (int round = 0; round < 50; ++round) {
        FiberFuture f;
        int payload = 0;
        auto waiter = on(round % 2, [&] {
            const int32_t r = f.wait();
            return r == -round && payload == round;
        });
        std::thread setter([&] {
            if (round % 2 == 0) { std::this_thread::sleep_for(200us); }
            payload = round;
            f.set(-round);
        });
        EXPECT_TRUE(waiter.join()) << "round " << round;
        setter.join();
    }
}

TEST_F(FiberFutureTest, APlainThreadWaitsWhileAFiberSets) {
    for (int round = 0; round < 50; ++round) {
        FiberFuture f;
        int payload = 0;
        auto setter = on(round % 2, [&] {
            if (round % 2 == 0) { (void)this_fiber::sleep_for(200us); }  // usually after the thread sleeps
            payload = round * 3;
            f.set(round);
        });
        EXPECT_EQ(f.wait(), round);
        EXPECT_EQ(payload, round * 3);
        setter.join();
    }
}

// ---- reset and reuse -------------------------------------------------------------------------------------------

TEST_F(FiberFutureTest, ResetMakesAFutureReusable) {
    FiberFuture f;
    for (int i = 0; i < 3; ++i) {
        f.set(i);
        EXPECT_EQ(f.wait(), i);
        f.reset();
        EXPECT_FALSE(f.isSet());
    }
}

TEST_F(FiberFutureTest, PingPongReusesTwoFuturesAcrossCarriers) {
    FiberFuture ping;  // consumed by the ponger
    FiberFuture pong;  // consumed by the pinger
    auto pinger = on(0, [&] {
        int bad = 0;
        for (int r = 0; r < kPingPongRounds; ++r) {
            ping.set(r);
            const int32_t back = pong.wait();
            pong.reset();
            if (back != r + 1) { ++bad; }
        }
        return bad;
    });
    auto ponger = on(1, [&] {
        for (int r = 0; r < kPingPongRounds; ++r) {
            const int32_t v = ping.wait();
            ping.reset();
            pong.set(v + 1);
        }
    });
    EXPECT_EQ(pinger.join(), 0);
    ponger.join();

    // The same between a thread and a fiber.
    auto fiberSide = on(1, [&] {
        for (int r = 0; r < kPingPongRounds / 10; ++r) {
            const int32_t v = ping.wait();
            ping.reset();
            pong.set(v * 2);
        }
    });
    int bad = 0;
    for (int r = 0; r < kPingPongRounds / 10; ++r) {
        ping.set(r);
        if (pong.wait() != 2 * r) { ++bad; }
        pong.reset();
    }
    fiberSide.join();
    EXPECT_EQ(bad, 0);
}

// ---- waitForMultiple ----------------------------------------------------------------------------------------------

TEST_F(FiberFutureTest, WaitForMultipleReturnsTheOneSetElsewhere) {
    auto h = on(0, [this] {
        FiberFuture a, b, c;
        FiberFuture* all[3] = {&a, &b, &c};
        auto setter = on(1, [&b] {
            (void)this_fiber::sleep_for(1ms);
            b.set(22);
        });
        const size_t idx = FiberFuture::waitForMultiple(all, 3);
        setter.join();
        return idx == 1 && b.result() == 22 && !a.isSet() && !c.isSet();
    });
    EXPECT_TRUE(h.join());
}

TEST_F(FiberFutureTest, WaitForMultipleWithOneAlreadySetReturnsAtOnce) {
    auto h = on(0, [] {
        FiberFuture a, b, c;
        c.set(3);
        FiberFuture* all[3] = {&a, &b, &c};
        const size_t idx = FiberFuture::waitForMultiple(all, 3);
        // a and b were attached on the way to c: they must be detached again, i.e. plainly reusable.
        a.set(1);
        b.set(2);
        return idx == 2 && a.wait() == 1 && b.wait() == 2;
    });
    EXPECT_TRUE(h.join());

    auto first = on(1, [] {
        FiberFuture a, b;
        a.set(10);
        b.set(20);
        FiberFuture* all[2] = {&a, &b};
        return FiberFuture::waitForMultiple(all, 2);
    });
    EXPECT_EQ(first.join(), 0u) << "with several set, the first set one is returned";
}

// Waits for the first of three futures in a frame of its own, which is gone (and its stack reused) when the
// caller goes on; the futures that were not set must no longer point into it.
__attribute__((noinline)) size_t waitForOneOfThreeInOwnFrame(FiberFuture* a, FiberFuture* b, FiberFuture* c) {
    FiberFuture* all[3] = {a, b, c};
    return FiberFuture::waitForMultiple(all, 3);
}
__attribute__((noinline)) int scribbleOnTheStack(int seed) {
    volatile char junk[4096];
    for (size_t i = 0; i < sizeof(junk); ++i) { junk[i] = static_cast<char>(seed + static_cast<int>(i)); }
    return junk[seed % sizeof(junk)];
}

TEST_F(FiberFutureTest, WaitForMultipleDetachesTheUnsetFutures) {
    auto h = on(0, [this] {
        auto a = std::make_unique<FiberFuture>();
        auto b = std::make_unique<FiberFuture>();
        auto c = std::make_unique<FiberFuture>();
        auto setter = on(1, [&c] {
            (void)this_fiber::sleep_for(1ms);
            c->set(33);
        });
        const size_t idx = waitForOneOfThreeInOwnFrame(a.get(), b.get(), c.get());
        setter.join();
        (void)scribbleOnTheStack(static_cast<int>(idx));
        bool ok = idx == 2 && c->result() == 33 && !a->isSet() && !b->isSet();
        // Setting a detached future touches nothing but the future (with a stale attachment it would call
        // into the dead frame of waitForOneOfThreeInOwnFrame).
        auto lateSetter = on(1, [&a] { a->set(11); });
        ok = ok && a->wait() == 11;
        lateSetter.join();
        b->set(12);
        ok = ok && b->wait() == 12;
        // And the unset ones may simply be destroyed (heap: ASan reports any later touch).
        a.reset();
        b.reset();
        c.reset();
        return ok;
    });
    EXPECT_TRUE(h.join());
}

TEST_F(FiberFutureTest, WaitForMultipleFromAPlainThread) {
    FiberFuture a, b, c;
    FiberFuture* all[3] = {&a, &b, &c};
    auto setter = on(1, [&a] {
        (void)this_fiber::sleep_for(1ms);
        a.set(-ENOENT);
    });
    EXPECT_EQ(FiberFuture::waitForMultiple(all, 3), 0u);
    setter.join();
    EXPECT_EQ(a.result(), -ENOENT);
    EXPECT_FALSE(b.isSet());
    EXPECT_FALSE(c.isSet());
    c.set(5);
    EXPECT_EQ(c.wait(), 5);
}

TEST_F(FiberFutureTest, WaitForMultipleRacingSetters) {
    // Two setters (a fiber on the other carrier and a plain thread) race to set two futures a waiter is
    // attached to; the waiter returns a set one, and after waiting for both it destroys them.
    std::atomic<FiberFuture*> slots[2] = {};
    std::atomic<uint64_t> progress{0};
    Watchdog dog("WaitForMultipleRacingSetters", progress, 30s);
    auto fiberSetter = on(1, [&] {
        for (int i = 0; i < kMultiRaceIterations; ++i) {
            FiberFuture* f;
            while ((f = slots[0].exchange(nullptr, std::memory_order_acquire)) == nullptr) { this_fiber::yield(); }
            f->set(i);
        }
    });
    std::thread threadSetter([&] {
        for (int i = 0; i < kMultiRaceIterations; ++i) {
            FiberFuture* f;
            while ((f = slots[1].exchange(nullptr, std::memory_order_acquire)) == nullptr) {
                std::this_thread::yield();
            }
            f->set(i);
        }
    });
    auto waiter = on(0, [&] {
        int bad = 0;
        for (int i = 0; i < kMultiRaceIterations; ++i) {
            FiberFuture f0, f1;
            FiberFuture* all[2] = {&f0, &f1};
            slots[0].store(&f0, std::memory_order_release);
            slots[1].store(&f1, std::memory_order_release);
            const size_t idx = FiberFuture::waitForMultiple(all, 2);
            if (idx > 1 || !all[idx]->isSet() || all[idx]->result() != i) { ++bad; }
            if (f0.wait() != i || f1.wait() != i) { ++bad; }  // both setters are done with them after this
            progress.fetch_add(1, std::memory_order_relaxed);
        }
        return bad;
    });
    EXPECT_EQ(waiter.join(), 0);
    fiberSetter.join();
    threadSetter.join();
}

// ---- waitWithTimeout --------------------------------------------------------------------------------------------

TEST_F(FiberFutureTest, WaitWithTimeoutTimesOutOnAFiber) {
    auto h = on(0, [] {
        FiberFuture f;
        const auto start = std::chrono::steady_clock::now();
        const int32_t r = FiberFuture::waitWithTimeout(&f, 5ms);
        const auto elapsed = std::chrono::steady_clock::now() - start;
        // The future stays armed: a later set() is legal and a later wait() returns it.
        auto setter = spindle::spawn([&f] { f.set(8); }, SpawnOptions{.carrier = 1});
        const int32_t later = f.wait();
        if (setter) { setter->join(); }
        return std::make_tuple(r, elapsed, later);
    });
    const auto [r, elapsed, later] = h.join();
    EXPECT_EQ(r, -ETIMEDOUT);
    EXPECT_GE(elapsed, 5ms) << "a timeout never fires early";
    EXPECT_EQ(later, 8);
}

TEST_F(FiberFutureTest, WaitWithTimeoutTimesOutOnAPlainThread) {
    FiberFuture f;
    const auto start = std::chrono::steady_clock::now();
    EXPECT_EQ(FiberFuture::waitWithTimeout(&f, 5ms), -ETIMEDOUT);
    EXPECT_GE(std::chrono::steady_clock::now() - start, 5ms) << "a timeout never fires early";
    EXPECT_FALSE(f.isSet());
    // Still armed and usable.
    auto setter = on(1, [&f] { f.set(9); });
    EXPECT_EQ(f.wait(), 9);
    setter.join();

    // A zero or negative timeout on an unset future reports a timeout at once.
    FiberFuture g;
    EXPECT_EQ(FiberFuture::waitWithTimeout(&g, 0ns), -ETIMEDOUT);
    EXPECT_EQ(FiberFuture::waitWithTimeout(&g, -1ms), -ETIMEDOUT);
}

// kNoTimeout: only the result or a cancel ends the wait, and it arms no timer in the kernel. With a
// finite stand-in (the accept without a deadline waited 24 hours, a multishot receive a year) every park
// of the carrier was a timed one: the kernel armed and cancelled a timer each time.
TEST_F(FiberFutureTest, WaitWithoutLimitEndsWithTheResultOrACancelAndKeepsParksUntimed) {
    FiberFuture forever;
    auto waiter = on(0, [&] { return FiberFuture::waitWithTimeout(&forever, FiberFuture::kNoTimeout); });
    // Another fiber on carrier 0 waits for the main thread ten times: ten parks, each woken by a set.
    constexpr int kRounds = 10;
    FiberFuture step[kRounds];
    std::atomic<int> reached{0};
    auto stepper = on(0, [&] {
        for (int i = 0; i < kRounds; ++i) {
            reached.store(i + 1);
            EXPECT_EQ(step[i].wait(), i);
        }
    });
    const auto parksOf0 = [&] { return rt().stats().at(0); };
    uint64_t parks0 = 0;
    uint64_t timed0 = 0;
    for (int i = 0; i < kRounds; ++i) {
        while (reached.load() <= i) { std::this_thread::yield(); }
        std::this_thread::sleep_for(2ms);  // let carrier 0 park
        if (i == 0) {
            parks0 = parksOf0().parks;
            timed0 = parksOf0().timedParks;
        }
        step[i].set(i);
    }
    stepper.join();
    EXPECT_GE(parksOf0().parks - parks0, uint64_t{kRounds - 1});
    EXPECT_EQ(parksOf0().timedParks - timed0, 0u) << "a wait without limit made the carrier's parks timed";
    waiter.cancel();
    EXPECT_EQ(waiter.join(), -ECANCELED);

    // Set: its result. On a plain thread as well (which no cancel reaches).
    FiberFuture later;
    auto waiter2 = on(0, [&] { return FiberFuture::waitWithTimeout(&later, FiberFuture::kNoTimeout); });
    std::this_thread::sleep_for(1ms);
    later.set(6);
    EXPECT_EQ(waiter2.join(), 6);
    FiberFuture fromFiber;
    auto setter = on(1, [&] {
        (void)this_fiber::sleep_for(1ms);
        fromFiber.set(7);
    });
    EXPECT_EQ(FiberFuture::waitWithTimeout(&fromFiber, FiberFuture::kNoTimeout), 7);
    setter.join();
}

TEST_F(FiberFutureTest, WaitWithTimeoutReturnsTheResultWhenSetInTime) {
    // Already set: the result, whatever the timeout.
    FiberFuture done;
    done.set(4);
    EXPECT_EQ(FiberFuture::waitWithTimeout(&done, 0ns), 4);

    // A fiber waiter, set from the other carrier well before the (long) timeout.
    auto fiberWaiter = on(0, [] {
        FiberFuture f;
        auto setter = spindle::spawn(
            [&f] {
                (void)this_fiber::sleep_for(1ms);
                f.set(41);
            },
            SpawnOptions{.carrier = 1, .pinned = true});
        const int32_t r = FiberFuture::waitWithTimeout(&f, 60s);
        if (setter) { setter->join(); }
        return r;
    });
    EXPECT_EQ(fiberWaiter.join(), 41);

    // Same carrier: the setter runs only once the waiter has parked.
    auto sameCarrier = on(1, [] {
        FiberFuture f;
        auto setter = spindle::spawn([&f] { f.set(43); }, SpawnOptions{.carrier = 1, .pinned = true});
        const int32_t r = FiberFuture::waitWithTimeout(&f, 60s);
        if (setter) { setter->join(); }
        return r;
    });
    EXPECT_EQ(sameCarrier.join(), 43);

    // A thread waiter, set by a fiber.
    FiberFuture g;
    auto setter = on(1, [&g] {
        (void)this_fiber::sleep_for(1ms);
        g.set(42);
    });
    EXPECT_EQ(FiberFuture::waitWithTimeout(&g, 60s), 42);
    setter.join();
}

TEST_F(FiberFutureTest, ManyShortTimeoutsOnFibers) {
    // Timers that expire and timers that are cancelled (set first), interleaved on both carriers; every
    // call must come back with one of the two answers.
    std::vector<FiberHandle<int>> hs;
    for (int c = 0; c < 2; ++c) {
        hs.push_back(on(c, [] {
            int bad = 0;
            for (int i = 0; i < 200; ++i) {
                FiberFuture f;
                if (i % 2 == 0) { f.set(i); }
                const int32_t r = FiberFuture::waitWithTimeout(&f, std::chrono::microseconds(50 + i % 7));
                if (i % 2 == 0 ? r != i : r != -ETIMEDOUT) { ++bad; }
            }
            return bad;
        }));
    }
    for (auto& h : hs) { EXPECT_EQ(h.join(), 0); }
}

TEST_F(FiberFutureTest, WaitWithTimeoutRacingSetsAcrossCarriers) {
    // Unpinned waiters whose timeouts race sets from the other carrier: a waiter woken by a set may resume on
    // the other carrier (stolen) and then disarm its timer from there. Either answer is right; what must hold
    // is that a timed-out future stays armed and later yields the set value, and that nothing hangs.
    constexpr int kWaiters = 8;
    constexpr int kRounds = kSlowRounds ? 50 : 200;
    std::atomic<uint64_t> progress{0};
    Watchdog dog("WaitWithTimeoutRacingSetsAcrossCarriers", progress, 30s);
    std::vector<FiberHandle<int>> hs;
    for (int w = 0; w < kWaiters; ++w) {
        auto h = runtime_->spawn(
            [w, &progress] {
                int bad = 0;
                for (int i = 0; i < kRounds; ++i) {
                    FiberFuture f;
                    const int me = this_fiber::carrierIndex();
                    auto setter = spindle::spawn(
                        [&f, i] {
                            if (i % 3 != 0) { (void)this_fiber::sleep_for(std::chrono::microseconds(20 * (i % 5))); }
                            f.set(i);
                        },
                        SpawnOptions{.carrier = 1 - me});
                    const int32_t r = FiberFuture::waitWithTimeout(&f, std::chrono::microseconds(10 + (i + w) % 60));
                    const int32_t v = f.wait();  // set either way, sooner or later
                    if (setter) { setter->join(); }
                    if ((r != i && r != -ETIMEDOUT) || v != i) { ++bad; }
                    progress.fetch_add(1, std::memory_order_relaxed);
                }
                return bad;
            },
            SpawnOptions{.carrier = w % 2});
        ASSERT_TRUE(h) << h.error().message();
        hs.push_back(std::move(*h));
    }
    for (auto& h : hs) { EXPECT_EQ(h.join(), 0); }
}

// ---- the set-versus-park race ------------------------------------------------------------------------------------

TEST_F(FiberFutureTest, SetRacingTheParkNeverLosesTheWakeUp) {
    // Each iteration, a waiter on carrier 0 publishes a fresh future and waits on it while a setter on
    // carrier 1 sets it: the set lands before, during or after the park. A lost wake-up hangs; the
    // watchdog turns that into an abort with a message.
    std::atomic<FiberFuture*> slot{nullptr};
    std::atomic<uint64_t> progress{0};
    Watchdog dog("SetRacingTheParkNeverLosesTheWakeUp", progress, 30s);
    auto setter = on(1, [&] {
        for (int i = 0; i < kRaceIterations; ++i) {
            FiberFuture* f;
            while ((f = slot.exchange(nullptr, std::memory_order_acquire)) == nullptr) { this_fiber::yield(); }
            f->set(i);
        }
    }, "setter");
    auto waiter = on(0, [&] {
        int bad = 0;
        for (int i = 0; i < kRaceIterations; ++i) {
            FiberFuture f;
            slot.store(&f, std::memory_order_release);
            if (f.wait() != i) { ++bad; }
            progress.fetch_add(1, std::memory_order_relaxed);
        }
        return bad;
    }, "waiter");
    EXPECT_EQ(waiter.join(), 0);
    setter.join();
    EXPECT_EQ(progress.load(), static_cast<uint64_t>(kRaceIterations));
}

TEST_F(FiberFutureTest, SetFromAThreadRacingTheParkNeverLosesTheWakeUp) {
    std::atomic<FiberFuture*> slot{nullptr};
    std::atomic<uint64_t> progress{0};
    Watchdog dog("SetFromAThreadRacingTheParkNeverLosesTheWakeUp", progress, 30s);
    std::thread setter([&] {
        for (int i = 0; i < kRaceIterations / 10; ++i) {
            FiberFuture* f;
            while ((f = slot.exchange(nullptr, std::memory_order_acquire)) == nullptr) { std::this_thread::yield(); }
            f->set(i);
        }
    });
    auto waiter = on(0, [&] {
        int bad = 0;
        for (int i = 0; i < kRaceIterations / 10; ++i) {
            FiberFuture f;
            slot.store(&f, std::memory_order_release);
            if (f.wait() != i) { ++bad; }
            progress.fetch_add(1, std::memory_order_relaxed);
        }
        return bad;
    });
    EXPECT_EQ(waiter.join(), 0);
    setter.join();
}

}  // namespace
}  // namespace spindle
