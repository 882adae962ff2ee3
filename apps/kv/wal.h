// SPDX-License-Identifier: Apache-2.0
#pragma once
/// spindle-kv's write-ahead log: one file per shard, records framed with their length and CRC32C,
/// appended by one writer fiber per shard through the runtime's I/O calls, with group commit.
///
/// Record framing (little-endian): u32 payload length, u32 CRC32C of those four bytes, u32 CRC32C of
/// the payload, then the payload. The header's own checksum tells a damaged length (corruption) from
/// a record cut short by a crash (a torn tail).
///
/// Invariant: a valid record's first kRecordHeader bytes are never all zero, so that zeros at a
/// record boundary mean "the log ends here" and nothing else: the header's second word is
/// the CRC32C of the first, and no four bytes whose CRC32C is zero are zero themselves (CRC32C of four
/// zero bytes is 0x48674BC7; kZeroLengthHeaderCrc below checks it at compile time). Any change to the
/// framing must keep this.
///
/// Preallocation (ShardLog's `preallocate`): the writer keeps the file extended ahead of the log's
/// end with zeros that are written (not fallocate()d: ext4 converts unwritten extents with a journal
/// commit at the fdatasync after the first write into them) and fdatasynced before any record goes
/// there, so that a batch's fdatasync overwrites blocks inside i_size and needs no journal commit (on
/// ext4 about 75-80 us against about 130 us for an append, measured on the project's virtual disk).
/// The log's logical end is then not the file's size: a clean stop truncates the zero tail; a crash
/// leaves it, and recovery reads it as the end (below).
///
/// Recovery (scanLog): records are read in order until the first bad one (a short header, a header
/// whose checksum fails, a length past the end of the file, a payload whose checksum fails). If
/// everything from there to the end of the file is zero bytes, that is the preallocated tail: the
/// log ends cleanly there and nothing is dropped (ScanReport::zeroTail). Otherwise, if no valid record
/// starts anywhere after it, the bad bytes are a torn tail (zeros after a torn record included): they
/// are dropped (the file is truncated there) and the number of bytes is reported. If a valid record
/// follows, the log is corrupt in the middle: recovery refuses, unless asked to truncate there anyway
/// (losing the records after it, which are counted).
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
/// Fault points (base/inject.h): kLogWrite fails a batch's write, kLogSync its fdatasync, kLogExtend
/// the preallocation's write of zeros or its fdatasync. A failed preallocation fails the log the same
/// way (an ENOSPC there is the disk filling up, and the batches after it would meet it too).
///
/// Compaction (apps/kv/rewrite.h drives it): beginCapture() makes append() copy every record into a
/// capture buffer as well; the rewriter writes a snapshot of the shard to a new file, then what was
/// captured (takeCaptured), syncs it, and calls switchTo(). The writer fiber does the switch between two
/// batches: it writes what was captured since into the new file, fdatasyncs it, renames it over the
/// log and fsyncs the directory, and only then goes on, writing to the new file. The records that were
/// pending for the old file are in the new one (captured), so they are released as durable with it.
/// Crash safety: until the rename the log's name is the old file, complete, and the writer still
/// appends to it; the new file is complete (synced) before the rename; records appended during the
/// switch are acknowledged only after the directory fsync, so whichever file the name points to after
/// a crash holds every acknowledged record. A failure before the rename leaves the old file in use
/// and the log healthy (the switch returns the errno); one after it (the directory fsync) fails the log.

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

/// The CRC32C a record of zero length carries in its header's second word (see the framing invariant).
inline constexpr uint32_t kZeroLengthHeaderCrc = [] {
    uint32_t crc = 0xFFFFFFFFu;
    for (int byte = 0; byte < 4; ++byte) {
        for (int bit = 0; bit < 8; ++bit) { crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u))); }
    }
    return crc ^ 0xFFFFFFFFu;
}();
static_assert(kZeroLengthHeaderCrc == 0x48674BC7u && kZeroLengthHeaderCrc != 0,
              "a record's header is never all zero: zeros at a record boundary are the log's end");

/// The preallocation's default step (ServerOptions::logPreallocate, --log-preallocate-bytes): see
/// ShardLog::start. Why 4 MiB: zeroing and syncing it takes about 1-2 ms of writes and 3 ms of
/// fdatasync here, while a shard under `always` logs a few MB a second (redis-benchmark SET at 50
/// clients), so the step lasts about a second and the extension is long done before the writer needs
/// it; the one costlier sync per step (a batch's fdatasync that meets the extension's journal commit)
/// is then one in thousands. Larger steps gain nothing measurable and cost disk until a clean stop
/// (the file runs at most about two steps ahead) and zeros for recovery to read after a crash.
inline constexpr uint64_t kDefaultPreallocate = uint64_t{4} << 20;

