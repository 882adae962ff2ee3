// SPDX-License-Identifier: Apache-2.0
// Tests for the file-system, poll and splice calls of core/io.h: each call's effect checked against the
// kernel's own view (::stat, ::lstat, ::access, ::pread), each call's main errors passed through, the null-path
// EFAULT, poll woken by a write that comes before or after the poller parked, and every call once from a
// plain thread (the off-fiber ring).
//
// No verdict depends on timing: where two orders are possible, both must give the same result, and the
// test forces each order where it can.

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <liburing.h>  // SPLICE_F_FD_IN_FIXED
#include <linux/openat2.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/inject.h"
#include "core/fiber.h"
#include "core/io.h"
#include "tests/core/with_runtime.h"

namespace spindle {
namespace {

using testing_support::pattern;
using testing_support::yieldUntil;

using testing_support::Pipe;
using namespace std::chrono_literals;

/// errno of a ::stat on `p`, 0 when it exists.
int statErr(const std::string& p, struct stat* st = nullptr) {
    struct stat tmp {};
    return ::stat(p.c_str(), st != nullptr ? st : &tmp) == 0 ? 0 : errno;
}

mode_t currentUmask() {
    const mode_t m = ::umask(0);
    ::umask(m);
    return m;
}

/// A runtime with two carriers, a scratch directory and a descriptor for it.
class IoOpsTest : public testing_support::WithScratchDir {
protected:
    void SetUp() override {
        WithScratchDir::SetUp();
        if (HasFatalFailure()) { return; }
        dirfd_ = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        ASSERT_GE(dirfd_, 0) << std::strerror(errno);
    }
    void TearDown() override {
        if (dirfd_ >= 0) { ::close(dirfd_); }
        WithScratchDir::TearDown();
    }

    /// Creates an empty file `name` in the scratch directory.
    void touch(const char* name) {
        const int fd = makeFile(name);
        if (fd >= 0) { ::close(fd); }
    }

