// SPDX-License-Identifier: Apache-2.0
// Tests for FiberCondVar (core/fiber_condvar.h): notify_one wakes one waiter, oldest first; notify_all wakes
// the current waiters and not later ones; timed waits time out holding the lock again (also when the runtime
// shuts down); the predicate forms; odd durations and deadlines; the lock types it accepts; fibers on two
// carriers and plain threads waiting and notifying each other; and the race between a deadline and a notify,
// in a loop.
//
// The lock is a std::mutex (never held across a park) or a small lock built on FiberSemaphore(1).
// No verdict depends on timing: sleeps and short timeouts only make the interesting interleaving likely.

#include "core/fiber_condvar.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <optional>
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

constexpr int kRaceRounds = kSlowRounds ? 1'000 : 3'000;
constexpr int kPingPongRounds = kSlowRounds ? 1'000 : 3'000;

using FiberCondVarTest = WithRuntime;

// ---- notify ---------------------------------------------------------------------------------------------------

TEST_F(FiberCondVarTest, ANotifyWithNobodyWaitingIsNotRemembered) {
    FiberCondVar cv;
    std::mutex m;
    cv.notify_one();
    cv.notify_all();
    std::unique_lock lk(m);
    EXPECT_EQ(cv.wait_for(lk, 2ms), std::cv_status::timeout) << "on a plain thread";
    EXPECT_TRUE(lk.owns_lock());
    lk.unlock();
    auto h = on(0, [&] {
        std::unique_lock flk(m);
        return cv.wait_for(flk, 2ms) == std::cv_status::timeout && flk.owns_lock();
    });
    EXPECT_TRUE(h.join()) << "on a fiber";
}

TEST_F(FiberCondVarTest, NotifyOneWakesOneWaiterOldestFirst) {
    // Everything runs pinned on carrier 0, so the waiters queue in spawn order and nothing runs in parallel.
    constexpr int kWaiters = 6;
    auto driver = on(0, [] {
        FiberCondVar cv;
        std::mutex m;
        std::atomic<int> entered{0};
        std::atomic<int> woken{0};
        std::vector<int> order;  // carrier 0 only
        std::vector<FiberHandle<void>> waiters;
        for (int i = 0; i < kWaiters; ++i) {
            waiters.push_back(spindle::spawn(
                                  [&, i] {
                                      std::unique_lock lk(m);
                                      entered.fetch_add(1);
                                      cv.wait(lk);  // no predicate: count the wake-ups themselves
                                      order.push_back(i);
                                      woken.fetch_add(1);
                                  },
                                  SpawnOptions{.carrier = 0, .pinned = true})
                                  .value());
            yieldUntil([&] { return entered.load() == i + 1; });  // parked in wait() once it yields to us
        }
        bool ok = true;
        for (int k = 0; k < kWaiters; ++k) {
            cv.notify_one();
            yieldUntil([&] { return woken.load() >= k + 1; });
            // Give a second (wrong) wake-up every chance to run before we look.
            for (int y = 0; y < 8; ++y) { this_fiber::yield(); }
            if (woken.load() != k + 1) {
                ADD_FAILURE() << "notify_one #" << k << " woke " << woken.load() - k << " waiters";
                ok = false;
                break;
            }
            if (order[static_cast<size_t>(k)] != k) {
                ADD_FAILURE() << "notify_one #" << k << " woke waiter " << order[static_cast<size_t>(k)];
                ok = false;
            }
        }
        cv.notify_all();  // releases the rest after a failure
        for (auto& w : waiters) { w.join(); }
        return ok;
    });
    EXPECT_TRUE(driver.join());
}

TEST_F(FiberCondVarTest, NotifyAllWakesTheCurrentWaitersButNotLaterOnes) {
    FiberCondVar cv;
    std::mutex m;
    int entered = 0;  // guarded by m
    std::atomic<int> woken{0};
    auto waiter = [&] {
        std::unique_lock lk(m);
        ++entered;
        cv.wait(lk);
        woken.fetch_add(1);
    };
    std::vector<FiberHandle<void>> fibers;
    for (int i = 0; i < 6; ++i) { fibers.push_back(on(i % 2, waiter)); }
    std::vector<std::thread> threads;
    for (int i = 0; i < 2; ++i) { threads.emplace_back(waiter); }
    // A waiter is in the list before it unlocks m, so seeing all of them counted under m means all are queued.
    yieldUntil([&] {
        std::lock_guard g(m);
        return entered == 8;
    });
    cv.notify_all();
    // A waiter arriving after notify_all() must stay asleep: nobody notifies again, so only its deadline ends
    // its wait, whatever the timing.
    auto late = on(1, [&] {
        std::unique_lock lk(m);
        return cv.wait_for(lk, 20ms) == std::cv_status::timeout;
    });
    std::cv_status lateThread;
    {
        std::unique_lock lk(m);
        lateThread = cv.wait_for(lk, 20ms);
    }
    for (auto& f : fibers) { f.join(); }
    for (auto& t : threads) { t.join(); }
    EXPECT_EQ(woken.load(), 8);
    EXPECT_TRUE(late.join()) << "a fiber that began waiting after notify_all() was woken by it";
    EXPECT_EQ(lateThread, std::cv_status::timeout) << "a thread that began waiting after notify_all() was woken";
}

