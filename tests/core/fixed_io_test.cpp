// SPDX-License-Identifier: Apache-2.0
// Tests for core/fixed.h: registered buffers (read_fixed/write_fixed) and registered files (FixedFile).
//
// Every transfer is checked against the kernel's own view (::pread/::pwrite on the same file), and the
// per-carrier counters prove which path a call took: the registered form on the owning carrier, the
// plain form on another carrier, off-fiber, or when the kernel refused the registration (forced with
// the kRegisterBuffers/kRegisterFiles fault points). Error paths: EINVAL for a range outside the
// buffer, ENOBUFS/ENFILE when exhausted (and recovery after a release), ENOTSUP with the feature
// off, EPERM off-fiber, EBADF for bad descriptors, EINVAL for bad options.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <liburing.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/log.h"
#include "core/fiber.h"
#include "core/fixed.h"
#include "core/internal/carrier.h"
#include "core/internal/io_submit.h"
#include "core/io.h"
#include "core/runtime.h"
#include "tests/core/with_runtime.h"
#include "uring/inject.h"

namespace spindle {
namespace {

using testing_support::pattern;
using testing_support::withCarriers;

constexpr size_t kBufSize = 64 * 1024;  // RuntimeOptions::fixedBufferSize's default
constexpr unsigned kBufCount = 64;      // RuntimeOptions::fixedBufferCount's default
constexpr size_t kFileSize = 256 * 1024;

using inject::ArmedFault;

/// The counters of every carrier, for before/after comparisons.
struct Counts {
    std::vector<CarrierStats> s;
    explicit Counts(const Runtime& rt) : s(rt.stats()) {}
    uint64_t fixedIo(unsigned c) const { return s[c].fixedIo; }
    uint64_t fallback(unsigned c) const { return s[c].fixedFallbackIo; }
    uint64_t fileIo(unsigned c) const { return s[c].fixedFileIo; }
    uint64_t fileFallback(unsigned c) const { return s[c].fixedFileFallbackIo; }
};

/// Starts fn pinned on `carrier` of `rt` and returns its value.
template <class F>
auto runOn(Runtime& rt, int carrier, F&& fn) {
    return rt.spawn(std::forward<F>(fn), SpawnOptions{.carrier = carrier, .pinned = true}).value().join();
}

/// Whether `fd` is an open descriptor.
bool isOpen(int fd) { return ::fcntl(fd, F_GETFD) >= 0; }

/// A read-write file in a scratch directory, for tests that start their own runtime.
struct ScratchDirFile {
    testing_support::ScratchDir dir;
    int fd = -1;
    ScratchDirFile() {
        if (dir.ok()) { fd = ::open(dir.path("f").c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644); }
    }
    ~ScratchDirFile() {
        if (fd >= 0) { ::close(fd); }
    }
    ScratchDirFile(const ScratchDirFile&) = delete;
    ScratchDirFile& operator=(const ScratchDirFile&) = delete;
    [[nodiscard]] bool ok() const { return fd >= 0; }
};

/// A scratch file of kFileSize pattern bytes; the pattern is kept for comparisons.
class FixedIoTest : public testing_support::WithScratchDir {
protected:
    void SetUp() override {
        SPINDLE_REQUIRE_URING("registered buffers and files");
        WithScratchDir::SetUp();
        if (HasFatalFailure()) { return; }
        fd_ = makeFile("data");
        ASSERT_GE(fd_, 0);
        content_ = pattern(kFileSize, 7);
        ASSERT_EQ(::pwrite(fd_, content_.data(), content_.size(), 0), static_cast<ssize_t>(content_.size()));
    }
    void TearDown() override {
        if (fd_ >= 0) { ::close(fd_); }
        WithScratchDir::TearDown();
    }

    /// `n` bytes of the file at `off`, as ::pread sees them.
    std::vector<char> preadBack(size_t off, size_t n) const {
        std::vector<char> v(n);
        EXPECT_EQ(::pread(fd_, v.data(), n, static_cast<off_t>(off)), static_cast<ssize_t>(n));
        return v;
    }
    /// Whether buf[0, n) equals content_[off, off + n).
    bool matchesFile(const char* buf, size_t off, size_t n) const {
        return std::memcmp(buf, content_.data() + off, n) == 0;
    }
    /// A fresh descriptor on the scratch file (for registerFile, which takes ownership).
    int openData() const {
        const int fd = ::open(path("data").c_str(), O_RDWR | O_CLOEXEC);
        EXPECT_GE(fd, 0) << std::strerror(errno);
        return fd;
    }

