// SPDX-License-Identifier: Apache-2.0
#pragma once
/// One shard of spindle-kv's keyspace: the string keys whose hash maps to it, their expiry times, and
/// the log records of its mutations. A shard is touched by the thread of the carrier it belongs to
/// only (commands reach it through Runtime::runOnCarrier), so nothing in it is locked.
///
/// Expiry: lazy (a key found expired on access is removed then) plus active (activeExpire() removes
/// what a min-heap of expiry times says is due, a bounded number per call). Heap entries for a key
/// whose expiry changed since are skipped when they come up.
///
/// Logging: with a log attached, every mutation appends its record (absolute expiry times, so that a
/// replay later gives the same keyspace) and notes its sequence number in lastSeq(). Expiry itself is
/// not logged: a replayed key whose time has passed is expired again on access.
/// Thread-safety: none; the owner carrier's thread only. usedBytes() and keyCount() may be read
/// anywhere (relaxed, racy).

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <queue>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace spindle::kv {

class ShardLog;

struct Entry {
    std::string value;
    int64_t expireAtMs = 0;  // unix time in ms; 0: no expiry
};

/// FNV-1a, 64 bits: the key's shard is hash % shards. Fixed, so that a key's log stays its shard's
/// across restarts and architectures.
[[nodiscard]] uint64_t keyHash(std::string_view key) noexcept;

/// Whether `s` matches the glob `pattern` as KEYS matches keys in Redis: '*' any run, '?' any byte,
/// '[abc]', '[^abc]' and '[a-z]' sets (a reversed range counts as its ascending one; an unterminated set
/// ends at the end of the pattern), and '\\' to take the next byte literally, in or out of a set.
[[nodiscard]] bool globMatch(std::string_view pattern, std::string_view s) noexcept;

/// Unix time in milliseconds (CLOCK_REALTIME), what expiry times are kept in.
[[nodiscard]] int64_t nowMs() noexcept;

class Shard {
public:
    explicit Shard(unsigned index) noexcept : index_(index) {}

    /// The live entry for `key`, or null (removing it first when it has expired).
    [[nodiscard]] Entry* find(std::string_view key, int64_t now);

    /// Each mutation applies itself and, with a log, appends its record.
    void set(std::string_view key, std::string_view value, int64_t expireAtMs);
    bool del(std::string_view key);
    void expireAt(std::string_view key, int64_t atMs);  // Precondition: the key exists, atMs > 0
    bool persist(std::string_view key);
    void flush();

    /// Applies one log record (recovery). False when the payload is not a record this version wrote.
    [[nodiscard]] bool replay(std::string_view payload);

    /// Removes up to `budget` keys whose time has come; returns how many.
    size_t activeExpire(int64_t now, size_t budget);

    /// Calls fn(key) for every live key (KEYS); stops when fn returns false.
    void forEachKey(int64_t now, const std::function<bool(std::string_view)>& fn);

    void attachLog(ShardLog* log) noexcept { log_ = log; }
    [[nodiscard]] ShardLog* log() const noexcept { return log_; }
    /// The sequence number of the last record appended (0: none yet).
    [[nodiscard]] uint64_t lastSeq() const noexcept { return lastSeq_; }
    [[nodiscard]] unsigned index() const noexcept { return index_; }
    [[nodiscard]] uint64_t usedBytes() const noexcept { return used_.load(std::memory_order_relaxed); }
    [[nodiscard]] uint64_t keyCount() const noexcept { return keys_.load(std::memory_order_relaxed); }
    [[nodiscard]] uint64_t expiresCount() const noexcept { return expires_.load(std::memory_order_relaxed); }
    [[nodiscard]] uint64_t expiredKeys() const noexcept { return expired_.load(std::memory_order_relaxed); }

    // Bytes counted per key besides its name and value (hash node, Entry, string headers).
    static constexpr size_t kEntryOverhead = 96;

private:
    struct Hash {
        using is_transparent = void;
        size_t operator()(std::string_view s) const noexcept { return static_cast<size_t>(keyHash(s)); }
    };
    using Map = std::unordered_map<std::string, Entry, Hash, std::equal_to<>>;

    void erase(Map::iterator it);
    void record(std::string_view payload);
    void account() noexcept;
    void setExpiry(Entry& e, std::string_view key, int64_t atMs);

    unsigned index_;
    Map map_;
    using Due = std::pair<int64_t, std::string>;
    std::priority_queue<Due, std::vector<Due>, std::greater<>> due_;
    ShardLog* log_ = nullptr;
    uint64_t lastSeq_ = 0;
    uint64_t usedLocal_ = 0;
    uint64_t expiresLocal_ = 0;
    std::string scratch_;  // a record being built
    std::atomic<uint64_t> used_{0};
    std::atomic<uint64_t> keys_{0};
    std::atomic<uint64_t> expires_{0};
    std::atomic<uint64_t> expired_{0};
};

}  // namespace spindle::kv
