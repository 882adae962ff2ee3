// SPDX-License-Identifier: Apache-2.0
// Tests for FiberSequencer (core/fiber_sequencer.h): the counter, registrations satisfied at once, wake-up
// in token order (futures on one thread, and 1,000 fibers), advance() past several tokens, cancellation
// before and after the token is reached and of waiters in the middle of the heap, cancel() racing an
// increment() on the other carrier (and from a plain thread), waitWithTimeout() and waitForMultiple() on
// sequencer futures, threads and fibers waking each other, and a waiter destroying the sequencer.
//
// No verdict depends on timing: sleeps and timeouts only make an interleaving likely, and a watchdog turns
// a lost wake-up into a loud abort instead of a hang.

#include "core/fiber_sequencer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "base/relax.h"
#include "core/fiber.h"
#include "core/fiber_future.h"
#include "core/runtime.h"
#include "tests/core/with_runtime.h"

namespace spindle {
namespace {

using namespace std::chrono_literals;
using namespace testing_support;
using Future = FiberSequencer::Future;

// Under qemu-user (one host CPU for both carriers) a round costs a time slice or two, 7 ms: 5,000 rounds
// took 35 s. The two sides meet there only where the host preempts, so more rounds buy little; each
// round keeps its checks.
constexpr int kCancelRaceRounds = kEmulated ? 800 : kSlowRounds ? 5'000 : 20'000;
constexpr int kPingPongRounds = kSlowRounds ? 1'000 : 10'000;
constexpr int kDestroyRounds = kSlowRounds ? 500 : 2'000;
constexpr int kOrderedWaiters = 1'000;

/// Spins (yielding) until `pred` holds; the caller's watchdog catches a condition that never comes.
template <class Pred>
void spinUntil(Pred pred) {
    for (unsigned i = 0; !pred(); ++i) {
        if (i < 64) {
            cpuRelax();
        } else {
            this_fiber::yield();
        }
    }
}

using FiberSequencerTest = WithRuntime;

std::vector<uint64_t> shuffledTokens(int n, uint32_t seed) {
    std::vector<uint64_t> tokens(static_cast<size_t>(n));
    std::iota(tokens.begin(), tokens.end(), uint64_t{1});
    std::mt19937 rng(seed);
    std::shuffle(tokens.begin(), tokens.end(), rng);
    return tokens;
}

// ---- the counter -------------------------------------------------------------------------------------------

TEST_F(FiberSequencerTest, CountsUpAndAdvanceOnlyRaises) {
    FiberSequencer s;
    EXPECT_EQ(s.value(), 0u);
    s.increment();
    EXPECT_EQ(s.value(), 1u);
    s.advance(5);
    EXPECT_EQ(s.value(), 5u);
    s.advance(3);
    EXPECT_EQ(s.value(), 5u) << "advance() never lowers the counter";
    s.advance(5);
    EXPECT_EQ(s.value(), 5u);
    s.increment();
    EXPECT_EQ(s.value(), 6u);
    s.advance(FiberSequencer::kMaxValue);
    EXPECT_EQ(s.value(), FiberSequencer::kMaxValue);
}

TEST_F(FiberSequencerTest, ARegistrationAlreadyReachedIsSetAtOnce) {
    FiberSequencer s;
    s.advance(3);
    Future f;
    s.wait(3, &f);
    ASSERT_TRUE(f.isSet());
    EXPECT_EQ(f.wait(), 0);
    EXPECT_EQ(f.token(), 3u);
    s.wait(0, &f);  // reused once set
    ASSERT_TRUE(f.isSet());
    EXPECT_EQ(f.wait(), 0);

    EXPECT_EQ(s.wait(2), 0) << "blocking form on a plain thread";
    EXPECT_EQ(on(0, [&] { return s.wait(3); }).join(), 0) << "blocking form on a fiber";
}

// ---- order ---------------------------------------------------------------------------------------------------

TEST_F(FiberSequencerTest, FuturesAreSetInTokenOrderAsTheCounterStepsUp) {
    // One thread does everything, so each increment() combines by itself and has set every future it
    // satisfies before it returns: after step v exactly the tokens 1..v are set.
    FiberSequencer s;
    const std::vector<uint64_t> tokens = shuffledTokens(kOrderedWaiters, 1234);
    auto futures = std::make_unique<Future[]>(tokens.size());
    std::vector<Future*> byToken(tokens.size() + 2, nullptr);
    for (size_t i = 0; i < tokens.size(); ++i) {
        s.wait(tokens[i], &futures[i]);
        byToken[tokens[i]] = &futures[i];
    }
    for (size_t i = 0; i < tokens.size(); ++i) { ASSERT_FALSE(futures[i].isSet()) << "token " << tokens[i]; }

    for (uint64_t v = 1; v <= tokens.size(); ++v) {
        s.increment();
        ASSERT_TRUE(byToken[v]->isSet()) << "token " << v << " not set when the counter reached it";
        ASSERT_EQ(byToken[v]->result(), 0);
        if (v + 1 <= tokens.size()) { ASSERT_FALSE(byToken[v + 1]->isSet()) << "token " << v + 1 << " set early"; }
        if (v % 97 == 0) {
            for (size_t i = 0; i < tokens.size(); ++i) { ASSERT_EQ(futures[i].isSet(), tokens[i] <= v); }
        }
    }
}

TEST_F(FiberSequencerTest, FibersAreWokenInTokenOrder) {
    // 1,000 fibers on both carriers register shuffled tokens 1..1000. The counter then goes up one step at
    // a time, each step waiting until the fiber it released has recorded itself, so the record must read
    // 1, 2, ..., 1000.
    FiberSequencer s;
    const std::vector<uint64_t> tokens = shuffledTokens(kOrderedWaiters, 99);
    std::atomic<uint64_t> registered{0};
    std::atomic<uint64_t> recorded{0};
    std::vector<uint64_t> order(tokens.size(), 0);
    Watchdog dog("FibersAreWokenInTokenOrder", recorded, 30s);

    std::vector<FiberHandle<int32_t>> fibers;
    fibers.reserve(tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) {
        const uint64_t token = tokens[i];
        fibers.push_back(on(static_cast<int>(i % 2), [&, token] {
            Future f;
            s.wait(token, &f);
            registered.fetch_add(1);
            const int32_t res = f.wait();
            order[recorded.load()] = token;  // one fiber at a time: the driver waits for each
            recorded.fetch_add(1);
            return res;
        }));
    }
    while (registered.load() != tokens.size()) { std::this_thread::sleep_for(1ms); }
    for (uint64_t v = 1; v <= tokens.size(); ++v) {
        s.increment();
        while (recorded.load() != v) { std::this_thread::yield(); }
    }
    for (auto& h : fibers) { EXPECT_EQ(h.join(), 0); }
    for (size_t i = 0; i < order.size(); ++i) { ASSERT_EQ(order[i], i + 1) << "position " << i; }
}

TEST_F(FiberSequencerTest, AdvancePastSeveralTokensSetsEverySatisfiedFuture) {
    FiberSequencer s;
    constexpr uint64_t kTokens[] = {4, 1, 9, 7, 4, 10, 2, 8, 3, 6, 5, 7};
    constexpr size_t kCount = std::size(kTokens);
    Future futures[kCount];
    for (size_t i = 0; i < kCount; ++i) { s.wait(kTokens[i], &futures[i]); }

    s.advance(7);
    for (size_t i = 0; i < kCount; ++i) {
        EXPECT_EQ(futures[i].isSet(), kTokens[i] <= 7) << "token " << kTokens[i];
    }
    s.advance(5);  // lower: nothing changes
    EXPECT_EQ(s.value(), 7u);
    for (size_t i = 0; i < kCount; ++i) { EXPECT_EQ(futures[i].isSet(), kTokens[i] <= 7); }
    s.advance(10);
    for (size_t i = 0; i < kCount; ++i) {
        ASSERT_TRUE(futures[i].isSet());
        EXPECT_EQ(futures[i].result(), 0);
    }

    // Fibers parked on both carriers, released by one advance().
    std::atomic<uint64_t> parked{0};
    std::vector<FiberHandle<int32_t>> fibers;
    for (int i = 0; i < 16; ++i) {
        fibers.push_back(on(i % 2, [&s, &parked, i] {
            Future f;
            s.wait(11 + static_cast<uint64_t>(i), &f);
            parked.fetch_add(1);
            return f.wait();
        }));
    }
    while (parked.load() != 16) { std::this_thread::sleep_for(1ms); }
    s.advance(100);
    for (auto& h : fibers) { EXPECT_EQ(h.join(), 0); }
}

// ---- cancellation --------------------------------------------------------------------------------------------

TEST_F(FiberSequencerTest, CancelBeforeTheTokenIsReachedSetsEcanceled) {
    FiberSequencer s;
    Future f;
    s.wait(5, &f);
    EXPECT_FALSE(f.isSet());
    f.cancel();
    ASSERT_TRUE(f.isSet()) << "nobody else combines, so cancel() completes it before returning";
    EXPECT_EQ(f.wait(), -ECANCELED);
    s.advance(10);
    EXPECT_EQ(f.result(), -ECANCELED) << "a cancelled future is not set again";
    f.cancel();  // idempotent
    EXPECT_EQ(f.result(), -ECANCELED);

    // On a fiber, with another registration left in place.
    EXPECT_EQ(on(1,
                 [&s] {
                     Future a;
                     Future b;
                     s.wait(20, &a);
                     s.wait(21, &b);
                     a.cancel();
                     const int32_t ra = a.wait();
                     s.advance(21);
                     return ra == -ECANCELED && b.wait() == 0;
                 })
                  .join(),
              true);
}

TEST_F(FiberSequencerTest, CancelAfterTheTokenIsReachedKeepsZero) {
    FiberSequencer s;
    Future f;
    s.wait(2, &f);
    s.increment();
    s.increment();
    ASSERT_TRUE(f.isSet());
    f.cancel();
    EXPECT_EQ(f.wait(), 0);

    Future g;
    s.wait(1, &g);  // satisfied at registration
    g.cancel();
    EXPECT_EQ(g.wait(), 0);
}

TEST_F(FiberSequencerTest, CancelledFuturesLeaveTheOthersInOrder) {
    // Cancel a seeded half of 300 registrations (most in the middle of the heap), then step the counter:
    // the cancelled ones are -ECANCELED at once, every other one is set exactly at its token.
    FiberSequencer s;
    constexpr int kCount = 300;
    const std::vector<uint64_t> tokens = shuffledTokens(kCount, 7);
    auto futures = std::make_unique<Future[]>(kCount);
    for (int i = 0; i < kCount; ++i) { s.wait(tokens[static_cast<size_t>(i)], &futures[i]); }
    s.increment();  // pops token 1, so the heap is reshaped before the cancels
    std::mt19937 rng(42);
    std::vector<bool> cancelled(kCount, false);
    for (int i = 0; i < kCount; ++i) {
        if (tokens[static_cast<size_t>(i)] > 1 && (rng() & 1) != 0) {
            cancelled[static_cast<size_t>(i)] = true;
            futures[i].cancel();
            ASSERT_TRUE(futures[i].isSet());
            ASSERT_EQ(futures[i].result(), -ECANCELED);
        }
    }
    for (uint64_t v = 2; v <= kCount; ++v) {
        s.increment();
        for (int i = 0; i < kCount; ++i) {
            const uint64_t t = tokens[static_cast<size_t>(i)];
            if (cancelled[static_cast<size_t>(i)]) {
                ASSERT_EQ(futures[i].result(), -ECANCELED);
            } else {
                ASSERT_EQ(futures[i].isSet(), t <= v) << "token " << t << " at " << v;
                if (t <= v) { ASSERT_EQ(futures[i].result(), 0); }
            }
        }
    }
}

/// One side registers token r+1 and cancels it while the other side increments to r+1; the future must
/// be set exactly once, with 0 or -ECANCELED. Both outcomes are counted, neither is required.
struct CancelRace {
    FiberSequencer s;
    std::atomic<uint64_t> armed{0};
    std::atomic<uint64_t> seen{0};  // the incrementer is about to increment to this
    std::atomic<uint64_t> progress{0};
    int zeros = 0;
    int cancels = 0;
    bool bad = false;

