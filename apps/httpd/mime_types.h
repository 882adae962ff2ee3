// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The Content-Type of a file by its extension, from a mime.types file (Debian's media-types package
/// installs /etc/mime.types) with spindle-httpd's built-in table (contentTypeFor) as the fallback and
/// "application/octet-stream" as the default.
///
/// The file is read once, at start; lookups are a binary search with no allocation. Types under
/// text/ get "; charset=utf-8", as the built-in ones do. An extension listed twice keeps its first type.
/// Thread-safety: load() before sharing; lookups from any thread after.

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace spindle::httpd {

class MimeTypes {
public:
    /// Only the built-in table until load() succeeds.
    MimeTypes() = default;

    /// Replaces the table with the one in `path`: lines of a type and its extensions separated by
    /// blanks, '#' starting a comment; a line without extensions, or with a type lacking a '/', is
    /// skipped. Extensions compare case-insensitively.
    /// Errors: returns 0, or the errno of opening or reading `path` (ENOENT where it is missing);
    /// on an error the table is left as it was.
    [[nodiscard]] int load(const char* path);
    /// Parses mime.types text (as load() does with a file's contents).
    void parse(std::string_view text);

    /// The type for a file name (its extension after the last '.' of its last segment).
    [[nodiscard]] std::string_view lookup(std::string_view fileName) const noexcept;
    /// Extensions in the loaded table.
    [[nodiscard]] size_t size() const noexcept { return byExtension_.size(); }

private:
    // Sorted by extension (lower case), unique.
    std::vector<std::pair<std::string, std::string>> byExtension_;
};

}  // namespace spindle::httpd
