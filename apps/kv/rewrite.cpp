// SPDX-License-Identifier: Apache-2.0
#include "apps/kv/rewrite.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include <fmt/format.h>

#include "core/io.h"

namespace spindle::kv {

namespace {

constexpr size_t kSliceBytes = 256 * 1024;      // snapshot bytes written per slice
constexpr size_t kSmallTail = 64 * 1024;        // a tail this short is left to the switch
constexpr int kTailRounds = 16;                 // tail drains at most before the switch regardless

}  // namespace

std::string shardLogPath(const std::string& dir, unsigned index) { return fmt::format("{}/shard-{}.log", dir, index); }

bool removeStaleRewrite(const std::string& dir, unsigned index) noexcept {
    const std::string tmp = shardLogPath(dir, index) + ".rewrite";
    return ::unlink(tmp.c_str()) == 0;
}

int rewriteShardLog(Shard& shard, ShardLog& log, const std::string& dir, const std::atomic<bool>& stop,
                    RewriteStats* stats) noexcept {
    const std::string path = shardLogPath(dir, shard.index());
    const std::string tmp = path + ".rewrite";
    auto dirFd = spindle::openat(AT_FDCWD, dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (!dirFd) { return dirFd.errorCode(); }
    auto fd = spindle::openat(AT_FDCWD, tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (!fd) {
        ::close(*dirFd);
        return fd.errorCode();
    }
    log.beginCapture();
    std::string buf;
    SnapshotCursor cursor;
    uint64_t offset = 0;
    uint64_t tailBytes = 0;
    int err = 0;
    for (bool done = false; !done && err == 0;) {
        done = shard.snapshotSlice(cursor, nowMs(), kSliceBytes, buf);
        if (!buf.empty()) {
            err = logWrite(*fd, buf, offset);  // parks: the carrier serves commands meanwhile
            offset += buf.size();
            buf.clear();
        }
        if (err == 0 && stop.load(std::memory_order_relaxed)) { err = ECANCELED; }
    }
    shard.endSnapshot(cursor);
    // What was appended during the snapshot, until what is left is small; the switch writes the rest.
    for (int round = 0; round < kTailRounds && err == 0; ++round) {
        log.takeCaptured(buf);
        if (buf.empty()) { break; }
        err = logWrite(*fd, buf, offset);
        offset += buf.size();
        tailBytes += buf.size();
        const bool small = buf.size() < kSmallTail;
        buf.clear();
        if (small) { break; }
    }
    if (err == 0) { err = logSync(*fd); }
    if (err != 0) {
        log.endCapture();
        ::close(*fd);
        (void)::unlink(tmp.c_str());
        ::close(*dirFd);
        return err;
    }
    err = log.switchTo(*fd, offset, tmp, path, *dirFd);
    ::close(*dirFd);
    if (stats != nullptr) {
        stats->keys = cursor.keys;
        stats->tailBytes = tailBytes;
        stats->size = log.size();
    }
    return err;
}

}  // namespace spindle::kv
