// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Mapping a request path to a file under the document root: percent-decoding, the refusal of
/// anything that could leave the root, and the Content-Type of a file name.
///
/// Thread-safety: pure functions.

#include <cstddef>
#include <string_view>

namespace spindle::httpd {

enum class PathStatus : unsigned char {
    kOk,          // `out` holds a relative path (no leading '/'), NUL-terminated
    kBadRequest,  // not an origin-form path, a bad %-escape, an encoded NUL or '/', or a ".." segment
    kTooLong,     // the decoded path does not fit `out`
};

/// Decodes `urlPath` (e.g. "/docs/a%20b.html") into a path relative to the root ("docs/a b.html"),
/// NUL-terminated in `out[0..capacity)`; `*length` gets its length. A path ending in '/' (the root
/// included) gets "index.html" appended. Empty segments ("a//b") collapse, "." segments are dropped.
/// Errors: kBadRequest for a path not starting with '/', a malformed %-escape, "%00" or "%2F", and
/// any ".." segment (so no request names a file outside the root: symbolic links inside the root
/// are followed, as they are by most servers); kTooLong when it does not fit.
[[nodiscard]] PathStatus resolvePath(std::string_view urlPath, char* out, size_t capacity, size_t* length) noexcept;

/// The Content-Type for a file name by its extension (case-insensitive); "application/octet-stream"
/// for an unknown one.
[[nodiscard]] std::string_view contentTypeFor(std::string_view fileName) noexcept;

}  // namespace spindle::httpd
