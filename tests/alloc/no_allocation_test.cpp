// The hot paths allocate nothing once warm (issue 17, item 12): spawn and join on a carrier and across
// carriers, the I/O calls (with and without a deadline), sleeps, and wake-ups from another thread. This
// program replaces the global operator new and delete to count every allocation made in the process
// while a test has counting on; the benchmarks report the same, but only a test can fail on it.
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

namespace {

std::atomic<bool> gCounting{false};
std::atomic<uint64_t> gAllocations{0};

void* counted(std::size_t n, std::size_t align) {
    if (gCounting.load(std::memory_order_relaxed)) { gAllocations.fetch_add(1, std::memory_order_relaxed); }
    void* p = align <= alignof(std::max_align_t) ? std::malloc(n != 0 ? n : 1)
                                                  : std::aligned_alloc(align, (n + align - 1) / align * align);
    return p;
}

}  // namespace

// These are the process's operator new and delete: malloc and free underneath, by design.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

void* operator new(std::size_t n) {
    if (void* p = counted(n, 0)) { return p; }
    throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
    if (void* p = counted(n, 0)) { return p; }
    throw std::bad_alloc();
}
void* operator new(std::size_t n, std::align_val_t a) {
    if (void* p = counted(n, static_cast<std::size_t>(a))) { return p; }
    throw std::bad_alloc();
}
void* operator new[](std::size_t n, std::align_val_t a) {
    if (void* p = counted(n, static_cast<std::size_t>(a))) { return p; }
    throw std::bad_alloc();
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return counted(n, 0); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return counted(n, 0); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

namespace spindle {
namespace {

using namespace std::chrono_literals;

/// Counts the allocations made anywhere in the process while alive.
class CountAllocations {
public:
    CountAllocations() noexcept {
        gAllocations.store(0);
        gCounting.store(true);
    }
    ~CountAllocations() { gCounting.store(false); }
    [[nodiscard]] uint64_t count() const noexcept { return gAllocations.load(); }
    CountAllocations(const CountAllocations&) = delete;
    CountAllocations& operator=(const CountAllocations&) = delete;
};

// The counter itself: a test that could not fail would prove nothing.
TEST(NoAllocation, TheCounterSeesAnAllocation) {
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
