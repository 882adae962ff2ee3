// SPDX-License-Identifier: Apache-2.0
// spindle-kv's log compaction in process: BGREWRITEAOF shrinks the logs and keeps the keyspace across a
// restart; rewrites back to back under concurrent writers (sets, deletes, expiries, appends) lose
// nothing; SAVE answers once its rewrite is done; the automatic rewrite and its CONFIG parameters; a
// rewrite that cannot write its file leaves the old log in use; a leftover <log>.rewrite is removed at
// start; the snapshot walk over a shard that rehashes between slices; a rewrite keeps hashes, lists
// and sets, and their expiries, exactly; SHUTDOWN SAVE rewrites before it stops (and refuses to stop
// when that fails), SHUTDOWN and SHUTDOWN NOSAVE do not rewrite.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <map>
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
using testing_support::dumpTypedKeyspace;
using testing_support::infoField;
using testing_support::Keyspace;
using testing_support::RespClient;
using testing_support::TypedKeyspace;

const std::string kOk = "+OK\r\n";
const std::string kShutdownFailed = "-ERR Errors trying to SHUTDOWN. Check logs.\r\n";

class KvRewrite : public testing_support::KvServerFixture {
protected:
    // Sets k0..k19 to "v" through `c` (twenty keys over both shards).
    static void setTwentyKeys(RespClient& c) {
        for (int i = 0; i < 20; ++i) { ASSERT_EQ(c.call({"SET", "k" + std::to_string(i), "v"}), kOk); }
    }
};

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
    // SHUTDOWN SAVE cannot save: it refuses, as Redis does when its save fails, and the server runs on.
    EXPECT_EQ(c.call({"SHUTDOWN", "SAVE"}), kShutdownFailed);
    EXPECT_EQ(c.call({"SHUTDOWN", "SAVE", "NOSAVE"}), "-ERR syntax error\r\n");
    EXPECT_EQ(c.call({"PING"}), "+PONG\r\n");
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
    // The logs grow past 4 KiB while the threshold is still 1 GiB; only then is it lowered. Were it
    // lowered first, a run slow enough to span a 100 ms check would rewrite a shard twice.
    for (int i = 0; i < 400; ++i) { ASSERT_EQ(c.call({"SET", "k" + std::to_string(i % 10), std::string(100, 'v')}), kOk); }
    EXPECT_EQ(infoField(port_, "persistence", "aof_rewrites"), "0");
    EXPECT_EQ(c.call({"CONFIG", "SET", "auto-aof-rewrite-min-size", "4kb", "auto-aof-rewrite-percentage", "50"}), kOk);
    EXPECT_EQ(c.call({"CONFIG", "GET", "auto-aof-rewrite-min-size"}), "*2\r\n$25\r\nauto-aof-rewrite-min-size\r\n$4\r\n4096\r\n");
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
    SPINDLE_SKIP_WITHOUT_FAULT_INJECTION();
    startServer(withDir(Fsync::kAlways));
    RespClient c(port_);
    ASSERT_NO_FATAL_FAILURE(setTwentyKeys(c));
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
    SPINDLE_SKIP_WITHOUT_FAULT_INJECTION();
    startServer(withDir(Fsync::kNo));
    RespClient c(port_);
    ASSERT_NO_FATAL_FAILURE(setTwentyKeys(c));
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

// SHUTDOWN SAVE compacts every shard's log as SAVE does before the server stops (Redis's SAVE
// modifier forces a snapshot); the keyspace survives the restart.
TEST_F(KvRewrite, ShutdownSaveRewritesTheLogsFirst) {
    startServer(withDir(Fsync::kAlways));
    RespClient c(port_);
    for (int round = 0; round < 10; ++round) {
        for (int k = 0; k < 20; ++k) {
            ASSERT_EQ(c.call({"SET", "k" + std::to_string(k), std::string(40, 'v') + std::to_string(round)}), kOk);
        }
    }
    const Keyspace want = dumpKeyspace(port_);
    const uint64_t before = logBytesOnDisk();
    ASSERT_TRUE(c.sendRaw(RespClient::encode({"SHUTDOWN", "SAVE"})));
    EXPECT_TRUE(c.closedByPeer());
    EXPECT_EQ(server_->wait(), 0);
    EXPECT_EQ(server_->stats().rewrites, 2u);  // one per shard
    EXPECT_LT(logBytesOnDisk(), before / 5);
    startServer(withDir(Fsync::kAlways));
    EXPECT_EQ(dumpKeyspace(port_), want);
}