    int fd_ = -1;
    std::vector<char> content_;
};

// ---- registered buffers --------------------------------------------------------------------------

TEST_F(FixedIoTest, ReadFixedAndWriteFixedMatchPreadOnTheOwningCarrier) {
    const Counts before(rt());
    on(0, [&] {
        auto b = acquireFixedBuffer();
        ASSERT_TRUE(b) << b.error().message();
        EXPECT_TRUE(b->valid());
        EXPECT_TRUE(b->registered());
        EXPECT_EQ(b->carrier(), 0u);
        EXPECT_EQ(b->size(), kBufSize);
        EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data()) % 4096, 0u) << "page aligned";

        // The whole buffer, then a window at an odd buffer offset and file offset.
        auto r = read_fixed(fd_, *b, 0, kBufSize, 4096);
        ASSERT_TRUE(r) << r.error().message();
        ASSERT_EQ(*r, kBufSize);
        EXPECT_TRUE(matchesFile(b->data(), 4096, kBufSize));
        std::memset(b->data(), 0, kBufSize);
        r = read_fixed(fd_, *b, 1000, 3000, 77);
        ASSERT_TRUE(r) << r.error().message();
        ASSERT_EQ(*r, 3000u);
        EXPECT_TRUE(matchesFile(b->data() + 1000, 77, 3000));
        EXPECT_EQ(b->data()[999], 0) << "nothing written before bufOffset";
        EXPECT_EQ(b->data()[4000], 0) << "nothing written past bufOffset + len";

        // Reading past the end of the file: a short read, then 0.
        r = read_fixed(fd_, *b, 0, kBufSize, kFileSize - 100);
        ASSERT_TRUE(r);
        EXPECT_EQ(*r, 100u);
        r = read_fixed(fd_, *b, 0, kBufSize, kFileSize);
        ASSERT_TRUE(r);
        EXPECT_EQ(*r, 0u);

        // write_fixed: a new pattern from the middle of the buffer, checked with ::pread.
        const auto fresh = pattern(5000, 99);
        std::memcpy(b->data() + 300, fresh.data(), fresh.size());
        auto w = write_fixed(fd_, *b, 300, fresh.size(), 10000);
        ASSERT_TRUE(w) << w.error().message();
        ASSERT_EQ(*w, fresh.size());
        EXPECT_EQ(preadBack(10000, fresh.size()), fresh);
    }).join();
    const Counts after(rt());
    EXPECT_EQ(after.fixedIo(0) - before.fixedIo(0), 5u) << "every call took the registered path";
    EXPECT_EQ(after.fallback(0) - before.fallback(0), 0u);
    EXPECT_TRUE(after.s[0].fixedBuffersRegistered);
}

TEST_F(FixedIoTest, RangesOutsideTheBufferAreEinval) {
    on(0, [&] {
        auto b = acquireFixedBuffer().value();
        const auto bad = [&](size_t off, size_t len) {
            auto r = read_fixed(fd_, b, off, len, 0);
            auto w = write_fixed(fd_, b, off, len, 0);
            return (r ? 0 : r.errorCode()) * 1000 + (w ? 0 : w.errorCode());
        };
        EXPECT_EQ(bad(0, kBufSize + 1), EINVAL * 1001) << "len past the end";
        EXPECT_EQ(bad(kBufSize, 1), EINVAL * 1001) << "one byte past the end";
        EXPECT_EQ(bad(kBufSize + 1, 0), EINVAL * 1001) << "offset past the end";
        EXPECT_EQ(bad(1, SIZE_MAX), EINVAL * 1001) << "bufOffset + len overflows";
        FixedBuffer empty;
        EXPECT_EQ(read_fixed(fd_, empty, 0, 0, 0).errorCode(), EINVAL) << "an empty FixedBuffer";
        EXPECT_EQ(write_fixed(fd_, empty, 0, 0, 0).errorCode(), EINVAL);
        // The edges themselves are fine.
        auto r = read_fixed(fd_, b, kBufSize, 0, 0);
        ASSERT_TRUE(r) << r.error().message();
        EXPECT_EQ(*r, 0u);
        r = read_fixed(fd_, b, kBufSize - 1, 1, 5);
        ASSERT_TRUE(r) << r.error().message();
        EXPECT_EQ(*r, 1u);
        EXPECT_EQ(b.data()[kBufSize - 1], content_[5]);
    }).join();
    // The kernel's own errors pass through.
    on(0, [&] {
        auto b = acquireFixedBuffer().value();
        EXPECT_EQ(read_fixed(-1, b, 0, 16, 0).errorCode(), EBADF);
        EXPECT_EQ(write_fixed(123456, b, 0, 16, 0).errorCode(), EBADF);
    }).join();
}

