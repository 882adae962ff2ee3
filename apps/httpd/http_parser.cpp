// SPDX-License-Identifier: Apache-2.0
#include "apps/httpd/http_parser.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>

namespace spindle::httpd {
namespace {

// RFC 9110 §5.6.2: tchar = "!" / "#" / "$" / "%" / "&" / "'" / "*" / "+" / "-" / "." / "^" / "_" / "`" / "|" / "~"
// / DIGIT / ALPHA. One table lookup per byte.
constexpr std::array<bool, 256> makeTokenTable() {
    std::array<bool, 256> t{};
    for (int c = '0'; c <= '9'; ++c) { t[static_cast<size_t>(c)] = true; }
    for (int c = 'a'; c <= 'z'; ++c) { t[static_cast<size_t>(c)] = true; }
    for (int c = 'A'; c <= 'Z'; ++c) { t[static_cast<size_t>(c)] = true; }
    for (char c : std::string_view("!#$%&'*+-.^_`|~")) { t[static_cast<unsigned char>(c)] = true; }
    return t;
}
constexpr std::array<bool, 256> kTokenChar = makeTokenTable();

// Field-value characters: HTAB, SP, VCHAR, obs-text (RFC 9110 §5.5). Everything but CTLs and DEL.
constexpr std::array<bool, 256> makeValueTable() {
    std::array<bool, 256> t{};
    t['\t'] = true;
    for (int c = 0x20; c <= 0xff; ++c) { t[static_cast<size_t>(c)] = c != 0x7f; }
    return t;
}
constexpr std::array<bool, 256> kValueChar = makeValueTable();

// Request-target: visible ASCII only (RFC 9112 §3.2 allows nothing else unencoded).
bool isTargetChar(char c) noexcept {
    const auto u = static_cast<unsigned char>(c);
    return u > 0x20 && u < 0x7f;
}

std::string_view trimOws(std::string_view s) noexcept {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) { s.remove_prefix(1); }
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) { s.remove_suffix(1); }
    return s;
}

Method methodOf(std::string_view m) noexcept {
    // Methods are case-sensitive (RFC 9110 §9.1).
    switch (m.size()) {
        case 3:
            if (m == "GET") { return Method::kGet; }
            if (m == "PUT") { return Method::kPut; }
            break;
        case 4:
            if (m == "HEAD") { return Method::kHead; }
            if (m == "POST") { return Method::kPost; }
            break;
        case 5:
            if (m == "PATCH") { return Method::kPatch; }
            if (m == "TRACE") { return Method::kTrace; }
            break;
        case 6:
            if (m == "DELETE") { return Method::kDelete; }
            break;
        case 7:
            if (m == "OPTIONS") { return Method::kOptions; }
            if (m == "CONNECT") { return Method::kConnect; }
            break;
        default:
            break;
    }
    return Method::kOther;
}

ParseResult fail(int status) noexcept { return ParseResult{ParseStatus::kError, status, 0}; }

// Calls fn(token) for each element of a comma-separated list, trimmed; empty elements are skipped.
template <class Fn>
void forEachListElement(std::string_view list, Fn&& fn) noexcept {
    while (!list.empty()) {
        const size_t comma = list.find(',');
        const std::string_view element = trimOws(list.substr(0, comma));
        if (!element.empty()) { fn(element); }
        if (comma == std::string_view::npos) { break; }
        list.remove_prefix(comma + 1);
    }
}

// Splits the target into path and query. Origin-form "/p?q", absolute-form "http://host/p?q",
// asterisk-form "*" and authority-form "host:port" (the latter two: path = target).
void splitTarget(std::string_view target, Request& out) noexcept {
    std::string_view rest = target;
    auto hasScheme = [&](std::string_view scheme) {
        return rest.size() >= scheme.size() && equalsIgnoreCase(rest.substr(0, scheme.size()), scheme);
    };
    if (rest.front() != '/' && (hasScheme("http://") || hasScheme("https://"))) {  // origin-form: the usual case
        const size_t afterScheme = rest.find("://") + 3;
        const size_t pathStart = rest.find_first_of("/?", afterScheme);
        rest = pathStart == std::string_view::npos ? rest.substr(rest.size()) : rest.substr(pathStart);
    }
    const size_t q = rest.find('?');
    if (q == std::string_view::npos) {
        out.path = rest;
        out.query = rest.substr(rest.size());
    } else {
        out.path = rest.substr(0, q);
        out.query = rest.substr(q + 1);
    }
}

