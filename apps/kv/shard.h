// SPDX-License-Identifier: Apache-2.0
#pragma once
/// One shard of spindle-kv's keyspace: the keys whose hash maps to it (strings, hashes, lists, sets),
/// their expiry times, and the log records of its mutations. A shard is touched by the thread of the carrier it belongs to
/// only (commands reach it through Runtime::runOnCarrier), so nothing in it is locked.
///
/// Expiry: lazy (a key found expired on access is removed then) plus active (activeExpire() removes
/// what a min-heap of expiry times says is due, a bounded number per call). Heap entries for a key
/// whose expiry changed since are skipped when they come up.
///
/// Logging: with a log attached, every mutation appends one record (absolute expiry times, so that a
/// replay later gives the same keyspace) and notes its sequence number in lastSeq(). A command that
/// changes several fields or elements of one key (HSET with many pairs, LPOP with a count) is one
/// record, so a torn tail never replays half of it. A key removed because it expired (lazily or
/// actively) is logged as a delete, as Redis propagates a DEL: replay never expires anything, so the
/// records that follow (an HSET that created the key anew) apply to what they applied to. A
/// collection left empty is removed, as in Redis (the replay of the same records removes it too).
/// Thread-safety: none; the owner carrier's thread only. usedBytes() and keyCount() may be read
/// anywhere (relaxed, racy).

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <deque>
#include <memory>
#include <queue>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <variant>
#include <vector>

#include "apps/kv/key_table.h"

namespace spindle::kv {

class ShardLog;

/// FNV-1a, 64 bits: the key's shard is hash % shards. Fixed, so that a key's log stays its shard's
/// across restarts and architectures.
[[nodiscard]] uint64_t keyHash(std::string_view key) noexcept;

/// keyHash as a transparent hasher (lookups by string_view build no string).
struct KeyHasher {
    using is_transparent = void;
    size_t operator()(std::string_view s) const noexcept { return static_cast<size_t>(keyHash(s)); }
};

enum class ValueType : uint8_t { kString = 0, kHash = 1, kList = 2, kSet = 3 };

/// TYPE's name for `t`: "string", "hash", "list", "set".
[[nodiscard]] const char* typeName(ValueType t) noexcept;

using HashValue = std::unordered_map<std::string, std::string, KeyHasher, std::equal_to<>>;
using ListValue = std::deque<std::string>;
using SetValue = std::unordered_set<std::string, KeyHasher, std::equal_to<>>;

/// What a key that is not a string holds, and the bytes counted for it (its elements and their overhead).
struct Collection {
    std::variant<HashValue, ListValue, SetValue> value;  // in ValueType's order (index + 1)
    uint64_t bytes = 0;
};

/// What every form of a key's value has: its expiry, and its collection unless it is a string. The
/// pointer is the tag (null: a string; else the variant's index says which collection), so a string
/// pays 8 bytes for it and the string path one null test.
/// Invariant: a collection is never empty (a command that empties one removes the key).
struct EntryBase {
    int64_t expireAtMs = 0;  // unix time in ms; 0: no expiry
    std::unique_ptr<Collection> coll;

    [[nodiscard]] ValueType type() const noexcept {
        return coll == nullptr ? ValueType::kString : static_cast<ValueType>(coll->value.index() + 1);
    }
    [[nodiscard]] bool isString() const noexcept { return coll == nullptr; }
    [[nodiscard]] HashValue& hash() noexcept { return std::get<HashValue>(coll->value); }
    [[nodiscard]] ListValue& list() noexcept { return std::get<ListValue>(coll->value); }
    [[nodiscard]] SetValue& set() noexcept { return std::get<SetValue>(coll->value); }
    [[nodiscard]] const HashValue& hash() const noexcept { return std::get<HashValue>(coll->value); }
    [[nodiscard]] const ListValue& list() const noexcept { return std::get<ListValue>(coll->value); }
    [[nodiscard]] const SetValue& set() const noexcept { return std::get<SetValue>(coll->value); }
};

/// A key's value and expiry apart from any shard: what RENAME carries from one shard to another, and
/// what a restore record decodes to before Shard::restore stores it.
struct Detached : EntryBase {
    std::string str;  // a string's bytes; unused for a collection
    [[nodiscard]] std::string_view value() const noexcept { return str; }
};

/// One key as a shard stores it: one allocation holding a 28-byte header, the key's bytes right after
/// it (in what would be the class's tail padding) and a string's bytes (a 16-byte string under a
/// 10-byte key takes one 64-byte malloc chunk; a std::string member took a 32-byte chunk of its own
/// beyond 15 bytes, and a third cache miss for GET). A
/// collection lives behind `coll`. Entries are made and destroyed by the shard and its KeyTable only;
/// an entry's address is stable until its key is removed or its string is set to one longer than
/// room() (Shard::set then makes a new one).
class Entry : public EntryBase {
public:
    Entry(const Entry&) = delete;
    Entry& operator=(const Entry&) = delete;