TEST_F(FixedIoTest, AnExhaustedPoolGivesEnobufsAndRecoversAfterARelease) {
    on(0, [&] {
        std::vector<FixedBuffer> all;
        std::set<unsigned> indexes;
        for (unsigned i = 0; i < kBufCount; ++i) {
            auto b = acquireFixedBuffer();
            ASSERT_TRUE(b) << "buffer " << i << ": " << b.error().message();
            indexes.insert(b->index());
            all.push_back(std::move(*b));
        }
        EXPECT_EQ(indexes.size(), size_t{kBufCount}) << "each buffer handed out once";
        EXPECT_EQ(*indexes.rbegin(), kBufCount - 1);
        auto none = acquireFixedBuffer();
        ASSERT_FALSE(none);
        EXPECT_EQ(none.errorCode(), ENOBUFS);

        const unsigned freed = all[10].index();
        all[10].release();
        EXPECT_FALSE(all[10].valid());
        all[10].release();  // a second release is a no-op, not a double free
        auto again = acquireFixedBuffer();
        ASSERT_TRUE(again) << again.error().message();
        EXPECT_EQ(again->index(), freed);
        EXPECT_EQ(acquireFixedBuffer().errorCode(), ENOBUFS);

        // Move-assigning over a held buffer gives the old one back.
        all[0] = std::move(*again);
        EXPECT_FALSE(again->valid());
        EXPECT_TRUE(acquireFixedBuffer()) << "the buffer all[0] held came back";
    }).join();
    // The other carrier's pool is its own.
    on(1, [&] {
        auto b = acquireFixedBuffer();
        ASSERT_TRUE(b) << b.error().message();
        EXPECT_EQ(b->carrier(), 1u);
    }).join();
}

TEST_F(FixedIoTest, AcquireOffFiberIsEperm) {
    auto b = acquireFixedBuffer();
    ASSERT_FALSE(b);
    EXPECT_EQ(b.errorCode(), EPERM);
}

TEST_F(FixedIoTest, ABufferReleasedOnAPlainThreadGoesBackToItsPool) {
    // The fiber hands every buffer of carrier 0 to this thread...
    auto all = on(0, [] {
        std::vector<FixedBuffer> v;
        while (auto b = acquireFixedBuffer()) { v.push_back(std::move(*b)); }
        return v;
    }).join();
    ASSERT_EQ(all.size(), size_t{kBufCount});
    EXPECT_EQ(on(0, [] { return acquireFixedBuffer().errorCode(); }).join(), ENOBUFS);
    // ...which drops them on yet another plain thread.
    std::thread([v = std::move(all)]() mutable { v.clear(); }).join();
    EXPECT_EQ(on(0, [] {
                  std::vector<FixedBuffer> v;
                  while (auto b = acquireFixedBuffer()) { v.push_back(std::move(*b)); }
                  return v.size();
              }).join(),
              size_t{kBufCount});
}

TEST_F(FixedIoTest, ABufferReleasedOnAnotherCarrierGoesBackToItsPool) {
    on(0, [this] {
        std::vector<FixedBuffer> all;
        while (auto b = acquireFixedBuffer()) { all.push_back(std::move(*b)); }
        ASSERT_EQ(all.size(), size_t{kBufCount});
        on(1, [v = std::move(all)]() mutable {
            EXPECT_EQ(v.front().carrier(), 0u);
            v.clear();  // released on carrier 1
        }).join();
        size_t n = 0;
        while (auto b = acquireFixedBuffer()) { ++n; all.push_back(std::move(*b)); }
        EXPECT_EQ(n, size_t{kBufCount});
    }).join();
}

