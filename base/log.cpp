#include "base/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

namespace spindle::log {
namespace {
Level fromEnv() noexcept {
    const char* v = std::getenv("SPINDLE_LOG");
    if (v == nullptr) { return Level::kWarn; }
    if (std::strcmp(v, "error") == 0) { return Level::kError; }
    if (std::strcmp(v, "info") == 0) { return Level::kInfo; }
    if (std::strcmp(v, "debug") == 0) { return Level::kDebug; }
    return Level::kWarn;
}
std::atomic<int>& levelSlot() noexcept {
    static std::atomic<int> slot{static_cast<int>(fromEnv())};
    return slot;
}
constexpr const char* kNames[] = {"error", "warn", "info", "debug"};
}  // namespace

Level threshold() noexcept { return static_cast<Level>(levelSlot().load(std::memory_order_relaxed)); }

void setThreshold(Level level) noexcept { levelSlot().store(static_cast<int>(level), std::memory_order_relaxed); }

void write(Level level, std::string_view text) noexcept {
    static std::mutex mu;
    try {
        std::string line = fmt::format("spindle[{}]: {}\n", kNames[static_cast<int>(level)], text);
        std::lock_guard<std::mutex> g(mu);
        const char* p = line.data();
        size_t n = line.size();
        while (n > 0) {
            ssize_t w = ::write(STDERR_FILENO, p, n);
            if (w <= 0) { return; }
            p += w;
            n -= static_cast<size_t>(w);
        }
    } catch (...) {
        // Out of memory while logging: drop the line rather than throw from noexcept.
    }
}
}  // namespace spindle::log
