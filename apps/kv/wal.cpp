// SPDX-License-Identifier: Apache-2.0
#include "apps/kv/wal.h"

#include <isa-l/crc.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/log.h"
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

// The record at `at` when it is whole and both checksums hold; its payload in `payload`.
bool validRecordAt(std::string_view log, size_t at, std::string_view& payload) noexcept {
    if (log.size() - at < kRecordHeader) { return false; }
    const char* h = log.data() + at;
    if (crc32c(h, 4) != getU32(h + 4)) { return false; }
    const uint32_t len = getU32(h);
    if (log.size() - at - kRecordHeader < len) { return false; }
    payload = log.substr(at + kRecordHeader, len);
    return crc32c(payload.data(), payload.size()) == getU32(h + 8);
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
    r.droppedBytes = log.size() - at;
    // A valid record after the bad one means the damage is not the end of the last write.
    for (size_t probe = at + 1; probe + kRecordHeader <= log.size(); ++probe) {
        if (validRecordAt(log, probe, payload)) {
            r.corruptInMiddle = true;
            break;
        }
    }
    return r;
}

ShardLog::ShardLog(int fd, uint64_t offset, Fsync mode) noexcept : fd_(fd), offset_(offset), mode_(mode) {
    size_.store(offset, std::memory_order_relaxed);
}

Result<std::unique_ptr<ShardLog>> ShardLog::start(Runtime& rt, unsigned carrier, int fd, uint64_t offset, Fsync mode) {
    std::unique_ptr<ShardLog> log(new ShardLog(fd, offset, mode));
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
    if (mode == Fsync::kEverySec) {
        auto syncer = rt.spawn([l = log.get()]() noexcept { l->syncerLoop(); },
                               SpawnOptions{.name = "kv-wal-sync", .carrier = static_cast<int>(carrier), .pinned = true});
        if (!syncer) {
            const int err = syncer.errorCode();
            log->fd_ = -1;
            (void)log->stop();
            return Error{err};
        }
        log->syncer_ = std::move(*syncer);
    }
    return log;
}

ShardLog::~ShardLog() { (void)stop(); }

uint64_t ShardLog::append(std::string_view payload) {
    frameRecord(pending_, payload);
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

int ShardLog::syncThrough(uint64_t seq) noexcept {
    if (seq > 0) { (void)done_.wait(seq); }
    if (failed() != 0) { return failed(); }
    if (auto r = spindle::fdatasync(fd_); !r) {
        fail(r.errorCode());
        return failed();
    }
    syncs_.fetch_add(1, std::memory_order_relaxed);
    return 0;
}

LogStats ShardLog::stats() const noexcept {
    return LogStats{.records = records_.load(std::memory_order_relaxed),
                    .bytes = bytes_.load(std::memory_order_relaxed),
                    .syncs = syncs_.load(std::memory_order_relaxed),
                    .syncedRecords = syncedRecords_.load(std::memory_order_relaxed)};
}

void ShardLog::fail(int err) noexcept {
    int expected = 0;
    if (failed_.compare_exchange_strong(expected, err, std::memory_order_acq_rel)) {
        log::error("spindle-kv: the write-ahead log failed ({}): writes are refused from now on", std::strerror(err));
    }
}

void ShardLog::writerLoop() noexcept {
    uint64_t lastSynced = 0;
    for (;;) {
        if (pending_.empty()) {
            if (stopping_) { break; }
            wake_.reset();
            if (pending_.empty() && !stopping_) { wake_.wait(); }
            continue;
        }
        writing_.swap(pending_);
        const uint64_t last = appended_;
        if (failed() == 0) {
            size_t done = 0;
            while (done < writing_.size()) {
                auto n = spindle::write(fd_, writing_.data() + done, writing_.size() - done, offset_ + done);
                if (!n || *n == 0) {
                    fail(n ? EIO : n.errorCode());
                    break;
                }
                done += *n;
            }
            offset_ += done;
            size_.store(offset_, std::memory_order_relaxed);
            bytes_.fetch_add(done, std::memory_order_relaxed);
        }
        writing_.clear();
        if (failed() == 0) {
            written_ = last;
            if (mode_ == Fsync::kAlways) {
                if (auto r = spindle::fdatasync(fd_); r) {
                    syncs_.fetch_add(1, std::memory_order_relaxed);
                    syncedRecords_.fetch_add(last - lastSynced, std::memory_order_relaxed);
                    lastSynced = last;
                    durable_.store(last, std::memory_order_release);
                } else {
                    fail(r.errorCode());
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
    if (failed() == 0 && written_ > lastSynced) {
        if (auto r = spindle::fdatasync(fd_); r) {
            syncs_.fetch_add(1, std::memory_order_relaxed);
            syncedRecords_.fetch_add(written_ - lastSynced, std::memory_order_relaxed);
        } else {
            fail(r.errorCode());
        }
    }
}

void ShardLog::syncerLoop() noexcept {
    uint64_t lastSynced = 0;
    while (spindle::sleep(std::chrono::seconds(1))) {
        if (unsynced_.exchange(0, std::memory_order_relaxed) == 0 || failed() != 0) { continue; }
        const uint64_t covered = written_;
        if (auto r = spindle::fdatasync(fd_); r) {
            syncs_.fetch_add(1, std::memory_order_relaxed);
            syncedRecords_.fetch_add(covered - lastSynced, std::memory_order_relaxed);
            lastSynced = covered;
        } else {
            fail(r.errorCode());
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
    if (fd_ >= 0) {
        ::close(fd_);
        fd_ = -1;
    }
    return failed();
}

}  // namespace spindle::kv
