// SPDX-License-Identifier: Apache-2.0
// KeyLocks on its own: shared and exclusive holds, what single-key commands must wait for, queued
// requests granted strictly in order when keys are released, and the waiters woken by a release;
// whole-shard holds (the keyspace commands) against key holds and single-key commands.
#include "apps/kv/key_locks.h"

#include <gtest/gtest.h>

namespace spindle::kv {
namespace {

void fill(LockRequest& r, std::vector<std::string_view> keys, bool exclusive) {
    r.keys = std::move(keys);
    r.exclusive = exclusive;
}

TEST(KeyLocks, SharedAndExclusiveHolds) {
    KeyLocks locks;
    EXPECT_TRUE(locks.idle());
    LockRequest readA, readB, write;
    fill(readA, {"a", "b"}, false);
    fill(readB, {"b"}, false);
    fill(write, {"b", "c"}, true);
    ASSERT_TRUE(locks.tryLock(readA));
    ASSERT_TRUE(locks.tryLock(readB));  // shared with shared
    EXPECT_FALSE(locks.tryLock(write));  // b is read-held
    EXPECT_FALSE(locks.blocked("b", /*write=*/false));  // reads pass a shared hold
    EXPECT_TRUE(locks.blocked("b", /*write=*/true));
    EXPECT_FALSE(locks.blocked("c", true));
    locks.unlock(readA);
    locks.unlock(readB);
    EXPECT_TRUE(locks.idle());
    ASSERT_TRUE(locks.tryLock(write));
    EXPECT_TRUE(locks.blocked("c", false));  // an exclusive hold blocks reads too
    locks.unlock(write);
    EXPECT_EQ(locks.heldKeys(), 0u);
}

TEST(KeyLocks, QueuedRequestsAreGrantedInOrderAndWaitersWoken) {
    KeyLocks locks;
    LockRequest first, second, third, other;
    fill(first, {"k"}, true);
    fill(second, {"k", "x"}, true);
    fill(third, {"x"}, true);
    fill(other, {"free"}, false);
    ASSERT_TRUE(locks.lockOrQueue(first));
    EXPECT_FALSE(locks.lockOrQueue(second));
    // "x" is free, but an earlier request waits: third queues behind it (no overtaking, no starvation).
    EXPECT_FALSE(locks.lockOrQueue(third));
    EXPECT_FALSE(locks.tryLock(other));  // nor does an optimistic try overtake
    FiberFuture woken;
    locks.waitForUnlock(woken);
    locks.unlock(first);
    EXPECT_TRUE(woken.isSet());
    EXPECT_TRUE(second.granted.isSet());
    EXPECT_FALSE(third.granted.isSet());  // x is second's now
    locks.unlock(second);
    EXPECT_TRUE(third.granted.isSet());
    locks.unlock(third);
    EXPECT_TRUE(locks.idle());
}

void fillWhole(LockRequest& r, bool exclusive) {
    r.wholeShard = true;
    r.exclusive = exclusive;
}

// A shared whole-shard hold (KEYS, DBSIZE, SCAN, RANDOMKEY) shares with readers and waits for, then
// blocks, writers of any key; an exclusive one (FLUSHALL) conflicts with every hold and command.
TEST(KeyLocks, WholeShardHoldsConflictWithEveryKey) {
    KeyLocks locks;
    LockRequest read, write, readB, scan, keys, flush;
    fill(read, {"a"}, false);
    fill(write, {"b"}, true);
    fill(readB, {"b"}, false);
    fillWhole(scan, false);
    fillWhole(keys, false);
    fillWhole(flush, true);
    ASSERT_TRUE(locks.tryLock(write));
    EXPECT_FALSE(locks.tryLock(scan));  // b is being written: a reader of the shard waits
    EXPECT_TRUE(locks.blocked(scan));
    ASSERT_TRUE(locks.tryLock(read));
    locks.unlock(write);
    EXPECT_FALSE(locks.blocked(scan));
    ASSERT_TRUE(locks.tryLock(scan));  // beside the reader of a
    ASSERT_TRUE(locks.tryLock(keys));
    EXPECT_FALSE(locks.idle());
    EXPECT_FALSE(locks.blocked("zz", /*write=*/false));
    EXPECT_TRUE(locks.blocked("zz", /*write=*/true));  // a key no request names: the shard is held
    EXPECT_TRUE(locks.blocked(write));
    EXPECT_TRUE(locks.blocked(flush));
    locks.unlock(read);
    locks.unlock(scan);
    EXPECT_TRUE(locks.blocked(flush));  // keys still holds it
    locks.unlock(keys);
    EXPECT_TRUE(locks.idle());
    ASSERT_TRUE(locks.tryLock(flush));
    EXPECT_EQ(locks.heldKeys(), 0u);
    EXPECT_TRUE(locks.blocked("zz", /*write=*/false));
    EXPECT_TRUE(locks.blocked(read));
    EXPECT_TRUE(locks.blocked(scan));
    EXPECT_FALSE(locks.lockOrQueue(readB));
    locks.unlock(flush);
    EXPECT_TRUE(readB.granted.isSet());
    locks.unlock(readB);
    EXPECT_TRUE(locks.idle());
}

// Whole-shard requests queue with key requests and are granted strictly in order.
TEST(KeyLocks, WholeShardRequestsQueueInOrder) {
    KeyLocks locks;
    LockRequest mset, other, flush, keys;
    fill(mset, {"a"}, true);
    fill(other, {"b"}, true);
    fillWhole(flush, true);
    fillWhole(keys, false);
    ASSERT_TRUE(locks.lockOrQueue(mset));
    EXPECT_FALSE(locks.lockOrQueue(flush));
    EXPECT_FALSE(locks.lockOrQueue(other));  // b is free, but the flush came first
    EXPECT_FALSE(locks.lockOrQueue(keys));
    locks.unlock(mset);
    EXPECT_TRUE(flush.granted.isSet());
    EXPECT_FALSE(other.granted.isSet());
    locks.unlock(flush);
    EXPECT_TRUE(other.granted.isSet());
    EXPECT_FALSE(keys.granted.isSet());  // b is being written
    locks.unlock(other);
    EXPECT_TRUE(keys.granted.isSet());
    locks.unlock(keys);
    EXPECT_TRUE(locks.idle());
}

}  // namespace
}  // namespace spindle::kv
