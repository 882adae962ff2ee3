// SPDX-License-Identifier: Apache-2.0
#include "apps/httpd/static_path.h"

#include <array>
#include <utility>

#include "apps/httpd/http_parser.h"

namespace spindle::httpd {
namespace {

int hexValue(char c) noexcept {
    if (c >= '0' && c <= '9') { return c - '0'; }
    if (c >= 'a' && c <= 'f') { return c - 'a' + 10; }
    if (c >= 'A' && c <= 'F') { return c - 'A' + 10; }
    return -1;
}

}  // namespace

PathStatus resolvePath(std::string_view urlPath, char* out, size_t capacity, size_t* length) noexcept {
    if (urlPath.empty() || urlPath.front() != '/' || capacity == 0) { return PathStatus::kBadRequest; }
    size_t n = 0;
    auto put = [&](char c) {
        if (n + 1 >= capacity) { return false; }
        out[n++] = c;
        return true;
    };
    size_t i = 1;
    bool directory = true;  // whether what was resolved so far names a directory ("/" does)
    for (;;) {
        // One segment: up to the next '/', decoded into out.
        const size_t segStart = n;
        while (i < urlPath.size() && urlPath[i] != '/') {
            char c = urlPath[i];
            if (c == '%') {
                if (i + 2 >= urlPath.size()) { return PathStatus::kBadRequest; }
                const int hi = hexValue(urlPath[i + 1]);
                const int lo = hexValue(urlPath[i + 2]);
                if (hi < 0 || lo < 0) { return PathStatus::kBadRequest; }
                c = static_cast<char>(hi * 16 + lo);
                if (c == '\0' || c == '/') { return PathStatus::kBadRequest; }
                i += 3;
            } else {
                ++i;
            }
            if (!put(c)) { return PathStatus::kTooLong; }
        }
        const std::string_view seg(out + segStart, n - segStart);
        if (seg == "..") { return PathStatus::kBadRequest; }
        if (seg.empty() || seg == ".") {
            n = segStart;  // "a//b" and "a/./b" name "a/b"; "a/" and "a/." name the directory a
            directory = true;
        } else {
            directory = false;
        }
        if (i >= urlPath.size()) { break; }
        ++i;  // the '/'
        if (!directory) {
            if (!put('/')) { return PathStatus::kTooLong; }
            directory = true;
        }
    }
    if (directory) {
        for (char c : std::string_view("index.html")) {
            if (!put(c)) { return PathStatus::kTooLong; }
        }
    }
    out[n] = '\0';
    *length = n;
    return PathStatus::kOk;
}

std::string_view contentTypeFor(std::string_view fileName) noexcept {
    static constexpr std::array<std::pair<std::string_view, std::string_view>, 22> kTypes{{
        {"html", "text/html; charset=utf-8"},
        {"htm", "text/html; charset=utf-8"},
        {"css", "text/css; charset=utf-8"},
        {"js", "text/javascript; charset=utf-8"},
        {"mjs", "text/javascript; charset=utf-8"},
        {"json", "application/json"},
        {"txt", "text/plain; charset=utf-8"},
        {"md", "text/markdown; charset=utf-8"},
        {"xml", "application/xml"},
        {"svg", "image/svg+xml"},
        {"png", "image/png"},
        {"jpg", "image/jpeg"},
        {"jpeg", "image/jpeg"},
        {"gif", "image/gif"},
        {"webp", "image/webp"},
        {"ico", "image/x-icon"},
        {"wasm", "application/wasm"},
        {"pdf", "application/pdf"},
        {"woff", "font/woff"},
        {"woff2", "font/woff2"},
        {"mp4", "video/mp4"},
        {"gz", "application/gzip"},
    }};
    const size_t slash = fileName.rfind('/');
    const std::string_view base = slash == std::string_view::npos ? fileName : fileName.substr(slash + 1);
    const size_t dot = base.rfind('.');
    if (dot != std::string_view::npos && dot + 1 < base.size()) {
        const std::string_view ext = base.substr(dot + 1);
        for (const auto& [e, type] : kTypes) {
            if (equalsIgnoreCase(e, ext)) { return type; }
        }
    }
    return "application/octet-stream";
}

}  // namespace spindle::httpd
