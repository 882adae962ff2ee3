// SPDX-License-Identifier: Apache-2.0
#include "apps/kv/shard.h"

#include <malloc.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <new>
#include <type_traits>
#include <utility>

#include "apps/kv/wal.h"

namespace spindle::kv {

namespace {

// Log record types. A record's payload is its type byte, then its fields (little-endian integers,
// strings as u32 length + bytes). Numbers are fixed: logs written by older builds must replay.
enum Op : uint8_t {
    kSet = 1,        // key, value, i64 expireAt
    kDel = 2,        // key
    kExpireAt = 3,   // key, i64 expireAt
    kPersist = 4,    // key
    kFlush = 5,      // (nothing)
    kHSet = 6,       // key, u32 n, n x (field, value)
    kHDel = 7,       // key, u32 n, n x field
    kPush = 8,       // key, u8 left, u32 n, n x element
    kPop = 9,        // key, u8 left, u32 count
    kSAdd = 10,      // key, u32 n, n x member
    kSRem = 11,      // key, u32 n, n x member
    kRestore = 12,   // key, u8 type, i64 expireAt, then by type: value | u32 n, n x (field, value) | u32 n, n x element
};

void putU32(std::string& out, uint32_t v) {
    for (int i = 0; i < 4; ++i) { out.push_back(static_cast<char>(v >> (8 * i))); }
}
void putI64(std::string& out, int64_t v) {
    const auto u = static_cast<uint64_t>(v);
    for (int i = 0; i < 8; ++i) { out.push_back(static_cast<char>(u >> (8 * i))); }
}
void putBytes(std::string& out, std::string_view s) {
    putU32(out, static_cast<uint32_t>(s.size()));
    out.append(s);
}
void putList(std::string& out, std::span<const std::string_view> items) {
    putU32(out, static_cast<uint32_t>(items.size()));
    for (std::string_view i : items) { putBytes(out, i); }
}

uint64_t entryBytes(const Entry& e) noexcept { return e.isString() ? e.value().size() : e.coll->bytes; }

std::unique_ptr<Collection> emptyCollection(ValueType type) {
    auto c = std::make_unique<Collection>();
    if (type == ValueType::kList) {
        c->value.emplace<ListValue>();
    } else if (type == ValueType::kSet) {
        c->value.emplace<SetValue>();
    }
    return c;
}

// The restore record of `key` holding `e` (an Entry or a Detached; see kRestore).
template <class E>
void encodeRestore(std::string_view key, const E& e, std::string& out) {
    out.push_back(static_cast<char>(kRestore));
    putBytes(out, key);
    out.push_back(static_cast<char>(e.type()));
    putI64(out, e.expireAtMs);
    switch (e.type()) {
        case ValueType::kString: putBytes(out, e.value()); break;
        case ValueType::kHash:
            putU32(out, static_cast<uint32_t>(e.hash().size()));
            for (const auto& [f, v] : e.hash()) {
                putBytes(out, f);
                putBytes(out, v);
            }
            break;
        case ValueType::kList:
            putU32(out, static_cast<uint32_t>(e.list().size()));
            for (const std::string& v : e.list()) { putBytes(out, v); }
            break;
        case ValueType::kSet:
            putU32(out, static_cast<uint32_t>(e.set().size()));
            for (const std::string& v : e.set()) { putBytes(out, v); }
            break;
    }
}

// Reads a record's fields in order; any read past the end sets ok to false.
struct Reader {
    std::string_view in;
    bool ok = true;
    uint64_t fixed(int bytes) {
        if (in.size() < static_cast<size_t>(bytes)) {
            ok = false;
            return 0;
        }
        uint64_t v = 0;
        for (int i = 0; i < bytes; ++i) { v |= uint64_t{static_cast<unsigned char>(in[static_cast<size_t>(i)])} << (8 * i); }
        in.remove_prefix(static_cast<size_t>(bytes));
        return v;
    }
    std::string_view bytes() {
        const auto len = static_cast<size_t>(fixed(4));
        if (!ok || in.size() < len) {
            ok = false;
            return {};
        }
        std::string_view s = in.substr(0, len);
        in.remove_prefix(len);
        return s;
    }
    // A u32 count, then that many strings (each at least 4 bytes, so a bad count fails fast).
    bool list(std::vector<std::string_view>& out) {
        const auto n = static_cast<size_t>(fixed(4));
        if (!ok || n > in.size() / 4) {
            ok = false;
            return false;
        }
        out.clear();
        for (size_t i = 0; i < n && ok; ++i) { out.push_back(bytes()); }
        return ok;
    }
};

}  // namespace

const char* typeName(ValueType t) noexcept {
    switch (t) {
        case ValueType::kString: return "string";
        case ValueType::kHash: return "hash";
        case ValueType::kList: return "list";
        case ValueType::kSet: return "set";
    }
    return "none";
}

Entry* Entry::make(std::string_view key, std::string_view value) {
    // At least sizeof(Entry): an empty key and value still need the whole object.
    const size_t want = std::max(sizeof(Entry), kHeader + key.size() + value.size());
    void* mem = std::malloc(want);
    if (mem == nullptr) { throw std::bad_alloc(); }
    // What malloc's chunk holds beyond the request is room to grow the string in place.
    const size_t room = std::min<size_t>(malloc_usable_size(mem) - kHeader - key.size(), UINT32_MAX);
    auto* e = ::new (mem) Entry(static_cast<uint32_t>(key.size()), static_cast<uint32_t>(value.size()),
                                static_cast<uint32_t>(room));
    if (!key.empty()) { std::memcpy(e->bytes(), key.data(), key.size()); }
    if (!value.empty()) { std::memcpy(e->bytes() + key.size(), value.data(), value.size()); }
    return e;
}

void Entry::destroy(Entry* e) noexcept {
    e->~Entry();
    std::free(e);
}

void Entry::assign(std::string_view v) noexcept {
    if (!v.empty()) { std::memcpy(bytes() + keyLen_, v.data(), v.size()); }
    valueLen_ = static_cast<uint32_t>(v.size());
}

Detached Entry::clone() const {
    Detached d;
    d.str = value();
    d.expireAtMs = expireAtMs;
    if (coll) { d.coll = std::make_unique<Collection>(*coll); }
    return d;
}

void appendRestoreRecords(const Entry& e, std::string& out) {
    // Built in place after the record header (wal.h's frameRecord would copy it): a snapshot writes
    // one of these per key.
    const size_t at = out.size();
    out.append(kRecordHeader, '\0');
    encodeRestore(e.key(), e, out);
    frameRecordInPlace(out, at);
}

uint64_t keyHash(std::string_view key) noexcept {
    uint64_t h = 0xcbf29ce484222325ull;
    for (char c : key) {
        h ^= static_cast<unsigned char>(c);
        h *= 0x100000001b3ull;
    }
    return h;
}

namespace {

// Matches one pattern element at p[i] against `c`; `next` is where the element ends.
bool matchOne(std::string_view p, size_t i, char c, size_t& next) noexcept {
    if (p[i] == '?') {
        next = i + 1;
        return true;
    }
    if (p[i] == '\\' && i + 1 < p.size()) {
        next = i + 2;
        return p[i + 1] == c;
    }
    if (p[i] != '[') {
        next = i + 1;
        return p[i] == c;
    }
    ++i;
    const bool negate = i < p.size() && p[i] == '^';
    if (negate) { ++i; }
    bool matched = false;
    while (i < p.size() && p[i] != ']') {
        if (p[i] == '\\' && i + 1 < p.size()) {
            matched = matched || p[i + 1] == c;
            i += 2;
        } else if (i + 2 < p.size() && p[i + 1] == '-') {
            auto lo = static_cast<unsigned char>(p[i]), hi = static_cast<unsigned char>(p[i + 2]);
            if (lo > hi) { std::swap(lo, hi); }
            const auto u = static_cast<unsigned char>(c);
            matched = matched || (u >= lo && u <= hi);
            i += 3;
        } else {
            matched = matched || p[i] == c;
            ++i;
        }
    }
    next = i < p.size() ? i + 1 : i;  // past the ']', or the end of an unterminated set
    return negate ? !matched : matched;
}

}  // namespace

bool globMatch(std::string_view p, std::string_view s) noexcept {
    size_t pi = 0, si = 0;
    size_t starP = std::string_view::npos, starS = 0;  // where to resume after the last '*'
    while (si < s.size()) {
        if (pi < p.size() && p[pi] == '*') {
            while (pi < p.size() && p[pi] == '*') { ++pi; }
            if (pi == p.size()) { return true; }
            starP = pi;
            starS = si;
            continue;
        }
        size_t next = 0;
        if (pi < p.size() && matchOne(p, pi, s[si], next)) {
            pi = next;
            ++si;
            continue;
        }
        if (starP == std::string_view::npos) { return false; }
        pi = starP;  // let the last '*' take one more byte
        si = ++starS;
    }
    while (pi < p.size() && p[pi] == '*') { ++pi; }
    return pi == p.size();
}

int64_t nowMs() noexcept {
    timespec t{};
    ::clock_gettime(CLOCK_REALTIME, &t);
    return static_cast<int64_t>(t.tv_sec) * 1000 + t.tv_nsec / 1'000'000;
}

namespace {

void setPayload(std::string& out, std::string_view key, std::string_view value, int64_t expireAtMs) {
    out.push_back(static_cast<char>(kSet));
    putBytes(out, key);
    putBytes(out, value);
    putI64(out, expireAtMs);
}

}  // namespace

void Shard::account() noexcept {
    used_.store(usedLocal_, std::memory_order_relaxed);
    keys_.store(table_.size(), std::memory_order_relaxed);
    expires_.store(expiresLocal_, std::memory_order_relaxed);
}

void Shard::record(std::string_view payload) {
    if (log_ != nullptr) { lastSeq_ = log_->append(payload); }
}

bool Shard::logWhole(std::string_view key) {
    return walk_ != nullptr && tableHash(key) >= walk_->next;  // the walk has not got to it
}

void Shard::recordWhole(std::string_view key) {
    scratch_.clear();
    const Entry* e = table_.find(key, tableHash(key));
    if (e == nullptr || std::visit([](const auto& c) { return c.empty(); }, e->coll->value)) {
        scratch_.push_back(static_cast<char>(kDel));
        putBytes(scratch_, key);
    } else {
        encodeRestore(key, *e, scratch_);
    }
    record(scratch_);
}

template <class Fields>
void Shard::logChange(std::string_view key, uint8_t op, Fields&& fields) {
    if (log_ == nullptr) { return; }
    if (logWhole(key)) {
        recordWhole(key);
        return;
    }
    scratch_.clear();
    scratch_.push_back(static_cast<char>(op));
    putBytes(scratch_, key);
    fields(scratch_);
    record(scratch_);
}

void Shard::erase(std::string_view key, uint64_t hash, const Entry& e) {
    usedLocal_ -= key.size() + entryBytes(e) + kEntryOverhead;
    if (e.expireAtMs != 0) { --expiresLocal_; }
    (void)table_.erase(key, hash);
    account();
}

Entry& Shard::insert(uint64_t hash, Entry* fresh) {
    try {
        table_.insert(hash, fresh);
    } catch (...) {
        Entry::destroy(fresh);
        throw;
    }
    usedLocal_ += fresh->key().size() + kEntryOverhead;
    return *fresh;
}

Entry* Shard::find(std::string_view key, int64_t now) {
    const uint64_t hash = tableHash(key);
    Entry* e = table_.find(key, hash);
    if (e == nullptr) { return nullptr; }
    if (e->expireAtMs != 0 && e->expireAtMs <= now) {
        expire(key, hash, *e);
        return nullptr;
    }
    return e;
}

void Shard::expire(std::string_view key, uint64_t hash, const Entry& e) {
    // Logged as a delete (as Redis propagates a DEL): a replay does not expire, and without it a later
    // HSET or LPUSH on the same name would replay into the old value.
    if (log_ != nullptr && log_->failed() == 0) {
        scratch_.clear();
        scratch_.push_back(static_cast<char>(kDel));
        putBytes(scratch_, key);
        record(scratch_);
    }
    erase(key, hash, e);
    expired_.fetch_add(1, std::memory_order_relaxed);
}

void Shard::setExpiry(Entry& e, std::string_view key, int64_t atMs) {
    if (e.expireAtMs == 0 && atMs != 0) { ++expiresLocal_; }
    if (e.expireAtMs != 0 && atMs == 0) { --expiresLocal_; }
    e.expireAtMs = atMs;
    if (atMs != 0) { due_.emplace(atMs, std::string(key)); }
}

void Shard::set(std::string_view key, std::string_view value, int64_t expireAtMs) {
    const uint64_t hash = tableHash(key);
    Entry* e = table_.find(key, hash);
    if (e == nullptr) {
        e = &insert(hash, Entry::make(key, value));
    } else {
        usedLocal_ -= entryBytes(*e);
        if (value.size() <= e->room()) {
            e->assign(value);
            e->coll.reset();
        } else {  // a longer string than the entry has room for: a new entry in its place
            Entry* fresh = Entry::make(key, value);
            fresh->expireAtMs = e->expireAtMs;
            table_.replace(hash, e, fresh);
            e = fresh;
        }
    }
    usedLocal_ += value.size();
    setExpiry(*e, key, expireAtMs);
    account();
    if (log_ != nullptr) {
        scratch_.clear();
        setPayload(scratch_, key, value, expireAtMs);
        record(scratch_);
    }
}

bool Shard::del(std::string_view key) {
    const uint64_t hash = tableHash(key);
    const Entry* e = table_.find(key, hash);
    if (e == nullptr) { return false; }
    erase(key, hash, *e);
    if (log_ != nullptr) {
        scratch_.clear();
        scratch_.push_back(static_cast<char>(kDel));
        putBytes(scratch_, key);
        record(scratch_);
    }
    return true;
}

Entry& Shard::collection(std::string_view key, ValueType type) {
    const uint64_t hash = tableHash(key);
    if (Entry* e = table_.find(key, hash)) { return *e; }
    std::unique_ptr<Collection> c = emptyCollection(type);
    Entry& e = insert(hash, Entry::make(key, {}));
    e.coll = std::move(c);
    return e;
}

void Shard::settle(std::string_view key, uint64_t hash, const Entry& e) {
    const bool empty = std::visit([](const auto& c) { return c.empty(); }, e.coll->value);
    if (empty) {
        erase(key, hash, e);
    } else {
        account();
    }
}

int64_t Shard::hset(std::string_view key, std::span<const std::string_view> fieldValues) {
    Entry& e = collection(key, ValueType::kHash);
    HashValue& h = e.hash();
    int64_t added = 0;
    for (size_t i = 0; i + 1 < fieldValues.size(); i += 2) {
        const std::string_view f = fieldValues[i], v = fieldValues[i + 1];
        auto it = h.find(f);
        if (it == h.end()) {
            h.emplace(std::string(f), std::string(v));
            e.coll->bytes += f.size() + v.size() + kElementOverhead;
            usedLocal_ += f.size() + v.size() + kElementOverhead;
            ++added;
        } else {
            e.coll->bytes += v.size();
            e.coll->bytes -= it->second.size();
            usedLocal_ += v.size();
            usedLocal_ -= it->second.size();
            it->second.assign(v);
        }
    }
    account();
    logChange(key, kHSet, [&](std::string& rec) {
        putU32(rec, static_cast<uint32_t>(fieldValues.size() / 2));
        for (std::string_view x : fieldValues) { putBytes(rec, x); }
    });
    return added;
}

int64_t Shard::hdel(std::string_view key, std::span<const std::string_view> fields) {
    const uint64_t hash = tableHash(key);
    Entry* found = table_.find(key, hash);
    if (found == nullptr) { return 0; }
    Entry& e = *found;
    int64_t removed = 0;
    for (std::string_view f : fields) {
        auto at = e.hash().find(f);
        if (at == e.hash().end()) { continue; }
        const uint64_t bytes = at->first.size() + at->second.size() + kElementOverhead;
        e.coll->bytes -= bytes;
        usedLocal_ -= bytes;
        e.hash().erase(at);
        ++removed;
    }
    if (removed == 0) { return 0; }
    logChange(key, kHDel, [&](std::string& rec) { putList(rec, fields); });
    settle(key, hash, e);
    return removed;
}

int64_t Shard::push(std::string_view key, bool left, std::span<const std::string_view> elements) {
    Entry& e = collection(key, ValueType::kList);
    ListValue& l = e.list();
    for (std::string_view v : elements) {
        if (left) {
            l.emplace_front(v);
        } else {
            l.emplace_back(v);
        }
        e.coll->bytes += v.size() + kElementOverhead;
        usedLocal_ += v.size() + kElementOverhead;
    }
    account();
    logChange(key, kPush, [&](std::string& rec) {
        rec.push_back(left ? 1 : 0);
        putList(rec, elements);
    });
    return static_cast<int64_t>(l.size());
}

std::vector<std::string> Shard::pop(std::string_view key, bool left, size_t count) {
    std::vector<std::string> out;
    const uint64_t hash = tableHash(key);
    Entry* found = table_.find(key, hash);
    if (found == nullptr || count == 0) { return out; }
    Entry& e = *found;
    ListValue& l = e.list();
    while (out.size() < count && !l.empty()) {
        std::string& v = left ? l.front() : l.back();
        e.coll->bytes -= v.size() + kElementOverhead;
        usedLocal_ -= v.size() + kElementOverhead;
        out.push_back(std::move(v));
        if (left) {
            l.pop_front();
        } else {
            l.pop_back();
        }
    }
    logChange(key, kPop, [&](std::string& rec) {
        rec.push_back(left ? 1 : 0);
        putU32(rec, static_cast<uint32_t>(out.size()));
    });
    settle(key, hash, e);
    return out;
}

int64_t Shard::sadd(std::string_view key, std::span<const std::string_view> members) {
    Entry& e = collection(key, ValueType::kSet);
    int64_t added = 0;
    for (std::string_view m : members) {
        if (e.set().emplace(m).second) {
            e.coll->bytes += m.size() + kElementOverhead;
            usedLocal_ += m.size() + kElementOverhead;
            ++added;
        }
    }
    account();
    if (added > 0) {
        logChange(key, kSAdd, [&](std::string& rec) { putList(rec, members); });
    }
    return added;
}

int64_t Shard::srem(std::string_view key, std::span<const std::string_view> members) {
    const uint64_t hash = tableHash(key);
    Entry* found = table_.find(key, hash);
    if (found == nullptr) { return 0; }
    Entry& e = *found;
    int64_t removed = 0;
    for (std::string_view m : members) {
        auto at = e.set().find(m);
        if (at == e.set().end()) { continue; }
        e.coll->bytes -= m.size() + kElementOverhead;
        usedLocal_ -= m.size() + kElementOverhead;
        e.set().erase(at);
        ++removed;
    }
    if (removed == 0) { return 0; }
    logChange(key, kSRem, [&](std::string& rec) { putList(rec, members); });
    settle(key, hash, e);
    return removed;
}

void Shard::restore(std::string_view key, Detached e) {
    const uint64_t hash = tableHash(key);
    if (log_ != nullptr) {
        scratch_.clear();
        encodeRestore(key, e, scratch_);
    }
    Entry* fresh = Entry::make(key, e.str);  // may throw: nothing has changed yet
    fresh->coll = std::move(e.coll);
    const int64_t at = e.expireAtMs;  // set below, counted as a new expiry
    // The old entry's slot makes room for the new one: the insert cannot grow the table, nor throw.
    if (const Entry* old = table_.find(key, hash)) { erase(key, hash, *old); }
    Entry& in = insert(hash, fresh);
    usedLocal_ += entryBytes(in);
    setExpiry(in, key, at);
    account();
    if (log_ != nullptr) { record(scratch_); }
}

void Shard::expireAt(std::string_view key, int64_t atMs) {
    Entry* e = table_.find(key, tableHash(key));
    if (e == nullptr) { return; }
    setExpiry(*e, key, atMs);
    account();
    if (log_ != nullptr) {
        scratch_.clear();
        scratch_.push_back(static_cast<char>(kExpireAt));
        putBytes(scratch_, key);
        putI64(scratch_, atMs);
        record(scratch_);
    }
}

bool Shard::persist(std::string_view key) {
    Entry* e = table_.find(key, tableHash(key));
    if (e == nullptr || e->expireAtMs == 0) { return false; }
    setExpiry(*e, key, 0);
    account();
    if (log_ != nullptr) {
        scratch_.clear();
        scratch_.push_back(static_cast<char>(kPersist));
        putBytes(scratch_, key);
        record(scratch_);
    }
    return true;
}

void Shard::flush() {
    table_.clear(walk_ != nullptr);  // a walk under way stays exact (see snapshotSlice)
    due_ = {};
    usedLocal_ = 0;
    expiresLocal_ = 0;
    account();
    if (log_ != nullptr) {
        scratch_.assign(1, static_cast<char>(kFlush));
        record(scratch_);
    }
}

bool Shard::replay(std::string_view payload) {
    if (payload.empty()) { return false; }
    Reader r{payload.substr(1)};
    ShardLog* log = std::exchange(log_, nullptr);  // replaying writes nothing back
    bool ok = true;
    switch (static_cast<uint8_t>(payload[0])) {
        case kSet: {
            const std::string_view key = r.bytes();
            const std::string_view value = r.bytes();
            const auto at = static_cast<int64_t>(r.fixed(8));
            if ((ok = r.ok && r.in.empty())) { set(key, value, at); }
            break;
        }
        case kDel: {
            const std::string_view key = r.bytes();
            if ((ok = r.ok && r.in.empty())) { (void)del(key); }
            break;
        }
        case kExpireAt: {
            const std::string_view key = r.bytes();
            const auto at = static_cast<int64_t>(r.fixed(8));
            if ((ok = r.ok && r.in.empty() && at > 0)) { expireAt(key, at); }
            break;
        }
        case kPersist: {
            const std::string_view key = r.bytes();
            if ((ok = r.ok && r.in.empty())) { (void)persist(key); }
            break;
        }
        case kFlush:
            if ((ok = payload.size() == 1)) { flush(); }
            break;
        case kHSet:
        case kHDel:
        case kSAdd:
        case kSRem: {
            const std::string_view key = r.bytes();
            std::vector<std::string_view> items;
            const auto op = static_cast<uint8_t>(payload[0]);
            if (op == kHSet) {
                const auto n = static_cast<size_t>(r.fixed(4));
                ok = r.ok && n <= r.in.size() / 8;
                for (size_t i = 0; ok && i < 2 * n; ++i) { items.push_back(r.bytes()); }
            } else {
                (void)r.list(items);
            }
            const ValueType want = op == kHSet || op == kHDel ? ValueType::kHash : ValueType::kSet;
            Entry* e = ok ? find(key, INT64_MIN) : nullptr;
            if (!(ok = ok && r.ok && r.in.empty() && (e == nullptr || e->type() == want))) { break; }
            if (op == kHSet) {
                (void)hset(key, items);
            } else if (op == kHDel) {
                (void)hdel(key, items);
            } else if (op == kSAdd) {
                (void)sadd(key, items);
            } else {
                (void)srem(key, items);
            }
            break;
        }
        case kPush:
        case kPop: {
            const std::string_view key = r.bytes();
            const bool left = r.fixed(1) != 0;
            std::vector<std::string_view> items;
            size_t count = 0;
            if (payload[0] == kPush) {
                (void)r.list(items);
            } else {
                count = static_cast<size_t>(r.fixed(4));
            }
            Entry* e = r.ok ? find(key, INT64_MIN) : nullptr;
            if (!(ok = r.ok && r.in.empty() && (e == nullptr || e->type() == ValueType::kList))) { break; }
            if (payload[0] == kPush) {
                (void)push(key, left, items);
            } else {
                (void)pop(key, left, count);
            }
            break;
        }
        case kRestore: {
            const std::string_view key = r.bytes();
            const auto type = static_cast<uint8_t>(r.fixed(1));
            Detached e;
            e.expireAtMs = static_cast<int64_t>(r.fixed(8));
            if (!(ok = r.ok && type <= static_cast<uint8_t>(ValueType::kSet))) { break; }
            const auto t = static_cast<ValueType>(type);
            std::vector<std::string_view> items;
            if (t == ValueType::kString) {
                e.str = std::string(r.bytes());
            } else if (t == ValueType::kHash) {
                const auto n = static_cast<size_t>(r.fixed(4));
                ok = r.ok && n <= r.in.size() / 8;
                for (size_t i = 0; ok && i < 2 * n; ++i) { items.push_back(r.bytes()); }
            } else {
                (void)r.list(items);
            }
            if (!(ok = ok && r.ok && r.in.empty() && (t == ValueType::kString || !items.empty()))) { break; }
            if (t != ValueType::kString) {
                e.coll = emptyCollection(t);
                for (size_t i = 0; i < items.size(); ++i) {
                    if (t == ValueType::kHash) {
                        e.hash().insert_or_assign(std::string(items[i]), std::string(items[i + 1]));
                        ++i;
                    } else if (t == ValueType::kList) {
                        e.list().emplace_back(items[i]);
                    } else {
                        e.set().emplace(items[i]);
                    }
                }
                // The bytes as the incremental calls count them.
                std::visit(
                    [&](const auto& c) {
                        for (const auto& item : c) {
                            if constexpr (std::is_same_v<std::decay_t<decltype(item)>, std::string>) {
                                e.coll->bytes += item.size() + kElementOverhead;
                            } else {
                                e.coll->bytes += item.first.size() + item.second.size() + kElementOverhead;
                            }
                        }
                    },
                    e.coll->value);
            }
            restore(key, std::move(e));
            break;
        }
        default: ok = false;
    }
    log_ = log;
    return ok;
}

void Shard::expectKeys(uint64_t keys) {
    constexpr uint64_t kMost = uint64_t{1} << 27;  // a bound on the guess (2 GiB of slots)
    table_.reserve(static_cast<size_t>(std::min<uint64_t>(table_.size() + keys, kMost)));
}

void Shard::prefetch(std::string_view payload, int stage) const noexcept {
    // Every record but kFlush starts with the key: op, u32 length, bytes.
    if (payload.size() < 5 || static_cast<uint8_t>(payload[0]) == kFlush) { return; }
    Reader r{payload.substr(1)};
    const std::string_view key = r.bytes();
    if (!r.ok) { return; }
    if (stage == 0) {
        prefetchSlot(tableHash(key));
    } else {
        prefetchNode(tableHash(key));
    }
}

void Shard::endReplay() {
    // A log that rewrote few keys many times had far fewer keys than records: give back the slots.
    table_.shrinkToFit();
}

size_t Shard::activeExpire(int64_t now, size_t budget) {
    size_t removed = 0;
    while (!due_.empty() && due_.top().first <= now && budget > 0) {
        --budget;
        const std::string_view key = due_.top().second;
        const uint64_t hash = tableHash(key);
        const Entry* e = table_.find(key, hash);
        if (e != nullptr && e->expireAtMs == due_.top().first) {
            expire(key, hash, *e);
            ++removed;
        }
        due_.pop();
    }
    return removed;
}

uint64_t Shard::scan(uint64_t pos, size_t count, int64_t now,
                     const std::function<void(std::string_view, const Entry&)>& fn) {
    constexpr int kShift = 64 - kScanPositionBits;
    // Whole home slots until about `count` keys; as many empty ones as Redis would pass (10 x count).
    const auto step = table_.walk(pos << kShift, count, count * 10, [&](const Entry& e, uint64_t) {
        if (e.expireAtMs != 0 && e.expireAtMs <= now) { return; }
        fn(e.key(), e);
    });
    // A table of more than 2^40 slots would need a finer position; KeyTable's positions are home slots.
    return step.done ? 0 : step.next >> kShift;
}

bool Shard::randomKey(int64_t now, uint64_t seed, std::string& out) {
    return table_.pick(seed, [&](const Entry& e) {
        if (e.expireAtMs != 0 && e.expireAtMs <= now) { return false; }
        out.assign(e.key());
        return true;
    });
}

bool Shard::snapshotSlice(SnapshotCursor& c, int64_t now, size_t budget, std::string& out) {
    if (c.done) { return true; }
    if (!c.started) {
        c.started = true;
        c.next = 0;
        walk_ = &c;
    }
    const size_t target = out.size() + budget;
    // A slice ends after whole home slots once `out` has grown by `budget`: about that many keys' worth.
    KeyTable<Entry>::WalkStep step{c.next, false};
    while (!step.done && out.size() < target) {
        step = table_.walk(step.next, 1, SIZE_MAX, [&](const Entry& e, uint64_t) {
            if (e.expireAtMs != 0 && e.expireAtMs <= now) { return; }
            appendRestoreRecords(e, out);
            ++c.keys;
        });
    }
    c.next = step.next;
    if (!step.done) { return false; }
    c.done = true;
    walk_ = nullptr;  // every key visited: deltas are right for all of them from now on
    return true;
}

void Shard::endSnapshot(SnapshotCursor& c) noexcept {
    if (!c.started || c.ended) { return; }
    c.ended = true;
    if (walk_ == &c) { walk_ = nullptr; }
}

void Shard::forEachKey(int64_t now, const std::function<bool(std::string_view)>& fn) {
    table_.forEach([&](const Entry& e) { return (e.expireAtMs != 0 && e.expireAtMs <= now) || fn(e.key()); });
}

}  // namespace spindle::kv
