// SPDX-License-Identifier: Apache-2.0
// Tests for ChaseLevDeque: single-threaded order and growth, then concurrent
// conservation (every pushed item is taken exactly once, by the owner or by
// exactly one thief). Verdicts never depend on timing; the stress tests only
// get more interleavings when the machine is faster.

#include "core/internal/chase_lev_deque.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <latch>
#include <optional>
#include <random>
#include <stop_token>
#include <thread>
#include <vector>

#include "tests/core/with_runtime.h"

namespace spindle::detail {
namespace {

using namespace testing_support;

// Sanitizer builds run 5-20x slower and CI gives them two cores; keep each
// stress test well under ten seconds there.
constexpr int kStressItems = kSanitized ? (1 << 14) : (1 << 16);
constexpr int kBurstRounds = kSanitized ? (1 << 13) : (1 << 15);
constexpr int kRepeats = kSanitized ? 4 : 8;
constexpr int kThieves = 3;

TEST(ChaseLevDeque, EmptyYieldsNothing) {
    ChaseLevDeque<int> deque;
    EXPECT_TRUE(deque.emptyApprox());
    EXPECT_EQ(deque.sizeApprox(), 0u);
    EXPECT_EQ(deque.pop(), std::nullopt);
    EXPECT_EQ(deque.steal(), std::nullopt);
    // A failed pop must restore bottom: the deque still works afterwards.
    deque.push(7);
    EXPECT_EQ(deque.sizeApprox(), 1u);
    EXPECT_EQ(deque.steal(), 7);
    EXPECT_EQ(deque.pop(), std::nullopt);
    EXPECT_TRUE(deque.emptyApprox());
}

TEST(ChaseLevDeque, PopIsLifo) {
    ChaseLevDeque<int> deque(4);
    for (int i = 0; i < 10; ++i) { deque.push(i); }
    EXPECT_EQ(deque.sizeApprox(), 10u);
    for (int i = 9; i >= 0; --i) { EXPECT_EQ(deque.pop(), i); }
    EXPECT_EQ(deque.pop(), std::nullopt);
}

TEST(ChaseLevDeque, StealIsFifo) {
    ChaseLevDeque<int> deque(4);
    for (int i = 0; i < 10; ++i) { deque.push(i); }
    for (int i = 0; i < 10; ++i) { EXPECT_EQ(deque.steal(), i); }
    EXPECT_EQ(deque.steal(), std::nullopt);
    EXPECT_TRUE(deque.emptyApprox());
}

TEST(ChaseLevDeque, PopAndStealMeetInTheMiddle) {
    ChaseLevDeque<int> deque(3);
    for (int i = 0; i < 7; ++i) { deque.push(i); }
    EXPECT_EQ(deque.steal(), 0);
    EXPECT_EQ(deque.pop(), 6);
    EXPECT_EQ(deque.steal(), 1);
    EXPECT_EQ(deque.pop(), 5);
    EXPECT_EQ(deque.steal(), 2);
    EXPECT_EQ(deque.pop(), 4);
    EXPECT_EQ(deque.pop(), 3);  // the last item, taken through the CAS path
    EXPECT_EQ(deque.pop(), std::nullopt);
    EXPECT_EQ(deque.steal(), std::nullopt);
}

TEST(ChaseLevDeque, WrapsAroundWithoutGrowing) {
    ChaseLevDeque<int> deque(2);  // four slots
    int next = 0;
    int expected = 0;
    for (int round = 0; round < 100; ++round) {
        for (int k = 0; k < 4; ++k) { deque.push(next++); }
        EXPECT_EQ(deque.sizeApprox(), 4u);
        for (int k = 0; k < 4; ++k) { EXPECT_EQ(deque.steal(), expected++); }
    }
    EXPECT_TRUE(deque.emptyApprox());
}

TEST(ChaseLevDeque, GrowthKeepsEveryItem) {
    for (unsigned logCapacity : {0u, 2u}) {
        ChaseLevDeque<int> deque(logCapacity);
        constexpr int kItems = 10000;
        int oldest = 0;
        // Steal now and then so top is not at zero when the buffer grows: the
        // live range then straddles the wrap point of the old buffer.
        for (int i = 0; i < kItems; ++i) {
            deque.push(i);
            if (i % 3 == 0) { ASSERT_EQ(deque.steal(), oldest++); }
        }
        ASSERT_EQ(deque.sizeApprox(), static_cast<size_t>(kItems - oldest));
        for (int i = kItems - 1; i >= oldest; --i) { ASSERT_EQ(deque.pop(), i); }
        EXPECT_EQ(deque.pop(), std::nullopt);
        EXPECT_EQ(deque.steal(), std::nullopt);
    }
}

// Counts takes per item, from the owner and from thieves alike.
class TakeCounter {
public:
    explicit TakeCounter(size_t items) : seen_(items) {}
    void take(std::optional<int> v) {
        if (v) { seen_[static_cast<size_t>(*v)].fetch_add(1, std::memory_order_relaxed); }
    }
    // Items [0, pushed) were taken exactly once; the rest never appeared.
    void expectEachTakenOnce(size_t pushed) const {
        for (size_t i = 0; i < seen_.size(); ++i) {
            const unsigned times = seen_[i].load(std::memory_order_relaxed);
            ASSERT_EQ(times, i < pushed ? 1u : 0u) << "item " << i;
        }
    }

private:
    std::vector<std::atomic<uint8_t>> seen_;
};

// kThieves threads that call steal() and hand each item to onTake(item, thief)
// until join(). The constructor returns only once every thief is running, so
// a fast owner cannot finish its pushes before they start.
template <class T, class OnTake>
class ThiefGang {
public:
    ThiefGang(ChaseLevDeque<T>& deque, OnTake onTake) : started_(kThieves + 1) {
        for (int t = 0; t < kThieves; ++t) {
            threads_.emplace_back([this, &deque, onTake, t](const std::stop_token& st) {
                started_.count_down();
                while (!st.stop_requested()) {
                    if (std::optional<T> v = deque.steal()) {
                        onTake(*v, t);
                        stolen_.fetch_add(1, std::memory_order_relaxed);
                    } else {
                        std::this_thread::yield();  // lets the owner run on a two-core machine
                    }
                }
            });
        }
        started_.arrive_and_wait();
    }