    int dirfd_ = -1;
};

// ---- fallocate ---------------------------------------------------------------------------------------------------

TEST_F(IoOpsTest, FallocateAllocatesAndPunchesAsStatSees) {
    const int fd = makeFile("alloc");
    constexpr uint64_t kMiB = 1 << 20;
    const auto [grow, keep] = onFiber([&] {
        const int g = spindle::fallocate(fd, 0, 0, kMiB).errorCode();
        const int k = spindle::fallocate(fd, FALLOC_FL_KEEP_SIZE, kMiB, kMiB).errorCode();
        return std::make_pair(g, k);
    });
    if (grow == EOPNOTSUPP) { GTEST_SKIP() << "fallocate: not supported by the scratch file system"; }
    ASSERT_EQ(grow, 0) << std::strerror(grow);
    ASSERT_EQ(keep, 0) << std::strerror(keep);
    struct stat st {};
    ASSERT_EQ(::fstat(fd, &st), 0);
    EXPECT_EQ(st.st_size, static_cast<off_t>(kMiB)) << "mode 0 extends the file";
    EXPECT_GE(static_cast<uint64_t>(st.st_blocks) * 512, 2 * kMiB) << "KEEP_SIZE still allocates past the end";

    // Punch a hole into written data: those bytes read back as zeros, the rest is untouched.
    auto data = pattern(64 * 1024, 11);
    ASSERT_EQ(::pwrite(fd, data.data(), data.size(), 0), static_cast<ssize_t>(data.size()));
    const int punched = onFiber(
        [&] { return spindle::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 4096, 8192).errorCode(); });
    if (punched == EOPNOTSUPP) {
        ::close(fd);
        GTEST_SKIP() << "FALLOC_FL_PUNCH_HOLE: not supported by the scratch file system";
    }
    ASSERT_EQ(punched, 0) << std::strerror(punched);
    std::memset(data.data() + 4096, 0, 8192);
    std::vector<char> back(data.size());
    ASSERT_EQ(::pread(fd, back.data(), back.size(), 0), static_cast<ssize_t>(back.size()));
    EXPECT_TRUE(back == data);
    ASSERT_EQ(::fstat(fd, &st), 0);
    EXPECT_EQ(st.st_size, static_cast<off_t>(kMiB)) << "a punched hole keeps the size";
    ::close(fd);
}

TEST_F(IoOpsTest, FtruncateSetsTheSizeStatSees) {
    const int fd = makeFile("t");
    const auto grown = onFiber([&] { return spindle::ftruncate(fd, 12345).ok(); });
    ASSERT_TRUE(grown);
    struct stat st {};
    ASSERT_EQ(::fstat(fd, &st), 0);
    EXPECT_EQ(st.st_size, 12345);
    ASSERT_TRUE(spindle::ftruncate(fd, 100).ok()) << "off-fiber";
    ASSERT_EQ(::fstat(fd, &st), 0);
    EXPECT_EQ(st.st_size, 100);
    const int ro = ::open(path("t").c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(ro, 0);
    Pipe p;
    ASSERT_GE(p.r, 0);
    const auto e = onFiber([&] {
        std::array<int, 4> r{};
        r[0] = spindle::ftruncate(-1, 0).errorCode();
        r[1] = spindle::ftruncate(fd, ~uint64_t{0}).errorCode();
        r[2] = spindle::ftruncate(ro, 0).errorCode();
        r[3] = spindle::ftruncate(p.w, 0).errorCode();
        return r;
    });
    EXPECT_EQ(e[0], EBADF) << "a bad fd";
    EXPECT_EQ(e[1], EINVAL) << "a length past INT64_MAX";
    EXPECT_TRUE(e[2] == EBADF || e[2] == EINVAL) << "a read-only fd: " << e[2];
    EXPECT_EQ(e[3], EINVAL) << "a pipe";
    ::close(ro);
    ::close(fd);
}

TEST_F(IoOpsTest, FallocateErrorsComeBackAsErrno) {
    const int rw = makeFile("f");
    const int ro = ::open(path("f").c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(ro, 0);
    Pipe p;
    ASSERT_GE(p.r, 0);
    const auto e = onFiber([&] {
        std::array<int, 5> r{};
        r[0] = spindle::fallocate(-1, 0, 0, 4096).errorCode();
        r[1] = spindle::fallocate(rw, 0, 0, 0).errorCode();
        r[2] = spindle::fallocate(rw, 0, 0, ~uint64_t{0}).errorCode();
        r[3] = spindle::fallocate(ro, 0, 0, 4096).errorCode();
        r[4] = spindle::fallocate(p.w, 0, 0, 4096).errorCode();
        return r;
    });
    EXPECT_EQ(e[0], EBADF) << "a bad fd";
    EXPECT_EQ(e[1], EINVAL) << "len 0";
    EXPECT_EQ(e[2], EINVAL) << "a length past INT64_MAX";
    EXPECT_EQ(e[3], EBADF) << "a read-only fd";
    EXPECT_EQ(e[4], ESPIPE) << "a pipe";
    ::close(ro);
    ::close(rw);
}

// ---- openat2 -------------------------------------------------------------------------------------------------

// RESOLVE_BENEATH refuses a path (or a link) that leaves the directory; RESOLVE_NO_SYMLINKS refuses any link.
TEST_F(IoOpsTest, Openat2ResolvesBeneathAndRefusesLinksAsAsked) {
    touch("file");
    ASSERT_EQ(::symlink("file", path("inside").c_str()), 0);
    ASSERT_EQ(::symlink("/etc/hostname", path("outside").c_str()), 0);
    const auto r = onFiber([&] {
        std::array<int, 7> e{};
        auto open = [&](const char* p, uint64_t resolve) {
            Result<int> fd = spindle::openat2(dirfd_, p, O_RDONLY, 0, resolve);
            if (!fd) { return fd.errorCode(); }
            ::close(*fd);
            return 0;
        };
        e[0] = open("file", RESOLVE_BENEATH);
        e[1] = open("inside", RESOLVE_BENEATH);
        e[2] = open("outside", RESOLVE_BENEATH);
        e[3] = open("../x", RESOLVE_BENEATH);
        e[4] = open("inside", RESOLVE_NO_SYMLINKS);
        e[5] = spindle::openat2(dirfd_, nullptr, O_RDONLY, 0, 0).errorCode();
        e[6] = open("file", ~uint64_t{0});
        return e;
    });
    if (r[0] == ENOSYS || r[0] == EINVAL) { GTEST_SKIP() << "openat2: " << std::strerror(r[0]); }
    EXPECT_EQ(r[0], 0) << std::strerror(r[0]);
    EXPECT_EQ(r[1], 0) << "a link that stays inside: " << std::strerror(r[1]);
    EXPECT_EQ(r[2], EXDEV) << "a link out of the directory";
    EXPECT_EQ(r[3], EXDEV) << "a .. out of the directory";
    EXPECT_EQ(r[4], ELOOP) << "any link under RESOLVE_NO_SYMLINKS";
    EXPECT_EQ(r[5], EFAULT) << "a null path";
    EXPECT_EQ(r[6], EINVAL) << "unknown resolve bits";
}

// ---- mkdirat -------------------------------------------------------------------------------------------------

TEST_F(IoOpsTest, MkdiratMakesADirectoryWithTheUmaskedMode) {
    const std::string abs = path("abs");
    const auto [rel, absolute] = onFiber([&] {
        return std::make_pair(spindle::mkdirat(dirfd_, "rel", 0750).errorCode(),
                              spindle::mkdirat(AT_FDCWD, abs.c_str(), 0700).errorCode());
    });
    ASSERT_EQ(rel, 0) << std::strerror(rel);
    ASSERT_EQ(absolute, 0) << std::strerror(absolute);
    struct stat st {};
    ASSERT_EQ(statErr(path("rel"), &st), 0);
    EXPECT_TRUE(S_ISDIR(st.st_mode));
    EXPECT_EQ(st.st_mode & 07777, 0750 & ~currentUmask());
    ASSERT_EQ(statErr(abs, &st), 0);
    EXPECT_TRUE(S_ISDIR(st.st_mode));
}

TEST_F(IoOpsTest, MkdiratErrorsComeBackAsErrno) {
    touch("file");
    ASSERT_EQ(::mkdir(path("dir").c_str(), 0700), 0);
    const auto e = onFiber([&] {
        std::array<int, 5> r{};
        r[0] = spindle::mkdirat(dirfd_, "dir", 0700).errorCode();
        r[1] = spindle::mkdirat(dirfd_, "missing/sub", 0700).errorCode();
        r[2] = spindle::mkdirat(dirfd_, "file/sub", 0700).errorCode();
        r[3] = spindle::mkdirat(dirfd_, nullptr, 0700).errorCode();
        r[4] = spindle::mkdirat(-1, "relative", 0700).errorCode();
        return r;
    });
    EXPECT_EQ(e[0], EEXIST);
    EXPECT_EQ(e[1], ENOENT) << "a missing parent";
    EXPECT_EQ(e[2], ENOTDIR) << "a parent that is a file";
    EXPECT_EQ(e[3], EFAULT) << "a null path";
    EXPECT_EQ(e[4], EBADF) << "a relative path against a bad dirfd";
    EXPECT_EQ(statErr(path("relative")), ENOENT);
}

// ---- unlinkat ------------------------------------------------------------------------------------------------

TEST_F(IoOpsTest, UnlinkatRemovesFilesAndEmptyDirectories) {
    touch("file");
    ASSERT_EQ(::mkdir(path("dir").c_str(), 0700), 0);
    ASSERT_EQ(::symlink("file", path("link").c_str()), 0);
    const std::string abs = path("file");
    const auto e = onFiber([&] {
        std::array<int, 3> r{};
        r[0] = spindle::unlinkat(dirfd_, "link", 0).errorCode();  // the link, not its target
        r[1] = spindle::unlinkat(AT_FDCWD, abs.c_str(), 0).errorCode();
        r[2] = spindle::unlinkat(dirfd_, "dir", AT_REMOVEDIR).errorCode();
        return r;
    });
    EXPECT_EQ(e[0], 0);
    EXPECT_EQ(e[1], 0);
    EXPECT_EQ(e[2], 0);
    struct stat st {};
    errno = 0;
    EXPECT_EQ(::lstat(path("link").c_str(), &st), -1);
    EXPECT_EQ(errno, ENOENT);
    errno = 0;
    EXPECT_EQ(::access(abs.c_str(), F_OK), -1);
    EXPECT_EQ(errno, ENOENT);
    EXPECT_EQ(statErr(path("dir")), ENOENT);
}

TEST_F(IoOpsTest, UnlinkatErrorsComeBackAsErrno) {
    touch("file");
    ASSERT_EQ(::mkdir(path("empty").c_str(), 0700), 0);
    ASSERT_EQ(::mkdir(path("full").c_str(), 0700), 0);
    touch("full/inside");
    const auto e = onFiber([&] {
        std::array<int, 6> r{};
        r[0] = spindle::unlinkat(dirfd_, "missing", 0).errorCode();
        r[1] = spindle::unlinkat(dirfd_, "empty", 0).errorCode();
        r[2] = spindle::unlinkat(dirfd_, "file", AT_REMOVEDIR).errorCode();
        r[3] = spindle::unlinkat(dirfd_, "full", AT_REMOVEDIR).errorCode();
        r[4] = spindle::unlinkat(dirfd_, nullptr, 0).errorCode();
        r[5] = spindle::unlinkat(-1, "file", 0).errorCode();
        return r;
    });
    EXPECT_EQ(e[0], ENOENT);
    EXPECT_EQ(e[1], EISDIR) << "a directory without AT_REMOVEDIR";
    EXPECT_EQ(e[2], ENOTDIR) << "AT_REMOVEDIR on a file";
    EXPECT_EQ(e[3], ENOTEMPTY);
    EXPECT_EQ(e[4], EFAULT) << "a null path";
    EXPECT_EQ(e[5], EBADF);
    // Nothing was removed by the failed calls.
    EXPECT_EQ(statErr(path("file")), 0);
    EXPECT_EQ(statErr(path("empty")), 0);
    EXPECT_EQ(statErr(path("full/inside")), 0);
}

// ---- renameat ------------------------------------------------------------------------------------------------

TEST_F(IoOpsTest, RenameatMovesExchangesAndHonoursNoReplace) {
    touch("a");
    touch("x");
    touch("y");
    ASSERT_EQ(::mkdir(path("sub").c_str(), 0700), 0);
    const int subfd = ::open(path("sub").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    ASSERT_GE(subfd, 0);
    struct stat a {}, x {}, y {};
    ASSERT_EQ(::lstat(path("a").c_str(), &a), 0);
    ASSERT_EQ(::lstat(path("x").c_str(), &x), 0);
    ASSERT_EQ(::lstat(path("y").c_str(), &y), 0);

    const auto e = onFiber([&] {
        std::array<int, 4> r{};
        r[0] = spindle::renameat(dirfd_, "a", subfd, "b").errorCode();  // across two dirfds
        r[1] = spindle::renameat(dirfd_, "x", dirfd_, "y", RENAME_NOREPLACE).errorCode();
        r[2] = spindle::renameat(dirfd_, "x", dirfd_, "y", RENAME_EXCHANGE).errorCode();
        r[3] = spindle::renameat(dirfd_, "y", dirfd_, "z", RENAME_NOREPLACE).errorCode();
        return r;
    });
    ::close(subfd);
    ASSERT_EQ(e[0], 0) << std::strerror(e[0]);
    EXPECT_EQ(e[1], EEXIST) << "RENAME_NOREPLACE onto an existing name";
    if (e[2] == EINVAL) { GTEST_SKIP() << "RENAME_EXCHANGE: not supported by the scratch file system"; }
    EXPECT_EQ(e[2], 0) << std::strerror(e[2]);
    EXPECT_EQ(e[3], 0) << std::strerror(e[3]);

    struct stat st {};
    EXPECT_EQ(::lstat(path("a").c_str(), &st), -1) << "the old name is gone";
    ASSERT_EQ(::lstat(path("sub/b").c_str(), &st), 0);
    EXPECT_EQ(st.st_ino, a.st_ino) << "the same file under the new name";
    ASSERT_EQ(::lstat(path("x").c_str(), &st), 0);
    EXPECT_EQ(st.st_ino, y.st_ino) << "RENAME_EXCHANGE swapped the names";
    EXPECT_EQ(::lstat(path("y").c_str(), &st), -1) << "y moved on to z";
    ASSERT_EQ(::lstat(path("z").c_str(), &st), 0);
    EXPECT_EQ(st.st_ino, x.st_ino);
}

TEST_F(IoOpsTest, RenameatErrorsComeBackAsErrno) {
    touch("file");
    ASSERT_EQ(::mkdir(path("dir").c_str(), 0700), 0);
    ASSERT_EQ(::mkdir(path("full").c_str(), 0700), 0);
    touch("full/inside");
    const auto e = onFiber([&] {
        std::array<int, 6> r{};
        r[0] = spindle::renameat(dirfd_, "missing", dirfd_, "other").errorCode();
        r[1] = spindle::renameat(dirfd_, "dir", dirfd_, "full").errorCode();
        r[2] = spindle::renameat(dirfd_, "dir", dirfd_, "file").errorCode();
        r[3] = spindle::renameat(dirfd_, nullptr, dirfd_, "other").errorCode();
        r[4] = spindle::renameat(dirfd_, "file", dirfd_, nullptr).errorCode();
        r[5] = spindle::renameat(-1, "file", dirfd_, "other").errorCode();
        return r;
    });
    EXPECT_EQ(e[0], ENOENT);
    EXPECT_EQ(e[1], ENOTEMPTY) << "a directory onto a non-empty directory";
    EXPECT_EQ(e[2], ENOTDIR) << "a directory onto a file";
    EXPECT_EQ(e[3], EFAULT) << "a null old path";
    EXPECT_EQ(e[4], EFAULT) << "a null new path";
    EXPECT_EQ(e[5], EBADF);
    EXPECT_EQ(statErr(path("file")), 0);
    EXPECT_EQ(statErr(path("dir")), 0);
    EXPECT_EQ(statErr(path("other")), ENOENT);
}

// ---- poll ----------------------------------------------------------------------------------------------------

TEST_F(IoOpsTest, PollReportsWritableReadableAndHangup) {
    Pipe p;
    ASSERT_GE(p.r, 0);
    const auto got = onFiber([&] {
        std::array<int, 3> r{};
        r[0] = spindle::poll(p.w, POLLOUT).valueOr(-1);  // an empty pipe is writable at once
        char c = 'x';
        (void)spindle::write(p.w, &c, 1);
        r[1] = spindle::poll(p.r, POLLIN).valueOr(-1);
        (void)spindle::read(p.r, &c, 1);
        p.closeWrite();
        r[2] = spindle::poll(p.r, POLLIN).valueOr(-1);  // drained, no writer left
        return r;
    });
    EXPECT_EQ(got[0], POLLOUT);
    EXPECT_EQ(got[1], POLLIN);
    EXPECT_EQ(got[2], POLLHUP);
}

TEST_F(IoOpsTest, PollErrorsComeBackAsErrno) {
    Pipe p;
    ASSERT_GE(p.r, 0);
    const auto e = onFiber([&] {
        std::array<int, 4> r{};
        r[0] = spindle::poll(-1, POLLIN).errorCode();
        r[1] = spindle::poll(999'999, POLLIN).errorCode();
        r[2] = spindle::poll(p.r, POLLIN | POLLNVAL).errorCode();
        r[3] = spindle::poll(p.r, static_cast<short>(0x8000 | POLLIN)).errorCode();  // a negative short
        return r;
    });
    EXPECT_EQ(e[0], EBADF);
    EXPECT_EQ(e[1], EBADF);
    EXPECT_EQ(e[2], EINVAL) << "POLLNVAL is an answer, not an event to wait for";
    EXPECT_EQ(e[3], EINVAL) << "a mask that would sign-extend into epoll flags";
}

// The writer runs only after the poller has parked and its poll is armed in the kernel: both fibers share
// carrier 0, the poller raises `armed` and parks without yielding in between, and the writer's own nop on
// the same ring completes only after the batch that carried the poll SQE was submitted.
TEST_F(IoOpsTest, PollWakesWhenAnotherFiberWritesAfterItParked) {
    Pipe p;
    ASSERT_GE(p.r, 0);
    std::atomic<bool> armed{false}, pollerDone{false};
    auto poller = on(0, [&] {
        armed.store(true);
        auto r = spindle::poll(p.r, POLLIN);
        pollerDone.store(true);
        return r.ok() ? static_cast<int>(*r) : -r.errorCode();
    });
    auto writer = on(0, [&] {
        yieldUntil([&] { return armed.load(); });
        EXPECT_TRUE(spindle::nop());
        const bool stillParked = !pollerDone.load();  // nothing was written: it cannot have returned
        char c = 'w';
        EXPECT_EQ(spindle::write(p.w, &c, 1).valueOr(0), 1u);
        return stillParked;
    });
    EXPECT_TRUE(writer.join());
    EXPECT_EQ(poller.join(), POLLIN);
}

// The write lands before the poll is made: the poll completes at once with the same verdict.
TEST_F(IoOpsTest, PollSeesDataWrittenBeforeItWasMade) {
    Pipe p;
    ASSERT_GE(p.r, 0);
    std::atomic<bool> written{false};
    auto writer = on(1, [&] {
        char c = 'w';
        EXPECT_EQ(spindle::write(p.w, &c, 1).valueOr(0), 1u);
        written.store(true);
    });
    auto poller = on(0, [&] {
        yieldUntil([&] { return written.load(); });
        return spindle::poll(p.r, POLLIN).valueOr(-1);
    });
    writer.join();
    EXPECT_EQ(poller.join(), POLLIN);
}

// Unordered: poller and writer on different carriers race; whichever comes first, POLLIN.
TEST_F(IoOpsTest, PollAndACrossCarrierWriterRaceToTheSameVerdict) {
    Pipe p;
    ASSERT_GE(p.r, 0);
    const int rounds = testing_support::kSanitized ? 50 : 300;
    for (int i = 0; i < rounds; ++i) {
        auto poller = on(i % 2, [&] { return spindle::poll(p.r, POLLIN).valueOr(-1); });
        auto writer = on(1 - i % 2, [&] {
            char c = 'w';
            return spindle::write(p.w, &c, 1).valueOr(0);
        });
        ASSERT_EQ(writer.join(), 1u);
        ASSERT_EQ(poller.join(), POLLIN) << "round " << i;
        char c;
        ASSERT_EQ(::read(p.r, &c, 1), 1);  // drain, so the next round starts unreadable
    }
}

// Off-fiber: a plain thread parks in poll on its own ring; a fiber writes once the thread says it is about to
// poll (before or after the thread's poll reached the kernel: both give POLLIN).
TEST_F(IoOpsTest, PollFromAPlainThreadWakesOnAFiberWrite) {
    Pipe p;
    ASSERT_GE(p.r, 0);
    std::atomic<bool> armed{false};
    int got = -2;
    std::thread t([&] {
        EXPECT_FALSE(this_fiber::inFiber());
        armed.store(true);
        got = spindle::poll(p.r, POLLIN).valueOr(-1);
    });
    while (!armed.load()) { std::this_thread::yield(); }
    EXPECT_EQ(onFiber([&] {
                  char c = 'w';
                  return spindle::write(p.w, &c, 1).valueOr(0);
              }),
              1u);
    t.join();
    EXPECT_EQ(got, POLLIN);
}

// ---- splice and tee ------------------------------------------------------------------------------------------

TEST_F(IoOpsTest, SpliceMovesExactBytesFileToPipeToFile) {
    const int src = makeFile("src");
    const int dst = makeFile("dst");
    const auto data = pattern(200'000, 12);  // three times a default pipe's capacity
    ASSERT_EQ(::pwrite(src, data.data(), data.size(), 0), static_cast<ssize_t>(data.size()));
    Pipe p;
    ASSERT_GE(p.r, 0);

    const auto moved = onFiber([&] {
        uint64_t off = 0;
        while (off < data.size()) {
            auto in = spindle::splice(src, static_cast<int64_t>(off), p.w, -1, data.size() - off, 0);
            if (!in || *in == 0) { return off; }
            size_t out = 0;
            while (out < *in) {
                auto o = spindle::splice(p.r, -1, dst, static_cast<int64_t>(off + out), *in - out, 0);
                if (!o || *o == 0) { return off + out; }
                out += *o;
            }
            off += *in;
        }
        return off;
    });
    EXPECT_EQ(moved, data.size());
    struct stat st {};
    ASSERT_EQ(::fstat(dst, &st), 0);
    EXPECT_EQ(st.st_size, static_cast<off_t>(data.size()));
    std::vector<char> back(data.size());
    ASSERT_EQ(::pread(dst, back.data(), back.size(), 0), static_cast<ssize_t>(back.size()));
    EXPECT_TRUE(back == data);
    EXPECT_EQ(::lseek(src, 0, SEEK_CUR), 0) << "explicit offsets leave the file position alone";
    EXPECT_EQ(::lseek(dst, 0, SEEK_CUR), 0);

    // Offset -1 uses and advances the file position, like splice(2) with NULL.
    ASSERT_EQ(::lseek(src, 1000, SEEK_SET), 1000);
    const auto [n, m] = onFiber([&] {
        const size_t a = spindle::splice(src, -1, p.w, -1, 500, 0).valueOr(0);
        std::vector<char> buf(a);
        const size_t b = spindle::read(p.r, buf.data(), buf.size()).valueOr(0);
        EXPECT_EQ(std::memcmp(buf.data(), data.data() + 1000, b), 0);
        return std::make_pair(a, b);
    });
    EXPECT_EQ(n, 500u);
    EXPECT_EQ(m, 500u);
    EXPECT_EQ(::lseek(src, 0, SEEK_CUR), 1500);

    // Once the pipe is empty and has no writer, splice says end of input.
    p.closeWrite();
    EXPECT_EQ(onFiber([&] { return spindle::splice(p.r, -1, dst, 0, 100, 0).errorCode(); }), 0);
    EXPECT_EQ(onFiber([&] { return spindle::splice(p.r, -1, dst, 0, 100, 0).valueOr(99); }), 0u);
    ::close(src);
    ::close(dst);
}

TEST_F(IoOpsTest, SpliceErrorsComeBackAsErrno) {
    const int a = makeFile("a");
    const int b = makeFile("b");
    ASSERT_EQ(::pwrite(a, "hello", 5, 0), 5);
    Pipe p;
    ASSERT_GE(p.r, 0);
    ASSERT_EQ(::write(p.w, "xy", 2), 2);
    const auto e = onFiber([&] {
        std::array<int, 5> r{};
        r[0] = spindle::splice(a, 0, b, 0, 5, 0).errorCode();
        r[1] = spindle::splice(p.r, 0, b, 0, 2, 0).errorCode();
        r[2] = spindle::splice(-1, 0, p.w, -1, 5, 0).errorCode();
        r[3] = spindle::splice(a, 0, -1, -1, 5, 0).errorCode();
        r[4] = spindle::splice(a, 0, p.w, -1, 5, SPLICE_F_FD_IN_FIXED).errorCode();
        return r;
    });
    EXPECT_EQ(e[0], EINVAL) << "neither end is a pipe";
    EXPECT_EQ(e[1], ESPIPE) << "an offset on the pipe end";
    EXPECT_EQ(e[2], EBADF) << "a bad fdIn";
    EXPECT_EQ(e[3], EBADF) << "a bad fdOut";
    EXPECT_EQ(e[4], EINVAL) << "SPLICE_F_FD_IN_FIXED";
    char buf[4];
    EXPECT_EQ(::read(p.r, buf, sizeof(buf)), 2) << "the failed calls moved nothing";
    ::close(a);
    ::close(b);
}

// A splice or tee into a pipe (or socket) whose reader has gone raises SIGPIPE in the thread that
// makes it; the caller must get EPIPE instead, as from a send, whether or not the process ignores the
// signal. Before, on the epoll backend (the call runs on an offload thread), the process ended.
TEST_F(IoOpsTest, SpliceAndTeeIntoAGoneReaderAreEpipeNotSigpipe) {
    struct sigaction dfl {}, saved {};
    dfl.sa_handler = SIG_DFL;
    ASSERT_EQ(::sigaction(SIGPIPE, &dfl, &saved), 0);  // as in a process that does not ignore it
    Pipe from, to;
    ASSERT_GE(from.r, 0);
    ASSERT_GE(to.r, 0);
    ASSERT_EQ(::write(from.w, "abcdef", 6), 6);
    ::close(to.r);
    to.r = -1;
    const auto e = onFiber([&] {
        return std::make_pair(spindle::splice(from.r, -1, to.w, -1, 6, 0).errorCode(),
                              spindle::tee(from.r, to.w, 6, 0).errorCode());
    });
    EXPECT_EQ(e.first, EPIPE);
    EXPECT_EQ(e.second, EPIPE);
    ASSERT_EQ(::sigaction(SIGPIPE, &saved, nullptr), 0);
}

TEST_F(IoOpsTest, TeeDuplicatesPipeDataWithoutConsumingIt) {
    Pipe from, to;
    ASSERT_GE(from.r, 0);
    ASSERT_GE(to.r, 0);
    const auto data = pattern(10'000, 13);
    ASSERT_EQ(::write(from.w, data.data(), data.size()), static_cast<ssize_t>(data.size()));
    const size_t teed = onFiber([&] { return spindle::tee(from.r, to.w, data.size(), 0).valueOr(0); });
    EXPECT_EQ(teed, data.size());
    std::vector<char> a(data.size()), b(data.size());
    ASSERT_EQ(::read(from.r, a.data(), a.size()), static_cast<ssize_t>(a.size())) << "tee left the source as it was";
    ASSERT_EQ(::read(to.r, b.data(), b.size()), static_cast<ssize_t>(b.size()));
    EXPECT_TRUE(a == data);
    EXPECT_TRUE(b == data);
}

TEST_F(IoOpsTest, TeeErrorsComeBackAsErrno) {
    const int f = makeFile("f");
    Pipe p, q;
    ASSERT_GE(p.r, 0);
    ASSERT_GE(q.r, 0);
    ASSERT_EQ(::write(p.w, "xy", 2), 2);
    const auto e = onFiber([&] {
        std::array<int, 5> r{};
        r[0] = spindle::tee(f, q.w, 2, 0).errorCode();
        r[1] = spindle::tee(p.r, f, 2, 0).errorCode();
        r[2] = spindle::tee(p.r, p.w, 2, 0).errorCode();
        r[3] = spindle::tee(-1, q.w, 2, 0).errorCode();
        r[4] = spindle::tee(p.r, q.w, 2, SPLICE_F_FD_IN_FIXED).errorCode();
        return r;
    });
    EXPECT_EQ(e[0], EINVAL) << "fdIn is not a pipe";
    EXPECT_EQ(e[1], EINVAL) << "fdOut is not a pipe";
    EXPECT_EQ(e[2], EINVAL) << "both ends of the same pipe";
    EXPECT_EQ(e[3], EBADF);
    EXPECT_EQ(e[4], EINVAL) << "SPLICE_F_FD_IN_FIXED";
    ::close(f);
}

// ---- splice and tee that wait --------------------------------------------------------------------------------------

/// A connected AF_UNIX stream pair whose `near` end has no room left: its send buffer (and the peer's
/// receive queue) filled before the test, `filled` bytes. `cutOff()` ends a call blocked on it (the peer
/// shuts its reading side: the blocked sender gets EPIPE); `drain()` reads everything the peer has.
struct FullSocket {
    int near = -1;
    int peer = -1;
    size_t filled = 0;
    FullSocket() {
        int sv[2];
        if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
            ADD_FAILURE() << "socketpair: " << std::strerror(errno);
            return;
        }
        near = sv[0];
        peer = sv[1];
        const int small = 4096;
        (void)::setsockopt(near, SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
        (void)::setsockopt(peer, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
        const std::vector<char> chunk(4096, 'f');
        for (;;) {
            const ssize_t n = ::send(near, chunk.data(), chunk.size(), MSG_DONTWAIT);
            if (n <= 0) { break; }
            filled += static_cast<size_t>(n);
        }
    }
    ~FullSocket() {
        if (near >= 0) { ::close(near); }
        if (peer >= 0) { ::close(peer); }
    }
    FullSocket(const FullSocket&) = delete;
    FullSocket& operator=(const FullSocket&) = delete;
    void cutOff() const { (void)::shutdown(peer, SHUT_RD); }
    /// Reads `n` bytes from the peer (blocking).
    [[nodiscard]] std::vector<char> drain(size_t n) const {
        std::vector<char> got(n);
        size_t at = 0;
        while (at < n) {
            const ssize_t r = ::recv(peer, got.data() + at, n - at, 0);
            if (r <= 0) { break; }
            at += static_cast<size_t>(r);
        }
        got.resize(at);
        return got;
    }
};

/// Polls the runtime's fiber listing until the fiber named `name` is suspended.
void awaitSuspended(Runtime& rt, const std::string& name) {
    for (;;) {
        const FiberListing l = rt.fibers(false);
        for (const FiberInfo& f : l.fibers) {
            if (f.name == name && f.state == "suspended") { return; }
        }
        std::this_thread::sleep_for(1ms);
    }
}

/// Calls `cutOff` unless `disarm()` comes within `limit`: a call that blocks where it should wait (and
/// ignores its deadline or a cancel) then fails its test with the error the cut gives instead of hanging it.
class Watchdog {
public:
    template <class F>
    Watchdog(std::chrono::milliseconds limit, F cutOff) : thread_([this, limit, cutOff] {
        std::unique_lock lock(mu_);
        if (!cv_.wait_for(lock, limit, [this] { return disarmed_; })) { cutOff(); }
    }) {}
    ~Watchdog() { disarm(); }
    Watchdog(const Watchdog&) = delete;
    Watchdog& operator=(const Watchdog&) = delete;
    void disarm() {
        {
            std::lock_guard lock(mu_);
            disarmed_ = true;
        }
        cv_.notify_all();
        if (thread_.joinable()) { thread_.join(); }
    }

private:
    std::mutex mu_;
    std::condition_variable cv_;
    bool disarmed_ = false;
    std::thread thread_;
};

/// A pipe holding `bytes` bytes and a FullSocket to splice them into, with a Watchdog that cuts the
/// socket off after 10 s (a splice that blocks instead of waiting then fails its test, not hangs it).
struct PipeToFullSocket {
    FullSocket s;
    Pipe p;
    std::vector<char> data;
    Watchdog dog;
    explicit PipeToFullSocket(size_t bytes) : data(pattern(bytes, 21)), dog(10s, [this] { s.cutOff(); }) {
        EXPECT_GT(s.filled, 0u);
        EXPECT_EQ(::write(p.w, data.data(), data.size()), static_cast<ssize_t>(data.size()));
    }
    [[nodiscard]] Result<size_t> splice(Deadline deadline = {}) const {
        return spindle::splice(p.r, -1, s.near, -1, data.size(), 0, deadline);
    }
};

// A splice from a pipe into a socket with no room waits for room and honours its deadline, moving
// nothing. Before, on the epoll backend, it ran blocking on the offload pool: the deadline was ignored
// and the call (and a pool thread) stayed until the peer read or went. On io_uring the kernel never
// fired the linked timeout of a splice blocked in its worker, with the same outcome.
TEST_F(IoOpsTest, ASpliceIntoASocketWithNoRoomHonoursItsDeadline) {
    PipeToFullSocket t(3000);
    const int err = onFiber([&] { return t.splice(50ms).errorCode(); });
    t.dog.disarm();
    EXPECT_EQ(err, ETIMEDOUT);
    EXPECT_EQ(t.p.queued(), 3000) << "a splice that timed out moved nothing";
}

/// kWaiting pipes of 2,000 bytes each and as many FullSockets to splice them into, with a Watchdog that
/// cuts the sockets off after 10 s; finish() lets the peers read and checks each splice's bytes.
struct SplicesIntoFullSockets {
    static constexpr size_t kWaiting = 3;  // RuntimeOptions::offloadThreads is 2
    std::array<FullSocket, kWaiting> socks;
    std::array<Pipe, kWaiting> pipes;
    std::vector<char> data;
    Watchdog dog;
    explicit SplicesIntoFullSockets(unsigned seed) : data(pattern(2000, seed)), dog(10s, [this] {
        for (const auto& s : socks) { s.cutOff(); }
    }) {
        for (size_t i = 0; i < kWaiting; ++i) {
            EXPECT_GT(socks[i].filled, 0u);
            EXPECT_EQ(::write(pipes[i].w, data.data(), data.size()), static_cast<ssize_t>(data.size()));
        }
    }
    [[nodiscard]] size_t splice(size_t i) const {
        return spindle::splice(pipes[i].r, -1, socks[i].near, -1, data.size(), 0).valueOr(0);
    }
    /// Every splicer is joined, whatever the checks find: the pipes and sockets outlive them.
    void finish(std::vector<FiberHandle<size_t>>& splicers) {
        dog.disarm();
        for (size_t i = 0; i < kWaiting; ++i) {
            const auto got = socks[i].drain(socks[i].filled + data.size());
            if (got.size() == socks[i].filled + data.size()) {
                EXPECT_TRUE(std::equal(data.begin(), data.end(), got.end() - static_cast<ptrdiff_t>(data.size()))) << i;
            } else {
                ADD_FAILURE() << i << ": the peer read " << got.size() << " bytes, not " << socks[i].filled + data.size();
            }
            EXPECT_EQ(splicers[i].join(), data.size()) << i;
        }
    }
};

// Splices waiting for room in sockets hold no offload thread: with more of them waiting than the pool
// has threads, a file call (the pool's work on the epoll backend) still runs; then the peers read and
// every splice completes with its bytes.
TEST_F(IoOpsTest, SplicesWaitingForRoomLeaveTheOffloadPoolFree) {
    SplicesIntoFullSockets t(22);
    std::atomic<size_t> started{0};
    std::vector<FiberHandle<size_t>> splicers;
    for (size_t i = 0; i < t.kWaiting; ++i) {
        splicers.push_back(anywhere([&, i] {
            started.fetch_add(1);
            return t.splice(i);
        }));
    }
    yieldUntil([&] { return started.load() == t.kWaiting; });
    touch("f");
    const int statErrno = onFiber([&] {
        struct statx sx {};
        return spindle::statx(dirfd_, "f", 0, STATX_SIZE, &sx).errorCode();
    });
    EXPECT_EQ(statErrno, 0) << "the statx ran while the splices waited";
    t.finish(splicers);
}

/// This process's io_uring workers (threads named iou-wrk-*) asleep anywhere but in the worker's own
/// idle wait, that is in a call they run (a running thread shows wchan "0" and is not counted); -1
/// when no thread of the process shows where it sleeps (a kernel that hides wchan), though some
/// always sleep (the carriers, the watchdog).
int busyRingWorkers() {
    int busy = 0;
    bool shown = false;
    const std::string dir = "/proc/self/task";
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) { return -1; }
    while (const dirent* e = ::readdir(d)) {
        if (e->d_name[0] == '.') { continue; }
        auto slurp = [&](const char* what) {
            std::string text(256, '\0');
            const int fd = ::open((dir + "/" + e->d_name + "/" + what).c_str(), O_RDONLY | O_CLOEXEC);
            if (fd < 0) { return std::string(); }
            const ssize_t n = ::read(fd, text.data(), text.size());
            ::close(fd);
            text.resize(n > 0 ? static_cast<size_t>(n) : 0);
            while (!text.empty() && text.back() == '\n') { text.pop_back(); }
            return text;
        };
        const std::string wchan = slurp("wchan");
        if (wchan.empty() || wchan == "0") { continue; }
        shown = true;
        if (slurp("comm").rfind("iou-wrk-", 0) == 0 && wchan != "io_wq_worker") { ++busy; }
    }
    ::closedir(d);
    return shown ? busy : -1;
}

// Splices waiting for room hold no kernel thread either. io_uring runs every splice in an io-wq
// worker; before, each waiting one slept there (3 of 3 workers busy here; a file server splicing to
// N slow readers held N). Now each waits with a poll on the ring, and the workers are idle. On the
// epoll backend no worker is involved: the check holds trivially there.
TEST_F(IoOpsTest, SplicesWaitingForRoomHoldNoRingWorker) {
    SplicesIntoFullSockets t(23);
    if (HasFailure()) { return; }  // no full sockets or no bytes in the pipes: nothing would wait
    if (busyRingWorkers() < 0) { GTEST_SKIP() << "/proc/<pid>/task/<tid>/wchan does not say where threads sleep"; }
    std::vector<FiberHandle<size_t>> splicers;
    for (size_t i = 0; i < t.kWaiting; ++i) {
        splicers.push_back(rt().spawn([&, i] { return t.splice(i); }, SpawnOptions{.name = "splicer"}).value());
    }
    const auto giveUp = std::chrono::steady_clock::now() + 10s;
    for (size_t waiting = 0; waiting < t.kWaiting;) {  // all of them in their wait
        if (std::chrono::steady_clock::now() > giveUp) {
            ADD_FAILURE() << "only " << waiting << " splicers waited";
            break;
        }
        std::this_thread::sleep_for(1ms);
        waiting = 0;
        for (const FiberInfo& f : rt().fibers(false).fibers) {
            if (f.name == "splicer" && f.state == "suspended") { ++waiting; }
        }
    }
    std::this_thread::sleep_for(100ms);  // a worker that took a splice has had time to block in it
    // A worker asleep only for a moment (a socket's lock, the pipe's mutex; also those of other rings of
    // this process) is let go: up to 2 s for the count to reach 0. One blocked in a splice stays.
    int busy = busyRingWorkers();
    for (int i = 0; i < 200 && busy > 0; ++i) {
        std::this_thread::sleep_for(10ms);
        busy = busyRingWorkers();
    }
    EXPECT_EQ(busy, 0) << "workers asleep in a call while the splices wait for room";
    t.finish(splicers);
}

// The caller's own SPLICE_F_NONBLOCK means what it means to splice(2): a pipe with nothing to give
// answers EAGAIN at once, moving nothing, on both backends. Before, the epoll driver parked the call
// until the pipe had bytes (here: until its deadline), as if the flag were not there.
TEST_F(IoOpsTest, ACallersSpliceNonblockAnswersEagainOnAnEmptyPipe) {
    Pipe in, out;
    ASSERT_GE(in.r, 0);
    ASSERT_GE(out.r, 0);
    const int err = onFiber([&] { return spindle::splice(in.r, -1, out.w, -1, 64, SPLICE_F_NONBLOCK, 2s).errorCode(); });
    EXPECT_EQ(err, EAGAIN);
    EXPECT_EQ(out.queued(), 0);
}

#if defined(SPINDLE_FAULT_INJECTION)
// An EAGAIN that lasts though both ends are ready (TCP's global memory limit refuses a send while the
// socket's own room says ready; here the fault point kSpliceAgain answers it in place of the call):
// the splice waits it out with a sleep that doubles from 1 ms to 64 ms, never past its deadline,
// instead of trying again without end. Before, the epoll backend parked the call on its output end,
// whose readiness was there already, and tried again at once: thousands of tries in these 200 ms.
/// 100 bytes in one pipe, to be spliced into another: both ends ready.
struct PipeToPipe {
    Pipe in, out;
    std::vector<char> data;
    explicit PipeToPipe(unsigned seed) : data(pattern(100, seed)) {
        EXPECT_GE(in.r, 0);
        EXPECT_GE(out.r, 0);
        EXPECT_EQ(::write(in.w, data.data(), data.size()), 100);
    }
    [[nodiscard]] Result<size_t> splice(Deadline deadline) const {
        return spindle::splice(in.r, -1, out.w, -1, data.size(), 0, deadline);
    }
};

TEST_F(IoOpsTest, ASpliceWhoseEagainLastsWaitsItOutUntilItsDeadline) {
    PipeToPipe t(24);
    constexpr uint32_t kArmed = 1'000'000;
    uint32_t tries = 0;
    const int err = onFiber([&] {
        inject::ArmedFault f(inject::Point::kSpliceAgain, EAGAIN, kArmed);
        const int e = t.splice(200ms).errorCode();
        tries = kArmed - inject::remaining(inject::Point::kSpliceAgain);
        return e;
    });
    EXPECT_EQ(err, ETIMEDOUT);
    EXPECT_EQ(t.in.queued(), 100) << "nothing moved";
    EXPECT_EQ(t.out.queued(), 0);
    EXPECT_GE(tries, 4u) << "the quick tries, and one at least after a wait";
    EXPECT_LE(tries, 100u) << "tries in 200 ms: the doubling wait allows a few dozen at most";
}

// ... and once the condition ends, the splice goes through with its bytes.
TEST_F(IoOpsTest, ASpliceGoesThroughOnceALastingEagainEnds) {
    PipeToPipe t(25);
    // 12 EAGAINs, then the call: a few quick tries (4 on epoll, 3 on io_uring), then one try after each
    // wait of 1, 2, 4 ... 64, 64 ms: 0.2-0.25 s
    inject::ArmedFault f(inject::Point::kSpliceAgain, EAGAIN, 12);
    const auto moved = onFiber([&] { return t.splice(10s).valueOr(0); });
    EXPECT_EQ(moved, 100u);
    EXPECT_EQ(inject::remaining(inject::Point::kSpliceAgain), 0u) << "every armed EAGAIN was answered first";
    std::vector<char> got(100);
    ASSERT_EQ(::read(t.out.r, got.data(), got.size()), 100);
    EXPECT_EQ(got, t.data);
}
#endif

// A splice waiting for room is cancelled: ECANCELED, and its bytes stay in the pipe.
TEST_F(IoOpsTest, ASpliceWaitingForRoomIsCancelled) {
    PipeToFullSocket t(10);
    auto h = rt().spawn([&] { return t.splice().errorCode(); }, SpawnOptions{.name = "splicer"}).value();
    awaitSuspended(rt(), "splicer");  // in its wait: the cancel ends the wait, not the call before it starts
    h.cancel();
    const int err = h.join();
    t.dog.disarm();
    EXPECT_EQ(err, ECANCELED);
    EXPECT_EQ(t.p.queued(), 10);
}

// The other direction and the other end: a splice from a socket with nothing to read waits for bytes,
// and a splice from an empty pipe into a socket waits for the pipe's writer.
TEST_F(IoOpsTest, SplicesWaitForTheirInputEnd) {
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    Pipe p, q;
    ASSERT_GE(p.r, 0);
    ASSERT_GE(q.r, 0);
    const auto data = pattern(1500, 23);
    auto fromSocket = anywhere([&] { return spindle::splice(sv[0], -1, p.w, -1, data.size(), 0, 10s).valueOr(0); });
    auto fromPipe = anywhere([&] { return spindle::splice(q.r, -1, sv[0], -1, data.size(), 0, 10s).valueOr(0); });
    ASSERT_EQ(::send(sv[1], data.data(), data.size(), 0), static_cast<ssize_t>(data.size()));
    ASSERT_EQ(::write(q.w, data.data(), data.size()), static_cast<ssize_t>(data.size()));
    EXPECT_EQ(fromSocket.join(), data.size());
    EXPECT_EQ(fromPipe.join(), data.size());
    std::vector<char> a(data.size()), b(data.size());
    EXPECT_EQ(::read(p.r, a.data(), a.size()), static_cast<ssize_t>(a.size()));
    EXPECT_EQ(::recv(sv[1], b.data(), b.size(), MSG_WAITALL), static_cast<ssize_t>(b.size()));
    EXPECT_TRUE(a == data);
    EXPECT_TRUE(b == data);
    ::close(sv[0]);
    ::close(sv[1]);
}

// A tee into a full pipe waits for room (and honours its deadline there); once the reader makes room it
// copies.
TEST_F(IoOpsTest, ATeeIntoAFullPipeWaitsForRoom) {
    Pipe from, to;
    ASSERT_GE(from.r, 0);
    ASSERT_GE(to.r, 0);
    const int fl = ::fcntl(to.w, F_GETFL);
    ASSERT_EQ(::fcntl(to.w, F_SETFL, fl | O_NONBLOCK), 0);
    size_t filled = 0;
    for (char c[4096] = {};;) {
        const ssize_t n = ::write(to.w, c, sizeof(c));
        if (n <= 0) { break; }
        filled += static_cast<size_t>(n);
    }
    ASSERT_EQ(::fcntl(to.w, F_SETFL, fl), 0);
    ASSERT_EQ(::write(from.w, "abc", 3), 3);
    Watchdog dog(10s, [&] { ::close(std::exchange(to.r, -1)); });  // the tee then fails with EPIPE
    EXPECT_EQ(onFiber([&] { return spindle::tee(from.r, to.w, 3, 0, 50ms).errorCode(); }), ETIMEDOUT);
    auto h = rt().spawn([&] { return spindle::tee(from.r, to.w, 3, 0).valueOr(0); }, SpawnOptions{.name = "teer"}).value();
    awaitSuspended(rt(), "teer");
    std::vector<char> room(filled);
    size_t got = 0;
    while (got < filled) {
        const ssize_t n = ::read(to.r, room.data(), filled - got);
        ASSERT_GT(n, 0);
        got += static_cast<size_t>(n);
    }
    EXPECT_EQ(h.join(), 3u);
    dog.disarm();
    EXPECT_EQ(from.queued(), 3) << "tee consumed nothing";
}

// Splices with deadlines, one after another on one fiber (so each request sits where the last one
// did): those that finish in time leave nothing behind that could touch the next (on io_uring their
// timeout is removed and that removal awaited), and those that time out are followed by one that works.
TEST_F(IoOpsTest, SplicesWithDeadlinesOneAfterAnother) {
    Pipe p, q;
    ASSERT_GE(p.r, 0);
    ASSERT_GE(q.r, 0);
    const auto outcome = onFiber([&] {
        std::array<int, 3> bad{};  // wrong counts, wrong timeouts, wrong bytes
        for (int i = 0; i < 200; ++i) {
            const bool timeout = i % 10 == 9;
            const char c = static_cast<char>('a' + i % 26);
            if (!timeout && ::write(p.w, &c, 1) != 1) { ++bad[0]; }
            auto r = spindle::splice(p.r, -1, q.w, -1, 1, 0, timeout ? Deadline(1ms) : Deadline(10s));
            if (timeout) {
                bad[1] += r.errorCode() != ETIMEDOUT;
                continue;
            }
            char got = 0;
            bad[0] += !r || *r != 1;
            bad[2] += ::read(q.r, &got, 1) != 1 || got != c;
        }
        return bad;
    });
    EXPECT_EQ(outcome[0], 0) << "splices that did not move their byte";
    EXPECT_EQ(outcome[1], 0) << "splices on an empty pipe that did not time out";
    EXPECT_EQ(outcome[2], 0) << "bytes that arrived wrong";
}

// The same waits from a plain thread: a splice into a socket with no room honours its deadline.
TEST_F(IoOpsTest, ASpliceFromAPlainThreadHonoursItsDeadline) {
    PipeToFullSocket t(3);
    int err = 0;
    std::thread([&] { err = t.splice(50ms).errorCode(); }).join();
    t.dog.disarm();
    EXPECT_EQ(err, ETIMEDOUT);
    EXPECT_EQ(t.p.queued(), 3);
}

// ---- off-fiber -------------------------------------------------------------------------------------------------

// Every call once from a plain thread, on that thread's own ring, checked the same way.
TEST_F(IoOpsTest, EveryCallWorksFromAPlainThread) {
    const auto data = pattern(5000, 14);
    std::thread t([&] {
        ASSERT_FALSE(this_fiber::inFiber());
        EXPECT_EQ(spindle::mkdirat(dirfd_, "d", 0700).errorCode(), 0);
        EXPECT_EQ(statErr(path("d")), 0);
        EXPECT_EQ(spindle::mkdirat(dirfd_, "d", 0700).errorCode(), EEXIST);

        auto fd = spindle::openat(dirfd_, "d/f", O_RDWR | O_CREAT | O_EXCL, 0600);
        ASSERT_TRUE(fd) << fd.error().message();
        const int fallocErr = spindle::fallocate(*fd, 0, 0, 8192).errorCode();
        EXPECT_TRUE(fallocErr == 0 || fallocErr == EOPNOTSUPP) << std::strerror(fallocErr);
        if (fallocErr == 0) {
            struct stat st {};
            EXPECT_EQ(::fstat(*fd, &st), 0);
            EXPECT_EQ(st.st_size, 8192);
        }
        EXPECT_EQ(spindle::fallocate(-1, 0, 0, 1).errorCode(), EBADF);
        ASSERT_EQ(::pwrite(*fd, data.data(), data.size(), 0), static_cast<ssize_t>(data.size()));

        Pipe p, q;
        ASSERT_GE(p.r, 0);
        ASSERT_GE(q.r, 0);
        EXPECT_EQ(spindle::splice(*fd, 0, p.w, -1, data.size(), 0).valueOr(0), data.size());
        EXPECT_EQ(spindle::poll(p.r, POLLIN).valueOr(-1), POLLIN);
        EXPECT_EQ(spindle::tee(p.r, q.w, data.size(), 0).valueOr(0), data.size());
        std::vector<char> a(data.size()), b(data.size());
        EXPECT_EQ(::read(p.r, a.data(), a.size()), static_cast<ssize_t>(a.size()));
        EXPECT_EQ(::read(q.r, b.data(), b.size()), static_cast<ssize_t>(b.size()));
        EXPECT_TRUE(a == data);
        EXPECT_TRUE(b == data);
        EXPECT_EQ(spindle::splice(*fd, 0, *fd, 0, 1, 0).errorCode(), EINVAL);
        EXPECT_EQ(spindle::tee(*fd, q.w, 1, 0).errorCode(), EINVAL);
        EXPECT_EQ(spindle::poll(-1, POLLIN).errorCode(), EBADF);
        EXPECT_TRUE(spindle::close(*fd));

        EXPECT_EQ(spindle::renameat(dirfd_, "d/f", dirfd_, "g").errorCode(), 0);
        EXPECT_EQ(statErr(path("d/f")), ENOENT);
        EXPECT_EQ(statErr(path("g")), 0);
        EXPECT_EQ(spindle::renameat(dirfd_, "d/f", dirfd_, "g").errorCode(), ENOENT);
        EXPECT_EQ(spindle::unlinkat(dirfd_, "g", 0).errorCode(), 0);
        EXPECT_EQ(::access(path("g").c_str(), F_OK), -1);
        EXPECT_EQ(spindle::unlinkat(dirfd_, "d", AT_REMOVEDIR).errorCode(), 0);
        EXPECT_EQ(statErr(path("d")), ENOENT);
        EXPECT_EQ(spindle::unlinkat(dirfd_, "d", AT_REMOVEDIR).errorCode(), ENOENT);

        EXPECT_EQ(spindle::mkdirat(dirfd_, nullptr, 0700).errorCode(), EFAULT);
        EXPECT_EQ(spindle::unlinkat(dirfd_, nullptr, 0).errorCode(), EFAULT);
        EXPECT_EQ(spindle::renameat(dirfd_, nullptr, dirfd_, nullptr).errorCode(), EFAULT);
    });
    t.join();
}

}  // namespace
}  // namespace spindle
