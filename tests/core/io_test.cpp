// SPDX-License-Identifier: Apache-2.0
// Tests for the fiber-blocking I/O calls (core/io.h): results checked against the kernel's own view of the
// file, errors passed through, the file position, the off-fiber path, a ring much smaller than the I/O in
// flight, shutdown with sleepers and readers in flight, sleep order and bounds, and descriptor numbers
// closed with close(2) and reused.
//
// No verdict depends on timing: sleeps have only lower bounds that the runtime guarantees and upper bounds
// that a loaded machine cannot reach.

#include "core/io.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "core/fiber.h"
#include "core/fiber_event.h"
#include "core/fiber_future.h"
#include "core/runtime.h"
#include "tests/core/with_runtime.h"

namespace spindle {
namespace {

using namespace std::chrono_literals;

using testing_support::pattern;
using testing_support::Pipe;
using testing_support::yieldUntil;

/// A runtime with two carriers and a scratch directory that TearDown removes.
class IoTest : public testing_support::WithScratchDir {};

// ---- data against the kernel's view ------------------------------------------------------------------------

TEST_F(IoTest, WriteIsWhatPreadSees) {
    const int fd = makeFile("w");
    const auto data = pattern(100'000, 1);
    const auto [written, synced, datasynced] = onFiber([&] {
        auto w = spindle::write(fd, data.data(), data.size(), 0);
        auto s = spindle::fsync(fd);
        auto d = spindle::fdatasync(fd);
        return std::make_tuple(w.valueOr(0), s.errorCode(), d.errorCode());
    });
    EXPECT_EQ(written, data.size());
    EXPECT_EQ(synced, 0);
    EXPECT_EQ(datasynced, 0);

    std::vector<char> back(data.size());
    ASSERT_EQ(::pread(fd, back.data(), back.size(), 0), static_cast<ssize_t>(back.size()));
    EXPECT_TRUE(back == data);
    struct stat st {};
    ASSERT_EQ(::fstat(fd, &st), 0);
    EXPECT_EQ(st.st_size, static_cast<off_t>(data.size()));
    ::close(fd);
}

TEST_F(IoTest, ReadSeesWhatPwriteWrote) {
    const int fd = makeFile("r");
    const auto data = pattern(70'000, 2);
    ASSERT_EQ(::pwrite(fd, data.data(), data.size(), 0), static_cast<ssize_t>(data.size()));

    const auto [whole, part] = onFiber([&] {
        std::vector<char> all(data.size());
        auto r1 = spindle::read(fd, all.data(), all.size(), 0);
        std::vector<char> mid(1000);
        auto r2 = spindle::read(fd, mid.data(), mid.size(), 4096);
        const bool okAll = r1 && *r1 == all.size() && all == data;
        const bool okMid = r2 && *r2 == mid.size() && std::memcmp(mid.data(), data.data() + 4096, mid.size()) == 0;
        return std::make_pair(okAll, okMid);
    });
    EXPECT_TRUE(whole);
    EXPECT_TRUE(part);
    ::close(fd);
}

TEST_F(IoTest, WritevAndReadvScatterAndGather) {
    const int fd = makeFile("v");
    const auto a = pattern(100, 3);
    const auto b = pattern(5000, 4);
    const auto c = pattern(17, 5);
    // Sized once and filled with std::copy: GCC 12 at -O3 takes inserts into a 10-byte vector for
    // out-of-bounds copies (a false -Warray-bounds).
    std::vector<char> expected(10 + a.size() + b.size() + c.size(), '\0');  // the hole before offset 10 reads as zeros
    std::copy(c.begin(), c.end(), std::copy(b.begin(), b.end(), std::copy(a.begin(), a.end(), expected.begin() + 10)));

    const auto written = onFiber([&] {
        const iovec iov[3] = {{const_cast<char*>(a.data()), a.size()},
                              {const_cast<char*>(b.data()), b.size()},
                              {const_cast<char*>(c.data()), c.size()}};
        return spindle::writev(fd, iov, 3, 10).valueOr(0);
    });
    EXPECT_EQ(written, a.size() + b.size() + c.size());
    std::vector<char> back(expected.size());
    ASSERT_EQ(::pread(fd, back.data(), back.size(), 0), static_cast<ssize_t>(back.size()));
    EXPECT_TRUE(back == expected);

    // Gather into a different split of the same bytes.
    const auto [got, joined] = onFiber([&] {
        std::vector<char> x(7), y(3000), z(expected.size() - 7 - 3000);
        const iovec iov[3] = {{x.data(), x.size()}, {y.data(), y.size()}, {z.data(), z.size()}};
        const size_t n = spindle::readv(fd, iov, 3, 0).valueOr(0);
        std::vector<char> all(x);
        all.insert(all.end(), y.begin(), y.end());
        all.insert(all.end(), z.begin(), z.end());
        return std::make_pair(n, all);
    });
    EXPECT_EQ(got, expected.size());
    EXPECT_TRUE(joined == expected);

    EXPECT_EQ(onFiber([&] { return spindle::readv(fd, nullptr, -1, 0).errorCode(); }), EINVAL);
    ::close(fd);
}

TEST_F(IoTest, OpenatStatxAndClose) {
    const int dirfd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    ASSERT_GE(dirfd, 0) << std::strerror(errno);
    const auto data = pattern(12'345, 6);
    struct Out {
        int openErr = -1, statErr = -1, fstatErr = -1, closeErr = -1;
        int fd = -1;
        size_t written = 0;
        struct statx byPath {};
        struct statx byFd {};
    };
    const Out out = onFiber([&] {
        Out o;
        auto fd = spindle::openat(dirfd, "created", O_RDWR | O_CREAT | O_EXCL, 0640);
        o.openErr = fd.errorCode();
        if (!fd) { return o; }
        o.fd = *fd;
        o.written = spindle::write(*fd, data.data(), data.size(), 0).valueOr(0);
        o.statErr = spindle::statx(dirfd, "created", 0, STATX_BASIC_STATS, &o.byPath).errorCode();
        o.fstatErr = spindle::statx(*fd, "", AT_EMPTY_PATH, STATX_SIZE, &o.byFd).errorCode();
        o.closeErr = spindle::close(*fd).errorCode();
        return o;
    });
    ASSERT_EQ(out.openErr, 0) << std::strerror(out.openErr);
    EXPECT_EQ(out.written, data.size());
    EXPECT_EQ(out.statErr, 0);
    EXPECT_EQ(out.fstatErr, 0);
    EXPECT_EQ(out.closeErr, 0);

    struct stat st {};
    ASSERT_EQ(::stat(path("created").c_str(), &st), 0);
    EXPECT_EQ(out.byPath.stx_size, static_cast<uint64_t>(st.st_size));
    EXPECT_EQ(out.byPath.stx_size, data.size());
    EXPECT_EQ(out.byPath.stx_ino, st.st_ino);
    EXPECT_EQ(out.byPath.stx_mode, st.st_mode);
    EXPECT_TRUE(S_ISREG(out.byPath.stx_mode));
    EXPECT_EQ(out.byFd.stx_size, data.size());

    // close really closed it (nothing else in this test opens files meanwhile).
    errno = 0;
    EXPECT_EQ(::fcntl(out.fd, F_GETFD), -1);
    EXPECT_EQ(errno, EBADF);

    // O_EXCL on an existing file: the kernel's EEXIST.
    EXPECT_EQ(onFiber([&] { return spindle::openat(dirfd, "created", O_RDWR | O_CREAT | O_EXCL, 0640).errorCode(); }),
              EEXIST);
    ::close(dirfd);
}

// ---- errors ------------------------------------------------------------------------------------------------------

// A fiber whose I/O calls all complete at once (on epoll a nop never parks; on io_uring every call
// does) still lets the other fibers of its carrier run while it goes on: at the latest every few
// such calls, not only when it ends.
TEST_F(IoTest, AFiberWhoseCallsCompleteAtOnceDoesNotStarveItsCarrier) {
    constexpr int kCalls = 800;
    std::atomic<int> ticks{0};
    std::atomic<bool> done{false};
    int ticksWhileRunning = -1;
    auto ticker = on(0, [&] {
        while (!done.load(std::memory_order_relaxed)) {
            ticks.fetch_add(1, std::memory_order_relaxed);
            this_fiber::yield();
        }
    });
    auto busy = on(0, [&] {
        this_fiber::yield();  // the ticker is under way
        const int before = ticks.load();
        for (int i = 0; i < kCalls; ++i) { ASSERT_TRUE(nop()); }
        ticksWhileRunning = ticks.load() - before;
        done.store(true);
    });
    busy.join();
    ticker.join();
    EXPECT_GE(ticksWhileRunning, kCalls / 16) << "the other fiber ran " << ticksWhileRunning << " times during "
                                              << kCalls << " calls";
}

TEST_F(IoTest, ErrorsComeBackAsErrno) {
    char buf[16] = {};
    const std::string missing = path("does-not-exist");
    const auto errs = onFiber([&] {
        std::array<int, 8> e{};
        e[0] = spindle::read(-1, buf, sizeof(buf), 0).errorCode();
        e[1] = spindle::write(-1, buf, sizeof(buf), 0).errorCode();
        e[2] = spindle::read(999'999, buf, sizeof(buf)).errorCode();
        e[3] = spindle::write(999'999, buf, sizeof(buf)).errorCode();
        e[4] = spindle::open(missing.c_str(), O_RDONLY).errorCode();
        e[5] = spindle::fsync(-1).errorCode();
        struct statx stx {};
        e[6] = spindle::statx(AT_FDCWD, missing.c_str(), 0, STATX_SIZE, &stx).errorCode();
        e[7] = spindle::open(nullptr, O_RDONLY).errorCode();
        return e;
    });
    EXPECT_EQ(errs[0], EBADF) << "read on a bad fd";
    EXPECT_EQ(errs[1], EBADF) << "write on a bad fd";
    EXPECT_EQ(errs[2], EBADF) << "read on an fd that is not open";
    EXPECT_EQ(errs[3], EBADF) << "write on an fd that is not open";
    EXPECT_EQ(errs[4], ENOENT) << "openat of a missing path";
    EXPECT_EQ(errs[5], EBADF) << "fsync on a bad fd";
    EXPECT_EQ(errs[6], ENOENT) << "statx of a missing path";
    EXPECT_EQ(errs[7], EFAULT) << "a null path";
}

TEST_F(IoTest, ShortFileGivesShortCountsThenEndOfFile) {
    const int fd = makeFile("short");
    const auto data = pattern(100, 7);
    ASSERT_EQ(::pwrite(fd, data.data(), data.size(), 0), 100);
    const auto got = onFiber([&] {
        std::vector<char> buf(4096);
        std::array<int64_t, 4> n{};
        auto r0 = spindle::read(fd, buf.data(), buf.size(), 0);
        n[0] = r0 ? static_cast<int64_t>(*r0) : -r0.errorCode();
        const bool same = std::memcmp(buf.data(), data.data(), 100) == 0;
        auto r1 = spindle::read(fd, buf.data(), buf.size(), 60);
        n[1] = r1 ? static_cast<int64_t>(*r1) : -r1.errorCode();
        auto r2 = spindle::read(fd, buf.data(), buf.size(), 100);
        n[2] = r2 ? static_cast<int64_t>(*r2) : -r2.errorCode();
        auto r3 = spindle::read(fd, buf.data(), buf.size(), 1'000'000);
        n[3] = r3 ? static_cast<int64_t>(*r3) : -r3.errorCode();
        return std::make_pair(n, same);
    });
    EXPECT_EQ(got.first[0], 100) << "a short file gives a short count";
    EXPECT_TRUE(got.second);
    EXPECT_EQ(got.first[1], 40);
    EXPECT_EQ(got.first[2], 0) << "reading at end of file gives 0";
    EXPECT_EQ(got.first[3], 0) << "reading past end of file gives 0";
    ::close(fd);
}

// ---- the file position ---------------------------------------------------------------------------------------------

TEST_F(IoTest, CurrentPositionReadsAndWritesAdvanceTheFileOffset) {
    const int fd = makeFile("pos");
    struct Out {
        size_t w1 = 0, w2 = 0, w3 = 0, r1 = 0, r2 = 0;
        off_t afterWrites = -1, afterPwrite = -1, afterReads = -1;
        std::string read1, read2;
    };
    const Out o = onFiber([&] {
        Out out;
        out.w1 = spindle::write(fd, "abc", 3).valueOr(0);
        out.w2 = spindle::write(fd, "defg", 4, kCurrentPosition).valueOr(0);
        out.afterWrites = ::lseek(fd, 0, SEEK_CUR);
        out.w3 = spindle::write(fd, "XY", 2, 100).valueOr(0);  // positional: the offset stays
        out.afterPwrite = ::lseek(fd, 0, SEEK_CUR);
        ::lseek(fd, 0, SEEK_SET);
        char b1[2];
        out.r1 = spindle::read(fd, b1, sizeof(b1)).valueOr(0);
        out.read1.assign(b1, out.r1);
        char b2[5];
        out.r2 = spindle::read(fd, b2, sizeof(b2)).valueOr(0);
        out.read2.assign(b2, out.r2);
        out.afterReads = ::lseek(fd, 0, SEEK_CUR);
        return out;
    });
    EXPECT_EQ(o.w1, 3u);
    EXPECT_EQ(o.w2, 4u);
    EXPECT_EQ(o.afterWrites, 7);
    EXPECT_EQ(o.w3, 2u);
    EXPECT_EQ(o.afterPwrite, 7) << "an explicit offset must not move the file position";
    EXPECT_EQ(o.read1, "ab");
    EXPECT_EQ(o.read2, "cdefg");
    EXPECT_EQ(o.afterReads, 7);
    char all[7];
    ASSERT_EQ(::pread(fd, all, 7, 0), 7);
    EXPECT_EQ(std::string(all, 7), "abcdefg");
    ::close(fd);
}

// ---- off-fiber ---------------------------------------------------------------------------------------------------

void offFiberRoundTrip(const std::string& file, bool* ok) {
    *ok = false;
    EXPECT_FALSE(this_fiber::inFiber());
    EXPECT_TRUE(spindle::nop());
    auto fd = spindle::open(file.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
    ASSERT_TRUE(fd) << fd.error().message();
    const auto data = pattern(9000, 8);
    auto w = spindle::write(*fd, data.data(), data.size(), 0);
    ASSERT_TRUE(w);
    EXPECT_EQ(*w, data.size());
    EXPECT_TRUE(spindle::fsync(*fd));
    std::vector<char> back(data.size());
    ASSERT_EQ(::pread(*fd, back.data(), back.size(), 0), static_cast<ssize_t>(back.size()));
    EXPECT_TRUE(back == data);
    std::vector<char> viaRing(data.size());
    auto r = spindle::read(*fd, viaRing.data(), viaRing.size(), 0);
    ASSERT_TRUE(r);
    EXPECT_EQ(*r, data.size());
    EXPECT_TRUE(viaRing == data);
    struct statx stx {};
    EXPECT_TRUE(spindle::statx(AT_FDCWD, file.c_str(), 0, STATX_SIZE, &stx));
    EXPECT_EQ(stx.stx_size, data.size());
    EXPECT_TRUE(spindle::close(*fd));
    char buf[4];
    EXPECT_EQ(spindle::read(-1, buf, sizeof(buf)).errorCode(), EBADF);
    EXPECT_EQ(spindle::open((file + ".missing").c_str(), O_RDONLY).errorCode(), ENOENT);
    const auto start = std::chrono::steady_clock::now();
    EXPECT_TRUE(spindle::sleep(2ms));
    EXPECT_GE(std::chrono::steady_clock::now() - start, 2ms);
    *ok = true;
}

TEST_F(IoTest, CallsFromAPlainThreadWork) {
    bool ok = false;
    offFiberRoundTrip(path("thread-a"), &ok);  // the test thread, with a runtime up
    EXPECT_TRUE(ok);
    bool ok2 = false;
    std::thread t([&] { offFiberRoundTrip(path("thread-b"), &ok2); });
    t.join();
    EXPECT_TRUE(ok2);
}

TEST(IoOffFiber, WorksWithoutAnyRuntime) {
    const testing_support::ScratchDir scratch;
    ASSERT_TRUE(scratch.ok());
    bool ok = false;
    std::thread t([&] { offFiberRoundTrip(scratch.path("f"), &ok); });
    t.join();
    EXPECT_TRUE(ok);
}

// ---- a ring far smaller than the I/O in flight ---------------------------------------------------------------

TEST(IoSmallRing, TenTimesTheRingInFlightAllComplete) {
    SPINDLE_REQUIRE_URING("the SQ-full path of a small ring");
    constexpr unsigned kRing = 8;
    constexpr int kReaders = 10 * kRing;
    RuntimeOptions o;
    o.carriers = 1;
    o.ringEntries = kRing;
    auto rt = Runtime::start(o);
    ASSERT_TRUE(rt) << rt.error().message();

    std::array<std::array<int, 2>, kReaders> pipes{};
    for (auto& p : pipes) { ASSERT_EQ(::pipe2(p.data(), O_CLOEXEC), 0) << std::strerror(errno); }
    auto message = [](int i) { return "pipe-" + std::to_string(i) + "."; };

    std::atomic<int> blocked{0};
    std::vector<std::string> got(kReaders);
    std::vector<int> errs(kReaders, -1);
    int writeErrors = 0;

    // A parent on the only carrier spawns every reader, then a writer; they all run there, so the writer
    // sees `blocked == kReaders` only once every reader has parked in read() with its SQE taken.
    auto parent = rt->spawn([&] {
        std::vector<FiberHandle<void>> hs;
        for (int i = 0; i < kReaders; ++i) {
            auto h = spindle::spawn([&, i] {
                char buf[32] = {};
                blocked.fetch_add(1, std::memory_order_relaxed);
                auto r = spindle::read(pipes[static_cast<size_t>(i)][0], buf, sizeof(buf));
                errs[static_cast<size_t>(i)] = r.errorCode();
                if (r) { got[static_cast<size_t>(i)].assign(buf, *r); }
            });
            if (h) { hs.push_back(std::move(*h)); }
        }
        auto writer = spindle::spawn([&] {
            while (blocked.load(std::memory_order_relaxed) < kReaders) { this_fiber::yield(); }
            for (int i = 0; i < kReaders; ++i) {
                const std::string m = message(i);
                auto w = spindle::write(pipes[static_cast<size_t>(i)][1], m.data(), m.size());
                if (!w || *w != m.size()) { ++writeErrors; }
            }
        });
        for (auto& h : hs) { h.join(); }
        if (writer) { writer->join(); }
        return hs.size();
    });
    ASSERT_TRUE(parent) << parent.error().message();
    EXPECT_EQ(parent->join(), static_cast<size_t>(kReaders));
    EXPECT_EQ(writeErrors, 0);
    for (int i = 0; i < kReaders; ++i) {
        EXPECT_EQ(errs[static_cast<size_t>(i)], 0) << "reader " << i;
        EXPECT_EQ(got[static_cast<size_t>(i)], message(i)) << "reader " << i;
    }
    // The test is about a full SQ: make sure it was.
    EXPECT_GT(rt->stats()[0].sqFull, 0u);
    for (auto& p : pipes) {
        ::close(p[0]);
        ::close(p[1]);
    }
}

// ---- shutdown ---------------------------------------------------------------------------------------------------

TEST(IoShutdown, CancelsSleepersAndReadersInFlight) {
    constexpr int kSleepers = 6;
    constexpr int kReaders = 6;
    RuntimeOptions o;
    o.carriers = 2;
    auto rt = Runtime::start(o);
    ASSERT_TRUE(rt) << rt.error().message();

    std::array<std::array<int, 2>, kReaders> pipes{};
    for (auto& p : pipes) { ASSERT_EQ(::pipe2(p.data(), O_CLOEXEC), 0) << std::strerror(errno); }

    std::atomic<int> started{0};
    std::atomic<int> sleepCanceled{0}, readCanceled{0}, otherOutcome{0};
    for (int i = 0; i < kSleepers; ++i) {
        auto h = rt->spawn([&] {
            started.fetch_add(1);
            auto r = spindle::sleep(1h);
            (r.errorCode() == ECANCELED ? sleepCanceled : otherOutcome).fetch_add(1);
        }, SpawnOptions{.carrier = i % 2});
        ASSERT_TRUE(h);
        h->detach();
    }
    for (int i = 0; i < kReaders; ++i) {
        auto h = rt->spawn([&, i] {
            started.fetch_add(1);
            char buf[8];
            auto r = spindle::read(pipes[static_cast<size_t>(i)][0], buf, sizeof(buf));
            (r.errorCode() == ECANCELED ? readCanceled : otherOutcome).fetch_add(1);
        }, SpawnOptions{.carrier = i % 2});
        ASSERT_TRUE(h);
        h->detach();
    }
    // Let them all reach their blocking call (a call made after shutdown began fails with ECANCELED too, so
    // the verdict does not depend on how far they got).
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    while (started.load() < kSleepers + kReaders && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(1ms);
    }
    ASSERT_EQ(started.load(), kSleepers + kReaders);
    std::this_thread::sleep_for(20ms);

    rt->shutdown();
    rt->join();
    EXPECT_EQ(sleepCanceled.load(), kSleepers);
    EXPECT_EQ(readCanceled.load(), kReaders);
    EXPECT_EQ(otherOutcome.load(), 0);
    EXPECT_EQ(rt->liveFibers(), 0u);
    for (auto& p : pipes) {
        ::close(p[0]);
        ::close(p[1]);
    }
}

TEST(IoShutdown, CallsMadeAfterShutdownBeganAreCanceled) {
    RuntimeOptions o;
    o.carriers = 2;
    auto rt = Runtime::start(o);
    ASSERT_TRUE(rt) << rt.error().message();
    std::array<int, 2> p{};
    ASSERT_EQ(::pipe2(p.data(), O_CLOEXEC), 0);
    ASSERT_EQ(::write(p[1], "x", 1), 1);  // a read would not even block

    FiberFuture go;
    struct Out {
        int sleepErr = -1, sleepUntilErr = -1, nopErr = -1, readErr = -1;
        int childValue = -1;
    };
    auto h = rt->spawn([&] {
        Out out;
        (void)go.wait();  // released once shutdown() has been called
        out.sleepErr = spindle::sleep(1ms).errorCode();
        out.sleepUntilErr = this_fiber::sleep_until(std::chrono::steady_clock::now() + 1h).errorCode();
        out.nopErr = spindle::nop().errorCode();
        char c;
        out.readErr = spindle::read(p[0], &c, 1).errorCode();
        // A fiber of the runtime may still spawn, and its child still runs.
        auto child = spindle::spawn([] { return 5; });
        out.childValue = child ? child->join() : -child.errorCode();
        return out;
    });
    ASSERT_TRUE(h) << h.error().message();
    rt->shutdown();
    go.set(0);
    const Out out = h->join();
    rt->join();
    EXPECT_EQ(out.sleepErr, ECANCELED);
    EXPECT_EQ(out.sleepUntilErr, ECANCELED);
    EXPECT_EQ(out.nopErr, ECANCELED);
    EXPECT_EQ(out.readErr, ECANCELED);
    EXPECT_EQ(out.childValue, 5);
    ::close(p[0]);
    ::close(p[1]);
}

// ---- sleep --------------------------------------------------------------------------------------------------------

/// Three fibers pinned to carrier 0 that sleep until base + 30, 10 and 20 ms and append their delay to
/// `order` as they wake (a fiber that is woken by shutdown instead appends nothing).
std::vector<FiberHandle<void>> spawnSleepers(std::vector<int>& order, std::chrono::steady_clock::time_point base) {
    std::vector<FiberHandle<void>> hs;
    for (int ms : {30, 10, 20}) {
        auto h = spindle::spawn(
            [&order, base, ms] {
                if (this_fiber::sleep_until(base + std::chrono::milliseconds(ms))) { order.push_back(ms); }
            },
            SpawnOptions{.carrier = 0, .pinned = true});
        if (h) { hs.push_back(std::move(*h)); }
    }
    return hs;
}

TEST_F(IoTest, SleepersWakeInDeadlineOrder) {
    // Deadlines from one base, so the order is the deadlines' whatever the delays in starting the fibers.
    std::vector<int> order;  // carrier 0 only
    auto parent = runtime_->spawn(
        [&order] {
            const auto base = std::chrono::steady_clock::now();
            auto hs = spawnSleepers(order, base);
            for (auto& h : hs) { h.join(); }
        },
        SpawnOptions{.carrier = 0, .pinned = true});
    ASSERT_TRUE(parent);
    parent->join();
    EXPECT_EQ(order, (std::vector<int>{10, 20, 30}));
}

TEST_F(IoTest, SleepersThatExpireTogetherWakeInDeadlineOrder) {
    // The parent keeps the carrier busy past every deadline, so all three timers expire in one pass.
    std::vector<int> order;  // carrier 0 only
    auto parent = runtime_->spawn(
        [&order] {
            const auto base = std::chrono::steady_clock::now();
            auto hs = spawnSleepers(order, base);
            this_fiber::yield();  // the three run and arm their timers
            while (std::chrono::steady_clock::now() < base + 40ms) {}  // no yield: hold the carrier
            for (auto& h : hs) { h.join(); }
        },
        SpawnOptions{.carrier = 0, .pinned = true});
    ASSERT_TRUE(parent);
    parent->join();
    EXPECT_EQ(order, (std::vector<int>{10, 20, 30}));
}

TEST_F(IoTest, SleepNeverReturnsEarly) {
    for (auto d : {0ms, 1ms, 5ms, 20ms}) {
        const auto [ok, elapsed] = onFiber([d] {
            const auto start = std::chrono::steady_clock::now();
            auto r = spindle::sleep(d);
            return std::make_pair(r.ok(), std::chrono::steady_clock::now() - start);
        });
        EXPECT_TRUE(ok);
        EXPECT_GE(elapsed, d) << "sleep(" << d.count() << "ms) returned early";
        EXPECT_LT(elapsed, d + 2s) << "sleep(" << d.count() << "ms) took far too long";
    }
    // A negative duration returns at once.
    EXPECT_TRUE(onFiber([] { return spindle::sleep(-5ms).ok(); }));
    // Several concurrent sleepers on both carriers.
    std::vector<FiberHandle<bool>> hs;
    for (int i = 0; i < 20; ++i) {
        auto h = runtime_->spawn([i] {
            const auto d = std::chrono::milliseconds(1 + i % 7);
            const auto start = std::chrono::steady_clock::now();
            const bool ok = spindle::sleep(d).ok();
            return ok && std::chrono::steady_clock::now() - start >= d;
        });
        ASSERT_TRUE(h);
        hs.push_back(std::move(*h));
    }
    for (auto& h : hs) { EXPECT_TRUE(h.join()); }
}

TEST_F(IoTest, NopWorks) {
    EXPECT_TRUE(onFiber([] {
        for (int i = 0; i < 1000; ++i) {
            if (!spindle::nop()) { return false; }
        }
        return true;
    }));
    EXPECT_TRUE(spindle::nop()) << "off-fiber";
}

// ---- a number closed with close(2) and reused -----------------------------------------------------------------
//
// A readiness driver keys what it knows by descriptor number; close(2) is invisible to it. A wait on a new file
// that got an old number must still be woken by the new file's readiness (on epoll, the old file's registration
// left the set when the file closed, and a wait that trusted it slept forever).

/// Reads one byte from `fd` with a deadline far beyond the test's writes: 1 for 'n', -errno otherwise.
int readOneN(int fd) {
    char c = 0;
    auto r = spindle::read(fd, &c, 1, kCurrentPosition, 20s);
    if (!r) { return -r.errorCode(); }
    return *r == 1 && c == 'n' ? 1 : -1000;
}

/// Closes `fd` with close(2) and puts the read end of a fresh pipe at the same number; returns its write end.
int reusePipeNumber(int fd) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) { return -1; }
    ::close(fd);
    if (::dup3(p[0], fd, O_CLOEXEC) != fd) { return -1; }
    ::close(p[0]);
    return p[1];
}

TEST_F(IoTest, ANumberReusedByAnotherFiberBeforeTheCarrierPollsAgainIsWaitedOnAfresh) {
    Pipe a;
    const int number = a.r;
    std::atomic<bool> reading{false};
    std::atomic<int> newWrite{-1};
    FiberEvent go;
    // The second fiber runs on the same carrier right after the first, in the same run: the first one's wait
    // was ended by an event on this number, and the carrier has not looked for events since.
    auto second = on(0, [&] {
        go.wait();
        return readOneN(number);
    });
    auto first = on(0, [&] {
        char c = 0;
        reading.store(true);
        auto r = spindle::read(number, &c, 1);  // waits: the byte comes from the test thread
        newWrite.store(reusePipeNumber(number));
        go.set();
        return r && *r == 1 && c == 'x';
    });
    yieldUntil([&] { return reading.load(); });
    std::this_thread::sleep_for(5ms);  // the read is waiting (if not, it takes the byte at once: no harm)
    ASSERT_EQ(::write(a.w, "x", 1), 1);
    EXPECT_TRUE(first.join());
    ASSERT_GE(newWrite.load(), 0) << std::strerror(errno);
    std::this_thread::sleep_for(5ms);  // the second fiber is waiting on the new file
    ASSERT_EQ(::write(newWrite.load(), "n", 1), 1);
    EXPECT_EQ(second.join(), 1) << "the wait on the new file was not woken by its byte";
    ::close(newWrite.load());
}

TEST_F(IoTest, ANumberReusedByTheSameFiberAfterASleepIsWaitedOnAfresh) {
    Pipe a;
    const int number = a.r;
    std::atomic<bool> reading{false};
    std::atomic<int> newWrite{-1};
    std::atomic<bool> waitingAgain{false};
    auto f = on(0, [&] {
        char c = 0;
        reading.store(true);
        auto r = spindle::read(number, &c, 1);
        if (!r || *r != 1 || c != 'x') { return -2000; }
        (void)this_fiber::sleep_for(1ms);  // the carrier looks for events (and parks) meanwhile
        newWrite.store(reusePipeNumber(number));
        waitingAgain.store(true);
        return readOneN(number);
    });
    yieldUntil([&] { return reading.load(); });
    std::this_thread::sleep_for(5ms);
    ASSERT_EQ(::write(a.w, "x", 1), 1);
    yieldUntil([&] { return waitingAgain.load(); });
    ASSERT_GE(newWrite.load(), 0) << std::strerror(errno);
    std::this_thread::sleep_for(5ms);
    ASSERT_EQ(::write(newWrite.load(), "n", 1), 1);
    EXPECT_EQ(f.join(), 1) << "the wait on the new file was not woken by its byte";
    ::close(newWrite.load());
}

}  // namespace
}  // namespace spindle
