// SPDX-License-Identifier: Apache-2.0
// Stress tests for FiberMutex and FiberFutex with invariants: fibers on two carriers and plain threads increment a
// plain counter under the mutex and the total is exact; readers under lock_shared never see a writer's two fields
// differ; producers and consumers meeting through a futex never lose a post (a lost one hangs, and the watchdog
// turns the hang into a failure).
//
// No verdict depends on timing. Counts shrink under the sanitizers to keep each test within about 15 seconds.

#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/fiber.h"
#include "core/fiber_futex.h"
#include "core/fiber_mutex.h"
#include "core/internal/waiter_table.h"
#include "core/runtime.h"
#include "tests/core/with_runtime.h"

namespace spindle {
namespace {

using namespace std::chrono_literals;
using namespace testing_support;

constexpr int kIncrements = kSanitized ? 300'000 : 1'000'000;
constexpr int kWrites = kSanitized ? 30'000 : 100'000;
constexpr int kItems = kSanitized ? 90'000 : 300'000;

using SyncStress = WithRuntime;

TEST_F(SyncStress, ACounterUnderTheMutexIsExact) {
    constexpr int kFibers = 8;
    constexpr int kThreads = 2;
    constexpr int kWorkers = kFibers + kThreads;
    static_assert(kIncrements % kWorkers == 0);
    FiberMutex m;
    uint64_t counter = 0;  // plain: the mutex alone guards it
    int inside = 0;        // plain: more than one holder at once would show here (and to TSan)
    std::atomic<uint64_t> overlaps{0};
    std::atomic<uint64_t> progress{0};
    Watchdog dog("counter under FiberMutex", progress, 60s);

    auto work = [&](int id) {
        for (int i = 0; i < kIncrements / kWorkers; ++i) {
            // Every way in: lock(), try_lock() falling back to a lock_guard, and unique_lock.
            std::unique_lock<FiberMutex> lock(m, std::defer_lock);
            if ((i + id) % 3 == 0) {
                if (!lock.try_lock()) { lock.lock(); }
            } else {
                lock.lock();
            }
            if (inside++ != 0) { overlaps.fetch_add(1); }
            ++counter;
            // Now and then the holder parks or yields while holding, so waiters meet an owner that is not
            // running (they must park, not spin).
            if (i % 512 == 0) { this_fiber::yield(); }
            --inside;
            lock.unlock();
            progress.fetch_add(1, std::memory_order_relaxed);
        }
    };
    std::vector<FiberHandle<void>> fibers;
    for (int i = 0; i < kFibers; ++i) { fibers.push_back(onUnpinned(i % 2, [&, i] { work(i); })); }
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i) { threads.emplace_back(work, kFibers + i); }
    for (auto& f : fibers) { f.join(); }
    for (auto& t : threads) { t.join(); }