TEST_F(FixedIoTest, ABufferUsedOffItsCarrierTakesThePlainPathWithTheSameResult) {
    FixedBuffer b = on(0, [] { return acquireFixedBuffer().value(); }).join();
    ASSERT_TRUE(b.registered());
    const Counts before(rt());
    // On carrier 1: its ring does not know carrier 0's buffers, so the call must be a plain read.
    on(1, [&] {
        std::memset(b.data(), 0, kBufSize);
        auto r = read_fixed(fd_, b, 100, 8192, 12345);
        ASSERT_TRUE(r) << r.error().message();
        ASSERT_EQ(*r, 8192u);
        EXPECT_TRUE(matchesFile(b.data() + 100, 12345, 8192));
        const auto fresh = pattern(4096, 3);
        std::memcpy(b.data(), fresh.data(), fresh.size());
        ASSERT_EQ(write_fixed(fd_, b, 0, fresh.size(), 65536).value(), fresh.size());
        EXPECT_EQ(preadBack(65536, fresh.size()), fresh);
    }).join();
    const Counts mid(rt());
    EXPECT_EQ(mid.fallback(1) - before.fallback(1), 2u) << "carrier 1 used plain read/write";
    EXPECT_EQ(mid.fixedIo(1) - before.fixedIo(1), 0u);
    EXPECT_EQ(mid.fixedIo(0) - before.fixedIo(0), 0u);
    // Off-fiber (this thread's private ring): plain, correct, and counted nowhere.
    std::memset(b.data(), 0, kBufSize);
    auto r = read_fixed(fd_, b, 0, kBufSize, 0);
    ASSERT_TRUE(r) << r.error().message();
    ASSERT_EQ(*r, kBufSize);
    EXPECT_TRUE(matchesFile(b.data(), 0, kBufSize));
    const Counts after(rt());
    for (unsigned c = 0; c < 2; ++c) {
        EXPECT_EQ(after.fixedIo(c), mid.fixedIo(c));
        EXPECT_EQ(after.fallback(c), mid.fallback(c));
    }
    // Back on its own carrier: registered again.
    on(0, [&] { EXPECT_EQ(read_fixed(fd_, b, 0, 512, 0).value(), 512u); }).join();
    EXPECT_EQ(Counts(rt()).fixedIo(0) - after.fixedIo(0), 1u);
}

TEST_F(FixedIoTest, AFiberThatMovesCarriersKeepsReadingCorrectly) {
    // Unpinned readers, each with a buffer of carrier 0, read until one of them has been stolen and
    // read on carrier 1. Fibers pinned to carrier 0 keep it busy (they are never
    // stolen themselves), and two readers make carrier 0 hand its queue to the idle carrier 1. Every
    // read must be right wherever it ran; a read on the buffer's own carrier must be registered, any
    // other plain.
    const Counts before(rt());
    std::atomic<bool> stop{false};
    std::atomic<bool> moved{false};
    std::vector<FiberHandle<void>> busy;
    for (int i = 0; i < 2; ++i) {
        busy.push_back(on(0, [&] {
            while (!stop.load()) { this_fiber::yield(); }
        }));
    }
    struct Tally {
        uint64_t own[2] = {0, 0};      // reads on carrier c with a buffer of carrier c
        uint64_t foreign[2] = {0, 0};  // reads on carrier c with a buffer of the other carrier
        int bad = 0;
    };
    const auto readUntilMoved = [&](FixedBuffer b) {
        Tally t;
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        for (size_t i = 0; (!moved.load() || i < 20) && std::chrono::steady_clock::now() < deadline; ++i) {
            const size_t off = (i * 4099) % (kFileSize - 4096);
            const unsigned where = detail::Carrier::current()->index();  // no switch before the read's prepare
            auto r = read_fixed(fd_, b, 0, 4096, off);
            if (!r || *r != 4096 || !matchesFile(b.data(), off, 4096)) { ++t.bad; }
            if (where == b.carrier()) {
                ++t.own[where];
            } else {
                ++t.foreign[where];
                moved = true;
            }
            this_fiber::yield();
        }
        return t;
    };
    auto r1 = onUnpinned(0, [&, b = on(0, [] { return acquireFixedBuffer().value(); }).join()]() mutable {
        return readUntilMoved(std::move(b));
    });
    auto r2 = onUnpinned(0, [&, b = on(0, [] { return acquireFixedBuffer().value(); }).join()]() mutable {
        return readUntilMoved(std::move(b));
    });
    const Tally t1 = r1.join();
    const Tally t2 = r2.join();
    stop = true;
    for (auto& h : busy) { h.join(); }
    EXPECT_EQ(t1.bad + t2.bad, 0);
    const Counts after(rt());
    for (unsigned c = 0; c < 2; ++c) {
        EXPECT_EQ(after.fixedIo(c) - before.fixedIo(c), t1.own[c] + t2.own[c]) << "carrier " << c;
        EXPECT_EQ(after.fallback(c) - before.fallback(c), t1.foreign[c] + t2.foreign[c]) << "carrier " << c;
    }
    if (!moved) { GTEST_SKIP() << "no reader was stolen in 10 s; only the same-carrier half ran"; }
}

