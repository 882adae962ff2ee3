// SPDX-License-Identifier: Apache-2.0
// KeyTable (apps/kv/key_table.h): a model check against std::unordered_map with hashes chosen to
// collide and to wrap round the end of the slot array, backward-shift removal, walks that survive
// doubling (each key exactly once) and shrinking (none missed), clear() with and without the slots.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "apps/kv/key_table.h"

namespace spindle::kv {
namespace {

// A node as KeyTable wants one: a key and what it holds. Counts the nodes alive, so that a test sees
// the table destroy what it drops.
struct Node {
    std::string k;
    std::string v;
    static inline int alive = 0;
    Node(std::string key, std::string value) : k(std::move(key)), v(std::move(value)) { ++alive; }
    ~Node() { --alive; }
    [[nodiscard]] std::string_view key() const noexcept { return k; }
    static void destroy(Node* n) noexcept { delete n; }
};
using Table = KeyTable<Node>;

void put(Table& t, const std::string& k, uint64_t h, const std::string& v) { t.insert(h, new Node(k, v)); }

// Hashes from a few clusters, some at the very top of the hash space (their home slots are the last
// ones, so their runs wrap round to slot 0), so that runs are long and removals shift a lot.
uint64_t clusteredHash(std::mt19937_64& rng) {
    static constexpr uint64_t kBases[] = {0, uint64_t{1} << 62, ~uint64_t{0} - 5};
    const uint64_t base = kBases[rng() % 3];
    const uint64_t offset = rng() % (uint64_t{1} << 58);
    return base == kBases[2] ? base - (offset >> 40) : base + offset;
}

// tableHash spreads the keys people use (a counter after a prefix, as redis-benchmark's) evenly over
// the top bits that pick the home slot, and tells apart keys that differ in one byte at any length,
// including the bytes the overlapping reads of short keys take twice.
TEST(TableHash, SpreadsCountersOverTheTopBitsAndSeparatesNearKeys) {
    std::vector<int> buckets(256);
    constexpr int kKeys = 100'000;
    for (int i = 0; i < kKeys; ++i) { ++buckets[tableHash("key:" + std::to_string(i)) >> 56]; }
    for (int b : buckets) {
        EXPECT_GT(b, kKeys / 256 * 3 / 4);
        EXPECT_LT(b, kKeys / 256 * 5 / 4);
    }
    std::unordered_map<uint64_t, std::string> seen;
    for (size_t len = 0; len <= 40; ++len) {
        for (size_t at = 0; at <= len; ++at) {
            std::string k(len, 'a');
            if (at < len) { k[at] = 'b'; }
            const auto [it, fresh] = seen.emplace(tableHash(k), k);
            EXPECT_TRUE(fresh || it->second == k) << "'" << k << "' and '" << it->second << "' collide";
        }
    }
    EXPECT_EQ(tableHash(std::string_view("ab\0", 3)) == tableHash("ab"), false);
}

TEST(KeyTable, AgreesWithAMapThroughInsertsAndRemovalsOfCollidingKeys) {
    std::mt19937_64 rng(7);
    Table t;
    std::unordered_map<std::string, std::pair<uint64_t, std::string>> model;
    std::vector<std::string> names;
    for (int i = 0; i < 3000; ++i) { names.push_back("k" + std::to_string(i)); }
    std::unordered_map<std::string, uint64_t> hashOf;
    for (const std::string& n : names) { hashOf[n] = clusteredHash(rng); }
    for (int op = 0; op < 30'000; ++op) {
        const std::string& k = names[rng() % names.size()];
        const uint64_t h = hashOf[k];
        if (rng() % 3 != 0) {
            if (Node* n = t.find(k, h)) {
                if (op % 2 == 0) {
                    n->v = "v" + std::to_string(op);
                } else {
                    t.replace(h, n, new Node(k, "v" + std::to_string(op)));
                }
            } else {
                put(t, k, h, "v" + std::to_string(op));
            }
            model[k] = {h, "v" + std::to_string(op)};
        } else {
            EXPECT_EQ(t.erase(k, h), model.erase(k) == 1) << k;
        }
        ASSERT_EQ(t.size(), model.size());
        ASSERT_EQ(Node::alive, static_cast<int>(model.size()));
        ASSERT_LE(t.size() * 4, t.capacity() * 3);
    }
    for (const std::string& n : names) {
        const Node* v = t.find(n, hashOf[n]);
        auto it = model.find(n);
        ASSERT_EQ(v != nullptr, it != model.end()) << n;
        if (v != nullptr) { EXPECT_EQ(v->v, it->second.second); }
    }
    size_t visited = 0;
    t.forEach([&](const Node& n) {
        ++visited;
        EXPECT_EQ(model.at(n.k).second, n.v);
        return true;
    });
    EXPECT_EQ(visited, model.size());
    size_t untilFalse = 0;
    t.forEach([&](const Node&) { return ++untilFalse < 5; });
    EXPECT_EQ(untilFalse, std::min<size_t>(5, model.size())) << "forEach stops when told";
    t.clear();
    EXPECT_EQ(Node::alive, 0);
}

TEST(KeyTable, ANodeStaysWhereItIsWhileOtherKeysComeAndGo) {
    Table t;
    auto* first = new Node("first", "one");
    t.insert(1, first);
    for (uint64_t i = 0; i < 10'000; ++i) { put(t, "k" + std::to_string(i), i * 0x9E3779B97F4A7C15ull, "x"); }
    for (uint64_t i = 0; i < 10'000; i += 2) { ASSERT_TRUE(t.erase("k" + std::to_string(i), i * 0x9E3779B97F4A7C15ull)); }
    EXPECT_EQ(t.find("first", 1), first);
    EXPECT_EQ(first->v, "one");
    EXPECT_FALSE(t.erase("first", 2)) << "a key is found by its hash and its bytes";
    EXPECT_EQ(t.find("first", 2), nullptr);
}

// Walks a table in steps of about `keys`, running `between` after each step; returns how many times
// each key was visited.
template <class F>
std::map<std::string, int> walkAll(Table& t, size_t keys, F&& between) {
    std::map<std::string, int> seen;
    Table::WalkStep step;
    uint64_t lastNext = 0;
    do {
        step = t.walk(step.next, keys, SIZE_MAX, [&](const Node& n, uint64_t) { ++seen[n.k]; });
        if (!step.done) {
            EXPECT_GT(step.next, lastNext) << "a walk goes forward";
            lastNext = step.next;
        }
        between();
    } while (!step.done);
    return seen;
}

TEST(KeyTable, AWalkVisitsEveryKeyThatStayedOnceThoughTheTableDoublesUnderIt) {
    std::mt19937_64 rng(11);
    Table t;
    for (int i = 0; i < 500; ++i) { put(t, "stay" + std::to_string(i), rng(), "v"); }
    const size_t before = t.capacity();
    int added = 0;
    const auto seen = walkAll(t, 50, [&] {
        for (int j = 0; j < 100; ++j) { put(t, "new" + std::to_string(added++), rng(), "v"); }
    });
    EXPECT_GE(t.capacity(), before * 4) << "the table did not double twice under the walk";
    for (int i = 0; i < 500; ++i) { EXPECT_EQ(seen.count("stay" + std::to_string(i)) ? seen.at("stay" + std::to_string(i)) : 0, 1) << i; }
}

TEST(KeyTable, AWalkMissesNothingWhenTheTableShrinksUnderIt) {
    std::mt19937_64 rng(13);
    Table t;
    std::vector<std::pair<std::string, uint64_t>> gone;
    for (int i = 0; i < 2000; ++i) {
        const uint64_t h = rng();
        put(t, "k" + std::to_string(i), h, "v");
        if (i >= 200) { gone.emplace_back("k" + std::to_string(i), h); }
    }
    bool shrunk = false;
    const auto seen = walkAll(t, 30, [&] {
        if (shrunk) { return; }
        for (const auto& [k, h] : gone) { ASSERT_TRUE(t.erase(k, h)); }
        const size_t cap = t.capacity();
        t.shrinkToFit();
        EXPECT_LT(t.capacity(), cap);
        shrunk = true;
    });
    for (int i = 0; i < 200; ++i) { EXPECT_GE(seen.count("k" + std::to_string(i)), 1u) << i; }
}

TEST(KeyTable, ClearKeepsTheSlotsOnlyWhenAsked) {
    Table t;
    t.reserve(1000);
    const size_t cap = t.capacity();
    EXPECT_GE(cap * 3, 1000u * 4);
    for (uint64_t i = 0; i < 100; ++i) { put(t, std::to_string(i), i << 50, "v"); }
    t.clear(true);
    EXPECT_EQ(t.size(), 0u);
    EXPECT_EQ(t.capacity(), cap);
    EXPECT_EQ(t.find("1", uint64_t{1} << 50), nullptr);
    put(t, "again", 5, "v");
    t.clear();
    EXPECT_EQ(t.capacity(), 0u);
    EXPECT_EQ(t.find("again", 5), nullptr);
    EXPECT_EQ(Node::alive, 0);
    const auto step = t.walk(0, 10, SIZE_MAX, [](const Node&, uint64_t) { FAIL(); });
    EXPECT_TRUE(step.done);
    EXPECT_FALSE(t.pick(3, [](const Node&) { return true; }));
    t.prefetch(5);  // hints on an empty table touch nothing
    t.prefetchNode(5);
}

TEST(KeyTable, PickFindsTheOneAcceptableKeyFromAnySeed) {
    Table t;
    for (uint64_t i = 0; i < 300; ++i) { put(t, "k" + std::to_string(i), i * 0x9E3779B97F4A7C15ull, i == 123 ? "yes" : "no"); }
    for (uint64_t seed = 0; seed < 50; ++seed) {
        std::string got;
        ASSERT_TRUE(t.pick(seed * 7919, [&](const Node& n) {
            if (n.v != "yes") { return false; }
            got = n.k;
            return true;
        }));
        EXPECT_EQ(got, "k123");
    }
    EXPECT_FALSE(t.pick(1, [](const Node&) { return false; }));
}

}  // namespace
}  // namespace spindle::kv
