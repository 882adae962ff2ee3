#pragma once
/// Minimal leveled logging to stderr, formatted with {fmt}.
///
/// The level comes from the SPINDLE_LOG environment variable (error, warn, info,
/// debug; default warn), read once. Logging allocates and may block on stderr:
/// it is for start-up, shutdown and rare events, never for the per-I/O path.

#include <fmt/format.h>

#include <string_view>

namespace spindle::log {

enum class Level : int { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

/// The level in force; reading it is one relaxed load.
Level threshold() noexcept;
/// Overrides the environment (tests and tools use it).
void setThreshold(Level level) noexcept;
/// Writes one line "spindle[level]: text\n" atomically with respect to other log lines.
void write(Level level, std::string_view text) noexcept;

template <class... Args>
void emit(Level level, fmt::format_string<Args...> f, Args&&... args) noexcept {
    if (static_cast<int>(level) > static_cast<int>(threshold())) { return; }
    try {
        write(level, fmt::format(f, std::forward<Args>(args)...));
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
