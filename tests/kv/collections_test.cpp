// SPDX-License-Identifier: Apache-2.0
// spindle-kv's hashes, lists and sets, and the key commands that move or list keys (RENAME, SCAN,
// RANDOMKEY, MSETNX), in process over loopback with two shards: exact replies and errors, RESP3
// types, memory accounting, expiry, and every mutation replayed exactly after a restart. Also the
// multi-key commands' atomicity: readers never see half of an MSET across shards, nor do KEYS, SCAN,
// DBSIZE and RANDOMKEY, and FLUSHALL never leaves half of one.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "apps/kv/server.h"
#include "apps/kv/shard.h"
#include "base/inject.h"
#include "tests/core/with_runtime.h"
#include "tests/kv/resp_client.h"
#include "tests/kv/server_fixture.h"

namespace spindle::kv {
namespace {

using namespace std::chrono_literals;
using testing_support::RespClient;
using V = std::vector<std::string>;

std::string bulk(std::string_view s) { return "$" + std::to_string(s.size()) + "\r\n" + std::string(s) + "\r\n"; }
const std::string kOk = "+OK\r\n";
const std::string kNil = "$-1\r\n";
const std::string kWrongType = "-WRONGTYPE Operation against a key holding the wrong kind of value\r\n";

// A key named `prefix`N that lives on shard `shard` of 2.
std::string keyOn(unsigned shard, const std::string& prefix) {
    for (int i = 0;; ++i) {
        std::string k = prefix + std::to_string(i);
        if (keyHash(k) % 2 == shard) { return k; }
    }
}

class KvCollections : public testing_support::KvServerFixture {};

TEST_F(KvCollections, HashesAnswerAsRedis) {
    startServer(defaults(false));
    RespClient c(port_);
    EXPECT_EQ(c.call({"HSET", "h", "a", "1", "b", "2"}), ":2\r\n");
    EXPECT_EQ(c.call({"HSET", "h", "a", "10", "c", "3"}), ":1\r\n");
    EXPECT_EQ(c.call({"HSET", "h", "a"}), "-ERR wrong number of arguments for 'hset' command\r\n");
    EXPECT_EQ(c.call({"HGET", "h", "a"}), bulk("10"));
    EXPECT_EQ(c.call({"HGET", "h", "zz"}), kNil);
    EXPECT_EQ(c.call({"HGET", "nohash", "a"}), kNil);
    EXPECT_EQ(c.call({"HMGET", "h", "a", "zz", "c"}), "*3\r\n" + bulk("10") + kNil + bulk("3"));
    EXPECT_EQ(c.call({"HMGET", "nohash", "a"}), "*1\r\n" + kNil);
    EXPECT_EQ(c.call({"HLEN", "h"}), ":3\r\n");
    EXPECT_EQ(c.call({"HEXISTS", "h", "b"}), ":1\r\n");
    EXPECT_EQ(c.call({"HEXISTS", "h", "zz"}), ":0\r\n");
    EXPECT_EQ(c.call({"HINCRBY", "h", "a", "5"}), ":15\r\n");
    EXPECT_EQ(c.call({"HINCRBY", "h", "new", "-3"}), ":-3\r\n");
    EXPECT_EQ(c.call({"HINCRBY", "h", "a", "x"}), "-ERR value is not an integer or out of range\r\n");
    EXPECT_EQ(c.call({"HSET", "h", "s", "abc"}), ":1\r\n");
    EXPECT_EQ(c.call({"HINCRBY", "h", "s", "1"}), "-ERR hash value is not an integer\r\n");
    EXPECT_EQ(c.call({"HINCRBY", "h", "a", "9223372036854775807"}), "-ERR increment or decrement would overflow\r\n");
    EXPECT_EQ(c.call({"HDEL", "h", "s", "new", "zz"}), ":2\r\n");
    // Unordered replies: compare as sets of lines.
    const std::string all = c.call({"HGETALL", "h"});
    EXPECT_EQ(all.substr(0, 4), "*6\r\n") << all;
    for (const char* part : {"$1\r\na\r\n$2\r\n15\r\n", "$1\r\nb\r\n$1\r\n2\r\n", "$1\r\nc\r\n$1\r\n3\r\n"}) {
        EXPECT_NE(all.find(part), std::string::npos) << all;
    }
    EXPECT_EQ(c.call({"HKEYS", "h"}).substr(0, 4), "*3\r\n");
    EXPECT_EQ(c.call({"HVALS", "h"}).substr(0, 4), "*3\r\n");
    EXPECT_EQ(c.call({"HGETALL", "nohash"}), "*0\r\n");
    EXPECT_EQ(c.call({"TYPE", "h"}), "+hash\r\n");
    EXPECT_EQ(c.call({"HDEL", "h", "a", "b", "c"}), ":3\r\n");
    EXPECT_EQ(c.call({"EXISTS", "h"}), ":0\r\n");  // emptied: removed
    // Wrong types both ways.
    EXPECT_EQ(c.call({"SET", "s", "v"}), kOk);
    EXPECT_EQ(c.call({"HSET", "s", "f", "v"}), kWrongType);
    EXPECT_EQ(c.call({"HGET", "s", "f"}), kWrongType);
    EXPECT_EQ(c.call({"HGETALL", "s"}), kWrongType);
    EXPECT_EQ(c.call({"HSET", "h2", "f", "v"}), ":1\r\n");
    EXPECT_EQ(c.call({"GET", "h2"}), kWrongType);
    EXPECT_EQ(c.call({"APPEND", "h2", "x"}), kWrongType);
    EXPECT_EQ(c.call({"INCR", "h2"}), kWrongType);
    EXPECT_EQ(c.call({"MGET", "h2", "s"}), "*2\r\n" + kNil + bulk("v"));
    EXPECT_EQ(c.call({"SET", "h2", "now a string"}), kOk);  // SET replaces any type
    EXPECT_EQ(c.call({"TYPE", "h2"}), "+string\r\n");
    // RESP3: HGETALL is a map.
    c.call({"HELLO", "3"});
    EXPECT_EQ(c.call({"HSET", "h3", "f", "v"}), ":1\r\n");
    EXPECT_EQ(c.call({"HGETALL", "h3"}), "%1\r\n" + bulk("f") + bulk("v"));
    EXPECT_EQ(c.call({"HGETALL", "nohash"}), "%0\r\n");
    EXPECT_EQ(c.call({"HGET", "h3", "zz"}), "_\r\n");
}

TEST_F(KvCollections, ListsAnswerAsRedis) {
    startServer(defaults(false));
    RespClient c(port_);
    EXPECT_EQ(c.call({"RPUSH", "l", "a", "b", "c"}), ":3\r\n");
    EXPECT_EQ(c.call({"LPUSH", "l", "z", "y"}), ":5\r\n");  // y z a b c
    EXPECT_EQ(c.call({"LRANGE", "l", "0", "-1"}), "*5\r\n" + bulk("y") + bulk("z") + bulk("a") + bulk("b") + bulk("c"));
    EXPECT_EQ(c.call({"LRANGE", "l", "-2", "100"}), "*2\r\n" + bulk("b") + bulk("c"));
    EXPECT_EQ(c.call({"LRANGE", "l", "3", "1"}), "*0\r\n");
    EXPECT_EQ(c.call({"LRANGE", "l", "a", "1"}), "-ERR value is not an integer or out of range\r\n");
    EXPECT_EQ(c.call({"LRANGE", "nolist", "0", "-1"}), "*0\r\n");
    EXPECT_EQ(c.call({"LLEN", "l"}), ":5\r\n");
    EXPECT_EQ(c.call({"LINDEX", "l", "0"}), bulk("y"));
    EXPECT_EQ(c.call({"LINDEX", "l", "-1"}), bulk("c"));
    EXPECT_EQ(c.call({"LINDEX", "l", "5"}), kNil);
    EXPECT_EQ(c.call({"LINDEX", "l", "x"}), "-ERR value is not an integer or out of range\r\n");
    EXPECT_EQ(c.call({"LPOP", "l"}), bulk("y"));
    EXPECT_EQ(c.call({"RPOP", "l"}), bulk("c"));
    EXPECT_EQ(c.call({"LPOP", "l", "2"}), "*2\r\n" + bulk("z") + bulk("a"));
    EXPECT_EQ(c.call({"LPOP", "l", "0"}), "*0\r\n");
    EXPECT_EQ(c.call({"LPOP", "l", "-1"}), "-ERR value is out of range, must be positive\r\n");
    EXPECT_EQ(c.call({"LPOP", "l", "x"}), "-ERR value is out of range, must be positive\r\n");
    EXPECT_EQ(c.call({"LPOP", "l", "1", "2"}), "-ERR wrong number of arguments for 'lpop' command\r\n");
    EXPECT_EQ(c.call({"RPOP", "l", "10"}), "*1\r\n" + bulk("b"));
    EXPECT_EQ(c.call({"EXISTS", "l"}), ":0\r\n");
    EXPECT_EQ(c.call({"LPOP", "l"}), kNil);
    EXPECT_EQ(c.call({"LPOP", "l", "2"}), "*-1\r\n");
    EXPECT_EQ(c.call({"SET", "s", "v"}), kOk);
    EXPECT_EQ(c.call({"LPUSH", "s", "a"}), kWrongType);
    EXPECT_EQ(c.call({"LPOP", "s"}), kWrongType);
    EXPECT_EQ(c.call({"LRANGE", "s", "0", "1"}), kWrongType);
    EXPECT_EQ(c.call({"RPUSH", "l2", "x"}), ":1\r\n");
    EXPECT_EQ(c.call({"TYPE", "l2"}), "+list\r\n");
    c.call({"HELLO", "3"});
    EXPECT_EQ(c.call({"LPOP", "nolist", "2"}), "_\r\n");
}

TEST_F(KvCollections, SetsAnswerAsRedis) {
    startServer(defaults(false));
    RespClient c(port_);
    EXPECT_EQ(c.call({"SADD", "s", "a", "b", "a"}), ":2\r\n");
    EXPECT_EQ(c.call({"SADD", "s", "b", "c"}), ":1\r\n");
    EXPECT_EQ(c.call({"SCARD", "s"}), ":3\r\n");
    EXPECT_EQ(c.call({"SISMEMBER", "s", "a"}), ":1\r\n");
    EXPECT_EQ(c.call({"SISMEMBER", "s", "z"}), ":0\r\n");
    EXPECT_EQ(c.call({"SMEMBERS", "s"}).substr(0, 4), "*3\r\n");
    EXPECT_EQ(c.call({"SREM", "s", "a", "z"}), ":1\r\n");
    EXPECT_EQ(c.call({"SMEMBERS", "nosset"}), "*0\r\n");
    EXPECT_EQ(c.call({"TYPE", "s"}), "+set\r\n");
    EXPECT_EQ(c.call({"SET", "str", "v"}), kOk);
    EXPECT_EQ(c.call({"SADD", "str", "a"}), kWrongType);
    EXPECT_EQ(c.call({"SCARD", "str"}), kWrongType);
    EXPECT_EQ(c.call({"SREM", "s", "b", "c"}), ":2\r\n");
    EXPECT_EQ(c.call({"EXISTS", "s"}), ":0\r\n");
    c.call({"HELLO", "3"});
    EXPECT_EQ(c.call({"SADD", "s3", "m"}), ":1\r\n");
    EXPECT_EQ(c.call({"SMEMBERS", "s3"}), "~1\r\n" + bulk("m"));
}

TEST_F(KvCollections, MemoryAccountingAndExpiryCoverCollections) {
    startServer(defaults(false));
    RespClient c(port_);
    EXPECT_EQ(server_->stats().usedMemory, 0u);
    EXPECT_EQ(c.call({"HSET", "h", "field", "value"}), ":1\r\n");
    EXPECT_EQ(server_->stats().usedMemory, 1 + Shard::kEntryOverhead + 10 + Shard::kElementOverhead);
    EXPECT_EQ(c.call({"RPUSH", "l", "abc", "de"}), ":2\r\n");
    EXPECT_EQ(c.call({"SADD", "s", "x"}), ":1\r\n");
    EXPECT_EQ(c.call({"DEL", "h", "l", "s"}), ":3\r\n");
    EXPECT_EQ(server_->stats().usedMemory, 0u);
    // Past maxmemory: the commands that grow get -OOM; those that shrink still work.
    EXPECT_EQ(c.call({"RPUSH", "l", std::string(2000, 'x')}), ":1\r\n");
    EXPECT_EQ(c.call({"CONFIG", "SET", "maxmemory", "1000"}), kOk);
    EXPECT_EQ(c.call({"HSET", "h", "f", "v"}), "-OOM command not allowed when used memory > 'maxmemory'.\r\n");
    EXPECT_EQ(c.call({"SADD", "s", "m"}), "-OOM command not allowed when used memory > 'maxmemory'.\r\n");
    EXPECT_EQ(c.call({"LPUSH", "l", "m"}), "-OOM command not allowed when used memory > 'maxmemory'.\r\n");
    EXPECT_EQ(c.call({"RPOP", "l"}), bulk(std::string(2000, 'x')));
    EXPECT_EQ(c.call({"CONFIG", "SET", "maxmemory", "0"}), kOk);
    // Expiry on every type: an absolute time read back exactly (a TTL read after a 30 ms PEXPIRE
    // raced the clock: a run slow enough, as a loaded sanitizer build can be, read -2), then 30 ms
    // ones, each set before the sleep begins and so run out by its end.
    EXPECT_EQ(c.call({"HSET", "h", "f", "v"}), ":1\r\n");
    EXPECT_EQ(c.call({"SADD", "s", "m"}), ":1\r\n");
    EXPECT_EQ(c.call({"RPUSH", "l", "e"}), ":1\r\n");
    for (const char* k : {"h", "s", "l"}) {
        EXPECT_EQ(c.call({"PEXPIREAT", k, "99999999999999"}), ":1\r\n");
        EXPECT_EQ(c.call({"PEXPIRETIME", k}), ":99999999999999\r\n") << k;
    }
    for (const char* k : {"h", "s", "l"}) { EXPECT_EQ(c.call({"PEXPIRE", k, "30"}), ":1\r\n"); }
    std::this_thread::sleep_for(60ms);
    EXPECT_EQ(c.call({"HGET", "h", "f"}), kNil);
    EXPECT_EQ(c.call({"SCARD", "s"}), ":0\r\n");
    EXPECT_EQ(c.call({"LLEN", "l"}), ":0\r\n");
    EXPECT_EQ(server_->stats().usedMemory, 0u);
}

// A canonical dump of the keyspace through the protocol: every key with its type, TTL flag and
// sorted contents, so that two servers (or one before and after a restart) compare as text.
std::string dump(RespClient& c, const std::vector<std::string>& keys) {
    std::string out;
    for (const std::string& k : keys) {
        const std::string type = c.call({"TYPE", k});
        out += k + " " + type;
        if (type == "+string\r\n") {
            out += c.call({"GET", k});
        } else if (type == "+hash\r\n") {
            const std::string all = c.call({"HGETALL", k});
            std::multiset<std::string> parts;
            size_t at = all.find("\r\n") + 2;
            while (at < all.size()) {
                const size_t e1 = all.find("\r\n", all.find("\r\n", at) + 2) + 2;
                const size_t e2 = all.find("\r\n", all.find("\r\n", e1) + 2) + 2;
                parts.insert(all.substr(at, e2 - at));
                at = e2;
            }
            for (const std::string& p : parts) { out += p; }
        } else if (type == "+list\r\n") {
            out += c.call({"LRANGE", k, "0", "-1"});
        } else if (type == "+set\r\n") {
            const std::string all = c.call({"SMEMBERS", k});
            std::multiset<std::string> parts;
            size_t at = all.find("\r\n") + 2;
            while (at < all.size()) {
                const size_t e = all.find("\r\n", all.find("\r\n", at) + 2) + 2;
                parts.insert(all.substr(at, e - at));
                at = e;
            }
            for (const std::string& p : parts) { out += p; }
        }
        out += c.call({"TTL", k}) == ":-1\r\n" ? " persistent\n" : " expires\n";
    }
    return out;
}

TEST_F(KvCollections, EveryMutationReplaysExactly) {
    const ServerOptions o = defaults(true);
    startServer(o);
    std::vector<std::string> keys{"h", "l", "s", "gone", "renamed", "moved", "typechange", "lpopped", "hx", "str"};
    keys.push_back(keyOn(0, "cross"));   // 10
    keys.push_back(keyOn(1, "cross"));   // 11
    keys.push_back(keyOn(0, "msetnx"));  // 12
    keys.push_back(keyOn(1, "msetnx"));  // 13
    keys.push_back(keyOn(1, "del"));     // 14
    keys.push_back(keyOn(keyHash("nxsrc") % 2 == 0 ? 1 : 0, "nxdst"));  // 15: the other shard than nxsrc's
    keys.push_back("nxsrc");
    std::string before;
    {
        RespClient c(port_);
        EXPECT_EQ(c.call({"HSET", "h", "a", "1", "b", "2", "c", "3"}), ":3\r\n");
        EXPECT_EQ(c.call({"HDEL", "h", "b"}), ":1\r\n");
        EXPECT_EQ(c.call({"HINCRBY", "h", "a", "41"}), ":42\r\n");
        EXPECT_EQ(c.call({"HMSET", "h", "d", "4"}), kOk);
        EXPECT_EQ(c.call({"RPUSH", "l", "1", "2", "3", "4", "5"}), ":5\r\n");
        EXPECT_EQ(c.call({"LPUSH", "l", "0", "-1"}), ":7\r\n");
        EXPECT_EQ(c.call({"LPOP", "l", "2"}).substr(0, 4), "*2\r\n");
        EXPECT_EQ(c.call({"RPOP", "l"}), bulk("5"));
        EXPECT_EQ(c.call({"SADD", "s", "x", "y", "z"}), ":3\r\n");
        EXPECT_EQ(c.call({"SREM", "s", "y"}), ":1\r\n");
        EXPECT_EQ(c.call({"SADD", "gone", "only"}), ":1\r\n");
        EXPECT_EQ(c.call({"SREM", "gone", "only"}), ":1\r\n");  // emptied: removed, and stays removed
        EXPECT_EQ(c.call({"RPUSH", "lpopped", "a"}), ":1\r\n");
        EXPECT_EQ(c.call({"LPOP", "lpopped"}), bulk("a"));
        EXPECT_EQ(c.call({"HSET", "renamed", "f", "v"}), ":1\r\n");
        EXPECT_EQ(c.call({"EXPIRE", "renamed", "1000"}), ":1\r\n");
        EXPECT_EQ(c.call({"RENAME", "renamed", "moved"}), kOk);
        EXPECT_EQ(c.call({"SADD", keys[10], "m1", "m2"}), ":2\r\n");
        EXPECT_EQ(c.call({"RENAME", keys[10], keys[11]}), kOk);  // across shards
        // A key that expires and comes back as another type: the expiry is logged as a delete, or
        // the replay would meet the old hash with SADD.
        EXPECT_EQ(c.call({"HSET", "typechange", "f", "v"}), ":1\r\n");
        EXPECT_EQ(c.call({"PEXPIRE", "typechange", "20"}), ":1\r\n");
        EXPECT_EQ(c.call({"HSET", "hx", "f", "v"}), ":1\r\n");
        EXPECT_EQ(c.call({"PEXPIRE", "hx", "20"}), ":1\r\n");
        std::this_thread::sleep_for(40ms);
        EXPECT_EQ(c.call({"SADD", "typechange", "now", "a", "set"}), ":3\r\n");
        EXPECT_EQ(c.call({"HSET", "hx", "g", "w"}), ":1\r\n");  // a new hash, without the old field
        EXPECT_EQ(c.call({"SET", "str", "plain"}), kOk);
        EXPECT_EQ(c.call({"MSETNX", "str", "x", "other", "y"}), ":0\r\n");
        EXPECT_EQ(c.call({"HSETNX", "h", "nx", "1"}), ":1\r\n");
        EXPECT_EQ(c.call({"HSETNX", "h", "nx", "2"}), ":0\r\n");
        EXPECT_EQ(c.call({"RPUSHX", "l", "x"}), ":5\r\n");
        EXPECT_EQ(c.call({"LPUSHX", "nolist", "x"}), ":0\r\n");
        EXPECT_EQ(c.call({"MSETNX", keys[12], "m1", keys[13], "m2"}), ":1\r\n");  // across shards
        EXPECT_EQ(c.call({"SADD", keys[14], "doomed"}), ":1\r\n");
        EXPECT_EQ(c.call({"DEL", keys[14], keys[12]}), ":2\r\n");
        EXPECT_EQ(c.call({"RPUSH", "nxsrc", "a", "b"}), ":2\r\n");
        EXPECT_EQ(c.call({"RENAMENX", "nxsrc", keys[13]}), ":0\r\n");
        EXPECT_EQ(c.call({"RENAMENX", "nxsrc", keys[15]}), ":1\r\n");
        before = dump(c, keys);
        EXPECT_EQ(c.call({"HGETALL", "hx"}), "*2\r\n" + bulk("g") + bulk("w"));
    }
    startServer(o);  // replays the logs
    RespClient c(port_);
    EXPECT_EQ(dump(c, keys), before);
    EXPECT_EQ(c.call({"DBSIZE"}), ":10\r\n");  // h l s moved typechange hx str, cross and msetnx on shard 1, nxdst
    const std::string ttl = c.call({"TTL", "moved"});
    EXPECT_TRUE(ttl == ":1000\r\n" || ttl == ":999\r\n") << ttl;  // the TTL moved with the value and was replayed
}

TEST_F(KvCollections, RenameAndMsetnxAcrossShards) {
    startServer(defaults(false));
    RespClient c(port_);
    const std::string a = keyOn(0, "a"), b = keyOn(1, "b"), a2 = keyOn(0, "a2-");
    EXPECT_EQ(c.call({"RENAME", a, b}), "-ERR no such key\r\n");
    EXPECT_EQ(c.call({"SET", a, "v"}), kOk);
    EXPECT_EQ(c.call({"PEXPIRE", a, "100000"}), ":1\r\n");
    EXPECT_EQ(c.call({"RENAME", a, b}), kOk);
    EXPECT_EQ(c.call({"GET", b}), bulk("v"));
    EXPECT_EQ(c.call({"EXISTS", a}), ":0\r\n");
    EXPECT_NE(c.call({"PTTL", b}), ":-1\r\n");  // the TTL moved with it
    EXPECT_EQ(c.call({"RENAME", b, b}), kOk);
    EXPECT_EQ(c.call({"RENAMENX", b, b}), ":0\r\n");
    EXPECT_EQ(c.call({"SET", a, "other"}), kOk);
    EXPECT_EQ(c.call({"RENAMENX", b, a}), ":0\r\n");
    EXPECT_EQ(c.call({"RENAMENX", a, a2}), ":1\r\n");  // same shard
    EXPECT_EQ(c.call({"GET", a2}), bulk("other"));
    EXPECT_EQ(c.call({"RENAMENX", a2, a}), ":1\r\n");
    EXPECT_EQ(c.call({"RENAME", a, b}), kOk);  // overwrites the target, whatever its type
    EXPECT_EQ(c.call({"GET", b}), bulk("other"));
    EXPECT_EQ(c.call({"MSETNX", a, "1", b, "2"}), ":0\r\n");
    EXPECT_EQ(c.call({"EXISTS", a}), ":0\r\n");
    EXPECT_EQ(c.call({"MSETNX", a, "1", a2, "2"}), ":1\r\n");
    EXPECT_EQ(c.call({"MGET", a, a2}), "*2\r\n" + bulk("1") + bulk("2"));
    EXPECT_EQ(c.call({"MSETNX", a}), "-ERR wrong number of arguments for 'msetnx' command\r\n");
    EXPECT_EQ(c.call({"MSETNX", a, "1", b}), "-ERR wrong number of arguments for 'msetnx' command\r\n");
}

// Every key present for the whole scan comes back exactly once, though the table doubles under the
// scan (Shard::scan walks in hash order).
TEST_F(KvCollections, ScanReturnsEveryKeyOnceAcrossShardsAndRehashes) {
    startServer(defaults(false));
    RespClient c(port_);
    RespClient writer(port_);
    std::set<std::string> present;
    for (int i = 0; i < 300; ++i) {
        const std::string k = "k" + std::to_string(i);
        EXPECT_EQ(c.call({"SET", k, "v"}), kOk);
        present.insert(k);
    }
    EXPECT_EQ(c.call({"HSET", "ahash", "f", "v"}), ":1\r\n");
    std::map<std::string, int> seen;
    std::string cursor = "0";
    int calls = 0, added = 0;
    do {
        const std::string r = c.call({"SCAN", cursor, "COUNT", "7"});
        ASSERT_EQ(r.substr(0, 5), "*2\r\n$") << r;
        size_t at = r.find("\r\n", 4) + 2;
        const size_t end = r.find("\r\n", at);
        cursor = r.substr(at, end - at);
        at = r.find("\r\n", end + 2) + 2;  // past the array header
        while (at < r.size()) {
            const size_t lenEnd = r.find("\r\n", at);
            const size_t len = std::stoul(r.substr(at + 1, lenEnd - at - 1));
            ++seen[r.substr(lenEnd + 2, len)];
            at = lenEnd + 2 + len + 2;
        }
        // Meanwhile the table grows (rehashes) and other keys come and go.
        for (int j = 0; j < 60; ++j) { writer.call({"SET", "new" + std::to_string(added++), "v"}); }
        writer.call({"DEL", "new" + std::to_string(added / 2)});
        ++calls;
    } while (cursor != "0" && calls < 100000);
    // 150 keys a shard at first (256 slots); twice 300 more make the tables double twice at least.
    EXPECT_GE(added, 600) << "the tables did not grow under the scan";
    for (const std::string& k : present) { EXPECT_EQ(seen[k], 1) << k << " was not returned once"; }
    EXPECT_EQ(seen["ahash"], 1);
    // MATCH and TYPE filter what a whole scan returns.
    auto scanAll = [&](const V& options) {
        std::set<std::string> keys;
        std::string cur = "0";
        do {
            V args{"SCAN", cur};
            args.insert(args.end(), options.begin(), options.end());
            const std::string one = c.call(args);
            const size_t a = one.find("\r\n", 4) + 2;
            cur = one.substr(a, one.find("\r\n", a) - a);
            size_t at = one.find("\r\n", one.find("\r\n", a) + 2) + 2;
            while (at < one.size()) {
                const size_t lenEnd = one.find("\r\n", at);
                const size_t len = std::stoul(one.substr(at + 1, lenEnd - at - 1));
                keys.insert(one.substr(lenEnd + 2, len));
                at = lenEnd + 2 + len + 2;
            }
        } while (cur != "0");
        return keys;
    };
    EXPECT_EQ(scanAll({"MATCH", "ahas?"}), std::set<std::string>{"ahash"});
    EXPECT_EQ(scanAll({"TYPE", "hash", "COUNT", "1000"}), std::set<std::string>{"ahash"});
    EXPECT_EQ(scanAll({"MATCH", "k29?", "TYPE", "string"}).size(), 10u);
    EXPECT_EQ(c.call({"SCAN", "x"}), "-ERR invalid cursor\r\n");
    EXPECT_EQ(c.call({"SCAN", "0", "COUNT", "x"}), "-ERR value is not an integer or out of range\r\n");
    EXPECT_EQ(c.call({"SCAN", "0", "COUNT", "0"}), "-ERR syntax error\r\n");
    EXPECT_EQ(c.call({"SCAN", "0", "MATCH"}), "-ERR syntax error\r\n");
    EXPECT_EQ(c.call({"SCAN", "18446744073709551615"}), "*2\r\n$1\r\n0\r\n*0\r\n");
}

TEST_F(KvCollections, RandomkeyClientListAndSave) {
    startServer(defaults(true));
    RespClient c(port_);
    EXPECT_EQ(c.call({"RANDOMKEY"}), kNil);
    EXPECT_EQ(c.call({"SET", "only", "v"}), kOk);
    EXPECT_EQ(c.call({"RANDOMKEY"}), bulk("only"));
    EXPECT_EQ(c.call({"SET", "other", "v"}), kOk);
    std::set<std::string> got;
    for (int i = 0; i < 64; ++i) { got.insert(c.call({"RANDOMKEY"})); }
    EXPECT_EQ(got, (std::set<std::string>{bulk("only"), bulk("other")}));
    EXPECT_EQ(c.call({"CLIENT", "SETNAME", "me"}), kOk);
    RespClient d(port_);
    EXPECT_EQ(d.call({"GET", "only"}), bulk("v"));
    const std::string list = c.call({"CLIENT", "LIST"});
    ASSERT_EQ(list[0], '$') << list;
    const std::string text = list.substr(list.find("\r\n") + 2);
    EXPECT_NE(text.find(" addr=127.0.0.1:"), std::string::npos) << text;
    EXPECT_NE(text.find(" laddr=127.0.0.1:" + std::to_string(port_) + " fd="), std::string::npos) << text;
    EXPECT_NE(text.find(" name=me age="), std::string::npos) << text;
    EXPECT_NE(text.find(" db=0 "), std::string::npos) << text;
    EXPECT_NE(text.find(" cmd=client|list "), std::string::npos) << text;
    EXPECT_NE(text.find(" cmd=get "), std::string::npos) << text;
    EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 3) << text;  // 2 lines, then the bulk's CRLF
    EXPECT_EQ(text.rfind("id=", 0), 0u) << text;
    // An unknown command leaves NULL, as Redis 7.0 shows it, not the name it was sent by.
    EXPECT_EQ(d.call({"NOSUCH", "x"}), "-ERR unknown command 'NOSUCH', with args beginning with: 'x' \r\n");
    const std::string after = c.call({"CLIENT", "LIST"});
    EXPECT_NE(after.find(" cmd=NULL "), std::string::npos) << after;
    EXPECT_EQ(after.find("nosuch"), std::string::npos) << after;
    EXPECT_EQ(c.call({"CLIENT", "LIST", "ID", "999999"}), "$0\r\n\r\n");
    EXPECT_EQ(c.call({"CLIENT", "LIST", "ID", "x"}), "-ERR Invalid client ID\r\n");
    EXPECT_EQ(c.call({"CLIENT", "LIST", "FOO"}), "-ERR syntax error\r\n");
    // A container command shows its subcommand, as Redis 7.0 does (checked against redis-server 7.0.15),
    // also when its arguments were wrong; an unknown subcommand shows NULL; one without any, the command.
    struct Case {
        std::vector<std::string> call;
        std::string cmd;
    };
    const std::vector<Case> cases = {
        {{"CLIENT", "SETNAME", "d"}, " cmd=client|setname "},
        {{"client", "SetName"}, " cmd=client|setname "},
        {{"CONFIG", "GET", "maxmemory"}, " cmd=config|get "},
        {{"COMMAND", "COUNT"}, " cmd=command|count "},
        {{"COMMAND"}, " cmd=command "},
        {{"CLIENT", "FOO"}, " cmd=NULL "},
        {{"CONFIG", "nope"}, " cmd=NULL "},
        {{"GET", "k", "extra"}, " cmd=get "},
    };
    for (const Case& k : cases) {
        (void)d.call(k.call);
        const std::string l = c.call({"CLIENT", "LIST"});
        // d's line: the one that is not c's own (cmd=client|list).
        size_t at = 0;
        std::string dLine;
        while (at < l.size()) {
            const size_t end = l.find('\n', at);
            const std::string line = l.substr(at, end == std::string::npos ? std::string::npos : end - at);
            if (line.find("id=") != std::string::npos && line.find(" cmd=client|list ") == std::string::npos) { dLine = line; }
            if (end == std::string::npos) { break; }
            at = end + 1;
        }
        EXPECT_NE(dLine.find(k.cmd), std::string::npos) << k.call[0] << ": " << dLine;
    }
    const uint64_t rewrites = server_->stats().rewrites;
    EXPECT_EQ(c.call({"SAVE"}), kOk);
    EXPECT_GE(server_->stats().rewrites, rewrites + 2);  // every shard's log rewritten
    EXPECT_EQ(c.call({"BGREWRITEAOF"}), "+Background append only file rewriting started\r\n");
}

#if defined(SPINDLE_FAULT_INJECTION)
// A BGREWRITEAOF right after SAVE starts: once SAVE has answered, no rewrite is in progress. A rewrite
// used to wake its waiters before it cleared "in progress", so a carrier thread preempted between the
// two (here: the fault point kRewriteEnd, which sleeps 50 ms there) let SAVE answer while
// BGREWRITEAOF still found a rewrite running (seen once in ten loaded runs of the suite).
TEST_F(KvCollections, ABgrewriteaofRightAfterSaveStarts) {
    startServer(defaults(true));
    RespClient c(port_);
    ASSERT_EQ(c.call({"SET", "k", "v"}), kOk);
    inject::ArmedFault slow(inject::Point::kRewriteEnd, 50, 1000);
    for (int i = 0; i < 3; ++i) {
        ASSERT_EQ(c.call({"SAVE"}), kOk);
        ASSERT_EQ(c.call({"BGREWRITEAOF"}), "+Background append only file rewriting started\r\n") << "round " << i;
    }
    EXPECT_EQ(c.call({"SAVE"}), kOk);
}
#endif

// How much longer than its planned time a race may run to reach the reads its test asks for.
constexpr auto kRaceCap = 20s;

// Writers MSET two keys on different shards to the same value over and over; readers, with MGET and
// with GET one key after the other, must never see the two differ in a way that shows half an MSET.
TEST_F(KvCollections, NoClientSeesHalfAnMset) {
    startServer(defaults(false));
    const std::string a = keyOn(0, "atomic-a"), b = keyOn(1, "atomic-b");
    {
        RespClient c(port_);
        ASSERT_EQ(c.call({"MSET", a, "0", b, "0"}), kOk);
    }
    std::atomic<bool> stop{false};
    std::atomic<int> torn{0}, reads{0};
    std::string firstTear;
    std::vector<std::thread> threads;
    for (int w = 0; w < 2; ++w) {
        threads.emplace_back([&, w] {
            RespClient c(port_);
            for (int i = 1; !stop.load(); ++i) {
                const std::string v = std::to_string(w) + ":" + std::to_string(i);
                // Alternate the order so that both shards go first sometimes.
                if (i % 2 == 0) {
                    c.call({"MSET", a, v, b, v});
                } else {
                    c.call({"MSET", b, v, a, v});
                }
            }
        });
    }
    for (int r = 0; r < 2; ++r) {
        threads.emplace_back([&, r] {
            RespClient c(port_);
            while (!stop.load()) {
                std::string va, vb;
                if (r == 0) {
                    const std::string m = c.call({"MGET", a, b});
                    const size_t mid = m.find("$", 5);
                    va = m.substr(4, mid - 4);
                    vb = m.substr(mid);
                } else {
                    // Without a writer in between, GET a then GET b see the same MSET or a later
                    // one; never b older than a... unless a later MSET landed: so re-read a.
                    va = c.call({"GET", a});
                    vb = c.call({"GET", b});
                    const std::string va2 = c.call({"GET", a});
                    if (va == va2 && vb != va) {  // a stayed put across the read of b: b must equal it
                        if (torn.fetch_add(1) == 0) { firstTear = "GET " + va + " / " + vb; }
                    }
                    reads.fetch_add(1);
                    continue;
                }
                if (va != vb && torn.fetch_add(1) == 0) { firstTear = "MGET " + va + " / " + vb; }
                reads.fetch_add(1);
            }
        });
    }
    // 700 ms, and on until the readers have done what the check below asks (see kRaceCap).
    std::this_thread::sleep_for(700ms);
    for (const auto capped = std::chrono::steady_clock::now() + kRaceCap;
         reads.load() <= 100 && torn.load() == 0 && std::chrono::steady_clock::now() < capped;) {
        std::this_thread::sleep_for(5ms);
    }
    stop.store(true);
    for (auto& t : threads) { t.join(); }
    EXPECT_EQ(torn.load(), 0) << "a client saw half an MSET: " << firstTear;
    EXPECT_GT(reads.load(), 100);
}

// A race's tally: the tears its checkers saw, and the first of each kind.
struct Tears {
    std::atomic<int> count{0};
    std::mutex mu;
    std::map<std::string, std::string> first;  // kind -> what was seen