/// Appends one framed record holding `payload` to `out`.
void frameRecord(std::string& out, std::string_view payload);
/// Frames a record built in place: `out` holds kRecordHeader bytes reserved for the header at
/// `headerAt`, then the payload up to its end. Writes the header (length and CRC32C) into the
/// reserved bytes, copying nothing.
void frameRecordInPlace(std::string& out, size_t headerAt) noexcept;

/// Writes all of `bytes` to `fd` at `offset` through the runtime (a short write is continued).
/// Returns 0 or the errno (EIO for a write that wrote nothing). Fault point: kLogWrite.
[[nodiscard]] int logWrite(int fd, std::string_view bytes, uint64_t offset) noexcept;
/// fdatasync(fd) through the runtime. Returns 0 or the errno. Fault point: kLogSync.
[[nodiscard]] int logSync(int fd) noexcept;

struct ScanReport {
    uint64_t records = 0;       // valid records applied
    uint64_t validBytes = 0;    // the length of the good prefix
    uint64_t droppedBytes = 0;  // bytes after it (torn tail, or what truncation at a corruption lost)
    bool corruptInMiddle = false;  // a valid record follows the first bad one
    uint64_t droppedRecords = 0;   // valid records found after the first bad one (what truncation there loses)
    uint64_t badOffset = 0;     // where the first bad record starts (== validBytes)
    uint64_t zeroTail = 0;      // zero bytes after the good prefix up to the end: preallocated, not damage
};                              // validBytes + droppedBytes + zeroTail == the file's size

/// Walks the records of `log`, calling apply(payload) for each valid one of the good prefix; see the
/// file comment for the torn-tail and corruption rules. apply returns false to stop (bad payload:
/// treated as corruption at that record).
[[nodiscard]] ScanReport scanLog(std::string_view log, const std::function<bool(std::string_view)>& apply);

/// scanLog over the file `fd` (from offset 0 to its size), read through the runtime in chunks of
/// `chunk` bytes (more for a record that is bigger) instead of whole: memory stays at a chunk or a
/// record, and parsing a chunk overlaps the kernel's read-ahead of the next. The same report as
/// scanLog on the whole file. After the first chunk, expect(n) (when given) learns about how many
/// records the rest of the file holds, judged by the first chunk's. Records are checked 16 at a time,
/// and prefetch(payload, stage) (when given) is called for each of them with stage 0, then for each
/// with stage 1, before apply() is, so that the memory their application will touch is on its way for
/// all 16 at once (in two steps: a lookup's first load tells where its second goes; Shard::prefetch).
/// Yields every 64 KiB parsed.
/// Errors: fstat's and read's errno.
[[nodiscard]] Result<ScanReport> scanLogFile(int fd, const std::function<bool(std::string_view)>& apply,
                                             size_t chunk = size_t{8} << 20,
                                             const std::function<void(uint64_t)>& expect = {},
                                             const std::function<void(std::string_view, int)>& prefetch = {});

struct LogStats {
    uint64_t records = 0;   // appended
    uint64_t bytes = 0;     // written to the file
    uint64_t syncs = 0;     // fdatasync calls that succeeded
    uint64_t syncedRecords = 0;  // records those syncs covered (syncedRecords / syncs: the mean batch)
    uint64_t preallocated = 0;   // bytes of zeros written ahead of the log (preallocation)
    uint64_t appendedPastEnd = 0;  // batches written outside the preallocated zeros (their fdatasync costs more)
};

/// One shard's log. append() and the writer run on the shard's carrier; waitDurable() from any fiber.
class ShardLog {
public:
    /// Takes `fd` (open for writing; the next record goes at `offset`, the log's logical end, which may
    /// be below the file's size: the rest is a zero tail) and starts the writer fiber (and, with
    /// kEverySec, the syncer) pinned to `carrier`. With `preallocate` > 0 (on a regular file) a third
    /// fiber keeps the file extended with written, synced zeros: once less than `preallocate` bytes are
    /// left ahead of a batch, the next `preallocate` bytes after the file's end are zeroed and
    /// fdatasynced while the writer goes on below them. When the writer has caught up with the zeros
    /// (a fresh log, a record bigger than the room left), the new ones start a quarter step after the
    /// batch, and the batches until they are ready are appends, as without preallocation; only a
    /// batch that would reach zeros still being written waits for them. stop() truncates the zero tail.
    /// Errors: spawn's (ENOMEM, ECANCELED).
    [[nodiscard]] static Result<std::unique_ptr<ShardLog>> start(Runtime& rt, unsigned carrier, int fd, uint64_t offset,
                                                               Fsync mode, uint64_t preallocate = 0);
    ~ShardLog();
    ShardLog(const ShardLog&) = delete;
    ShardLog& operator=(const ShardLog&) = delete;

