// SPDX-License-Identifier: Apache-2.0
#pragma once
/// How every spindle app reads its command line: CLI11, with the exit statuses the apps document, and
/// the validators their numeric flags share.
///
/// Exit status, the same for every app (README.md, "Flags and exit status"): kExitOk (0) when done, and
/// after --help; kExitFailure (1) when something failed at run time, said on stderr (the runtime or a
/// server did not start, an I/O error, a failed connection); kExitUsage (2) for a bad command line: an
/// unknown flag, a value that is not a number, or a number out of its flag's range. CLI11's own codes
/// (104 for a value that does not convert, 105 out of range, 109 an unknown flag, ...) never reach
/// the shell.

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>

#include "spindle_version.h"  // generated: SPINDLE_VERSION_STRING

namespace spindle::apps {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

/// The --version line of the program run as `argv0`: "spindle-httpd 0.1.0 (git 9dabab9)", the version
/// from CMake and, in a git checkout, `git describe` (cmake/version.cmake).
[[nodiscard]] inline std::string versionLine(const char* argv0) {
    std::string_view name = argv0 != nullptr ? argv0 : "spindle";
    if (const size_t slash = name.rfind('/'); slash != std::string_view::npos) { name.remove_prefix(slash + 1); }
    return std::string(name) + " " + SPINDLE_VERSION_STRING;
}

/// The text --help-all prints: the program's --help, then each subcommand's options under a line of its
/// own, "Subcommand NAME (DESCRIPTION):", which help2man makes a subsection of the man page's OPTIONS.
[[nodiscard]] inline std::string helpAll(CLI::App& app) {
    std::string out = app.help();
    constexpr std::string_view kOptions = "\nOptions:\n";
    for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
        const std::string text = sub->help();
        const size_t at = text.find(kOptions);
        out += "\nSubcommand " + sub->get_name() + " (" + sub->get_description() + "):\n";
        if (at != std::string::npos) { out += text.substr(at + kOptions.size()); }
    }
    return out;
}

/// Parses `argv` into `app` and its subcommands, with --version and --help-all flags added. Returns
/// std::nullopt when the program goes on, else the status for main to return: kExitOk after --help (the
/// help on stdout), --help-all (the help of the program and of every subcommand, which the man pages are
/// made from: cmake/manpages.cmake) or --version (versionLine() on stdout), kExitUsage after a bad command
/// line (CLI11's message, which names the flag, then "Run with --help for more information.", on stderr).
/// The help's usage line names the program by its file name, not the path it was run by.
[[nodiscard]] inline std::optional<int> parseCommandLine(CLI::App& app, int argc, const char* const* argv) {
    const std::string line = versionLine(argc > 0 ? argv[0] : nullptr);
    if (app.get_name().empty()) { app.name(line.substr(0, line.find(' '))); }
    app.set_version_flag("--version", line, "print the version and exit");
    // Callbacks run before the required options and subcommands are checked: --help-all needs none.
    app.add_flag_callback(
        "--help-all",
        [&app] {
            std::fputs(helpAll(app).c_str(), stdout);
            throw CLI::Success();
        },
        "print the help of every subcommand too, and exit");
    try {
        app.parse(argc, argv);
        return std::nullopt;
    } catch (const CLI::ParseError& e) {
        return app.exit(e) == 0 ? kExitOk : kExitUsage;  // exit() prints the help, or the message
    }
}

/// CLI::Range for a real number (seconds, say) that refuses NaN as well: CLI::Range lets "nan" through,
/// since it compares false with both bounds. --help shows CLI::Range's description, "FLOAT in [min - max]".
[[nodiscard]] inline CLI::Validator realRange(double min, double max) {
    const CLI::Validator range = CLI::Range(min, max);
    return CLI::Validator(
        [range](std::string& text) {
            double value = 0;
            if (CLI::detail::lexical_cast(text, value) && std::isnan(value)) {
                return "Value " + text + " is not a number";
            }
            return range(text);
        },
        range.get_description());
}

/// Refuses a count that is not a power of two (an io_uring provided-buffer ring holds 2^k entries). Goes
/// after a CLI::Range, which refuses what is not a number first.
[[nodiscard]] inline CLI::Validator powerOfTwo() {
    return CLI::Validator(
        [](std::string& text) {
            uint64_t value = 0;
            if (!CLI::detail::lexical_cast(text, value) || value == 0 || (value & (value - 1)) != 0) {
                return "Value " + text + " is not a power of two";
            }
            return std::string();
        },
        "POWER OF TWO");
}

}  // namespace spindle::apps