    void add(const std::string& kind, const std::string& what) {
        count.fetch_add(1);
        std::lock_guard lock(mu);
        first.emplace(kind, what);
    }
    [[nodiscard]] std::string report() {
        std::lock_guard lock(mu);
        std::string out;
        for (const auto& [kind, what] : first) {
            std::string shown = what;
            for (size_t at = 0; (at = shown.find("\r\n", at)) != std::string::npos;) { shown.replace(at, 2, " "); }
            out += "\n  " + kind + ": " + shown;
        }
        return out;
    }
};

// Runs `threads` (writers and checkers, each looping until its stop flag is set) for `limit`, and on
// past it until `progress` (the checkers' count) exceeds `atLeast`, for kRaceCap at most: a loaded
// machine races as many reads as a quiet one, only more slowly (a fixed time let a test's "enough
// reads" check fail under load: 55 of 60 reads in 300 ms). Ends early once every one of `kinds` has
// torn (a failing run). Then joins them.
void race(std::vector<std::function<void(const std::atomic<bool>&)>> threads, std::chrono::milliseconds limit,
          Tears& tears, size_t kinds, const std::atomic<int>& progress, int atLeast) {
    std::atomic<bool> stop{false};
    std::vector<std::thread> running;
    for (auto& fn : threads) {
        running.emplace_back([&stop, fn = std::move(fn)] { fn(stop); });
    }
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
        const auto now = std::chrono::steady_clock::now();
        if (now - start >= limit && (progress.load() > atLeast || now - start >= limit + kRaceCap)) { break; }
        {
            std::lock_guard lock(tears.mu);
            if (tears.first.size() >= kinds) { break; }
        }
        std::this_thread::sleep_for(5ms);
    }
    stop.store(true);
    for (auto& t : running) { t.join(); }
}

