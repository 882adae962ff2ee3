// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Reads spindle's log lines back (base/log.h) for the tests that check their shape: one regular
/// expression for the whole line, so a change of format fails here first.

#include <ctime>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace spindle::testing_support {

/// One log line, split into its fields; `time` is empty when SPINDLE_LOG_TIME=0 left it out.
struct LogLine {
    std::string time;    // 2026-11-25T23:37:02.123456Z
    std::string thread;  // c<carrier index> or t<kernel tid>
    std::string level;   // error, warn, info or debug
    std::string text;
};

/// The fields of `line` (without its newline), or nullopt where it is not exactly a log line.
inline std::optional<LogLine> parseLogLine(const std::string& line) {
    static const std::regex kShape(
        R"(^(?:(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z) )?(c\d+|t\d+) spindle\[(error|warn|info|debug)\]: (.*)$)");
    std::smatch m;
    if (!std::regex_match(line, m, kShape)) { return std::nullopt; }
    return LogLine{m[1].str(), m[2].str(), m[3].str(), m[4].str()};
}

/// Seconds since the epoch that a log timestamp names (its microseconds dropped), -1 if out of range.
inline long long logTimeSeconds(const std::string& time) {
    std::tm t{};
    int us = 0;
    if (std::sscanf(time.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d.%6dZ", &t.tm_year, &t.tm_mon, &t.tm_mday, &t.tm_hour,
                    &t.tm_min, &t.tm_sec, &us) != 7) {
        return -1;
    }
    if (t.tm_mon < 1 || t.tm_mon > 12 || t.tm_mday < 1 || t.tm_mday > 31 || t.tm_hour > 23 || t.tm_min > 59 ||
        t.tm_sec > 60) {
        return -1;
    }
    t.tm_year -= 1900;
    t.tm_mon -= 1;
    return static_cast<long long>(::timegm(&t));
}

/// The lines of `text`, each without its newline.
inline std::vector<std::string> splitLines(const std::string& text) {
    std::vector<std::string> lines;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) { lines.push_back(line); }
    return lines;
}

}  // namespace spindle::testing_support
