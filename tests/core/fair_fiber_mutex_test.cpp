// SPDX-License-Identifier: Apache-2.0
// Tests for FairFiberMutex (core/fair_fiber_mutex.h): lock/unlock/try_lock, the standard lock types, FIFO
// order among fibers queued on one pinned carrier and among fibers and threads queued through lock(Future*),
// the async form with waitWithTimeout(), try_lock() refusing to barge past a queue, and the last owner
// destroying the mutex. The mutual-exclusion stress lives in tests/stress/sequencer_stress_test.cpp.
//
// No verdict depends on timing: sleeps and timeouts only make an interleaving likely.

#include "core/fair_fiber_mutex.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
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

constexpr int kDestroyRounds = kSanitized ? 500 : 2'000;
constexpr int kQueued = 64;

template <class T>
concept Cancellable = requires(T& f) { f.cancel(); };
static_assert(Cancellable<FiberSequencer::Future>);
static_assert(!Cancellable<FairFiberMutex::Future>, "a ticket cannot be given back, so cancel() is hidden");

using FairFiberMutexTest = WithRuntime;

TEST_F(FairFiberMutexTest, LockUnlockAndTryLock) {
    FairFiberMutex m;
    EXPECT_TRUE(m.try_lock());
    EXPECT_FALSE(m.try_lock()) << "not recursive";
    m.unlock();
    m.lock();
    EXPECT_FALSE(m.try_lock());
    m.unlock();
    EXPECT_TRUE(on(0, [&m] {
                    m.lock();
                    const bool refused = !m.try_lock();
                    m.unlock();
                    return refused;
                }).join());
    EXPECT_TRUE(m.try_lock());
    m.unlock();
}

TEST_F(FairFiberMutexTest, WorksWithTheStandardLockTypes) {
    FairFiberMutex a;
    FairFiberMutex b;
    {
        std::lock_guard<FairFiberMutex> guard(a);
        EXPECT_FALSE(a.try_lock());
    }
    {
        std::unique_lock<FairFiberMutex> lock(a, std::try_to_lock);
        EXPECT_TRUE(lock.owns_lock());
        lock.unlock();
        EXPECT_TRUE(a.try_lock());
        a.unlock();
        lock.lock();
        EXPECT_TRUE(lock.owns_lock());
    }
    {
        std::scoped_lock both(a, b);  // std::lock's deadlock avoidance needs try_lock()
        EXPECT_FALSE(a.try_lock());
        EXPECT_FALSE(b.try_lock());
    }
    EXPECT_TRUE(a.try_lock());
    EXPECT_TRUE(b.try_lock());
    a.unlock();
    b.unlock();
}

TEST_F(FairFiberMutexTest, FibersOnOnePinnedCarrierAcquireInTheOrderTheyQueued) {
    // Everything runs on carrier 0, so a fiber that has run at all has drawn its ticket and parked (it
    // cannot be interrupted in between). The holder starts them one at a time and lets each queue before
    // the next, then releases; each must get the lock in turn, even though each yields while holding it.
    FairFiberMutex m;
    auto holder = on(0, [this, &m] {
        std::vector<int> order;
        std::atomic<int> queued{0};
        m.lock();
        std::vector<FiberHandle<void>> fibers;
        for (int i = 0; i < kQueued; ++i) {
            fibers.push_back(on(0, [&m, &order, &queued, i] {
                queued.store(i + 1);
                m.lock();
                order.push_back(i);
                this_fiber::yield();  // the others stay queued; nobody barges
                this_fiber::yield();
                m.unlock();
            }));
            while (queued.load() != i + 1) { this_fiber::yield(); }
        }
        const bool refused = !m.try_lock();
        m.unlock();
        for (auto& f : fibers) { f.join(); }
        bool inOrder = refused && order.size() == kQueued;
        for (size_t i = 0; i < order.size(); ++i) { inOrder = inOrder && order[i] == static_cast<int>(i); }
        return inOrder;
    });
    EXPECT_TRUE(holder.join());
}