// FLUSHALL (and FLUSHDB) racing MSETs of a pair across the shards: a flush is all or nothing to
// them, so the pair is always both there or both gone, during the race and after it.
TEST_F(KvCollections, FlushallNeverLeavesHalfAnMset) {
    startServer(defaults(false));
    const std::string a = keyOn(0, "flush-a"), b = keyOn(1, "flush-b");
    Tears tears;
    std::atomic<int> reads{0};
    auto check = [&](RespClient& c, const char* who) {
        const std::string n = c.call({"EXISTS", a, b});
        if (n != ":0\r\n" && n != ":2\r\n") { tears.add(who, "EXISTS " + n); }
        reads.fetch_add(1);
    };
    race({[&](const std::atomic<bool>& stop) {
              RespClient c(port_);
              for (int i = 0; !stop.load(); ++i) {
                  c.call(i % 2 == 0 ? V{"MSET", a, "v", b, "v"} : V{"MSET", b, "v", a, "v"});
                  check(c, "after an MSET");
              }
          },
          [&](const std::atomic<bool>& stop) {
              RespClient c(port_);
              for (int i = 0; !stop.load(); ++i) { EXPECT_EQ(c.call({i % 2 == 0 ? "FLUSHALL" : "FLUSHDB"}), kOk); }
          },
          [&](const std::atomic<bool>& stop) {
              RespClient c(port_);
              while (!stop.load()) { check(c, "reader"); }
          }},
         300ms, tears, 1, reads, 40);
    EXPECT_EQ(tears.count.load(), 0) << "half an MSET outlived a FLUSHALL:" << tears.report();
    EXPECT_GT(reads.load(), 40);
    RespClient c(port_);
    const std::string n = c.call({"EXISTS", a, b});
    EXPECT_TRUE(n == ":0\r\n" || n == ":2\r\n") << n;
}

