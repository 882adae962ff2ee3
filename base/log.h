// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Minimal leveled logging to stderr, formatted with {fmt}.
///
/// Each line is one write(2) of
///
///     2026-11-25T23:37:02.123456Z c1 spindle[warn]: text
///
/// a UTC timestamp with microseconds (left out with SPINDLE_LOG_TIME=0), the thread that logged
/// (`c<N>` on carrier N, else `t<tid>`, its kernel thread id), `spindle[level]:`, then the text. The
/// fields before the text hold no spaces, and `spindle[level]:` reads as it always has, so a grep for
/// `spindle\[warn\]` still finds the warnings.
///
/// The level comes from the SPINDLE_LOG environment variable (error, warn, info, debug; default
/// warn), read with SPINDLE_LOG_TIME at the first log call; a value it does not know is said in one
/// warning line. Logging takes a lock and may block on stderr: it is for start-up, shutdown and rare
/// events, never for the per-I/O path. A line up to about 500 bytes is formatted without allocating.

#include <fmt/format.h>

#include <iterator>
#include <string_view>

namespace spindle::log {

enum class Level : int { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

/// The level in force; after the first call, reading it is one relaxed load.
Level threshold() noexcept;
/// Overrides the environment (tests and tools use it).
void setThreshold(Level level) noexcept;
/// Reads SPINDLE_LOG and SPINDLE_LOG_TIME again, as the first log call does, undoing setThreshold;
/// a value it does not know is warned about and the default kept. For tests and tools that change
/// the environment.
void configureFromEnv() noexcept;

/// Names the calling thread `c<carrierIndex>` in the lines it writes; a carrier calls it once its
/// thread is set up. Thread-safety: touches only the calling thread's tag.
void setThreadTag(unsigned carrierIndex) noexcept;
/// Goes back to naming the calling thread `t<tid>`; a carrier calls it as its thread ends.
void clearThreadTag() noexcept;

/// Writes one line (the shape above) with a single write(2), under a lock, so lines written from
/// several threads at once never interleave. Keeps errno. Drops the line if memory runs out.
void write(Level level, std::string_view text) noexcept;

template <class... Args>
void emit(Level level, fmt::format_string<Args...> f, Args&&... args) noexcept {
    if (static_cast<int>(level) > static_cast<int>(threshold())) { return; }
    try {
        fmt::memory_buffer text;  // inline storage: a short message does not allocate
        fmt::format_to(std::back_inserter(text), f, std::forward<Args>(args)...);
        write(level, std::string_view(text.data(), text.size()));
    } catch (...) {
        write(level, "(log message could not be formatted)");
    }
}

template <class... Args>
void error(fmt::format_string<Args...> f, Args&&... args) noexcept { emit(Level::kError, f, std::forward<Args>(args)...); }
template <class... Args>
void warn(fmt::format_string<Args...> f, Args&&... args) noexcept { emit(Level::kWarn, f, std::forward<Args>(args)...); }
template <class... Args>
void info(fmt::format_string<Args...> f, Args&&... args) noexcept { emit(Level::kInfo, f, std::forward<Args>(args)...); }
template <class... Args>
void debug(fmt::format_string<Args...> f, Args&&... args) noexcept { emit(Level::kDebug, f, std::forward<Args>(args)...); }

}  // namespace spindle::log
