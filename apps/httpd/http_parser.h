// SPDX-License-Identifier: Apache-2.0
#pragma once
/// An incremental, zero-copy HTTP/1.1 request-head parser (RFC 9112) for spindle-httpd.
///
/// parseRequest() is fed every byte buffered so far for the next request and answers one of three
/// things: the head is not complete yet (feed it again with more bytes), the request is malformed
/// or over a limit (with the status code to answer before closing), or the head is complete. A
/// complete Request points into the input (method, target, path, query, header names and values
/// are string_views of it: nothing is copied or allocated), and says how many bytes it consumed.
/// The parser keeps no state between calls: the caller re-feeds the growing buffer, so the cost of
/// a head that arrives in k pieces is O(k * head size), bounded by ParserLimits::maxHeaderBytes.
///
/// Bodies: a Content-Length body is framed, not buffered. Request::body is the part of the body
/// that is already in the input and `consumed` covers it; bodyRemaining() bytes of the body are
/// still to be read from the stream by the caller (to use or discard them) before the next
/// request starts.
/// Transfer-Encoding: a body whose last coding is chunked (applied once) is framed by the caller with
/// ChunkedBodySkipper after the head: Request::chunked is set and contentLength is 0 (the server reads
/// and drops such bodies, as nginx does for its static files). Any other transfer coding is 501 Not
/// Implemented, chunked not last or twice is 400, and a request with both Transfer-Encoding and
/// Content-Length is 400 (RFC 9112 §6.3: a smuggling vector). In these cases the connection must be
/// closed, since the body cannot be framed.
/// Strictness: lines end in CRLF (a bare CR or LF is 400); empty lines before the request line
/// are skipped (RFC 9112 §2.2); obsolete line folding, whitespace before a header's colon,
/// control characters in a field value, a non-token method or header name are 400; an HTTP/1.1
/// request needs exactly one Host header (400 otherwise); HTTP/1.x with x > 1 is served as 1.1,
/// any other major version is 505.
/// Errors: ParseStatus::kError with `status` 400 (malformed), 413 (Content-
/// Length over maxBodyBytes), 414 (request line longer than maxHeaderBytes), 431 (head longer
/// than maxHeaderBytes, or more headers than allowed), 501 (other transfer codings), 505 (HTTP
/// major version other than 1).
/// Thread-safety: a pure function of its arguments.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace spindle::httpd {

/// The methods the server tells apart; everything else is kOther (its text is Request::method).
enum class Method : uint8_t { kGet, kHead, kPost, kPut, kDelete, kOptions, kPatch, kTrace, kConnect, kOther };

struct Header {
    std::string_view name;   // as sent (compare case-insensitively: see equalsIgnoreCase)
    std::string_view value;  // without the leading and trailing whitespace
};

struct ParserLimits {
    size_t maxHeaderBytes = 8 * 1024;  // request line + headers + the blank line; more: 431 (414)
    size_t maxHeaders = 100;           // header fields; more: 431 (also capped by the storage given)
    uint64_t maxBodyBytes = 1 << 20;   // Content-Length above this: 413
};

struct Request {
    Method method = Method::kOther;
    std::string_view methodText;  // e.g. "GET"
    std::string_view target;      // the request-target as sent
    std::string_view path;        // the target's path: origin-form up to '?', or the path of an absolute-form
    std::string_view query;       // after '?', without it ("" when none)
    int versionMinor = 1;         // 0 for HTTP/1.0, 1 otherwise
    std::span<const Header> headers;
    std::string_view host;        // the Host header's value ("" when none)
    uint64_t contentLength = 0;   // 0 when the request has no body
    std::string_view body;        // the part of the body present in the input (<= contentLength bytes)
    size_t headLength = 0;        // bytes of the head, skipped empty lines included
    bool keepAlive = true;        // whether the connection stays open after the response
    bool expectContinue = false;  // "Expect: 100-continue" was sent
    bool chunked = false;         // a chunked body follows the head (not consumed: see ChunkedBodySkipper)

