// SPDX-License-Identifier: Apache-2.0
#include "base/log.h"

#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <mutex>

namespace spindle::log {
namespace {
constexpr const char* kNames[] = {"error", "warn", "info", "debug"};
constexpr Level kDefaultLevel = Level::kWarn;

// Invariant: kUnread until the environment has been read (or setThreshold ran), then a Level.
constexpr int kUnread = -1;
std::atomic<int> levelSlot{kUnread};
std::atomic<bool> timestampsOn{true};

// The carrier index, or kNoCarrier on any other thread.
constexpr int kNoCarrier = -1;
thread_local int threadCarrier = kNoCarrier;

/// Reads the environment once per process, for whichever of threshold(), setThreshold() or write()
/// comes first; the function-local static makes concurrent first calls wait for the one reading.
void configureOnce() noexcept {
    static const bool done = (configureFromEnv(), true);
    (void)done;
}

/// The Level named by `v`, as an int, or -1 for a name that is none of kNames.
int parseLevel(const char* v) noexcept {
    for (int i = 0; i < static_cast<int>(std::size(kNames)); ++i) {
        if (std::strcmp(v, kNames[i]) == 0) { return i; }
    }
    return -1;
}

/// Appends "YYYY-MM-DDTHH:MM:SS.uuuuuuZ " (UTC) for now.
void appendTimestamp(fmt::memory_buffer& out) {
    timespec ts{};
    ::clock_gettime(CLOCK_REALTIME, &ts);
    tm t{};
    ::gmtime_r(&ts.tv_sec, &t);
    fmt::format_to(std::back_inserter(out), "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z ", t.tm_year + 1900,
                   t.tm_mon + 1, t.tm_mday, t.tm_hour, t.tm_min, t.tm_sec, ts.tv_nsec / 1000);
}

/// Writes [p, p + n) to stderr with one write(2), which the kernel takes whole for a file and for a
/// pipe up to PIPE_BUF; a short write (a longer line into a full pipe, a signal) is finished by more
/// calls, still under the caller's lock, so this process's lines never interleave.
void writeAll(const char* p, size_t n) noexcept {
    while (n > 0) {
        ssize_t w = ::write(STDERR_FILENO, p, n);
        if (w < 0 && errno == EINTR) { continue; }
        if (w <= 0) { return; }
        p += w;
        n -= static_cast<size_t>(w);
    }
}
}  // namespace

Level threshold() noexcept {
    int v = levelSlot.load(std::memory_order_relaxed);
    if (v == kUnread) [[unlikely]] {
        configureOnce();
        v = levelSlot.load(std::memory_order_relaxed);
    }
    return static_cast<Level>(v);
}

void setThreshold(Level level) noexcept {
    if (levelSlot.load(std::memory_order_relaxed) == kUnread) { configureOnce(); }
    levelSlot.store(static_cast<int>(level), std::memory_order_relaxed);
}

void configureFromEnv() noexcept {
    const char* timeEnv = std::getenv("SPINDLE_LOG_TIME");
    const bool timeKnown = timeEnv == nullptr || *timeEnv == '\0' || std::strcmp(timeEnv, "0") == 0 ||
                           std::strcmp(timeEnv, "1") == 0;
    timestampsOn.store(timeEnv == nullptr || std::strcmp(timeEnv, "0") != 0, std::memory_order_relaxed);

    const char* levelEnv = std::getenv("SPINDLE_LOG");
    const bool levelUnset = levelEnv == nullptr || *levelEnv == '\0';
    const int parsed = levelUnset ? static_cast<int>(kDefaultLevel) : parseLevel(levelEnv);
    // Stored before warning, so the warning's own threshold() and write() do not come back here.
    levelSlot.store(parsed < 0 ? static_cast<int>(kDefaultLevel) : parsed, std::memory_order_relaxed);

    if (parsed < 0) { warn("SPINDLE_LOG='{}' is not a level (error, warn, info or debug); using warn", levelEnv); }
    if (!timeKnown) { warn("SPINDLE_LOG_TIME='{}' is not 0 or 1; timestamps stay on", timeEnv); }
}

void setThreadTag(unsigned carrierIndex) noexcept { threadCarrier = static_cast<int>(carrierIndex); }

void clearThreadTag() noexcept { threadCarrier = kNoCarrier; }

void write(Level level, std::string_view text) noexcept {
    static std::mutex mu;
    const int savedErrno = errno;
    if (levelSlot.load(std::memory_order_relaxed) == kUnread) { configureOnce(); }
    try {
        fmt::memory_buffer line;  // formatted outside the lock; inline storage up to 500 bytes
        if (timestampsOn.load(std::memory_order_relaxed)) { appendTimestamp(line); }
        auto out = std::back_inserter(line);
        if (threadCarrier != kNoCarrier) {
            fmt::format_to(out, "c{} ", threadCarrier);
        } else {
            fmt::format_to(out, "t{} ", ::gettid());  // not cached: a forked child has a new tid
        }
        fmt::format_to(out, "spindle[{}]: {}\n", kNames[static_cast<int>(level)], text);
        std::lock_guard<std::mutex> g(mu);
        writeAll(line.data(), line.size());
    } catch (...) {
        // Out of memory while logging: drop the line rather than throw from noexcept.
    }
    errno = savedErrno;
}
}  // namespace spindle::log
