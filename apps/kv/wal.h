// SPDX-License-Identifier: Apache-2.0
#pragma once
/// spindle-kv's write-ahead log: one file per shard, records framed with their length and CRC32C,
/// appended by one writer fiber per shard through the runtime's I/O calls, with group commit.
///
/// Record framing (little-endian): u32 payload length, u32 CRC32C of those four bytes, u32 CRC32C of
/// the payload, then the payload. The header's own checksum tells a damaged length (corruption) from
/// a record cut short by a crash (a torn tail).
///
/// Recovery (scanLog): records are read in order until the first bad one (a short header, a header
/// whose checksum fails, a length past the end of the file, a payload whose checksum fails). If no
/// valid record starts anywhere after it, the bad bytes are a torn tail: they are dropped (the file
/// is truncated there) and the number of bytes is reported. If a valid record follows, the log is
/// corrupt in the middle: recovery refuses, unless asked to truncate there anyway (losing the records
/// after it, which are counted).
///
/// Group commit (ShardLog): appends go to a pending buffer in memory on the shard's carrier; the
/// writer fiber takes everything pending, writes it, and with kAlways calls fdatasync once for the whole
/// batch, then releases every waiter whose record the batch covered. Appends that arrive while a
/// batch is being written and synced form the next batch. kEverySec writes at once and syncs once a
/// second (a second fiber); kNo writes at once and leaves syncing to the kernel.
///
/// Errors: a write or fdatasync that fails (EIO, ENOSPC, ...) puts the log in the failed state for
/// good: the records of that batch and every later one are never reported durable, waitDurable()
/// returns the errno, and the shard refuses new writes (failed() != 0). Nothing is retried.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "base/result.h"
#include "core/fiber.h"
#include "core/fiber_event.h"
#include "core/fiber_sequencer.h"
#include "core/runtime.h"

namespace spindle::kv {

enum class Fsync : uint8_t { kAlways, kEverySec, kNo };

/// CRC32C (Castagnoli), as iSCSI and ext4 use it (ISA-L's crc32_iscsi).
[[nodiscard]] uint32_t crc32c(const void* data, size_t len) noexcept;

inline constexpr size_t kRecordHeader = 12;

/// Appends one framed record holding `payload` to `out`.
void frameRecord(std::string& out, std::string_view payload);

struct ScanReport {
    uint64_t records = 0;       // valid records applied
    uint64_t validBytes = 0;    // the length of the good prefix
    uint64_t droppedBytes = 0;  // bytes after it (torn tail, or what truncation at a corruption lost)
    bool corruptInMiddle = false;  // a valid record follows the first bad one
    uint64_t badOffset = 0;     // where the first bad record starts (== validBytes)
};

/// Walks the records of `log`, calling apply(payload) for each valid one of the good prefix; see the
/// file comment for the torn-tail and corruption rules. apply returns false to stop (bad payload:
/// treated as corruption at that record).
[[nodiscard]] ScanReport scanLog(std::string_view log, const std::function<bool(std::string_view)>& apply);

struct LogStats {
    uint64_t records = 0;   // appended
    uint64_t bytes = 0;     // written to the file
    uint64_t syncs = 0;     // fdatasync calls that succeeded
    uint64_t syncedRecords = 0;  // records those syncs covered (syncedRecords / syncs: the mean batch)
};

/// One shard's log. append() and the writer run on the shard's carrier; waitDurable() from any fiber.
class ShardLog {
public:
    /// Takes `fd` (open for writing; the next record goes at `offset`) and starts the writer fiber (and,
    /// with kEverySec, the syncer) pinned to `carrier`. Errors: spawn's (ENOMEM, ECANCELED).
    [[nodiscard]] static Result<std::unique_ptr<ShardLog>> start(Runtime& rt, unsigned carrier, int fd, uint64_t offset,
                                                               Fsync mode);
    ~ShardLog();
    ShardLog(const ShardLog&) = delete;
    ShardLog& operator=(const ShardLog&) = delete;

    /// Frames `payload` into the pending batch and returns its sequence number (from 1).
    /// Precondition: on the shard's carrier thread, failed() == 0, not stopped.
    uint64_t append(std::string_view payload);
    /// Waits until the record `seq` is durable as the mode promises (kAlways: synced; otherwise: at
    /// once). Returns 0, or the errno that failed the log before the record was synced.
    [[nodiscard]] int waitDurable(uint64_t seq) noexcept;
    /// Waits until every record up to `seq` has been written, then fdatasyncs the file whatever the
    /// mode (SAVE). Returns 0, or the errno that failed the log (a failed sync fails it for good). From
    /// any fiber.
    [[nodiscard]] int syncThrough(uint64_t seq) noexcept;
    /// 0, or the errno that put the log in the failed state.
    [[nodiscard]] int failed() const noexcept { return failed_.load(std::memory_order_acquire); }
    [[nodiscard]] Fsync mode() const noexcept { return mode_; }
    [[nodiscard]] LogStats stats() const noexcept;
    [[nodiscard]] uint64_t size() const noexcept { return size_.load(std::memory_order_relaxed); }
    /// Writes and syncs what is pending (any mode), ends the fibers and closes the file. From a plain
    /// thread. Returns 0 or the errno of the last write or sync. Idempotent.
    int stop() noexcept;

private:
    ShardLog(int fd, uint64_t offset, Fsync mode) noexcept;
    void writerLoop() noexcept;
    void syncerLoop() noexcept;
    void fail(int err) noexcept;

    int fd_;
    uint64_t offset_;
    Fsync mode_;
    // Touched on the shard's carrier only (append() and the writer fiber, which runs there).
    std::string pending_;
    std::string writing_;
    uint64_t appended_ = 0;  // sequence number of the last record appended
    uint64_t written_ = 0;   // last record written to the file
    bool stopping_ = false;
    FiberEvent wake_;        // set when something is pending or stopping_
    FiberSequencer done_;    // reaches a record's number once it is durable (or the log failed)
    std::atomic<uint64_t> durable_{0};  // last record synced (kAlways) or written
    std::atomic<int> failed_{0};
    std::atomic<uint64_t> size_{0};
    std::atomic<uint64_t> records_{0}, bytes_{0}, syncs_{0}, syncedRecords_{0};
    std::atomic<uint64_t> unsynced_{0};  // kEverySec: bytes written since the last sync
    FiberHandle<void> writer_;
    FiberHandle<void> syncer_;
    Runtime* rt_ = nullptr;
    unsigned carrier_ = 0;
    bool stopped_ = false;
};

}  // namespace spindle::kv