TEST(FixedIoOptions, AnEmptyPoolGivesEnotsup) {
    RuntimeOptions o = withCarriers(1);
    o.fixedBufferCount = 0;
    o.fixedBufferSize = 0;  // ignored without buffers
    auto rt = Runtime::start(o);
    ASSERT_TRUE(rt) << rt.error().message();
    EXPECT_EQ(runOn(*rt, 0, [] { return acquireFixedBuffer().errorCode(); }), ENOTSUP);
    EXPECT_FALSE(rt->stats()[0].fixedBuffersRegistered);
}

TEST(FixedIoOptions, OutOfRangeOptionsAreEinval) {
    const auto startErr = [](auto edit) {
        RuntimeOptions o = withCarriers(1);
        edit(o);
        auto rt = Runtime::start(o);
        return rt ? 0 : rt.errorCode();
    };
    EXPECT_EQ(startErr([](RuntimeOptions& o) { o.fixedBufferSize = 0; }), EINVAL);
    EXPECT_EQ(startErr([](RuntimeOptions& o) { o.fixedBufferSize = 4096 + 512; }), EINVAL);
    EXPECT_EQ(startErr([](RuntimeOptions& o) { o.fixedBufferSize = size_t{2} << 30; }), EINVAL);
    EXPECT_EQ(startErr([](RuntimeOptions& o) { o.fixedBufferCount = 16385; }), EINVAL);
    EXPECT_EQ(startErr([](RuntimeOptions& o) {
                  o.fixedBufferCount = 16384;
                  o.fixedBufferSize = size_t{1} << 30;  // 16 TiB
              }),
              EINVAL);
    EXPECT_EQ(startErr([](RuntimeOptions& o) { o.fixedFileSlots = (1u << 20) + 1; }), EINVAL);
    // The edges are accepted.
    EXPECT_EQ(startErr([](RuntimeOptions& o) {
                  o.fixedBufferCount = 1;
                  o.fixedBufferSize = 4096;
                  o.fixedFileSlots = 0;
              }),
              0);
}

/// Sets the log threshold to at least warn for a scope (a warning test must see warnings).
class WarningsShown {
public:
    WarningsShown() : saved_(log::threshold()) {
        if (static_cast<int>(saved_) < static_cast<int>(log::Level::kWarn)) { log::setThreshold(log::Level::kWarn); }
    }
    ~WarningsShown() { log::setThreshold(saved_); }

private:
    log::Level saved_;
};

TEST(FixedIoFallback, RefusedBufferRegistrationWarnsAndIoStaysCorrect) {
    SPINDLE_REQUIRE_URING("registration refused by the ring");
    ScratchDirFile file;
    ASSERT_TRUE(file.ok());
    std::optional<Runtime> rt;
    std::string logged;
    {
        WarningsShown shown;
        ArmedFault f(inject::Point::kRegisterBuffers, ENOMEM, /*count=*/2);
        testing::internal::CaptureStderr();
        auto r = Runtime::start(withCarriers(2));
        logged = testing::internal::GetCapturedStderr();
        ASSERT_TRUE(r) << "a refused registration must not fail start: " << r.error().message();
        rt.emplace(std::move(*r));
    }
    EXPECT_NE(logged.find("io_uring_register_buffers"), std::string::npos) << logged;
    EXPECT_NE(logged.find(std::strerror(ENOMEM)), std::string::npos) << logged;
    EXPECT_NE(logged.find("RLIMIT_MEMLOCK"), std::string::npos) << logged;
    EXPECT_NE(logged.find("64 buffers x 65536 bytes"), std::string::npos) << logged;
    for (const auto& s : rt->stats()) { EXPECT_FALSE(s.fixedBuffersRegistered) << "carrier " << s.index; }

    const Counts before(*rt);
    runOn(*rt, 0, [&] {
        auto b = acquireFixedBuffer();
        ASSERT_TRUE(b) << "the pool still works unregistered: " << b.error().message();
        EXPECT_FALSE(b->registered());
        const auto fresh = pattern(kBufSize, 5);
        std::memcpy(b->data(), fresh.data(), fresh.size());
        ASSERT_EQ(write_fixed(file.fd, *b, 0, kBufSize, 0).value(), kBufSize);
        std::memset(b->data(), 0, kBufSize);
        ASSERT_EQ(read_fixed(file.fd, *b, 0, kBufSize, 0).value(), kBufSize);
        EXPECT_EQ(std::memcmp(b->data(), fresh.data(), kBufSize), 0);
        std::vector<char> back(kBufSize);
        ASSERT_EQ(::pread(file.fd, back.data(), back.size(), 0), static_cast<ssize_t>(kBufSize));
        EXPECT_EQ(back, fresh);
    });
    const Counts after(*rt);
    EXPECT_EQ(after.fallback(0) - before.fallback(0), 2u);
    EXPECT_EQ(after.fixedIo(0), before.fixedIo(0));
}

