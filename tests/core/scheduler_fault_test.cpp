// SPDX-License-Identifier: Apache-2.0
// The scheduler's own allocations failing (issue 17, item 8), through the kGrowFail fault point: a run deque
// that cannot grow must still run every fiber woken (a wake-up cannot fail; it used to terminate the
// process from a noexcept path), a timer heap that cannot grow fails the sleep with ENOMEM, and a
// multishot cancel sent from elsewhere allocates nothing and is a no-op once the holding carrier is gone.

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <vector>

#include "core/fiber.h"
#include "core/fiber_future.h"
#include "core/ring_ops.h"
#include "core/runtime.h"
#include "tests/core/with_runtime.h"
#include "uring/inject.h"

namespace spindle {
namespace {

using namespace std::chrono_literals;
using inject::ArmedFault;

class SchedulerFault : public testing_support::WithRuntime {};

TEST_F(SchedulerFault, ARunDequeThatCannotGrowStillRunsEveryWokenFiber) {
    constexpr int kFibers = 2000;  // the deque holds 256 before it must grow
    std::atomic<int> ran{0};
    const int spawned = on(0, [&] {
        ArmedFault f(inject::Point::kGrowFail, 1, 1'000'000);
        std::vector<FiberHandle<void>> hs;
        hs.reserve(kFibers);
        for (int i = 0; i < kFibers; ++i) {
            auto h = spawn([&] { ran.fetch_add(1); });
            if (!h) { break; }
            hs.push_back(std::move(*h));
        }
        const int n = static_cast<int>(hs.size());
        EXPECT_GT(inject::remaining(inject::Point::kGrowFail), 0u);
        for (auto& h : hs) { h.join(); }
        return n;
    }).join();
    EXPECT_EQ(spawned, kFibers);
    EXPECT_EQ(ran.load(), kFibers);
}

TEST_F(SchedulerFault, ATimerHeapThatCannotGrowFailsTheSleepWithEnomem) {
    on(1, [&] {
        {
            // A fresh carrier's heap has no room yet: the first timer makes it grow.
            ArmedFault f(inject::Point::kGrowFail, 1, 2);
            const auto start = std::chrono::steady_clock::now();
            EXPECT_EQ(this_fiber::sleep_for(50ms).errorCode(), ENOMEM);
            EXPECT_LT(std::chrono::steady_clock::now() - start, 50ms) << "it did not sleep";
            FiberFuture never;
            EXPECT_EQ(FiberFuture::waitWithTimeout(&never, 1s), -ENOMEM) << "the heap still has no room";
        }
        EXPECT_TRUE(this_fiber::sleep_for(1ms)) << "the heap grows once the fault is gone";
    }).join();
}

/// A listening TCP socket on loopback: the target of a multishot accept that nothing connects to.
int listener() {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(fd, 8) != 0) { return -1; }
    return fd;
}

struct Accepts : MultishotCompletion {
    FiberFuture ended;
    std::atomic<int> completions{0};
    static void onCqe(MultishotCompletion* self, int32_t res, uint32_t flags) noexcept {
        auto* a = static_cast<Accepts*>(self);
        a->completions.fetch_add(1);
        if (res >= 0) { ::close(res); }
        if ((flags & op::kMore) == 0) { a->ended.set(res); }
    }
};

TEST_F(SchedulerFault, AMultishotCancelFromElsewhereIsFoldedAndNeedsNoAllocation) {
    const int fd = listener();
    ASSERT_GE(fd, 0);
    Accepts a;
    a.fn = &Accepts::onCqe;
    on(0, [&] { EXPECT_TRUE(armMultishot(op::acceptMultishot(fd, SOCK_CLOEXEC), &a)); }).join();
    // From this thread, twice: the second is folded into the first while it is queued.
    EXPECT_TRUE(cancelMultishot(&a));
    EXPECT_TRUE(cancelMultishot(&a));
    EXPECT_EQ(a.ended.wait(), -ECANCELED);
    settleMultishot(&a);
    EXPECT_FALSE(a.cancelQueued.load());
    EXPECT_EQ(a.completions.load(), 1);
    ::close(fd);
}

TEST(SchedulerFaultShutdown, AMultishotCancelAfterItsCarrierExitedDoesNothing) {
    auto rt = Runtime::start(testing_support::withCarriers(1));
    ASSERT_TRUE(rt);
    const int fd = listener();
    ASSERT_GE(fd, 0);
    Accepts a;
    a.fn = &Accepts::onCqe;
    auto armer = rt->spawn([&] { EXPECT_TRUE(armMultishot(op::acceptMultishot(fd, SOCK_CLOEXEC), &a)); });
    ASSERT_TRUE(armer);
    armer->join();
    rt->shutdown();
    EXPECT_EQ(a.ended.wait(), -ECANCELED) << "shutdown ends the operation";
    rt->join();
    // The carrier is gone: a message to it would never run (it used to be a heap message, leaked).
    EXPECT_TRUE(cancelMultishot(&a));
    EXPECT_FALSE(a.cancelQueued.load());
    settleMultishot(&a);
    ::close(fd);
}

}  // namespace
}  // namespace spindle