TEST_F(FiberCondVarTest, TheLockIsReleasedWhileWaitingAndHeldOnReturn) {
    for (int round = 0; round < 20; ++round) {
        FiberCondVar cv;
        SemLock lock;
        bool ready = false;  // guarded by lock
        bool heldOnReturn = false;
        auto waiter = on(round % 2, [&] {
            std::unique_lock lk(lock);
            cv.wait(lk, [&] { return ready; });
            heldOnReturn = lk.owns_lock() && lock.taken();
        });
        // The notifier can only take the lock if the waiter released it inside wait().
        auto notifier = on((round + 1) % 2, [&] {
            {
                std::lock_guard g(lock);
                ready = true;
            }
            cv.notify_one();
        });
        waiter.join();
        notifier.join();
        EXPECT_TRUE(heldOnReturn) << "round " << round;
        EXPECT_FALSE(lock.taken()) << "round " << round;
    }
}

// ---- timed waits ------------------------------------------------------------------------------------------------

TEST_F(FiberCondVarTest, WaitForTimesOutAndHoldsTheLockAgain) {
    FiberCondVar cv;
    SemLock lock;
    auto check = [&] {
        std::unique_lock lk(lock);
        const auto t0 = std::chrono::steady_clock::now();
        const std::cv_status st = cv.wait_for(lk, 3ms);
        const auto waited = std::chrono::steady_clock::now() - t0;
        return st == std::cv_status::timeout && lk.owns_lock() && lock.taken() && waited >= 3ms;
    };
    EXPECT_TRUE(check()) << "on a plain thread";
    EXPECT_FALSE(lock.taken());
    EXPECT_TRUE(on(0, check).join()) << "on a fiber";
    EXPECT_FALSE(lock.taken());
    // The same with a bare lock object (BasicLockable, no unique_lock).
    auto bare = on(1, [&] {
        lock.lock();
        const bool r = cv.wait_until(lock, std::chrono::steady_clock::now() + 2ms) == std::cv_status::timeout &&
                       lock.taken();
        lock.unlock();
        return r;
    });
    EXPECT_TRUE(bare.join());
}

TEST_F(FiberCondVarTest, ADeadlineInThePastReturnsTimeoutAtOnce) {
    FiberCondVar cv;
    std::mutex m;
    auto h = on(0, [&] {
        std::unique_lock lk(m);
        bool ok = cv.wait_for(lk, 0ns) == std::cv_status::timeout && lk.owns_lock();
        ok = ok && cv.wait_for(lk, -5s) == std::cv_status::timeout && lk.owns_lock();
        ok = ok && cv.wait_until(lk, std::chrono::steady_clock::now() - 1s) == std::cv_status::timeout;
        ok = ok && cv.wait_until(lk, std::chrono::steady_clock::time_point::min()) == std::cv_status::timeout;
        return ok && lk.owns_lock();
    });
    EXPECT_TRUE(h.join());
}

TEST_F(FiberCondVarTest, HugeTimeoutsMeanForeverNotOverflow) {
    FiberCondVar cv;
    std::mutex m;
    int turn = 0;  // guarded by m
    std::atomic<int> waiting{0};
    auto waiter = on(0, [&] {
        std::unique_lock lk(m);
        int notified = 0;
        waiting.store(1);
        notified += cv.wait_for(lk, std::chrono::hours::max()) == std::cv_status::no_timeout;
        waiting.store(2);
        notified += cv.wait_for(lk, std::chrono::duration<double>(INFINITY)) == std::cv_status::no_timeout;
        waiting.store(3);
        notified += cv.wait_until(lk, std::chrono::steady_clock::time_point::max()) == std::cv_status::no_timeout;
        waiting.store(4);
        notified += cv.wait_until(lk, std::chrono::time_point<std::chrono::steady_clock, std::chrono::hours>::max()) ==
                    std::cv_status::no_timeout;
        ++turn;
        return notified;
    });
    for (int i = 1; i <= 4; ++i) {
        // The waiter sets `waiting` under m and unlocks only inside wait: once we hold m, it is queued.
        yieldUntil([&] { return waiting.load() == i; });
        std::lock_guard g(m);
        cv.notify_one();
    }
    EXPECT_EQ(waiter.join(), 4);
}