TEST_F(FairFiberMutexTest, FibersAndThreadsQueuedThroughFuturesAcquireInOrder) {
    // lock(Future*) draws the ticket before it returns, so each contender can say "queued" and only then
    // wait: the queue order is known exactly, across both carriers and plain threads.
    FairFiberMutex m;
    std::vector<int> order;
    std::atomic<int> queued{0};
    auto contender = [&m, &order, &queued](int i) {
        FairFiberMutex::Future f;
        m.lock(&f);
        queued.store(i + 1);
        if (f.wait() != 0) { std::abort(); }
        order.push_back(i);
        this_fiber::yield();
        m.unlock();
    };
    m.lock();
    std::vector<FiberHandle<void>> fibers;
    std::vector<std::thread> threads;
    for (int i = 0; i < kQueued; ++i) {
        if (i % 4 == 3) {
            threads.emplace_back(contender, i);
        } else {
            fibers.push_back(on(i % 2, [&contender, i] { contender(i); }));
        }
        while (queued.load() != i + 1) { std::this_thread::yield(); }
    }
    m.unlock();
    for (auto& f : fibers) { f.join(); }
    for (auto& t : threads) { t.join(); }
    ASSERT_EQ(order.size(), static_cast<size_t>(kQueued));
    for (int i = 0; i < kQueued; ++i) { EXPECT_EQ(order[static_cast<size_t>(i)], i); }
}

TEST_F(FairFiberMutexTest, AsyncLockGrantsOwnershipWhenTheFutureIsSet) {
    FairFiberMutex m;
    FairFiberMutex::Future free;
    m.lock(&free);
    ASSERT_TRUE(free.isSet()) << "a free mutex is granted before lock() returns";
    EXPECT_EQ(free.wait(), 0);
    EXPECT_FALSE(m.try_lock());

    // Queued behind ourselves: only our unlock() can serve it. A timeout does not give the ticket back.
    FairFiberMutex::Future queued;
    m.lock(&queued);
    EXPECT_FALSE(queued.isSet());
    EXPECT_EQ(FiberFuture::waitWithTimeout(&queued, 1ms), -ETIMEDOUT);
    m.unlock();
    EXPECT_EQ(queued.wait(), 0) << "the lock passed to the queued ticket";
    EXPECT_FALSE(m.try_lock()) << "and it is owned now";
    m.unlock();

    // A fiber holds it; a thread queues asynchronously and waits.
    std::atomic<bool> held{false};
    std::atomic<bool> release{false};
    auto owner = on(1, [&] {
        m.lock();
        held.store(true);
        while (!release.load()) { this_fiber::yield(); }
        m.unlock();
    });
    while (!held.load()) { std::this_thread::yield(); }
    FairFiberMutex::Future f;
    m.lock(&f);
    EXPECT_FALSE(f.isSet());
    release.store(true);
    EXPECT_EQ(f.wait(), 0);
    owner.join();
    m.unlock();
    EXPECT_TRUE(m.try_lock());
    m.unlock();
}

TEST_F(FairFiberMutexTest, TryLockDoesNotBargePastTheQueue) {
    FairFiberMutex m;
    m.lock();
    FairFiberMutex::Future next;
    m.lock(&next);
    m.unlock();  // hands the lock to `next`, which has not even looked yet
    EXPECT_FALSE(m.try_lock());
    EXPECT_TRUE(on(0, [&m] { return !m.try_lock(); }).join());
    EXPECT_EQ(next.wait(), 0);
    m.unlock();
    EXPECT_TRUE(m.try_lock());
    m.unlock();
}

TEST_F(FairFiberMutexTest, TheLastOwnerMayDestroyTheMutex) {
    // The thread unlocks to a queued fiber, which unlocks and frees the mutex at once: the pthread rule.
    // ASan reports any touch by the first unlock() after the hand-over.
    for (int r = 0; r < kDestroyRounds; ++r) {
        auto* m = new FairFiberMutex;
        m->lock();
        std::atomic<bool> queued{false};
        auto next = anywhere([m, &queued] {
            FairFiberMutex::Future f;
            m->lock(&f);
            queued.store(true);
            (void)f.wait();
            m->unlock();
            delete m;
        });
        if (r % 2 == 0) {
            while (!queued.load()) { std::this_thread::yield(); }
        }
        m->unlock();
        next.join();
    }
}

}  // namespace
}  // namespace spindle