// ---- registered files ---------------------------------------------------------------------------

TEST_F(FixedIoTest, AFixedFileReadsAndWritesThroughItsSlot) {
    const Counts before(rt());
    on(0, [&] {
        auto f = registerFile(openData());
        ASSERT_TRUE(f) << f.error().message();
        EXPECT_TRUE(f->valid());
        EXPECT_TRUE(f->registered());
        EXPECT_GE(f->slot(), 0);
        EXPECT_EQ(f->carrier(), 0u);

        std::vector<char> buf(20000);
        auto r = read(*f, buf.data(), buf.size(), 3333);
        ASSERT_TRUE(r) << r.error().message();
        ASSERT_EQ(*r, buf.size());
        EXPECT_TRUE(matchesFile(buf.data(), 3333, buf.size()));

        const auto fresh = pattern(7000, 11);
        auto w = write(*f, fresh.data(), fresh.size(), 50000);
        ASSERT_TRUE(w) << w.error().message();
        ASSERT_EQ(*w, fresh.size());
        EXPECT_EQ(preadBack(50000, fresh.size()), fresh);

        // Both registrations at once: a registered buffer through a registered slot.
        auto b = acquireFixedBuffer().value();
        r = read(*f, b, 10, 7000, 50000);
        ASSERT_TRUE(r) << r.error().message();
        ASSERT_EQ(*r, 7000u);
        EXPECT_EQ(std::memcmp(b.data() + 10, fresh.data(), fresh.size()), 0);
        ASSERT_EQ(write(*f, b, 10, 7000, 100000).value(), 7000u);
        EXPECT_EQ(preadBack(100000, fresh.size()), fresh);
        EXPECT_EQ(read(*f, b, kBufSize, 1, 0).errorCode(), EINVAL) << "the buffer's bounds still apply";

        // kCurrentPosition reads at, and advances, the file position.
        ASSERT_EQ(::lseek(f->fd(), 0, SEEK_SET), 0);
        ASSERT_EQ(read(*f, buf.data(), 100).value(), 100u);
        ASSERT_EQ(read(*f, buf.data() + 100, 100).value(), 100u);
        EXPECT_TRUE(matchesFile(buf.data(), 0, 200));
    }).join();
    const Counts after(rt());
    EXPECT_EQ(after.fileIo(0) - before.fileIo(0), 6u);
    EXPECT_EQ(after.fileFallback(0) - before.fileFallback(0), 0u);
    EXPECT_EQ(after.fixedIo(0) - before.fixedIo(0), 2u) << "the combined calls used the registered buffer too";
    EXPECT_TRUE(after.s[0].fixedFilesRegistered);
}

TEST_F(FixedIoTest, AFixedFileUsedOffItsCarrierUsesThePlainFd) {
    FixedFile f = on(0, [&] { return registerFile(openData()).value(); }).join();
    ASSERT_TRUE(f.registered());
    const Counts before(rt());
    on(1, [&] {
        std::vector<char> buf(4096);
        ASSERT_EQ(read(f, buf.data(), buf.size(), 8192).value(), buf.size());
        EXPECT_TRUE(matchesFile(buf.data(), 8192, buf.size()));
    }).join();
    const Counts after(rt());
    EXPECT_EQ(after.fileFallback(1) - before.fileFallback(1), 1u);
    EXPECT_EQ(after.fileIo(1), before.fileIo(1));
    // Off-fiber too.
    std::vector<char> buf(4096);
    ASSERT_EQ(read(f, buf.data(), buf.size(), 0).value(), buf.size());
    EXPECT_TRUE(matchesFile(buf.data(), 0, buf.size()));
    EXPECT_TRUE(f.close());
}

