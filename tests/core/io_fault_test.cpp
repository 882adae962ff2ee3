// SPDX-License-Identifier: Apache-2.0
// I/O fault classes applied inside uring::Ring (uring/inject.h), driven through the public calls: a
// submission that fails with an errno and no side effect (alone, in a chain with a deadline, and amid
// a hundred fibers), short reads and writes that a loop recovers from, an SQ that behaves as full,
// and completions held back for a while. Each test checks the call's answer, that every fiber comes
// back (no completion lost), that every armed fault was used, and that the runtime works afterwards;
// ASan/LSan builds check that nothing leaks.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "core/fiber.h"
#include "core/io.h"
#include "core/runtime.h"
#include "tests/core/with_runtime.h"
#include "uring/inject.h"

namespace spindle {
namespace {

using namespace std::chrono_literals;

using testing_support::kSanitized;
using testing_support::pattern;
using testing_support::withCarriers;

using inject::ArmedFault;

using testing_support::Pipe;

class IoFaultTest : public testing_support::WithScratchDir {
protected:
    void SetUp() override {
        SPINDLE_REQUIRE_URING("fault injection in the ring (uring/inject.h)");
        WithScratchDir::SetUp();
    }
};

// ---- submission failure ---------------------------------------------------------------------------------------

TEST_F(IoFaultTest, AFailedSubmissionReturnsTheErrnoAndHasNoSideEffect) {
    const int fd = makeFile("f");
    const auto data = pattern(4096, 1);
    const auto [first, second, nopErr] = onFiber([&] {
        ArmedFault f(inject::Point::kSubmitFail, EIO);
        auto w1 = spindle::write(fd, data.data(), data.size(), 0);
        auto w2 = spindle::write(fd, data.data(), 100, 8192);  // the fault is used up
        auto n = spindle::nop();
        return std::make_tuple(w1.errorCode(), w2.valueOr(0), n.errorCode());
    });
    EXPECT_EQ(first, EIO);
    EXPECT_EQ(second, 100u);
    EXPECT_EQ(nopErr, 0);
    // The failed write never reached the kernel: the first 4 KiB are a hole, not the data.
    std::vector<char> back(data.size());
    ASSERT_EQ(::pread(fd, back.data(), back.size(), 0), static_cast<ssize_t>(back.size()));
    EXPECT_EQ(back, std::vector<char>(data.size(), 0));
    ::close(fd);
}

TEST_F(IoFaultTest, EveryFailedSubmissionOfAHundredPipeFibersIsReportedAndRetried) {
    // Each fiber moves kRounds messages through its own pipe and retries whatever failed. An injected
    // failure must have had no side effect: a write that failed but wrote would duplicate a message, a
    // read that failed but read would lose one.
    constexpr int kFibers = 100;
    const int kRounds = kSanitized ? 5 : 20;
    constexpr uint32_t kFailures = 200;
    std::vector<Pipe> pipes(kFibers);
    std::atomic<uint64_t> failures{0};
    std::atomic<uint64_t> mismatches{0};
    std::atomic<uint64_t> otherErrors{0};
    {
        ArmedFault f(inject::Point::kSubmitFail, EIO, kFailures, /*skip=*/10);
        std::vector<FiberHandle<void>> hs;
        for (int i = 0; i < kFibers; ++i) {
            hs.push_back(anywhere([&, i] {
                const Pipe& p = pipes[static_cast<size_t>(i)];
                for (int r = 0; r < kRounds; ++r) {
                    const std::string msg = "fiber " + std::to_string(i) + " round " + std::to_string(r);
                    for (;;) {
                        auto w = spindle::write(p.writeEnd(), msg.data(), msg.size());
                        if (w) {
                            if (*w != msg.size()) { mismatches.fetch_add(1); }
                            break;
                        }
                        (w.errorCode() == EIO ? failures : otherErrors).fetch_add(1);
                    }
                    std::string got;
                    while (got.size() < msg.size()) {
                        char buf[64];
                        auto rd = spindle::read(p.readEnd(), buf, msg.size() - got.size());
                        if (rd) {
                            got.append(buf, *rd);
                        } else {
                            (rd.errorCode() == EIO ? failures : otherErrors).fetch_add(1);
                        }
                    }
                    if (got != msg) { mismatches.fetch_add(1); }
                }
            }));
        }
        for (auto& h : hs) { h.join(); }
        EXPECT_EQ(inject::remaining(inject::Point::kSubmitFail), 0u);
    }
    EXPECT_EQ(failures.load(), kFailures);
    EXPECT_EQ(otherErrors.load(), 0u);
    EXPECT_EQ(mismatches.load(), 0u);
    for (auto& p : pipes) {  // nothing left over in any pipe
        EXPECT_EQ(::fcntl(p.readEnd(), F_SETFL, O_NONBLOCK), 0);
        char c;
        EXPECT_EQ(::read(p.readEnd(), &c, 1), -1);
        EXPECT_EQ(errno, EAGAIN);
    }
    // The runtime is unharmed.
    EXPECT_TRUE(onFiber([] { return static_cast<bool>(spindle::nop()); }));
}

TEST_F(IoFaultTest, AFailedSubmissionWithADeadlineFailsItsWholeChainAtOnce) {
    // A read with a deadline is the read linked to an IORING_OP_LINK_TIMEOUT. Failing the read must
    // answer at once with the errno (not ETIMEDOUT after 5 s, not EINVAL from a broken chain) and leave
    // the ring able to run the next chains.
    Pipe p;
    const auto start = std::chrono::steady_clock::now();
    const auto [err, elapsed, timedOut, afterData] = onFiber([&] {
        char buf[16];
        int e;
        std::chrono::steady_clock::duration took;
        {
            ArmedFault f(inject::Point::kSubmitFail, ENOBUFS);
            const auto t0 = std::chrono::steady_clock::now();
            auto r = spindle::read(p.readEnd(), buf, sizeof(buf), 0, std::chrono::seconds(5));
            took = std::chrono::steady_clock::now() - t0;
            e = r.errorCode();
        }
        // Disarmed: the same call on the empty pipe times out, and then one with data succeeds.
        auto t = spindle::read(p.readEnd(), buf, sizeof(buf), 0, 20ms);
        const char msg[] = "hello";
        (void)spindle::write(p.writeEnd(), msg, sizeof(msg));
        auto d = spindle::read(p.readEnd(), buf, sizeof(buf), 0, std::chrono::seconds(5));
        return std::make_tuple(e, took, t.errorCode(), d.valueOr(0));
    });
    EXPECT_EQ(err, ENOBUFS);
    EXPECT_LT(elapsed, 4s) << "the failed read waited for its deadline";
    EXPECT_EQ(timedOut, ETIMEDOUT);
    EXPECT_EQ(afterData, 6u);
    EXPECT_LT(std::chrono::steady_clock::now() - start, 4s);
}

TEST_F(IoFaultTest, AFailedSubmissionFromAPlainThreadComesBackToo) {
    // Off-fiber calls run on the thread's own ring, which takes the same faults.
    Pipe p;
    char buf[8];
    {
        ArmedFault f(inject::Point::kSubmitFail, EPERM);
        auto r = spindle::read(p.readEnd(), buf, sizeof(buf), 0, std::chrono::seconds(5));
        EXPECT_EQ(r.errorCode(), EPERM);
    }
    auto n = spindle::nop();
    EXPECT_TRUE(n) << n.error().message();
}

// A plain thread's call returns only with its completion, even when io_uring_enter fails on the
// way (ENOMEM: the kernel short of memory): it used to return that errno with its SQE still in the
// thread's ring, to go out with the next call and read into a buffer that was no longer the caller's.
TEST_F(IoFaultTest, APlainThreadsCallOutlastsAFailedEnter) {
    Pipe p;
    ASSERT_EQ(::write(p.w, "hello", 5), 5);
    char buf[8] = {};
    {
        ArmedFault f(inject::Point::kEnterFail, ENOMEM, 3);
        auto r = spindle::read(p.readEnd(), buf, sizeof(buf));
        ASSERT_TRUE(r) << r.error().message();
        EXPECT_EQ(*r, 5u);
        EXPECT_EQ(std::string(buf, 5), "hello");
        EXPECT_EQ(inject::remaining(inject::Point::kEnterFail), 0u);
    }
    // The next call gets its own completion, not a stale one.
    ASSERT_EQ(::write(p.w, "world!", 6), 6);
    char buf2[8] = {};
    auto r = spindle::read(p.readEnd(), buf2, sizeof(buf2));
    ASSERT_TRUE(r) << r.error().message();
    EXPECT_EQ(std::string(buf2, *r), "world!");
}

// ---- short reads and writes -----------------------------------------------------------------------------------

TEST_F(IoFaultTest, ShortReadsAreRecoveredByAReadUntilFullLoop) {
    const int fd = makeFile("short-read");
    const auto data = pattern(1 << 20, 3);
    ASSERT_EQ(::pwrite(fd, data.data(), data.size(), 0), static_cast<ssize_t>(data.size()));
    constexpr uint32_t kShort = 20;
    constexpr size_t kChunk = 64 * 1024;
    const auto [back, shortReads] = onFiber([&] {
        ArmedFault f(inject::Point::kShortIo, /*divisor=*/3, kShort);
        std::vector<char> out(data.size());
        size_t got = 0;
        uint32_t shortCount = 0;
        while (got < out.size()) {
            const size_t want = std::min(kChunk, out.size() - got);
            auto r = spindle::read(fd, out.data() + got, want, got);
            if (!r || *r == 0) { break; }
            if (*r < want) { ++shortCount; }
            got += *r;
        }
        out.resize(got);
        EXPECT_EQ(inject::remaining(inject::Point::kShortIo), 0u);
        return std::make_pair(std::move(out), shortCount);
    });
    EXPECT_EQ(shortReads, kShort);
    EXPECT_TRUE(back == data) << "the file was not reconstructed";
    ::close(fd);
}

TEST_F(IoFaultTest, ShortWritesAndVectoredIoAreRecoveredByALoop) {
    const int fd = makeFile("short-write");
    const auto data = pattern(300'000, 4);
    constexpr uint32_t kShort = 12;
    const auto [shortWrites, readvOk] = onFiber([&] {
        ArmedFault f(inject::Point::kShortIo, /*divisor=*/2, kShort);
        uint32_t shortCount = 0;
        size_t done = 0;
        while (done < data.size()) {
            const size_t want = std::min<size_t>(32 * 1024, data.size() - done);
            auto w = spindle::write(fd, data.data() + done, want, done);
            if (!w) { return std::make_pair(shortCount, false); }
            if (*w < want) { ++shortCount; }
            done += *w;
        }
        // A vectored read of the first 8 KiB comes back short too, and a loop finishes it.
        std::vector<char> head(8192);
        size_t got = 0;
        while (got < head.size()) {
            iovec iov{head.data() + got, head.size() - got};
            auto r = spindle::readv(fd, &iov, 1, got);
            if (!r || *r == 0) { break; }
            if (*r < head.size() - got) { ++shortCount; }
            got += *r;
        }
        EXPECT_EQ(inject::remaining(inject::Point::kShortIo), 0u);
        return std::make_pair(shortCount, got == head.size() && std::memcmp(head.data(), data.data(), got) == 0);
    });
    EXPECT_EQ(shortWrites, kShort);
    EXPECT_TRUE(readvOk);
    std::vector<char> back(data.size());
    ASSERT_EQ(::pread(fd, back.data(), back.size(), 0), static_cast<ssize_t>(back.size()));
    EXPECT_TRUE(back == data);
    ::close(fd);
}

TEST_F(IoFaultTest, PipesAreNeverShortened) {
    // A short count on a pipe that was not really short would lose bytes: the class leaves pipes alone.
    Pipe p;
    const auto [wrote, readBack, left] = onFiber([&] {
        ArmedFault f(inject::Point::kShortIo, 2, 5);
        const std::string msg(1000, 'x');
        auto w = spindle::write(p.writeEnd(), msg.data(), msg.size());
        std::string got(msg.size(), '\0');
        auto r = spindle::read(p.readEnd(), got.data(), got.size());
        return std::make_tuple(w.valueOr(0), r.valueOr(0), inject::remaining(inject::Point::kShortIo));
    });
    EXPECT_EQ(wrote, 1000u);
    EXPECT_EQ(readBack, 1000u);
    EXPECT_EQ(left, 5u) << "a pipe transfer used a short-I/O fault";
}

// ---- SQ full --------------------------------------------------------------------------------------------------

TEST(IoFaultSqFull, EachInjectedPassTakesTheSqFullPathOnce) {
    SPINDLE_REQUIRE_URING("the SQ-full path");
    // One carrier and one fiber doing nops one at a time: the SQ never fills by itself, so every
    // sqFull counted is an injected one, and each pass counts exactly once.
    auto rt = Runtime::start(withCarriers(1));
    ASSERT_TRUE(rt) << rt.error().message();
    constexpr uint32_t kPasses = 7;
    const uint64_t before = rt->stats()[0].sqFull;
    auto h = rt->spawn([] {
        ArmedFault f(inject::Point::kSqFull, EBUSY, kPasses);
        int errors = 0;
        // The ring notices the point at its next submission, so nop until every pass is used.
        for (int i = 0; i < 1000 && inject::remaining(inject::Point::kSqFull) != 0; ++i) {
            if (!spindle::nop()) { ++errors; }
        }
        return std::make_pair(errors, inject::remaining(inject::Point::kSqFull));
    });
    ASSERT_TRUE(h);
    const auto [errors, left] = h->join();
    EXPECT_EQ(errors, 0);
    EXPECT_EQ(left, 0u);
    EXPECT_EQ(rt->stats()[0].sqFull - before, kPasses);
}

TEST(IoFaultSqFull, AnEightEntryRingKeepsEveryCallAndChainWhileReportedFull) {
    SPINDLE_REQUIRE_URING("the SQ-full path");
    // Many fibers on a ring of 8 entries, half of their calls with a deadline (a two-SQE chain that
    // must leave in one submission), while the SQ also claims to be full: all answer correctly.
    RuntimeOptions o = withCarriers(1);
    o.ringEntries = 8;
    auto rt = Runtime::start(o);
    ASSERT_TRUE(rt) << rt.error().message();
    const int kFibers = kSanitized ? 50 : 200;
    constexpr int kCalls = 10;
    constexpr uint32_t kPasses = 300;
    const uint64_t before = rt->stats()[0].sqFull;
    std::atomic<int> errors{0};
    std::atomic<int> ok{0};
    {
        ArmedFault f(inject::Point::kSqFull, EBUSY, kPasses);
        auto parent = rt->spawn([&] {
            std::vector<FiberHandle<void>> hs;
            for (int i = 0; i < kFibers; ++i) {
                auto h = spindle::spawn([&, i] {
                    for (int c = 0; c < kCalls; ++c) {
                        auto r = (i + c) % 2 == 0 ? spindle::nop() : spindle::nop(std::chrono::seconds(30));
                        (r ? ok : errors).fetch_add(1);
                    }
                });
                if (h) { hs.push_back(std::move(*h)); }
            }
            for (auto& h : hs) { h.join(); }
            return hs.size();
        });
        ASSERT_TRUE(parent);
        EXPECT_EQ(parent->join(), static_cast<size_t>(kFibers));
        EXPECT_EQ(inject::remaining(inject::Point::kSqFull), 0u);
    }
    EXPECT_EQ(errors.load(), 0);
    EXPECT_EQ(ok.load(), kFibers * kCalls);
    EXPECT_GE(rt->stats()[0].sqFull - before, kPasses);
    auto after = rt->spawn([] { return static_cast<bool>(spindle::nop()); });
    ASSERT_TRUE(after);
    EXPECT_TRUE(after->join());
    rt->shutdown();
    rt->join();
    EXPECT_EQ(rt->liveFibers(), 0u);
}

// ---- delayed completions --------------------------------------------------------------------------------------

TEST_F(IoFaultTest, AHeldCompletionIsDeliveredBeforeTheCarrierSleeps) {
    // Held for far more reap passes than an idle carrier makes: only the rule "never block while a
    // CQE is held" brings it back.
    const auto [err, took, left] = onFiber([] {
        ArmedFault f(inject::Point::kDelayCompletion, /*passes=*/1'000'000);
        const auto t0 = std::chrono::steady_clock::now();
        auto r = spindle::nop();
        return std::make_tuple(r.errorCode(), std::chrono::steady_clock::now() - t0,
                               inject::remaining(inject::Point::kDelayCompletion));
    });
    EXPECT_EQ(err, 0);
    EXPECT_LT(took, 10s);
    EXPECT_EQ(left, 0u) << "the nop's completion was not the one held";
}

TEST_F(IoFaultTest, DelayedCompletionsOfManyFibersAreAllAnswered) {
    const int fd = makeFile("delayed");
    constexpr int kFibers = 100;
    const int kCalls = kSanitized ? 10 : 30;
    constexpr uint32_t kHeld = 1000;
    std::atomic<uint64_t> answered{0};
    std::atomic<uint64_t> wrong{0};
    {
        ArmedFault f(inject::Point::kDelayCompletion, /*passes=*/3, kHeld);
        std::vector<FiberHandle<void>> hs;
        for (int i = 0; i < kFibers; ++i) {
            hs.push_back(anywhere([&, i] {
                char block[512];
                std::memset(block, 'a' + i % 26, sizeof(block));
                for (int c = 0; c < kCalls; ++c) {
                    const uint64_t off = (static_cast<uint64_t>(i) * kCalls + c) * sizeof(block);
                    auto w = c % 3 == 0 ? spindle::write(fd, block, sizeof(block), off, std::chrono::seconds(30))
                                        : spindle::write(fd, block, sizeof(block), off);
                    if (!w || *w != sizeof(block)) { wrong.fetch_add(1); }
                    auto n = spindle::nop();
                    if (!n) { wrong.fetch_add(1); }
                    answered.fetch_add(2);
                }
            }));
        }
        for (auto& h : hs) { h.join(); }
        EXPECT_EQ(inject::remaining(inject::Point::kDelayCompletion), 0u);
    }
    EXPECT_EQ(answered.load(), static_cast<uint64_t>(kFibers) * kCalls * 2);
    EXPECT_EQ(wrong.load(), 0u);
    // Every write landed where it was aimed.
    for (int i = 0; i < kFibers; ++i) {
        char block[512];
        ASSERT_EQ(::pread(fd, block, sizeof(block), static_cast<off_t>(i) * kCalls * 512), 512);
        EXPECT_EQ(block[0], 'a' + i % 26);
        EXPECT_EQ(block[511], 'a' + i % 26);
    }
    ::close(fd);
}

TEST_F(IoFaultTest, AllClassesAtOnceLoseNothing) {
    // Failing, delaying and reporting-full together over many fibers: every call answers, failures are
    // counted exactly, and shutdown (TearDown, then ~Runtime) finds nothing in flight.
    constexpr int kFibers = 60;
    const int kCalls = kSanitized ? 10 : 40;
    constexpr uint32_t kFailures = 150;
    std::atomic<uint64_t> failed{0};
    std::atomic<uint64_t> succeeded{0};
    std::atomic<uint64_t> other{0};
    {
        ArmedFault fail(inject::Point::kSubmitFail, ECONNRESET, kFailures, 5);
        ArmedFault delay(inject::Point::kDelayCompletion, 2, 500);
        ArmedFault full(inject::Point::kSqFull, EBUSY, 100);
        std::vector<FiberHandle<void>> hs;
        for (int i = 0; i < kFibers; ++i) {
            hs.push_back(anywhere([&, i] {
                for (int c = 0; c < kCalls; ++c) {
                    auto r = (i + c) % 4 == 0 ? spindle::nop(std::chrono::seconds(30)) : spindle::nop();
                    if (r) {
                        succeeded.fetch_add(1);
                    } else {
                        (r.errorCode() == ECONNRESET ? failed : other).fetch_add(1);
                    }
                }
            }));
        }
        for (auto& h : hs) { h.join(); }
        EXPECT_EQ(inject::remaining(inject::Point::kSubmitFail), 0u);
    }
    EXPECT_EQ(failed.load(), kFailures);
    EXPECT_EQ(other.load(), 0u);
    EXPECT_EQ(failed.load() + succeeded.load(), static_cast<uint64_t>(kFibers) * kCalls);
}

}  // namespace
}  // namespace spindle
