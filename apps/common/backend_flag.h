// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The `--backend auto|io_uring|epoll` flag of every spindle app that starts a runtime
/// (RuntimeOptions::backend).
///
/// The flag keeps the spelling toString(Backend) and parseBackend() use; "auto" (the default) leaves
/// the choice to Runtime::start, where SPINDLE_BACKEND still applies, and an explicit backend wins
/// over SPINDLE_BACKEND. The runtime's choice is Runtime::backend(), which the apps print.

#include <CLI/CLI.hpp>
#include <string>

#include "core/runtime.h"

namespace spindle::apps {

/// Adds `--backend` to `app`, storing the spelling in `name`; values other than the three are refused.
inline CLI::Option* addBackendFlag(CLI::App& app, std::string& name) {
    return app
        .add_option("--backend", name,
                    "I/O backend: auto (io_uring where it can be set up, else epoll, with the reason logged), "
                    "io_uring (fail where it cannot be set up) or epoll; with auto, SPINDLE_BACKEND applies too")
        ->check(CLI::IsMember({"auto", "io_uring", "epoll"}))
        ->capture_default_str();
}

/// The backend `name` spells, as RuntimeOptions::backend wants it; kAuto for any other text.
[[nodiscard]] inline Backend backendFromFlag(const std::string& name) noexcept {
    auto backend = parseBackend(name);
    return backend ? *backend : Backend::kAuto;
}

/// The poll mode a --poll-mode value spells (block, spin, hybrid, as the apps' flags check them);
/// kBlock for any other text.
[[nodiscard]] inline PollMode pollModeFromFlag(const std::string& name) noexcept {
    return name == "spin" ? PollMode::kSpin : name == "hybrid" ? PollMode::kHybrid : PollMode::kBlock;
}

/// What an app adds to "the runtime did not start: <error>": with `--backend io_uring`, that no
/// fallback to epoll was allowed (Runtime::start has logged why io_uring could not be set up); else "".
[[nodiscard]] inline std::string startFailureNote(const std::string& name) {
    return name == "io_uring" ? " (--backend io_uring: no fallback to epoll)" : "";
}

}  // namespace spindle::apps
