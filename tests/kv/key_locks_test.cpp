// SPDX-License-Identifier: Apache-2.0
// KeyLocks on its own: shared and exclusive holds, what single-key commands must wait for, queued
// requests granted strictly in order when keys are released, and the waiters woken by a release.
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

}  // namespace
}  // namespace spindle::kv
