// SPDX-License-Identifier: Apache-2.0
#include "apps/httpd/access_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>

#include "base/counter.h"
#include "base/log.h"
#include "core/io.h"

namespace spindle::httpd {
namespace {

constexpr std::array<const char*, 12> kMonths{"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                              "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};

/// A cursor that never writes past its end.
struct Out {
    char* p;
    char* end;
    void put(std::string_view s) noexcept {
        const size_t n = std::min(s.size(), static_cast<size_t>(end - p));
        if (n == 0) { return; }  // an empty view may have no data() at all (memcpy from null is UB)
        std::memcpy(p, s.data(), n);
        p += n;
    }
    void put(char c) noexcept {
        if (p < end) { *p++ = c; }
    }
    void decimal(uint64_t v) noexcept {
        char digits[20];
        size_t n = 0;
        do {
            digits[n++] = static_cast<char>('0' + v % 10);
            v /= 10;
        } while (v != 0);
        while (n > 0) { put(digits[--n]); }
    }
    void two(int v) noexcept {
        put(static_cast<char>('0' + v / 10 % 10));
        put(static_cast<char>('0' + v % 10));
    }
    /// Free text, escaped as nginx escapes log variables; "-" when empty.
    void escaped(std::string_view s) noexcept {
        if (s.empty()) {
            put('-');
            return;
        }
        for (char c : s) {
            const auto u = static_cast<unsigned char>(c);
            if (u < 0x20 || u >= 0x7f || c == '"' || c == '\\') {
                if (end - p < 4) { return; }
                put("\\x");
                put("0123456789ABCDEF"[u >> 4]);
                put("0123456789ABCDEF"[u & 0xf]);
            } else {
                put(c);
            }
        }
    }
};

}  // namespace

size_t formatAccessLine(const AccessEntry& e, char* out, size_t capacity) noexcept {
    // The free-text fields share what the fixed part leaves; each gets a share, so that a huge target
    // cannot push the status and the agent out of the line.
    Out o{out, out + capacity - 1};  // the newline always fits
    o.put(e.remote.empty() ? std::string_view("-") : e.remote);
    o.put(" - - [");
    const time_t t = static_cast<time_t>(e.unixSeconds);
    tm parts{};
    ::gmtime_r(&t, &parts);
    o.two(parts.tm_mday);
    o.put('/');
    o.put(kMonths[static_cast<size_t>(parts.tm_mon)]);
    o.put('/');
    o.decimal(static_cast<uint64_t>(parts.tm_year + 1900));
    o.put(':');
    o.two(parts.tm_hour);
    o.put(':');
    o.two(parts.tm_min);
    o.put(':');
    o.two(parts.tm_sec);
    o.put(" +0000] \"");
    const size_t fixedTail = 64;  // status, bytes, quotes and separators
    const size_t share = (static_cast<size_t>(o.end - o.p) - std::min<size_t>(fixedTail, static_cast<size_t>(o.end - o.p))) / 3;
    auto field = [&](auto&& write) {
        char* const limit = o.end;
        o.end = std::min(o.end, o.p + share);
        write();
        o.end = limit;
    };
    field([&] {
        if (e.method.empty() && e.target.empty()) {
            o.put('-');
            return;
        }
        o.escaped(e.method);
        o.put(' ');
        o.escaped(e.target);
        o.put(e.versionMinor == 0 ? " HTTP/1.0" : " HTTP/1.1");
    });
    o.put("\" ");
    o.decimal(static_cast<uint64_t>(e.status));
    o.put(' ');
    o.decimal(e.bytes);
    o.put(" \"");
    field([&] { o.escaped(e.referer); });
    o.put("\" \"");
    field([&] { o.escaped(e.userAgent); });
    o.put('"');
    *o.p++ = '\n';  // the end was kept one short of the capacity for it
    return static_cast<size_t>(o.p - out);
}

AccessLog::AccessLog(int fd, unsigned carriers) : fd_(fd) {
    for (unsigned i = 0; i < carriers; ++i) { buffers_.push_back(std::make_unique<Buffer>()); }
}

AccessLog::~AccessLog() { ::close(fd_); }

Result<std::unique_ptr<AccessLog>> AccessLog::open(const std::string& path, unsigned carriers) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) { return Error{errno}; }
    return std::unique_ptr<AccessLog>(new AccessLog(fd, carriers));
}

void AccessLog::append(unsigned carrier, const AccessEntry& e) noexcept {
    Buffer& b = *buffers_[carrier];
    if (b.data.size() - b.length < kMaxAccessLine) {
        if (b.writing) {  // a write is in flight and the rest is full: this line is lost
            ownerAdd(b.dropped);
            return;
        }
        flush(carrier);
        if (b.data.size() - b.length < kMaxAccessLine) {
            ownerAdd(b.dropped);
            return;
        }
    }
    b.length += formatAccessLine(e, b.data.data() + b.length, kMaxAccessLine);
    ++b.lines;
}

void AccessLog::flush(unsigned carrier) noexcept {
    Buffer& b = *buffers_[carrier];
    if (b.writing || b.length == 0) { return; }
    // Lines appended while the write is in flight go after `length` and stay for the next flush.
    b.writing = true;
    const size_t length = b.length;
    const size_t lines = b.lines;
    size_t done = 0;
    int err = 0;
    while (done < length) {
        const Result<size_t> n = spindle::write(fd_, b.data.data() + done, length - done);
        if (!n || *n == 0) {
            err = n ? EIO : n.errorCode();
            break;
        }
        done += *n;
    }
    if (err != 0) {
        if (!b.failing) { log::warn("spindle-httpd: access log: {}; its lines are dropped", std::strerror(err)); }
        b.failing = true;
        ownerAdd(b.dropped, lines);
    } else {
        b.failing = false;
        ownerAdd(b.written, lines);
    }
    std::memmove(b.data.data(), b.data.data() + length, b.length - length);
    b.length -= length;
    b.lines -= lines;
    b.writing = false;
}

uint64_t AccessLog::dropped() const noexcept {
    uint64_t n = 0;
    for (const auto& b : buffers_) { n += b->dropped.load(std::memory_order_relaxed); }
    return n;
}

uint64_t AccessLog::written() const noexcept {
    uint64_t n = 0;
    for (const auto& b : buffers_) { n += b->written.load(std::memory_order_relaxed); }
    return n;
}

}  // namespace spindle::httpd