// SHUTDOWN NOSAVE, and SHUTDOWN alone (spindle-kv has no save points: Redis with an append-only file
// and none only syncs it), leave the logs as they are.
TEST_F(KvRewrite, ShutdownWithoutSaveLeavesTheLogsAlone) {
    for (const char* how : {"NOSAVE", ""}) {
        SCOPED_TRACE(how);
        startServer(withDir(Fsync::kAlways));
        RespClient c(port_);
        for (int i = 0; i < 50; ++i) { ASSERT_EQ(c.call({"SET", "k", std::to_string(i)}), kOk); }
        const uint64_t before = logBytesOnDisk();
        std::vector<std::string> cmd{"SHUTDOWN"};
        if (*how != '\0') { cmd.emplace_back(how); }
        ASSERT_TRUE(c.sendRaw(RespClient::encode(cmd)));
        EXPECT_TRUE(c.closedByPeer());
        EXPECT_EQ(server_->wait(), 0);
        EXPECT_EQ(server_->stats().rewrites, 0u);
        EXPECT_EQ(logBytesOnDisk(), before);
    }
    startServer(withDir(Fsync::kAlways));
    EXPECT_EQ(dumpKeyspace(port_)["k"].first, "49");
}

// A SHUTDOWN SAVE whose rewrite fails answers Redis's error and leaves the server running, the old
// logs in use; SHUTDOWN SAVE FORCE stops it all the same.
TEST_F(KvRewrite, AShutdownSaveThatFailsKeepsTheServerRunning) {
    SPINDLE_SKIP_WITHOUT_FAULT_INJECTION();
    startServer(withDir(Fsync::kAlways));
    RespClient c(port_);
    ASSERT_NO_FATAL_FAILURE(setTwentyKeys(c));
    {
        inject::ArmedFault f(inject::Point::kLogWrite, ENOSPC, 1);
        EXPECT_EQ(c.call({"SHUTDOWN", "SAVE"}), kShutdownFailed);
        EXPECT_EQ(inject::remaining(inject::Point::kLogWrite), 0u);
    }
    EXPECT_EQ(c.call({"SET", "later", "v"}), kOk);
    RespClient d(port_);
    EXPECT_EQ(d.call({"PING"}), "+PONG\r\n");
    {
        inject::ArmedFault f(inject::Point::kLogWrite, ENOSPC, 1);
        ASSERT_TRUE(c.sendRaw(RespClient::encode({"SHUTDOWN", "SAVE", "FORCE"})));
        EXPECT_TRUE(c.closedByPeer());
        EXPECT_EQ(server_->wait(), 0);
        EXPECT_EQ(inject::remaining(inject::Point::kLogWrite), 0u);
    }
    for (unsigned i = 0; i < 2; ++i) { EXPECT_FALSE(std::filesystem::exists(shardLogPath(dir_, i) + ".rewrite")); }
    startServer(withDir(Fsync::kAlways));
    EXPECT_EQ(dumpKeyspace(port_).size(), 21u);
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

// The keys of the restore records in `out`, each with how many times it was written.
std::map<std::string, int> restoredKeys(const std::string& out) {
    std::map<std::string, int> keys;
    (void)scanLog(out, [&](std::string_view p) {
        // kRestore: op 12, then the key as u32 length and bytes.
        if (p.size() < 5 || static_cast<uint8_t>(p[0]) != 12) { return true; }
        uint32_t len = 0;
        std::memcpy(&len, p.data() + 1, 4);
        ++keys[std::string(p.substr(5, len))];
        return true;
    });
    return keys;
}

// The table doubles four times between two slices of the walk: every key that stayed is written
// exactly once (the walk goes by hash, not by slot).
TEST(KvSnapshot, AWalkAcrossARehashVisitsEveryKeyThatStayedOnce) {
    Shard shard(0);
    for (int i = 0; i < 2000; ++i) { shard.set("stay:" + std::to_string(i), "v", 0); }
    SnapshotCursor cursor;
    std::string out;
    int slices = 0, added = 0;
    while (!shard.snapshotSlice(cursor, nowMs(), 512, out)) {
        if (++slices == 3) {  // a rehash under the walk
            while (added < 40000) { shard.set("new:" + std::to_string(added++), "v", 0); }
        }
        if (slices % 7 == 0) { (void)shard.del("stay:" + std::to_string(slices)); }
    }
    shard.endSnapshot(cursor);
    Shard replayed(0);
    ASSERT_EQ(scanLog(out, [&](std::string_view p) { return replayed.replay(p); }).droppedBytes, 0u);
    const std::map<std::string, int> written = restoredKeys(out);
    for (int i = 0; i < 2000; ++i) {
        if (i % 7 == 0 && i > 0 && i <= slices) { continue; }  // deleted during the walk
        const std::string k = "stay:" + std::to_string(i);
        ASSERT_NE(replayed.find(k, nowMs()), nullptr) << i;
        EXPECT_EQ(written.at(k), 1) << k;
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
    shard.set("after", "v", 0);
    EXPECT_LE(shard.keyCount(), 5001u + static_cast<uint64_t>(added));
}

// Every type goes through the snapshot's restore records: after BGREWRITEAOF and a restart each key
// has the same TYPE, contents (a list in order, binary-safe) and PEXPIRETIME as before; keys that
// expired, were emptied or renamed before the rewrite stay gone.
TEST_F(KvRewrite, ARewriteKeepsEveryTypeAndItsExpiry) {
    startServer(withDir(Fsync::kNo));
    const std::string bin("a\0\r\nb", 5);
    {
        RespClient c(port_);
        for (int k = 0; k < 200; ++k) {
            const std::string id = std::to_string(k);
            ASSERT_EQ(c.call({"SET", "s:" + id, "v" + id}), kOk);
            ASSERT_EQ(c.call({"HSET", "h:" + id, "f1", "x" + id, "f2", bin, "f3", ""}), ":3\r\n");
            ASSERT_EQ(c.call({"RPUSH", "l:" + id, "b", "c", bin}), ":3\r\n");
            ASSERT_EQ(c.call({"LPUSH", "l:" + id, "a"}), ":4\r\n");
            ASSERT_EQ(c.call({"SADD", "z:" + id, "m1", "m2", bin, id}), ":4\r\n");
            if (k % 3 == 0) {  // expiries on every type
                const std::string at = std::to_string(99999999990000 + k);
                for (const char* p : {"s:", "h:", "l:", "z:"}) { ASSERT_EQ(c.call({"PEXPIREAT", p + id, at}), ":1\r\n"); }
            }
        }
        // Changes the snapshot must reflect, not the commands that made them.
        ASSERT_EQ(c.call({"HDEL", "h:1", "f1"}), ":1\r\n");
        ASSERT_EQ(c.call({"HINCRBY", "h:2", "n", "41"}), ":41\r\n");
        ASSERT_EQ(c.call({"RPOP", "l:1"}), "$5\r\n" + bin + "\r\n");
        ASSERT_EQ(c.call({"LPOP", "l:2", "4"}).substr(0, 4), "*4\r\n");  // emptied: the key is gone
        ASSERT_EQ(c.call({"SREM", "z:1", "m1"}), ":1\r\n");
        ASSERT_EQ(c.call({"RENAME", "h:4", "renamed-hash"}), kOk);  // h:4 has no expiry
        ASSERT_EQ(c.call({"RENAME", "z:3", "renamed-set"}), kOk);   // z:3 has one: it moves with it
        ASSERT_EQ(c.call({"PERSIST", "l:6"}), ":1\r\n");
        std::vector<std::string> push{"RPUSH", "biglist"};  // one key larger than a 256 KiB slice
        for (int i = 0; i < 20000; ++i) { push.push_back("element-" + std::to_string(i) + std::string(20, 'e')); }
        ASSERT_EQ(c.call(push), ":20000\r\n");
        // Expired before the rewrite, of each type: not in the snapshot.
        ASSERT_EQ(c.call({"SET", "gone:s", "x", "PX", "1"}), kOk);
        ASSERT_EQ(c.call({"HSET", "gone:h", "f", "v"}), ":1\r\n");
        ASSERT_EQ(c.call({"RPUSH", "gone:l", "e"}), ":1\r\n");
        ASSERT_EQ(c.call({"SADD", "gone:z", "m"}), ":1\r\n");
        for (const char* k : {"gone:h", "gone:l", "gone:z"}) { ASSERT_EQ(c.call({"PEXPIRE", k, "1"}), ":1\r\n"); }
        // Their deletes (an expired key is logged as one) go to the log before the rewrite, not after it.
        for (int i = 0; i < 5000 && c.call({"DBSIZE"}) != ":800\r\n"; ++i) { std::this_thread::sleep_for(1ms); }
        ASSERT_EQ(c.call({"DBSIZE"}), ":800\r\n");
    }
    const TypedKeyspace before = dumpTypedKeyspace(port_);
    ASSERT_EQ(before.size(), 4u * 200 - 1 + 1);  // l:2 emptied; biglist added; renames keep the count
    EXPECT_EQ(before.at("renamed-set").type, "set");
    EXPECT_EQ(before.at("renamed-set").expireAtMs, 99999999990003);
    EXPECT_EQ(before.at("h:3").expireAtMs, 99999999990003);
    EXPECT_EQ(before.at("l:6").expireAtMs, -1);
    EXPECT_EQ(before.count("gone:h") + before.count("gone:l") + before.count("gone:z") + before.count("gone:s"), 0u);
    const uint64_t rewrites = std::stoull(infoField(port_, "persistence", "aof_rewrites"));
    {
        RespClient c(port_);
        ASSERT_EQ(c.call({"BGREWRITEAOF"}), "+Background append only file rewriting started\r\n");
    }
    ASSERT_TRUE(awaitRewrites(port_, rewrites + 2));  // one per shard
    EXPECT_EQ(infoField(port_, "persistence", "aof_last_bgrewrite_status"), "ok");
    EXPECT_EQ(infoField(port_, "persistence", "aof_rewrites"), std::to_string(rewrites + 2));
    EXPECT_EQ(dumpTypedKeyspace(port_), before);
    const uint64_t rewritten = std::stoull(infoField(port_, "persistence", "aof_current_size"));
    server_.reset();
    EXPECT_EQ(logBytesOnDisk(), rewritten);  // nothing but the snapshot: the replay below reads only it
    startServer(withDir(Fsync::kNo));
    const TypedKeyspace after = dumpTypedKeyspace(port_);
    EXPECT_EQ(after.size(), before.size());
    for (const auto& [key, v] : before) {
        auto it = after.find(key);
        ASSERT_NE(it, after.end()) << key << " was lost";
        EXPECT_EQ(it->second.type, v.type) << key;
        EXPECT_EQ(it->second.items, v.items) << key;
        EXPECT_EQ(it->second.expireAtMs, v.expireAtMs) << key;
    }
    // And the restored collections behave as collections (the types and encodings are live, not copies).
    RespClient c(port_);
    EXPECT_EQ(c.call({"HGET", "h:0", "f2"}), "$5\r\n" + bin + "\r\n");
    const std::string last = "element-19999" + std::string(20, 'e');
    EXPECT_EQ(c.call({"LINDEX", "biglist", "19999"}), "$" + std::to_string(last.size()) + "\r\n" + last + "\r\n");
    EXPECT_EQ(c.call({"SISMEMBER", "renamed-set", "m2"}), ":1\r\n");
    EXPECT_EQ(c.call({"LPUSH", "h:0", "x"}).rfind("-WRONGTYPE", 0), 0u);
}

// A key whose time has come but that the expiry fiber has not removed yet is left out of the snapshot,
// whatever its type.
TEST(KvSnapshot, AWalkLeavesOutExpiredKeysOfEveryType) {
    Shard shard(0);
    const std::vector<std::string_view> fv{"f", "v"}, one{"m"};
    for (const std::string_view prefix : {"live:", "dead:"}) {
        shard.set(std::string(prefix) + "s", "v", 0);
        (void)shard.hset(std::string(prefix) + "h", fv);
        (void)shard.push(std::string(prefix) + "l", false, one);
        (void)shard.sadd(std::string(prefix) + "z", one);
    }
    for (const char* k : {"dead:s", "dead:h", "dead:l", "dead:z"}) { shard.expireAt(k, 1); }  // 1 ms after 1970
    SnapshotCursor cursor;
    std::string out;
    while (!shard.snapshotSlice(cursor, nowMs(), 1 << 20, out)) {}
    shard.endSnapshot(cursor);
    EXPECT_EQ(cursor.keys, 4u);
    Shard replayed(0);
    const ScanReport r = scanLog(out, [&](std::string_view p) { return replayed.replay(p); });
    EXPECT_EQ(r.records, 4u);
    EXPECT_EQ(replayed.keyCount(), 4u);
    for (const char* k : {"live:s", "live:h", "live:l", "live:z"}) { EXPECT_NE(replayed.find(k, nowMs()), nullptr) << k; }
    EXPECT_EQ(replayed.find("live:h", nowMs())->type(), ValueType::kHash);
}

// Collection commands while rewrites walk the shards: pushes and pops (not idempotent) on lists the walk
// has or has not reached yet, and keys that change type (HSET, DEL, SADD) under it. The snapshot may
// already hold such a change when the capture replays it after the snapshot: the keyspace after the
// rewrites and after a restart must still be exactly the one the clients saw.
TEST_F(KvRewrite, CollectionWritesDuringRewritesReplayExactlyOnce) {
    startServer(withDir(Fsync::kNo));
    constexpr int kLists = 10000;  // about 3 MB: several slices per shard
    {
        RespClient c(port_);
        std::string batch;
        const std::string pad(100, 'p');
        for (int k = 0; k < kLists; ++k) { batch += RespClient::encode({"RPUSH", "l:" + std::to_string(k), "a" + pad, "b" + pad, "c" + pad}); }
        ASSERT_TRUE(c.sendRaw(batch));
        for (int k = 0; k < kLists; ++k) { ASSERT_EQ(c.reply().value_or(""), ":3\r\n"); }
    }
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> ops{0};
    std::thread writer([&] {  // pipelined, so that many commands land inside each walk
        RespClient c(port_);
        for (int j = 0; !stop.load() && c.connected();) {
            std::string batch;
            size_t n = 0;
            for (const int end = j + 100; j < end; ++j) {
                const std::string id = std::to_string(j % kLists), t = "t:" + std::to_string(j % 300);
                batch += RespClient::encode({"RPUSH", "l:" + id, "x" + std::to_string(j)});
                ++n;
                if (j % 3 == 0) {
                    batch += RespClient::encode({"LPOP", "l:" + std::to_string((j * 7) % kLists)});
                    ++n;
                }
                if (j % 5 == 0) {
                    for (const auto& cmd : {std::vector<std::string>{"DEL", t}, {"HSET", t, "f", std::to_string(j)}, {"DEL", t},
                                            {"SADD", t, "m", std::to_string(j)}}) {
                        batch += RespClient::encode(cmd);
                        ++n;
                    }
                }
            }
            ASSERT_TRUE(c.sendRaw(batch));
            for (size_t i = 0; i < n; ++i) {
                const std::string r = c.reply().value_or("-no reply");
                ASSERT_NE(r.front(), '-') << r;
            }
            ops += n;
        }
    });
    uint64_t rewrites = 0;
    for (int round = 0; round < 3; ++round) {
        const uint64_t before = ops.load();
        while (ops.load() < before + 2000) { std::this_thread::sleep_for(1ms); }
        RespClient c(port_);
        ASSERT_EQ(c.call({"BGREWRITEAOF"}), "+Background append only file rewriting started\r\n");
        rewrites += 2;
        ASSERT_TRUE(awaitRewrites(port_, rewrites));
    }
    stop.store(true);
    writer.join();
    EXPECT_EQ(infoField(port_, "persistence", "aof_rewrites"), std::to_string(rewrites));
    EXPECT_EQ(infoField(port_, "persistence", "aof_last_bgrewrite_status"), "ok");
    const TypedKeyspace live = dumpTypedKeyspace(port_);
    EXPECT_GE(live.size(), static_cast<size_t>(kLists));
    server_.reset();
    startServer(withDir(Fsync::kNo));
    const TypedKeyspace replayed = dumpTypedKeyspace(port_);
    EXPECT_EQ(replayed.size(), live.size());
    for (const auto& [key, v] : live) {
        auto it = replayed.find(key);
        ASSERT_NE(it, replayed.end()) << key << " was lost";
        EXPECT_EQ(it->second, v) << key << ": " << v.type << " of " << v.items.size() << " before, " << it->second.type
                                 << " of " << it->second.items.size() << " after";
    }
}

}  // namespace
}  // namespace spindle::kv
