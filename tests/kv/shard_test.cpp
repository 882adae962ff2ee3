// SPDX-License-Identifier: Apache-2.0
// A spindle-kv shard on its own (no runtime, no log): KEYS's glob, lazy and active expiry, the memory
// and key counts INFO reports, and the fixed key hash that maps keys to shards.
#include "apps/kv/shard.h"

#include "apps/kv/wal.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace spindle::kv {
namespace {

TEST(Glob, MatchesAsRedisKeysDoes) {
    struct Case {
        std::string_view pattern, s;
        bool match;
    };
    const std::vector<Case> cases{
        {"*", "", true},          {"*", "anything", true}, {"h?llo", "hello", true}, {"h?llo", "hllo", false},
        {"h*llo", "hllo", true},  {"h*llo", "heeeello", true}, {"h[ae]llo", "hallo", true}, {"h[ae]llo", "hillo", false},
        {"h[^e]llo", "hallo", true}, {"h[^e]llo", "hello", false}, {"h[a-b]llo", "hbllo", true}, {"h[b-a]llo", "hallo", true},
        {"h[a-b]llo", "hcllo", false}, {"\\*", "*", true}, {"\\*", "a", false}, {"[\\]]", "]", true},
        {"a*b*c", "aXXbYYc", true}, {"a*b*c", "aXXbYY", false}, {"**a", "ba", true}, {"user:*:name", "user:42:name", true},
        {"user:*:name", "user:42:age", false}, {"[abc", "b", true}, {"", "", true}, {"", "a", false},
        {"k?y", std::string_view("k\0y", 3), true},
    };
    for (const Case& c : cases) { EXPECT_EQ(globMatch(c.pattern, c.s), c.match) << c.pattern << " vs " << c.s; }
}

TEST(KeyHash, IsFixedAcrossBuilds) {
    // FNV-1a 64: these values must never change, or existing logs would land on other shards.
    EXPECT_EQ(keyHash(""), 0xcbf29ce484222325ull);
    EXPECT_EQ(keyHash("a"), 0xaf63dc4c8601ec8cull);
    EXPECT_EQ(keyHash("foobar"), 0x85944171f73967e8ull);
}

TEST(ShardAlone, LazyAndActiveExpiryAndCounts) {
    Shard s(0);
    const int64_t now = nowMs();
    s.set("plain", "v", 0);
    s.set("soon", "v", now + 10);
    s.set("later", "v", now + 100'000);
    EXPECT_EQ(s.keyCount(), 3u);
    EXPECT_EQ(s.expiresCount(), 2u);
    EXPECT_EQ(s.usedBytes(), 3 * Shard::kEntryOverhead + 5 + 4 + 5 + 3);
    // Lazy: found expired on access.
    EXPECT_EQ(s.find("soon", now + 20), nullptr);
    EXPECT_EQ(s.keyCount(), 2u);
    EXPECT_EQ(s.expiredKeys(), 1u);
    // Active: a changed expiry leaves a stale heap entry that must not remove the key.
    s.set("moved", "v", now + 10);
    s.expireAt("moved", now + 200'000);
    s.set("due1", "v", now + 5);
    s.set("due2", "v", now + 6);
    EXPECT_EQ(s.activeExpire(now + 50, 100), 2u);
    EXPECT_NE(s.find("moved", now + 50), nullptr);
    EXPECT_EQ(s.keyCount(), 3u);  // plain, later, moved
    // The budget bounds one pass.
    for (int i = 0; i < 10; ++i) { s.set("b" + std::to_string(i), "v", now + 1); }
    EXPECT_EQ(s.activeExpire(now + 50, 4), 4u);
    EXPECT_EQ(s.activeExpire(now + 50, 100), 6u);
    EXPECT_TRUE(s.persist("later"));
    EXPECT_FALSE(s.persist("later"));
    EXPECT_EQ(s.expiresCount(), 1u);  // "moved"
    s.flush();
    EXPECT_EQ(s.keyCount(), 0u);
    EXPECT_EQ(s.usedBytes(), 0u);
    EXPECT_EQ(s.expiresCount(), 0u);
}

// appendRestoreRecords (RENAME's, and a snapshot's, way of writing a key whole) replays into the same
// key: value, type, elements, expiry, and the same byte count.
// A string lives in its Entry: a shorter or equal one is written in place (the entry stays where it
// is), a longer one than the entry has room for gets a new entry in the same slot, and a collection
// key set to a string becomes one. Binary bytes, empty keys and values, and the byte counts follow.
TEST(ShardAlone, StringsChangeInPlaceOrMoveToALargerEntry) {
    Shard s(0);
    const int64_t now = nowMs();
    s.set("k", "short", 0);
    const Entry* first = s.find("k", now);
    ASSERT_NE(first, nullptr);
    EXPECT_EQ(first->key(), "k");
    EXPECT_GE(first->room(), 5u);
    s.set("k", "tiny", 0);
    EXPECT_EQ(s.find("k", now), first) << "a string that fits is written in place";
    EXPECT_EQ(first->value(), "tiny");
    const std::string big(1000, 'x');
    s.set("k", big, now + 100'000);
    const Entry* second = s.find("k", now);
    ASSERT_NE(second, nullptr);
    EXPECT_EQ(second->value(), big);
    EXPECT_EQ(second->expireAtMs, now + 100'000);
    EXPECT_EQ(s.expiresCount(), 1u);
    const std::string bin("a\0b\r\n", 5);
    s.set("k", bin, 0);
    EXPECT_EQ(s.find("k", now)->value(), bin);
    EXPECT_EQ(s.expiresCount(), 0u);
    s.set("", "", 0);
    ASSERT_NE(s.find("", now), nullptr);
    EXPECT_EQ(s.find("", now)->value(), "");
    const std::string_view fv[] = {"f", "v"};
    EXPECT_EQ(s.hset("h", fv), 1);
    s.set("h", "now a string", 0);
    ASSERT_TRUE(s.find("h", now)->isString());
    EXPECT_EQ(s.find("h", now)->value(), "now a string");
    EXPECT_EQ(s.keyCount(), 3u);
    const uint64_t used = s.usedBytes();
    EXPECT_EQ(used, 3 * Shard::kEntryOverhead + (1 + bin.size()) + 0 + (1 + 12));
    ASSERT_TRUE(s.del("k"));
    EXPECT_EQ(s.usedBytes(), used - (Shard::kEntryOverhead + 1 + bin.size()));
}

TEST(ShardAlone, RestoreRecordsRebuildEveryType) {
    Shard a(0);
    const int64_t now = nowMs();
    const std::vector<std::string_view> pairs{"f1", "v1", "f2", "v2"}, elems{"x", "y", "z"}, members{"m", "n"};
    const std::string binary("bin\0ary", 7);
    a.set("str", binary, 0);
    (void)a.hset("hash", pairs);
    (void)a.push("list", /*left=*/false, elems);
    (void)a.sadd("set", members);
    a.expireAt("hash", now + 100'000);
    std::string log;
    for (const char* k : {"str", "hash", "list", "set"}) { appendRestoreRecords(*a.find(k, now), log); }
    Shard b(1);
    const ScanReport rep = scanLog(log, [&](std::string_view p) { return b.replay(p); });
    EXPECT_EQ(rep.records, 4u);
    EXPECT_EQ(rep.droppedBytes, 0u);
    EXPECT_EQ(b.keyCount(), 4u);
    EXPECT_EQ(b.expiresCount(), 1u);
    EXPECT_EQ(b.usedBytes(), a.usedBytes());
    EXPECT_EQ(b.find("str", now)->value(), binary);
    EXPECT_EQ(b.find("hash", now)->hash(), a.find("hash", now)->hash());
    EXPECT_EQ(b.find("hash", now)->expireAtMs, now + 100'000);
    EXPECT_EQ(b.find("list", now)->list(), a.find("list", now)->list());
    EXPECT_EQ(b.find("set", now)->set(), a.find("set", now)->set());
    // A damaged record (an element count past the payload) is refused, not applied.
    using namespace std::string_literals;
    EXPECT_FALSE(b.replay("\x0c\x01\0\0\0k\x02"s + std::string(8, '\0') + "\xff\xff\xff\x7f"s));
}

TEST(ShardAlone, CollectionsCountTheirBytesAndVanishWhenEmpty) {
    Shard s(0);
    const std::vector<std::string_view> pairs{"field", "value"}, elems{"abc", "de"};
    (void)s.hset("h", pairs);
    EXPECT_EQ(s.usedBytes(), 1 + Shard::kEntryOverhead + 10 + Shard::kElementOverhead);
    (void)s.push("l", true, elems);
    EXPECT_EQ(s.pop("l", true, 5), (std::vector<std::string>{"de", "abc"}));
    EXPECT_EQ(s.find("l", nowMs()), nullptr);
    const std::vector<std::string_view> field{"field"};
    EXPECT_EQ(s.hdel("h", field), 1);
    EXPECT_EQ(s.keyCount(), 0u);
    EXPECT_EQ(s.usedBytes(), 0u);
}

}  // namespace
}  // namespace spindle::kv