// The cursor and the keys of a SCAN reply.
std::pair<std::string, V> scanReply(const std::string& r) {
    // *2\r\n$<n>\r\n<cursor>\r\n*<k>\r\n...
    if (r.rfind("*2\r\n$", 0) != 0) { return {}; }
    const size_t lenEnd = r.find("\r\n", 4);
    const auto len = static_cast<size_t>(std::atol(r.c_str() + 5));
    return {r.substr(lenEnd + 2, len), testing_support::bulkItems(r.substr(lenEnd + 2 + len + 2))};
}

// KEYS, DBSIZE and RANDOMKEY against multi-key commands across the shards: one writer moves a key
// from shard to shard with RENAME (exactly one of k0 and k1 exists at any time), another MSETs and
// DELs a pair (both or neither). A reader of the whole keyspace never sees it between the halves of
// either, as no Redis client can.
TEST_F(KvCollections, KeyspaceReadsNeverSeeHalfACommand) {
    startServer(defaults(false));
    const std::string k0 = keyOn(0, "move-"), k1 = keyOn(1, "move-"), a = keyOn(0, "pair-a"), b = keyOn(1, "pair-b");
    {
        RespClient c(port_);
        ASSERT_EQ(c.call({"SET", k0, "v"}), kOk);
    }
    Tears tears;
    std::atomic<int> reads{0};
    auto reader = [&](const char* command, auto check) {
        return [&, command, check](const std::atomic<bool>& stop) {
            RespClient c(port_);
            const V args = std::string_view(command) == "KEYS" ? V{"KEYS", "*"} : V{command};
            while (!stop.load()) {
                const std::string r = c.call(args);
                if (!check(r)) { tears.add(command, r); }
                reads.fetch_add(1);
            }
        };
    };
    race({[&](const std::atomic<bool>& stop) {
              RespClient c(port_);
              for (int i = 0; !stop.load(); ++i) {
                  const std::string r = i % 2 == 0 ? c.call({"RENAME", k0, k1}) : c.call({"RENAME", k1, k0});
                  if (r != kOk) { tears.add("RENAME", r); }
              }
          },
          [&](const std::atomic<bool>& stop) {
              RespClient c(port_);
              while (!stop.load()) {
                  c.call({"MSET", a, "v", b, "v"});
                  c.call({"DEL", b, a});
              }
          },
          reader("KEYS",
                 [&](const std::string& r) {
                     const V keys = testing_support::bulkItems(r);
                     auto has = [&](const std::string& k) { return std::count(keys.begin(), keys.end(), k); };
                     return has(k0) + has(k1) == 1 && has(a) == has(b);
                 }),
          reader("DBSIZE", [](const std::string& r) { return r == ":1\r\n" || r == ":3\r\n"; }),
          reader("RANDOMKEY", [](const std::string& r) { return r != kNil; })},
         300ms, tears, 3, reads, 60);
    EXPECT_EQ(tears.count.load(), 0) << "a keyspace read saw half a command:" << tears.report();
    EXPECT_GT(reads.load(), 60);
}