// Parses the request line `line` (without CRLF). Returns 0 or the error status.
int parseRequestLine(std::string_view line, Request& out) noexcept {
    // One pass over each part: the method runs up to the first byte that is not a tchar, which must
    // be the first space; the target up to the first byte that is not visible ASCII, the second space.
    size_t sp1 = 0;
    while (sp1 < line.size() && kTokenChar[static_cast<unsigned char>(line[sp1])]) { ++sp1; }
    if (sp1 == 0 || sp1 == line.size() || line[sp1] != ' ') { return 400; }
    const std::string_view method = line.substr(0, sp1);
    size_t sp2 = sp1 + 1;
    while (sp2 < line.size() && isTargetChar(line[sp2])) { ++sp2; }
    if (sp2 == line.size() || line[sp2] != ' ') { return 400; }
    const std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
    if (target.empty()) { return 400; }
    const std::string_view version = line.substr(sp2 + 1);
    if (version.size() != 8 || version.substr(0, 5) != "HTTP/" || version[6] != '.') { return 400; }
    const char major = version[5];
    const char minor = version[7];
    if (major < '0' || major > '9' || minor < '0' || minor > '9') { return 400; }
    if (major != '1') { return 505; }
    out.methodText = method;
    out.method = methodOf(method);
    out.target = target;
    out.versionMinor = minor == '0' ? 0 : 1;  // HTTP/1.x, x > 1: served as the highest we speak
    splitTarget(target, out);
    return 0;
}

// A request line not finished yet: reject it early when what is there already cannot start one.
int checkPartialRequestLine(std::string_view partial) noexcept {
    for (char c : partial) {
        if (c == ' ') { return 0; }
        if (!kTokenChar[static_cast<unsigned char>(c)]) { return 400; }
    }
    return 0;
}

}  // namespace

std::string_view Request::header(std::string_view name) const noexcept {
    for (const Header& h : headers) {
        if (equalsIgnoreCase(h.name, name)) { return h.value; }
    }
    return {};
}

