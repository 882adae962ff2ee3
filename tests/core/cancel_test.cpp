// SPDX-License-Identifier: Apache-2.0
// Deadlines (linked timeouts) and FiberHandle::cancel(): a pipe read that never completes times out and
// the fiber goes on; a deadline already passed has no side effect; a fiber blocked in each kind of wait
// (I/O, sleep, a primitive's timed wait) is cancelled from a thread, from a fiber on another carrier and
// from one on its own carrier; cancellation racing a completion loses no byte in either order; a
// cancelled fiber's later calls fail until it acknowledges; untimed waits are not interrupted.
//
// No verdict depends on timing: a timeout is only ever checked to have come no earlier than its deadline,
// and where a cancel may land before or after the wait began, both orders must give ECANCELED (the test
// forces each order where it can: a latch for "before", the ring's submission count for "during").

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/fiber.h"
#include "core/fiber_condvar.h"
#include "core/fiber_event.h"
#include "core/fiber_future.h"
#include "core/fiber_futex.h"
#include "core/fiber_mutex.h"
#include "core/fiber_semaphore.h"
#include "core/io.h"
#include "tests/core/with_runtime.h"

namespace spindle {
namespace {

using namespace std::chrono_literals;
using testing_support::kSanitized;
using testing_support::yieldUntil;

using testing_support::Pipe;

class Deadlines : public testing_support::WithRuntime {};
class Cancel : public testing_support::WithRuntime {
protected:
    /// SQEs carrier `c` has submitted so far.
    uint64_t submitted(unsigned c) { return rt().stats().at(c).sqesSubmitted; }
    uint64_t cancelled() {
        uint64_t n = 0;
        for (const auto& s : rt().stats()) { n += s.waitsCancelled; }
        return n;
    }
};

// ---- deadlines ------------------------------------------------------------------------------------

TEST_F(Deadlines, PipeReadThatNeverCompletesTimesOutAndTheFiberGoesOn) {
    Pipe p;
    ASSERT_GE(p.r, 0);
    auto h = on(0, [&] {
        char buf[8];
        const auto start = std::chrono::steady_clock::now();
        auto r = spindle::read(p.r, buf, sizeof(buf), kCurrentPosition, 30ms);
        const auto waited = std::chrono::steady_clock::now() - start;
        EXPECT_FALSE(r);
        EXPECT_EQ(r.errorCode(), ETIMEDOUT);
        EXPECT_GE(waited, 30ms);  // never before the deadline
        // The fiber goes on, and the pipe lost nothing: a byte written now is read in full.
        EXPECT_EQ(::write(p.w, "x", 1), 1);
        auto again = spindle::read(p.r, buf, sizeof(buf), kCurrentPosition, 10s);
        EXPECT_TRUE(again && *again == 1 && buf[0] == 'x');
        return 0;
    });
    EXPECT_EQ(h.join(), 0);
}

TEST_F(Deadlines, APassedDeadlineFailsWithoutSideEffects) {
    Pipe p;
    ASSERT_GE(p.r, 0);
    onFiber([&] {
        const Deadline past = Deadline(std::chrono::steady_clock::now() - 1s);
        EXPECT_TRUE(past.expired());
        auto w = spindle::write(p.w, "abc", 3, kCurrentPosition, past);
        EXPECT_EQ(w.errorCode(), ETIMEDOUT);
        EXPECT_EQ(p.queued(), 0);  // nothing was written
        auto z = spindle::nop(Deadline(0ns));
        EXPECT_EQ(z.errorCode(), ETIMEDOUT);
    });
}

TEST_F(Deadlines, AnOperationThatFinishesFirstReturnsItsResult) {
    Pipe p;
    ASSERT_GE(p.r, 0);
    const int rounds = kSanitized ? 200 : 2000;
    onFiber([&] {
        for (int i = 0; i < rounds; ++i) {
            char c = static_cast<char>(i);
            auto w = spindle::write(p.w, &c, 1, kCurrentPosition, 10s);
            ASSERT_TRUE(w && *w == 1);
            char got = 0;
            auto r = spindle::read(p.r, &got, 1, kCurrentPosition, 10s);
            ASSERT_TRUE(r && *r == 1);
            ASSERT_EQ(got, c);
        }
        // The linked timeouts' own completions, arriving later, disturb nothing.
        for (int i = 0; i < 100; ++i) { ASSERT_TRUE(spindle::nop()); }
    });
}

TEST_F(Deadlines, PollAndManyConcurrentReadsTimeOut) {
    constexpr int kFibers = 64;
    std::vector<Pipe> pipes(kFibers);
    std::atomic<int> timedOut{0};
    std::vector<FiberHandle<void>> hs;
    for (int i = 0; i < kFibers; ++i) {
        hs.push_back(anywhere([&, i] {
            char buf[4];
            const int fd = pipes[static_cast<size_t>(i)].r;
            const int err = i % 2 == 0 ? spindle::read(fd, buf, 4, kCurrentPosition, 20ms).errorCode()
                                       : spindle::poll(fd, POLLIN, 20ms).errorCode();
            if (err == ETIMEDOUT) { timedOut.fetch_add(1); }
        }));
    }
    for (auto& h : hs) { h.join(); }
    EXPECT_EQ(timedOut.load(), kFibers);
}

TEST_F(Deadlines, WorkOffFiberOnTheThreadRing) {
    Pipe p;
    ASSERT_GE(p.r, 0);
    char buf[4];
    auto r = spindle::read(p.r, buf, sizeof(buf), kCurrentPosition, 20ms);
    EXPECT_EQ(r.errorCode(), ETIMEDOUT);
    ASSERT_EQ(::write(p.w, "ok", 2), 2);
    auto again = spindle::read(p.r, buf, sizeof(buf), kCurrentPosition, 10s);
    ASSERT_TRUE(again);
    EXPECT_EQ(*again, 2u);
    EXPECT_EQ(spindle::nop(Deadline(std::chrono::steady_clock::now() - 1ms)).errorCode(), ETIMEDOUT);
}

// Deadlines short enough to fire while a file write is running (in io_uring's worker, where the kernel
// may answer the timeout's cancel with EALREADY): whatever the timing, a call that reports success wrote
// all its bytes, and one that timed out returned only after its operation's completion.
TEST(DeadlineRaces, ShortDeadlinesOnFileWritesNeverMisreportAResult) {
    testing_support::ScratchDir dir;
    ASSERT_TRUE(dir.ok());
    const std::string file = dir.path("deadline-writes");
    const int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    ASSERT_GE(fd, 0);
    const int rounds = kSanitized ? 64 : 256;
    constexpr size_t kBlock = 64 * 1024;
    int wrote = 0;
    int timedOut = 0;
    auto r = Runtime::run([&] {
        for (int i = 0; i < rounds; ++i) {
            const auto data = testing_support::pattern(kBlock, static_cast<unsigned>(i));
            const uint64_t off = static_cast<uint64_t>(i) * kBlock;
            auto w = spindle::write(fd, data.data(), kBlock, off, std::chrono::microseconds(i % 40));
            if (w) {
                ASSERT_GT(*w, 0u);
                std::vector<char> back(*w);
                ASSERT_EQ(::pread(fd, back.data(), back.size(), static_cast<off_t>(off)), static_cast<ssize_t>(*w));
                ASSERT_TRUE(std::equal(back.begin(), back.end(), data.begin()));
                ++wrote;
            } else {
                ASSERT_TRUE(w.errorCode() == ETIMEDOUT) << w.error().message();
                ++timedOut;
            }
            auto s = spindle::fsync(fd, std::chrono::microseconds(i % 7));
            ASSERT_TRUE(s || s.errorCode() == ETIMEDOUT) << s.error().message();
        }
    }, testing_support::withCarriers(1));
    ASSERT_TRUE(r);
    EXPECT_EQ(wrote + timedOut, rounds);
    ::close(fd);
}

TEST(DeadlineType, ConversionsSaturateAndOrder) {
    EXPECT_FALSE(Deadline().isSet());
    EXPECT_FALSE(Deadline::never().expired());
    EXPECT_TRUE(Deadline(-5s).expired());
    const Deadline far = std::chrono::nanoseconds::max();
    EXPECT_TRUE(far.isSet());
    EXPECT_FALSE(far.expired());
    EXPECT_EQ(far.ns(), static_cast<uint64_t>(INT64_MAX));
    const Deadline hours = std::chrono::hours(24 * 365 * 1000);  // overflows int64 nanoseconds
    EXPECT_EQ(hours.ns(), static_cast<uint64_t>(INT64_MAX));
    // The integer path's edges: the first count past what nanoseconds hold, either way.
    constexpr int64_t kMsMax = INT64_MAX / 1'000'000;
    EXPECT_EQ(Deadline(std::chrono::milliseconds(kMsMax + 1)).ns(), static_cast<uint64_t>(INT64_MAX));
    EXPECT_EQ(Deadline(std::chrono::hours::max()).ns(), static_cast<uint64_t>(INT64_MAX));
    EXPECT_TRUE(Deadline(std::chrono::hours::min()).expired());
    EXPECT_TRUE(Deadline(std::chrono::milliseconds(-kMsMax - 1)).expired());
    // Fractional and floating-point durations take the other path.
    const uint64_t low = Deadline(400ms).ns();
    const uint64_t half = Deadline(std::chrono::duration<double>(0.5)).ns();
    EXPECT_GT(half, low);
    EXPECT_LE(half, Deadline(500ms).ns());
    EXPECT_TRUE(Deadline(std::chrono::duration<double>(-1.0)).expired());
    EXPECT_LT(Deadline(1s).ns(), Deadline(2s).ns());
    const auto t = std::chrono::steady_clock::now() + 1h;
    EXPECT_EQ(Deadline(t).ns(),
              static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count()));
}

// ---- cancellation: each kind of wait ---------------------------------------------------------------

TEST_F(Cancel, ABlockedPipeReadReturnsEcanceledFromAThread) {
    Pipe p;
    ASSERT_GE(p.r, 0);
    std::atomic<bool> reading{false};
    std::atomic<uint64_t> before{0};
    auto h = on(0, [&] {
        char buf[4];
        // Counted here, not before the spawn: the wake-up that brought this fiber re-arms the carrier's
        // eventfd read, an SQE that would otherwise pass for the read's own.
        before.store(submitted(0));
        reading.store(true);
        auto r = spindle::read(p.r, buf, sizeof(buf));
        EXPECT_EQ(r.errorCode(), ECANCELED);
        EXPECT_TRUE(this_fiber::cancellationRequested());
        // Until acknowledged, every call fails at once, with no side effect.
        EXPECT_EQ(spindle::nop().errorCode(), ECANCELED);
        EXPECT_EQ(spindle::write(p.w, "z", 1).errorCode(), ECANCELED);
        EXPECT_EQ(this_fiber::sleep_for(1h).errorCode(), ECANCELED);
        EXPECT_EQ(p.queued(), 0);
        EXPECT_TRUE(this_fiber::acknowledgeCancellation());
        EXPECT_FALSE(this_fiber::acknowledgeCancellation());
        EXPECT_TRUE(spindle::nop());
        return 1;
    });
    // The read's SQE has left for the kernel: the fiber is parked in it.
    yieldUntil([&] { return reading.load() && submitted(0) > before.load(); });
    h.cancel();
    EXPECT_EQ(h.join(), 1);
    EXPECT_GE(cancelled(), 1u);
}

TEST_F(Cancel, ACancelBeforeTheCallFailsItWithoutSubmitting) {
    Pipe p;
    ASSERT_GE(p.r, 0);
    std::atomic<bool> go{false};
    auto h = on(0, [&] {
        while (!go.load()) { this_fiber::yield(); }
        EXPECT_TRUE(this_fiber::cancellationRequested());
        char buf[4];
        EXPECT_EQ(spindle::read(p.r, buf, sizeof(buf)).errorCode(), ECANCELED);
    });
    h.cancel();
    h.cancel();  // idempotent
    go.store(true);
    h.join();
    EXPECT_EQ(cancelled(), 0u);  // no wait had to be ended
}

TEST_F(Cancel, FromAFiberOnTheSameCarrierAndFromAnother) {
    for (int cancellerCarrier : {0, 1}) {
        Pipe p;
        ASSERT_GE(p.r, 0);
        std::atomic<bool> reading{false};
        const uint64_t before = submitted(0);
        auto victim = on(0, [&] {
            char buf[4];
            reading.store(true);
            return spindle::read(p.r, buf, sizeof(buf), kCurrentPosition, 1h).errorCode();
        });
        auto canceller = on(cancellerCarrier, [&] {
            while (!(reading.load() && submitted(0) > before)) { this_fiber::yield(); }
            victim.cancel();
        });
        canceller.join();
        // The deadline is an hour away: ECANCELED, not ETIMEDOUT.
        EXPECT_EQ(victim.join(), ECANCELED) << "canceller on carrier " << cancellerCarrier;
    }
}

TEST_F(Cancel, ASleepingFiberWakesWithEcanceled) {
    std::atomic<bool> sleeping{false};
    auto h = on(1, [&] {
        sleeping.store(true);
        return this_fiber::sleep_for(1h).errorCode();
    });
    yieldUntil([&] { return sleeping.load(); });
    std::this_thread::sleep_for(5ms);  // likely parked by now; either order must give ECANCELED
    h.cancel();
    EXPECT_EQ(h.join(), ECANCELED);
}

TEST_F(Cancel, TimedWaitsOfThePrimitivesEndWithTheCancellation) {
    FiberFutex futex;
    FiberSemaphore sem(0);
    FiberMutex m;
    FiberCondVar cv;
    FiberFuture never;
    std::atomic<int> parked{0};
    auto futexWaiter = on(0, [&] {
        parked.fetch_add(1);
        return futex.waitFor(futex.get() + 1, 1h);
    });
    auto semWaiter = on(1, [&] {
        parked.fetch_add(1);
        const bool got = sem.try_acquire_for(1h);
        return got ? 0 : (this_fiber::cancellationRequested() ? -ECANCELED : -ETIMEDOUT);
    });
    auto cvWaiter = on(0, [&] {
        std::unique_lock<FiberMutex> lock(m);
        parked.fetch_add(1);
        const auto st = cv.wait_for(lock, 1h);
        EXPECT_TRUE(lock.owns_lock());
        return st == std::cv_status::timeout && this_fiber::cancellationRequested() ? -ECANCELED : 0;
    });
    auto futureWaiter = on(1, [&] {
        parked.fetch_add(1);
        return FiberFuture::waitWithTimeout(&never, 1h);
    });
    yieldUntil([&] { return parked.load() == 4; });
    std::this_thread::sleep_for(5ms);
    futexWaiter.cancel();
    semWaiter.cancel();
    cvWaiter.cancel();
    futureWaiter.cancel();
    EXPECT_EQ(futexWaiter.join(), -ECANCELED);
    EXPECT_EQ(semWaiter.join(), -ECANCELED);
    EXPECT_EQ(cvWaiter.join(), -ECANCELED);
    EXPECT_EQ(futureWaiter.join(), -ECANCELED);
    EXPECT_EQ(sem.available(), 0);
}

TEST_F(Cancel, UntimedWaitsAreNotInterruptedButSeeTheRequestNext) {
    FiberEvent ev;
    std::atomic<bool> waiting{false};
    std::atomic<bool> returned{false};
    auto h = on(0, [&] {
        waiting.store(true);
        ev.wait();
        returned.store(true);
        return this_fiber::sleep_for(1ms).errorCode();
    });
    yieldUntil([&] { return waiting.load(); });
    h.cancel();
    std::this_thread::sleep_for(5ms);
    EXPECT_FALSE(returned.load());  // still waiting: wait() cannot report ECANCELED
    ev.set();
    EXPECT_EQ(h.join(), ECANCELED);
}

TEST_F(Cancel, AFinishedFiberIgnoresIt) {
    auto h = anywhere([] { return 7; });
    yieldUntil([&] { return h.done(); });
    h.cancel();
    EXPECT_EQ(h.join(), 7);
}

// ---- cancellation racing completion ----------------------------------------------------------------

TEST_F(Cancel, RacingACompletionLosesNoByteInEitherOrder) {
    const int rounds = kSanitized ? 100 : 1000;
    int completedFirst = 0;
    int cancelledFirst = 0;
    for (int i = 0; i < rounds; ++i) {
        Pipe p;
        ASSERT_GE(p.r, 0);
        std::atomic<bool> reading{false};
        auto h = on(i % 2, [&] {
            char c = 0;
            reading.store(true);
            auto r = spindle::read(p.r, &c, 1);
            if (r) { return *r == 1 && c == 'q' ? 1 : -1000; }
            if (r.errorCode() != ECANCELED) { return -r.errorCode(); }
            // Cancelled before the byte was taken: it is still in the pipe.
            EXPECT_TRUE(this_fiber::acknowledgeCancellation());
            auto again = spindle::read(p.r, &c, 1);
            return again && *again == 1 && c == 'q' ? 2 : -2000;
        });
        yieldUntil([&] { return reading.load(); });
        if (i % 3 == 0) {
            ASSERT_EQ(::write(p.w, "q", 1), 1);
            h.cancel();
        } else {
            h.cancel();
            ASSERT_EQ(::write(p.w, "q", 1), 1);
        }
        const int got = h.join();
        ASSERT_TRUE(got == 1 || got == 2) << "round " << i << ": " << got;
        (got == 1 ? completedFirst : cancelledFirst) += 1;
    }
    EXPECT_EQ(completedFirst + cancelledFirst, rounds);
}

TEST_F(Cancel, MigratingFibersAllStop) {
    // Unpinned fibers that sleep, read with deadlines and yield, so they move between carriers and a
    // cancel may chase one from the carrier it waited on to the next.
    const int fibers = kSanitized ? 50 : 200;
    std::vector<Pipe> pipes(static_cast<size_t>(fibers));
    std::atomic<int> stopped{0};
    std::atomic<int> started{0};
    std::vector<FiberHandle<void>> hs;
    for (int i = 0; i < fibers; ++i) {
        hs.push_back(onUnpinned(i % 2, [&, i] {
            started.fetch_add(1);
            char buf[1];
            for (unsigned k = 0;; ++k) {
                Result<void> r;
                switch ((k + static_cast<unsigned>(i)) % 3) {
                    case 0: r = this_fiber::sleep_for(std::chrono::microseconds(50 + (k % 7) * 30)); break;
                    case 1: {
                        auto rr = spindle::read(pipes[static_cast<size_t>(i)].r, buf, 1, kCurrentPosition, 100us);
                        r = rr.errorCode() == ETIMEDOUT ? Result<void>{} : Result<void>(Error{rr.errorCode()});
                        break;
                    }
                    default: this_fiber::yield(); r = spindle::nop(); break;
                }
                if (!r) {
                    EXPECT_EQ(r.errorCode(), ECANCELED);
                    break;
                }
            }
            stopped.fetch_add(1);
        }));
    }
    yieldUntil([&] { return started.load() == fibers; });
    std::this_thread::sleep_for(2ms);
    for (auto& h : hs) { h.cancel(); }
    for (auto& h : hs) { h.join(); }
    EXPECT_EQ(stopped.load(), fibers);
}

}  // namespace
}  // namespace spindle
