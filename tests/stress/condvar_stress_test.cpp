// SPDX-License-Identifier: Apache-2.0
// Stress tests for FiberCondVar (core/fiber_condvar.h) with fibers on two carriers and plain threads mixed:
// a bounded queue built on two condition variables delivers every item exactly once, under a fiber-aware
// lock and under a std::mutex, with untimed and timed consumers; and timed waiters racing notify_one()
// neither lose a wake-up (an untimed waiter would hang) nor get more wake-ups than there were notifies.
//
// No verdict depends on timing. A watchdog turns a lost wake-up (a hang) into a loud failure.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "core/fiber.h"
#include "core/fiber_condvar.h"
#include "core/runtime.h"
#include "tests/core/with_runtime.h"

namespace spindle {
namespace {

using namespace std::chrono_literals;
using namespace testing_support;

constexpr int kItems = kSanitized ? 50'000 : 100'000;
constexpr int kTokens = kSanitized ? 20'000 : 50'000;

using CondVarStress = WithRuntime;

/// A bounded FIFO queue: producers wait while it is full, consumers while it is empty.
template <class Lock>
class BoundedQueue {
public:
    explicit BoundedQueue(size_t capacity) : capacity_(capacity) {}

    void push(int item) {
        std::unique_lock lk(lock_);
        notFull_.wait(lk, [&] { return items_.size() < capacity_; });
        items_.push_back(item);
        lk.unlock();
        notEmpty_.notify_one();
    }

    /// The next item, or nothing once closed and drained. `timed`: wait in short slices (exercising
    /// timeouts) instead of one untimed wait.
    std::optional<int> pop(bool timed) {
        std::unique_lock lk(lock_);
        auto ready = [&] { return !items_.empty() || closed_; };
        if (timed) {
            while (!notEmpty_.wait_for(lk, 50us, ready)) {}
        } else {
            notEmpty_.wait(lk, ready);
        }
        if (items_.empty()) { return std::nullopt; }
        const int item = items_.front();
        items_.pop_front();
        lk.unlock();
        notFull_.notify_one();
        return item;
    }

