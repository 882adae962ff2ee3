// SPDX-License-Identifier: Apache-2.0
#pragma once
/// What a static file's response is, decided from the request's headers and the file's size and
/// modification time: validators (Last-Modified, ETag), conditional requests (RFC 9110 §13) and
/// single byte ranges (RFC 9110 §14). The server opens and reads the file; this only decides.
///
/// The ETag is nginx's: "<mtime in hex>-<size in hex>", strong. Last-Modified is the mtime's second.
/// Range: one byte-range-spec gets 206; a set that no spec of satisfies gets 416 (with
/// "Content-Range: bytes */SIZE"); a set of several ranges gets 200 with the whole file (RFC 9110
/// allows it: a server may ignore Range); a syntactically invalid header or another unit is ignored.
/// Preconditions are evaluated in RFC 9110 §13.2.2's order: If-Match, If-Unmodified-Since,
/// If-None-Match, If-Modified-Since, If-Range. A date that cannot be parsed is ignored, as is an
/// If-Modified-Since later than now (§13.1.3). If-Modified-Since is met by any mtime later than the
/// date (nginx's default, `if_modified_since exact`, wants equality; browsers and curl -z send the
/// Last-Modified they got, so both agree for them).
///
/// Thread-safety: pure functions.

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "apps/httpd/http_parser.h"

namespace spindle::httpd {

/// An IMF-fixdate ("Sun, 06 Nov 1994 08:49:37 GMT") is this long.
inline constexpr size_t kHttpDateLength = 29;

/// Writes the IMF-fixdate of `unixSeconds` (UTC) into out[0..kHttpDateLength). Seconds before
/// 1970 or after 9999 are clamped to those years' ends.
void formatHttpDate(int64_t unixSeconds, char* out) noexcept;

/// Parses an HTTP-date in any of the three forms RFC 9110 §5.6.7 asks recipients to accept
/// (IMF-fixdate, RFC 850's "Sunday, 06-Nov-94 08:49:37 GMT", asctime's "Sun Nov  6 08:49:37 1994").
/// Errors: nullopt for anything else, or an out-of-range field (month 13, hour 24, day 32).
[[nodiscard]] std::optional<int64_t> parseHttpDate(std::string_view text) noexcept;

/// A strong entity tag, quotes included.
struct ETag {
    std::array<char, 36> text{};  // '"' + 16 hex digits + '-' + 16 hex digits + '"'
    uint8_t length = 0;
    [[nodiscard]] std::string_view view() const noexcept { return {text.data(), length}; }
};

/// nginx's ETag for a file: its mtime's seconds and its size in lower-case hex.
[[nodiscard]] ETag makeETag(uint64_t size, int64_t mtimeSeconds) noexcept;

/// Whether the If-Match / If-None-Match value `list` ("*", or entity tags separated by commas)
/// names `etag`; `weak` selects weak comparison (W/ prefixes ignored), otherwise a weak tag in the
/// list never matches. An element that is not an entity tag makes the list match nothing.
[[nodiscard]] bool etagListMatches(std::string_view list, std::string_view etag, bool weak) noexcept;

/// An inclusive byte range [first, last] of a representation.
struct ByteRange {
    uint64_t first = 0;
    uint64_t last = 0;
    [[nodiscard]] uint64_t length() const noexcept { return last - first + 1; }
};

enum class RangeStatus : uint8_t {
    kIgnore,         // no usable Range: send the whole file with 200
    kPartial,        // send `range` with 206
    kUnsatisfiable,  // 416 with "Content-Range: bytes */SIZE"
};

struct RangeResult {
    RangeStatus status = RangeStatus::kIgnore;
    ByteRange range;  // kPartial only
};

/// Interprets a Range header value for a representation of `size` bytes: "bytes=" (case-insensitive)
/// then a comma-separated set of "first-last", "first-" and "-suffix" specs, with optional whitespace.
/// A last past the end is cut to the end; a suffix longer than the file means the whole file.
/// Errors: kIgnore for a value that does not parse (or another unit, or last < first), kUnsatisfiable
/// when no spec overlaps the file (an empty file satisfies none).
[[nodiscard]] RangeResult parseRange(std::string_view value, uint64_t size) noexcept;

/// The file as the validators see it.
struct FileState {
    uint64_t size = 0;
    int64_t mtime = 0;   // seconds since the epoch
    std::string_view etag{};
    int64_t now = 0;     // the server's clock, seconds since the epoch
};

/// What to send for a GET or HEAD of a file.
struct FilePlan {
    int status = 200;      // 200, 206, 304, 412 or 416
    uint64_t offset = 0;   // 200 and 206: the bytes to send (the whole file for 200)
    uint64_t length = 0;
};

/// Decides the response to a GET or HEAD of the file `f` from the request's conditional and Range
/// headers (the class comment gives the rules).
[[nodiscard]] FilePlan planFileResponse(const Request& req, const FileState& f) noexcept;

}  // namespace spindle::httpd
