// SPDX-License-Identifier: Apache-2.0
// Tests for the poll modes (RuntimeOptions::pollMode, sqpoll): every mode runs I/O (pipes, nop, timers),
// cross-carrier spawns and wake-ups, and stealing correctly; a spinning runtime shuts down; a spinning carrier
// never parks and is never sent a wake-up; a hybrid one parks once its spin window has passed; SQPOLL rings
// work, and a refused SQPOLL falls back to a plain ring; nonsense options fail start() with EINVAL.
//
// No verdict depends on timing: counters are read once the work they count is done, and "eventually" checks
// poll with a 10 s ceiling that only a hang can reach.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/relax.h"
#include "core/fiber.h"
#include "core/fiber_future.h"
#include "core/io.h"
#include "core/runtime.h"
#include "tests/core/with_runtime.h"
#include "uring/inject.h"

namespace spindle {
namespace {

using namespace std::chrono_literals;
using testing_support::settledLiveFibers;

struct ModeParams {
    const char* name;
    PollMode mode;
    bool sqpoll;
    bool deferTaskrun;
};

RuntimeOptions optionsFor(const ModeParams& p) {
    RuntimeOptions o;
    o.carriers = 2;
    o.pollMode = p.mode;
    o.spinMicros = 100;
    o.sqpoll = p.sqpoll;
    o.deferTaskrun = p.deferTaskrun;
    return o;
}

uint64_t sum(const std::vector<CarrierStats>& stats, uint64_t CarrierStats::*field) {
    uint64_t n = 0;
    for (const auto& s : stats) { n += s.*field; }
    return n;
}

bool ringHas(const Runtime& rt, const char* feature) {
    for (const auto& s : rt.stats()) {
        if (s.ring.find(feature) == std::string::npos) { return false; }
    }
    return true;
}

/// A two-carrier runtime in the mode under test; TearDown fails the test if a fiber outlived it.
class PollModes : public testing::TestWithParam<ModeParams> {
protected:
    void SetUp() override {
        auto rt = Runtime::start(optionsFor(GetParam()));
        ASSERT_TRUE(rt) << "Runtime::start: " << rt.error().message();
        runtime_.emplace(std::move(*rt));
        if (GetParam().sqpoll && !ringHas(*runtime_, "sqpoll=true")) {
            GTEST_SKIP() << "this kernel refused IORING_SETUP_SQPOLL (see the log)";
        }
    }
    void TearDown() override {
        if (runtime_) {
            EXPECT_EQ(settledLiveFibers(*runtime_), 0u);
            checkModeCounters();
        }
    }

    // What the mode promises about parking, checked once the test's work is done.
    void checkModeCounters() {
        const auto stats = runtime_->stats();
        switch (GetParam().mode) {
            case PollMode::kBlock:
                EXPECT_EQ(sum(stats, &CarrierStats::idleSpins), 0u) << "a blocking carrier never spins";
                break;
            case PollMode::kSpin:
                EXPECT_EQ(sum(stats, &CarrierStats::parks), 0u) << "a spinning carrier never parks";
                EXPECT_EQ(sum(stats, &CarrierStats::wakesSent), 0u) << "nobody pays to wake a spinning carrier";
                EXPECT_GT(sum(stats, &CarrierStats::idleSpins), 0u);
                break;
            case PollMode::kHybrid:
                EXPECT_GT(sum(stats, &CarrierStats::idleSpins), 0u);
                break;
        }
    }

    template <class F>
    auto on(int carrier, F&& fn) {
        return runtime_->spawn(std::forward<F>(fn), SpawnOptions{.carrier = carrier, .pinned = true}).value();
    }

