// SPDX-License-Identifier: Apache-2.0
// Timeouts too large to add to the clock (nanoseconds::max() and the like) mean "no timeout": the
// waits below must park until they are woken or cancelled, not compute now() + d, wrap round to the
// past and return at once. FiberCondVar and FiberSemaphore are covered in their own tests.
//
// No verdict depends on timing: each wait is ended by a set, post or cancel that comes after the
// waiter is known to have started, and a wait that returned early says so by its result.

#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <thread>

#include "core/fiber.h"
#include "core/fiber_future.h"
#include "core/fiber_futex.h"
#include "core/io.h"
#include "tests/core/with_runtime.h"

namespace spindle {
namespace {

using namespace std::chrono_literals;

class HugeTimeoutTest : public testing_support::WithRuntime {};

constexpr auto kForever = std::chrono::nanoseconds::max();

// Lets the waiter get into its wait: a result that comes back before this is a wrapped deadline.
void letItPark(const std::atomic<bool>& started) {
    while (!started.load()) { std::this_thread::sleep_for(1ms); }
    std::this_thread::sleep_for(20ms);
}

TEST_F(HugeTimeoutTest, SleepForNanosecondsMaxSleepsUntilCancelled) {
    for (auto sleeper : {+[] { return this_fiber::sleep_for(kForever); }, +[] { return spindle::sleep(kForever); }}) {
        std::atomic<bool> started{false};
        std::atomic<bool> returned{false};
        auto h = on(0, [&, sleeper] {
            started.store(true);
            auto r = sleeper();
            returned.store(true);
            return r ? 0 : r.errorCode();
        });
        letItPark(started);
        EXPECT_FALSE(returned.load()) << "the sleep returned at once";
        h.cancel();
        EXPECT_EQ(h.join(), ECANCELED);
    }
}

TEST_F(HugeTimeoutTest, FutexWaitForNanosecondsMaxWaitsForThePost) {
    FiberFutex futex;
    std::atomic<bool> started{false};
    auto h = on(0, [&] {
        started.store(true);
        return futex.waitFor(futex.get() + 1, kForever);
    });
    letItPark(started);
    futex.post();
    EXPECT_EQ(h.join(), 0);
}

TEST_F(HugeTimeoutTest, FutureWaitWithTimeoutNanosecondsMaxWaitsForTheSet) {
    FiberFuture future;
    std::atomic<bool> started{false};
    auto h = on(0, [&] {
        started.store(true);
        return FiberFuture::waitWithTimeout(&future, kForever);
    });
    letItPark(started);
    future.set(7);
    EXPECT_EQ(h.join(), 7);
}

// The same from a plain thread, which waits on its own semaphore instead of a carrier's timer.
TEST_F(HugeTimeoutTest, APlainThreadWaitsToo) {
    FiberFuture future;
    FiberFutex futex;
    std::atomic<bool> started{false};
    int32_t got = 0;
    int futexResult = -1;
    std::thread t([&] {
        started.store(true);
        got = FiberFuture::waitWithTimeout(&future, kForever);
        futexResult = futex.waitFor(futex.get() + 1, kForever);
    });
    letItPark(started);
    future.set(3);
    std::this_thread::sleep_for(20ms);
    futex.post();
    t.join();
    EXPECT_EQ(got, 3);
    EXPECT_EQ(futexResult, 0);
}

}  // namespace
}  // namespace spindle
