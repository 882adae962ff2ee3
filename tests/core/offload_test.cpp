// SPDX-License-Identifier: Apache-2.0
// Tests for offload() (core/offload.h): the value and void forms; exception propagation; the caller's carrier
// keeps running other fibers while the offloaded call blocks (it blocks until a fiber pinned to the same carrier
// releases it, so a stalled carrier deadlocks, caught by the watchdog); many concurrent offloads never run more
// than offloadThreads at once; a plain thread runs fn inline; ECANCELED once shutdown began; and destroying the
// runtime with work queued completes that work with ECANCELED.
//
// No verdict depends on timing.

#include "core/offload.h"

#include <gtest/gtest.h>
#include <pthread.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <latch>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/fiber.h"
#include "core/runtime.h"
#include "tests/core/with_runtime.h"

namespace spindle {
namespace {

using namespace std::chrono_literals;
using namespace testing_support;

std::string threadName() {
    char name[16] = {};
    ::pthread_getname_np(::pthread_self(), name, sizeof(name));
    return name;
}

class OffloadTest : public WithRuntime {};

TEST_F(OffloadTest, ReturnsTheValueFromAPoolThread) {
    auto r = onFiber([] {
        const std::thread::id caller = std::this_thread::get_id();
        return offload([caller] {
            return std::string(std::this_thread::get_id() != caller ? "elsewhere:" : "inline:") + threadName();
        });
    });
    ASSERT_TRUE(r) << r.error().message();
    EXPECT_EQ(*r, "elsewhere:spindle-off");
}

TEST_F(OffloadTest, VoidFormRunsTheFunction) {
    int ran = 0;
    auto r = onFiber([&ran] { return offload([&ran] { ++ran; }); });
    ASSERT_TRUE(r) << r.error().message();
    EXPECT_EQ(ran, 1);
}

TEST_F(OffloadTest, MoveOnlyValueAndLvalueCallable) {
    auto r = onFiber([] {
        auto make = [] { return std::make_unique<int>(42); };
        return offload(make);  // an lvalue callable is invoked in place, not copied
    });
    ASSERT_TRUE(r) << r.error().message();
    EXPECT_EQ(**r, 42);
}

TEST_F(OffloadTest, RethrowsTheExceptionInTheCaller) {
    std::string caught;
    onFiber([&caught] {
        try {
            (void)offload([]() -> int { throw std::runtime_error("disk on fire"); });
        } catch (const std::runtime_error& e) {
            caught = e.what();
        }
    });
    EXPECT_EQ(caught, "disk on fire");
}

// The offloaded call waits for a latch that only another fiber pinned to the same carrier counts down, after it
// saw the call start. Were the call run on the carrier, that fiber could never run: the watchdog would fire.
TEST_F(OffloadTest, CarrierRunsOtherFibersWhileTheCallBlocks) {
    std::atomic<uint64_t> progress{0};
    Watchdog watchdog("offload on carrier 0", progress, 20s);
    std::atomic<bool> started{false};
    std::latch release(1);
    auto blocked = on(0, [&] {
        return offload([&] {
            started.store(true);
            release.wait();
            return 7;
        });
    });
    auto releaser = on(0, [&] {
        while (!started.load()) {
            progress.fetch_add(1);
            this_fiber::yield();
        }
        release.count_down();
    });
    releaser.join();
    auto r = blocked.join();
    ASSERT_TRUE(r) << r.error().message();
    EXPECT_EQ(*r, 7);
}

TEST_F(OffloadTest, ManyConcurrentOffloadsStayWithinThePool) {
    const unsigned limit = RuntimeOptions{}.offloadThreads;  // the fixture's runtime uses the default
    const int kFibers = 200;
    std::atomic<int> running{0};
    std::atomic<int> maxRunning{0};
    std::vector<std::optional<Result<uint64_t>>> results(kFibers);
    std::vector<FiberHandle<void>> fibers;
    for (int i = 0; i < kFibers; ++i) {
        fibers.push_back(anywhere([&, i] {
            results[i] = offload([&, i] {
                const int now = running.fetch_add(1) + 1;
                int seen = maxRunning.load();
                while (now > seen && !maxRunning.compare_exchange_weak(seen, now)) {}
                std::this_thread::yield();  // give the other pool threads a chance to overlap
                running.fetch_sub(1);
                return static_cast<uint64_t>(i) * i;
            });
        }));
    }
    for (auto& f : fibers) { f.join(); }
    for (int i = 0; i < kFibers; ++i) {
        ASSERT_TRUE(results[i].has_value());
        ASSERT_TRUE(*results[i]) << results[i]->error().message();
        EXPECT_EQ(**results[i], static_cast<uint64_t>(i) * i);
    }
    EXPECT_GE(maxRunning.load(), 1);
    EXPECT_LE(maxRunning.load(), static_cast<int>(limit));
}

TEST(OffloadPlainThread, RunsInlineWithoutARuntime) {
    const std::thread::id self = std::this_thread::get_id();
    auto r = offload([] { return std::this_thread::get_id(); });
    ASSERT_TRUE(r);
    EXPECT_EQ(*r, self);
    int ran = 0;
    EXPECT_TRUE(offload([&ran] { ++ran; }));
    EXPECT_EQ(ran, 1);
    EXPECT_THROW((void)offload([]() -> int { throw std::runtime_error("x"); }), std::runtime_error);
}

TEST_F(OffloadTest, PlainThreadBesideARuntimeRunsInline) {
    const std::thread::id self = std::this_thread::get_id();
    auto r = offload([] { return std::this_thread::get_id(); });
    ASSERT_TRUE(r);
    EXPECT_EQ(*r, self);
}

TEST_F(OffloadTest, NestedOffloadOnAPoolThreadRunsInline) {
    auto r = onFiber([] {
        return offload([] {
            const std::thread::id pool = std::this_thread::get_id();
            return offload([pool] { return std::this_thread::get_id() == pool; }).value();
        });
    });
    ASSERT_TRUE(r);
    EXPECT_TRUE(*r);
}

TEST_F(OffloadTest, AfterShutdownBeganReturnsECANCELED) {
    bool ran = false;
    auto h = anywhere([&] {
        rt().shutdown();
        auto r = offload([&ran] { ran = true; });
        return r ? 0 : r.errorCode();
    });
    EXPECT_EQ(h.join(), ECANCELED);
    EXPECT_FALSE(ran);
}

TEST(OffloadShutdown, InvalidThreadCountIsRejected) {
    RuntimeOptions o = withCarriers(1);
    o.offloadThreads = 0;
    auto rt = Runtime::start(o);
    ASSERT_FALSE(rt);
    EXPECT_EQ(rt.errorCode(), EINVAL);
}

// One pool thread, held by the first call; eight more calls queue behind it. Destroying the runtime completes the
// queued ones with ECANCELED (their functions never run); the running one finishes and returns its value.
TEST(OffloadShutdown, DestructionCancelsQueuedWork) {
    RuntimeOptions o = withCarriers(2);
    o.offloadThreads = 1;
    auto started = Runtime::start(o);
    ASSERT_TRUE(started) << started.error().message();
    std::optional<Runtime> rt(std::move(*started));

    constexpr int kQueued = 8;
    std::atomic<uint64_t> progress{0};
    Watchdog watchdog("offload shutdown", progress, 20s);
    std::atomic<bool> firstStarted{false};
    std::latch releaseFirst(1);
    std::atomic<int> firstResult{-1};
    std::atomic<int> cancelled{0};
    std::atomic<int> otherResults{0};
    std::atomic<int> neverRan{0};
    std::atomic<detail::RuntimeImpl*> impl{nullptr};

    rt->spawn([&] {
          impl.store(detail::currentRuntime());
          auto r = offload([&] {
              firstStarted.store(true);
              releaseFirst.wait();
              return 5;
          });
          firstResult.store(r ? *r : -r.errorCode());
      })
        .value()
        .detach();
    while (!firstStarted.load()) { std::this_thread::yield(); }
    for (int i = 0; i < kQueued; ++i) {
        rt->spawn([&] {
              auto r = offload([&] { neverRan.fetch_add(1); });
              if (!r && r.errorCode() == ECANCELED) {
                  cancelled.fetch_add(1);
              } else {
                  otherResults.fetch_add(1);
              }
              progress.fetch_add(1);
          })
            .value()
            .detach();
    }
    while (detail::offloadQueued(impl.load()) != kQueued) {
        progress.fetch_add(1);
        std::this_thread::yield();
    }
    // Released only once the queued calls came back cancelled, so they were cancelled, not run.
    std::jthread releaser([&] {
        while (cancelled.load() + otherResults.load() != kQueued) { std::this_thread::yield(); }
        releaseFirst.count_down();
    });
    rt.reset();  // ~Runtime: shutdown (cancels the queue), then joins carriers and the pool
    releaser.join();
    EXPECT_EQ(cancelled.load(), kQueued);
    EXPECT_EQ(otherResults.load(), 0);
    EXPECT_EQ(neverRan.load(), 0);
    EXPECT_EQ(firstResult.load(), 5);
}

}  // namespace
}  // namespace spindle