    std::optional<Runtime> runtime_;
};

TEST_P(PollModes, PipeReadOnOneCarrierWriteOnTheOther) {
    int fds[2];
    ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
    constexpr int kRounds = 200;
    auto reader = on(1, [&] {
        uint64_t total = 0;
        for (int i = 0; i < kRounds; ++i) {
            uint32_t v = 0;
            auto n = spindle::read(fds[0], &v, sizeof(v));
            if (!n || *n != sizeof(v) || v != static_cast<uint32_t>(i)) { return uint64_t{0}; }
            total += v;
        }
        return total;
    });
    auto writer = on(0, [&] {
        for (int i = 0; i < kRounds; ++i) {
            const uint32_t v = static_cast<uint32_t>(i);
            auto n = spindle::write(fds[1], &v, sizeof(v));
            if (!n || *n != sizeof(v)) { return false; }
            if (i % 8 == 0) { this_fiber::yield(); }
        }
        return true;
    });
    EXPECT_TRUE(writer.join());
    EXPECT_EQ(reader.join(), uint64_t{kRounds} * (kRounds - 1) / 2);
    ::close(fds[0]);
    ::close(fds[1]);
}

TEST_P(PollModes, NopsOnEveryCarrier) {
    std::vector<FiberHandle<int>> hs;
    for (int c = 0; c < 2; ++c) {
        hs.push_back(on(c, [] {
            int ok = 0;
            for (int i = 0; i < 500; ++i) { ok += spindle::nop() ? 1 : 0; }
            return ok;
        }));
    }
    for (auto& h : hs) { EXPECT_EQ(h.join(), 500); }
}

TEST_P(PollModes, SleepTimersFireOnEveryCarrier) {
    std::vector<FiberHandle<int>> hs;
    for (int c = 0; c < 2; ++c) {
        for (int k = 0; k < 3; ++k) {
            hs.push_back(on(c, [k] {
                int ok = 0;
                for (int i = 0; i < 10; ++i) { ok += spindle::sleep(std::chrono::microseconds(200 * (k + 1))) ? 1 : 0; }
                return ok;
            }));
        }
    }
    for (auto& h : hs) { EXPECT_EQ(h.join(), 10); }
}

TEST_P(PollModes, CrossCarrierSpawnAndWake) {
    // Carrier 0 spawns onto carrier 1, which sets a future carrier 0 waits on: both directions cross.
    auto h = on(0, [] {
        int ok = 0;
        for (int i = 0; i < 300; ++i) {
            FiberFuture done;
            auto child = spawn([&done, i] { done.set(i); }, SpawnOptions{.carrier = 1, .pinned = true});
            if (!child) { return -1; }
            ok += done.wait() == i ? 1 : 0;
            child->join();
        }
        return ok;
    });
    EXPECT_EQ(h.join(), 300);
}

TEST_P(PollModes, PlainThreadWakesAFiber) {
    FiberFuture ping;
    FiberFuture pong;
    constexpr int kRounds = 100;
    auto h = on(1, [&] {
        int ok = 0;
        for (int i = 0; i < kRounds; ++i) {
            ok += ping.wait() == i ? 1 : 0;
            ping.reset();
            pong.set(i);
        }
        return ok;
    });
    int ok = 0;
    for (int i = 0; i < kRounds; ++i) {
        ping.set(i);
        ok += pong.wait() == i ? 1 : 0;
        pong.reset();
    }
    EXPECT_EQ(ok, kRounds);
    EXPECT_EQ(h.join(), kRounds);
}

TEST_P(PollModes, AnIdleCarrierStealsFromABusyOne) {
    // A pinned fiber hogs carrier 0 until every fiber it queued there has run: only carrier 1 can run them.
    constexpr int kFibers = 16;
    std::atomic<int> ran{0};
    auto hog = on(0, [&] {
        for (int i = 0; i < kFibers; ++i) {
            auto h = spawn([&] {
                ran.fetch_add(1);
                this_fiber::yield();
            }, SpawnOptions{.carrier = 0});
            if (!h) { return false; }
        }
        while (ran.load() < kFibers) {
            cpuRelax();
        }
        return true;
    });
    EXPECT_TRUE(hog.join());
    EXPECT_EQ(ran.load(), kFibers);
    EXPECT_GE(sum(runtime_->stats(), &CarrierStats::steals), static_cast<uint64_t>(kFibers));
}

INSTANTIATE_TEST_SUITE_P(Modes, PollModes,
                         testing::Values(ModeParams{"block", PollMode::kBlock, false, true},
                                         ModeParams{"spin", PollMode::kSpin, false, true},
                                         ModeParams{"spin_coop_taskrun", PollMode::kSpin, false, false},
                                         ModeParams{"hybrid", PollMode::kHybrid, false, true},
                                         ModeParams{"block_sqpoll", PollMode::kBlock, true, true},
                                         ModeParams{"spin_sqpoll", PollMode::kSpin, true, true},
                                         ModeParams{"hybrid_sqpoll", PollMode::kHybrid, true, true}),
                         [](const testing::TestParamInfo<ModeParams>& p) { return std::string(p.param.name); });

TEST(PollMode, SpinningRuntimeWithNoWorkShutsDown) {
    RuntimeOptions o;
    o.carriers = 2;
    o.pollMode = PollMode::kSpin;
    auto rt = Runtime::start(o);
    ASSERT_TRUE(rt) << rt.error().message();
    rt->shutdown();
    rt->join();
    for (const auto& s : rt->stats()) { EXPECT_EQ(s.parks, 0u) << "carrier " << s.index; }
}

TEST(PollMode, SpinningRunReturnsFnsValue) {
    RuntimeOptions o;
    o.carriers = 2;
    o.pollMode = PollMode::kSpin;
    auto r = Runtime::run([] { return spindle::nop() ? 7 : -1; }, o);
    ASSERT_TRUE(r) << r.error().message();
    EXPECT_EQ(*r, 7);
}

TEST(PollMode, HybridParksAfterItsSpinWindow) {
    RuntimeOptions o;
    o.carriers = 2;
    o.pollMode = PollMode::kHybrid;
    o.spinMicros = 100;
    auto rt = Runtime::start(o);
    ASSERT_TRUE(rt) << rt.error().message();
    // Idle, each carrier spins for 100 µs and then parks: its park counter rises. 10 s is a hang, not a verdict.
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    auto allParked = [&] {
        for (const auto& s : rt->stats()) {
            if (s.parks == 0 || s.idleSpins == 0) { return false; }
        }
        return true;
    };
    while (!allParked() && std::chrono::steady_clock::now() < deadline) { std::this_thread::sleep_for(1ms); }
    EXPECT_TRUE(allParked());
    // Parked carriers still take work, woken the block way.
    auto h = rt->spawn([] {
        FiberFuture done;
        auto child = spawn([&done] { done.set(1); }, SpawnOptions{.carrier = 1, .pinned = true});
        if (!child) { return -1; }
        const int v = done.wait();
        child->join();
        return v;
    }, SpawnOptions{.carrier = 0, .pinned = true});
    ASSERT_TRUE(h);
    EXPECT_EQ(h->join(), 1);
    rt->waitIdle();
}

// With DEFER_TASKRUN and TASKRUN_FLAG a spinning carrier enters the kernel only when the ring flags task
// work: a read parked on an empty pipe costs no system call per idle pass, and its completion is still seen.
TEST(PollMode, SpinningCarrierWithIoInFlightEntersOnlyForTaskWork) {
    RuntimeOptions o;
    o.carriers = 1;
    o.pollMode = PollMode::kSpin;
    auto rt = Runtime::start(o);
    ASSERT_TRUE(rt) << rt.error().message();
    if (!ringHas(*rt, "defer_taskrun=true") || !ringHas(*rt, "taskrun_flag=true")) {
        rt->shutdown();
        rt->join();
        GTEST_SKIP() << "this kernel gave no DEFER_TASKRUN with TASKRUN_FLAG: " << rt->stats()[0].ring;
    }
    int fds[2];
    ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
    std::atomic<bool> reading{false};
    auto reader = rt->spawn([&] {
        reading.store(true);
        uint32_t v = 0;
        auto n = spindle::read(fds[0], &v, sizeof(v));
        return n && *n == sizeof(v) ? v : 0u;
    }, SpawnOptions{.carrier = 0, .pinned = true});
    ASSERT_TRUE(reader);
    while (!reading.load()) { std::this_thread::sleep_for(1ms); }
    std::this_thread::sleep_for(5ms);  // the read's SQE leaves on the next pass, well within this
    const auto before = rt->stats()[0];
    std::this_thread::sleep_for(50ms);
    const auto after = rt->stats()[0];
    // 50 ms of idle passes (hundreds of thousands of them) with a read in flight: without the flag each
    // pass would enter. A handful is allowed for stray task work (a timer, the eventfd re-arm).
    EXPECT_GT(after.idleSpins + after.fibersRun, 0u);
    EXPECT_LT(after.enters - before.enters, 20u) << "a spinning carrier entered the kernel with no task work flagged";
    const uint32_t v = 0xC0FFEE;
    ASSERT_EQ(::write(fds[1], &v, sizeof(v)), static_cast<ssize_t>(sizeof(v)));
    EXPECT_EQ(reader->join(), 0xC0FFEEu);
    EXPECT_EQ(rt->stats()[0].parks, 0u);
    ::close(fds[0]);
    ::close(fds[1]);
    rt->shutdown();
    rt->join();
}

TEST(PollMode, BlockModeNeverSpins) {
    auto rt = Runtime::start(testing_support::withCarriers(2));
    ASSERT_TRUE(rt);
    auto h = rt->spawn([] { return spindle::sleep(1ms) ? 1 : 0; });
    ASSERT_TRUE(h);
    EXPECT_EQ(h->join(), 1);
    rt->waitIdle();
    for (const auto& s : rt->stats()) { EXPECT_EQ(s.idleSpins, 0u); }
}

TEST(PollMode, SqpollThreadsSitOnNoCarriersPu) {
    RuntimeOptions o;
    o.carriers = 2;
    o.sqpoll = true;
    auto rt = Runtime::start(o);
    ASSERT_TRUE(rt) << rt.error().message();
    if (!ringHas(*rt, "sqpoll=true")) { GTEST_SKIP() << "this kernel refused IORING_SETUP_SQPOLL"; }
    for (const auto& s : rt->stats()) {
        SCOPED_TRACE(s.ring);
        EXPECT_EQ(s.ring.find("defer_taskrun=true"), std::string::npos) << "SQPOLL excludes DEFER_TASKRUN";
        if (s.pu < 0) {
            EXPECT_NE(s.ring.find("sq_thread_cpu=-1"), std::string::npos) << "unbound carrier: SQ thread unpinned";
        } else {
            // On no carrier's PU: a spinning carrier would hold the CPU for a whole time slice while its
            // neighbour's SQ thread waited (8 ms per round trip through a pipe on 16 idle cores).
            for (const auto& other : rt->stats()) {
                EXPECT_EQ(s.ring.find("sq_thread_cpu=" + std::to_string(other.pu) + " "), std::string::npos)
                    << "the SQ thread of carrier " << s.index << " shares PU " << other.pu << " with carrier "
                    << other.index;
            }
        }
    }
}

#if defined(SPINDLE_FAULT_INJECTION)
TEST(PollMode, RefusedSqpollFallsBackToAPlainRing) {
    SPINDLE_REQUIRE_URING("SQPOLL");
    inject::arm(inject::Point::kSqpollSetup, EPERM, /*count=*/2);
    RuntimeOptions o;
    o.carriers = 2;
    o.sqpoll = true;
    auto rt = Runtime::start(o);
    inject::disarm(inject::Point::kSqpollSetup);
    ASSERT_TRUE(rt) << "a refused SQPOLL must not fail start: " << rt.error().message();
    EXPECT_TRUE(ringHas(*rt, "sqpoll=false"));
    int fds[2];
    ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
    auto h = rt->spawn([&] {
        const char out[] = "fallback";
        char in[sizeof(out)] = {};
        auto w = spindle::write(fds[1], out, sizeof(out));
        auto r = spindle::read(fds[0], in, sizeof(in));
        return w && r && *r == sizeof(out) && std::string(in) == out;
    });
    ASSERT_TRUE(h);
    EXPECT_TRUE(h->join());
    rt->waitIdle();
    ::close(fds[0]);
    ::close(fds[1]);
}
#endif

TEST(PollMode, NonsenseOptionsFailStartWithEinval) {
    auto expectEinval = [](RuntimeOptions o, const char* what) {
        o.carriers = 1;
        auto rt = Runtime::start(o);
        ASSERT_FALSE(rt) << what;
        EXPECT_EQ(rt.errorCode(), EINVAL) << what;
    };
    RuntimeOptions o;
    o.pollMode = static_cast<PollMode>(7);
    expectEinval(o, "pollMode out of range");
    o = RuntimeOptions{};
    o.pollMode = PollMode::kHybrid;
    o.spinMicros = 0;
    expectEinval(o, "spinMicros 0");
    o.spinMicros = 1'000'001;
    expectEinval(o, "spinMicros above 1 s");
    o = RuntimeOptions{};
    o.sqpoll = true;
    o.sqThreadIdleMs = 0;
    expectEinval(o, "sqThreadIdleMs 0");
    o.sqThreadIdleMs = 60'001;
    expectEinval(o, "sqThreadIdleMs above 60 s");
    // The edges are accepted.
    o = RuntimeOptions{};
    o.carriers = 1;
    o.pollMode = PollMode::kHybrid;
    o.spinMicros = 1'000'000;
    o.sqThreadIdleMs = 60'000;
    auto rt = Runtime::start(o);
    EXPECT_TRUE(rt) << rt.error().message();
}

}  // namespace
}  // namespace spindle
