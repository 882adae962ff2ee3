// SPDX-License-Identifier: Apache-2.0
// spindle-kv's write-ahead log: CRC32C, framing, recovery of a torn tail cut at every byte of the last
// record, refusal on a flipped bit in the middle, shard records replayed into the same keyspace, group
// commit (concurrent writers share fdatasyncs), and a failing fdatasync that stops acknowledgements.
#include "apps/kv/wal.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "apps/kv/shard.h"
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
    // A tail of zeros (blocks the crash left unwritten) is torn too.
    std::string zeros = log.substr(0, goodPrefix) + std::string(4096, '\0');
    ScanReport r;
    EXPECT_EQ(payloadsOf(zeros, &r).size(), 5u);
    EXPECT_FALSE(r.corruptInMiddle);
    EXPECT_EQ(r.droppedBytes, 4096u);
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

}  // namespace
}  // namespace spindle::kv
