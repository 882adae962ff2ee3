// SPDX-License-Identifier: Apache-2.0
// spindle-kv when its write-ahead log fails (base/inject.h's kLogWrite and kLogSync points, ENOSPC and
// EIO): with appendfsync always the write is never acknowledged and gets -MISCONF, the connection
// closes, later writes on that shard get -MISCONF, reads keep working, INFO says so, and after a
// restart every acknowledged write is there; with everysec the write is acknowledged at once (as
// Redis does) and the writes after the failure are refused; FLUSHALL is refused whole. Recovery: a log cut at every byte of its
// last record comes back without that record; a flipped bit in the middle refuses to start and says
// what --truncate-corrupt-log would drop, which then starts and reports it. Preallocation: a failed
// extension fails the log as a failed batch does; a zero tail (what a crash leaves of the preallocated
// zeros) is the clean end, and a torn record followed by zeros is still a torn tail.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "apps/kv/rewrite.h"
#include "apps/kv/shard.h"
#include "apps/kv/wal.h"
#include "base/inject.h"
#include "tests/kv/server_fixture.h"

namespace spindle::kv {
namespace {

using namespace std::chrono_literals;
using testing_support::dumpKeyspace;
using testing_support::infoField;
using testing_support::RespClient;

const std::string kOk = "+OK\r\n";

// Keys of shard `shard` (of 2): the test's runtime has two carriers, so two shards.
std::vector<std::string> keysOfShard(unsigned shard, size_t n, const std::string& prefix) {
    std::vector<std::string> out;
    for (int i = 0; out.size() < n; ++i) {
        std::string k = prefix + std::to_string(1000 + i);  // one width: records of one size
        if (keyHash(k) % 2 == shard) { out.push_back(std::move(k)); }
    }
    return out;
}

std::string misconf(int err) { return std::string("-MISCONF Errors writing to the AOF file: ") + std::strerror(err) + "\r\n"; }

class KvLogFault : public testing_support::KvServerFixture {
protected:
    void SetUp() override {
        SPINDLE_SKIP_WITHOUT_FAULT_INJECTION();
        KvServerFixture::SetUp();
    }
    void TearDown() override {
        inject::disarm(inject::Point::kLogWrite);
        inject::disarm(inject::Point::kLogSync);
        inject::disarm(inject::Point::kLogExtend);
        KvServerFixture::TearDown();
    }
};

TEST_F(KvLogFault, AFailedWriteOrSyncIsNeverAcknowledgedAndNothingAcknowledgedIsLost) {
    for (inject::Point point : {inject::Point::kLogWrite, inject::Point::kLogSync}) {
        for (int err : {ENOSPC, EIO}) {
            SCOPED_TRACE(std::string(point == inject::Point::kLogWrite ? "write " : "fdatasync ") + std::strerror(err));
            std::filesystem::remove_all(dir_);
            std::filesystem::create_directory(dir_);
            startServer(withDir(Fsync::kAlways));
            const auto keys = keysOfShard(0, 21, "k");
            const auto other = keysOfShard(1, 2, "o");
            {
                RespClient c(port_);
                for (size_t i = 0; i < 20; ++i) { ASSERT_EQ(c.call({"SET", keys[i], "v" + std::to_string(i)}), kOk); }
                ASSERT_EQ(c.call({"SET", other[0], "o"}), kOk);
                inject::arm(point, err, 1);
                EXPECT_EQ(c.call({"SET", keys[20], "never acknowledged"}), misconf(err));
                EXPECT_TRUE(c.closedByPeer());
                EXPECT_EQ(inject::remaining(point), 0u);
            }
            {
                RespClient c(port_);
                EXPECT_EQ(c.call({"GET", keys[3]}), "$2\r\nv3\r\n");        // reads work
                EXPECT_EQ(c.call({"SET", keys[3], "no"}), misconf(err));     // writes to that shard are refused
                EXPECT_EQ(c.call({"DEL", keys[4]}), misconf(err));
                EXPECT_EQ(c.call({"GET", keys[4]}), "$2\r\nv4\r\n");
                EXPECT_EQ(c.call({"SET", other[1], "o"}), kOk);             // the other shard's log is fine
                EXPECT_EQ(infoField(port_, "persistence", "aof_last_write_status"), "err");
            }
            server_.reset();
            startServer(withDir(Fsync::kAlways));
            RespClient c(port_);
            for (size_t i = 0; i < 20; ++i) {
                EXPECT_EQ(c.call({"GET", keys[i]}), "$" + std::to_string(std::to_string(i).size() + 1) + "\r\nv" + std::to_string(i) + "\r\n");
            }
            EXPECT_EQ(c.call({"GET", other[1]}), "$1\r\no\r\n");
            if (point == inject::Point::kLogWrite) { EXPECT_EQ(c.call({"GET", keys[20]}), "$-1\r\n"); }
            EXPECT_EQ(c.call({"SET", keys[3], "writable again"}), kOk);
            server_.reset();
        }
    }
}

// FLUSHALL with one shard's log failed is refused whole, as Redis refuses a write with MISCONF: the
// other shard, whose log works, keeps its keys (before the keyspace commands took whole shards, it
// was flushed and the command still answered MISCONF).
TEST_F(KvLogFault, AFlushallWithAFailedLogFlushesNothing) {
    startServer(withDir(Fsync::kAlways));
    const auto keys = keysOfShard(0, 2, "k");
    const auto other = keysOfShard(1, 1, "o");
    {
        RespClient c(port_);
        ASSERT_EQ(c.call({"SET", keys[0], "v"}), kOk);
        ASSERT_EQ(c.call({"SET", other[0], "o"}), kOk);
        inject::arm(inject::Point::kLogWrite, ENOSPC, 1);
        EXPECT_EQ(c.call({"SET", keys[1], "never acknowledged"}), misconf(ENOSPC));
        EXPECT_TRUE(c.closedByPeer());
    }
    RespClient c(port_);
    EXPECT_EQ(c.call({"FLUSHALL"}), misconf(ENOSPC));
    EXPECT_EQ(c.call({"GET", other[0]}), "$1\r\no\r\n");
    EXPECT_EQ(c.call({"GET", keys[0]}), "$1\r\nv\r\n");
    EXPECT_EQ(c.call({"DBSIZE"}), ":3\r\n");  // the refused SET stays in memory, as in Redis
}

TEST_F(KvLogFault, EverysecAcknowledgesAtOnceAndRefusesTheWritesAfterAFailure) {
    startServer(withDir(Fsync::kEverySec));
    const auto keys = keysOfShard(1, 3, "k");
    RespClient c(port_);
    const uint64_t before = logBytesOnDisk();
    ASSERT_EQ(c.call({"SET", keys[0], "durable"}), kOk);
    // everysec acknowledges before the record is written: the fault armed next must not meet it.
    for (int i = 0; i < 1000 && logBytesOnDisk() == before; ++i) { std::this_thread::sleep_for(1ms); }
    ASSERT_GT(logBytesOnDisk(), before) << "the first record never reached the log";
    inject::arm(inject::Point::kLogWrite, EIO, 1);
    EXPECT_EQ(c.call({"SET", keys[1], "acknowledged, then lost"}), kOk);  // Redis's everysec promise
    std::string r;
    for (int i = 0; i < 500 && r != misconf(EIO); ++i) {
        r = c.call({"SET", keys[2], "x"});
        std::this_thread::sleep_for(2ms);
    }
    EXPECT_EQ(r, misconf(EIO));
    EXPECT_EQ(c.call({"GET", keys[0]}), "$7\r\ndurable\r\n");
}

// Cuts shard 0's log at every byte of its last record: each start drops just that record, truncates
// the file to the good prefix and reports the bytes.
TEST_F(KvLogFault, ALogCutAtEveryByteOfItsLastRecordLosesOnlyThatRecord) {
    startServer(withDir(Fsync::kAlways));
    const auto keys = keysOfShard(0, 6, "k");
    {
        RespClient c(port_);
        for (const auto& k : keys) { ASSERT_EQ(c.call({"SET", k, "value of " + k}), kOk); }
    }
    server_.reset();
    const std::string path = shardLogPath(dir_, 0);
    std::string bytes;
    {
        std::ifstream in(path, std::ios::binary);
        bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    std::string lastPayload;
    const ScanReport whole = scanLog(bytes, [&](std::string_view p) {
        lastPayload = p;
        return true;
    });
    ASSERT_EQ(whole.records, 6u);
    const size_t lastStart = bytes.size() - kRecordHeader - lastPayload.size();
    for (size_t cut = lastStart; cut < bytes.size(); ++cut) {
        SCOPED_TRACE(cut);
        {
            std::ofstream out(path, std::ios::binary | std::ios::trunc);
            out.write(bytes.data(), static_cast<std::streamsize>(cut));
        }
        startServer(withDir(Fsync::kAlways));
        EXPECT_EQ(server_->stats().droppedTailBytes, cut - lastStart);
        EXPECT_EQ(server_->stats().replayedRecords, 5u);
        server_.reset();
        EXPECT_EQ(std::filesystem::file_size(path), lastStart);
    }
    startServer(withDir(Fsync::kAlways));
    RespClient c(port_);
    const std::string v4 = "value of " + keys[4];
    EXPECT_EQ(c.call({"GET", keys[4]}), "$" + std::to_string(v4.size()) + "\r\n" + v4 + "\r\n");
    EXPECT_EQ(c.call({"GET", keys[5]}), "$-1\r\n");
}

// The preallocation's write of zeros or its fdatasync failing: the writes after it get -MISCONF, as
// after a failed batch, and every write acknowledged before is there after a restart.
TEST_F(KvLogFault, AFailedPreallocationFailsTheLogAsAFailedBatchDoes) {
    for (uint32_t skip : {0u, 1u}) {  // the write of zeros, then the fdatasync
        SCOPED_TRACE(skip == 0 ? "write" : "fdatasync");
        std::filesystem::remove_all(dir_);
        std::filesystem::create_directory(dir_);
        startServer(withDir(Fsync::kAlways));
        const auto keys = keysOfShard(0, 200, "k");
        std::vector<std::string> acknowledged;
        {
            RespClient c(port_);
            inject::arm(inject::Point::kLogExtend, EIO, 1, skip);
            std::string r;
            for (size_t i = 0; i < keys.size(); ++i) {  // the first SET asks for the extension
                r = c.call({"SET", keys[i], "v"});
                if (r != kOk) { break; }
                acknowledged.push_back(keys[i]);
                std::this_thread::sleep_for(1ms);
            }
            EXPECT_EQ(r, misconf(EIO));
            EXPECT_EQ(inject::remaining(inject::Point::kLogExtend), 0u);
        }
        EXPECT_EQ(infoField(port_, "persistence", "aof_last_write_status"), "err");
        {
            RespClient c(port_);
            EXPECT_EQ(c.call({"SET", keys[0], "refused"}), misconf(EIO));
        }
        server_.reset();
        startServer(withDir(Fsync::kAlways));
        RespClient c(port_);
        for (const auto& k : acknowledged) { EXPECT_EQ(c.call({"GET", k}), "$1\r\nv\r\n") << k; }
        EXPECT_EQ(c.call({"SET", keys[0], "writable again"}), kOk);
        server_.reset();
    }
}

// Only appendfsync always preallocates (everysec and no would pay the zeros for little).
TEST_F(KvLogFault, OnlyAlwaysPreallocates) {
    for (Fsync mode : {Fsync::kEverySec, Fsync::kNo, Fsync::kAlways}) {
        SCOPED_TRACE(static_cast<int>(mode));
        std::filesystem::remove_all(dir_);
        std::filesystem::create_directory(dir_);
        startServer(withDir(mode));
        RespClient c(port_);
        ASSERT_EQ(c.call({"SET", "k", "v"}), kOk);
        std::string pre;
        for (int i = 0; i < 2000 && (pre = infoField(port_, "persistence", "aof_preallocated_bytes")) == "0"; ++i) {
            if (mode != Fsync::kAlways && i == 200) { break; }  // 200 ms: time enough for the extension
            std::this_thread::sleep_for(1ms);
        }
        if (mode == Fsync::kAlways) {
            EXPECT_EQ(pre, std::to_string(kDefaultPreallocate));
        } else {
            EXPECT_EQ(pre, "0");
        }
        server_.reset();
    }
}

// What a crash leaves of the preallocated zeros after the last record is the log's clean end: nothing
// dropped, the records there, new ones appended after them; a clean stop leaves no zeros. A torn
// record followed by zeros is a torn tail, dropped with the zeros.
TEST_F(KvLogFault, AZeroTailIsTheCleanEndAndATornRecordBeforeOneIsDropped) {
    startServer(withDir(Fsync::kAlways));
    const auto keys = keysOfShard(0, 8, "k");
    {
        RespClient c(port_);
        for (size_t i = 0; i < 6; ++i) { ASSERT_EQ(c.call({"SET", keys[i], "value of " + keys[i]}), kOk); }
    }
    server_.reset();
    const std::string path = shardLogPath(dir_, 0);
    auto read = [&] {
        std::ifstream in(path, std::ios::binary);
        return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    };
    const std::string clean = read();
    ScanReport rep = scanLog(clean, [](std::string_view) { return true; });
    ASSERT_EQ(rep.records, 6u);
    EXPECT_EQ(rep.zeroTail, 0u) << "a clean stop truncates the preallocated zeros";
    {
        std::ofstream out(path, std::ios::binary | std::ios::app);
        const std::string zeros(3 << 20, '\0');
        out.write(zeros.data(), static_cast<std::streamsize>(zeros.size()));
    }
    startServer(withDir(Fsync::kAlways));
    EXPECT_EQ(server_->stats().droppedTailBytes, 0u);
    EXPECT_EQ(server_->stats().replayedRecords, 6u);
    EXPECT_EQ(infoField(port_, "persistence", "aof_current_size"), std::to_string(clean.size()));
    {
        RespClient c(port_);
        for (size_t i = 6; i < 8; ++i) { ASSERT_EQ(c.call({"SET", keys[i], "value of " + keys[i]}), kOk); }
    }
    server_.reset();
    const std::string grown = read();
    rep = scanLog(grown, [](std::string_view) { return true; });
    EXPECT_EQ(rep.records, 8u);
    EXPECT_EQ(rep.validBytes, grown.size());
    EXPECT_EQ(grown.substr(0, clean.size()), clean) << "the new records follow the old ones";
    // Cut the last record in the middle (its end may be zero bytes already), and add zeros after it.
    const size_t lastRecord = (grown.size() - clean.size()) / 2;  // keys[6]'s and keys[7]'s: one size
    const size_t cut = lastRecord / 2;
    {
        std::ofstream out(path, std::ios::binary | std::ios::trunc);
        out.write(grown.data(), static_cast<std::streamsize>(grown.size() - cut));
        const std::string zeros(5000, '\0');
        out.write(zeros.data(), static_cast<std::streamsize>(zeros.size()));
    }
    startServer(withDir(Fsync::kAlways));
    EXPECT_EQ(server_->stats().droppedTailBytes, lastRecord - cut + 5000);
    EXPECT_EQ(server_->stats().replayedRecords, 7u);
    RespClient c(port_);
    EXPECT_EQ(c.call({"GET", keys[7]}), "$-1\r\n");
    const std::string v6 = "value of " + keys[6];
    EXPECT_EQ(c.call({"GET", keys[6]}), "$" + std::to_string(v6.size()) + "\r\n" + v6 + "\r\n");
}

TEST_F(KvLogFault, AFlippedBitInTheMiddleRefusesToStartAndTruncationReportsTheLoss) {
    startServer(withDir(Fsync::kAlways));
    const auto keys = keysOfShard(0, 10, "k");
    {
        RespClient c(port_);
        for (const auto& k : keys) { ASSERT_EQ(c.call({"SET", k, std::string(30, 'v')}), kOk); }
    }
    server_.reset();
    const std::string path = shardLogPath(dir_, 0);
    std::string bytes;
    {
        std::ifstream in(path, std::ios::binary);
        bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    const size_t record = bytes.size() / 10;
    bytes[4 * record + kRecordHeader + 5] ^= 0x04;  // in the payload of record 4 (of 0..9)
    {
        std::ofstream out(path, std::ios::binary | std::ios::trunc);
        out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    }
    const ScanReport rep = scanLog(bytes, [](std::string_view) { return true; });
    EXPECT_TRUE(rep.corruptInMiddle);
    EXPECT_EQ(rep.records, 4u);
    EXPECT_EQ(rep.droppedRecords, 5u);  // the valid ones after the damage
    auto refused = Server::start(rt(), withDir(Fsync::kAlways));
    ASSERT_FALSE(refused);
    EXPECT_EQ(refused.errorCode(), EILSEQ);
    EXPECT_EQ(std::filesystem::file_size(path), bytes.size()) << "a refused start must not touch the log";
    ServerOptions o = withDir(Fsync::kAlways);
    o.truncateCorrupt = true;
    startServer(o);
    EXPECT_EQ(server_->stats().droppedTailBytes, bytes.size() - 4 * record);
    EXPECT_EQ(server_->stats().droppedRecords, 5u);
    EXPECT_EQ(infoField(port_, "persistence", "aof_dropped_records"), "5");
    EXPECT_EQ(dumpKeyspace(port_).size(), 4u);
}

}  // namespace
}  // namespace spindle::kv
