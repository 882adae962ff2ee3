// SPDX-License-Identifier: Apache-2.0
// A spindle-kv shard on its own (no runtime, no log): KEYS's glob, lazy and active expiry, the memory
// and key counts INFO reports, and the fixed key hash that maps keys to shards.
#include "apps/kv/shard.h"

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

}  // namespace
}  // namespace spindle::kv
