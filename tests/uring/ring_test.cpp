// SPDX-License-Identifier: Apache-2.0
// uring::Ring on its own, without a runtime: set-up and what it reports, NOPs out and back with
// their user_data, the SQ-full path, a reserved chain, a timed wait, registered buffers and files
// with their error paths, and the two fault points that act on the ring itself (kRingSetup,
// kEnterFail). Each test owns its ring, made on the test's thread, its only submitter.

#include "uring/ring.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <set>
#include <vector>

#include "tests/core/with_runtime.h"
#include "uring/inject.h"

namespace spindle::uring {
namespace {

void ignoreCqe(void*, const io_uring_cqe*) {}

// A ring of `entries` with the defaults otherwise; skips the test where io_uring cannot be used.
class RingTest : public testing::Test {
protected:
    void SetUp() override { SPINDLE_REQUIRE_URING("uring::Ring"); }

    void open(unsigned entries) {
        RingOptions o;
        o.entries = entries;
        auto r = ring_.init(o, &ignoreCqe, nullptr);
        ASSERT_TRUE(r) << r.error().message();
    }

    // Reaps until `n` CQEs came (each wait blocks until one is ready); returns their user_data.
    std::vector<uint64_t> reapAll(size_t n) {
        std::vector<uint64_t> got;
        for (int rounds = 0; got.size() < n && rounds < 1000; ++rounds) {
            const int w = ring_.submitAndWait(nullptr);
            EXPECT_TRUE(w == 0 || w == -EINTR) << w;
            ring_.reap([&](const io_uring_cqe* cqe) { got.push_back(cqe->user_data); });
        }
        return got;
    }

    void nop(uint64_t userData) {
        io_uring_sqe* sqe = ring_.acquireSqe();
        io_uring_prep_nop(sqe);
        io_uring_sqe_set_data64(sqe, userData);
    }

    Ring ring_;
};

TEST_F(RingTest, SetUpReportsItsSizesAndCloses) {
    open(8);
    EXPECT_TRUE(ring_.initialized());
    EXPECT_GT(ring_.fd(), 0);
    EXPECT_EQ(ring_.features().sqEntries, 8u);
    EXPECT_GE(ring_.features().cqEntries, 16u);
    EXPECT_FALSE(ring_.features().describe().empty());
    EXPECT_EQ(ring_.pending(), 0u);
    EXPECT_EQ(ring_.cqReady(), 0u);
    ring_.close();
    EXPECT_FALSE(ring_.initialized());
    ring_.close();  // twice is harmless
}

TEST_F(RingTest, NopsComeBackWithTheirUserData) {
    open(8);
    for (uint64_t i = 1; i <= 5; ++i) { nop(i * 8); }
    EXPECT_EQ(ring_.pending(), 5u);
    const std::vector<uint64_t> got = reapAll(5);
    EXPECT_EQ(std::set<uint64_t>(got.begin(), got.end()), (std::set<uint64_t>{8, 16, 24, 32, 40}));
    EXPECT_EQ(ring_.pending(), 0u);
    EXPECT_GE(ring_.stats().sqesSubmitted.load(), 5u);
    EXPECT_EQ(ring_.stats().cqesReaped.load(), 5u);
    EXPECT_GE(ring_.stats().enters.load(), 1u);
}

TEST_F(RingTest, AFullSubmissionQueueIsSubmittedAndTheCallGetsItsSqe) {
    open(4);
    for (uint64_t i = 1; i <= 10; ++i) { nop(i * 8); }  // 10 SQEs through a 4-entry SQ
    EXPECT_GE(ring_.stats().sqFull.load(), 2u);
    EXPECT_EQ(reapAll(10).size(), 10u);
}

TEST_F(RingTest, AReservedChainLeavesInOneSubmission) {
    open(4);
    nop(8);
    nop(16);
    nop(24);
    ring_.reserveSqes(2);  // three queued in four places: they go first
    EXPECT_EQ(ring_.pending(), 0u);
    const uint64_t fullBefore = ring_.stats().sqFull.load();
    io_uring_sqe* a = ring_.acquireSqe();
    io_uring_prep_nop(a);
    a->flags |= IOSQE_IO_LINK;
    io_uring_sqe_set_data64(a, 32);
    nop(40);
    EXPECT_EQ(ring_.pending(), 2u);  // both members still queued together
    EXPECT_EQ(ring_.stats().sqFull.load(), fullBefore);
    EXPECT_EQ(reapAll(5).size(), 5u);
}

TEST_F(RingTest, AWaitWithNothingInFlightTimesOut) {
    open(4);
    __kernel_timespec ts{};
    ts.tv_nsec = 10'000'000;
    EXPECT_EQ(ring_.submitAndWait(&ts), -ETIME);
}

TEST_F(RingTest, BuffersRegisterOnceAndUnregisterOnce) {
    open(4);
    std::vector<char> memory(4096);
    iovec iov{memory.data(), memory.size()};
    ASSERT_TRUE(ring_.registerBuffers(&iov, 1));
    EXPECT_EQ(ring_.registerBuffers(&iov, 1).errorCode(), EBUSY);
    EXPECT_TRUE(ring_.unregisterBuffers());
    EXPECT_EQ(ring_.unregisterBuffers().errorCode(), ENXIO);
}

TEST_F(RingTest, AFileTableTakesDescriptorsInItsSlotsOnly) {
    open(4);
    EXPECT_EQ(ring_.updateFile(0, 0).errorCode(), ENXIO);  // no table yet
    ASSERT_TRUE(ring_.registerFilesSparse(4));
    EXPECT_EQ(ring_.registerFilesSparse(4).errorCode(), EBUSY);
    int p[2];
    ASSERT_EQ(::pipe(p), 0);
    EXPECT_TRUE(ring_.updateFile(1, p[0]));
    EXPECT_EQ(ring_.updateFile(9, p[0]).errorCode(), EINVAL);  // outside the table
    EXPECT_EQ(ring_.updateFile(2, 1'000'000).errorCode(), EBADF);
    EXPECT_TRUE(ring_.updateFile(1, -1));  // emptied
    ::close(p[0]);
    ::close(p[1]);
    EXPECT_TRUE(ring_.unregisterFiles());
    EXPECT_EQ(ring_.unregisterFiles().errorCode(), ENXIO);
}

TEST_F(RingTest, AnInjectedSetUpFailureIsTheErrnoAndLeavesNoRing) {
    inject::ArmedFault f(inject::Point::kRingSetup, ENOMEM);
    RingOptions o;
    o.entries = 4;
    EXPECT_EQ(ring_.init(o, &ignoreCqe, nullptr).errorCode(), ENOMEM);
    EXPECT_FALSE(ring_.initialized());
}

TEST_F(RingTest, AnInjectedEnterFailureSubmitsNothing) {
    open(4);
    nop(8);
    {
        inject::ArmedFault f(inject::Point::kEnterFail, ENOMEM);
        EXPECT_EQ(ring_.submitAndWait(nullptr), -ENOMEM);
        EXPECT_EQ(ring_.pending(), 1u);  // still queued: the next enter sends it
    }
    EXPECT_EQ(reapAll(1), std::vector<uint64_t>{8});
}

}  // namespace
}  // namespace spindle::uring
