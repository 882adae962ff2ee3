// SPDX-License-Identifier: Apache-2.0
// Error paths that a healthy kernel never takes, driven by the fault points in
// uring/inject.h: a ring that cannot be set up (io_uring disabled, memlock) and a
// stack that cannot be mapped. Each must come back as a clear errno, leave the
// runtime usable (or cleanly not started), and leak nothing (ASan checks that).

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/fiber.h"
#include "core/fiber_future.h"
#include "core/io.h"
#include "core/runtime.h"
#include "tests/core/with_runtime.h"
#include "uring/inject.h"

namespace spindle {
namespace {

using namespace std::chrono_literals;
using testing_support::withCarriers;

using inject::ArmedFault;

/// Unsets SPINDLE_BACKEND for its lifetime (ctest sets it for each backend's run), so kAuto probes.
class NoBackendEnv {
public:
    NoBackendEnv() {
        if (const char* v = std::getenv("SPINDLE_BACKEND")) { saved_ = v; }
        ::unsetenv("SPINDLE_BACKEND");
    }
    ~NoBackendEnv() {
        if (!saved_.empty()) { ::setenv("SPINDLE_BACKEND", saved_.c_str(), 1); }
    }
    NoBackendEnv(const NoBackendEnv&) = delete;
    NoBackendEnv& operator=(const NoBackendEnv&) = delete;

private:
    std::string saved_;
};

RuntimeOptions uringOnly(unsigned carriers) {
    RuntimeOptions o = withCarriers(carriers);
    o.backend = Backend::kUring;
    return o;
}

TEST(FaultInjection, ARingThatCannotBeSetUpFailsStartWithItsErrno) {
    SPINDLE_REQUIRE_URING("ring set-up faults and the backend probe");
    {
        ArmedFault f(inject::Point::kRingSetup, ENOMEM);
        auto rt = Runtime::start(uringOnly(1));
        ASSERT_FALSE(rt);
        EXPECT_EQ(rt.errorCode(), ENOMEM);
    }
    auto rt = Runtime::start(uringOnly(1));  // disarmed: the next start works
    ASSERT_TRUE(rt) << rt.error().message();
}

TEST(FaultInjection, AutoFallsBackToEpollWhenNoRingCanBeSetUp) {
    SPINDLE_REQUIRE_URING("ring set-up faults and the backend probe");
    // ENOMEM (RLIMIT_MEMLOCK), EPERM (seccomp, the sysctl) and ENOSYS (qemu-user) say io_uring cannot
    // be used here at all: the probe sees it, and the carriers come up on epoll.
    NoBackendEnv noEnv;
    for (int err : {ENOMEM, EPERM, ENOSYS}) {
        ArmedFault f(inject::Point::kRingSetup, err, /*count=*/1);
        RuntimeOptions o = withCarriers(1);
        o.backend = Backend::kAuto;
        auto rt = Runtime::start(o);
        ASSERT_TRUE(rt) << rt.error().message();
        EXPECT_EQ(rt->backend(), Backend::kEpoll) << std::strerror(err);
        auto h = rt->spawn([] { return static_cast<bool>(spindle::nop()) ? 7 : 0; });
        ASSERT_TRUE(h);
        EXPECT_EQ(h->join(), 7);
    }
}

TEST(FaultInjection, AutoDoesNotFallBackOnOtherSetUpErrors) {
    SPINDLE_REQUIRE_URING("ring set-up faults and the backend probe");
    NoBackendEnv noEnv;
    ArmedFault f(inject::Point::kRingSetup, EFAULT, /*count=*/1);
    RuntimeOptions o = withCarriers(1);
    o.backend = Backend::kAuto;
    auto rt = Runtime::start(o);
    ASSERT_FALSE(rt);
    EXPECT_EQ(rt.errorCode(), EFAULT);
}

TEST(FaultInjection, ALaterCarrierFailingStopsTheOnesAlreadyRunning) {
    SPINDLE_REQUIRE_URING("ring set-up faults and the backend probe");
    // Carrier 0 comes up, carrier 1's ring fails: start() must stop and join carrier 0.
    {
        // The first set-up is start()'s probe ring, the second carrier 0's.
        ArmedFault f(inject::Point::kRingSetup, EPERM, /*count=*/1, /*skip=*/2);
        auto rt = Runtime::start(uringOnly(2));
        ASSERT_FALSE(rt);
        EXPECT_EQ(rt.errorCode(), EPERM);
    }
    auto rt = Runtime::start(uringOnly(2));
    ASSERT_TRUE(rt) << rt.error().message();
    EXPECT_EQ(rt->carrierCount(), 2u);
}

TEST(FaultInjection, RunReportsAStartFailure) {
    SPINDLE_REQUIRE_URING("ring set-up faults and the backend probe");
    ArmedFault f(inject::Point::kRingSetup, ENOSYS);
    bool ran = false;
    auto r = Runtime::run([&] { ran = true; }, uringOnly(1));
    ASSERT_FALSE(r);
    EXPECT_EQ(r.errorCode(), ENOSYS);
    EXPECT_FALSE(ran);
}

using FaultInjectionTest = testing_support::WithRuntime;

TEST_F(FaultInjectionTest, AStackThatCannotBeMappedFailsSpawnWithEnomem) {
    // From a plain thread, with no spare set aside yet, a spawn maps a stack of its own.
    {
        ArmedFault f(inject::Point::kStackMap, ENOMEM);
        auto h = rt().spawn([] { return 1; });
        ASSERT_FALSE(h);
        EXPECT_EQ(h.errorCode(), ENOMEM);
        EXPECT_EQ(rt().liveFibers(), 0u) << "a failed spawn must not be counted";
    }
    // The runtime is unharmed: the next spawn runs.
    auto h = rt().spawn([] { return 2; });
    ASSERT_TRUE(h) << h.error().message();
    EXPECT_EQ(h->join(), 2);

    // From a fiber, the first stack of a size class maps the class's first slab.
    const auto [code, after] = onFiber([] {
        ArmedFault f(inject::Point::kStackMap, ENOMEM);
        auto child = spindle::spawn([] { return 3; }, SpawnOptions{.stackSize = 128 * 1024});
        const int err = child ? 0 : child.errorCode();
        // Disarmed again by the time this one maps.
        inject::disarm(inject::Point::kStackMap);
        auto next = spindle::spawn([] { return 4; }, SpawnOptions{.stackSize = 128 * 1024});
        return std::make_pair(err, next ? next->join() : -1);
    });
    EXPECT_EQ(code, ENOMEM);
    EXPECT_EQ(after, 4);
}

// A carrier-to-carrier wake-up (MSG_RING) that the kernel refuses is not lost: the sender's ring
// gets the failure and wakes the target through its eventfd. Without that, a carrier parked with no
// timer (its parked flag cleared by the waker, so nobody else tries) slept with work in its inbox.
TEST(FaultInjection, AFailedRingWakeUpFallsBackToTheEventfd) {
    SPINDLE_REQUIRE_URING("MSG_RING wake-ups");
    RuntimeOptions o = uringOnly(2);
    o.pollMode = PollMode::kBlock;
    auto rt = Runtime::start(o);
    ASSERT_TRUE(rt);
    if (rt->stats()[0].ring.find("msg_ring=true") == std::string::npos) {
        GTEST_SKIP() << "this kernel has no IORING_OP_MSG_RING: " << rt->stats()[0].ring;
    }
    auto h = rt->spawn(
        [&rt]() noexcept -> int {
            // Carrier 1 has nothing to do: once it has parked (with no timer) it stays parked, as
            // nobody wakes it until the spawn below.
            for (int i = 0; i < 10000 && rt->stats()[1].parks == 0; ++i) { (void)this_fiber::sleep_for(1ms); }
            ArmedFault fault(inject::Point::kWakeFail, EBADF);
            FiberFuture ran;
            auto child = spawn([&ran]() noexcept { ran.set(1); }, SpawnOptions{.carrier = 1, .pinned = true});
            if (!child) { return -1; }
            const int32_t r = FiberFuture::waitWithTimeout(&ran, std::chrono::seconds(10));
            EXPECT_EQ(inject::remaining(inject::Point::kWakeFail), 0u) << "the wake-up did not take the fault";
            if (r != 1) { return -2; }  // carrier 1 slept with the fiber in its inbox
            child->join();
            return 1;
        },
        SpawnOptions{.carrier = 0, .pinned = true});
    ASSERT_TRUE(h);
    EXPECT_EQ(h->join(), 1);
    rt->shutdown();
    rt->join();
}

TEST(FaultInjection, PointsConsumeExactlyWhatWasArmed) {
    inject::arm(inject::Point::kStackMap, EIO, /*count=*/2, /*skip=*/1);
    EXPECT_EQ(inject::take(inject::Point::kStackMap), 0) << "skipped";
    EXPECT_EQ(inject::take(inject::Point::kStackMap), EIO);
    EXPECT_EQ(inject::take(inject::Point::kStackMap), EIO);
    EXPECT_EQ(inject::take(inject::Point::kStackMap), 0) << "used up";
    EXPECT_EQ(inject::take(inject::Point::kRingSetup), 0) << "points are independent";
    inject::arm(inject::Point::kStackMap, EIO, 5);
    inject::disarm(inject::Point::kStackMap);
    EXPECT_EQ(inject::take(inject::Point::kStackMap), 0) << "disarmed";
}

}  // namespace
}  // namespace spindle
