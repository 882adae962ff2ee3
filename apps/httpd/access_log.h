// SPDX-License-Identifier: Apache-2.0
#pragma once
/// spindle-httpd's access log: one line per answered request in nginx's "combined" format,
///   127.0.0.1 - - [26/Nov/2026:02:57:54 +0000] "GET /a.html HTTP/1.1" 200 1234 "referer" "agent"
/// buffered per carrier (64 KiB each) and written with O_APPEND through the runtime's I/O calls when
/// a buffer fills, by each carrier's idle sweep (so within a second or so) and at shutdown.
///
/// Differences from nginx: the time is UTC ("+0000"), the request line is rebuilt from the parsed
/// method, target and version, and the byte count is the body's length as answered (0 for HEAD and
/// 304), not bytes the kernel took. Quotes, backslashes, control and non-ASCII bytes in the request
/// line, referer and user agent are written as \xHH, as nginx does; an empty field is "-".
/// Errors: open() returns the errno of opening the file. A failed write is counted and its lines
/// are dropped (with one warning per failure run); so is a line that finds its buffer full while an
/// earlier write is still in flight. Neither stops the server.
/// Thread-safety: each carrier appends to and flushes its own buffer only (the carrier index picks
/// it); dropped() and written() from any thread.

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"

namespace spindle::httpd {

/// The longest line written; longer fields are cut to fit (the line still ends in a newline).
inline constexpr size_t kMaxAccessLine = 4096;

/// The fields of one line.
struct AccessEntry {
    std::string_view remote{};     // the client's address ("-" when unknown)
    int64_t unixSeconds = 0;
    std::string_view method{};
    std::string_view target{};
    int versionMinor = 1;
    int status = 0;
    uint64_t bytes = 0;
    std::string_view referer{};
    std::string_view userAgent{};
};

/// Formats `e` as one combined-format line, newline included, into out[0..capacity); returns its
/// length. Precondition: capacity >= 128 (room for everything but the three free-text fields).
[[nodiscard]] size_t formatAccessLine(const AccessEntry& e, char* out, size_t capacity) noexcept;

class AccessLog {
public:
    /// Opens (creates, mode 0644) `path` for appending, with a buffer for each of `carriers`.
    [[nodiscard]] static Result<std::unique_ptr<AccessLog>> open(const std::string& path, unsigned carriers);
    ~AccessLog();
    AccessLog(const AccessLog&) = delete;
    AccessLog& operator=(const AccessLog&) = delete;

    /// Adds a line to carrier `carrier`'s buffer, writing the buffer first when it has no room.
    /// Precondition: on a fiber pinned to `carrier` (the write parks it).
    void append(unsigned carrier, const AccessEntry& e) noexcept;
    /// Writes what carrier `carrier` has buffered. Precondition: as for append().
    void flush(unsigned carrier) noexcept;

    [[nodiscard]] uint64_t dropped() const noexcept;  // lines lost to a full buffer or a failed write
    [[nodiscard]] uint64_t written() const noexcept;  // lines written

private:
    static constexpr size_t kBufferBytes = 64 * 1024;
    struct alignas(64) Buffer {
        std::array<char, kBufferBytes> data;
        size_t length = 0;
        size_t lines = 0;                   // lines in data[0, length)
        bool writing = false;               // a flush is in flight: appends go after it, nobody else writes
        bool failing = false;               // the last write failed (warned once until one succeeds)
        std::atomic<uint64_t> dropped{0};   // written by the owning carrier only
        std::atomic<uint64_t> written{0};
    };
    AccessLog(int fd, unsigned carriers);

    int fd_;
    std::vector<std::unique_ptr<Buffer>> buffers_;
};

}  // namespace spindle::httpd
