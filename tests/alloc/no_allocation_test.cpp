// SPDX-License-Identifier: Apache-2.0
// The hot paths allocate nothing once warm (issue 17, item 12): spawn and join on a carrier and across
// carriers, the I/O calls (with and without a deadline), sleeps, and wake-ups from another thread. This
// program counts every allocation made in the process (testing/alloc_hook.h) while a test looks; the
// benchmarks report the same, but only a test can fail on it.
//
// The runtimes here run without the stall detector, whose report (only on a stall, which a sanitizer's
// slowness could cause) formats a log line.

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <new>
#include <vector>

#include "core/fiber.h"
#include "core/fiber_event.h"
#include "core/io.h"
#include "core/runtime.h"
#include "testing/alloc_hook.h"

namespace spindle {
namespace {

using namespace std::chrono_literals;

/// Counts the allocations made anywhere in the process while alive.
class CountAllocations {
public:
    CountAllocations() noexcept : before_(alloc_hook::processAllocations()) {}
    [[nodiscard]] uint64_t count() const noexcept { return alloc_hook::processAllocations() - before_; }
    CountAllocations(const CountAllocations&) = delete;
    CountAllocations& operator=(const CountAllocations&) = delete;

private:
    uint64_t before_;
};

// The counter itself: a test that could not fail would prove nothing.
TEST(NoAllocation, TheCounterSeesAnAllocation) {
    if (!alloc_hook::available()) { GTEST_SKIP() << "no operator new replacement in this build (TSan)"; }
    static int* volatile sink = nullptr;  // the compiler may not elide an allocation it cannot see die
    CountAllocations c;
    sink = new int(7);
    const uint64_t seen = c.count();
    delete sink;
    EXPECT_EQ(seen, 1u);
}

Runtime quietRuntime() {
    RuntimeOptions o;
    o.carriers = 2;
    o.stallThresholdMs = 0;
    auto rt = Runtime::start(o);
    if (!rt) { std::abort(); }
    return std::move(*rt);
}

/// Spawn and join on this carrier, `n` times; then `n` spawns aimed at `other` and their joins.
void spawnRound(int n, int other) {
    for (int i = 0; i < n; ++i) {
        auto h = spawn([] { return 1; });
        if (!h || h->join() != 1) { std::abort(); }
    }
    for (int i = 0; i < n; ++i) {
        auto h = spawn([] { return 2; }, SpawnOptions{.carrier = other});
        if (!h || h->join() != 2) { std::abort(); }
    }
}

TEST(NoAllocation, SpawnAndJoinOnceWarm) {
    if (!alloc_hook::available()) { GTEST_SKIP() << "no operator new replacement in this build (TSan)"; }
    Runtime rt = quietRuntime();
    uint64_t allocations = 1;
    rt.spawn([&] {
          spawnRound(5000, 1);  // warm: stacks pooled, credits taken, queues grown
          CountAllocations c;
          spawnRound(20000, 1);
          allocations = c.count();
      }, SpawnOptions{.carrier = 0, .pinned = true})
        .value()
        .join();
    EXPECT_EQ(allocations, 0u);
}

/// One round of the I/O calls: a write and a read through a pipe, with and without a deadline, a nop, a
/// short sleep.
void ioRound(int r, int w, int n) {
    char c = 0;
    for (int i = 0; i < n; ++i) {
        if (!spindle::write(w, "x", 1) || !spindle::read(r, &c, 1)) { std::abort(); }
        if (!spindle::write(w, "y", 1, kCurrentPosition, 5s) || !spindle::read(r, &c, 1, kCurrentPosition, 5s)) {
            std::abort();
        }
        if (!spindle::nop()) { std::abort(); }
        if (i % 16 == 0 && !this_fiber::sleep_for(1us)) { std::abort(); }
    }
}

TEST(NoAllocation, IoCallsOnceWarm) {
    if (!alloc_hook::available()) { GTEST_SKIP() << "no operator new replacement in this build (TSan)"; }
    Runtime rt = quietRuntime();
    int p[2];
    ASSERT_EQ(::pipe(p), 0);
    uint64_t allocations = 1;
    rt.spawn([&] {
          ioRound(p[0], p[1], 2000);
          CountAllocations c;
          ioRound(p[0], p[1], 10000);
          allocations = c.count();
      }, SpawnOptions{.carrier = 0, .pinned = true})
        .value()
        .join();
    EXPECT_EQ(allocations, 0u);
    ::close(p[0]);
    ::close(p[1]);
}

TEST(NoAllocation, WakeUpsFromAPlainThreadOnceWarm) {
    if (!alloc_hook::available()) { GTEST_SKIP() << "no operator new replacement in this build (TSan)"; }
    Runtime rt = quietRuntime();
    constexpr int kRounds = 5000;
    std::vector<FiberEvent> go(2 * kRounds);
    std::atomic<int> reached{0};
    auto h = rt.spawn([&] {
                   for (int i = 0; i < 2 * kRounds; ++i) {
                       reached.store(i + 1);
                       go[static_cast<size_t>(i)].wait();
                   }
               }, SpawnOptions{.carrier = 1})
                 .value();
    auto round = [&](int from) {
        for (int i = from; i < from + kRounds; ++i) {
            while (reached.load() <= i) { std::this_thread::yield(); }
            go[static_cast<size_t>(i)].set();
        }
    };
    round(0);
    uint64_t allocations = 1;
    {
        CountAllocations c;
        round(kRounds);
        h.join();
        allocations = c.count();
    }
    EXPECT_EQ(allocations, 0u);
}

}  // namespace
}  // namespace spindle