    /// Bytes before the key's: sizeof(Entry) less its padding.
    static constexpr size_t kHeader = sizeof(EntryBase) + 3 * sizeof(uint32_t);

    /// A new entry for `key` holding the string `value`, no expiry. Throws std::bad_alloc.
    [[nodiscard]] static Entry* make(std::string_view key, std::string_view value);
    static void destroy(Entry* e) noexcept;

    [[nodiscard]] std::string_view key() const noexcept { return {bytes(), keyLen_}; }
    /// A string's bytes (empty for a collection).
    [[nodiscard]] std::string_view value() const noexcept { return {bytes() + keyLen_, valueLen_}; }
    /// How long a string may grow in place.
    [[nodiscard]] size_t room() const noexcept { return room_; }
    /// Replaces the string's bytes. Precondition: v.size() <= room(), v does not overlap value().
    void assign(std::string_view v) noexcept;
    /// A deep copy, apart from the shard (RENAME to another shard).
    [[nodiscard]] Detached clone() const;

private:
    Entry(uint32_t keyLen, uint32_t valueLen, uint32_t room) noexcept : keyLen_(keyLen), valueLen_(valueLen), room_(room) {}
    ~Entry() = default;
    // Right after the last member: the header is 28 bytes, and sizeof(Entry) 32 only by padding.
    [[nodiscard]] char* bytes() noexcept { return reinterpret_cast<char*>(&room_ + 1); }
    [[nodiscard]] const char* bytes() const noexcept { return reinterpret_cast<const char*>(&room_ + 1); }

    uint32_t keyLen_;
    uint32_t valueLen_;
    uint32_t room_;
};
static_assert(sizeof(Entry) == 32, "a stored key's header: expiry, collection, three lengths, and padding");

/// Appends to `out` the framed log records that rebuild e's key with its value and expiry on replay,
/// replacing whatever the key held: one kRestore record per key. This is the one place that knows how
/// an entry is written out whole (RENAME and compaction's snapshot, Shard::snapshotSlice, both use it); Shard::replay reads it back.
void appendRestoreRecords(const Entry& e, std::string& out);

/// Whether `s` matches the glob `pattern` as KEYS matches keys in Redis: '*' any run, '?' any byte,
/// '[abc]', '[^abc]' and '[a-z]' sets (a reversed range counts as its ascending one; an unterminated set
/// ends at the end of the pattern), and '\\' to take the next byte literally, in or out of a set.
[[nodiscard]] bool globMatch(std::string_view pattern, std::string_view s) noexcept;

/// Unix time in milliseconds (CLOCK_REALTIME), what expiry times are kept in.
[[nodiscard]] int64_t nowMs() noexcept;

/// Where a compaction snapshot of a shard has got to (Shard::snapshotSlice): the keys whose tableHash
/// is below `next` have been written.
struct SnapshotCursor {
    uint64_t next = 0;
    bool started = false;
    bool done = false;   // every key visited
    bool ended = false;  // endSnapshot() was called
    uint64_t keys = 0;   // keys written
};

class Shard {
public:
    explicit Shard(unsigned index) noexcept : index_(index) {}

    /// The live entry for `key`, or null (removing it first when it has expired).
    [[nodiscard]] Entry* find(std::string_view key, int64_t now);