ParseResult parseRequest(std::string_view input, const ParserLimits& limits, std::span<Header> storage,
                         Request& out) noexcept {
    // In place: `out = Request{}` zeroed a temporary with `rep stos` and copied it over, and reading
    // the temporary back waited for those stores (no store forwarding from a string store): a third of
    // the parse of a small GET.
    std::construct_at(&out);
    // Only the first maxHeaderBytes bytes may hold the head; past them, an unfinished head is an error.
    const std::string_view window = input.substr(0, std::min(input.size(), limits.maxHeaderBytes));
    const bool windowFull = input.size() >= limits.maxHeaderBytes;
    const size_t maxHeaders = std::min(limits.maxHeaders, storage.size());

    // Empty lines before the request line are skipped (RFC 9112 §2.2).
    size_t pos = 0;
    while (pos < window.size() && (window[pos] == '\r' || window[pos] == '\n')) {
        if (window[pos] == '\n') { return fail(400); }  // bare LF
        if (pos + 1 == window.size()) { return windowFull ? fail(414) : ParseResult{}; }  // CR, LF not here yet
        if (window[pos + 1] != '\n') { return fail(400); }
        pos += 2;
    }

    // Finds the LF that ends the line starting at `from`; npos when it is not in the window.
    // Sets `bad` when the LF has no CR before it.
    auto lineEnd = [&](size_t from, bool& bad) -> size_t {
        if (from >= window.size()) { return std::string_view::npos; }
        const void* lf = std::memchr(window.data() + from, '\n', window.size() - from);
        if (lf == nullptr) { return std::string_view::npos; }
        const size_t at = static_cast<size_t>(static_cast<const char*>(lf) - window.data());
        bad = at == from || window[at - 1] != '\r';
        return at;
    };

    bool bad = false;
    size_t lf = lineEnd(pos, bad);
    if (lf == std::string_view::npos) {
        if (const int status = checkPartialRequestLine(window.substr(pos)); status != 0) { return fail(status); }
        return windowFull ? fail(414) : ParseResult{};
    }
    if (bad) { return fail(400); }
    if (const int status = parseRequestLine(window.substr(pos, lf - 1 - pos), out); status != 0) {
        return fail(status);
    }
    pos = lf + 1;

    size_t count = 0;
    size_t hosts = 0;
    bool haveLength = false;
    bool haveTransferEncoding = false;
    bool chunked = false;        // the last coding seen is chunked
    unsigned chunkedCount = 0;   // how many times chunked was applied
    bool lengthTooLarge = false;
    bool connectionClose = false;
    bool connectionKeepAlive = false;
    for (;;) {
        lf = lineEnd(pos, bad);
        if (lf == std::string_view::npos) { return windowFull ? fail(431) : ParseResult{}; }
        if (bad) { return fail(400); }
        const std::string_view line = window.substr(pos, lf - 1 - pos);
        pos = lf + 1;
        if (line.empty()) { break; }  // the blank line that ends the head
        if (line.front() == ' ' || line.front() == '\t') { return fail(400); }  // obs-fold
        // The name runs up to the first byte that is not a tchar, which must be the colon (so
        // whitespace before the colon is rejected too).
        size_t colon = 0;
        while (colon < line.size() && kTokenChar[static_cast<unsigned char>(line[colon])]) { ++colon; }
        if (colon == 0 || colon == line.size() || line[colon] != ':') { return fail(400); }
        const std::string_view name = line.substr(0, colon);
        const std::string_view rawValue = line.substr(colon + 1);
        for (char c : rawValue) {
            if (!kValueChar[static_cast<unsigned char>(c)]) { return fail(400); }
        }
        const std::string_view value = trimOws(rawValue);
        if (count == maxHeaders) { return fail(431); }
        storage[count++] = Header{name, value};

        // Dispatch on the length first: most names match none of these, and each length one at most.
        const size_t nameLength = name.size();
        if (nameLength != 4 && nameLength != 6 && nameLength != 10 && nameLength != 14 && nameLength != 17) {
            continue;
        }
        if (equalsIgnoreCase(name, "content-length")) {
            // 1*DIGIT only: no sign, no list (RFC 9112 §6.3 lets us reject "5, 5" as invalid).
            if (value.empty()) { return fail(400); }
            uint64_t n = 0;
            bool overflow = false;
            for (char c : value) {
                if (c < '0' || c > '9') { return fail(400); }
                const auto digit = static_cast<uint64_t>(c - '0');
                if (n > (UINT64_MAX - digit) / 10) {
                    overflow = true;
                } else {
                    n = n * 10 + digit;
                }
            }
            const bool tooLarge = overflow || n > limits.maxBodyBytes;
            if (haveLength && (tooLarge != lengthTooLarge || (!tooLarge && n != out.contentLength))) {
                return fail(400);  // two different lengths
            }
            haveLength = true;
            lengthTooLarge = tooLarge;
            out.contentLength = tooLarge ? 0 : n;
        } else if (equalsIgnoreCase(name, "transfer-encoding")) {
            haveTransferEncoding = true;
            forEachListElement(value, [&](std::string_view coding) {
                chunked = equalsIgnoreCase(coding, "chunked");
                chunkedCount += chunked ? 1 : 0;
            });
        } else if (equalsIgnoreCase(name, "connection")) {
            forEachListElement(value, [&](std::string_view option) {
                if (equalsIgnoreCase(option, "close")) { connectionClose = true; }
                if (equalsIgnoreCase(option, "keep-alive")) { connectionKeepAlive = true; }
            });
        } else if (equalsIgnoreCase(name, "host")) {
            ++hosts;
            out.host = value;
        } else if (equalsIgnoreCase(name, "expect")) {
            out.expectContinue = equalsIgnoreCase(value, "100-continue");
        }
    }

    if (haveTransferEncoding) {
        if (haveLength) { return fail(400); }
        // Chunked must be the last coding, applied once (RFC 9112 §6.1); without it the body cannot be framed.
        if (chunkedCount == 0) { return fail(501); }
        if (!chunked || chunkedCount > 1) { return fail(400); }
        out.chunked = true;
    }
    if (lengthTooLarge) { return fail(413); }
    if (out.versionMinor == 1 ? hosts != 1 : hosts > 1) { return fail(400); }

    out.headers = std::span<const Header>(storage.data(), count);
    out.keepAlive = out.versionMinor == 1 ? !connectionClose : (connectionKeepAlive && !connectionClose);
    out.headLength = pos;
    const size_t available = input.size() - pos;
    out.body = input.substr(pos, static_cast<size_t>(std::min<uint64_t>(available, out.contentLength)));
    return ParseResult{ParseStatus::kComplete, 0, pos + out.body.size()};
}

