// SPDX-License-Identifier: Apache-2.0
// Stress tests for FiberSequencer and the primitives on it: the combiner under many fibers and threads
// registering, cancelling, timing out, incrementing and advancing at once (every future set exactly once,
// with a result that fits what its owner did); FairFiberMutex mutual exclusion with fibers on two carriers
// and plain threads; and a FiberEvent barrier whose gates must never open early.
//
// Each test checks invariants, never timing. Counts are smaller under the sanitizers. A watchdog turns a
// lost wake-up into an abort with a message.

#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <thread>
#include <vector>

#include "core/fair_fiber_mutex.h"
#include "core/fiber.h"
#include "core/fiber_event.h"
#include "core/fiber_future.h"
#include "core/fiber_sequencer.h"
#include "core/runtime.h"
#include "tests/core/with_runtime.h"

namespace spindle {
namespace {

using namespace std::chrono_literals;
using namespace testing_support;

constexpr int kCombinerRounds = kSanitized ? 300 : 1'000;  // per waiter, of kBatch registrations each
constexpr int kMutexIncrements = kSanitized ? 200'000 : 1'000'000;
constexpr int kBarrierRounds = kSanitized ? 1'000 : 3'000;
constexpr int kBatch = 32;         // registrations a combiner-stress waiter holds at once
constexpr uint32_t kAhead = 1024;  // how far past the counter their tokens may lie

using SequencerStress = WithRuntime;

// ---- the combiner --------------------------------------------------------------------------------------------

/// Shared state of the combiner stress. Waiters register batches of futures on tokens a little ahead of
/// the counter, cancel some (at once, or after a short timed wait), and wait for all of them; raisers
/// keep incrementing and advancing until every waiter is done.
struct CombinerStress {
    FiberSequencer s;
    std::atomic<int> waitersLeft{0};
    std::atomic<uint64_t> progress{0};
    std::atomic<uint64_t> zeros{0};
    std::atomic<uint64_t> cancelled{0};
    std::atomic<uint64_t> violations{0};

    void waiter(uint32_t seed, int rounds) {
        std::mt19937 rng(seed);
        FiberSequencer::Future futures[kBatch];  // reused every round: a stray late set() would show
        bool cancelledByUs[kBatch];
        for (int r = 0; r < rounds; ++r) {
            for (int i = 0; i < kBatch; ++i) {
                s.wait(s.value() + rng() % kAhead, &futures[i]);
                cancelledByUs[i] = false;
            }
            for (int i = 0; i < kBatch; ++i) {
                switch (rng() % 4) {
                    case 0:  // cancel at once
                        futures[i].cancel();
                        cancelledByUs[i] = true;
                        break;
                    case 1:  // give it a moment, then give up on it
                        if (FiberFuture::waitWithTimeout(&futures[i], std::chrono::microseconds(rng() % 50)) ==
                            -ETIMEDOUT) {
                            futures[i].cancel();
                            cancelledByUs[i] = true;
                        }
                        break;
                    default:  // wait it out
                        break;
                }
            }
            for (int i = 0; i < kBatch; ++i) {
                const int32_t res = futures[i].wait();
                if (res == 0) {
                    zeros.fetch_add(1, std::memory_order_relaxed);
                    // Set with 0 means the counter reached the token: never early, never a stray set.
                    if (s.value() < futures[i].token()) { violations.fetch_add(1); }
                } else if (res == -ECANCELED && cancelledByUs[i]) {
                    cancelled.fetch_add(1, std::memory_order_relaxed);
                } else {
                    violations.fetch_add(1);
                }
            }
            progress.fetch_add(1, std::memory_order_relaxed);
        }
        waitersLeft.fetch_sub(1);
    }

