// SPDX-License-Identifier: Apache-2.0
#pragma once
/// --stats-json FILE, the flag with which a daemon (spindle-httpd, spindle-echo server, spindle-kv) also
/// writes the statistics it prints on stderr when it stops as one JSON object, and the writer behind it.
///
/// The object is built with nlohmann::json (apps/common/json.h), never by hand, so that any string in it
/// (a --root or --dir with quotes, backslashes or control bytes) stays valid JSON.
/// FILE "-" is stdout (the daemons write nothing else there); any other FILE is opened (created or
/// truncated) at start-up, by open(), so that a path that cannot be written stops the daemon before it
/// serves, and written when the daemon stops.
/// Errors: a FILE that cannot be opened or written is said on stderr, and the daemon exits 1 (kExitFailure).

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

#include "apps/common/json.h"

namespace spindle::apps {

struct StatsJsonFlag {
    std::string path;  // "": off; "-": stdout
    CLI::Option* option = nullptr;
    std::FILE* file = nullptr;  // from open() until writeStatsJson()

    StatsJsonFlag() = default;
    StatsJsonFlag(const StatsJsonFlag&) = delete;
    StatsJsonFlag& operator=(const StatsJsonFlag&) = delete;
    ~StatsJsonFlag() {
        if (file != nullptr && file != stdout) { std::fclose(file); }
    }

    void addTo(CLI::App& app) {
        option = app.add_option("--stats-json", path,
                                "when stopping, also write the exit statistics as one JSON object to FILE "
                                "('-': stdout)")
                     ->type_name("FILE");
    }
    /// Whether --stats-json was given.
    [[nodiscard]] bool on() const { return option != nullptr && option->count() > 0; }
    /// Opens FILE for writeStatsJson(), creating or truncating it. Returns true when open (or the flag is
    /// off); false after saying on stderr ("<app>: --stats-json FILE: <reason>") why not.
    [[nodiscard]] bool open(const char* app) {
        if (!on() || file != nullptr) { return true; }
        file = path == "-" ? stdout : std::fopen(path.c_str(), "w");
        if (file == nullptr) {
            std::fprintf(stderr, "%s: --stats-json %s: %s\n", app, path.c_str(), std::strerror(errno));
        }
        return file != nullptr;
    }
};

/// Writes `stats` on one line to the flag's FILE (stdout for "-") and closes it. Returns true when written,
/// or when the flag is off; false after saying on stderr ("<app>: --stats-json FILE: <reason>") why not.
[[nodiscard]] inline bool writeStatsJson(StatsJsonFlag& flag, const Json& stats, const char* app) {
    if (!flag.on()) { return true; }
    if (!flag.open(app)) { return false; }
    const std::string text = stats.dump() + "\n";
    std::FILE* f = std::exchange(flag.file, nullptr);
    bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    int err = ok ? 0 : errno;
    const int rc = f == stdout ? std::fflush(f) : std::fclose(f);
    if (rc != 0 && ok) {
        ok = false;
        err = errno;
    }
    if (!ok) {
        std::fprintf(stderr, "%s: --stats-json %s: %s\n", app, flag.path.c_str(),
                     err != 0 ? std::strerror(err) : "short write");
    }
    return ok;
}

}  // namespace spindle::apps