    // Stops and joins the thieves; returns how many items they took. Call it
    // after the owner has drained the deque, so stopping strands nothing.
    int join() {
        for (std::jthread& t : threads_) { t.request_stop(); }
        for (std::jthread& t : threads_) { t.join(); }
        return stolen_.load(std::memory_order_relaxed);
    }

private:
    std::latch started_;
    std::atomic<int> stolen_{0};
    std::vector<std::jthread> threads_;  // last, so ~jthread joins before the rest dies
};

void takeEachItemOnce() {
    ChaseLevDeque<int> deque(/*logCapacity=*/2);  // small, so growth races with thieves
    TakeCounter counter(kStressItems);
    ThiefGang thieves(deque, [&](int v, int) { counter.take(v); });
    for (int i = 0; i < kStressItems; ++i) {
        deque.push(i);
        if (i % 4 == 0) { counter.take(deque.pop()); }
    }
    while (std::optional<int> v = deque.pop()) { counter.take(v); }
    const int stolen = thieves.join();
    EXPECT_TRUE(deque.emptyApprox());
    counter.expectEachTakenOnce(kStressItems);
    testing::Test::RecordProperty("stolen", stolen);  // informational: how hard the thieves raced
}

TEST(ChaseLevDequeStress, TakesEachItemOnce) {
    for (int repeat = 0; repeat < kRepeats; ++repeat) {
        SCOPED_TRACE(repeat);
        takeEachItemOnce();
    }
}

void ownerBurstsTakeEachItemOnce(unsigned seed) {
    constexpr int kMaxItems = kBurstRounds * 40;
    ChaseLevDeque<int> deque(/*logCapacity=*/1);
    TakeCounter counter(kMaxItems);
    std::mt19937 rng(seed);
    int pushed = 0;
    ThiefGang thieves(deque, [&](int v, int) { counter.take(v); });
    for (int round = 0; round < kBurstRounds; ++round) {
        const int burst = round % 64 == 0 ? 32 : static_cast<int>(rng() % 6) + 1;
        for (int k = 0; k < burst; ++k) { deque.push(pushed++); }
        const int pops = static_cast<int>(rng() % 8);
        for (int k = 0; k < pops; ++k) { counter.take(deque.pop()); }
    }
    while (std::optional<int> v = deque.pop()) { counter.take(v); }
    const int stolen = thieves.join();
    ASSERT_LE(pushed, kMaxItems);
    EXPECT_TRUE(deque.emptyApprox());
    counter.expectEachTakenOnce(static_cast<size_t>(pushed));
    testing::Test::RecordProperty("stolen", stolen);
}

TEST(ChaseLevDequeStress, OwnerBurstsTakeEachItemOnce) {
    // Bursts keep the deque oscillating around a few items, so pop() often
    // races thieves for the last item; a long burst every 64 rounds forces growth.
    for (int repeat = 0; repeat < kRepeats; ++repeat) {
        SCOPED_TRACE(repeat);
        ownerBurstsTakeEachItemOnce(12345u + static_cast<unsigned>(repeat));
    }
}

// The runtime stores Fiber*: what the owner wrote into an object before
// pushing its pointer must be visible to the thread that takes it. Plain
// (non-atomic) fields let TSan check that happens-before edge.
struct Task {
    int payload = 0;
    int takenBy = -1;
};

TEST(ChaseLevDequeStress, TakerSeesWritesMadeBeforePush) {
    std::vector<Task> tasks(kStressItems);
    ChaseLevDeque<Task*> deque(/*logCapacity=*/2);
    std::atomic<int> taken{0};
    auto consume = [&](Task* task, int who) {
        EXPECT_EQ(task->payload, static_cast<int>(task - tasks.data()) * 3 + 1);
        EXPECT_EQ(task->takenBy, -1);
        task->takenBy = who;
        taken.fetch_add(1, std::memory_order_relaxed);
    };
    ThiefGang thieves(deque, consume);
    for (int i = 0; i < kStressItems; ++i) {
        tasks[static_cast<size_t>(i)].payload = i * 3 + 1;
        deque.push(&tasks[static_cast<size_t>(i)]);
        if (i % 8 == 0) {
            if (std::optional<Task*> task = deque.pop()) { consume(*task, kThieves); }
        }
    }
    while (std::optional<Task*> task = deque.pop()) { consume(*task, kThieves); }
    thieves.join();
    EXPECT_EQ(taken.load(), kStressItems);
    for (const Task& task : tasks) { ASSERT_NE(task.takenBy, -1); }
}

}  // namespace
}  // namespace spindle::detail