    void raiser(uint32_t seed) {
        std::mt19937 rng(seed);
        while (waitersLeft.load(std::memory_order_relaxed) != 0) {
            const uint32_t r = rng();
            if (r % 4 == 0) {
                s.advance(s.value() + 1 + (r >> 8) % 4);
            } else {
                s.increment();
            }
            this_fiber::yield();  // let the waiters on this carrier run
        }
    }
};

TEST_F(SequencerStress, CombinerSetsEveryFutureExactlyOnceWithTheRightResult) {
    constexpr int kWaiterFibers = 6;
    constexpr int kWaiterThreads = 2;
    constexpr int kRaiserFibers = 2;
    CombinerStress st;
    st.waitersLeft.store(kWaiterFibers + kWaiterThreads);
    Watchdog dog("CombinerSetsEveryFutureExactlyOnceWithTheRightResult", st.progress, 60s);

    std::vector<FiberHandle<void>> fibers;
    for (int i = 0; i < kWaiterFibers; ++i) {
        fibers.push_back(onUnpinned(i % 2, [&st, i] { st.waiter(100 + static_cast<uint32_t>(i), kCombinerRounds); }));
    }
    for (int i = 0; i < kRaiserFibers; ++i) {
        fibers.push_back(onUnpinned(i % 2, [&st, i] { st.raiser(200 + static_cast<uint32_t>(i)); }));
    }
    std::vector<std::thread> threads;
    for (int i = 0; i < kWaiterThreads; ++i) {
        threads.emplace_back([&st, i] { st.waiter(300 + static_cast<uint32_t>(i), kCombinerRounds); });
    }
    threads.emplace_back([&st] { st.raiser(400); });  // a raiser on a plain thread too
    for (auto& f : fibers) { f.join(); }
    for (auto& t : threads) { t.join(); }

    const uint64_t total = uint64_t{kWaiterFibers + kWaiterThreads} * kCombinerRounds * kBatch;
    EXPECT_EQ(st.violations.load(), 0u);
    EXPECT_EQ(st.zeros.load() + st.cancelled.load(), total) << "every future ended set exactly once";
    std::printf("combiner stress: %llu futures, %llu set with 0, %llu cancelled, counter at %llu\n",
                static_cast<unsigned long long>(total), static_cast<unsigned long long>(st.zeros.load()),
                static_cast<unsigned long long>(st.cancelled.load()),
                static_cast<unsigned long long>(st.s.value()));
}

// ---- FairFiberMutex ------------------------------------------------------------------------------------------

TEST_F(SequencerStress, FairMutexExcludesFibersOnTwoCarriersAndThreads) {
    constexpr int kFibers = 8;
    constexpr int kThreads = 2;
    constexpr int kWorkers = kFibers + kThreads;
    static_assert(kMutexIncrements % kWorkers == 0);
    constexpr int kEach = kMutexIncrements / kWorkers;

    FairFiberMutex m;
    uint64_t counter = 0;  // plain: only the mutex protects it
    std::atomic<bool> inside{false};
    std::atomic<uint64_t> overlaps{0};
    std::atomic<uint64_t> progress{0};
    Watchdog dog("FairMutexExcludesFibersOnTwoCarriersAndThreads", progress, 60s);

    auto work = [&](int worker) {
        for (int i = 0; i < kEach; ++i) {
            switch ((i + worker) % 4) {
                case 0: {
                    FairFiberMutex::Future f;
                    m.lock(&f);
                    if (f.wait() != 0) { std::abort(); }
                    break;
                }
                case 1:
                    if (!m.try_lock()) { m.lock(); }
                    break;
                default:
                    m.lock();
                    break;
            }
            if (inside.exchange(true, std::memory_order_relaxed)) { overlaps.fetch_add(1); }
            ++counter;
            inside.store(false, std::memory_order_relaxed);
            m.unlock();
            if (i % 1024 == 0) { progress.fetch_add(1, std::memory_order_relaxed); }
        }
    };
    std::vector<FiberHandle<void>> fibers;
    for (int i = 0; i < kFibers; ++i) { fibers.push_back(onUnpinned(i % 2, [&work, i] { work(i); })); }
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i) { threads.emplace_back(work, kFibers + i); }
    for (auto& f : fibers) { f.join(); }
    for (auto& t : threads) { t.join(); }

    EXPECT_EQ(overlaps.load(), 0u);
    EXPECT_EQ(counter, static_cast<uint64_t>(kMutexIncrements));
    EXPECT_TRUE(m.try_lock()) << "free at the end";
    m.unlock();
}

// ---- FiberEvent ----------------------------------------------------------------------------------------------

TEST_F(SequencerStress, EventBarrierNeverOpensEarly) {
    // A reusable barrier made of two events used in turn. The last to arrive in round r resets the gate
    // of round r + 1 (everyone has left it: they all arrived in round r) and then sets the gate of round r.
    // Whoever passes a gate checks that everyone had arrived in that round.
    constexpr int kFibers = 8;
    constexpr int kThreads = 2;
    constexpr int kParties = kFibers + kThreads;
    FiberEvent gates[2];
    std::vector<std::atomic<int>> arrived(kBarrierRounds);
    std::atomic<uint64_t> early{0};
    std::atomic<uint64_t> progress{0};
    Watchdog dog("EventBarrierNeverOpensEarly", progress, 60s);

    auto party = [&] {
        for (int r = 0; r < kBarrierRounds; ++r) {
            FiberEvent& gate = gates[r % 2];
            if (arrived[static_cast<size_t>(r)].fetch_add(1) + 1 == kParties) {
                gates[(r + 1) % 2].reset();
                gate.set();
                progress.fetch_add(1, std::memory_order_relaxed);
            } else if (r % 3 == 0) {
                FiberEvent::Future f;
                gate.wait(&f);
                if (f.wait() != 0) { early.fetch_add(1); }
            } else {
                gate.wait();
            }
            if (arrived[static_cast<size_t>(r)].load() != kParties) { early.fetch_add(1); }
        }
    };
    std::vector<FiberHandle<void>> fibers;
    for (int i = 0; i < kFibers; ++i) { fibers.push_back(onUnpinned(i % 2, party)); }
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i) { threads.emplace_back(party); }
    for (auto& f : fibers) { f.join(); }
    for (auto& t : threads) { t.join(); }
    EXPECT_EQ(early.load(), 0u);
    EXPECT_EQ(progress.load(), static_cast<uint64_t>(kBarrierRounds));
}

}  // namespace
}  // namespace spindle
