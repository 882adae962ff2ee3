// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The key intents of one shard: which keys multi-shard commands (MGET, MSET, MSETNX, DEL, EXISTS,
/// UNLINK, RENAME across shards) hold while they run, so that no client sees such a command half
/// done. It is the lock table of a VLL transaction (Dragonfly's, after Ren, Thomson and Abadi's
/// "Lightweight Locking for Main Memory Database Systems"): no mutex, only state that the shard's
/// own carrier touches, reached by messages like everything else in the shard.
///
/// Protocol (Server's multi-key path, see apps/kv/server.cpp, "Multi-key commands"):
/// 1. Intent: the coordinator (the client's connection fiber) asks every shard of the command at once
///    to tryLock() its keys. If one refuses, it keeps what it got below the first refusal (as if taken
///    in order), releases what it got above it, and goes on one shard after another in ascending shard
///    order with lockOrQueue(), waiting on each grant. Every waiting coordinator holds locks only on
///    shards below the one it waits on, and a shard grants its queue in order, so no cycle of waits
///    can form.
/// 2. Execute: with every key held, the shards do their part at once; the last message of each
///    shard also releases its keys (unlock()), which grants queued requests and wakes the waiters.
/// A single-key command whose key is held (blocked()) waits for the next unlock and runs again; one
/// on a free key runs at once, so the string path pays one emptiness test.
/// Shared holds (readers: MGET, EXISTS) let single-key reads through and block writes; exclusive
/// holds (writers) block both.
///
/// Whole-shard intents: the commands that read or change the whole keyspace (KEYS, DBSIZE,
/// RANDOMKEY and SCAN shared, FLUSHALL/FLUSHDB exclusive) hold the whole of every shard they visit,
/// taken by the same protocol (all shards at once, else one after another in ascending order). A
/// whole-shard hold conflicts with every key hold of the shard as a hold of each key would: a shared
/// one waits for exclusive key holds and blocks writes (single-key writes and exclusive requests), an
/// exclusive one waits for every hold and blocks every command on the shard. So a keyspace reader
/// sees every multi-key command whole or not at all, and FLUSHALL cannot run between the halves of an
/// MSET, as in Redis, where every command is atomic to every other.
/// Thread-safety: none; the shard's carrier thread only.

#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "apps/kv/shard.h"
#include "core/fiber_future.h"

namespace spindle::kv {

/// One command's request for its keys on one shard.
struct LockRequest {
    std::vector<std::string_view> keys;  // distinct; they must outlive the request's hold
    bool exclusive = true;
    bool wholeShard = false;  // the whole shard (every key, present or not); `keys` is ignored
    FiberFuture granted;  // set when a queued request is granted
};

class KeyLocks {
public:
    /// Nothing held and nothing queued: every command may run.
    [[nodiscard]] bool idle() const noexcept {
        return held_.empty() && queue_.empty() && wholeShared_ == 0 && !wholeExclusive_;
    }
    /// Whether a single-key command (a write or not) on `key` must wait.
    [[nodiscard]] bool blocked(std::string_view key, bool write) const;
    /// Whether a command that runs `req`'s step in one message without taking it (all its keys on one
    /// shard) must wait: what is held conflicts with it. Queued requests do not count.
    [[nodiscard]] bool blocked(const LockRequest& req) const { return !free(req); }
    /// Takes every key of `req` now, or none (false): when one is held incompatibly or requests are
    /// queued (they go first).
    [[nodiscard]] bool tryLock(const LockRequest& req);
    /// tryLock(), or else queues `req`: unlock() grants it later, in queue order, and sets
    /// req.granted. Returns whether it was granted now. `req` must stay alive until it is granted.
    [[nodiscard]] bool lockOrQueue(LockRequest& req);
    /// Releases what `req` holds, grants what the queue can have in order, wakes the waiters.
    void unlock(const LockRequest& req);
    /// Sets `f` at the next unlock(): a blocked single-key command waits on it and runs again.
    void waitForUnlock(FiberFuture& f) { waiters_.push_back(&f); }
    [[nodiscard]] size_t heldKeys() const noexcept { return held_.size(); }

private:
    struct Hold {
        uint32_t shared = 0;
        bool exclusive = false;
    };
    [[nodiscard]] bool free(const LockRequest& req) const;
    void take(const LockRequest& req);
    void release(const LockRequest& req);  // a key request's keys

    std::unordered_map<std::string, Hold, KeyHasher, std::equal_to<>> held_;
    size_t exclusiveKeys_ = 0;     // entries of held_ held exclusively (what a shared whole hold waits for)
    uint32_t wholeShared_ = 0;     // shared whole-shard holds; never at once with wholeExclusive_
    bool wholeExclusive_ = false;  // an exclusive whole-shard hold; then held_ is empty
    std::deque<LockRequest*> queue_;  // waiting requests, granted strictly in order
    std::vector<FiberFuture*> waiters_;
};

}  // namespace spindle::kv