/// Reads one byte through slot `slot` of the calling carrier's table (IOSQE_FIXED_FILE), bypassing
/// FixedFile: what the kernel's table holds there.
int32_t readThroughSlot(int slot) {
    char byte = 0;
    op::Op o = op::read(slot, &byte, 1, 0);
    o.flags |= op::kFixedFile;
    return detail::submitAndWait(o);
}

TEST_F(FixedIoTest, CloseEmptiesTheSlotAndClosesTheDescriptor) {
    on(0, [&] {
        const int fd = openData();
        auto f = registerFile(fd).value();
        const int slot = f.slot();
        EXPECT_EQ(readThroughSlot(slot), 1) << "the kernel's table holds the file";
        ASSERT_TRUE(f.close());
        EXPECT_FALSE(f.valid());
        EXPECT_FALSE(isOpen(fd)) << "the FixedFile owned the descriptor";
        EXPECT_EQ(readThroughSlot(slot), -EBADF) << "the slot is empty in the kernel's table";
        EXPECT_EQ(f.close().errorCode(), EBADF) << "a second close";
        std::vector<char> buf(16);
        EXPECT_EQ(read(f, buf.data(), buf.size(), 0).errorCode(), EBADF);
        EXPECT_EQ(write(f, buf.data(), buf.size(), 0).errorCode(), EBADF);
        // The slot is reused (the free list is LIFO).
        auto g = registerFile(openData()).value();
        EXPECT_EQ(g.slot(), slot);
        // The destructor closes as well.
        const int gfd = g.fd();
        { FixedFile moved = std::move(g); }
        EXPECT_FALSE(isOpen(gfd));
        EXPECT_EQ(readThroughSlot(slot), -EBADF);
    }).join();
}

TEST_F(FixedIoTest, BadDescriptorsAreEbadf) {
    on(0, [&] {
        EXPECT_EQ(registerFile(-1).errorCode(), EBADF);
        const int fd = openData();
        ASSERT_EQ(::close(fd), 0);
        EXPECT_EQ(registerFile(fd).errorCode(), EBADF) << "a closed descriptor";
        FixedFile empty;
        std::vector<char> buf(16);
        EXPECT_EQ(read(empty, buf.data(), buf.size(), 0).errorCode(), EBADF);
        EXPECT_EQ(write(empty, buf.data(), buf.size(), 0).errorCode(), EBADF);
        auto b = acquireFixedBuffer().value();
        EXPECT_EQ(read(empty, b, 0, 16, 0).errorCode(), EBADF);
        EXPECT_EQ(empty.close().errorCode(), EBADF);
    }).join();
    auto off = registerFile(fd_);
    ASSERT_FALSE(off);
    EXPECT_EQ(off.errorCode(), EPERM) << "off-fiber";
    EXPECT_TRUE(isOpen(fd_)) << "a failed registerFile leaves the descriptor to the caller";
}

/// Registers `fd` on the calling fiber's carrier, yielding while the table is full (a close sent
/// from elsewhere is on its way); gives up after 10 s.
Result<FixedFile> registerWhenFree(int fd) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (;;) {
        auto f = registerFile(fd);
        if (f || f.errorCode() != ENFILE || std::chrono::steady_clock::now() > deadline) { return f; }
        this_fiber::yield();
    }
}

TEST_F(FixedIoTest, AFullTableGivesEnfileAndAClosedSlotComesBackFromAnywhere) {
    RuntimeOptions o = withCarriers(2);
    o.fixedFileSlots = 2;
    auto started = Runtime::start(o);
    ASSERT_TRUE(started) << started.error().message();
    Runtime& small = *started;

    auto two = runOn(small, 0, [&] {
        std::vector<FixedFile> v;
        v.push_back(registerFile(openData()).value());
        v.push_back(registerFile(openData()).value());
        const int fd = openData();
        auto full = registerFile(fd);
        EXPECT_EQ(full.errorCode(), ENFILE);
        EXPECT_TRUE(isOpen(fd)) << "the caller keeps the descriptor on failure";
        ::close(fd);
        return v;
    });
    ASSERT_EQ(two.size(), 2u);

    // Closed on carrier 1: the slot travels back to carrier 0 as a message.
    const int slot1 = two[1].slot();
    runOn(small, 1, [f = std::move(two[1])]() mutable { EXPECT_TRUE(f.close()); });
    auto back = runOn(small, 0, [&] { return registerWhenFree(openData()); });
    ASSERT_TRUE(back) << back.error().message();
    EXPECT_EQ(back->slot(), slot1);
    EXPECT_EQ(runOn(small, 0, [s = slot1] { return readThroughSlot(s); }), 1) << "the new file is in the slot";

    // Dropped on a plain thread: the same, through the owner's eventfd.
    const int slot0 = two[0].slot();
    std::thread([f = std::move(two[0])]() mutable { f = FixedFile(); }).join();
    auto again = runOn(small, 0, [&] { return registerWhenFree(openData()); });
    ASSERT_TRUE(again) << again.error().message();
    EXPECT_EQ(again->slot(), slot0);

    // Still full: a slot is never handed out twice.
    EXPECT_EQ(runOn(small, 0, [&] {
                  const int fd = openData();
                  auto f = registerFile(fd);
                  if (!f) { ::close(fd); }
                  return f.errorCode();
              }),
              ENFILE);
    back->close().value();
    again->close().value();
}

