// SPDX-License-Identifier: Apache-2.0
// The fiber stack pool (core/stack_pool.cpp, issue 17 items 1 and 2): size classes, slabs under one
// mapping with guard pages that still fault, reuse most-recent-first, scavenging least-recently-used
// first and only after a whole idle period, spares for other threads; and, through a runtime, a
// million idle fibers on one carrier.

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "core/fiber.h"
#include "core/fiber_event.h"
#include "core/internal/stack_pool.h"
#include "core/runtime.h"
#include "tests/core/with_runtime.h"

namespace spindle {
namespace {

using detail::Stack;
using detail::StackPool;
using testing_support::kSanitized;

constexpr uint64_t kNever = UINT64_MAX / 2;  // a scavenge period no test waits out

// Whether the kernel refuses to read `p` (a guard page faults; a present page does not).
bool unreadable(const void* p) {
    int fds[2];
    if (::pipe(fds) != 0) { return false; }
    const long r = ::syscall(SYS_write, fds[1], p, 1);
    const bool refused = r < 0 && errno == EFAULT;
    ::close(fds[0]);
    ::close(fds[1]);
    return refused;
}

// Whether the page at `p` has memory behind it.
bool resident(const void* p) {
    unsigned char v = 0;
    void* page = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(p) & ~(StackPool::pageSize() - 1));
    return ::mincore(page, StackPool::pageSize(), &v) == 0 && (v & 1) != 0;
}

class StackPoolTest : public testing::Test {
protected:
    StackPoolTest() : pool_(kNever) { pool_.claimForThisThread(); }
    Stack take(size_t size) {
        auto s = pool_.acquire(size);
        EXPECT_TRUE(s) << s.error().message();
        return s ? *s : Stack{};
    }
    // Touches every page of the stack, as a deep fiber would.
    static void touch(const Stack& s) {
        for (char* p = s.usableBottom(); p < s.top(); p += StackPool::pageSize()) { *static_cast<volatile char*>(p) = 1; }
    }
    StackPool pool_;
};

TEST_F(StackPoolTest, SizesRoundUpToTheirClassAndAboveTheLargestAreMappedAlone) {
    EXPECT_EQ(StackPool::classSize(1), 16u * 1024);
    EXPECT_EQ(StackPool::classSize(16 * 1024), 16u * 1024);
    EXPECT_EQ(StackPool::classSize(20 * 1024), 32u * 1024);
    EXPECT_EQ(StackPool::classSize(64 * 1024), 64u * 1024);
    EXPECT_EQ(StackPool::classSize(StackPool::kMaxClassSize), StackPool::kMaxClassSize);
    EXPECT_EQ(StackPool::classSize(StackPool::kMaxClassSize + 1), 0u);

    Stack a = take(20 * 1024);
    EXPECT_EQ(a.usableSize(), 32u * 1024);
    EXPECT_EQ(a.pool, &pool_);
    Stack big = take(StackPool::kMaxClassSize + 4096);
    EXPECT_EQ(big.pool, nullptr) << "mapped alone, unmapped on release";
    EXPECT_GE(big.usableSize(), StackPool::kMaxClassSize + 4096);
    EXPECT_EQ(pool_.inUse(), 1u);
    StackPool::release(a);
    StackPool::release(big);
    EXPECT_EQ(pool_.inUse(), 0u);
    EXPECT_EQ(pool_.warm(), 1u);
}

TEST_F(StackPoolTest, EveryStackOfASlabHasAGuardThatFaultsAndTheSlabIsFewMappings) {
    std::vector<Stack> stacks;
    for (int i = 0; i < 100; ++i) { stacks.push_back(take(16 * 1024)); }
    EXPECT_EQ(pool_.slabs(), 2u) << "64 stacks of 16 KiB to a slab";
    for (const Stack& s : stacks) {
        EXPECT_TRUE(unreadable(s.base)) << "guard of the stack at " << static_cast<void*>(s.base);
        EXPECT_FALSE(unreadable(s.usableBottom()));
        EXPECT_FALSE(unreadable(s.top() - 1));
    }
    for (const Stack& s : stacks) { StackPool::release(s); }
}

TEST_F(StackPoolTest, TheMostRecentlyReleasedStackIsReusedFirst) {
    Stack a = take(64 * 1024);
    Stack b = take(64 * 1024);
    StackPool::release(a);
    StackPool::release(b);
    const Stack first = take(64 * 1024);
    const Stack second = take(64 * 1024);
    EXPECT_EQ(first.base, b.base);
    EXPECT_EQ(second.base, a.base);
    EXPECT_EQ(pool_.mapped(), 30u) << "one slab of 30 stacks of 64 KiB, mapped once";
    EXPECT_EQ(pool_.trims(), 0u) << "neither acquire nor release makes a system call on a warm pool";
    StackPool::release(first);
    StackPool::release(second);
}

// "Cold means least recently used": a scavenge gives back the pages of the stacks that nobody took for a
// whole period, oldest first, keeps the most recent keepWarm, and leaves the stacks used in the period alone.
TEST_F(StackPoolTest, AScavengeTrimsOnlyStacksIdleForAWholePeriodOldestFirst) {
    std::vector<Stack> stacks;
    for (int i = 0; i < 100; ++i) {
        stacks.push_back(take(64 * 1024));
        touch(stacks.back());
    }
    for (const Stack& s : stacks) { StackPool::release(s); }  // stacks[99] is the most recent
    pool_.maintain();  // arms the scavenger: 100 warm, above the 16 kept
    ASSERT_NE(pool_.nextScavengeNs(), UINT64_MAX);
    pool_.scavenge(pool_.nextScavengeNs() - 1);
    EXPECT_EQ(pool_.trims(), 0u) << "not due yet";

    // During the period, ten stacks are used and given back: the low-water mark is 90.
    std::vector<Stack> used;
    for (int i = 0; i < 10; ++i) { used.push_back(take(64 * 1024)); }
    for (const Stack& s : used) { StackPool::release(s); }
    pool_.scavenge(pool_.nextScavengeNs());
    // 100 warm, 90 idle the whole period, at most 100 - 16 may go: min(84, 90) = 84, oldest first.
    EXPECT_EQ(pool_.trims(), 84u);
    EXPECT_EQ(pool_.warm(), 16u);
    for (int i = 0; i < 84; ++i) {
        EXPECT_FALSE(resident(stacks[static_cast<size_t>(i)].top() - 1)) << "stack " << i << " should be cold";
    }
    for (int i = 84; i < 100; ++i) {
        EXPECT_TRUE(resident(stacks[static_cast<size_t>(i)].top() - 1)) << "stack " << i << " should be warm";
    }
    EXPECT_TRUE(unreadable(stacks[0].base)) << "a trimmed stack keeps its guard";
    EXPECT_EQ(pool_.nextScavengeNs(), UINT64_MAX) << "nothing left above keepWarm: no more wake-ups";
    // 100 stacks of 64 KiB were 4 slabs of 30; the 84 oldest (slabs 0 and 1 whole, 24 of slab 2) are cold,
    // and a slab with every stack cold is unmapped.
    EXPECT_EQ(pool_.slabs(), 2u);
    // A cold stack is reused as it is (it faults its pages in again).
    std::vector<Stack> again;
    for (int i = 0; i < 40; ++i) { again.push_back(take(64 * 1024)); }
    EXPECT_EQ(pool_.slabs(), 2u) << "the cold stacks of the remaining slabs come before a new slab";
    for (const Stack& s : again) { StackPool::release(s); }
}

TEST_F(StackPoolTest, TrimNowKeepsOnlyTheMostRecentAndUnmapsEmptySlabs) {
    std::vector<Stack> stacks;
    for (int i = 0; i < 90; ++i) { stacks.push_back(take(64 * 1024)); }
    EXPECT_EQ(pool_.slabs(), 3u);
    for (const Stack& s : stacks) { StackPool::release(s); }
    pool_.trimNow();
    EXPECT_EQ(pool_.warm(), 16u);
    EXPECT_EQ(pool_.slabs(), 1u) << "the 16 kept are the last 16 of the third slab";
}

TEST_F(StackPoolTest, AStrangersReleaseIsFiledAtMaintenance) {
    Stack s = take(64 * 1024);
    std::thread([s] { StackPool::release(s); }).join();
    EXPECT_EQ(pool_.inUse(), 1u) << "not filed yet";
    pool_.maintain();
    EXPECT_EQ(pool_.inUse(), 0u);
    const Stack again = take(64 * 1024);
    EXPECT_EQ(again.base, s.base);
    StackPool::release(again);
}

TEST_F(StackPoolTest, OtherThreadsGetSparesOnceTheOwnerSetsThemAside) {
    Stack first;
    std::thread([&] {
        auto r = pool_.acquireForeign(64 * 1024);
        ASSERT_TRUE(r) << r.error().message();
        first = *r;
    }).join();
    EXPECT_EQ(first.pool, nullptr) << "a miss maps a stack alone";
    EXPECT_EQ(first.usableSize(), 64u * 1024);
    StackPool::release(first);  // unmapped
    pool_.maintain();           // the miss asked for spares
    EXPECT_EQ(pool_.inUse(), StackPool::kSpares) << "spares count as out of the pool";
    std::vector<Stack> got;
    std::thread([&] {
        for (unsigned i = 0; i < StackPool::kSpares; ++i) {
            auto r = pool_.acquireForeign(64 * 1024);
            ASSERT_TRUE(r);
            got.push_back(*r);
        }
    }).join();
    for (const Stack& s : got) {
        EXPECT_EQ(s.pool, &pool_) << "a spare comes from the pool's slabs";
        StackPool::release(s);  // owner thread: filed at once
    }
    EXPECT_EQ(pool_.inUse(), 0u);
}

// ---- through a runtime ---------------------------------------------------------------------------------------

// Resident memory of this process, in bytes.
uint64_t residentBytes() {
    std::ifstream statm("/proc/self/statm");
    uint64_t size = 0;
    uint64_t rss = 0;
    statm >> size >> rss;
    return rss * StackPool::pageSize();
}

// Issue 17, item 1: spawning 100,000 fibers that each waited on one FiberEvent failed at 32,729 ("fiber stack
// guard mprotect failed"), two mappings per stack against vm.max_map_count = 65,530. A million idle fibers must
// start and finish on one carrier, at about one page of memory each.
TEST(StackPoolRuntime, AMillionIdleFibersStartAndFinishOnOneCarrier) {
    SPINDLE_ONE_BACKEND_ENOUGH("a million fibers waiting on FiberEvents, no I/O (20 s per run)");
    if (!StackPool::guardRegions()) {
        GTEST_SKIP() << "no guard regions here (Linux 6.13's MADV_GUARD_INSTALL; qemu-user ignores it): "
                        "each stack costs two mappings and vm.max_map_count bounds the fibers";
    }
    // The sanitizers keep state per fiber (TSan: a thread state each), so they hold fewer; still three times
    // the old limit.
    const int kFibers = kSanitized ? 100'000 : 1'000'000;
    RuntimeOptions o;
    o.carriers = 1;
    auto rt = Runtime::start(o);
    ASSERT_TRUE(rt) << rt.error().message();
    FiberEvent go;
    std::atomic<int> parked{0};
    std::atomic<int> ran{0};
    std::vector<FiberHandle<void>> hs;
    hs.reserve(static_cast<size_t>(kFibers));
    const uint64_t before = residentBytes();
    auto driver = rt->spawn([&] {
        for (int i = 0; i < kFibers; ++i) {
            auto h = spindle::spawn([&] {
                parked.fetch_add(1, std::memory_order_relaxed);
                go.wait();
                ran.fetch_add(1, std::memory_order_relaxed);
            });
            if (!h) {
                ADD_FAILURE() << "spawn " << i << " failed: " << h.error().message();
                return;
            }
            hs.push_back(std::move(*h));
            if (i % 1024 == 1023) { this_fiber::yield(); }  // let them reach their wait
        }
    });
    ASSERT_TRUE(driver);
    driver->join();
    ASSERT_EQ(hs.size(), static_cast<size_t>(kFibers));
    while (parked.load() != kFibers) { std::this_thread::sleep_for(std::chrono::milliseconds(1)); }
    const uint64_t held = residentBytes() - before;
    const double perFiber = static_cast<double>(held) / kFibers;
    std::printf("%d idle fibers: %.0f MiB resident more, %.2f KiB each\n", kFibers,
                static_cast<double>(held) / (1 << 20), perFiber / 1024);
    if (!kSanitized) {
        // One touched page of stack each (the control block, the payload, the frames down to the wait), plus the
        // handle kept here and the slabs' share of a page table: the bound is 4.0 KiB of stack.
        EXPECT_LE(perFiber, 4.0 * 1024 + 64) << "resident memory per idle fiber";
    }
    go.set();
    for (auto& h : hs) { h.join(); }
    EXPECT_EQ(ran.load(), kFibers);
    rt->shutdown();
    rt->join();
}

}  // namespace
}  // namespace spindle
