// SPDX-License-Identifier: Apache-2.0
#include "apps/kv/wal.h"

#include <fcntl.h>
#include <isa-l/crc.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <memory>
#include <utility>

#include "base/inject.h"
#include "base/log.h"
#include "core/fiber.h"
#include "core/io.h"

namespace spindle::kv {

namespace {

void putU32(std::string& out, uint32_t v) {
    const char b[4] = {static_cast<char>(v), static_cast<char>(v >> 8), static_cast<char>(v >> 16), static_cast<char>(v >> 24)};
    out.append(b, 4);
}

uint32_t getU32(const char* p) noexcept {
    const auto* u = reinterpret_cast<const unsigned char*>(p);
    return uint32_t{u[0]} | (uint32_t{u[1]} << 8) | (uint32_t{u[2]} << 16) | (uint32_t{u[3]} << 24);
}

enum class Check : uint8_t { kValid, kShort, kBad };

// The record at the start of `in`: kValid (its payload in `payload`), kShort when `in` ends before the
// record does (`need`: the bytes it takes, once the header is whole), kBad when a checksum fails.
Check checkRecord(std::string_view in, std::string_view& payload, size_t& need) noexcept {
    need = kRecordHeader;
    if (in.size() < kRecordHeader) { return Check::kShort; }
    const char* h = in.data();
    if (crc32c(h, 4) != getU32(h + 4)) { return Check::kBad; }
    const uint32_t len = getU32(h);
    need = kRecordHeader + len;
    if (in.size() - kRecordHeader < len) { return Check::kShort; }
    payload = in.substr(kRecordHeader, len);
    return crc32c(payload.data(), payload.size()) == getU32(h + 8) ? Check::kValid : Check::kBad;
}

// The record at `at` when it is whole and both checksums hold; its payload in `payload`.
bool validRecordAt(std::string_view log, size_t at, std::string_view& payload) noexcept {
    size_t need = 0;
    return checkRecord(log.substr(at), payload, need) == Check::kValid;
}

// Fills in the part of `r` about what follows the first bad record: `rest` starts at that record.
void probeAfterBad(std::string_view rest, ScanReport& r) noexcept {
    std::string_view payload;
    // Past the first one found, records are walked whole (and bytes one by one where none starts).
    for (size_t probe = 1; probe + kRecordHeader <= rest.size();) {
        if (validRecordAt(rest, probe, payload)) {
            r.corruptInMiddle = true;
            ++r.droppedRecords;
            probe += kRecordHeader + payload.size();
        } else {
            ++probe;
        }
    }
}

// The zeros preallocation writes, one write at most this much (so that a write the ring completes
// inline copies a bounded amount on the carrier). In .bss and never written: its pages stay the
// kernel's one zero page, so it costs no memory. Not const, or the compiler would put it in .rodata.
constexpr size_t kZeroBlock = 256 * 1024;
alignas(4096) char zeroBlock[kZeroBlock];

bool allZero(std::string_view bytes) noexcept {
    for (size_t at = 0; at < bytes.size(); at += kZeroBlock) {
        if (std::memcmp(bytes.data() + at, zeroBlock, std::min(kZeroBlock, bytes.size() - at)) != 0) { return false; }
    }
    return true;
}

// Fills in the part of `r` about the bytes after the good prefix, `rest`: the preallocated zero tail,
// or damage (a torn tail, or corruption when a valid record follows).
void judgeRest(std::string_view rest, ScanReport& r) noexcept {
    if (allZero(rest)) {
        r.zeroTail = rest.size();
        r.droppedBytes = 0;
        return;
    }
    r.droppedBytes = rest.size();
    probeAfterBad(rest, r);
}

}  // namespace

uint32_t crc32c(const void* data, size_t len) noexcept {
    return crc32_iscsi(static_cast<unsigned char*>(const_cast<void*>(data)), static_cast<int>(len), 0xFFFFFFFFu) ^
           0xFFFFFFFFu;
}

void frameRecord(std::string& out, std::string_view payload) {
    const auto len = static_cast<uint32_t>(payload.size());
    putU32(out, len);
    putU32(out, crc32c(out.data() + out.size() - 4, 4));
    putU32(out, crc32c(payload.data(), payload.size()));
    out.append(payload);
}

void frameRecordInPlace(std::string& out, size_t headerAt) noexcept {
    char* h = out.data() + headerAt;
    const size_t len = out.size() - headerAt - kRecordHeader;
    auto put = [](char* p, uint32_t v) {
        for (int i = 0; i < 4; ++i) { p[i] = static_cast<char>(v >> (8 * i)); }
    };
    put(h, static_cast<uint32_t>(len));
    put(h + 4, crc32c(h, 4));
    put(h + 8, crc32c(h + kRecordHeader, len));
}

ScanReport scanLog(std::string_view log, const std::function<bool(std::string_view)>& apply) {
    ScanReport r;
    size_t at = 0;
    std::string_view payload;
    while (at < log.size()) {
        if (!validRecordAt(log, at, payload) || !apply(payload)) { break; }
        ++r.records;
        at += kRecordHeader + payload.size();
    }
    r.validBytes = at;
    r.badOffset = at;
    judgeRest(log.substr(at), r);
    return r;
}

Result<ScanReport> scanLogFile(int fd, const std::function<bool(std::string_view)>& apply, size_t chunk,
                               const std::function<void(uint64_t)>& expect,
                               const std::function<void(std::string_view, int)>& prefetch) {
    struct stat st{};
    if (::fstat(fd, &st) != 0) { return Error{errno}; }
    const auto size = static_cast<uint64_t>(st.st_size);
    (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);  // a larger read-ahead window
    chunk = std::max<size_t>(chunk, 4096);
    size_t cap = chunk;
    auto buf = std::make_unique_for_overwrite<char[]>(cap);
    size_t begin = 0, end = 0;  // buf[begin, end): bytes read, not parsed yet
    uint64_t pos = 0;           // the file offset of buf[begin]
    uint64_t readTo = 0;        // the file offset of buf[end]
    ScanReport r;
    std::string_view payload;
    bool bad = false;
    constexpr uint64_t kYieldEvery = 64 * 1024;
    constexpr size_t kBatch = 16;
    std::array<std::string_view, kBatch> batch;
    uint64_t lastYield = 0;
    bool expected = false;
    uint64_t aheadTo = 0;  // the file offset up to which read-ahead was asked for
    while (!bad) {
        // Ask the kernel to start reading the chunk after this one now, so that the disk works while
        // this one is parsed (a cold replay waited for each chunk's read, then parsed it: the two
        // speeds added up instead of overlapping). Only a hint: a failure changes nothing.
        if (readTo < size && aheadTo < readTo + chunk) {
            const uint64_t from = std::max(aheadTo, readTo);
            aheadTo = std::min<uint64_t>(size, readTo + 2 * uint64_t{chunk});
            (void)::posix_fadvise(fd, static_cast<off_t>(from), static_cast<off_t>(aheadTo - from), POSIX_FADV_WILLNEED);
        }
        size_t need = 0;
        for (;;) {
            // Check a batch of records, let prefetch() start their memory loads, then apply them in order.
            size_t n = 0, at = begin;
            Check c = Check::kValid;
            while (n < kBatch) {
                c = checkRecord(std::string_view(buf.get() + at, end - at), payload, need);
                if (c != Check::kValid) { break; }
                batch[n++] = payload;
                at += kRecordHeader + payload.size();
            }
            if (prefetch) {
                for (int stage = 0; stage < 2; ++stage) {
                    for (size_t i = 0; i < n; ++i) { prefetch(batch[i], stage); }
                }
            }
            for (size_t i = 0; i < n && !bad; ++i) {
                if (!apply(batch[i])) {
                    bad = true;
                    break;
                }
                ++r.records;
                begin += kRecordHeader + batch[i].size();
                pos += kRecordHeader + batch[i].size();
                if (pos - lastYield >= kYieldEvery) {  // let the carrier's other fibers (and its stall detector) in
                    lastYield = pos;
                    this_fiber::yield();
                }
            }
            if (bad || c == Check::kBad) {
                bad = true;
                break;
            }
            if (c == Check::kShort) { break; }  // `need` is the next record's
        }
        // Not when the first chunk held the whole log: its size would count the zero tail as records.
        if (expect && !bad && r.records > 0 && !std::exchange(expected, true)) {
            expect((size - pos) * r.records / pos);
        }
        if (bad || readTo == size || pos + need > size) {  // a record the file ends in the middle of
            bad = bad || readTo != pos || pos != size;
            break;
        }
        // Keep the unparsed bytes, make room for the whole next record, and read the next chunk.
        const size_t kept = end - begin;
        if (need > cap) {
            cap = std::max(need, cap * 2);
            auto grown = std::make_unique_for_overwrite<char[]>(cap);
            std::memcpy(grown.get(), buf.get() + begin, kept);
            buf = std::move(grown);
        } else if (begin > 0) {
            std::memmove(buf.get(), buf.get() + begin, kept);
        }
        begin = 0;
        end = kept;
        while (end < cap && readTo < size) {
            auto n = spindle::read(fd, buf.get() + end, cap - end, readTo);
            if (!n) { return Error{n.errorCode()}; }
            if (*n == 0) { break; }
            end += *n;
            readTo += *n;
        }
        if (end == kept) { break; }  // the file shrank under us: what is left is a tail
    }
    r.validBytes = pos;
    r.badOffset = pos;
    // What follows the good prefix: zeros to the end (the preallocated tail, checked a buffer at a time,
    // since a step may be large), or damage, read whole to tell a torn tail from corruption in the middle.
    uint64_t zeros = 0;
    bool onlyZeros = true;
    while (onlyZeros && pos + zeros < size) {
        const size_t want = static_cast<size_t>(std::min<uint64_t>(cap, size - pos - zeros));
        auto n = spindle::read(fd, buf.get(), want, pos + zeros);
        if (!n) { return Error{n.errorCode()}; }
        if (*n == 0) { break; }
        onlyZeros = allZero(std::string_view(buf.get(), *n));
        if (onlyZeros) { zeros += *n; }
    }
    if (onlyZeros) {
        r.zeroTail = zeros;
        r.droppedBytes = size - pos - zeros;  // the file shrank under us
    } else {
        std::string rest(static_cast<size_t>(size - pos), '\0');
        size_t done = 0;
        while (done < rest.size()) {
            auto n = spindle::read(fd, rest.data() + done, rest.size() - done, pos + done);
            if (!n) { return Error{n.errorCode()}; }
            if (*n == 0) { break; }
            done += *n;
        }
        rest.resize(done);
        judgeRest(rest, r);
        r.droppedBytes += size - pos - done;  // the file shrank under us
    }
    return r;
}

ShardLog::ShardLog(int fd, uint64_t offset, Fsync mode, uint64_t preallocate) noexcept
    : fd_(fd), offset_(offset), mode_(mode), preallocate_(preallocate), allocEnd_(offset) {
    size_.store(offset, std::memory_order_relaxed);
    extendDone_.set();
}

Result<std::unique_ptr<ShardLog>> ShardLog::start(Runtime& rt, unsigned carrier, int fd, uint64_t offset, Fsync mode,
                                                  uint64_t preallocate) {
    struct stat st{};
    const bool regular = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
    std::unique_ptr<ShardLog> log(new ShardLog(fd, offset, mode, regular ? preallocate : 0));
    // A zero tail left by a crash is room already made (written; if its last extension's fdatasync had
    // not finished, the first batch's fdatasync makes it durable with the batch).
    if (regular) { log->allocEnd_ = std::max<uint64_t>(offset, static_cast<uint64_t>(st.st_size)); }
    log->rt_ = &rt;
    log->carrier_ = carrier;
    auto writer = rt.spawn([l = log.get()]() noexcept { l->writerLoop(); },
                           SpawnOptions{.name = "kv-wal", .carrier = static_cast<int>(carrier), .pinned = true});
    if (!writer) {
        log->fd_ = -1;  // the caller keeps the descriptor on failure
        log->stopped_ = true;
        return Error{writer.errorCode()};
    }
    log->writer_ = std::move(*writer);
    // The log's other fibers, on its carrier; a failure stops what was started and leaves fd_ to the caller.
    auto helper = [&](const char* name, void (ShardLog::*loop)() noexcept, FiberHandle<void>& slot) -> Result<void> {
        auto f = rt.spawn([l = log.get(), loop]() noexcept { (l->*loop)(); },
                          SpawnOptions{.name = name, .carrier = static_cast<int>(carrier), .pinned = true});
        if (!f) {
            const int err = f.errorCode();
            log->fd_ = -1;
            (void)log->stop();
            return Error{err};
        }
        slot = std::move(*f);
        return {};
    };
    if (mode == Fsync::kEverySec) {
        if (auto r = helper("kv-wal-sync", &ShardLog::syncerLoop, log->syncer_); !r) { return Error{r.errorCode()}; }
    }
    if (log->preallocate_ > 0) {
        if (auto r = helper("kv-wal-extend", &ShardLog::extenderLoop, log->extender_); !r) { return Error{r.errorCode()}; }
    }
    return log;
}

ShardLog::~ShardLog() { (void)stop(); }

uint64_t ShardLog::append(std::string_view payload) {
    const size_t at = pending_.size();
    frameRecord(pending_, payload);
    if (capturing_) { captured_.append(pending_, at, std::string::npos); }
    records_.fetch_add(1, std::memory_order_relaxed);
    wake_.set();
    return ++appended_;
}

int ShardLog::waitDurable(uint64_t seq) noexcept {
    // everysec and no acknowledge at once, as Redis does, unless the log has failed already.
    if (mode_ != Fsync::kAlways) { return failed(); }
    (void)done_.wait(seq);
    if (durable_.load(std::memory_order_acquire) >= seq) { return 0; }  // synced before any failure
    const int err = failed();
    return err != 0 ? err : EIO;
}

LogStats ShardLog::stats() const noexcept {
    return LogStats{.records = records_.load(std::memory_order_relaxed),
                    .bytes = bytes_.load(std::memory_order_relaxed),
                    .syncs = syncs_.load(std::memory_order_relaxed),
                    .syncedRecords = syncedRecords_.load(std::memory_order_relaxed),
                    .preallocated = preallocated_.load(std::memory_order_relaxed),
                    .appendedPastEnd = pastEnd_.load(std::memory_order_relaxed)};
}

void ShardLog::fail(int err) noexcept {
    int expected = 0;
    if (failed_.compare_exchange_strong(expected, err, std::memory_order_acq_rel)) {
        log::error("spindle-kv: the write-ahead log failed ({}): writes are refused from now on", std::strerror(err));
    }
}

int logWrite(int fd, std::string_view bytes, uint64_t offset) noexcept {
    if (bytes.empty()) { return 0; }
    SPINDLE_INJECT(inject::Point::kLogWrite, { return injectedErrno; });
    size_t done = 0;
    while (done < bytes.size()) {
        auto n = spindle::write(fd, bytes.data() + done, bytes.size() - done, offset + done);
        if (!n) { return n.errorCode(); }
        if (*n == 0) { return EIO; }
        done += *n;
    }
    return 0;
}

int logSync(int fd) noexcept {
    SPINDLE_INJECT(inject::Point::kLogSync, { return injectedErrno; });
    auto r = spindle::fdatasync(fd);
    return r ? 0 : r.errorCode();
}

// The extender fiber: zeroes [extFrom_, extTo_) of extFd_ and fdatasyncs it each time the writer asks
// (extendWake_), then moves allocEnd_ there. Runs on the shard's carrier, as the writer does.
void ShardLog::extenderLoop() noexcept {
    for (;;) {
        extendWake_.wait();
        extendWake_.reset();
        if (!extending_) {
            if (extenderStop_) { break; }
            continue;
        }
        int err = 0;
        SPINDLE_INJECT(inject::Point::kLogExtend, { err = injectedErrno; });
        for (uint64_t at = extFrom_; err == 0 && at < extTo_;) {
            const size_t n = static_cast<size_t>(std::min<uint64_t>(kZeroBlock, extTo_ - at));
            auto w = spindle::write(extFd_, zeroBlock, n, at);
            if (!w) {
                err = w.errorCode();
            } else if (*w == 0) {
                err = EIO;
            } else {
                at += *w;
            }
        }
        if (err == 0) { SPINDLE_INJECT(inject::Point::kLogExtend, { err = injectedErrno; }); }
        if (err == 0) {
            if (auto r = spindle::fdatasync(extFd_); !r) { err = r.errorCode(); }
        }
        if (err == 0) {
            preallocated_.fetch_add(extTo_ - extFrom_, std::memory_order_relaxed);
            allocEnd_ = extTo_;
        } else {
            log::error("spindle-kv: preallocating the write-ahead log ({} bytes at {}) failed", extTo_ - extFrom_, extFrom_);
            fail(err);
        }
        extending_ = false;
        extendDone_.set();
        if (extenderStop_) { break; }  // asked to stop meanwhile, or together with this extension
    }
}

void ShardLog::waitExtension() noexcept {
    while (extending_) { extendDone_.wait(); }
}

bool ShardLog::reserve(uint64_t bytes) noexcept {
    if (preallocate_ == 0) { return failed() == 0; }
    // Never into the range being zeroed: a batch that would reach it waits for the extension. Rare: the
    // zeros start at least a quarter step ahead of the batch that asked for them.
    while (extending_ && offset_ + bytes > extFrom_) { extendDone_.wait(); }
    if (failed() != 0) { return false; }
    const uint64_t end = offset_ + bytes;
    if (end > allocEnd_ || (offset_ < holeTo_ && end > holeFrom_)) {
        pastEnd_.fetch_add(1, std::memory_order_relaxed);  // an append or into a hole: a costlier sync
    }
    if (!extending_ && !stopping_ && allocEnd_ < end + preallocate_) {
        // Normally the zeros go on from allocEnd_, well ahead of the writer. When it has caught up (a
        // fresh or just-switched log, a record bigger than the room left), they start a quarter step
        // after this batch: the batches until the extension is done go below that as appends (the
        // cost of an append, as without preallocation) instead of waiting for it, leaving a hole
        // that reads as zeros.
        const uint64_t gap = std::max<uint64_t>(preallocate_ / 4, 1);
        extFd_ = fd_;
        extFrom_ = std::max(allocEnd_, end + gap);
        if (extFrom_ > allocEnd_) {
            holeFrom_ = std::max(allocEnd_, end);
            holeTo_ = extFrom_;
        }
        extTo_ = extFrom_ + preallocate_;
        extending_ = true;
        extendDone_.reset();
        extendWake_.set();
    }
    return true;
}

void ShardLog::writerLoop() noexcept {
    for (;;) {
        if (switch_ != nullptr) {
            Switch* s = std::exchange(switch_, nullptr);
            doSwitch(*s);
            s->done.set();
            continue;
        }
        if (pending_.empty()) {
            if (stopping_) { break; }
            wake_.reset();
            if (pending_.empty() && !stopping_ && switch_ == nullptr) { wake_.wait(); }
            continue;
        }
        writing_.swap(pending_);
        const uint64_t last = appended_;
        if (failed() == 0 && reserve(writing_.size())) {
            if (const int err = logWrite(fd_, writing_, offset_); err != 0) {
                fail(err);
            } else {
                offset_ += writing_.size();
                allocEnd_ = std::max(allocEnd_, offset_);
                size_.store(offset_, std::memory_order_relaxed);
                bytes_.fetch_add(writing_.size(), std::memory_order_relaxed);
            }
        }
        writing_.clear();
        if (failed() == 0) {
            written_ = last;
            if (mode_ == Fsync::kAlways) {
                if (const int err = logSync(fd_); err == 0) {
                    syncs_.fetch_add(1, std::memory_order_relaxed);
                    syncedRecords_.fetch_add(last - lastSynced_, std::memory_order_relaxed);
                    lastSynced_ = last;
                    durable_.store(last, std::memory_order_release);
                } else {
                    fail(err);
                }
            } else {
                unsynced_.fetch_add(1, std::memory_order_relaxed);
                durable_.store(last, std::memory_order_release);
            }
        }
        // Every waiter up to `last` learns its fate: durable_ says whether its record made it.
        done_.advance(last);
    }
    // Stopping: a last sync in every mode, so that a clean shutdown loses nothing.
    if (failed() == 0 && written_ > lastSynced_) {
        if (const int err = logSync(fd_); err == 0) {
            syncs_.fetch_add(1, std::memory_order_relaxed);
            syncedRecords_.fetch_add(written_ - lastSynced_, std::memory_order_relaxed);
            lastSynced_ = written_;
        } else {
            fail(err);
        }
    }
}

void ShardLog::beginCapture() {
    captured_.clear();
    capturing_ = true;
}

void ShardLog::takeCaptured(std::string& out) {
    out.append(captured_);
    captured_.clear();
}

void ShardLog::endCapture() noexcept {
    capturing_ = false;
    std::string().swap(captured_);
}

int ShardLog::switchTo(int newFd, uint64_t newSize, const std::string& tmpPath, const std::string& path, int dirFd) {
    if (const int err = failed(); err != 0 || stopping_) {
        endCapture();
        ::close(newFd);
        return err != 0 ? err : ECANCELED;
    }
    Switch s;
    s.fd = newFd;
    s.size = newSize;
    s.tmpPath = &tmpPath;
    s.path = &path;
    s.dirFd = dirFd;
    switch_ = &s;
    wake_.set();
    s.done.wait();
    return s.result;
}

// On the writer fiber, between two batches: whatever is in pending_ was never written to the old file
// (the last batch is written and, with kAlways, synced), and all of it is in the new file once the
// captured tail is, because the capture began before the snapshot read the shard.
void ShardLog::doSwitch(Switch& s) noexcept {
    waitExtension();  // no zeros may still be on their way to the old file once it is closed
    std::string tail;
    tail.swap(captured_);
    capturing_ = false;
    const size_t pendingAtSwitch = pending_.size();
    const uint64_t lastAtSwitch = appended_;
    int err = failed();
    if (err == 0) { err = logWrite(s.fd, tail, s.size); }
    if (err == 0) { err = logSync(s.fd); }
    if (err == 0) {
        auto r = spindle::renameat(AT_FDCWD, s.tmpPath->c_str(), AT_FDCWD, s.path->c_str(), 0);
        if (!r) { err = r.errorCode(); }
    }
    if (err != 0) {  // nothing renamed: the old file stays the log, pending_ goes there as before
        ::close(s.fd);
        (void)::unlink(s.tmpPath->c_str());
        s.result = err;
        return;
    }
    // The name is the new file's now: from here on the old file is no longer the log.
    ::close(fd_);
    fd_ = s.fd;
    offset_ = s.size + tail.size();
    allocEnd_ = offset_;  // the new file starts unextended; the next batch asks for room
    holeFrom_ = holeTo_ = 0;
    size_.store(offset_, std::memory_order_relaxed);
    bytes_.fetch_add(tail.size(), std::memory_order_relaxed);
    pending_.erase(0, pendingAtSwitch);
    if (auto r = spindle::fsync(s.dirFd); !r) {
        fail(r.errorCode());
        s.result = r.errorCode();
        done_.advance(lastAtSwitch);  // their waiters learn that the log failed
        return;
    }
    if (lastAtSwitch > lastSynced_) {
        syncs_.fetch_add(1, std::memory_order_relaxed);
        syncedRecords_.fetch_add(lastAtSwitch - lastSynced_, std::memory_order_relaxed);
    }
    written_ = lastAtSwitch;
    lastSynced_ = lastAtSwitch;
    durable_.store(lastAtSwitch, std::memory_order_release);
    done_.advance(lastAtSwitch);
}

void ShardLog::syncerLoop() noexcept {
    while (spindle::sleep(std::chrono::seconds(1))) {
        if (unsynced_.exchange(0, std::memory_order_relaxed) == 0 || failed() != 0) { continue; }
        const uint64_t covered = written_;
        if (const int err = logSync(fd_); err == 0) {
            if (covered > lastSynced_) {
                syncs_.fetch_add(1, std::memory_order_relaxed);
                syncedRecords_.fetch_add(covered - lastSynced_, std::memory_order_relaxed);
                lastSynced_ = covered;
            }
        } else {
            fail(err);
        }
    }
}

int ShardLog::stop() noexcept {
    if (stopped_) { return failed(); }
    stopped_ = true;
    if (syncer_.joinable()) {
        syncer_.cancel();
        syncer_.join();
    }
    if (writer_.joinable()) {
        (void)rt_->runOnCarrier(carrier_, [this]() noexcept {
            stopping_ = true;
            wake_.set();
        });
        writer_.join();
    }
    if (extender_.joinable()) {  // after the writer: it asks for no extension any more
        (void)rt_->runOnCarrier(carrier_, [this]() noexcept {
            extenderStop_ = true;
            extendWake_.set();
        });
        extender_.join();
    }
    // The zero tail goes: on disk the file is the log again. Only an optimisation (the zeros read as
    // the end), so a failure is only logged; a failed log is left as it is.
    struct stat st{};
    if (fd_ >= 0 && failed() == 0 && ::fstat(fd_, &st) == 0 && S_ISREG(st.st_mode) &&
        static_cast<uint64_t>(st.st_size) > offset_) {
        if (::ftruncate(fd_, static_cast<off_t>(offset_)) != 0 || ::fsync(fd_) != 0) {
            log::warn("spindle-kv: truncating the write-ahead log's preallocated tail: {}", std::strerror(errno));
        }
    }
    if (fd_ >= 0) {
        ::close(fd_);
        fd_ = -1;
    }
    return failed();
}

}  // namespace spindle::kv