    /// Each mutation applies itself and, with a log, appends its record. set() replaces any type.
    void set(std::string_view key, std::string_view value, int64_t expireAtMs);
    bool del(std::string_view key);
    /// Collections. Precondition: the key is absent (it is created, without expiry) or of the type
    /// the call names (the caller answered WRONGTYPE otherwise).
    /// hset: sets each (field, value) pair of `fieldValues` in order; returns how many fields are new.
    int64_t hset(std::string_view key, std::span<const std::string_view> fieldValues);
    /// hdel, srem: removes what is there; returns how many were; removes the key when left empty.
    int64_t hdel(std::string_view key, std::span<const std::string_view> fields);
    /// push: each element in order at the head (left) or the tail; returns the new length.
    int64_t push(std::string_view key, bool left, std::span<const std::string_view> elements);
    /// pop: up to `count` elements from the head or the tail, in pop order.
    std::vector<std::string> pop(std::string_view key, bool left, size_t count);
    int64_t sadd(std::string_view key, std::span<const std::string_view> members);
    int64_t srem(std::string_view key, std::span<const std::string_view> members);
    /// Makes `key` hold `e` (value, type and expiry), replacing what it held (RENAME's destination).
    /// Throws std::bad_alloc (the key then unchanged, nothing logged).
    void restore(std::string_view key, Detached e);
    void expireAt(std::string_view key, int64_t atMs);  // Precondition: the key exists, atMs > 0
    bool persist(std::string_view key);
    void flush();

    /// Applies one log record (recovery). False when the payload is not a record this version wrote.
    [[nodiscard]] bool replay(std::string_view payload);
    /// Recovery: room for about `keys` more keys at once, instead of a rehash at every doubling (a
    /// third of a replay's time with a million keys). endReplay() gives back what was not used.
    void expectKeys(uint64_t keys);
    void endReplay();
    /// Recovery: starts loading what replaying `payload` will read to look its key up: the table's slot
    /// (stage 0), then, once that is cached, the key's node (stage 1), so that a batch of records wait
    /// for memory together, not one by one. Only a hint: it changes nothing.
    void prefetch(std::string_view payload, int stage) const noexcept;
    /// Start loading what a lookup of the key whose tableHash is `hash` reads: its slot, then (once the
    /// slot is cached) its node. A pipeline of commands prefetches the slots of the keys a few commands
    /// ahead, and their nodes a little less far ahead. Only hints: they change nothing.
    void prefetchSlot(uint64_t hash) const noexcept { table_.prefetch(hash); }
    void prefetchNode(uint64_t hash) const noexcept { table_.prefetchNode(hash); }

    /// Removes up to `budget` keys whose time has come; returns how many.
    size_t activeExpire(int64_t now, size_t budget);

    /// Calls fn(key) for every live key (KEYS); stops when fn returns false.
    void forEachKey(int64_t now, const std::function<bool(std::string_view)>& fn);
    /// One SCAN step over this shard: calls fn(key, entry) for the live keys of the key table in hash
    /// order from position `pos` on, whole home slots at a time, until about `count` keys (or 10 x
    /// count empty slots) have been seen. Returns the position to go on from, 0 once the table has
    /// been walked; `pos` 0 starts. A position is the top kScanPositionBits bits of the hash to go on
    /// from (KeyTable::walk), so a key present for the whole walk is returned exactly once however the
    /// table grows meanwhile (more than once only if it shrinks, which FLUSHALL and nothing else does).
    uint64_t scan(uint64_t pos, size_t count, int64_t now, const std::function<void(std::string_view, const Entry&)>& fn);
    static constexpr int kScanPositionBits = 40;
    /// A live key chosen at random, or "" with false when there is none (RANDOMKEY).
    bool randomKey(int64_t now, uint64_t seed, std::string& out);