    /// Frames `payload` into the pending batch and returns its sequence number (from 1).
    /// Precondition: on the shard's carrier thread, failed() == 0, not stopped.
    uint64_t append(std::string_view payload);
    /// Waits until the record `seq` is durable as the mode promises (kAlways: synced; otherwise: at
    /// once). Returns 0, or the errno that failed the log before the record was synced.
    [[nodiscard]] int waitDurable(uint64_t seq) noexcept;
    /// 0, or the errno that put the log in the failed state.
    [[nodiscard]] int failed() const noexcept { return failed_.load(std::memory_order_acquire); }
    [[nodiscard]] Fsync mode() const noexcept { return mode_; }
    [[nodiscard]] LogStats stats() const noexcept;
    /// The log's logical size: the end of its last record written (not the file's size, which counts
    /// the preallocated zeros too).
    [[nodiscard]] uint64_t size() const noexcept { return size_.load(std::memory_order_relaxed); }
    /// Writes and syncs what is pending (any mode), ends the fibers, truncates the zero tail (when the
    /// log has not failed: ftruncate to size(), then fsync; a failure there is only logged, since the
    /// zeros read as the log's end) and closes the file. From a plain thread. Returns 0 or the errno of
    /// the last write or sync. Idempotent.
    int stop() noexcept;

    /// Compaction (see the file comment). Precondition for all four: on the shard's carrier thread.
    /// From now on append() also copies each record into the capture buffer.
    void beginCapture();
    /// Moves what was captured since the last call to the end of `out`.
    void takeCaptured(std::string& out);
    /// Ends a capture that will not be switched to (a rewrite that failed or was abandoned).
    void endCapture() noexcept;
    /// Has the writer switch the log to `newFd` (open for writing, holding `newSize` bytes of synced
    /// records), renaming `tmpPath` over `path` and fsyncing `dirFd`. Parks the calling fiber until the
    /// switch is done. Returns 0, or the errno that stopped it: before the rename, `newFd` is closed,
    /// the capture ended and the old file stays in use; after it, the log has failed (see the file
    /// comment). Ownership of `newFd` passes to the log in every case.
    [[nodiscard]] int switchTo(int newFd, uint64_t newSize, const std::string& tmpPath, const std::string& path, int dirFd);

private:
    ShardLog(int fd, uint64_t offset, Fsync mode, uint64_t preallocate) noexcept;
    struct Switch {
        int fd = -1;
        uint64_t size = 0;
        const std::string* tmpPath = nullptr;
        const std::string* path = nullptr;
        int dirFd = -1;
        int result = 0;
        FiberEvent done;
    };
    void writerLoop() noexcept;
    void syncerLoop() noexcept;
    void extenderLoop() noexcept;
    /// On the writer: makes room for `bytes` at offset_ (see start()); false when the log failed.
    bool reserve(uint64_t bytes) noexcept;
    void waitExtension() noexcept;
    void fail(int err) noexcept;
    void doSwitch(Switch& s) noexcept;

    int fd_;
    uint64_t offset_;
    Fsync mode_;
    // Touched on the shard's carrier only (append() and the writer fiber, which runs there).
    std::string pending_;
    std::string writing_;
    uint64_t appended_ = 0;  // sequence number of the last record appended
    uint64_t written_ = 0;   // last record written to the file
    uint64_t lastSynced_ = 0;  // last record an fdatasync covered
    bool stopping_ = false;
    bool capturing_ = false;
    std::string captured_;    // records appended since the capture began (or the last takeCaptured)
    Switch* switch_ = nullptr;  // a switch the writer is asked to make
    // Preallocation (preallocate_ > 0). Invariant: [offset_, allocEnd_) reads as zeros: written and
    // synced, except for [holeFrom_, holeTo_), a hole left between a batch and the zeros asked for
    // after it. While extending_, the extender alone writes [extFrom_, extTo_), which starts at or
    // after both allocEnd_ and the end of every batch written meanwhile (they stay below extFrom_).
    uint64_t preallocate_ = 0;
    uint64_t allocEnd_ = 0;
    uint64_t holeFrom_ = 0, holeTo_ = 0;
    bool extending_ = false;
    bool extenderStop_ = false;
    int extFd_ = -1;
    uint64_t extFrom_ = 0, extTo_ = 0;
    FiberEvent extendWake_;  // set to start an extension, or to end the extender
    FiberEvent extendDone_;  // set while no extension is under way
    FiberEvent wake_;        // set when something is pending or stopping_
    FiberSequencer done_;    // reaches a record's number once it is durable (or the log failed)
    std::atomic<uint64_t> durable_{0};  // last record synced (kAlways) or written
    std::atomic<int> failed_{0};
    std::atomic<uint64_t> size_{0};
    std::atomic<uint64_t> records_{0}, bytes_{0}, syncs_{0}, syncedRecords_{0}, preallocated_{0}, pastEnd_{0};
    std::atomic<uint64_t> unsynced_{0};  // kEverySec: bytes written since the last sync
    FiberHandle<void> writer_;
    FiberHandle<void> syncer_;
    FiberHandle<void> extender_;
    Runtime* rt_ = nullptr;
    unsigned carrier_ = 0;
    bool stopped_ = false;
};

}  // namespace spindle::kv
