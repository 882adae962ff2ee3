// SPDX-License-Identifier: Apache-2.0
#include "apps/httpd/mime_types.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "apps/httpd/static_path.h"

namespace spindle::httpd {
namespace {

char lower(char c) noexcept { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }
bool isBlank(char c) noexcept { return c == ' ' || c == '\t' || c == '\r'; }

/// Compares a stored (lower-case) extension with one as the request names it.
int compareExtension(std::string_view stored, std::string_view asked) noexcept {
    const size_t n = std::min(stored.size(), asked.size());
    for (size_t i = 0; i < n; ++i) {
        const char a = stored[i];
        const char b = lower(asked[i]);
        if (a != b) { return static_cast<unsigned char>(a) < static_cast<unsigned char>(b) ? -1 : 1; }
    }
    return stored.size() == asked.size() ? 0 : (stored.size() < asked.size() ? -1 : 1);
}

}  // namespace

int MimeTypes::load(const char* path) {
    const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) { return errno; }
    std::string text;
    char chunk[16384];
    for (;;) {
        const ssize_t n = ::read(fd, chunk, sizeof chunk);
        if (n < 0) {
            if (errno == EINTR) { continue; }
            const int err = errno;
            ::close(fd);
            return err;
        }
        if (n == 0) { break; }
        text.append(chunk, static_cast<size_t>(n));
    }
    ::close(fd);
    parse(text);
    return 0;
}

void MimeTypes::parse(std::string_view text) {
    std::vector<std::pair<std::string, std::string>> table;
    while (!text.empty()) {
        const size_t eol = text.find('\n');
        std::string_view line = text.substr(0, eol);
        text.remove_prefix(eol == std::string_view::npos ? text.size() : eol + 1);
        if (const size_t hash = line.find('#'); hash != std::string_view::npos) { line = line.substr(0, hash); }
        auto word = [&line]() {
            while (!line.empty() && isBlank(line.front())) { line.remove_prefix(1); }
            size_t n = 0;
            while (n < line.size() && !isBlank(line[n])) { ++n; }
            const std::string_view w = line.substr(0, n);
            line.remove_prefix(n);
            return w;
        };
        const std::string_view type = word();
        if (type.empty() || type.find('/') == std::string_view::npos) { continue; }
        std::string full(type);
        if (type.starts_with("text/")) { full += "; charset=utf-8"; }
        for (std::string_view ext = word(); !ext.empty(); ext = word()) {
            std::string e(ext);
            std::transform(e.begin(), e.end(), e.begin(), lower);
            table.emplace_back(std::move(e), full);
        }
    }
    // Stable: of two entries for one extension, the first in the file stays.
    std::stable_sort(table.begin(), table.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    table.erase(std::unique(table.begin(), table.end(), [](const auto& a, const auto& b) { return a.first == b.first; }),
                table.end());
    byExtension_ = std::move(table);
}

std::string_view MimeTypes::lookup(std::string_view fileName) const noexcept {
    const size_t slash = fileName.rfind('/');
    const std::string_view base = slash == std::string_view::npos ? fileName : fileName.substr(slash + 1);
    const size_t dot = base.rfind('.');
    if (dot != std::string_view::npos && dot + 1 < base.size()) {
        const std::string_view ext = base.substr(dot + 1);
        const auto it = std::lower_bound(byExtension_.begin(), byExtension_.end(), ext,
                                         [](const auto& entry, std::string_view e) { return compareExtension(entry.first, e) < 0; });
        if (it != byExtension_.end() && compareExtension(it->first, ext) == 0) { return it->second; }
    }
    return contentTypeFor(fileName);  // the built-in table, then application/octet-stream
}

}  // namespace spindle::httpd