ChunkedBodySkipper::Status ChunkedBodySkipper::fail(int status) noexcept {
    error_ = status;
    state_ = State::kDone;
    return Status::kError;
}

ChunkedBodySkipper::Status ChunkedBodySkipper::feed(std::string_view input, size_t* consumed) noexcept {
    *consumed = 0;
    if (error_ != 0) { return Status::kError; }
    if (state_ == State::kDone) { return Status::kDone; }
    size_t i = 0;
    while (i < input.size()) {
        if (state_ == State::kData) {  // the only state that takes more than a byte at a time
            const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk_, input.size() - i));
            i += n;
            chunk_ -= n;
            body_ += n;
            if (chunk_ == 0) { state_ = State::kDataCr; }
            continue;
        }
        const char c = input[i++];
        const auto u = static_cast<unsigned char>(c);
        const bool lineByte = state_ == State::kSize || state_ == State::kExtension || state_ == State::kTrailer ||
                              state_ == State::kTrailerStart;
        if (lineByte && ++line_ > maxLine_) {
            *consumed = i;
            return fail(400);
        }
        bool ok = true;
        switch (state_) {
            case State::kSize: {
                const int v = c >= '0' && c <= '9' ? c - '0' : (c | 0x20) >= 'a' && (c | 0x20) <= 'f' ? (c | 0x20) - 'a' + 10 : -1;
                if (v >= 0) {
                    ok = digits_++ < 16;
                    chunk_ = chunk_ * 16 + static_cast<uint64_t>(v);
                } else if (c == '\r') {
                    ok = digits_ > 0;
                    state_ = State::kSizeLf;
                } else {
                    ok = digits_ > 0 && (c == ';' || c == ' ' || c == '\t');
                    state_ = State::kExtension;
                }
                break;
            }
            case State::kExtension:
            case State::kTrailer:
                if (c == '\r') {
                    state_ = state_ == State::kExtension ? State::kSizeLf : State::kTrailerLf;
                } else {
                    ok = c == '\t' || (u >= 0x20 && u != 0x7f);
                }
                break;
            case State::kSizeLf:
                ok = c == '\n';
                line_ = 0;
                if (ok && chunk_ == 0) {
                    state_ = State::kTrailerStart;
                } else if (ok) {
                    if (chunk_ > maxBody_ - body_) {
                        *consumed = i;
                        return fail(413);
                    }
                    state_ = State::kData;
                }
                break;
            case State::kDataCr:
                ok = c == '\r';
                state_ = State::kDataLf;
                break;
            case State::kDataLf:
                ok = c == '\n';
                state_ = State::kSize;
                chunk_ = 0;
                digits_ = 0;
                break;
            case State::kTrailerStart:
                if (c == '\r') {
                    state_ = State::kEndLf;
                } else {
                    ok = c == '\t' || (u >= 0x20 && u != 0x7f);
                    state_ = State::kTrailer;
                }
                break;
            case State::kTrailerLf:
                ok = c == '\n';
                state_ = State::kTrailerStart;
                line_ = 0;
                break;
            case State::kEndLf:
                if (c != '\n') { ok = false; break; }
                state_ = State::kDone;
                *consumed = i;
                return Status::kDone;
            case State::kData:
            case State::kDone:
                break;
        }
        if (!ok) {
            *consumed = i;
            return fail(400);
        }
    }
    *consumed = i;
    return Status::kNeedMore;
}

std::string_view reasonPhrase(int status) noexcept {
    switch (status) {
        case 100: return "Continue";
        case 200: return "OK";
        case 204: return "No Content";
        case 206: return "Partial Content";
        case 301: return "Moved Permanently";
        case 304: return "Not Modified";
        case 400: return "Bad Request";
        case 403: return "Forbidden";
        case 404: return "Not Found";
        case 405: return "Method Not Allowed";
        case 408: return "Request Timeout";
        case 411: return "Length Required";
        case 412: return "Precondition Failed";
        case 413: return "Content Too Large";
        case 414: return "URI Too Long";
        case 416: return "Range Not Satisfiable";
        case 431: return "Request Header Fields Too Large";
        case 500: return "Internal Server Error";
        case 501: return "Not Implemented";
        case 503: return "Service Unavailable";
        case 505: return "HTTP Version Not Supported";
        default: return "Unknown";
    }
}

}  // namespace spindle::httpd
