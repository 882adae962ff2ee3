// SPDX-License-Identifier: Apache-2.0
// spindle-kv's write-ahead log: CRC32C, framing, recovery of a torn tail cut at every byte of the last
// record, refusal on a flipped bit in the middle, a zero tail read as the clean end, shard records
// replayed into the same keyspace, group commit (concurrent writers share fdatasyncs), a failing
// fdatasync that stops acknowledgements, and preallocation (zeros written ahead, truncated at stop,
// appends at the logical end after a reopen, a failed extension failing the log).
#include "apps/kv/wal.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "apps/kv/shard.h"
#include "base/inject.h"
#include "core/fiber.h"
#include "core/io.h"
#include "core/runtime.h"
#include "tests/core/with_runtime.h"

namespace spindle::kv {
namespace {

std::vector<std::string> payloadsOf(std::string_view log, ScanReport* report = nullptr) {
    std::vector<std::string> out;
    const ScanReport r = scanLog(log, [&](std::string_view p) {
        out.emplace_back(p);
        return true;
    });
    if (report != nullptr) { *report = r; }
    return out;
}

TEST(Wal, Crc32cIsCastagnoli) {
    EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);  // the check value of CRC-32C
    EXPECT_EQ(crc32c("", 0), 0u);
}

TEST(Wal, RecordsRoundTrip) {
    std::string log;
    for (int i = 0; i < 50; ++i) { frameRecord(log, std::string(static_cast<size_t>(i), static_cast<char>('a' + i % 26))); }
    frameRecord(log, std::string("\0\r\n", 3));
    ScanReport r;
    const auto got = payloadsOf(log, &r);
    ASSERT_EQ(got.size(), 51u);
    EXPECT_EQ(got[7], std::string(7, 'h'));
    EXPECT_EQ(got[50], std::string("\0\r\n", 3));
    EXPECT_EQ(r.validBytes, log.size());
    EXPECT_EQ(r.droppedBytes, 0u);
    EXPECT_FALSE(r.corruptInMiddle);
}

TEST(Wal, TornTailAtEveryByteOfTheLastRecordDropsOnlyIt) {
    std::string log;
    for (int i = 0; i < 5; ++i) { frameRecord(log, "record-" + std::to_string(i)); }
    const size_t goodPrefix = log.size();
    frameRecord(log, "the last record, torn");
    for (size_t cut = goodPrefix; cut < log.size(); ++cut) {
        ScanReport r;
        const auto got = payloadsOf(std::string_view(log).substr(0, cut), &r);
        ASSERT_EQ(got.size(), 5u) << cut;
        EXPECT_EQ(r.validBytes, goodPrefix) << cut;
        EXPECT_EQ(r.droppedBytes, cut - goodPrefix) << cut;
        EXPECT_FALSE(r.corruptInMiddle) << cut;
    }
    // Followed by zeros (the preallocated tail the crash left), the torn record is still a torn tail,
    // and the zeros go with it.
    for (size_t cut = goodPrefix + 1; cut < log.size(); ++cut) {
        ScanReport r;
        const std::string torn = log.substr(0, cut) + std::string(4096, '\0');
        ASSERT_EQ(payloadsOf(torn, &r).size(), 5u) << cut;
        EXPECT_EQ(r.droppedBytes, cut - goodPrefix + 4096) << cut;
        EXPECT_EQ(r.zeroTail, 0u) << cut;
        EXPECT_FALSE(r.corruptInMiddle) << cut;
    }
    // A whole header whose payload's blocks never made it (zeros where the payload was): torn.
    std::string headerOnly = log;
    std::fill(headerOnly.begin() + static_cast<std::ptrdiff_t>(goodPrefix + kRecordHeader), headerOnly.end(), '\0');
    ScanReport r;
    EXPECT_EQ(payloadsOf(headerOnly + std::string(100, '\0'), &r).size(), 5u);
    EXPECT_EQ(r.droppedBytes, log.size() - goodPrefix + 100);
}

// Zeros at a record boundary up to the end of the file are the preallocated tail: the clean end,
// whatever their length (shorter than a header too), with nothing dropped.
TEST(Wal, AZeroTailIsTheCleanEnd) {
    std::string log;
    for (int i = 0; i < 5; ++i) { frameRecord(log, "record-" + std::to_string(i)); }
    for (size_t zeros : {size_t{1}, size_t{7}, kRecordHeader - 1, kRecordHeader, size_t{4096}, size_t{(1 << 20) + 3}}) {
        ScanReport r;
        const auto got = payloadsOf(log + std::string(zeros, '\0'), &r);
        ASSERT_EQ(got.size(), 5u) << zeros;
        EXPECT_EQ(got[4], "record-4");
        EXPECT_EQ(r.validBytes, log.size()) << zeros;
        EXPECT_EQ(r.zeroTail, zeros) << zeros;
        EXPECT_EQ(r.droppedBytes, 0u) << zeros;
        EXPECT_FALSE(r.corruptInMiddle) << zeros;
    }
    ScanReport r;
    EXPECT_TRUE(payloadsOf(std::string(8192, '\0'), &r).empty());  // a preallocated log with no record yet
    EXPECT_EQ(r.zeroTail, 8192u);
    EXPECT_EQ(r.droppedBytes, 0u);
    // One non-zero byte anywhere after the zeros makes them damage, not the end.
    std::string dirty = log + std::string(4096, '\0');
    dirty[log.size() + 3000] = 1;
    EXPECT_EQ(payloadsOf(dirty, &r).size(), 5u);
    EXPECT_EQ(r.zeroTail, 0u);
    EXPECT_EQ(r.droppedBytes, 4096u);
    EXPECT_FALSE(r.corruptInMiddle);
    // Zeros followed by a valid record are a hole in the middle: corruption, not the end.
    std::string hole = log + std::string(kRecordHeader, '\0');
    frameRecord(hole, "after the hole");
    EXPECT_EQ(payloadsOf(hole, &r).size(), 5u);
    EXPECT_TRUE(r.corruptInMiddle);
    EXPECT_EQ(r.droppedRecords, 1u);
}

// The framing invariant behind the zero tail (wal.h): no valid record starts with a zero header, not
// even one of zero length.
TEST(Wal, NoRecordHeaderIsAllZero) {
    EXPECT_EQ(crc32c(std::string(4, '\0').data(), 4), kZeroLengthHeaderCrc);
    std::string empty;
    frameRecord(empty, "");
    ASSERT_EQ(empty.size(), kRecordHeader);
    EXPECT_NE(empty, std::string(kRecordHeader, '\0'));
    ScanReport r;
    EXPECT_EQ(payloadsOf(empty + std::string(64, '\0'), &r).size(), 1u);
    EXPECT_EQ(r.validBytes, kRecordHeader);
    EXPECT_EQ(r.zeroTail, 64u);
}

TEST(Wal, FlippedBitInTheMiddleIsCorruptionNotATail) {
    std::string log;
    for (int i = 0; i < 6; ++i) { frameRecord(log, "record number " + std::to_string(i)); }
    const size_t recordSize = log.size() / 6;
    // A bit in the payload of record 2, then one in the length field of record 3.
    for (size_t at : {2 * recordSize + kRecordHeader + 3, 3 * recordSize + 1}) {
        std::string bad = log;
        bad[at] = static_cast<char>(bad[at] ^ 0x10);
        ScanReport r;
        const auto got = payloadsOf(bad, &r);
        EXPECT_EQ(got.size(), at / recordSize) << at;
        EXPECT_TRUE(r.corruptInMiddle) << at;
        EXPECT_EQ(r.badOffset, (at / recordSize) * recordSize);
    }
}

class WalLog : public spindle::testing_support::WithRuntime {};

// scanLogFile, chunk by chunk, reports what scanLog reports on the whole file: records that straddle
// chunks, records bigger than a chunk, torn tails at every cut, and a corruption in the middle.
TEST_F(WalLog, ChunkedScanOfAFileMatchesTheWholeScan) {
    std::string log;
    for (int i = 0; i < 40; ++i) { frameRecord(log, std::string(static_cast<size_t>(i * 37 % 300), static_cast<char>('a' + i % 26))); }
    frameRecord(log, std::string(20000, 'B'));  // bigger than any chunk below
    for (int i = 0; i < 5; ++i) { frameRecord(log, "after the big one " + std::to_string(i)); }
    spindle::testing_support::ScratchDir scratch;
    ASSERT_TRUE(scratch.ok());
    const int fd = ::open(scratch.path("scan.log").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    ASSERT_GE(fd, 0);
    auto check = [&](const std::string& bytes, size_t chunk) {
        ASSERT_EQ(::ftruncate(fd, 0), 0);
        ASSERT_EQ(::pwrite(fd, bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
        std::vector<std::string> whole, chunked;
        const ScanReport a = scanLog(bytes, [&](std::string_view p) {
            whole.emplace_back(p);
            return true;
        });
        int expectCalls = 0;
        size_t prefetched = 0, prefetched1 = 0;
        uint64_t expected = 0;
        auto b = onFiber([&] {
            return scanLogFile(
                fd,
                [&](std::string_view p) {
                    chunked.emplace_back(p);
                    return true;
                },
                chunk,
                [&](uint64_t n) {
                    ++expectCalls;
                    expected = n;
                },
                [&](std::string_view p, int stage) {
                    // Each record is announced twice (stage 0, then 1, batch by batch) before it is applied (and
                    // a bad one may be announced only).
                    size_t& k = stage == 0 ? prefetched : prefetched1;
                    ASSERT_LE(prefetched1, prefetched);
                    EXPECT_EQ(p, (whole.size() > k ? std::string_view(whole[k]) : p));
                    ++k;
                });
        });
        EXPECT_GE(prefetched, chunked.size());
        EXPECT_EQ(prefetched1, prefetched);
        EXPECT_LE(expectCalls, 1);
        if (expectCalls == 1) { EXPECT_LT(expected, 100'000u); }  // a guess from the first chunk, not a wild one
        ASSERT_TRUE(b) << b.error().message();
        EXPECT_EQ(chunked, whole);
        EXPECT_EQ(b->records, a.records);
        EXPECT_EQ(b->validBytes, a.validBytes);
        EXPECT_EQ(b->droppedBytes, a.droppedBytes);
        EXPECT_EQ(b->corruptInMiddle, a.corruptInMiddle);
        EXPECT_EQ(b->droppedRecords, a.droppedRecords);
        EXPECT_EQ(b->zeroTail, a.zeroTail);
    };
    for (size_t chunk : {size_t{4096}, size_t{5000}, size_t{1} << 20}) {
        SCOPED_TRACE(chunk);
        check(log, chunk);
        for (size_t cut = log.size() - 40; cut < log.size(); ++cut) { check(log.substr(0, cut), chunk); }
        check(log.substr(0, 9000), chunk);  // inside the big record
        check("", chunk);
        check(log.substr(0, 7), chunk);
        std::string bad = log;
        bad[300] = static_cast<char>(bad[300] ^ 1);
        check(bad, chunk);
        check(log + std::string(3 * chunk + 5, '\0'), chunk);            // a zero tail longer than a chunk
        check(log.substr(0, log.size() - 3) + std::string(100, '\0'), chunk);  // a torn record, then zeros
    }
    ::close(fd);
}

TEST_F(WalLog, ShardMutationsReplayIntoTheSameKeyspace) {
    char path[] = "/tmp/spindle-kv-wal-XXXXXX";
    const int fd = ::mkstemp(path);
    ASSERT_GE(fd, 0);
    auto log = ShardLog::start(rt(), 0, fd, 0, Fsync::kNo);
    ASSERT_TRUE(log) << log.error().message();
    Shard shard(0);
    shard.attachLog(log->get());
    const int64_t later = nowMs() + 100'000;
    ASSERT_TRUE(rt().runOnCarrier(0, [&]() noexcept {
        shard.set("a", "1", 0);
        shard.set("b", "2", 0);
        shard.expireAt("b", later);
        shard.set("c", std::string("\0\r\n", 3), 0);
        shard.set("gone", "x", 1000);  // long past
        shard.set("kept", "ttl", later);
        (void)shard.persist("kept");
        (void)shard.del("a");
        shard.set("old", "v", 0);
        shard.flush();
        shard.set("a", "after flush", 0);
        shard.set("b", "2", later);
    }));
    EXPECT_EQ(shard.lastSeq(), 12u);
    ASSERT_EQ((*log)->stop(), 0);
    shard.attachLog(nullptr);
    const int rfd = ::open(path, O_RDONLY | O_CLOEXEC);
    ::unlink(path);
    ASSERT_GE(rfd, 0);
    std::string bytes(1 << 16, '\0');
    const ssize_t n = ::read(rfd, bytes.data(), bytes.size());
    ::close(rfd);
    ASSERT_GT(n, 0);
    bytes.resize(static_cast<size_t>(n));
    Shard replayed(0);
    const ScanReport r = scanLog(bytes, [&](std::string_view p) { return replayed.replay(p); });
    EXPECT_EQ(r.records, 12u);
    EXPECT_EQ(r.droppedBytes, 0u);
    const int64_t now = nowMs();
    EXPECT_EQ(replayed.keyCount(), 2u);
    ASSERT_NE(replayed.find("a", now), nullptr);
    EXPECT_EQ(replayed.find("a", now)->value(), "after flush");
    ASSERT_NE(replayed.find("b", now), nullptr);
    EXPECT_EQ(replayed.find("b", now)->expireAtMs, later);
    EXPECT_EQ(replayed.find("old", now), nullptr);
    // A record this version did not write stops the replay there.
    std::string junk;
    frameRecord(junk, "\x09garbage");
    EXPECT_EQ(scanLog(junk, [&](std::string_view p) { return replayed.replay(p); }).records, 0u);
}

TEST_F(WalLog, ConcurrentWritersShareFdatasyncs) {
    char path[] = "/tmp/spindle-kv-wal-XXXXXX";
    const int fd = ::mkstemp(path);
    ASSERT_GE(fd, 0);
    ::unlink(path);
    auto log = ShardLog::start(rt(), 0, fd, 0, Fsync::kAlways);
    ASSERT_TRUE(log) << log.error().message();
    ShardLog* l = log->get();
    constexpr int kWriters = 32, kEach = 20;
    std::vector<FiberHandle<void>> writers;
    std::atomic<int> acknowledged{0};
    for (int w = 0; w < kWriters; ++w) {
        writers.push_back(on(w % 2, [&, w] {
            for (int i = 0; i < kEach; ++i) {
                uint64_t seq = 0;
                ASSERT_TRUE(rt().runOnCarrier(0, [&]() noexcept { seq = l->append("writer " + std::to_string(w)); }));
                ASSERT_EQ(l->waitDurable(seq), 0);
                acknowledged.fetch_add(1);
            }
        }));
    }
    for (auto& w : writers) { w.join(); }
    EXPECT_EQ(acknowledged.load(), kWriters * kEach);
    const LogStats st = l->stats();
    EXPECT_EQ(st.records, static_cast<uint64_t>(kWriters * kEach));
    EXPECT_EQ(st.syncedRecords, st.records);
    EXPECT_LT(st.syncs, st.records) << "no two writers ever shared a sync";
    EXPECT_EQ(l->stop(), 0);
}

TEST_F(WalLog, FailedFdatasyncStopsAcknowledging) {
    // fdatasync on a pipe fails with EINVAL after the write went through (io_uring: a write at an
    // offset into a pipe ignores the offset). The epoll driver's pwrite(2) refuses a pipe at once
    // (ESPIPE), which is the write-failure path: either way nothing is acknowledged.
    int p[2];
    ASSERT_EQ(::pipe2(p, O_CLOEXEC | O_NONBLOCK), 0);
    auto log = ShardLog::start(rt(), 1, p[1], 0, Fsync::kAlways);
    ASSERT_TRUE(log) << log.error().message();
    ShardLog* l = log->get();
    int err = 0;
    onFiber([&] {
        uint64_t seq = 0;
        ASSERT_TRUE(rt().runOnCarrier(1, [&]() noexcept { seq = l->append("never durable"); }));
        err = l->waitDurable(seq);
        EXPECT_TRUE(err == EINVAL || err == ESPIPE) << std::strerror(err);
        EXPECT_EQ(l->failed(), err);
        // Later records are not acknowledged either (the shard refuses writes; the log reports them).
        ASSERT_TRUE(rt().runOnCarrier(1, [&]() noexcept { seq = l->append("after the failure"); }));
        EXPECT_EQ(l->waitDurable(seq), err);
    });
    EXPECT_EQ(l->stats().syncs, 0u);
    EXPECT_EQ(l->stop(), err);
    ::close(p[0]);
}

TEST_F(WalLog, WriteErrorStopsAcknowledgingInEveryMode) {
    for (Fsync mode : {Fsync::kAlways, Fsync::kEverySec, Fsync::kNo}) {
        const int fd = ::open("/dev/full", O_WRONLY | O_CLOEXEC);
        if (fd < 0) { GTEST_SKIP() << "no /dev/full"; }
        auto log = ShardLog::start(rt(), 0, fd, 0, mode);
        ASSERT_TRUE(log) << log.error().message();
        ShardLog* l = log->get();
        onFiber([&] {
            uint64_t seq = 0;
            ASSERT_TRUE(rt().runOnCarrier(0, [&]() noexcept { seq = l->append("no space"); }));
            if (mode == Fsync::kAlways) {
                EXPECT_EQ(l->waitDurable(seq), ENOSPC);
            } else {
                // Acknowledged at once, as Redis does; once the write failed, the log says so.
                while (l->failed() == 0) { (void)spindle::sleep(std::chrono::milliseconds(1)); }
                EXPECT_EQ(l->failed(), ENOSPC);
            }
        });
        EXPECT_EQ(l->stop(), ENOSPC);
    }
}

// The whole file at `path`.
std::string fileBytes(const std::string& path) {
    std::string out;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) { return out; }
    char buf[65536];
    for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) { out.append(buf, static_cast<size_t>(n)); }
    ::close(fd);
    return out;
}

uint64_t fileSize(int fd) {
    struct stat st{};
    return ::fstat(fd, &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

// With preallocation the file runs ahead of the log with zeros that read as its clean end; the first
// batches are appends (the zeros start a quarter step after the first one, so that nothing waits for
// them), the ones after land in the zeros, and stop() truncates the zeros.
TEST_F(WalLog, PreallocationWritesZerosAheadAndStopTruncatesThem) {
    spindle::testing_support::ScratchDir scratch;
    ASSERT_TRUE(scratch.ok());
    const std::string path = scratch.path("shard.log");
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    ASSERT_GE(fd, 0);
    constexpr uint64_t kStep = 64 * 1024;
    auto log = ShardLog::start(rt(), 0, fd, 0, Fsync::kAlways, kStep);
    ASSERT_TRUE(log) << log.error().message();
    ShardLog* l = log->get();
    auto appendDurably = [&](const std::string& payload) {
        onFiber([&] {
            uint64_t seq = 0;
            ASSERT_TRUE(rt().runOnCarrier(0, [&]() noexcept { seq = l->append(payload); }));
            ASSERT_EQ(l->waitDurable(seq), 0);
        });
    };
    appendDurably("the first record: appended past the (empty) file's end");
    EXPECT_EQ(l->stats().appendedPastEnd, 1u);
    for (int i = 0; i < 10'000 && l->stats().preallocated == 0; ++i) { onFiber([] { (void)spindle::sleep(std::chrono::milliseconds(1)); }); }
    ASSERT_GE(l->stats().preallocated, kStep);
    for (int i = 0; i < 20; ++i) { appendDurably(std::string(1000, 'h')); }  // past the quarter-step hole
    const uint64_t outside = l->stats().appendedPastEnd;
    EXPECT_GE(outside, 2u);
    for (int i = 0; i < 100; ++i) { appendDurably(std::string(100, static_cast<char>('a' + i % 26))); }  // < kStep
    EXPECT_EQ(l->stats().appendedPastEnd, outside) << "a batch went past the zeros made for it";
    EXPECT_GE(fileSize(fd), l->size() + kStep / 2);
    ScanReport r;
    const auto running = payloadsOf(fileBytes(path), &r);
    EXPECT_EQ(running.size(), 121u);
    EXPECT_EQ(r.validBytes, l->size());
    EXPECT_EQ(r.droppedBytes, 0u);
    EXPECT_GT(r.zeroTail, 0u);
    const uint64_t logical = l->size();
    EXPECT_EQ(l->stats().bytes, logical) << "bytes counts records, not zeros";
    ASSERT_EQ(l->stop(), 0);
    const std::string after = fileBytes(path);
    EXPECT_EQ(after.size(), logical);
    EXPECT_EQ(payloadsOf(after, &r).size(), 121u);
    EXPECT_EQ(r.zeroTail, 0u);
}

// A log that a crash left with a zero tail is reopened at its logical end (what the scan found),
// with and without preallocation: the new records follow the old ones, with no hole, and nothing is
// dropped by the next scan.
TEST_F(WalLog, AReopenedLogAppendsAtItsLogicalEnd) {
    for (uint64_t step : {uint64_t{0}, uint64_t{64 * 1024}}) {
        SCOPED_TRACE(step);
        spindle::testing_support::ScratchDir scratch;
        ASSERT_TRUE(scratch.ok());
        const std::string path = scratch.path("shard.log");
        std::string crashed;
        for (int i = 0; i < 3; ++i) { frameRecord(crashed, "before the crash " + std::to_string(i)); }
        const uint64_t logical = crashed.size();
        crashed.append(10'000, '\0');
        const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        ASSERT_GE(fd, 0);
        ASSERT_EQ(::pwrite(fd, crashed.data(), crashed.size(), 0), static_cast<ssize_t>(crashed.size()));
        auto scan = onFiber([&] { return scanLogFile(fd, [](std::string_view) { return true; }); });
        ASSERT_TRUE(scan);
        EXPECT_EQ(scan->validBytes, logical);
        EXPECT_EQ(scan->zeroTail, 10'000u);
        EXPECT_EQ(scan->droppedBytes, 0u);
        auto log = ShardLog::start(rt(), 1, fd, scan->validBytes, Fsync::kAlways, step);
        ASSERT_TRUE(log) << log.error().message();
        ShardLog* l = log->get();
        EXPECT_EQ(l->size(), logical);
        onFiber([&] {
            for (int i = 0; i < 2; ++i) {
                uint64_t seq = 0;
                ASSERT_TRUE(rt().runOnCarrier(1, [&]() noexcept { seq = l->append("after the restart " + std::to_string(i)); }));
                ASSERT_EQ(l->waitDurable(seq), 0);
            }
        });
        EXPECT_EQ(l->stats().appendedPastEnd, 0u) << "the crash's zeros were room enough";
        ScanReport r;
        auto got = payloadsOf(fileBytes(path), &r);
        ASSERT_EQ(got.size(), 5u);
        EXPECT_EQ(got[2], "before the crash 2");
        EXPECT_EQ(got[3], "after the restart 0");
        EXPECT_EQ(r.droppedBytes, 0u);
        EXPECT_EQ(r.validBytes, l->size());
        ASSERT_EQ(l->stop(), 0);
        EXPECT_EQ(fileBytes(path).size(), r.validBytes);
    }
}

// Writers outrunning a tiny step: batches wait for the extension under way or go past the end, and
// never into the range being zeroed (a record overwritten by zeros would end the scan early).
TEST_F(WalLog, WritersOutrunningATinyStepLoseNothing) {
    for (Fsync mode : {Fsync::kAlways, Fsync::kNo}) {
        spindle::testing_support::ScratchDir scratch;
        ASSERT_TRUE(scratch.ok());
        const std::string path = scratch.path("shard.log");
        const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        ASSERT_GE(fd, 0);
        auto log = ShardLog::start(rt(), 0, fd, 0, mode, /*preallocate=*/4096);
        ASSERT_TRUE(log) << log.error().message();
        ShardLog* l = log->get();
        constexpr int kWriters = 16, kEach = 40;
        std::vector<FiberHandle<void>> writers;
        for (int w = 0; w < kWriters; ++w) {
            writers.push_back(on(w % 2, [&, w] {
                for (int i = 0; i < kEach; ++i) {
                    uint64_t seq = 0;
                    // From a few bytes to more than a step.
                    const std::string payload = std::to_string(w) + ":" + std::to_string(i) + ":" +
                                                std::string(static_cast<size_t>((w * 131 + i * 977) % 6000), 'x');
                    ASSERT_TRUE(rt().runOnCarrier(0, [&]() noexcept { seq = l->append(payload); }));
                    ASSERT_EQ(l->waitDurable(seq), 0);
                }
            }));
        }
        for (auto& w : writers) { w.join(); }
        ASSERT_EQ(l->stop(), 0);  // with kNo the writer may still be writing: stop() waits for it
        EXPECT_GT(l->stats().preallocated, 0u);
        ScanReport r;
        const auto got = payloadsOf(fileBytes(path), &r);
        EXPECT_EQ(got.size(), static_cast<size_t>(kWriters * kEach));
        EXPECT_EQ(r.droppedBytes, 0u);
        EXPECT_EQ(r.zeroTail, 0u);
        std::vector<int> next(kWriters, 0);  // each writer's records in its order
        for (const auto& p : got) {
            const int w = std::atoi(p.c_str());
            ASSERT_EQ(std::atoi(p.c_str() + p.find(':') + 1), next[static_cast<size_t>(w)]++) << p.substr(0, 20);
        }
    }
}

// A preallocation whose write or fdatasync fails puts the log in the failed state as a failed batch
// does: nothing after it is acknowledged, the errno is reported, and what was acknowledged before is
// in the file.
TEST_F(WalLog, AFailedPreallocationFailsTheLog) {
#if !defined(SPINDLE_FAULT_INJECTION)
    GTEST_SKIP() << "built without SPINDLE_FAULT_INJECTION";
#endif
    for (uint32_t skip : {0u, 1u}) {  // the extension's write, then its fdatasync
        SCOPED_TRACE(skip == 0 ? "write" : "fdatasync");
        spindle::testing_support::ScratchDir scratch;
        ASSERT_TRUE(scratch.ok());
        const std::string path = scratch.path("shard.log");
        const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        ASSERT_GE(fd, 0);
        auto log = ShardLog::start(rt(), 0, fd, 0, Fsync::kAlways, 64 * 1024);
        ASSERT_TRUE(log) << log.error().message();
        ShardLog* l = log->get();
        inject::ArmedFault fault(inject::Point::kLogExtend, ENOSPC, 1, skip);
        std::vector<std::string> acknowledged;
        onFiber([&] {
            auto put = [&](const std::string& payload) {
                uint64_t seq = 0;
                EXPECT_TRUE(rt().runOnCarrier(0, [&]() noexcept { seq = l->append(payload); }));
                const int err = l->waitDurable(seq);
                if (err == 0) { acknowledged.push_back(payload); }
                return err;
            };
            // The first batch asks for the extension, and may be synced before the extension fails.
            const int first = put("first");
            EXPECT_TRUE(first == 0 || first == ENOSPC) << std::strerror(first);
            for (int i = 0; i < 10'000 && l->failed() == 0; ++i) { (void)spindle::sleep(std::chrono::milliseconds(1)); }
            EXPECT_EQ(l->failed(), ENOSPC);
            EXPECT_EQ(put("after the failure"), ENOSPC);
        });
        EXPECT_EQ(inject::remaining(inject::Point::kLogExtend), 0u);
        EXPECT_EQ(l->stop(), ENOSPC);
        ScanReport r;
        const auto got = payloadsOf(fileBytes(path), &r);
        EXPECT_EQ(std::vector<std::string>(got.begin(), got.begin() + static_cast<std::ptrdiff_t>(acknowledged.size())),
                  acknowledged);
        EXPECT_EQ(r.droppedBytes, 0u);
    }
}

}  // namespace
}  // namespace spindle::kv
