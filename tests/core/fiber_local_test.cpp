// SPDX-License-Identifier: Apache-2.0
// Tests for FiberLocal<T> (core/fiber_local.h): a value per fiber, value-initialised on first access;
// isolation between many fibers running at once; a value that follows its fiber from carrier to carrier;
// destructors that run once, on the ending fiber, newest first, also when the fiber throws, and for
// values that destructors make; reset() and emplace(); two keys of one type; a key destroyed before its
// values; a table grown by many keys without moving values; the off-fiber (per-thread) instance of plain
// threads and of a carrier's own code; allocation failure; no allocation for a fiber that uses none; and
// a throwing destructor terminating the process.
//
// The allocation tests count, or fail, one thread's allocations through testing/alloc_hook.h, which
// this test program links. Sanitizer builds skip them: their allocators add allocations of their own.

#include "core/fiber_local.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/fiber.h"
#include "core/fiber_future.h"
#include "core/runtime.h"
#include "testing/alloc_hook.h"
#include "tests/core/with_runtime.h"

#if !defined(SPINDLE_ASAN) && !defined(SPINDLE_TSAN)
#define SPINDLE_TEST_ALLOC_HOOK 1
#endif

namespace spindle {
namespace {

using namespace std::chrono_literals;
using namespace testing_support;

// The allocation hook (testing/alloc_hook.h): counts, or fails, this thread's allocations in its scope. Use
// it only where the caller cannot switch threads (a plain thread, or a pinned fiber).
using AllocHook = alloc_hook::ThisThread;

// ---- value types ---------------------------------------------------------------------------------------

// Counts its constructions and destructions; one set of counters per Tag, so that tests do not share,
// zeroed by the test that uses them (so --gtest_repeat works).
template <int Tag>
struct Counted {
    static inline std::atomic<int> made{0};
    static inline std::atomic<int> gone{0};
    static void zero() {
        made.store(0);
        gone.store(0);
    }
    Counted() { made.fetch_add(1); }
    ~Counted() { gone.fetch_add(1); }
    Counted(const Counted&) = delete;
    Counted& operator=(const Counted&) = delete;
    int value = 0;
};

// Appends its id to a log when destroyed (the log belongs to one fiber: no lock).
struct Logged {
    Logged(std::vector<int>* log, int id) : log_(log), id_(id) {}
    ~Logged() { log_->push_back(id_); }
    Logged(const Logged&) = delete;
    Logged& operator=(const Logged&) = delete;
    std::vector<int>* log_;
    int id_;
};

using FiberLocalTest = WithRuntime;

// ---- basics --------------------------------------------------------------------------------------------

TEST_F(FiberLocalTest, FirstAccessValueInitialises) {
    FiberLocal<int> n;
    struct Point {
        int x = 3;
        int y = 4;
    };
    FiberLocal<Point> p;
    onFiber([&] {
        EXPECT_EQ(n.getIfExists(), nullptr);
        EXPECT_EQ(n.get(), 0);
        EXPECT_EQ(n.getIfExists(), &n.get());
        *n = 7;
        EXPECT_EQ(*n.getIfExists(), 7);
        EXPECT_EQ(p->x, 3);
        p->y = 5;
        EXPECT_EQ((*p).y, 5);
        EXPECT_EQ(&*p, p.getIfExists());
    });
}

TEST_F(FiberLocalTest, TwoKeysOfTheSameTypeAreDistinct) {
    FiberLocal<int> a;
    FiberLocal<int> b;
    onFiber([&] {
        *a = 1;
        *b = 2;
        EXPECT_EQ(*a, 1);
        EXPECT_EQ(*b, 2);
        EXPECT_NE(&*a, &*b);
        b.reset();
        EXPECT_EQ(*a, 1);
        EXPECT_EQ(b.getIfExists(), nullptr);
    });
}

TEST_F(FiberLocalTest, ResetDestroysNowAndTheNextGetMakesAFreshOne) {
    using C = Counted<1>;
    C::zero();
    FiberLocal<C> fl;
    onFiber([&] {
        fl.reset();  // nothing to reset
        fl->value = 9;
        EXPECT_EQ(C::made.load(), 1);
        fl.reset();
        EXPECT_EQ(C::gone.load(), 1);
        EXPECT_EQ(fl.getIfExists(), nullptr);
        EXPECT_EQ(fl->value, 0);
        EXPECT_EQ(C::made.load(), 2);
    });
    EXPECT_EQ(C::gone.load(), 2);
}

TEST_F(FiberLocalTest, EmplaceReplacesTheValueAfterMakingTheNewOne) {
    std::vector<int> log;
    FiberLocal<Logged> fl;
    FiberLocal<std::string> s;
    onFiber([&] {
        Logged& first = fl.emplace(&log, 1);
        EXPECT_EQ(fl.getIfExists(), &first);
        Logged& second = fl.emplace(&log, 2);
        EXPECT_EQ(log, std::vector<int>{1});
        EXPECT_EQ(fl.getIfExists(), &second);
        EXPECT_EQ(second.id_, 2);
        EXPECT_EQ(s.emplace(3, 'x'), "xxx");
        EXPECT_EQ(*s, "xxx");
    });
    EXPECT_EQ(log, (std::vector<int>{1, 2}));
}

TEST_F(FiberLocalTest, ManyKeysKeepEveryValueInPlace) {
    // More keys than the first table holds: the table grows (and moves), the values do not.
    constexpr int kKeys = 100;
    std::vector<std::unique_ptr<FiberLocal<int>>> keys;
    for (int i = 0; i < kKeys; ++i) { keys.push_back(std::make_unique<FiberLocal<int>>()); }
    onFiber([&] {
        std::vector<int*> at;
        for (int i = 0; i < kKeys; ++i) {
            at.push_back(&keys[static_cast<size_t>(i)]->get());
            *at.back() = i;
        }
        for (int i = 0; i < kKeys; ++i) {
            EXPECT_EQ(keys[static_cast<size_t>(i)]->getIfExists(), at[static_cast<size_t>(i)]);
            EXPECT_EQ(*at[static_cast<size_t>(i)], i);
        }
    });
}

// ---- fibers and carriers -------------------------------------------------------------------------------

TEST_F(FiberLocalTest, IsolatedBetweenManyFibersAtOnce) {
    // Every fiber sets its own value and then parks and yields, on both carriers and interleaved with
    // the others, until all have started; each must keep seeing its own value at the same address.
    constexpr int kFibers = kSanitized ? 100 : 400;
    FiberLocal<uint64_t> id;
    FiberLocal<std::string> name;
    std::atomic<int> started{0};
    std::vector<FiberHandle<int>> hs;
    for (int i = 0; i < kFibers; ++i) {
        hs.push_back(onUnpinned(i % 2, [&, i] {
            int bad = 0;
            *id = static_cast<uint64_t>(i);
            *name = "fiber-" + std::to_string(i);
            const uint64_t* at = &*id;
            started.fetch_add(1);
            for (int k = 0; k < 20 || started.load() < kFibers; ++k) {
                if (k % 4 == 0) {
                    (void)this_fiber::sleep_for(std::chrono::microseconds(10 + (i + k) % 50));
                } else {
                    this_fiber::yield();
                }
                if (*id != static_cast<uint64_t>(i) || &*id != at || *name != "fiber-" + std::to_string(i)) {
                    ++bad;
                }
            }
            return bad;
        }));
    }
    int bad = 0;
    for (auto& h : hs) { bad += h.join(); }
    EXPECT_EQ(bad, 0);
}

void burn() {
    volatile uint64_t sink = 0;
    for (int i = 0; i < 20000; ++i) { sink = sink + static_cast<uint64_t>(i); }
}

TEST_F(FiberLocalTest, FollowsAFiberThatMovesToAnotherCarrier) {
    // Unpinned fibers all start on carrier 0 and work between yields, so the idle carrier 1 steals
    // some; each runs until it has run on both carriers (or a cap), checking its value after every yield.
    constexpr int kFibers = 16;
    constexpr int kCap = 2'000;
    FiberLocal<int> mine;
    struct Outcome {
        bool moved = false;
        int bad = 0;
    };
    std::vector<FiberHandle<Outcome>> hs;
    for (int i = 0; i < kFibers; ++i) {
        hs.push_back(onUnpinned(0, [&, i] {
            Outcome out;
            *mine = i;
            const int* at = &*mine;
            unsigned seen = 0;
            for (int k = 0; k < kCap && seen != 3u; ++k) {
                seen |= 1u << this_fiber::carrierIndex();
                burn();
                this_fiber::yield();
                if (*mine != i || &*mine != at) { ++out.bad; }
            }
            out.moved = seen == 3u;
            return out;
        }));
    }
    int moved = 0;
    int bad = 0;
    for (auto& h : hs) {
        const Outcome o = h.join();
        moved += o.moved ? 1 : 0;
        bad += o.bad;
    }
    EXPECT_EQ(bad, 0);
    EXPECT_GT(moved, 0) << "no fiber ever ran on both carriers";
}

// ---- destruction ---------------------------------------------------------------------------------------

TEST_F(FiberLocalTest, DestructorsRunOnceBeforeJoinReturns) {
    using C = Counted<2>;
    C::zero();
    FiberLocal<C> a;
    FiberLocal<C> b;
    FiberLocal<C> unused;
    // One at a time: each join sees its fiber's two values destroyed.
    for (int i = 0; i < 20; ++i) {
        onUnpinned(i % 2, [&] {
            a->value = 1;
            (void)this_fiber::sleep_for(10us);
            b->value = 2;
        }).join();
        EXPECT_EQ(C::made.load(), 2 * (i + 1));
        EXPECT_EQ(C::gone.load(), 2 * (i + 1));
    }
    // Many at once, some of them detached.
    constexpr int kFibers = kSanitized ? 50 : 200;
    std::vector<FiberHandle<void>> hs;
    for (int i = 0; i < kFibers; ++i) {
        auto h = onUnpinned(i % 2, [&, i] {
            (void)a.get();
            this_fiber::yield();
            if (i % 3 == 0) { (void)b.get(); }
        });
        if (i % 5 == 0) {
            h.detach();
        } else {
            hs.push_back(std::move(h));
        }
    }
    for (auto& h : hs) { h.join(); }
    rt().waitIdle();
    EXPECT_EQ(C::made.load(), C::gone.load());
    EXPECT_EQ(C::made.load(), 40 + kFibers + (kFibers + 2) / 3);
}

TEST_F(FiberLocalTest, DestroyedNewestFirst) {
    std::vector<int> log;
    FiberLocal<Logged> a;
    FiberLocal<Logged> b;
    FiberLocal<Logged> c;
    FiberLocal<Logged> d;
    onFiber([&] {
        b.emplace(&log, 2);
        c.emplace(&log, 3);
        a.emplace(&log, 1);
        d.emplace(&log, 4);
        c.reset();           // logs 3 now
        c.emplace(&log, 5);  // the newest now
        d.emplace(&log, 6);  // replaces 4 (logged now), newer still
    });
    EXPECT_EQ(log, (std::vector<int>{3, 4, 6, 5, 1, 2}));
}

TEST_F(FiberLocalTest, DestroyedWhenTheFiberThrows) {
    using C = Counted<3>;
    C::zero();
    FiberLocal<C> fl;
    auto h = onUnpinned(0, [&] {
        fl->value = 1;
        throw std::runtime_error("fiber failed");
    });
    EXPECT_THROW(h.join(), std::runtime_error);
    EXPECT_EQ(C::made.load(), 1);
    EXPECT_EQ(C::gone.load(), 1);
}

// What a destructor saw of the fiber it ran on.
struct EndSeen {
    bool inFiber = false;
    FiberId id = 0;
    bool slept = false;
};

struct Witness {
    EndSeen* seen = nullptr;
    ~Witness() {
        if (seen == nullptr) { return; }
        seen->inFiber = this_fiber::inFiber();
        seen->id = this_fiber::id();
        seen->slept = static_cast<bool>(this_fiber::sleep_for(1ms));  // parks: the fiber is still running
    }
};

TEST_F(FiberLocalTest, DestructorsRunOnTheEndingFiberAndMayBlock) {
    FiberLocal<Witness> w;
    EndSeen seen;
    auto h = onUnpinned(1, [&] {
        w->seen = &seen;
        return this_fiber::id();
    });
    const FiberId id = h.id();
    EXPECT_EQ(h.join(), id);
    EXPECT_TRUE(seen.inFiber);
    EXPECT_EQ(seen.id, id);
    EXPECT_TRUE(seen.slept);
}

// A destructor that makes a value of another FiberLocal: that value is destroyed too.
using Late = Counted<4>;
FiberLocal<Late>* gLate = nullptr;

struct MakesLate {
    ~MakesLate() { gLate->get().value = 1; }
};

TEST_F(FiberLocalTest, ValuesMadeByDestructorsAreDestroyedToo) {
    Late::zero();
    FiberLocal<Late> late;
    FiberLocal<MakesLate> maker;
    gLate = &late;
    onFiber([&] { (void)maker.get(); });
    gLate = nullptr;
    EXPECT_EQ(Late::made.load(), 1);
    EXPECT_EQ(Late::gone.load(), 1);
}

TEST_F(FiberLocalTest, AKeyDestroyedFirstLeavesItsValuesToTheirFibers) {
    // Two fibers hold values of a key that is then destroyed. One makes a new key, which takes the freed
    // index (the last freed is reused first): the stale value is destroyed there, not read as the new
    // key's. The other just ends, and its stale value is destroyed with it.
    using C = Counted<5>;
    C::zero();
    auto key = std::make_unique<FiberLocal<C>>();
    FiberFuture keyGone;
    FiberFuture keyGone2;
    std::atomic<int> holding{0};
    auto reuser = on(0, [&] {
        (*key)->value = 1;
        holding.fetch_add(1);
        (void)keyGone.wait();
        EXPECT_EQ(C::gone.load(), 0);
        FiberLocal<int> later;
        EXPECT_EQ(later.getIfExists(), nullptr);
        EXPECT_EQ(later.get(), 0);
        EXPECT_EQ(C::gone.load(), 1) << "the stale value was destroyed when its slot was taken";
    });
    auto ender = on(1, [&] {
        (*key)->value = 2;
        holding.fetch_add(1);
        (void)keyGone2.wait();
    });
    yieldUntil([&] { return holding.load() == 2; });
    key.reset();
    keyGone.set(0);
    reuser.join();
    keyGone2.set(0);
    ender.join();
    EXPECT_EQ(C::made.load(), 2);
    EXPECT_EQ(C::gone.load(), 2);
}

// ---- off-fiber -----------------------------------------------------------------------------------------

TEST_F(FiberLocalTest, OffFiberEachThreadHasItsOwnInstance) {
    using C = Counted<6>;
    C::zero();
    FiberLocal<C> fl;
    fl->value = 5;  // this thread's
    const C* mine = &*fl;
    onFiber([&] {
        EXPECT_EQ(fl.getIfExists(), nullptr);
        EXPECT_EQ(fl->value, 0);
        fl->value = 6;
    });
    EXPECT_EQ(fl.getIfExists(), mine);
    EXPECT_EQ(fl->value, 5);
    std::vector<std::thread> threads;
    std::atomic<int> bad{0};
    for (int t = 0; t < 4; ++t) {
        threads.emplace_back([&, t] {
            if (fl.getIfExists() != nullptr || fl->value != 0 || &*fl == mine) { bad.fetch_add(1); }
            fl->value = 10 + t;
            std::this_thread::sleep_for(1ms);
            if (fl->value != 10 + t) { bad.fetch_add(1); }
        });
    }
    for (auto& t : threads) { t.join(); }  // each thread's value died as it exited
    EXPECT_EQ(bad.load(), 0);
    EXPECT_EQ(C::made.load(), 6);
    EXPECT_EQ(C::gone.load(), 5);
    fl.reset();
    EXPECT_EQ(C::gone.load(), 6);
}

TEST_F(FiberLocalTest, ACarriersOwnCodeUsesItsThreadsInstance) {
    // Work run between fibers (runOnCarrier) is off-fiber: the carrier thread's instance, which persists
    // from one call to the next and is not any fiber's; it dies when the carrier thread exits.
    using C = Counted<7>;
    C::zero();
    FiberLocal<C> fl;
    ASSERT_TRUE(rt().runOnCarrier(0, [&] { fl->value = 40; }));
    int seen = -1;
    ASSERT_TRUE(rt().runOnCarrier(0, [&] { seen = fl->value; }));
    EXPECT_EQ(seen, 40);
    EXPECT_EQ(onFiber([&] { return fl->value; }, 0), 0);
    ASSERT_TRUE(rt().runOnCarrier(1, [&] { seen = fl->value; }));
    EXPECT_EQ(seen, 0);
    EXPECT_EQ(C::made.load(), 3);
    EXPECT_EQ(C::gone.load(), 1);  // the fiber's
    runtime_.reset();              // shuts down and joins the carrier threads
    EXPECT_EQ(C::gone.load(), 3);
}

// ---- memory --------------------------------------------------------------------------------------------

TEST_F(FiberLocalTest, AFiberThatUsesNoneAllocatesNothing) {
#if !defined(SPINDLE_TEST_ALLOC_HOOK)
    GTEST_SKIP() << "sanitizer build: the allocation hook is compiled out";
#else
    FiberLocal<int> fl;
    struct Counts {
        uint64_t none = 0;
        uint64_t first = 0;
        uint64_t again = 0;
    };
    // Everything on carrier 0's thread (pinned), where the hook counts.
    const Counts c = on(0, [&] {
        for (int i = 0; i < 64; ++i) {  // warm the stack pool
            spindle::spawn([] {}, SpawnOptions{.carrier = 0, .pinned = true})->join();
        }
        Counts out;
        {
            AllocHook hook;
            for (int i = 0; i < 100; ++i) {
                spindle::spawn([] {}, SpawnOptions{.carrier = 0, .pinned = true})->join();
            }
            out.none = hook.stop();
        }
        {
            AllocHook hook;
            spindle::spawn([&] { *fl = 1; }, SpawnOptions{.carrier = 0, .pinned = true})->join();
            out.first = hook.stop();
        }
        {
            AllocHook hook;
            spindle::spawn([&] { *fl = 1; *fl = 2; }, SpawnOptions{.carrier = 0, .pinned = true})->join();
            out.again = hook.stop();
        }
        return out;
    }).join();
    EXPECT_EQ(c.none, 0u);
    EXPECT_EQ(c.first, 2u) << "the table and the value";
    EXPECT_EQ(c.again, 2u) << "nothing shared between fibers: each makes its own";
#endif
}

TEST_F(FiberLocalTest, AllocationFailureLeavesNoValue) {
#if !defined(SPINDLE_TEST_ALLOC_HOOK)
    GTEST_SKIP() << "sanitizer build: the allocation hook is compiled out";
#else
    FiberLocal<int> fl;
    FiberLocal<int> other;
    struct Outcome {
        bool firstThrew = false;   // the value's allocation failed
        bool secondThrew = false;  // the table's allocation failed (the value's succeeded)
        bool tryGetNull = false;
        bool emplaceThrew = false;
        bool emptyAfter = false;
        int after = -1;
        int kept = -1;
    };
    const Outcome o = on(0, [&] {
        Outcome out;
        {
            AllocHook hook(0);
            try {
                (void)fl.get();
            } catch (const std::bad_alloc&) {
                out.firstThrew = true;
            }
        }
        {
            AllocHook hook(1);
            try {
                (void)fl.get();
            } catch (const std::bad_alloc&) {
                out.secondThrew = true;
            }
        }
        {
            AllocHook hook(1);
            out.tryGetNull = fl.tryGet() == nullptr;
        }
        out.emptyAfter = fl.getIfExists() == nullptr;
        *other = 7;  // the table exists from here on
        {
            AllocHook hook(0);
            try {
                (void)other.emplace(8);
            } catch (const std::bad_alloc&) {
                out.emplaceThrew = true;
            }
        }
        out.kept = *other;
        out.after = fl.get();
        return out;
    }).join();
    EXPECT_TRUE(o.firstThrew);
    EXPECT_TRUE(o.secondThrew);
    EXPECT_TRUE(o.tryGetNull);
    EXPECT_TRUE(o.emptyAfter);
    EXPECT_TRUE(o.emplaceThrew);
    EXPECT_EQ(o.kept, 7);
    EXPECT_EQ(o.after, 0);
#endif
}

// ---- a throwing destructor -------------------------------------------------------------------------------

struct ThrowsOnDestruction {
    ~ThrowsOnDestruction() noexcept(false) { throw std::runtime_error("destructor threw"); }
};

void fiberWithAThrowingValue() {
    auto rt = Runtime::start(withCarriers(1));
    if (!rt) { return; }
    FiberLocal<ThrowsOnDestruction> fl;
    rt->spawn([&] { (void)fl.get(); })->join();
}

TEST(FiberLocalDeathTest, ADestructorThatThrowsTerminates) {
    // As in runtime_test.cpp: threadsafe re-executes the binary, unless the environment chose a style.
    if (std::getenv("GTEST_DEATH_TEST_STYLE") == nullptr) { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
    EXPECT_DEATH(fiberWithAThrowingValue(), "destructor threw");
}

}  // namespace
}  // namespace spindle

