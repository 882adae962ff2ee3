// SPDX-License-Identifier: Apache-2.0
#pragma once
/// spindle-kv's server: the Redis protocol over net::TcpServer, a keyspace split into one shard per
/// carrier, and a write-ahead log per shard.
///
/// Dispatch: a connection fiber (pinned where it was accepted) parses every complete request in its
/// buffer (pipelining) and runs each command; a command on a key runs on the key's shard through
/// Runtime::runOnCarrier (inline when the shard is the connection's own carrier), so no lock guards
/// the data. MGET, MSET, MSETNX, DEL, UNLINK, EXISTS and RENAME split their keys by shard, visit
/// their shards at once and are atomic as other clients see them (per-shard key intents, see
/// apps/kv/key_locks.h and "Multi-key commands" in server.cpp). So are the keyspace commands: KEYS,
/// DBSIZE, RANDOMKEY and each SCAN call hold every shard they read (a whole-shard intent, shared),
/// FLUSHALL and FLUSHDB every shard (exclusive); none of them sees, or leaves, a multi-key command
/// half done, and a single-key write waits while a shard is held. Not atomic: a whole SCAN walk (one
/// shard after another, across calls, as Redis's walk is across calls) and INFO's counts (read
/// without holding anything). Replies of a batch leave in one send.
///
/// Durability: see apps/kv/wal.h. With appendfsync always, the replies of a batch leave only once
/// every write in it is synced; if a log fails first, the replies before the first write it did not
/// cover are sent and the connection is closed (the client never sees an acknowledgement for a write
/// that is not durable), and every later write on that shard gets "-MISCONF Errors writing to the
/// AOF file: <error>".
///
/// Compaction (apps/kv/rewrite.h): BGREWRITEAOF rewrites every shard's log in the background, SAVE
/// does the same and answers when it is done, and a shard whose log has grown past
/// autoRewriteMinSize and by autoRewritePercentage percent over its size after the last rewrite (or
/// at start) is rewritten on its own (Redis's auto-aof-rewrite-min-size and -percentage; 0 percent
/// turns it off). Both are in CONFIG GET/SET. INFO persistence reports aof_rewrite_in_progress,
/// aof_last_bgrewrite_status, aof_rewrites, aof_current_size, aof_base_size and the rest.
/// SHUTDOWN SAVE rewrites every log as SAVE does before it stops; if that fails it answers "-ERR
/// Errors trying to SHUTDOWN. Check logs." and the server keeps running (unless FORCE is given), as
/// Redis does. SHUTDOWN and SHUTDOWN NOSAVE do not rewrite (there are no save points: as Redis with
/// an append-only file and none, they only write and sync the logs, in wait()).
///
/// Log failure (EIO, ENOSPC, ... on a write or an fdatasync): the write whose record the log could not
/// make durable gets "-MISCONF Errors writing to the AOF file: <error>" in place of its reply, after
/// the replies before it, and the connection is then closed (the replies of the commands that followed
/// it in the batch are dropped: they might acknowledge what is not durable). The write stays in memory
/// (as in Redis), so reads until a restart may see it; after a restart it is gone unless it did reach
/// the disk. Every later write on that shard gets the same -MISCONF error; reads keep working.
///
/// Recovery: at start each shard replays <dir>/shard-<i>.log (see wal.h: a torn tail is truncated and
/// logged; corruption in the middle refuses to start unless truncateCorrupt). The shard count is kept
/// in <dir>/kv.meta; a directory written with another count refuses to start (EINVAL, with a message
/// naming the count to use).
///
/// Errors: start() returns EINVAL for bad options or a data directory of another shard count,
/// EILSEQ for a log corrupt in the middle, the errno of opening, reading or truncating the files, and
/// net::TcpServer::start's errors (EADDRINUSE, ...). Each is logged with its cause.
/// Thread-safety: stop(), stats() from any thread or fiber; wait() and the destructor from a plain
/// thread.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "apps/kv/resp.h"
#include "apps/kv/wal.h"
#include "base/result.h"
#include "core/runtime.h"
#include "net/address.h"