    EXPECT_EQ(counter, static_cast<uint64_t>(kIncrements));
    EXPECT_EQ(overlaps.load(), 0u);
    EXPECT_EQ(detail::WaiterTable::instance().countWaiters(&m), 0u);
}

TEST_F(SyncStress, ReadersAlwaysSeeTheWritersInvariant) {
    // Writers keep a == b, changing them one at a time (with a yield in between now and then); readers under
    // lock_shared must never see them differ.
    constexpr int kWriterFibers = 2;
    constexpr int kReaderFibers = 4;
    FiberMutex m;
    uint64_t a = 0;
    uint64_t b = 0;
    std::atomic<int> writersLeft{kWriterFibers + 1};
    std::atomic<uint64_t> torn{0};
    std::atomic<uint64_t> reads{0};
    std::atomic<uint64_t> progress{0};
    Watchdog dog("readers and writers", progress, 60s);

    auto write = [&](int count) {
        for (int i = 0; i < count; ++i) {
            {
                std::lock_guard g(m);
                ++a;
                if (i % 64 == 0) { this_fiber::yield(); }
                ++b;
            }
            progress.fetch_add(1, std::memory_order_relaxed);
        }
        writersLeft.fetch_sub(1);
    };
    auto read = [&] {
        while (writersLeft.load() > 0) {
            {
                std::shared_lock l(m);
                if (a != b) { torn.fetch_add(1); }
                reads.fetch_add(1, std::memory_order_relaxed);
            }
            // Cooperative scheduling: a reader that never parks or yields keeps its carrier, and a
            // writer woken onto that carrier (not waiting yet, so readers do not defer to it) would
            // never run. The watchdog caught that once in a loaded run.
            this_fiber::yield();
        }
    };
    std::vector<FiberHandle<void>> fibers;
    for (int i = 0; i < kWriterFibers; ++i) { fibers.push_back(onUnpinned(i % 2, [&] { write(kWrites / 4); })); }
    for (int i = 0; i < kReaderFibers; ++i) { fibers.push_back(onUnpinned(i % 2, read)); }
    std::thread threadWriter(write, kWrites / 2);
    std::thread threadReader(read);
    for (auto& f : fibers) { f.join(); }
    threadWriter.join();
    threadReader.join();

    EXPECT_EQ(torn.load(), 0u);
    EXPECT_EQ(a, static_cast<uint64_t>(kWrites));
    EXPECT_EQ(b, static_cast<uint64_t>(kWrites));
    EXPECT_GT(reads.load(), 0u);
}

TEST_F(SyncStress, FutexProducersAndConsumersNeverLoseAPost) {
    // Producers make items available and post; consumers take items and, when none is left, wait for a post
    // after the get() they checked under. The consumer that takes the last item posts once more so that the
    // others see the end. A lost post leaves a consumer parked for ever: the watchdog catches it. Some
    // consumers wait with short limits, so that timeouts race with posts too.
    constexpr int kProducerFibers = 2;
    constexpr int kConsumerFibers = 3;
    constexpr int kProducers = kProducerFibers + 1;
    static_assert(kItems % kProducers == 0);
    FiberFutex posted;
    std::atomic<int64_t> available{0};
    std::atomic<uint64_t> taken{0};
    std::atomic<uint64_t> timeouts{0};
    Watchdog dog("futex producers and consumers", taken, 60s);

    auto produce = [&] {
        for (int i = 0; i < kItems / kProducers; ++i) {
            available.fetch_add(1);
            posted.post();
            if (i % 256 == 0) { this_fiber::yield(); }
        }
    };
    auto consume = [&](bool timed) {
        uint64_t mine = 0;
        for (;;) {
            const uint64_t seen = posted.get();
            if (taken.load() == static_cast<uint64_t>(kItems)) { break; }
            int64_t n = available.load();
            if (n > 0 && available.compare_exchange_strong(n, n - 1)) {
                ++mine;
                if (taken.fetch_add(1) + 1 == static_cast<uint64_t>(kItems)) { posted.post(); }
                continue;
            }
            if (!timed) {
                posted.wait(seen + 1);
            } else if (posted.waitFor(seen + 1, 50us) == -ETIMEDOUT) {
                timeouts.fetch_add(1, std::memory_order_relaxed);
            }
        }
        return mine;
    };
    std::vector<FiberHandle<uint64_t>> consumers;
    for (int i = 0; i < kConsumerFibers; ++i) {
        consumers.push_back(onUnpinned(i % 2, [&, i] { return consume(i == 0); }));
    }
    uint64_t threadTook = 0;
    std::thread threadConsumer([&] { threadTook = consume(false); });
    std::vector<FiberHandle<void>> producers;
    for (int i = 0; i < kProducerFibers; ++i) { producers.push_back(onUnpinned(i % 2, produce)); }
    std::thread threadProducer(produce);

    for (auto& p : producers) { p.join(); }
    threadProducer.join();
    uint64_t total = 0;
    for (auto& c : consumers) { total += c.join(); }
    threadConsumer.join();
    total += threadTook;

    EXPECT_EQ(total, static_cast<uint64_t>(kItems)) << "each item taken once";
    EXPECT_EQ(available.load(), 0);
    EXPECT_EQ(posted.get(), static_cast<uint64_t>(kItems) + 1);
    EXPECT_EQ(detail::WaiterTable::instance().countWaiters(&posted), 0u);
    RecordProperty("timedWaitsThatRanOut", std::to_string(timeouts.load()));
}

}  // namespace
}  // namespace spindle