    /// Appends the restore records (appendRestoreRecords) of the next keys of the table in hash order
    /// to `out`, whole home slots at a time, until `out` has grown by about `budget` bytes; returns true
    /// once every key has been visited. Between two calls the shard may change freely: a key that
    /// exists from the first call to the last and is not written in between is visited exactly once,
    /// however much the table grows (KeyTable::walk; a FLUSHALL during the walk keeps the slot array so
    /// that this holds there too). Keys written in between may or may not be visited; the caller
    /// captures those writes (ShardLog::beginCapture) and appends them after the snapshot.
    ///
    /// Collections: while a walk is under way, a hash, list or set command on a key the walk has not
    /// visited yet (its hash is at or above the cursor) logs the key whole (one kRestore, or a kDel once
    /// it is emptied) instead of its delta record: the snapshot will hold the change already, and a
    /// delta (an RPUSH, or an HSET on a key that is a set by the time the walk gets there) would be
    /// applied to it a second time when the capture is replayed after the snapshot. Keys already
    /// visited log deltas as usual.
    bool snapshotSlice(SnapshotCursor& cursor, int64_t now, size_t budget, std::string& out);
    /// Ends a walk, finished or not. Idempotent.
    void endSnapshot(SnapshotCursor& cursor) noexcept;

    void attachLog(ShardLog* log) noexcept { log_ = log; }
    [[nodiscard]] ShardLog* log() const noexcept { return log_; }
    /// The sequence number of the last record appended (0: none yet).
    [[nodiscard]] uint64_t lastSeq() const noexcept { return lastSeq_; }
    [[nodiscard]] unsigned index() const noexcept { return index_; }
    [[nodiscard]] uint64_t usedBytes() const noexcept { return used_.load(std::memory_order_relaxed); }
    [[nodiscard]] uint64_t keyCount() const noexcept { return keys_.load(std::memory_order_relaxed); }
    [[nodiscard]] uint64_t expiresCount() const noexcept { return expires_.load(std::memory_order_relaxed); }
    [[nodiscard]] uint64_t expiredKeys() const noexcept { return expired_.load(std::memory_order_relaxed); }

    // Bytes counted per key besides its name and value: the Entry header, malloc's, a table slot.
    static constexpr size_t kEntryOverhead = Entry::kHeader + 8 + KeyTable<Entry>::kSlotBytesPerKey;
    // Bytes counted per element of a collection besides its bytes (node, string headers; a hash
    // field's value is counted with it).
    static constexpr size_t kElementOverhead = 48;

private:
    /// Removes `key` (present, holding `e`), accounting for it.
    void erase(std::string_view key, uint64_t hash, const Entry& e);
    /// erase() for a key whose time has come, logged as a delete.
    void expire(std::string_view key, uint64_t hash, const Entry& e);
    /// The entry of `key` holding a collection of `type`, created empty when absent.
    Entry& collection(std::string_view key, ValueType type);
    /// Adds `fresh` (its key absent; hash `hash`), accounting for the key (not for its value). Throws
    /// std::bad_alloc, having destroyed `fresh`.
    Entry& insert(uint64_t hash, Entry* fresh);
    /// Removes `key` (present, holding `e`) when its collection has been emptied; accounts either way.
    void settle(std::string_view key, uint64_t hash, const Entry& e);
    void record(std::string_view payload);
    /// For a collection command on `key` (still in the map) about to log: whether it must log the key
    /// whole (a snapshot walk has not visited its bucket yet; see snapshotSlice).
    [[nodiscard]] bool logWhole(std::string_view key);
    /// Logs `key` whole: its restore record, or a delete when its collection is empty (or it is gone).
    void recordWhole(std::string_view key);
    /// With a log, logs a collection command on `key`: the key whole where logWhole says so, else the
    /// change: the record type `op`, the key, then what fields(std::string&) appends.
    template <class Fields>
    void logChange(std::string_view key, uint8_t op, Fields&& fields);
    void account() noexcept;
    void setExpiry(Entry& e, std::string_view key, int64_t atMs);

    unsigned index_;
    KeyTable<Entry> table_;
    using Due = std::pair<int64_t, std::string>;
    std::priority_queue<Due, std::vector<Due>, std::greater<>> due_;
    ShardLog* log_ = nullptr;
    const SnapshotCursor* walk_ = nullptr;  // the snapshot walk under way, if any (until it is done)
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
