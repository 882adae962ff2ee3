// SPDX-License-Identifier: Apache-2.0
#pragma once
/// KeyTable<N>: spindle-kv's table of keys for one shard, kept in hash order.
///
/// Layout: a power-of-two array of 16-byte slots {hash, node}, probed linearly. The nodes are the
/// caller's: N is a type with `std::string_view key() const` and `static void destroy(N*)`; the table
/// owns the nodes it holds (spindle-kv's N is Entry, one allocation with the key and a string's bytes
/// inline). A key's home slot is the top bits of its 64-bit
/// hash (not the bottom ones), so slots run in hash order: a key sits at its home or a little after
/// it (never past an empty slot), and doubling the table keeps every key's relative order.
/// Removal shifts the keys behind back into the hole (no tombstones), so lookups never slow down with
/// churn. At most 3/4 of the slots are used; the table grows by doubling on insert and shrinks only on
/// shrinkToFit() or clear().
///
/// Why not std::unordered_map (what spindle-kv used first): a lookup there reads the bucket, then the
/// node before the key's (the bucket points at its predecessor), then the key's node, three cache
/// misses on a large table, plus a division per node compared; a profile of SET and GET with 16
/// pipelined commands put half the server's CPU time there. Here it is one slot line and the node, and
/// the slot can be prefetched from the hash alone (prefetch()).
///
/// Hash order gives walks that survive growth: walk(from, ...) visits every key whose hash is >= from
/// in increasing home slots and says where to go on, as a hash. A key present for the whole walk is
/// visited exactly once however much the table grows between two steps (its hash, not its slot, says
/// whether it was visited), and a key whose hash is below the position was visited (or inserted
/// after the walk passed). SCAN and the compaction snapshot are such walks. Only a shrink between
/// two steps can make a walk visit some keys twice (never miss one).
///
/// Pointer stability: a node stays where it is until it is erased or replaced (only slots move).
/// Errors: insert, reserve and shrinkToFit allocate and may throw std::bad_alloc, leaving the table as
/// it was; nothing else fails. Thread-safety: none.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string_view>
#include <utility>

#include "base/prefetch.h"

namespace spindle::kv {

/// The hash KeyTable is meant to be used with: a key's bytes read 8 at a time (overlapping reads for
/// the last ones), folded by 64x64->128-bit multiplications whose two halves are XORed, so that every
/// input bit reaches the top bits, which are the home slot. About 5 ns for a 16-byte key where a
/// byte-at-a-time FNV-1a takes about 20, and a command hashes its key three or four times. Not
/// persistent: nothing outside one process may depend on its values (the shard of a key is keyHash,
/// shard.h, which is fixed).
[[nodiscard]] inline uint64_t tableHash(std::string_view key) noexcept {
    constexpr uint64_t kA = 0x9E3779B97F4A7C15ull, kB = 0xD6E8FEB86659FD93ull, kC = 0xA0761D6478BD642Full;
    const auto mix = [](uint64_t x, uint64_t y) noexcept {
        const unsigned __int128 r = static_cast<unsigned __int128>(x) * y;
        return static_cast<uint64_t>(r) ^ static_cast<uint64_t>(r >> 64);
    };
    const auto load64 = [](const char* p) noexcept {
        uint64_t v;
        std::memcpy(&v, p, 8);
        return v;
    };
    const auto load32 = [](const char* p) noexcept {
        uint32_t v;
        std::memcpy(&v, p, 4);
        return static_cast<uint64_t>(v);
    };
    const char* p = key.data();
    size_t n = key.size();
    uint64_t seed = kC ^ (n * kA);
    uint64_t a = 0, b = 0;
    if (n > 16) {
        for (; n > 16; p += 16, n -= 16) { seed = mix(load64(p) ^ kA, load64(p + 8) ^ seed); }
        a = load64(p + n - 16);  // the last 16 bytes, overlapping what was folded in
        b = load64(p + n - 8);
    } else if (n >= 8) {
        a = load64(p);
        b = load64(p + n - 8);
    } else if (n >= 4) {
        a = load32(p);
        b = load32(p + n - 4);
    } else if (n > 0) {
        a = (static_cast<uint64_t>(static_cast<unsigned char>(p[0])) << 16) |
            (static_cast<uint64_t>(static_cast<unsigned char>(p[n / 2])) << 8) | static_cast<unsigned char>(p[n - 1]);
    }
    return mix(mix(a ^ kA, b ^ seed ^ kB), kC ^ seed);
}

template <class N>
class KeyTable {
public:
    KeyTable() = default;
    KeyTable(const KeyTable&) = delete;
    KeyTable& operator=(const KeyTable&) = delete;
    ~KeyTable() { release(); }

