// SPDX-License-Identifier: Apache-2.0
#include "apps/kv/resp.h"

#include <algorithm>
#include <charconv>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

namespace spindle::kv {

namespace {

constexpr int64_t kUnauthMaxMultibulk = 10;
constexpr int64_t kUnauthMaxBulk = 1024 * 1024;

bool isHex(char c) noexcept { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
int hexValue(char c) noexcept {
    if (c >= '0' && c <= '9') { return c - '0'; }
    if (c >= 'a' && c <= 'f') { return c - 'a' + 10; }
    return c - 'A' + 10;
}
bool isSpace(char c) noexcept { return c == ' ' || c == '\n' || c == '\r' || c == '\t' || c == '\v' || c == '\f'; }

// Splits an inline line as Redis's sdssplitargs does; false for unbalanced quotes.
bool splitArgs(std::string_view line, std::vector<std::string>& out) {
    size_t i = 0;
    const size_t n = line.size();
    for (;;) {
        while (i < n && isSpace(line[i])) { ++i; }
        if (i >= n) { return true; }
        std::string cur;
        bool inDouble = false;
        bool inSingle = false;
        for (;;) {
            if (inDouble) {
                if (i >= n) { return false; }
                if (line[i] == '\\' && i + 3 < n && line[i + 1] == 'x' && isHex(line[i + 2]) && isHex(line[i + 3])) {
                    cur.push_back(static_cast<char>(hexValue(line[i + 2]) * 16 + hexValue(line[i + 3])));
                    i += 3;
                } else if (line[i] == '\\' && i + 1 < n) {
                    ++i;
                    char c = line[i];
                    switch (c) {
                        case 'n': c = '\n'; break;
                        case 'r': c = '\r'; break;
                        case 't': c = '\t'; break;
                        case 'b': c = '\b'; break;
                        case 'a': c = '\a'; break;
                        default: break;
                    }
                    cur.push_back(c);
                } else if (line[i] == '"') {
                    // A closing quote must be followed by a space or the end.
                    if (i + 1 < n && !isSpace(line[i + 1])) { return false; }
                    inDouble = false;
                    ++i;
                    break;
                } else {
                    cur.push_back(line[i]);
                }
            } else if (inSingle) {
                if (i >= n) { return false; }
                if (line[i] == '\\' && i + 1 < n && line[i + 1] == '\'') {
                    ++i;
                    cur.push_back('\'');
                } else if (line[i] == '\'') {
                    if (i + 1 < n && !isSpace(line[i + 1])) { return false; }
                    inSingle = false;
                    ++i;
                    break;
                } else {
                    cur.push_back(line[i]);
                }
            } else {
                if (i >= n || isSpace(line[i])) { break; }
                if (line[i] == '"') {
                    inDouble = true;
                } else if (line[i] == '\'') {
                    inSingle = true;
                } else {
                    cur.push_back(line[i]);
                }
            }
            ++i;
        }
        out.push_back(std::move(cur));
    }
}

ParseResult error(std::string_view text) { return ParseResult{ParseStatus::kError, 0, text}; }

ParseResult parseInline(std::string_view in, const RespLimits& limits, Request& out) {
    const size_t nl = in.find('\n');
    if (nl == std::string_view::npos) {
        if (in.size() > limits.maxInlineSize) { return error("Protocol error: too big inline request"); }
        return ParseResult{};
    }
    std::string_view line = in.substr(0, nl);
    if (!line.empty() && line.back() == '\r') { line.remove_suffix(1); }
    if (!splitArgs(line, out.owned)) { return error("Protocol error: unbalanced quotes in request"); }
    out.args.reserve(out.owned.size());
    for (const std::string& a : out.owned) { out.args.emplace_back(a); }
    return ParseResult{ParseStatus::kCommand, nl + 1, {}};
}

// Reads "<prefix><number>\r" at in[pos] (Redis looks for the '\r' and skips two bytes). Returns false
// with `incomplete` when the line is not all there yet.
bool countLine(std::string_view in, size_t pos, int64_t& value, size_t& next, bool& incomplete, bool& tooBig,
               bool& bad, size_t maxInline) {
    incomplete = tooBig = bad = false;
    const size_t cr = in.find('\r', pos);
    if (cr == std::string_view::npos) {
        if (in.size() - pos > maxInline) { tooBig = true; }
        incomplete = true;
        return false;
    }
    if (cr + 1 >= in.size()) {  // the '\n' is not there yet
        incomplete = true;
        return false;
    }
    if (!parseInt64(in.substr(pos + 1, cr - pos - 1), value)) {
        bad = true;
        return false;
    }
    next = cr + 2;
    return true;
}

}  // namespace

namespace {

ParseResult parseAny(std::string_view in, const RespLimits& limits, Request& out, bool authRequired) {
    if (in.empty()) { return ParseResult{}; }
    if (in[0] != '*') { return parseInline(in, limits, out); }
    int64_t count = 0;
    size_t pos = 0;
    bool incomplete = false, tooBig = false, bad = false;
    if (!countLine(in, 0, count, pos, incomplete, tooBig, bad, limits.maxInlineSize)) {
        if (tooBig) { return error("Protocol error: too big mbulk count string"); }
        if (bad) { return error("Protocol error: invalid multibulk length"); }
        return ParseResult{};
    }
    if (count > limits.maxMultibulkLength) { return error("Protocol error: invalid multibulk length"); }
    if (count > kUnauthMaxMultibulk && authRequired) { return error("Protocol error: unauthenticated multibulk length"); }
    if (count <= 0) { return ParseResult{ParseStatus::kCommand, pos, {}}; }
    out.args.reserve(static_cast<size_t>(std::min<int64_t>(count, 1024)));
    for (int64_t i = 0; i < count; ++i) {
        if (pos >= in.size()) { return ParseResult{}; }
        if (in[pos] != '$') {
            // Redis: "expected '$', got '%c'", the byte as it is.
            static thread_local char text[] = "Protocol error: expected '$', got ' '";
            text[sizeof text - 3] = in[pos];
            return error(std::string_view(text, sizeof text - 1));
        }
        int64_t len = 0;
        size_t dataAt = 0;
        if (!countLine(in, pos, len, dataAt, incomplete, tooBig, bad, limits.maxInlineSize)) {
            if (tooBig) { return error("Protocol error: too big bulk count string"); }
            if (bad) { return error("Protocol error: invalid bulk length"); }
            return ParseResult{};
        }
        if (len < 0 || len > limits.maxBulkLength) { return error("Protocol error: invalid bulk length"); }
        if (len > kUnauthMaxBulk && authRequired) { return error("Protocol error: unauthenticated bulk length"); }
        const auto ulen = static_cast<size_t>(len);
        // The bulk and the two bytes after it (Redis skips them without looking).
        if (in.size() - dataAt < ulen + 2) { return ParseResult{}; }
        out.args.push_back(in.substr(dataAt, ulen));
        pos = dataAt + ulen + 2;
    }
    return ParseResult{ParseStatus::kCommand, pos, {}};
}

}  // namespace

ParseResult parseRequest(std::string_view in, const RespLimits& limits, Request& out, bool authRequired) {
    out.args.clear();
    out.owned.clear();
    const ParseResult r = parseAny(in, limits, out, authRequired);
    if (r.status != ParseStatus::kCommand) {
        // Nothing half-parsed is left for the caller to mistake for a command.
        out.args.clear();
        out.owned.clear();
    }
    return r;
}

void ReplyWriter::header(char type, int64_t n) {
    // The type, at most 20 characters of an int64_t, CRLF: one append. std::to_chars rather than
    // snprintf, whose format parsing cost a GET's bulk reply about 3 % of the server's CPU (-P 16).
    char buf[1 + 20 + 2];
    buf[0] = type;
    char* end = std::to_chars(buf + 1, buf + 21, n).ptr;  // 20 characters always fit
    *end++ = '\r';
    *end++ = '\n';
    out_.append(buf, static_cast<size_t>(end - buf));
}

void ReplyWriter::simple(std::string_view s) {
    out_.push_back('+');
    out_.append(s);
    out_.append("\r\n");
}

void ReplyWriter::error(std::string_view s) {
    out_.push_back('-');
    // A newline inside would end the reply early: Redis turns them into spaces.
    for (char c : s) { out_.push_back(c == '\r' || c == '\n' ? ' ' : c); }
    out_.append("\r\n");
}

void ReplyWriter::integer(int64_t v) { header(':', v); }

void ReplyWriter::bulk(std::string_view s) {
    header('$', static_cast<int64_t>(s.size()));
    out_.append(s);
    out_.append("\r\n");
}

void ReplyWriter::null() {
    if (protocol_ >= 3) {
        out_.append("_\r\n");
    } else {
        out_.append("$-1\r\n");
    }
}

void ReplyWriter::nullArray() {
    if (protocol_ >= 3) {
        out_.append("_\r\n");
    } else {
        out_.append("*-1\r\n");
    }
}

void ReplyWriter::arrayHeader(size_t n) { header('*', static_cast<int64_t>(n)); }

void ReplyWriter::mapHeader(size_t n) {
    if (protocol_ >= 3) {
        header('%', static_cast<int64_t>(n));
    } else {
        header('*', static_cast<int64_t>(2 * n));
    }
}

void ReplyWriter::setHeader(size_t n) { header(protocol_ >= 3 ? '~' : '*', static_cast<int64_t>(n)); }

void ReplyWriter::doubleValue(std::string_view formatted) {
    if (protocol_ >= 3) {
        out_.push_back(',');
        out_.append(formatted);
        out_.append("\r\n");
    } else {
        bulk(formatted);
    }
}

std::string unknownCommandError(const std::vector<std::string_view>& args) {
    // As C's "%.*s" would print them: up to the first NUL.
    auto cstr = [](std::string_view s) { return s.substr(0, std::min(s.size(), s.find('\0'))); };
    std::string list;
    for (size_t i = 1; i < args.size() && list.size() < 128; ++i) {
        const size_t precision = 128 - list.size();
        list += '\'';
        list += cstr(args[i]).substr(0, precision);
        list += "' ";
    }
    std::string name(cstr(args.empty() ? std::string_view() : args[0]).substr(0, 128));
    return "ERR unknown command '" + name + "', with args beginning with: " + list;
}

bool parseInt64(std::string_view s, int64_t& out) noexcept {
    if (s.empty() || s.size() > 20) { return false; }
    size_t i = 0;
    bool negative = false;
    if (s.size() == 1 && s[0] == '0') {
        out = 0;
        return true;
    }
    if (s[0] == '-') {
        negative = true;
        i = 1;
        if (s.size() == 1) { return false; }
    }
    if (s[i] < '1' || s[i] > '9') { return false; }
    uint64_t v = 0;
    for (; i < s.size(); ++i) {
        if (s[i] < '0' || s[i] > '9') { return false; }
        const uint64_t d = static_cast<uint64_t>(s[i] - '0');
        if (v > (std::numeric_limits<uint64_t>::max() - d) / 10) { return false; }
        v = v * 10 + d;
    }
    if (negative) {
        if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) + 1) { return false; }
        out = v == static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) + 1 ? std::numeric_limits<int64_t>::min()
                                                                                   : -static_cast<int64_t>(v);
    } else {
        if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) { return false; }
        out = static_cast<int64_t>(v);
    }
    return true;
}

bool parseLongDouble(std::string_view s, long double& out) noexcept {
    if (s.empty() || s.size() > 5 * 1024 || isSpace(s[0])) { return false; }
    std::string copy(s);
    char* end = nullptr;
    errno = 0;
    const long double v = std::strtold(copy.c_str(), &end);
    if (end != copy.c_str() + copy.size() || std::isnan(v) || (errno == ERANGE && (v == HUGE_VALL || v == -HUGE_VALL || v == 0))) {
        return false;
    }
    out = v;
    return true;
}

void toLower(std::string_view in, std::string& out) {
    out.resize(in.size());
    for (size_t i = 0; i < in.size(); ++i) {
        const char c = in[i];
        out[i] = (c >= 'A' && c <= 'Z') ? static_cast<char>(c + ('a' - 'A')) : c;
    }
}

}  // namespace spindle::kv
