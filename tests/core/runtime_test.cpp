// SPDX-License-Identifier: Apache-2.0
// Tests for the runtime and its fibers (core/runtime.h, core/fiber.h): run() and start(), option and spawn
// errors, many fibers across carriers, exceptions through join, joins from threads and fibers, yield, waking a
// parked carrier, detach, this_fiber, and the counters.
//
// No verdict depends on timing: where a test sleeps, it does so only to make the interesting path likely.

#include "core/internal/stack_pool.h"
#include "core/runtime.h"
#include "tests/core/with_runtime.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "core/fiber.h"
#include "core/fiber_future.h"
#include "core/io.h"

namespace spindle {
namespace {

using namespace std::chrono_literals;
using namespace testing_support;

constexpr int kManyFibers = kSanitized ? 10'000 : 100'000;
// Live handles at a time: every live stack costs two VMAs (stack and guard), and vm.max_map_count is 65530.
constexpr int kBatch = 2'000;

using RuntimeTest = WithRuntime;

// ---- Runtime::run ----------------------------------------------------------------------------------------

TEST(RuntimeRun, ReturnsTheMainFibersValue) {
    auto r = Runtime::run([] { return 42; }, withCarriers(2));
    ASSERT_TRUE(r) << r.error().message();
    EXPECT_EQ(*r, 42);

    auto s = Runtime::run([] { return std::string(100, 'x') + std::string(this_fiber::name()); }, withCarriers(1));
    ASSERT_TRUE(s) << s.error().message();
    EXPECT_EQ(*s, std::string(100, 'x') + "main");
}

TEST(RuntimeRun, RunsAVoidMainFiber) {
    bool ranOnFiber = false;
    auto r = Runtime::run([&] { ranOnFiber = this_fiber::inFiber(); }, withCarriers(2));
    ASSERT_TRUE(r) << r.error().message();
    EXPECT_TRUE(ranOnFiber);
}

TEST(RuntimeRun, ReturnsOnlyOnceEveryFiberIsDone) {
    constexpr int kDetached = 50;
    std::atomic<int> finished{0};
    auto r = Runtime::run(
        [&] {
            for (int i = 0; i < kDetached; ++i) {
                auto h = spindle::spawn([&finished, i] {
                    (void)this_fiber::sleep_for(std::chrono::milliseconds(1 + i % 5));
                    finished.fetch_add(1, std::memory_order_relaxed);
                });
                if (h) { h->detach(); }
            }
            return 7;
        },
        withCarriers(2));
    ASSERT_TRUE(r) << r.error().message();
    EXPECT_EQ(*r, 7);
    EXPECT_EQ(finished.load(), kDetached);
}

TEST(RuntimeRun, RethrowsTheMainFibersException) {
    try {
        (void)Runtime::run([]() -> int { throw std::runtime_error("main failed"); }, withCarriers(2));
        FAIL() << "Runtime::run returned instead of rethrowing";
    } catch (const std::runtime_error& e) {
        EXPECT_STREQ(e.what(), "main failed");
    }
    // And from a void main fiber that threw after blocking (it may have moved to another carrier).
    try {
        (void)Runtime::run(
            [] {
                (void)this_fiber::sleep_for(1ms);
                this_fiber::yield();
                throw std::logic_error("void main failed");
            },
            withCarriers(2));
        FAIL() << "Runtime::run returned instead of rethrowing";
    } catch (const std::logic_error& e) {
        EXPECT_STREQ(e.what(), "void main failed");
    }
}

// ---- Runtime::start ----------------------------------------------------------------------------------------

TEST(RuntimeStart, RejectsBadOptions) {
    RuntimeOptions tinyStack;
    tinyStack.stackSize = 1024;
    EXPECT_EQ(Runtime::start(tinyStack).errorCode(), EINVAL);

    RuntimeOptions noRing;
    noRing.ringEntries = 0;
    EXPECT_EQ(Runtime::start(noRing).errorCode(), EINVAL);

    RuntimeOptions hugeRing;
    hugeRing.ringEntries = 1u << 20;
    EXPECT_EQ(Runtime::start(hugeRing).errorCode(), EINVAL);

    RuntimeOptions bogus;
    bogus.topology = "bogus";
    EXPECT_EQ(Runtime::start(bogus).errorCode(), EINVAL);

    RuntimeOptions smallCq;
    smallCq.cqEntries = smallCq.ringEntries - 1;
    EXPECT_EQ(Runtime::start(smallCq).errorCode(), EINVAL);
    RuntimeOptions hugeCq;
    hugeCq.cqEntries = 1u << 20;
    EXPECT_EQ(Runtime::start(hugeCq).errorCode(), EINVAL);
}

// More than kMaxCarriers is refused before anything is allocated for them, whether asked for or picked as
// a placement's natural count (here a synthetic topology of more cores than that).
TEST(RuntimeStart, RejectsMoreCarriersThanTheMaximum) {
    for (const unsigned count : {kMaxCarriers + 1, 99'999u, ~0u}) {
        RuntimeOptions many;
        many.carriers = count;
        many.fixedBufferCount = 0;  // were it to start them, no pinned memory
        ASSERT_EQ(Runtime::start(many).errorCode(), EINVAL) << count;  // stop at the first: no runaway
    }
    RuntimeOptions natural;
    natural.topology = "synthetic:pack:2 core:" + std::to_string(kMaxCarriers / 2 + 1) + " pu:1";
    natural.fixedBufferCount = 0;
    natural.ringEntries = 8;
    EXPECT_EQ(Runtime::start(natural).errorCode(), EINVAL) << natural.topology;
    natural.carriers = 2;  // the same topology with a count that fits
    auto rt = Runtime::start(natural);
    ASSERT_TRUE(rt) << rt.error().message();
    EXPECT_EQ(rt->carrierCount(), 2u);
}

TEST(RuntimeStart, CompletionQueueIsSizedForManyOperationsInFlight) {
    SPINDLE_REQUIRE_URING("the completion queue's size");
    for (const auto& [asked, expected] : {std::pair{0u, "cq=4096 "}, std::pair{5000u, "cq=8192 "}}) {
        RuntimeOptions o;
        o.carriers = 1;
        o.cqEntries = asked;
        auto rt = Runtime::start(o);
        ASSERT_TRUE(rt) << rt.error().message();
        const std::string ring = rt->stats()[0].ring;
        EXPECT_NE(ring.find(expected), std::string::npos) << ring;
    }
}

TEST(RuntimeStart, SyntheticTopologyStartsOneUnboundCarrierPerCore) {
    RuntimeOptions o;
    o.topology = "synthetic:pack:1 core:3 pu:1";
    auto rt = Runtime::start(o);
    ASSERT_TRUE(rt) << rt.error().message();
    ASSERT_EQ(rt->carrierCount(), 3u);
    const auto stats = rt->stats();
    ASSERT_EQ(stats.size(), 3u);
    for (unsigned i = 0; i < 3; ++i) {
        EXPECT_EQ(stats[i].index, i);
        EXPECT_EQ(stats[i].pu, -1) << "a synthetic topology is not this machine: carrier " << i << " must be unbound";
    }
    // Each of the three carriers runs fibers.
    for (int c = 0; c < 3; ++c) {
        auto h = rt->spawn([] { return this_fiber::carrierIndex(); }, SpawnOptions{.carrier = c, .pinned = true});
        ASSERT_TRUE(h) << h.error().message();
        EXPECT_EQ(h->join(), c);
    }
}

TEST(RuntimeLifecycle, StartAndStopManyTimes) {
    // Carriers exit while the thread that called shutdown() (or the carrier that retired the last fiber) is
    // still waking them: every start, spawn, shutdown and join must come out clean, under TSan too.
    constexpr int kRounds = kSanitized ? 50 : 200;
    for (int round = 0; round < kRounds; ++round) {
        auto rt = Runtime::start(withCarriers(2));
        ASSERT_TRUE(rt) << "round " << round << ": " << rt.error().message();
        std::vector<FiberHandle<int>> hs;
        for (int i = 0; i < 4; ++i) {
            auto h = rt->spawn([i] { return i; }, SpawnOptions{.carrier = i % 2});
            ASSERT_TRUE(h);
            if (i % 2 == 0) {
                hs.push_back(std::move(*h));
            } else {
                h->detach();
            }
        }
        for (size_t k = 0; k < hs.size(); ++k) { EXPECT_EQ(hs[k].join(), static_cast<int>(2 * k)); }
        if (round % 2 == 0) {
            rt->shutdown();
            rt->join();
        }
        // odd rounds: ~Runtime shuts down and joins
    }
}

// ---- spawn errors -----------------------------------------------------------------------------------------

TEST_F(RuntimeTest, SpawnRejectsACarrierIndexOutOfRange) {
    const int n = static_cast<int>(rt().carrierCount());
    for (int bad : {n, n + 1, 1000, -2, -1000}) {
        auto h = rt().spawn([] {}, SpawnOptions{.carrier = bad});
        EXPECT_EQ(h.errorCode(), EINVAL) << "carrier " << bad;
    }
    EXPECT_EQ(rt().liveFibers(), 0u) << "a rejected spawn must not stay counted";
    // The last valid index works.
    auto h = rt().spawn([] { return this_fiber::carrierIndex(); }, SpawnOptions{.carrier = n - 1, .pinned = true});
    ASSERT_TRUE(h) << h.error().message();
    EXPECT_EQ(h->join(), n - 1);
}

// ---- resume hints (this_fiber::setResumeHint) ------------------------------------------------------------

TEST(ResumeHint, PacksTheAddressAndTheLinesTheRangeSpans) {
    const auto* aligned = reinterpret_cast<const void*>(uintptr_t{0x7f0000001000});
    const uintptr_t a = detail::packResumeHint(aligned, 200);
    EXPECT_EQ(detail::resumeHintAddress(a), aligned);
    EXPECT_EQ(detail::resumeHintLines(a), 4u);  // 200 bytes from a line's start: 4 lines
    const auto* inside = reinterpret_cast<const void*>(uintptr_t{0x7f0000001030});
    EXPECT_EQ(detail::resumeHintLines(detail::packResumeHint(inside, 100)), 3u);  // bytes 48..147 of its line
    EXPECT_EQ(detail::resumeHintLines(detail::packResumeHint(inside, 1)), 1u);
    // Capped at kResumeHintMaxBytes, counted from the address's place in its line.
    EXPECT_EQ(detail::resumeHintLines(detail::packResumeHint(aligned, 1 << 20)), this_fiber::kResumeHintMaxBytes / 64);
    const auto* last = reinterpret_cast<const void*>(uintptr_t{0x7f000000103f});
    EXPECT_EQ(detail::resumeHintLines(detail::packResumeHint(last, 1 << 20)), this_fiber::kResumeHintMaxBytes / 64 + 1);
    EXPECT_EQ(detail::resumeHintAddress(detail::packResumeHint(last, 1 << 20)), last);
    // No hint: a null address, no bytes, an address the packing cannot hold.
    EXPECT_EQ(detail::packResumeHint(nullptr, 64), 0u);
    EXPECT_EQ(detail::packResumeHint(aligned, 0), 0u);
    EXPECT_EQ(detail::packResumeHint(reinterpret_cast<const void*>(uintptr_t{1} << 56), 64), 0u);
}

TEST_F(RuntimeTest, AResumeHintIsTheRunningFibersUntilItIsClearedOrTheFiberEnds) {
    // The hint shares the line that the pop before the fiber's prefetches.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winvalid-offsetof"
    static_assert(offsetof(detail::Fiber, resumeHint_) + sizeof(uintptr_t) <= 64);
    static_assert(offsetof(detail::Fiber, nextLocal_) < 64);
#pragma GCC diagnostic pop
    int object = 0;
    const uintptr_t want = detail::packResumeHint(&object, sizeof(object));
    auto h = onUnpinned(0, [&] {
        EXPECT_EQ(detail::runningFiber()->resumeHint_, 0u);  // none to begin with
        this_fiber::setResumeHint(&object, sizeof(object));
        const uintptr_t set = detail::runningFiber()->resumeHint_;
        for (int i = 0; i < 20; ++i) { this_fiber::yield(); }  // through the run queue, maybe to the other carrier
        const uintptr_t kept = detail::runningFiber()->resumeHint_;
        this_fiber::setResumeHint(nullptr, 0);
        return std::pair{set == want && kept == want, detail::runningFiber()->resumeHint_ == 0};
    });
    const auto [kept, cleared] = h.join();
    EXPECT_TRUE(kept);
    EXPECT_TRUE(cleared);
    // A fiber that ends with its hint set takes it along: the next one on its carrier (likely on the
    // same stack, whose top holds the fiber's block) starts without one.
    on(0, [&] { this_fiber::setResumeHint(&object, sizeof(object)); }).join();
    EXPECT_EQ(on(0, [] { return detail::runningFiber()->resumeHint_; }).join(), 0u);
    // A plain thread: no effect, and nothing kept for its stand-in fiber.
    this_fiber::setResumeHint(&object, sizeof(object));
    EXPECT_EQ(detail::currentFiber()->resumeHint_, 0u);
}

TEST_F(RuntimeTest, FibersWithResumeHintsRunThroughTheQueueEvenWhenAHintNamesUnmappedMemory) {
    // The pop before each fiber prefetches its hint; a prefetch never faults, so a stale hint (memory
    // unmapped, or never mapped) costs nothing but the prefetch. 64 fibers on one carrier, each yielding
    // with a hint, so each pop finds the next fiber's.
    constexpr int kFibers = 64;
    constexpr int kRounds = 50;
    std::atomic<int> turns{0};
    std::vector<FiberHandle<void>> fibers;
    for (int i = 0; i < kFibers; ++i) {
        fibers.push_back(on(0, [&turns, i] {
            auto owned = std::make_unique<std::array<char, 512>>();
            // A page mapped and given back: its address names nothing any more.
            void* page = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            EXPECT_NE(page, MAP_FAILED);
            const auto stale = reinterpret_cast<uintptr_t>(page);
            if (page != MAP_FAILED) { ::munmap(page, 4096); }
            for (int r = 0; r < kRounds; ++r) {
                switch ((i + r) % 3) {
                    case 0: this_fiber::setResumeHint(owned.get(), sizeof(*owned)); break;
                    case 1: this_fiber::setResumeHint(reinterpret_cast<const void*>(stale), 256); break;
                    default: this_fiber::setResumeHint(reinterpret_cast<const void*>(uintptr_t{0x10}), 4096); break;
                }
                turns.fetch_add(1, std::memory_order_relaxed);
                this_fiber::yield();
            }
        }));
    }
    for (auto& f : fibers) { f.join(); }
    EXPECT_EQ(turns.load(), kFibers * kRounds);
}

TEST_F(RuntimeTest, SpawnRejectsATinyStack) {
    for (size_t bad : {size_t{1}, size_t{1024}, size_t{4096}, size_t{16 * 1024 - 1}}) {
        auto h = rt().spawn([] {}, SpawnOptions{.stackSize = bad});
        EXPECT_EQ(h.errorCode(), EINVAL) << "stackSize " << bad;
    }
    EXPECT_EQ(rt().liveFibers(), 0u) << "a rejected spawn must not stay counted";
}

TEST_F(RuntimeTest, NonDefaultStackSizesWork) {
    // The smallest accepted stack, and a large one that the fiber really uses.
    auto small = rt().spawn([] { return 1; }, SpawnOptions{.stackSize = 16 * 1024});
    ASSERT_TRUE(small) << small.error().message();
    EXPECT_EQ(small->join(), 1);

    auto big = rt().spawn(
        [] {
            volatile char block[512 * 1024];
            for (size_t i = 0; i < sizeof(block); i += 4096) { block[i] = static_cast<char>(i >> 12); }
            int sum = 0;
            for (size_t i = 0; i < sizeof(block); i += 4096) { sum += block[i]; }
            return sum;
        },
        SpawnOptions{.stackSize = 1024 * 1024});
    ASSERT_TRUE(big) << big.error().message();
    int expected = 0;
    for (size_t i = 0; i < 512 * 1024; i += 4096) { expected += static_cast<char>(i >> 12); }
    EXPECT_EQ(big->join(), expected);
}

TEST_F(RuntimeTest, SpawnFromAThreadAfterShutdownIsCanceled) {
    rt().shutdown();
    auto h = rt().spawn([] {});
    EXPECT_EQ(h.errorCode(), ECANCELED);
    auto pinned = rt().spawn([] {}, SpawnOptions{.carrier = 0});
    EXPECT_EQ(pinned.errorCode(), ECANCELED);
    rt().join();
    EXPECT_EQ(rt().liveFibers(), 0u);
}

TEST(SpawnOffFiber, IsEperm) {
    auto h = spindle::spawn([] {});
    EXPECT_EQ(h.errorCode(), EPERM);
    // Also from a thread while a runtime is up: only a fiber has a "caller's runtime".
    auto rt = Runtime::start(withCarriers(1));
    ASSERT_TRUE(rt) << rt.error().message();
    auto h2 = spindle::spawn([] {});
    EXPECT_EQ(h2.errorCode(), EPERM);
}

// ---- many fibers ------------------------------------------------------------------------------------------

// Each fiber counts its own runs, the carrier it started on, and (when pinned) whether it stayed put.
struct ManyFibersTally {
    explicit ManyFibersTally(int n) : runs(static_cast<size_t>(n)) {}
    std::vector<std::atomic<uint8_t>> runs;
    std::atomic<uint64_t> perCarrier[2] = {};
    std::atomic<uint64_t> misplaced{0};   // a pinned fiber found on the wrong carrier
    std::atomic<uint64_t> badResult{0};   // join() returned another fiber's value
    std::atomic<uint64_t> spawnFailed{0};
};

// Fiber i: a quarter pinned to carrier 0, a quarter pinned to carrier 1 (they also yield once, and must
// still be there), the rest go where the runtime puts them (and may be stolen).
SpawnOptions manyFibersOptions(int i) {
    switch (i % 4) {
        case 0: return SpawnOptions{.carrier = 0, .pinned = true};
        case 1: return SpawnOptions{.carrier = 1, .pinned = true};
        default: return SpawnOptions{};
    }
}

auto manyFibersBody(ManyFibersTally& t, int i) {
    return [&t, i] {
        t.runs[static_cast<size_t>(i)].fetch_add(1, std::memory_order_relaxed);
        const int c = this_fiber::carrierIndex();
        if (c >= 0 && c < 2) { t.perCarrier[c].fetch_add(1, std::memory_order_relaxed); }
        const int pin = i % 4;
        if (pin < 2) {
            if (c != pin) { t.misplaced.fetch_add(1, std::memory_order_relaxed); }
            this_fiber::yield();
            if (this_fiber::carrierIndex() != pin) { t.misplaced.fetch_add(1, std::memory_order_relaxed); }
        }
        return i;
    };
}

// Spawns and joins kManyFibers fibers with `spawn` (the runtime's or spindle::), kBatch live at a time.
template <class SpawnFn>
void spawnAndJoinMany(ManyFibersTally& t, SpawnFn spawn) {
    std::vector<FiberHandle<int>> handles;
    handles.reserve(kBatch);
    for (int first = 0; first < kManyFibers; first += kBatch) {
        const int last = std::min(first + kBatch, kManyFibers);
        handles.clear();
        std::vector<int> indexOf;
        for (int i = first; i < last; ++i) {
            auto h = spawn(manyFibersBody(t, i), manyFibersOptions(i));
            if (!h) {
                t.spawnFailed.fetch_add(1, std::memory_order_relaxed);
                continue;
            }
            handles.push_back(std::move(*h));
            indexOf.push_back(i);
        }
        for (size_t k = 0; k < handles.size(); ++k) {
            if (handles[k].join() != indexOf[k]) { t.badResult.fetch_add(1, std::memory_order_relaxed); }
        }
    }
}

void expectEachRanOnceOnBothCarriers(const ManyFibersTally& t) {
    EXPECT_EQ(t.spawnFailed.load(), 0u);
    EXPECT_EQ(t.badResult.load(), 0u);
    EXPECT_EQ(t.misplaced.load(), 0u) << "a pinned fiber ran on another carrier";
    int notOnce = 0;
    for (size_t i = 0; i < t.runs.size(); ++i) {
        if (t.runs[i].load() != 1) {
            if (++notOnce <= 5) { ADD_FAILURE() << "fiber " << i << " ran " << int(t.runs[i].load()) << " times"; }
        }
    }
    EXPECT_EQ(notOnce, 0);
    EXPECT_EQ(t.perCarrier[0].load() + t.perCarrier[1].load(), static_cast<uint64_t>(kManyFibers));
    // The pinned quarters guarantee both carriers ran some, whatever the scheduling.
    EXPECT_GE(t.perCarrier[0].load(), static_cast<uint64_t>(kManyFibers / 4));
    EXPECT_GE(t.perCarrier[1].load(), static_cast<uint64_t>(kManyFibers / 4));
}

TEST_F(RuntimeTest, ManyFibersSpawnedFromAThreadRunOnceEach) {
    ASSERT_EQ(rt().carrierCount(), 2u);
    ManyFibersTally t(kManyFibers);
    spawnAndJoinMany(t, [this](auto&& fn, const SpawnOptions& o) { return rt().spawn(std::move(fn), o); });
    expectEachRanOnceOnBothCarriers(t);
}

TEST_F(RuntimeTest, ManyFibersSpawnedFromAFiberRunOnceEach) {
    ASSERT_EQ(rt().carrierCount(), 2u);
    ManyFibersTally t(kManyFibers);
    auto driver = rt().spawn(
        [&t] {
            spawnAndJoinMany(t, [](auto&& fn, const SpawnOptions& o) { return spindle::spawn(std::move(fn), o); });
        },
        SpawnOptions{.name = "driver"});
    ASSERT_TRUE(driver) << driver.error().message();
    driver->join();
    expectEachRanOnceOnBothCarriers(t);
}

// Fibers that are spawned and joined must give their stacks back to a pool, also when a plain thread spawns
// them and drops the last reference in join().
TEST_F(RuntimeTest, JoinedFibersDoNotKeepTheirStacks) {
    constexpr int kFibers = 10'000;
    constexpr int kBatchHere = 500;
    for (int first = 0; first < kFibers; first += kBatchHere) {
        std::vector<FiberHandle<int>> hs;
        for (int i = first; i < first + kBatchHere; ++i) {
            auto h = rt().spawn([i] { return i; });
            ASSERT_TRUE(h) << "spawn " << i << ": " << h.error().message();
            hs.push_back(std::move(*h));
        }
        // Let the batch finish first, so that join() usually drops the last reference on this thread.
        for (auto& h : hs) {
            while (!h.done()) { std::this_thread::yield(); }
        }
        for (int k = 0; k < kBatchHere; ++k) { EXPECT_EQ(hs[static_cast<size_t>(k)].join(), first + k); }
    }
    rt().waitIdle();
    // Out of the pools now: at most the last batch, released by this thread and filed by its carrier at its
    // next maintenance, and the spares each carrier sets aside for spawns from other threads. A leak is 10,000.
    uint64_t out = 0;
    uint64_t slabs = 0;
    for (const auto& s : rt().stats()) {
        out += s.stacksInUse;
        slabs += s.stackSlabs;
    }
    const uint64_t bound = kBatchHere + rt().carrierCount() * detail::StackPool::kSpares;
    EXPECT_LE(out, bound) << kFibers << " fibers spawned and joined from a thread left " << out << " stacks out";
    // 30 stacks of 64 KiB to a slab: what the pools hold stays near what was ever live at once.
    EXPECT_LE(slabs * 30, bound + rt().carrierCount() * 60) << slabs << " slabs mapped";
}

// ---- exceptions through join -------------------------------------------------------------------------------

struct CustomError {
    int code;
    std::string where;
};

TEST_F(RuntimeTest, JoinRethrowsAStdException) {
    auto h = rt().spawn([]() -> int { throw std::runtime_error("disk on fire"); });
    ASSERT_TRUE(h) << h.error().message();
    // Join once the carrier is completely done with the fiber (the already-finished path; the next test
    // joins while the fiber still runs). This also keeps the exception's last owner on this thread, since
    // TSan cannot see libstdc++'s exception_ptr reference count and would report its cross-thread delete.
    // The carrier uncounts a fiber just before it signals done, so wait for both.
    EXPECT_EQ(settledLiveFibers(rt()), 0u);
    yieldUntil([&] { return h->done(); });  // this_fiber::yield() on a plain thread yields the thread
    try {
        (void)h->join();
        FAIL() << "join() returned instead of rethrowing";
    } catch (const std::runtime_error& e) {
        EXPECT_STREQ(e.what(), "disk on fire");
    }
    EXPECT_FALSE(h->joinable());
}

TEST_F(RuntimeTest, JoinRethrowsACustomExceptionType) {
    auto h = rt().spawn([] {
        (void)this_fiber::sleep_for(1ms);  // throw after blocking: the fiber may have moved
        this_fiber::yield();
        throw CustomError{17, "after a sleep"};
    });
    ASSERT_TRUE(h) << h.error().message();
    try {
        h->join();
        FAIL() << "join() returned instead of rethrowing";
    } catch (const CustomError& e) {
        EXPECT_EQ(e.code, 17);
        EXPECT_EQ(e.where, "after a sleep");
    }
}

TEST_F(RuntimeTest, JoinFromAFiberRethrowsToThatFiber) {
    // Both on carrier 0, so the thrower and the catcher share a thread (see JoinRethrowsAStdException on TSan).
    auto outer = rt().spawn([] {
        auto inner = spindle::spawn([]() -> int { throw CustomError{3, "inner"}; },
                                    SpawnOptions{.name = "inner", .carrier = 0, .pinned = true});
        if (!inner) { return std::string("spawn failed"); }
        std::string caught;
        try {
            (void)inner->join();
            caught = "no exception";
        } catch (const CustomError& e) {
            caught = e.where + ":" + std::to_string(e.code);  // no blocking inside the catch block
        }
        return caught;
    }, SpawnOptions{.name = "outer", .carrier = 0, .pinned = true});
    ASSERT_TRUE(outer) << outer.error().message();
    EXPECT_EQ(outer->join(), "inner:3");
}

TEST_F(RuntimeTest, AFiberExceptionDoesNotTakeTheCarrierDown) {
    for (int i = 0; i < 20; ++i) {
        auto bad = rt().spawn([i]() -> int { throw std::runtime_error("bad " + std::to_string(i)); },
                              SpawnOptions{.carrier = i % 2});
        ASSERT_TRUE(bad);
        EXPECT_THROW((void)bad->join(), std::runtime_error);
        auto good = rt().spawn([i] { return i; }, SpawnOptions{.carrier = i % 2, .pinned = true});
        ASSERT_TRUE(good);
        EXPECT_EQ(good->join(), i);
    }
}

// ---- joins ---------------------------------------------------------------------------------------------------

TEST_F(RuntimeTest, JoinFromAPlainThread) {
    // The test thread.
    auto h = rt().spawn([] { return std::string("from a fiber"); });
    ASSERT_TRUE(h) << h.error().message();
    EXPECT_EQ(h->join(), "from a fiber");

    // Another thread, joining a fiber that is still blocked when the join starts (most likely).
    auto slow = rt().spawn([] {
        (void)this_fiber::sleep_for(5ms);
        return 99;
    });
    ASSERT_TRUE(slow) << slow.error().message();
    FiberHandle<int> handle = std::move(*slow);
    int got = 0;
    std::thread joiner([&] { got = handle.join(); });
    joiner.join();
    EXPECT_EQ(got, 99);
}

TEST_F(RuntimeTest, JoinFromAFiber) {
    auto outer = rt().spawn([] {
        int sum = 0;
        for (int c = 0; c < 2; ++c) {
            // One child on each carrier: the join crosses carriers at least once.
            auto child = spindle::spawn(
                [c] {
                    (void)this_fiber::sleep_for(1ms);
                    return 10 + c;
                },
                SpawnOptions{.carrier = c});
            if (!child) { return -1; }
            sum += child->join();
        }
        return sum;
    });
    ASSERT_TRUE(outer) << outer.error().message();
    EXPECT_EQ(outer->join(), 21);
}

TEST_F(RuntimeTest, DoneTurnsTrueWhenTheFiberEnds) {
    FiberFuture release;
    auto h = rt().spawn([&release] { return release.wait(); });
    ASSERT_TRUE(h) << h.error().message();
    EXPECT_TRUE(h->joinable());
    EXPECT_FALSE(h->done()) << "the fiber waits for `release`";
    release.set(5);
    while (!h->done()) { std::this_thread::yield(); }
    EXPECT_EQ(h->join(), 5);
    EXPECT_FALSE(h->joinable());
    EXPECT_FALSE(h->done());
}

// ---- scheduling ----------------------------------------------------------------------------------------------

TEST_F(RuntimeTest, YieldInterleavesTwoFibersOnOneCarrier) {
    constexpr int kRounds = 200;
    std::vector<int> trace;  // touched only on carrier 0
    auto parent = rt().spawn(
        [&trace] {
            auto worker = [&trace](int who) {
                return [&trace, who] {
                    for (int r = 0; r < kRounds; ++r) {
                        trace.push_back(who);
                        this_fiber::yield();
                    }
                };
            };
            auto a = spindle::spawn(worker(0), SpawnOptions{.name = "a", .carrier = 0, .pinned = true});
            auto b = spindle::spawn(worker(1), SpawnOptions{.name = "b", .carrier = 0, .pinned = true});
            if (a) { a->join(); }
            if (b) { b->join(); }
        },
        SpawnOptions{.name = "parent", .carrier = 0, .pinned = true});
    ASSERT_TRUE(parent) << parent.error().message();
    parent->join();
    ASSERT_EQ(trace.size(), 2u * kRounds);
    int runs[2] = {0, 0};
    for (size_t k = 0; k < trace.size(); ++k) {
        ++runs[trace[k]];
        if (k > 0) {
            ASSERT_NE(trace[k], trace[k - 1]) << "at step " << k << " fiber " << trace[k]
                                              << " ran twice in a row although the other had yielded to it";
        }
    }
    EXPECT_EQ(runs[0], kRounds);
    EXPECT_EQ(runs[1], kRounds);
}

TEST_F(RuntimeTest, SpawnFromAThreadWakesAParkedCarrier) {
    for (int round = 0; round < 3; ++round) {
        for (int c = 0; c < static_cast<int>(rt().carrierCount()); ++c) {
            // Give the carriers time to run out of work and park; the verdict does not depend on it.
            std::this_thread::sleep_for(20ms);
            auto h = rt().spawn([] { return this_fiber::carrierIndex(); }, SpawnOptions{.carrier = c, .pinned = true});
            ASSERT_TRUE(h) << h.error().message();
            EXPECT_EQ(h->join(), c);
        }
    }
    // Unpinned, round robin, after another idle spell.
    std::this_thread::sleep_for(20ms);
    std::vector<FiberHandle<int>> hs;
    for (int i = 0; i < 8; ++i) {
        auto h = rt().spawn([i] { return i; });
        ASSERT_TRUE(h);
        hs.push_back(std::move(*h));
    }
    for (int i = 0; i < 8; ++i) { EXPECT_EQ(hs[static_cast<size_t>(i)].join(), i); }
}

TEST_F(RuntimeTest, DetachedFibersFinishBeforeWaitIdleReturns) {
    constexpr int kFibers = 200;
    std::atomic<int> finished{0};
    for (int i = 0; i < kFibers; ++i) {
        auto h = rt().spawn([&finished, i] {
            if (i % 3 == 0) { (void)this_fiber::sleep_for(2ms); }
            if (i % 3 == 1) { this_fiber::yield(); }
            finished.fetch_add(1, std::memory_order_relaxed);
        });
        ASSERT_TRUE(h) << h.error().message();
        if (i % 2 == 0) {
            h->detach();
            EXPECT_FALSE(h->joinable());
        }
        // odd ones: the handle is dropped here, which detaches too
    }
    rt().waitIdle();
    EXPECT_EQ(finished.load(), kFibers);
    EXPECT_EQ(rt().liveFibers(), 0u);

    // The runtime takes new fibers after waitIdle().
    auto again = rt().spawn([] { return 1; });
    ASSERT_TRUE(again) << again.error().message();
    EXPECT_EQ(again->join(), 1);
}

// ---- this_fiber -----------------------------------------------------------------------------------------------

TEST_F(RuntimeTest, ThisFiberOnAFiber) {
    struct Seen {
        FiberId id = 0;
        std::string name;
        bool inFiber = false;
        int carrier = -2;
    };
    auto h = rt().spawn(
        [] {
            Seen s;
            s.id = this_fiber::id();
            s.name = std::string(this_fiber::name());
            s.inFiber = this_fiber::inFiber();
            s.carrier = this_fiber::carrierIndex();
            return s;
        },
        SpawnOptions{.name = "worker-7", .carrier = 1, .pinned = true});
    ASSERT_TRUE(h) << h.error().message();
    const FiberId handleId = h->id();
    const Seen s = h->join();
    EXPECT_NE(s.id, 0u);
    EXPECT_EQ(s.id, handleId);
    EXPECT_EQ(s.name, "worker-7");
    EXPECT_TRUE(s.inFiber);
    EXPECT_EQ(s.carrier, 1);

    auto unnamed = rt().spawn([] { return std::string(this_fiber::name()); });
    ASSERT_TRUE(unnamed);
    EXPECT_EQ(unnamed->join(), "");

    const std::string longName(40, 'n');
    auto named = rt().spawn([] { return std::string(this_fiber::name()); }, SpawnOptions{.name = longName.c_str()});
    ASSERT_TRUE(named);
    EXPECT_EQ(named->join(), std::string(31, 'n')) << "at most 31 characters are kept";

    // Ids are distinct.
    auto a = rt().spawn([] { return this_fiber::id(); });
    auto b = rt().spawn([] { return this_fiber::id(); });
    ASSERT_TRUE(a && b);
    const FiberId ida = a->join();
    const FiberId idb = b->join();
    EXPECT_NE(ida, idb);
    EXPECT_NE(ida, s.id);
}

TEST_F(RuntimeTest, ThisFiberOnAPlainThread) {
    EXPECT_FALSE(this_fiber::inFiber());
    EXPECT_EQ(this_fiber::name(), "thread");
    EXPECT_EQ(this_fiber::carrierIndex(), -1);
    const FiberId mine = this_fiber::id();
    EXPECT_NE(mine, 0u);
    EXPECT_EQ(this_fiber::id(), mine) << "a thread keeps its proxy's id";

    FiberId other = 0;
    bool otherInFiber = true;
    std::thread t([&] {
        other = this_fiber::id();
        otherInFiber = this_fiber::inFiber();
    });
    t.join();
    EXPECT_NE(other, 0u);
    EXPECT_NE(other, mine);
    EXPECT_FALSE(otherInFiber);

    auto h = rt().spawn([] { return this_fiber::id(); });
    ASSERT_TRUE(h);
    EXPECT_NE(h->join(), mine);
}

// ---- counters ---------------------------------------------------------------------------------------------------

TEST_F(RuntimeTest, StatsAreSaneAfterWork) {
    constexpr int kFibers = 100;
    std::vector<FiberHandle<int>> hs;
    for (int i = 0; i < kFibers; ++i) {
        auto h = rt().spawn(
            [] {
                int ok = 0;
                for (int k = 0; k < 4; ++k) { ok += spindle::nop() ? 1 : 0; }
                return ok;
            },
            SpawnOptions{.carrier = i % 2});
        ASSERT_TRUE(h);
        hs.push_back(std::move(*h));
    }
    for (auto& h : hs) { EXPECT_EQ(h.join(), 4); }

    const auto stats = rt().stats();
    ASSERT_EQ(stats.size(), rt().carrierCount());
    uint64_t fibersRun = 0;
    uint64_t sqes = 0;
    uint64_t cqes = 0;
    for (size_t i = 0; i < stats.size(); ++i) {
        EXPECT_EQ(stats[i].index, i);
        EXPECT_FALSE(stats[i].ring.empty());
        EXPECT_GE(stats[i].enters, 1u) << "every ring enters the kernel at least once (set-up submit)";
        fibersRun += stats[i].fibersRun;
        sqes += stats[i].sqesSubmitted;
        cqes += stats[i].cqesReaped;
    }
    // Each fiber was switched into at least once per nop (it parks on each), plus its first run.
    EXPECT_GE(fibersRun, static_cast<uint64_t>(kFibers));
    EXPECT_GE(sqes, static_cast<uint64_t>(4 * kFibers));
    EXPECT_GE(cqes, static_cast<uint64_t>(4 * kFibers));
    EXPECT_FALSE(rt().describe().empty());
}

// ---- a detached fiber's exception ------------------------------------------------------------------------

void detachedFiberThrows() {
    auto rt = Runtime::start(withCarriers(1));
    if (!rt) { return; }
    auto h = rt->spawn([] { throw std::runtime_error("nobody listens"); }, SpawnOptions{.name = "orphan"});
    if (h) { h->detach(); }
    rt->waitIdle();
}

TEST(RuntimeDeathTest, AnExceptionFromADetachedFiberAborts) {
    // Unless the environment chose (the aarch64 flavour under qemu-user sets "fast": threadsafe re-executes
    // the binary, which qemu-user cannot do for a foreign one).
    if (std::getenv("GTEST_DEATH_TEST_STYLE") == nullptr) { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
    EXPECT_DEATH(detachedFiberThrows(), "fiber 'orphan' \\(id [0-9]+\\) ended with an exception nobody joined "
                                        "to receive: nobody listens");
}

}  // namespace
}  // namespace spindle
