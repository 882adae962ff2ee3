// SPDX-License-Identifier: Apache-2.0
// spindle-kv's log compaction in process: BGREWRITEAOF shrinks the logs and keeps the keyspace across a
// restart; rewrites back to back under concurrent writers (sets, deletes, expiries, appends) lose
// nothing; SAVE answers once its rewrite is done; the automatic rewrite and its CONFIG parameters; a
// rewrite that cannot write its file leaves the old log in use; a leftover <log>.rewrite is removed at
// start; the snapshot walk over a shard that rehashes between slices.
#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "apps/kv/rewrite.h"
#include "apps/kv/shard.h"
#include "base/inject.h"
#include "tests/kv/server_fixture.h"

namespace spindle::kv {
namespace {

using namespace std::chrono_literals;
using testing_support::awaitRewrites;
using testing_support::dumpKeyspace;
using testing_support::infoField;
using testing_support::Keyspace;
using testing_support::RespClient;

const std::string kOk = "+OK\r\n";

class KvRewrite : public testing_support::KvServerFixture {};

TEST_F(KvRewrite, BgrewriteaofShrinksTheLogsAndKeepsTheKeyspace) {
    startServer(withDir(Fsync::kNo));
    {
        RespClient c(port_);
        for (int round = 0; round < 30; ++round) {
            for (int k = 0; k < 100; ++k) {
                ASSERT_EQ(c.call({"SET", "key:" + std::to_string(k), std::string(40, 'a') + std::to_string(round)}), kOk);
            }
        }
        EXPECT_EQ(c.call({"PEXPIREAT", "key:1", "99999999999999"}), ":1\r\n");
        EXPECT_EQ(c.call({"SET", "bin", std::string("\0\r\nx", 4)}), kOk);
        EXPECT_EQ(c.call({"DEL", "key:2"}), ":1\r\n");
        EXPECT_EQ(c.call({"SET", "gone", "x", "PX", "1"}), kOk);  // expired before the snapshot
        // The expiry fiber removes it and logs a delete (the types work's rule for an expired key): let
        // that happen before the rewrite, so that afterwards the logs hold the snapshot and nothing else.
        for (int i = 0; i < 5000 && c.call({"DBSIZE"}) != ":100\r\n"; ++i) { std::this_thread::sleep_for(1ms); }
        ASSERT_EQ(c.call({"DBSIZE"}), ":100\r\n");
        EXPECT_EQ(infoField(port_, "persistence", "aof_rewrite_in_progress"), "0");
        EXPECT_EQ(c.call({"BGREWRITEAOF"}), "+Background append only file rewriting started\r\n");
    }
    const uint64_t before = std::stoull(infoField(port_, "persistence", "aof_bytes"));
    ASSERT_TRUE(awaitRewrites(port_, 2));  // one per shard
    EXPECT_EQ(infoField(port_, "persistence", "aof_last_bgrewrite_status"), "ok");
    const uint64_t after = std::stoull(infoField(port_, "persistence", "aof_current_size"));
    EXPECT_EQ(infoField(port_, "persistence", "aof_base_size"), std::to_string(after));
    EXPECT_LT(after * 10, before) << "the rewritten logs are not much smaller";
    const Keyspace ks = dumpKeyspace(port_);
    EXPECT_EQ(ks.size(), 100u);
    EXPECT_EQ(ks.at("key:1").second, 99999999999999);
    EXPECT_EQ(ks.at("bin").first, std::string("\0\r\nx", 4));
    server_.reset();
    EXPECT_EQ(logBytesOnDisk(), after);
    for (unsigned i = 0; i < 2; ++i) { EXPECT_FALSE(std::filesystem::exists(shardLogPath(dir_, i) + ".rewrite")); }
    startServer(withDir(Fsync::kNo));
    EXPECT_EQ(dumpKeyspace(port_), ks);
}

TEST_F(KvRewrite, RewritesUnderConcurrentWritesLoseNothing) {
    ServerOptions o = withDir(Fsync::kNo);
    startServer(o);
    {
        // Enough keys for several slices per shard, written in one pipeline.
        RespClient c(port_);
        std::string batch;
        for (int k = 0; k < 5000; ++k) { batch += RespClient::encode({"SET", "pre:" + std::to_string(k), std::string(100, 'p')}); }
        ASSERT_TRUE(c.sendRaw(batch));
        for (int k = 0; k < 5000; ++k) { ASSERT_EQ(c.reply().value_or(""), kOk); }
    }
    constexpr int kWriters = 3, kKeys = 150, kOps = 1000, kRewrites = 3;
    std::vector<Keyspace> models(kWriters);
    std::atomic<int> running{kWriters};
    std::atomic<int> started{0};  // rewrites started while the writers ran
    std::vector<std::thread> writers;
    for (int w = 0; w < kWriters; ++w) {
        writers.emplace_back([&, w] {
            std::mt19937 rng(static_cast<unsigned>(w * 7919 + 1));
            RespClient c(port_);
            Keyspace& m = models[static_cast<size_t>(w)];
            // At least kOps, and on until kRewrites rewrites have begun (a slow machine is slow at both).
            for (int i = 0; i < kOps || (started.load() < kRewrites && i < 50 * kOps); ++i) {
                const std::string key = "w" + std::to_string(w) + ":" + std::to_string(rng() % kKeys);
                const std::string value = "v" + std::to_string(i) + std::string(rng() % 64, 'x');
                const int64_t at = 90'000'000'000'000 + static_cast<int64_t>(rng() % 1000);
                auto it = m.find(key);
                switch (rng() % 6) {
                    case 0:
                    case 1:
                        ASSERT_EQ(c.call({"SET", key, value}), kOk);
                        m[key] = {value, -1};
                        break;
                    case 2:
                        ASSERT_EQ(c.call({"SET", key, value, "PXAT", std::to_string(at)}), kOk);
                        m[key] = {value, at};
                        break;
                    case 3:
                        ASSERT_EQ(c.call({"DEL", key}), it != m.end() ? ":1\r\n" : ":0\r\n");
                        if (it != m.end()) { m.erase(it); }
                        break;
                    case 4:
                        ASSERT_EQ(c.call({"PEXPIREAT", key, std::to_string(at)}), it != m.end() ? ":1\r\n" : ":0\r\n");
                        if (it != m.end()) { it->second.second = at; }
                        break;
                    default: {
                        const std::string r = c.call({"APPEND", key, "+a"});
                        ASSERT_EQ(r.front(), ':') << r;
                        if (it != m.end()) {
                            it->second.first += "+a";
                        } else {
                            m[key] = {"+a", -1};
                        }
                    }
                }
            }
            running.fetch_sub(1);
        });
    }
    // Rewrites back to back while they write; SAVE now and then.
    {
        RespClient c(port_);
        while (running.load() > 0) {
            const std::string r = (started.load() % 5 == 4) ? c.call({"SAVE"}) : c.call({"BGREWRITEAOF"});
            if (r == kOk || r.rfind("+Background", 0) == 0) { started.fetch_add(1); }
            std::this_thread::sleep_for(1ms);
        }
    }
    for (auto& t : writers) { t.join(); }
    ASSERT_TRUE(awaitRewrites(port_, 0));
    EXPECT_GE(started.load(), kRewrites) << "too few rewrites overlapped the writers";
    EXPECT_EQ(infoField(port_, "persistence", "aof_last_bgrewrite_status"), "ok");
    Keyspace want;
    for (int k = 0; k < 5000; ++k) { want["pre:" + std::to_string(k)] = {std::string(100, 'p'), -1}; }
    for (const Keyspace& m : models) { want.insert(m.begin(), m.end()); }
    EXPECT_EQ(dumpKeyspace(port_), want);
    server_.reset();
    startServer(o);
    EXPECT_EQ(dumpKeyspace(port_), want) << "the rewritten logs replay into another keyspace";
}

TEST_F(KvRewrite, SaveAnswersOnceTheRewriteIsDone) {
    startServer(withDir(Fsync::kAlways));
    RespClient c(port_);
    for (int i = 0; i < 50; ++i) { ASSERT_EQ(c.call({"SET", "k", std::to_string(i)}), kOk); }
    EXPECT_EQ(c.call({"SAVE"}), kOk);
    EXPECT_EQ(infoField(port_, "persistence", "aof_rewrite_in_progress"), "0");
    EXPECT_EQ(infoField(port_, "persistence", "aof_rewrites"), "2");
    EXPECT_EQ(infoField(port_, "persistence", "aof_current_size"), infoField(port_, "persistence", "aof_base_size"));
    EXPECT_EQ(std::to_string(logBytesOnDisk()), infoField(port_, "persistence", "aof_current_size"));
    // Writes go on into the new logs.
    EXPECT_EQ(c.call({"SET", "after", "save"}), kOk);
    server_.reset();
    startServer(withDir(Fsync::kAlways));
    Keyspace ks = dumpKeyspace(port_);
    EXPECT_EQ(ks.size(), 2u);
    EXPECT_EQ(ks["k"].first, "49");
    EXPECT_EQ(ks["after"].first, "save");
}

TEST_F(KvRewrite, NoLogMeansNothingToRewrite) {
    ServerOptions o;
    o.address = net::SocketAddress::ipv4Loopback(0);
    startServer(o);
    RespClient c(port_);
    EXPECT_EQ(c.call({"BGREWRITEAOF"}), "-ERR spindle-kv keeps no log to rewrite (start it with --dir)\r\n");
    EXPECT_EQ(c.call({"SAVE"}), "-ERR spindle-kv keeps no log to rewrite (start it with --dir)\r\n");
    EXPECT_EQ(c.call({"BGREWRITEAOF", "x"}), "-ERR wrong number of arguments for 'bgrewriteaof' command\r\n");
}

TEST_F(KvRewrite, AutomaticRewriteAndItsConfig) {
    ServerOptions o = withDir(Fsync::kNo);
    o.autoRewriteMinSize = 1 << 30;
    startServer(o);
    RespClient c(port_);
    EXPECT_EQ(c.call({"CONFIG", "GET", "auto-aof-rewrite-percentage"}),
              "*2\r\n$27\r\nauto-aof-rewrite-percentage\r\n$3\r\n100\r\n");
    EXPECT_EQ(c.call({"CONFIG", "GET", "auto-aof-*"}),
              "*4\r\n$27\r\nauto-aof-rewrite-percentage\r\n$3\r\n100\r\n"
              "$25\r\nauto-aof-rewrite-min-size\r\n$10\r\n1073741824\r\n");
    EXPECT_EQ(c.call({"CONFIG", "SET", "auto-aof-rewrite-min-size", "lots"}),
              "-ERR CONFIG SET failed (possibly related to argument 'auto-aof-rewrite-min-size') - argument must be a memory or a positive number\r\n");
    EXPECT_EQ(c.call({"CONFIG", "SET", "auto-aof-rewrite-min-size", "4kb", "auto-aof-rewrite-percentage", "50"}), kOk);
    EXPECT_EQ(c.call({"CONFIG", "GET", "auto-aof-rewrite-min-size"}), "*2\r\n$25\r\nauto-aof-rewrite-min-size\r\n$4\r\n4096\r\n");
    for (int i = 0; i < 400; ++i) { ASSERT_EQ(c.call({"SET", "k" + std::to_string(i % 10), std::string(100, 'v')}), kOk); }
    ASSERT_TRUE(awaitRewrites(port_, 2)) << "both shards' logs passed 4 KiB: both are rewritten on their own";
    EXPECT_EQ(infoField(port_, "persistence", "aof_rewrites"), "2");
    EXPECT_LT(std::stoull(infoField(port_, "persistence", "aof_current_size")), 8 * 1024u);
    // Percentage 0 turns it off.
    EXPECT_EQ(c.call({"CONFIG", "SET", "auto-aof-rewrite-percentage", "0"}), kOk);
    const std::string done = infoField(port_, "persistence", "aof_rewrites");
    for (int i = 0; i < 400; ++i) { ASSERT_EQ(c.call({"SET", "k" + std::to_string(i % 10), std::string(100, 'v')}), kOk); }
    std::this_thread::sleep_for(250ms);
    EXPECT_EQ(infoField(port_, "persistence", "aof_rewrites"), done);
}

TEST_F(KvRewrite, ARewriteThatCannotWriteLeavesTheOldLogInUse) {
#if !defined(SPINDLE_FAULT_INJECTION)
    GTEST_SKIP() << "built without SPINDLE_FAULT_INJECTION";
#endif
    startServer(withDir(Fsync::kAlways));
    RespClient c(port_);
    for (int i = 0; i < 20; ++i) { ASSERT_EQ(c.call({"SET", "k" + std::to_string(i), "v"}), kOk); }
    {
        inject::ArmedFault f(inject::Point::kLogWrite, ENOSPC, 1);
        EXPECT_EQ(c.call({"SAVE"}), "-ERR No space left on device\r\n");
        EXPECT_EQ(inject::remaining(inject::Point::kLogWrite), 0u);
    }
    EXPECT_EQ(infoField(port_, "persistence", "aof_last_bgrewrite_status"), "err");
    EXPECT_EQ(infoField(port_, "persistence", "aof_last_write_status"), "ok");
    for (unsigned i = 0; i < 2; ++i) { EXPECT_FALSE(std::filesystem::exists(shardLogPath(dir_, i) + ".rewrite")); }
    EXPECT_EQ(c.call({"SET", "later", "v"}), kOk);
    EXPECT_EQ(c.call({"SAVE"}), kOk);  // and the next one works
    EXPECT_EQ(infoField(port_, "persistence", "aof_last_bgrewrite_status"), "ok");
    server_.reset();
    startServer(withDir(Fsync::kAlways));
    EXPECT_EQ(dumpKeyspace(port_).size(), 21u);
}

// Each fdatasync of a rewrite (of the new file after the snapshot, then in the switch before the
// rename) failing in turn: SAVE reports it, the old logs stay the logs and keep every write.
TEST_F(KvRewrite, AFailedSyncBeforeTheRenameKeepsTheOldLog) {
#if !defined(SPINDLE_FAULT_INJECTION)
    GTEST_SKIP() << "built without SPINDLE_FAULT_INJECTION";
#endif
    startServer(withDir(Fsync::kNo));
    RespClient c(port_);
    for (int i = 0; i < 20; ++i) { ASSERT_EQ(c.call({"SET", "k" + std::to_string(i), "v"}), kOk); }
    for (uint32_t skip = 0; skip < 4; ++skip) {  // two shards, two fdatasyncs each
        SCOPED_TRACE(skip);
        {
            inject::ArmedFault f(inject::Point::kLogSync, EIO, 1, skip);
            EXPECT_EQ(c.call({"SAVE"}), "-ERR Input/output error\r\n");
            EXPECT_EQ(inject::remaining(inject::Point::kLogSync), 0u);
        }
        EXPECT_EQ(infoField(port_, "persistence", "aof_last_write_status"), "ok");
        EXPECT_EQ(c.call({"SET", "after" + std::to_string(skip), "v"}), kOk);
        for (unsigned i = 0; i < 2; ++i) { EXPECT_FALSE(std::filesystem::exists(shardLogPath(dir_, i) + ".rewrite")); }
    }
    server_.reset();
    startServer(withDir(Fsync::kNo));
    EXPECT_EQ(dumpKeyspace(port_).size(), 24u);
}

TEST_F(KvRewrite, StoppingDuringARewriteKeepsEveryWrite) {
    startServer(withDir(Fsync::kAlways));
    {
        RespClient c(port_);
        std::string batch;
        for (int k = 0; k < 20000; ++k) { batch += RespClient::encode({"SET", "k" + std::to_string(k), std::string(100, 'v')}); }
        ASSERT_TRUE(c.sendRaw(batch));
        for (int k = 0; k < 20000; ++k) { ASSERT_EQ(c.reply().value_or(""), kOk); }
        EXPECT_EQ(c.call({"BGREWRITEAOF"}), "+Background append only file rewriting started\r\n");
    }
    server_.reset();  // the rewrite stops at its next slice, or finishes its switch
    for (unsigned i = 0; i < 2; ++i) { EXPECT_FALSE(std::filesystem::exists(shardLogPath(dir_, i) + ".rewrite")); }
    startServer(withDir(Fsync::kAlways));
    RespClient c(port_);
    EXPECT_EQ(c.call({"DBSIZE"}), ":20000\r\n");
}

TEST_F(KvRewrite, ALeftoverRewriteFileIsRemovedAtStart) {
    startServer(withDir(Fsync::kAlways));
    {
        RespClient c(port_);
        ASSERT_EQ(c.call({"SET", "a", "1"}), kOk);
    }
    server_.reset();
    for (unsigned i = 0; i < 2; ++i) { std::ofstream(shardLogPath(dir_, i) + ".rewrite") << "half a snapshot"; }
    startServer(withDir(Fsync::kAlways));
    for (unsigned i = 0; i < 2; ++i) { EXPECT_FALSE(std::filesystem::exists(shardLogPath(dir_, i) + ".rewrite")); }
    EXPECT_EQ(dumpKeyspace(port_).size(), 1u);
}

// Restore records of `out` replayed into a fresh shard: every "stay:<i>" key must be there.
void expectEveryStayingKey(const std::string& out, int keys) {
    Shard replayed(0);
    const ScanReport r = scanLog(out, [&](std::string_view p) { return replayed.replay(p); });
    EXPECT_EQ(r.droppedBytes, 0u);
    for (int i = 0; i < keys; ++i) { ASSERT_NE(replayed.find("stay:" + std::to_string(i), nowMs()), nullptr) << i; }
}

TEST(KvSnapshot, AWalkAcrossARehashVisitsEveryKeyThatStayed) {
    Shard shard(0);
    for (int i = 0; i < 2000; ++i) { shard.set("stay:" + std::to_string(i), "v", 0); }
    SnapshotCursor cursor;
    std::string out;
    int slices = 0, added = 0;
    while (!shard.snapshotSlice(cursor, nowMs(), 512, out)) {
        if (++slices == 3) {  // past the raised load factor: a rehash under the walk
            while (added < 40000) { shard.set("new:" + std::to_string(added++), "v", 0); }
        }
        if (slices % 7 == 0) { (void)shard.del("stay:" + std::to_string(slices)); }
    }
    shard.endSnapshot(cursor);
    EXPECT_EQ(cursor.restarts, 1u);
    Shard replayed(0);
    ASSERT_EQ(scanLog(out, [&](std::string_view p) { return replayed.replay(p); }).droppedBytes, 0u);
    for (int i = 0; i < 2000; ++i) {
        if (i % 7 == 0 && i > 0 && i <= slices) { continue; }  // deleted during the walk
        ASSERT_NE(replayed.find("stay:" + std::to_string(i), nowMs()), nullptr) << i;
    }
}

TEST(KvSnapshot, AWalkFinishesWhileKeysKeepComing) {
    Shard shard(0);
    for (int i = 0; i < 5000; ++i) { shard.set("stay:" + std::to_string(i), "v", 0); }
    SnapshotCursor cursor;
    std::string out;
    int added = 0, slices = 0;
    while (!shard.snapshotSlice(cursor, nowMs(), 1024, out)) {
        ASSERT_LT(++slices, 100000) << "the walk does not end";
        for (int j = 0; j < 40; ++j) { shard.set("new:" + std::to_string(added++), "v", 0); }  // more than a slice takes
    }
    shard.endSnapshot(cursor);
    expectEveryStayingKey(out, 5000);
    shard.set("after", "v", 0);  // the load factor is back: the map may rehash again
    EXPECT_LE(shard.keyCount(), 5001u + static_cast<uint64_t>(added));
}

}  // namespace
}  // namespace spindle::kv