// SCAN walks the shards one after another, so a walk may or may not return a key created during it;
// but once a SCAN of one shard has returned a key that an MSET created, that MSET is done, and a SCAN
// of the other shard that starts afterwards must return its other key. Three carriers (three
// shards), so that an MSET's coordinator may sit on neither of its two shards and send both halves
// from there. Writers create pair i (a key on shard 0 and one on shard 1, named p<w>.<i>...) and
// delete pair i - 64; readers send a SCAN of each of the two shards in one batch (shard 0 first, then
// shard 1 first), so that the second follows the first closely, and check the pairs too recent to
// have been deleted since. The second SCAN must overtake the MSET's message to its shard, which is
// rare: against the server before SCAN held its shard this failed in about one run in four.
TEST_F(KvCollections, ScanNeverSeesHalfAnMset) {
    runtime_.reset();
    auto three = Runtime::start(spindle::testing_support::withCarriers(3));
    ASSERT_TRUE(three) << three.error().message();
    runtime_.emplace(std::move(*three));
    startServer(defaults(false));
    auto pairKey = [](unsigned shard, int w, int i) {
        const std::string prefix = "p" + std::to_string(w) + "." + std::to_string(i) + (shard == 0 ? "a-" : "b-");
        for (int n = 0;; ++n) {
            std::string k = prefix + std::to_string(n);
            if (keyHash(k) % 3 == shard) { return k; }
        }
    };
    constexpr int kLive = 64;
    Tears tears;
    std::atomic<int> reads{0};
    const std::string cursors[3] = {"0", std::to_string(uint64_t{1} << 54), std::to_string(uint64_t{2} << 54)};
    auto writer = [&](int w) {
        return [&, w](const std::atomic<bool>& stop) {
            RespClient c(port_);
            for (int i = 0; !stop.load(); ++i) {
                c.call({"MSET", pairKey(0, w, i), "v", pairKey(1, w, i), "v"});
                if (i >= kLive) { c.call({"DEL", pairKey(0, w, i - kLive), pairKey(1, w, i - kLive)}); }
            }
        };
    };
    auto reader = [&](const std::atomic<bool>& stop) {
        RespClient c(port_);
        for (unsigned first = 0; !stop.load(); first = 1 - first) {
            const unsigned second = 1 - first;
            if (!c.sendRaw(RespClient::encode({"SCAN", cursors[first], "COUNT", "100000"}) +
                           RespClient::encode({"SCAN", cursors[second], "COUNT", "100000"}))) {
                break;
            }
            const auto [cursorA, keysA] = scanReply(c.reply().value_or(""));
            const auto [cursorB, keysB] = scanReply(c.reply().value_or(""));
            // Each shard in one call: its SCAN goes on to the next shard.
            if (cursorA != cursors[first + 1] || cursorB != cursors[second + 1]) { continue; }
            // writer -> pair numbers seen
            std::map<int, std::set<int>> seenA, seenB;
            for (const std::string& k : keysA) { seenA[std::atoi(k.c_str() + 1)].insert(std::atoi(k.c_str() + k.find('.') + 1)); }
            for (const std::string& k : keysB) { seenB[std::atoi(k.c_str() + 1)].insert(std::atoi(k.c_str() + k.find('.') + 1)); }
            for (const auto& [w, pairs] : seenA) {
                const int newest = *pairs.rbegin();
                for (auto it = pairs.lower_bound(newest - kLive / 2); it != pairs.end(); ++it) {
                    if (!seenB[w].contains(*it)) {
                        tears.add("shard " + std::to_string(first) + " first",
                                  "writer " + std::to_string(w) + "'s pair " + std::to_string(*it) + " (newest " +
                                      std::to_string(newest) + ")");
                    }
                }
            }
            reads.fetch_add(1);
        }
    };
    race({writer(0), writer(1), writer(2), reader, reader}, 400ms, tears, 1, reads, 40);
    EXPECT_EQ(tears.count.load(), 0) << "SCAN saw half an MSET:" << tears.report();
    EXPECT_GT(reads.load(), 40);
}

}  // namespace
}  // namespace spindle::kv