TEST(FixedIoOptions, NoFileTableGivesEnotsup) {
    RuntimeOptions o = withCarriers(1);
    o.fixedFileSlots = 0;
    auto rt = Runtime::start(o);
    ASSERT_TRUE(rt) << rt.error().message();
    const int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    EXPECT_EQ(runOn(*rt, 0, [fd] { return registerFile(fd).errorCode(); }), ENOTSUP);
    EXPECT_TRUE(isOpen(fd));
    ::close(fd);
    EXPECT_FALSE(rt->stats()[0].fixedFilesRegistered);
}

TEST(FixedIoFallback, RefusedFileTableWarnsAndFixedFilesUseThePlainFd) {
    SPINDLE_REQUIRE_URING("registration refused by the ring");
    ScratchDirFile file;
    ASSERT_TRUE(file.ok());
    std::optional<Runtime> rt;
    std::string logged;
    {
        WarningsShown shown;
        ArmedFault f(inject::Point::kRegisterFiles, EMFILE, /*count=*/2);
        testing::internal::CaptureStderr();
        auto r = Runtime::start(withCarriers(2));
        logged = testing::internal::GetCapturedStderr();
        ASSERT_TRUE(r) << r.error().message();
        rt.emplace(std::move(*r));
    }
    EXPECT_NE(logged.find("io_uring_register_files_sparse(1024 slots)"), std::string::npos) << logged;
    EXPECT_NE(logged.find(std::strerror(EMFILE)), std::string::npos) << logged;
    for (const auto& s : rt->stats()) { EXPECT_FALSE(s.fixedFilesRegistered); }

    const Counts before(*rt);
    runOn(*rt, 0, [&] {
        EXPECT_EQ(registerFile(-1).errorCode(), EBADF) << "bad descriptors are refused in the fallback too";
        const int dup = ::dup(file.fd);
        auto f = registerFile(dup);
        ASSERT_TRUE(f) << f.error().message();
        EXPECT_FALSE(f->registered());
        EXPECT_EQ(f->slot(), -1);
        const auto fresh = pattern(3000, 8);
        ASSERT_EQ(write(*f, fresh.data(), fresh.size(), 0).value(), fresh.size());
        std::vector<char> back(fresh.size());
        ASSERT_EQ(read(*f, back.data(), back.size(), 0).value(), back.size());
        EXPECT_EQ(back, fresh);
        ASSERT_TRUE(f->close());
        EXPECT_FALSE(isOpen(dup));
    });
    const Counts after(*rt);
    EXPECT_EQ(after.fileFallback(0) - before.fileFallback(0), 2u);
    EXPECT_EQ(after.fileIo(0), before.fileIo(0));
}

TEST_F(FixedIoTest, DeadlinesApplyToFixedCalls) {
    int p[2];
    ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
    on(0, [&] {
        auto f = registerFile(p[0]).value();  // owns the read end now
        auto b = acquireFixedBuffer().value();
        using namespace std::chrono_literals;
        EXPECT_EQ(read(f, b, 0, 16, kCurrentPosition, Deadline(20ms)).errorCode(), ETIMEDOUT);
        EXPECT_EQ(read_fixed(f.fd(), b, 0, 16, kCurrentPosition, Deadline(20ms)).errorCode(), ETIMEDOUT);
        ASSERT_EQ(::write(p[1], "hello", 5), 5);
        auto r = read(f, b, 0, 16, kCurrentPosition, Deadline(10s));
        ASSERT_TRUE(r) << r.error().message();
        ASSERT_EQ(*r, 5u);
        EXPECT_EQ(std::memcmp(b.data(), "hello", 5), 0);
    }).join();
    ::close(p[1]);
}

}  // namespace
}  // namespace spindle