    [[nodiscard]] size_t size() const noexcept { return size_; }
    [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
    /// Slots (0 before the first insert). size() <= capacity() * 3 / 4.
    [[nodiscard]] size_t capacity() const noexcept { return mask_ + (slots_ != nullptr ? 1 : 0); }

    /// The node of `key`, whose hash is `hash`, or null.
    [[nodiscard]] N* find(std::string_view key, uint64_t hash) const noexcept {
        const size_t at = locate(key, hash);
        return at == kNone ? nullptr : slots_[at].node;
    }

    /// Takes `n`, whose key (hash `hash`) must be absent. Throws std::bad_alloc without taking it.
    void insert(uint64_t hash, N* n) {
        if ((size_ + 1) * 4 > capacity() * 3) { grow(std::max<size_t>(kMinCapacity, capacity() * 2)); }
        size_t at = home(hash);
        while (slots_[at].node != nullptr) { at = (at + 1) & mask_; }
        slots_[at] = Slot{hash, n};
        ++size_;
    }

    /// Puts `fresh` (the same key) where `old` is, and destroys `old`. Precondition: `old` is held.
    void replace(uint64_t hash, N* old, N* fresh) noexcept {
        size_t at = home(hash);
        while (slots_[at].node != old) { at = (at + 1) & mask_; }
        slots_[at].node = fresh;
        N::destroy(old);
    }

    /// Removes `key`; false when it was not there.
    bool erase(std::string_view key, uint64_t hash) noexcept {
        const size_t at = locate(key, hash);
        if (at == kNone) { return false; }
        N::destroy(slots_[at].node);
        --size_;
        closeHole(at);
        return true;
    }

    /// Removes every key. keepCapacity keeps the slot array (a walk under way then stays exact).
    void clear(bool keepCapacity = false) noexcept {
        if (!keepCapacity) {
            release();
            return;
        }
        for (size_t i = 0; i < capacity(); ++i) {
            if (slots_[i].node != nullptr) { N::destroy(slots_[i].node); }
            slots_[i] = Slot{};
        }
        size_ = 0;
    }

    /// Room for `keys` keys without growing. Throws std::bad_alloc (the table unchanged).
    void reserve(size_t keys) {
        const size_t want = std::bit_ceil(std::max<size_t>(kMinCapacity, (keys * 4 + 2) / 3));
        if (want > capacity()) { grow(want); }
    }
    /// Shrinks the slot array to the smallest that holds size() keys (nothing when it is that already).
    /// Throws std::bad_alloc (the table unchanged).
    void shrinkToFit() {
        if (size_ == 0) {
            release();
            return;
        }
        const size_t want = std::bit_ceil(std::max<size_t>(kMinCapacity, (size_ * 4 + 2) / 3));
        if (want < capacity()) { grow(want); }
    }

    /// Starts loading the slot where a lookup of `hash` begins (a hint; it changes nothing).
    void prefetch(uint64_t hash) const noexcept {
        if (slots_ != nullptr) { prefetchRead(&slots_[home(hash)]); }
    }
    /// Starts loading the node of the key in the home slot of `hash`, if that slot is cached already
    /// (after prefetch()); a hint for batches: prefetch() them all, then this, then look them up.
    void prefetchNode(uint64_t hash) const noexcept {
        if (slots_ == nullptr) { return; }
        for (size_t at = home(hash);; at = (at + 1) & mask_) {
            const Slot& s = slots_[at];
            if (s.node == nullptr) { return; }
            if (s.hash == hash) {
                prefetchRead(s.node);  // not __builtin_prefetch, which let GCC delete this loop (base/prefetch.h)
                return;
            }
            if (((at + 1) & 3) == 0) { return; }  // the end of the slot's cache line: not worth a miss
        }
    }

    /// Calls fn(node) for every node; stops early when fn returns false.
    template <class F>
    void forEach(F&& fn) const {
        for (size_t i = 0; i < capacity(); ++i) {
            if (slots_[i].node != nullptr && !fn(std::as_const(*slots_[i].node))) { return; }
        }
    }

    /// Where a walk has got to. `done` once every home slot was visited.
    struct WalkStep {
        uint64_t next = 0;  // the hash to go on from
        bool done = false;
    };
    /// Visits, in hash order, the keys whose home slot is at or after that of `from`, whole home slots at
    /// a time, calling fn(node, hash) for each, until fn has been called at least `keys` times
    /// (or `maxSlots` home slots were passed); returns where to go on. Visiting starts at the home slot
    /// of `from` rounded down, so a `from` that a previous step returned (on this table, or one it
    /// has since doubled into) revisits nothing. fn must not change the table.
    template <class F>
    WalkStep walk(uint64_t from, size_t keys, size_t maxSlots, F&& fn) const {
        if (slots_ == nullptr) { return WalkStep{0, true}; }
        const size_t cap = capacity();
        size_t first = home(from);
        size_t seen = 0;
        size_t passed = 0;
        while (first < cap && seen < keys && passed < maxSlots) {
            const size_t last = std::min(cap, first + kWalkChunk);  // homes [first, last)
            // The keys homed in [first, last) lie between `first` and the first empty slot at or after
            // `last` (a key is never past an empty slot from its home), among keys homed before `first`.
            for (size_t i = first;; ++i) {
                const Slot& s = slots_[i & mask_];
                if (s.node == nullptr) {
                    if (i >= last) { break; }
                    continue;
                }
                const size_t h = home(s.hash);
                if (h >= first && h < last) {
                    fn(std::as_const(*s.node), s.hash);
                    ++seen;
                }
            }
            passed += last - first;
            first = last;
        }
        if (first >= cap) { return WalkStep{0, true}; }
        return WalkStep{static_cast<uint64_t>(first) << shift_, false};
    }

    /// The first key at or after a slot chosen by `seed` (going round), or false when empty. Any key
    /// may come out; keys after long gaps more often.
    template <class F>
    bool pick(uint64_t seed, F&& accept) const {
        if (size_ == 0) { return false; }
        const size_t start = static_cast<size_t>(seed) & mask_;
        for (size_t i = 0; i < capacity(); ++i) {
            const Slot& s = slots_[(start + i) & mask_];
            if (s.node != nullptr && accept(std::as_const(*s.node))) { return true; }
        }
        return false;
    }

private:
    static constexpr size_t kNone = ~size_t{0};
    static constexpr size_t kMinCapacity = 8;
    static constexpr size_t kWalkChunk = 16;  // home slots per round of a walk (SCAN COUNT's grain)

    struct Slot {
        uint64_t hash = 0;
        N* node = nullptr;
    };

public:
    /// Bytes of slots per key at the load a table has on average between two doublings (about 0.56).
    static constexpr size_t kSlotBytesPerKey = 28;

private:
    [[nodiscard]] size_t home(uint64_t hash) const noexcept { return static_cast<size_t>(hash >> shift_); }

    [[nodiscard]] size_t locate(std::string_view key, uint64_t hash) const noexcept {
        if (slots_ == nullptr) { return kNone; }
        for (size_t at = home(hash);; at = (at + 1) & mask_) {
            const Slot& s = slots_[at];
            if (s.node == nullptr) { return kNone; }
            if (s.hash == hash && s.node->key() == key) { return at; }
        }
    }

    // Backward-shift deletion: moves each following key of the run back into the hole unless that
    // would put it before its home.
    void closeHole(size_t hole) noexcept {
        for (size_t at = (hole + 1) & mask_;; at = (at + 1) & mask_) {
            Slot& s = slots_[at];
            if (s.node == nullptr) { break; }
            const size_t h = home(s.hash);
            // Movable when its home is not in (hole, at] (cyclically).
            const bool homeAfterHole = hole <= at ? (h > hole && h <= at) : (h > hole || h <= at);
            if (homeAfterHole) { continue; }
            slots_[hole] = s;
            hole = at;
        }
        slots_[hole] = Slot{};
    }

    void grow(size_t cap) {
        auto fresh = std::make_unique<Slot[]>(cap);  // throws before anything changes
        const int bits = std::countr_zero(cap);
        const int shift = 64 - bits;
        const size_t mask = cap - 1;
        for (size_t i = 0; i < capacity(); ++i) {
            const Slot& s = slots_[i];
            if (s.node == nullptr) { continue; }
            size_t at = static_cast<size_t>(s.hash >> shift);
            while (fresh[at].node != nullptr) { at = (at + 1) & mask; }
            fresh[at] = s;
        }
        slots_ = std::move(fresh);
        mask_ = mask;
        shift_ = shift;
    }

    void release() noexcept {
        for (size_t i = 0; i < capacity(); ++i) {
            if (slots_[i].node != nullptr) { N::destroy(slots_[i].node); }
        }
        slots_.reset();
        mask_ = 0;
        shift_ = 63;
        size_ = 0;
    }

    std::unique_ptr<Slot[]> slots_;
    size_t mask_ = 0;  // capacity - 1
    int shift_ = 63;   // 64 - log2(capacity)
    size_t size_ = 0;
};

}  // namespace spindle::kv