    void canceller(int rounds) {
        for (int r = 0; r < rounds; ++r) {
            const uint64_t token = static_cast<uint64_t>(r) + 1;
            Future f;
            s.wait(token, &f);
            armed.store(token, std::memory_order_release);
            // Vary who comes first: every other round starts its delay only once the incrementer is on its
            // way, so that the two calls really meet.
            if (r % 2 == 0) { spinUntil([&] { return seen.load(std::memory_order_acquire) >= token; }); }
            for (int i = 0; i < (r % 32) * (r % 32); ++i) { cpuRelax(); }
            f.cancel();
            const int32_t res = f.wait();
            if (res == 0) {
                ++zeros;
            } else if (res == -ECANCELED) {
                ++cancels;
            } else {
                bad = true;
            }
            (void)s.wait(token);  // the incrementer's step has happened; start the next round
            progress.fetch_add(1);
        }
    }
    void incrementer(int rounds) {
        for (int r = 0; r < rounds; ++r) {
            const uint64_t token = static_cast<uint64_t>(r) + 1;
            spinUntil([&] { return armed.load(std::memory_order_acquire) >= token; });
            seen.store(token, std::memory_order_release);
            s.increment();
        }
    }
};

TEST_F(FiberSequencerTest, CancelRacesAnIncrementOnTheOtherCarrier) {
    CancelRace race;
    Watchdog dog("CancelRacesAnIncrementOnTheOtherCarrier", race.progress, 30s);
    auto a = on(0, [&] { race.canceller(kCancelRaceRounds); }, "canceller");
    auto b = on(1, [&] { race.incrementer(kCancelRaceRounds); }, "incrementer");
    a.join();
    b.join();
    EXPECT_FALSE(race.bad);
    EXPECT_EQ(race.zeros + race.cancels, kCancelRaceRounds);
    EXPECT_EQ(race.s.value(), static_cast<uint64_t>(kCancelRaceRounds));
    std::printf("cancel race (carriers): %d set with 0, %d cancelled\n", race.zeros, race.cancels);
}

TEST_F(FiberSequencerTest, CancelFromAThreadRacesAnIncrementOnACarrier) {
    CancelRace race;
    Watchdog dog("CancelFromAThreadRacesAnIncrementOnACarrier", race.progress, 30s);
    auto b = on(1, [&] { race.incrementer(kCancelRaceRounds); }, "incrementer");
    race.canceller(kCancelRaceRounds);
    b.join();
    EXPECT_FALSE(race.bad);
    EXPECT_EQ(race.zeros + race.cancels, kCancelRaceRounds);
    std::printf("cancel race (thread): %d set with 0, %d cancelled\n", race.zeros, race.cancels);
}

// ---- with FiberFuture's waiting helpers ------------------------------------------------------------------

TEST_F(FiberSequencerTest, WaitWithTimeoutThenCancel) {
    // Nobody raises the counter, so the timeout is the only way out: -ETIMEDOUT, then the cancel sets it.
    auto onFiber = on(0, [] {
        FiberSequencer s;
        Future f;
        s.wait(1, &f);
        const int32_t timedOut = FiberFuture::waitWithTimeout(&f, 2ms);
        f.cancel();
        const int32_t cancelled = f.wait();
        return timedOut == -ETIMEDOUT && cancelled == -ECANCELED;
    });
    EXPECT_TRUE(onFiber.join());

    FiberSequencer s;
    Future f;
    s.wait(1, &f);
    EXPECT_EQ(FiberFuture::waitWithTimeout(&f, 2ms), -ETIMEDOUT) << "on a plain thread";
    f.cancel();
    EXPECT_EQ(f.wait(), -ECANCELED);

    // Timed out, then reached before the cancel: the cancel finds it set with 0.
    Future g;
    s.wait(1, &g);
    EXPECT_EQ(FiberFuture::waitWithTimeout(&g, 1ms), -ETIMEDOUT);
    s.increment();
    EXPECT_TRUE(g.isSet());
    g.cancel();
    EXPECT_EQ(g.wait(), 0);
}

TEST_F(FiberSequencerTest, WaitForMultipleReturnsTheSatisfiedOne) {
    FiberSequencer a;
    FiberSequencer b;
    std::atomic<bool> attached{false};
    auto waiter = on(0, [&] {
        Future fa;
        Future fb;
        a.wait(1, &fa);
        b.wait(3, &fb);
        attached.store(true);
        FiberFuture* both[] = {&fa, &fb};
        const size_t first = FiberFuture::waitForMultiple(both, 2);
        fa.cancel();  // the loser is withdrawn before it goes out of scope
        const int32_t loser = fa.wait();
        return first == 1 && fb.result() == 0 && loser == -ECANCELED;
    });
    while (!attached.load()) { std::this_thread::sleep_for(1ms); }
    b.advance(3);
    EXPECT_TRUE(waiter.join());
}

// ---- threads and fibers -----------------------------------------------------------------------------------

TEST_F(FiberSequencerTest, ThreadsAndFibersWakeEachOther) {
    // Ping-pong over one counter: the fiber waits for odd values and makes them even, the thread the
    // reverse. Every step is a park and a cross-thread wake.
    FiberSequencer s;
    std::atomic<uint64_t> progress{0};
    Watchdog dog("ThreadsAndFibersWakeEachOther", progress, 30s);
    auto fiber = on(0, [&] {
        for (int i = 0; i < kPingPongRounds; ++i) {
            (void)s.wait(2 * static_cast<uint64_t>(i) + 1);
            s.increment();
            progress.fetch_add(1);
        }
    });
    for (int i = 0; i < kPingPongRounds; ++i) {
        s.increment();
        EXPECT_EQ(s.wait(2 * static_cast<uint64_t>(i) + 2), 0);
    }
    fiber.join();
    EXPECT_EQ(s.value(), 2 * static_cast<uint64_t>(kPingPongRounds));
}

TEST_F(FiberSequencerTest, AReleasedWaiterMayDestroyTheSequencer) {
    // The only other call running is the increment() that releases the waiter, which then frees the
    // sequencer at once: under ASan a touch after the release shows up as a use after free.
    std::atomic<uint64_t> progress{0};
    Watchdog dog("AReleasedWaiterMayDestroyTheSequencer", progress, 30s);
    for (int r = 0; r < kDestroyRounds; ++r) {
        auto* s = new FiberSequencer;
        std::atomic<bool> registered{false};
        auto waiter = anywhere([s, &registered, r] {
            if (r % 2 == 0) {
                Future f;
                s->wait(1, &f);
                registered.store(true);
                (void)f.wait();
            } else {
                registered.store(true);
                (void)s->wait(1);  // blocking form: sometimes sees the raise on its fast path
            }
            delete s;
        });
        spinUntil([&] { return registered.load(); });
        s->increment();
        waiter.join();
        progress.fetch_add(1);
    }
}

}  // namespace
}  // namespace spindle