    void close() {
        {
            std::lock_guard g(lock_);
            closed_ = true;
        }
        notEmpty_.notify_all();
    }

private:
    Lock lock_;
    FiberCondVar notFull_;
    FiberCondVar notEmpty_;
    std::deque<int> items_;  // guarded by lock_
    bool closed_ = false;    // guarded by lock_
    const size_t capacity_;
};

/// N producers and M consumers, each either a fiber or a plain thread, move kItems items through a queue
/// of capacity 4; every item must come out exactly once.
template <class Lock>
void runBoundedQueue(Runtime& rt, bool timedConsumers) {
    constexpr int kProducers = 4;  // 3 fibers, 1 thread
    constexpr int kConsumers = 4;  // 3 fibers, 1 thread
    static_assert(kItems % kProducers == 0);
    BoundedQueue<Lock> queue(4);
    std::vector<std::atomic<uint8_t>> seen(kItems);
    std::atomic<uint64_t> delivered{0};
    Watchdog dog("bounded queue", delivered, 60s);

    auto produce = [&](int p) {
        for (int i = p; i < kItems; i += kProducers) { queue.push(i); }
    };
    auto consume = [&](bool timed) {
        while (auto item = queue.pop(timed)) {
            seen[static_cast<size_t>(*item)].fetch_add(1, std::memory_order_relaxed);
            delivered.fetch_add(1, std::memory_order_relaxed);
        }
    };

    std::vector<FiberHandle<void>> fibers;
    std::vector<std::thread> consumerThreads;
    for (int c = 0; c < kConsumers - 1; ++c) {
        fibers.push_back(rt.spawn([&, c] { consume(timedConsumers && c % 2 == 0); }).value());
    }
    consumerThreads.emplace_back([&] { consume(timedConsumers); });
    std::vector<FiberHandle<void>> producers;
    for (int p = 0; p < kProducers - 1; ++p) { producers.push_back(rt.spawn([&, p] { produce(p); }).value()); }
    std::thread producerThread([&] { produce(kProducers - 1); });

    for (auto& p : producers) { p.join(); }
    producerThread.join();
    queue.close();
    for (auto& f : fibers) { f.join(); }
    for (auto& t : consumerThreads) { t.join(); }

    EXPECT_EQ(delivered.load(), static_cast<uint64_t>(kItems));
    int missing = 0;
    int doubled = 0;
    for (auto& s : seen) {
        missing += s.load() == 0;
        doubled += s.load() > 1;
    }
    EXPECT_EQ(missing, 0);
    EXPECT_EQ(doubled, 0);
}

TEST_F(CondVarStress, BoundedQueueDeliversEveryItemOnceUnderAFiberLock) {
    runBoundedQueue<SemLock>(*runtime_, /*timedConsumers=*/false);
}

TEST_F(CondVarStress, BoundedQueueDeliversEveryItemOnceUnderAStdMutex) {
    runBoundedQueue<std::mutex>(*runtime_, /*timedConsumers=*/false);
}

TEST_F(CondVarStress, BoundedQueueWithTimedConsumersDeliversEveryItemOnce) {
    runBoundedQueue<SemLock>(*runtime_, /*timedConsumers=*/true);
}

TEST_F(CondVarStress, TimedWaitersRacingNotifiesLoseAndDoubleNothing) {
    // A notifier hands out kTokens tokens, one notify_one() each (under the lock, right after adding the
    // token). Waiters take tokens; some wait with short deadlines, so deadlines keep racing notifies, and
    // some wait without one, so a wake-up lost to a stale or withdrawn node would leave a token untaken and
    // an untimed waiter asleep forever (the watchdog fires). And since a waiter wakes only for a notify that
    // picked it (or its deadline), no_timeout returns plus untimed returns cannot exceed the notifies.
    FiberCondVar cv;
    SemLock lock;
    int64_t tokens = 0;  // guarded by lock
    bool done = false;   // guarded by lock
    std::atomic<uint64_t> taken{0};
    std::atomic<uint64_t> notifies{0};
    std::atomic<uint64_t> wakeUps{0};  // returns caused by a notify (no_timeout, or an untimed wait)
    std::atomic<uint64_t> timeouts{0};
    Watchdog dog("tokens", taken, 60s);

    auto waiter = [&](bool timed, unsigned seed) {
        std::minstd_rand rng(seed);
        std::unique_lock lk(lock);
        for (;;) {
            while (tokens == 0 && !done) {
                if (timed) {
                    if (cv.wait_for(lk, std::chrono::microseconds(rng() % 40)) == std::cv_status::timeout) {
                        timeouts.fetch_add(1, std::memory_order_relaxed);
                    } else {
                        wakeUps.fetch_add(1, std::memory_order_relaxed);
                    }
                } else {
                    cv.wait(lk);
                    wakeUps.fetch_add(1, std::memory_order_relaxed);
                }
            }
            if (tokens == 0) { return; }  // done
            --tokens;
            taken.fetch_add(1, std::memory_order_relaxed);
        }
    };

    std::vector<FiberHandle<void>> fibers;
    for (unsigned i = 0; i < 6; ++i) {
        fibers.push_back(runtime_->spawn([&, i] { waiter(/*timed=*/i % 3 != 0, i); }).value());
    }
    std::vector<std::thread> threads;
    threads.emplace_back([&] { waiter(true, 100); });
    threads.emplace_back([&] { waiter(false, 101); });

    auto notifier = [&](int count) {
        for (int i = 0; i < count; ++i) {
            {
                std::lock_guard g(lock);
                ++tokens;
                cv.notify_one();
                notifies.fetch_add(1, std::memory_order_relaxed);
            }
            if (i % 64 == 0) { this_fiber::yield(); }
        }
    };
    auto nf = runtime_->spawn([&] { notifier(kTokens / 2); }).value();
    std::thread nt([&] { notifier(kTokens - kTokens / 2); });
    nf.join();
    nt.join();

    // Wait until every token is taken (waiters must not be told to stop before), then release them.
    while (taken.load() < static_cast<uint64_t>(kTokens)) { std::this_thread::sleep_for(1ms); }
    {
        std::lock_guard g(lock);
        done = true;
    }
    cv.notify_all();
    for (auto& f : fibers) { f.join(); }
    for (auto& t : threads) { t.join(); }

    EXPECT_EQ(taken.load(), static_cast<uint64_t>(kTokens));
    // notify_all() above may wake up to 8 more.
    EXPECT_LE(wakeUps.load(), notifies.load() + 8);
    std::printf("notifies %llu, wake-ups %llu, timeouts %llu\n", static_cast<unsigned long long>(notifies.load()),
                static_cast<unsigned long long>(wakeUps.load()), static_cast<unsigned long long>(timeouts.load()));
}

}  // namespace
}  // namespace spindle
