// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Compaction of one shard's write-ahead log (BGREWRITEAOF, SAVE, and the automatic rewrite): a
/// snapshot of the shard written to <log>.rewrite in bounded slices while the shard keeps serving,
/// then the records appended meanwhile, then the atomic switch (ShardLog::switchTo: fdatasync,
/// rename over the log, directory fsync). No fork and no pause: between two slices the fiber waits
/// for its write, and every command of the carrier runs.
///
/// Why the result is the shard's state: the capture begins before the first slice reads the shard,
/// so every record appended after that is in the captured tail, which follows the snapshot in the new
/// file. A key the snapshot visited at any moment holds then a state that the tail's records for that
/// key, replayed in order, turn into its final state (each record sets a key's value and expiry, or
/// its expiry alone, or removes it); a key that the tail does not touch was not written during the
/// rewrite, and Shard::snapshotSlice visits every such key.
///
/// Crash safety: see ShardLog (wal.h). A crash before the rename leaves <log>.rewrite behind, which
/// the next start removes (removeStaleRewrite).
/// Errors: the errno of creating, writing or syncing the new file or of the switch; ECANCELED when
/// `stop` was seen between slices. The old log is then still the log and the shard keeps running
/// (except after a failed directory fsync, which fails the log: see wal.h).

#include <atomic>
#include <cstdint>
#include <string>

#include "apps/kv/shard.h"
#include "apps/kv/wal.h"

namespace spindle::kv {

/// <dir>/shard-<index>.log
[[nodiscard]] std::string shardLogPath(const std::string& dir, unsigned index);

struct RewriteStats {
    uint64_t keys = 0;       // restore records' keys written by the snapshot
    uint64_t tailBytes = 0;  // bytes of records captured during the rewrite and appended after it
    uint64_t size = 0;       // the new log's size at the switch
};

/// Rewrites the log of `shard` (whose log is `log`, kept in `dir`).
/// Precondition: on a fiber pinned to the shard's carrier; no other rewrite of this shard runs.
[[nodiscard]] int rewriteShardLog(Shard& shard, ShardLog& log, const std::string& dir, const std::atomic<bool>& stop,
                                  RewriteStats* stats = nullptr) noexcept;

/// Removes <log>.rewrite, what a rewrite that a crash interrupted leaves behind; true if one was there.
bool removeStaleRewrite(const std::string& dir, unsigned index) noexcept;

}  // namespace spindle::kv