namespace spindle::kv {

struct ServerOptions {
    net::SocketAddress address = net::SocketAddress::ipv4Loopback(6379);
    std::string dir;                  // data directory; "" keeps no log (nothing survives a restart)
    Fsync appendFsync = Fsync::kEverySec;
    uint64_t maxClients = 10000;      // more: "-ERR max number of clients reached", then closed
    uint64_t maxMemory = 0;           // bytes of keys and values; 0: no limit. Past it writes get -OOM
    std::string requirePass;          // "": no AUTH needed
    RespLimits limits;
    uint64_t queryBufferLimit = 1ull << 30;  // client-query-buffer-limit: past it the client is closed
    bool truncateCorrupt = false;     // recovery: truncate at a corruption in the middle instead of refusing
    bool shareAddress = false;        // SO_REUSEPORT sharing with other processes (net::TcpServer)
    uint64_t autoRewritePercentage = 100;           // auto-aof-rewrite-percentage; 0: no automatic rewrite
    uint64_t autoRewriteMinSize = 64ull << 20;      // auto-aof-rewrite-min-size, bytes per shard log
    uint64_t logPreallocate = kDefaultPreallocate;  // appendfsync always: zeros written ahead of each log
                                                    // (ShardLog::start); 0: none
    // Receives: one multishot receive per connection into a net::ProvidedBufferPool of this many
    // buffers per carrier (a power of two) of this size, where the kernel allows; a connection that
    // waits then holds none of the ring's buffers (its own parse buffer keeps up to 16 KiB; a larger
    // one, grown for a large request, is freed once empty). Off (or refused): one receive per batch
    // into the connection's own buffer. A ring that runs dry (many connections each holding received
    // bytes; before Linux 6.12 each receive takes a whole buffer) costs speed, not data: the receive
    // falls back to a heap buffer and arms again (ServerStats::receiveRingExhausted counts it).
    bool providedBuffers = true;
    // A batch's replies leave through a net::PostedSend: the connection goes back to its receive
    // without waiting for the send's completion, which the carrier takes (one resume per batch instead
    // of two); the next batch's replies are built in a second buffer meanwhile. false: every send is
    // waited for (--wait-send).
    bool postedSend = true;
    unsigned providedBufferCount = 512;
    size_t providedBufferSize = 8192;
};

/// Parses a size as Redis's configuration does: digits, optionally followed by k, kb, m, mb, g or gb
/// (k = 1000, kb = 1024, ...; any case). False for anything else or an overflow.
[[nodiscard]] bool parseMemorySize(std::string_view text, uint64_t& out) noexcept;

struct ServerStats {
    uint64_t connections = 0;      // accepted
    uint64_t clients = 0;          // connected now
    uint64_t commands = 0;         // commands processed
    uint64_t rejectedClients = 0;  // refused for maxclients
    uint64_t keys = 0;
    uint64_t usedMemory = 0;
    LogStats log;                  // summed over the shards
    uint64_t replayedRecords = 0;
    uint64_t droppedTailBytes = 0;
    uint64_t droppedRecords = 0;   // valid records after a corruption that truncation dropped
    uint64_t rewrites = 0;         // log rewrites completed (one per shard rewritten)
    uint64_t rewritesFailed = 0;
    // Receives that brought a connection bytes: into a buffer of the provided-buffer ring; into a
    // heap buffer the pool took because its ring had run dry; into a connection's own buffer (provided
    // buffers turned off, or no ring here). Then how often a ring ran dry (ENOBUFS), and on how many
    // carriers the pool's ring is registered.
    uint64_t providedReceives = 0;
    uint64_t ownBufferReceives = 0;
    uint64_t heapReceives = 0;
    uint64_t receiveRingExhausted = 0;
    unsigned receiveRingCarriers = 0;
};

class Server {
public:
    [[nodiscard]] static Result<std::unique_ptr<Server>> start(Runtime& rt, const ServerOptions& options);
    /// stop(), wait().
    ~Server();
    Server(const Server&) = delete;
    Server& operator=(const Server&) = delete;

    [[nodiscard]] net::SocketAddress localAddress() const noexcept;
    /// Stops accepting; connections finish the batch in hand and close. Returns at once. Idempotent.
    void stop() noexcept;
    /// Waits until stop() (or SHUTDOWN) and every connection has ended, then writes and syncs the
    /// logs and closes them. Returns 0, or the errno of a log that failed. Precondition: a plain thread.
    int wait() noexcept;
    [[nodiscard]] ServerStats stats() const noexcept;

    struct Impl;

private:
    explicit Server(std::unique_ptr<Impl> impl) noexcept;
    std::unique_ptr<Impl> impl_;
};

}  // namespace spindle::kv
