// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The `--backend auto|io_uring|epoll` flag of every spindle app that starts a runtime
/// (RuntimeOptions::backend), and the other runtime flags the daemons share (--poll-mode's values,
/// --worker-cpus).
///
/// The flag keeps the spelling toString(Backend) and parseBackend() use; "auto" (the default) leaves
/// the choice to Runtime::start, where SPINDLE_BACKEND still applies, and an explicit backend wins
/// over SPINDLE_BACKEND. The runtime's choice is Runtime::backend(), which the apps print.

#include <CLI/CLI.hpp>
#include <sched.h>

#include <string>
#include <utility>
#include <vector>

#include "base/cpu_list.h"
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

/// Adds `--worker-cpus LIST` (RuntimeOptions::workerCpus: where the kernel's io_uring workers and the
/// offload pool run) to `app`, storing the text in `list`; a list parseCpuList (base/cpu_list.h) refuses is refused.
inline CLI::Option* addWorkerCpusFlag(CLI::App& app, std::string& list) {
    return app
        .add_option("--worker-cpus", list,
                    "CPUs (e.g. 2,3 or 2-3) for the helper threads: the kernel's io_uring workers, which run "
                    "buffered file writes and fsync, and the offload pool; none a carrier is bound to; "
                    "default: each carrier's workers share its CPU")
        ->check([](const std::string& v) -> std::string {
            return parseCpuList(v) ? "" : "a CPU list such as 2,3 or 2-3 (each CPU below " +
                                              std::to_string(CPU_SETSIZE) + ")";
        });
}

/// The CPUs a --worker-cpus value spells, as RuntimeOptions::workerCpus wants them; none for "".
[[nodiscard]] inline std::vector<unsigned> workerCpusFromFlag(const std::string& list) {
    if (list.empty()) { return {}; }
    auto cpus = parseCpuList(list);
    return cpus ? std::move(*cpus) : std::vector<unsigned>{};
}

/// What an app adds to "the runtime did not start: <error>": with `--backend io_uring`, that no
/// fallback to epoll was allowed (Runtime::start has logged why io_uring could not be set up); else "".
[[nodiscard]] inline std::string startFailureNote(const std::string& name) {
    return name == "io_uring" ? " (--backend io_uring: no fallback to epoll)" : "";
}

}  // namespace spindle::apps