TEST_F(FiberCondVarTest, ShutdownEndsATimedWaitOnAFiber) {
    FiberCondVar cv;
    std::mutex m;
    std::atomic<bool> started{false};
    auto waiter = on(0, [&] {
        std::unique_lock lk(m);
        started.store(true);
        return cv.wait_for(lk, 1h) == std::cv_status::timeout && lk.owns_lock();
    });
    yieldUntil([&] { return started.load(); });
    // Usually parked by now (then shutdown fires its timer); if not, shutdown refuses its timer and it gives
    // up at once. A timeout either way.
    std::this_thread::sleep_for(2ms);
    runtime_->shutdown();
    EXPECT_TRUE(waiter.join());
}

// ---- predicates -------------------------------------------------------------------------------------------------

TEST_F(FiberCondVarTest, PredicateWaitReturnsOnlyOnceThePredicateHolds) {
    FiberCondVar cv;
    std::mutex m;
    int value = 0;  // guarded by m
    std::atomic<int> checks{0};
    auto waiter = on(0, [&] {
        std::unique_lock lk(m);
        cv.wait(lk, [&] {
            checks.fetch_add(1);
            return value >= 5;
        });
        return value;
    });
    for (int i = 1; i <= 5; ++i) {
        {
            std::lock_guard g(m);
            value = i;
        }
        cv.notify_all();  // wakes the waiter at values 1..4 too: it must go back to sleep
        std::this_thread::sleep_for(100us);
    }
    EXPECT_EQ(waiter.join(), 5);
    EXPECT_GE(checks.load(), 1);
}

TEST_F(FiberCondVarTest, PredicateWaitForReturnsTheLastPredicateValue) {
    FiberCondVar cv;
    std::mutex m;
    bool flag = false;  // guarded by m
    auto h = on(1, [&] {
        std::unique_lock lk(m);
        int ok = 0;
        // False predicate, nobody notifies: false after the deadline, lock held.
        ok += !cv.wait_for(lk, 2ms, [&] { return flag; }) && lk.owns_lock();
        ok += !cv.wait_until(lk, std::chrono::steady_clock::now() + 2ms, [&] { return flag; }) && lk.owns_lock();
        // True predicate: true at once, even with no time at all.
        flag = true;
        ok += cv.wait_for(lk, 0s, [&] { return flag; });
        ok += cv.wait_until(lk, std::chrono::steady_clock::now() - 1h, [&] { return flag; });
        return ok;
    });
    EXPECT_EQ(h.join(), 4);
}

TEST_F(FiberCondVarTest, PredicateWaitForSeesAChangeMadeInTime) {
    for (int round = 0; round < 20; ++round) {
        FiberCondVar cv;
        SemLock lock;
        bool flag = false;  // guarded by lock
        auto waiter = on(round % 2, [&] {
            std::unique_lock lk(lock);
            return cv.wait_for(lk, 60s, [&] { return flag; }) && lock.taken();
        });
        std::thread setter([&] {
            if (round % 2 == 0) { std::this_thread::sleep_for(200us); }
            {
                std::lock_guard g(lock);
                flag = true;
            }
            cv.notify_one();
        });
        EXPECT_TRUE(waiter.join()) << "round " << round;
        setter.join();
    }
}

// ---- fibers and threads together ----------------------------------------------------------------------------

TEST_F(FiberCondVarTest, FibersAndThreadsTakeTurns) {
    // Four parties (a fiber on each carrier, two plain threads) pass one turn around a ring: each waits until
    // the turn is its own, advances it, and wakes everyone.
    FiberCondVar cv;
    std::mutex m;
    int turn = 0;  // guarded by m
    constexpr int kParties = 4;
    std::atomic<uint64_t> progress{0};
    Watchdog dog("FibersAndThreadsTakeTurns", progress, 30s);
    auto party = [&](int me) {
        for (int r = 0; r < kPingPongRounds; ++r) {
            std::unique_lock lk(m);
            cv.wait(lk, [&] { return turn % kParties == me; });
            ++turn;
            progress.fetch_add(1, std::memory_order_relaxed);
            lk.unlock();
            cv.notify_all();
        }
    };
    auto f0 = on(0, [&] { party(0); });
    auto f1 = on(1, [&] { party(1); });
    std::thread t2([&] { party(2); });
    std::thread t3([&] { party(3); });
    f0.join();
    f1.join();
    t2.join();
    t3.join();
    EXPECT_EQ(turn, kParties * kPingPongRounds);
}

