// SPDX-License-Identifier: Apache-2.0
#include "apps/kv/shard.h"

#include <ctime>
#include <utility>

#include "apps/kv/wal.h"

namespace spindle::kv {

namespace {

enum Op : uint8_t { kSet = 1, kDel = 2, kExpireAt = 3, kPersist = 4, kFlush = 5 };

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
};

}  // namespace

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

void Shard::account() noexcept {
    used_.store(usedLocal_, std::memory_order_relaxed);
    keys_.store(map_.size(), std::memory_order_relaxed);
    expires_.store(expiresLocal_, std::memory_order_relaxed);
}

void Shard::record(std::string_view payload) {
    if (log_ != nullptr) { lastSeq_ = log_->append(payload); }
}

void Shard::erase(Map::iterator it) {
    usedLocal_ -= it->first.size() + it->second.value.size() + kEntryOverhead;
    if (it->second.expireAtMs != 0) { --expiresLocal_; }
    map_.erase(it);
    account();
}

Entry* Shard::find(std::string_view key, int64_t now) {
    auto it = map_.find(key);
    if (it == map_.end()) { return nullptr; }
    if (it->second.expireAtMs != 0 && it->second.expireAtMs <= now) {
        erase(it);
        expired_.fetch_add(1, std::memory_order_relaxed);
        return nullptr;
    }
    return &it->second;
}

void Shard::setExpiry(Entry& e, std::string_view key, int64_t atMs) {
    if (e.expireAtMs == 0 && atMs != 0) { ++expiresLocal_; }
    if (e.expireAtMs != 0 && atMs == 0) { --expiresLocal_; }
    e.expireAtMs = atMs;
    if (atMs != 0) { due_.emplace(atMs, std::string(key)); }
}

void Shard::set(std::string_view key, std::string_view value, int64_t expireAtMs) {
    auto it = map_.find(key);
    if (it == map_.end()) {
        it = map_.emplace(std::string(key), Entry{}).first;
        usedLocal_ += key.size() + kEntryOverhead;
    } else {
        usedLocal_ -= it->second.value.size();
    }
    it->second.value.assign(value);
    usedLocal_ += value.size();
    setExpiry(it->second, key, expireAtMs);
    account();
    if (log_ != nullptr) {
        scratch_.clear();
        scratch_.push_back(static_cast<char>(kSet));
        putBytes(scratch_, key);
        putBytes(scratch_, value);
        putI64(scratch_, expireAtMs);
        record(scratch_);
    }
}

bool Shard::del(std::string_view key) {
    auto it = map_.find(key);
    if (it == map_.end()) { return false; }
    erase(it);
    if (log_ != nullptr) {
        scratch_.clear();
        scratch_.push_back(static_cast<char>(kDel));
        putBytes(scratch_, key);
        record(scratch_);
    }
    return true;
}

void Shard::expireAt(std::string_view key, int64_t atMs) {
    auto it = map_.find(key);
    if (it == map_.end()) { return; }
    setExpiry(it->second, key, atMs);
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
    auto it = map_.find(key);
    if (it == map_.end() || it->second.expireAtMs == 0) { return false; }
    setExpiry(it->second, key, 0);
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
    map_.clear();
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
        default: ok = false;
    }
    log_ = log;
    return ok;
}

size_t Shard::activeExpire(int64_t now, size_t budget) {
    size_t removed = 0;
    while (!due_.empty() && due_.top().first <= now && budget > 0) {
        --budget;
        auto it = map_.find(std::string_view(due_.top().second));
        if (it != map_.end() && it->second.expireAtMs == due_.top().first) {
            erase(it);
            expired_.fetch_add(1, std::memory_order_relaxed);
            ++removed;
        }
        due_.pop();
    }
    return removed;
}

void Shard::forEachKey(int64_t now, const std::function<bool(std::string_view)>& fn) {
    for (const auto& [key, entry] : map_) {
        if (entry.expireAtMs != 0 && entry.expireAtMs <= now) { continue; }
        if (!fn(key)) { return; }
    }
}

}  // namespace spindle::kv
