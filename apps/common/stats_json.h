// SPDX-License-Identifier: Apache-2.0
#pragma once
/// --stats-json FILE, the flag with which a daemon (spindle-httpd, spindle-echo server, spindle-kv) also
/// writes the statistics it prints on stderr when it stops as one JSON object, and the writer behind it.
///
/// The object is built with nlohmann::json (apps/common/json.h), never by hand, so that any string in it
/// (a --root or --dir with quotes, backslashes or control bytes) stays valid JSON.
/// FILE "-" is stdout (the daemons write nothing else there); any other FILE is created or truncated
/// when the daemon stops, not when it starts.
/// Errors: a FILE that cannot be written is said on stderr and makes the exit status 1 (kExitFailure).

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "apps/common/json.h"

namespace spindle::apps {

struct StatsJsonFlag {
    std::string path;  // "": off; "-": stdout
    CLI::Option* option = nullptr;

    void addTo(CLI::App& app) {
        option = app.add_option("--stats-json", path,
                                "when stopping, also write the exit statistics as one JSON object to FILE "
                                "('-': stdout)")
                     ->type_name("FILE");
    }
    /// Whether --stats-json was given.
    [[nodiscard]] bool on() const { return option != nullptr && option->count() > 0; }
};

/// Writes `stats` on one line to the flag's FILE (stdout for "-"). Returns true when written, or when the
/// flag is off; false after saying on stderr ("<app>: --stats-json FILE: <reason>") why not.
[[nodiscard]] inline bool writeStatsJson(const StatsJsonFlag& flag, const Json& stats, const char* app) {
    if (!flag.on()) { return true; }
    const std::string text = stats.dump() + "\n";
    const bool toStdout = flag.path == "-";
    std::FILE* f = toStdout ? stdout : std::fopen(flag.path.c_str(), "w");
    bool ok = f != nullptr && std::fwrite(text.data(), 1, text.size(), f) == text.size();
    int err = ok ? 0 : errno;
    if (f != nullptr) {
        const int rc = toStdout ? std::fflush(f) : std::fclose(f);
        if (rc != 0 && ok) {
            ok = false;
            err = errno;
        }
    }
    if (!ok) {
        std::fprintf(stderr, "%s: --stats-json %s: %s\n", app, flag.path.c_str(),
                     err != 0 ? std::strerror(err) : "short write");
    }
    return ok;
}

}  // namespace spindle::apps