TEST_F(FiberCondVarTest, ThreadWaitsFiberNotifiesAndBack) {
    FiberCondVar cv;
    SemLock lock;  // fibers and threads may both hold it across a park
    int ball = 0;  // guarded by lock: even: the thread's turn, odd: the fiber's
    auto fiber = anywhere([&] {
        for (int r = 0; r < kPingPongRounds; ++r) {
            std::unique_lock lk(lock);
            cv.wait(lk, [&] { return ball % 2 == 1; });
            ++ball;
            cv.notify_one();
        }
    });
    for (int r = 0; r < kPingPongRounds; ++r) {
        std::unique_lock lk(lock);
        cv.wait(lk, [&] { return ball % 2 == 0; });
        ++ball;
        cv.notify_one();
    }
    fiber.join();
    EXPECT_EQ(ball, 2 * kPingPongRounds);
}

// ---- deadline against notify ------------------------------------------------------------------------------------

TEST_F(FiberCondVarTest, ADeadlineRacingANotifyNeitherLosesNorDoublesTheWakeUp) {
    // Each round one waiter (fiber or thread) waits with a short deadline while a notifier (fiber or thread)
    // calls notify_one() at about the same moment. Either the deadline won (timeout, and the notify found
    // nobody) or the notify did (no_timeout). Then a probe checks that the list holds nothing stale: a fresh
    // untimed waiter must be the one the next notify_one() wakes; a node left behind would swallow that
    // notify and the probe would hang (the watchdog turns a hang into a failure).
    FiberCondVar cv;
    std::mutex m;
    std::atomic<uint64_t> progress{0};
    Watchdog dog("deadline-vs-notify rounds", progress, 30s);
    std::mt19937 rng(12345);
    int timeouts = 0;
    int notified = 0;
    for (int round = 0; round < kRaceRounds; ++round) {
        const auto timeout = std::chrono::microseconds(rng() % 60);
        const auto delay = std::chrono::microseconds(rng() % 60);
        std::atomic<bool> entered{false};
        std::atomic<int> status{-1};
        auto waitOnce = [&] {
            std::unique_lock lk(m);
            entered.store(true);
            status.store(cv.wait_for(lk, timeout) == std::cv_status::timeout ? 0 : 1);
        };
        auto notifyOnce = [&] {
            yieldUntil([&] { return entered.load(); });
            const auto until = std::chrono::steady_clock::now() + delay;
            while (std::chrono::steady_clock::now() < until) { this_fiber::yield(); }
            cv.notify_one();
        };
        const int shape = round % 4;  // who waits and who notifies: fiber/fiber, fiber/thread, thread/fiber, ...
        std::optional<FiberHandle<void>> wf;
        std::optional<FiberHandle<void>> nf;
        std::optional<std::thread> wt;
        std::optional<std::thread> nt;
        if (shape == 0 || shape == 1) { wf.emplace(on(round % 2, waitOnce)); } else { wt.emplace(waitOnce); }
        if (shape == 0 || shape == 2) { nf.emplace(on((round + 1) % 2, notifyOnce)); } else { nt.emplace(notifyOnce); }
        if (wf) { wf->join(); } else { wt->join(); }
        if (nf) { nf->join(); } else { nt->join(); }
        ASSERT_NE(status.load(), -1);
        (status.load() == 0 ? timeouts : notified) += 1;

        // The probe.
        std::atomic<bool> probeIn{false};
        auto probe = on(round % 2, [&] {
            std::unique_lock lk(m);
            probeIn.store(true);
            cv.wait(lk);
        });
        yieldUntil([&] { return probeIn.load(); });
        {
            std::lock_guard g(m);  // the probe is queued once it let go of m
        }
        cv.notify_one();
        probe.join();
        progress.fetch_add(1, std::memory_order_relaxed);
    }
    EXPECT_EQ(timeouts + notified, kRaceRounds);
    std::printf("deadline won %d rounds, notify won %d\n", timeouts, notified);
}

}  // namespace
}  // namespace spindle