    /// Body bytes that the caller must still read from the stream (and use or discard).
    [[nodiscard]] uint64_t bodyRemaining() const noexcept { return contentLength - body.size(); }
    /// The value of the first header named `name` (case-insensitive), or "" when none.
    [[nodiscard]] std::string_view header(std::string_view name) const noexcept;
};

enum class ParseStatus : uint8_t {
    kIncomplete,  // the head is not complete yet: feed more bytes
    kComplete,    // `request` holds a complete head; `consumed` bytes were used
    kError,       // malformed or over a limit: answer `status`, then close the connection
};

struct ParseResult {
    ParseStatus status = ParseStatus::kIncomplete;
    int httpStatus = 0;    // kError: the status code to answer (400, 413, 414, 431, 501, 505)
    size_t consumed = 0;   // kComplete: headLength + body.size(); otherwise 0
};

/// Parses the request head at the start of `input` into `out`, writing its header fields into
/// `storage` (out.headers points there). The effective header-count limit is the smaller of
/// limits.maxHeaders and storage.size().
/// Precondition: `input` and `storage` outlive the use of `out`.
[[nodiscard]] ParseResult parseRequest(std::string_view input, const ParserLimits& limits,
                                       std::span<Header> storage, Request& out) noexcept;

/// ASCII case-insensitive comparison (header names, tokens).
[[nodiscard]] inline bool equalsIgnoreCase(std::string_view a, std::string_view b) noexcept {
    if (a.size() != b.size()) { return false; }
    for (size_t i = 0; i < a.size(); ++i) {
        // Folding bit 5 maps 'A'..'Z' to 'a'..'z', and must be checked to land on a letter: it also
        // maps '@' to '`', '[' to '{' and so on.
        const auto x = static_cast<unsigned char>(a[i]);
        const auto y = static_cast<unsigned char>(b[i]);
        if (x == y) { continue; }
        const auto lx = static_cast<unsigned char>(x | 0x20);
        if (lx != (y | 0x20) || lx < 'a' || lx > 'z') { return false; }
    }
    return true;
}

/// Reads a chunked body (RFC 9112 §7.1) incrementally and drops its data: feed it the bytes that
/// follow the head, as they arrive, until it says kDone (the body, its last chunk and trailer
/// section consumed) or kError. Chunk extensions and trailer fields are skipped.
/// Strictness: chunk sizes are hex digits (at most 16), lines end in CRLF (a bare LF is 400), a
/// chunk's data is followed by CRLF.
/// Errors: kError with errorStatus() 400 (malformed, or a size line, extension or trailer line longer
/// than maxLineBytes) or 413 (more than maxBodyBytes of data in all).
/// Thread-safety: one owner.
class ChunkedBodySkipper {
public:
    enum class Status : uint8_t { kNeedMore, kDone, kError };

    ChunkedBodySkipper(uint64_t maxBodyBytes, size_t maxLineBytes) noexcept
        : maxBody_(maxBodyBytes), maxLine_(maxLineBytes) {}

    /// Consumes a prefix of `input` (*consumed bytes: all of it unless kDone or kError come first).
    [[nodiscard]] Status feed(std::string_view input, size_t* consumed) noexcept;
    [[nodiscard]] int errorStatus() const noexcept { return error_; }
    /// Data bytes seen so far (extensions, sizes and trailers not counted).
    [[nodiscard]] uint64_t bodyBytes() const noexcept { return body_; }

private:
    enum class State : uint8_t { kSize, kExtension, kSizeLf, kData, kDataCr, kDataLf, kTrailerStart, kTrailer, kTrailerLf, kEndLf, kDone };
    Status fail(int status) noexcept;

    uint64_t maxBody_;
    size_t maxLine_;
    State state_ = State::kSize;
    uint64_t chunk_ = 0;   // kSize: the size so far; kData: the bytes left in the chunk
    unsigned digits_ = 0;  // hex digits of the size
    size_t line_ = 0;      // bytes of the current size or trailer line
    uint64_t body_ = 0;
    int error_ = 0;
};

/// The reason phrase of a status code this server sends ("Unknown" for others).
[[nodiscard]] std::string_view reasonPhrase(int status) noexcept;

}  // namespace spindle::httpd
