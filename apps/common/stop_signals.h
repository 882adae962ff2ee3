// SPDX-License-Identifier: Apache-2.0
#pragma once
/// SIGINT and SIGTERM for the daemons: blocked in every thread and read from a signalfd by one fiber,
/// which asks the server to stop (its drain then runs on the carriers, never in a signal handler).
///
/// blockStopSignals() must run before Runtime::start, so that every carrier thread inherits the mask
/// and the signals reach the process only through the signalfd. Errors: -1 with a message on stderr
/// naming the app and the failed call (pthread_sigmask, signalfd).
/// watchStopSignals() spawns the fiber; at the first signal it prints "<app>: signal N, <doing>" and
/// calls stop() on its fiber. The fiber returns without calling stop() when the runtime shuts down
/// first (poll fails with ECANCELED). Errors: spawn's (ENOMEM, ECANCELED), in the Result.

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "core/io.h"
#include "core/runtime.h"

namespace spindle::apps {

[[nodiscard]] inline int blockStopSignals(const char* app) noexcept {
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGTERM);
    if (const int e = ::pthread_sigmask(SIG_BLOCK, &signals, nullptr); e != 0) {
        std::fprintf(stderr, "%s: pthread_sigmask: %s\n", app, std::strerror(e));
        return -1;
    }
    const int sfd = ::signalfd(-1, &signals, SFD_NONBLOCK | SFD_CLOEXEC);
    if (sfd < 0) { std::fprintf(stderr, "%s: signalfd: %s\n", app, std::strerror(errno)); }
    return sfd;
}

template <class Stop>
[[nodiscard]] Result<FiberHandle<int>> watchStopSignals(Runtime& rt, int sfd, const char* app, const char* doing,
                                                         Stop stop) {
    return rt.spawn(
        [sfd, app, doing, stop = std::move(stop)]() mutable -> int {
            for (;;) {
                auto ready = spindle::poll(sfd, POLLIN);
                if (!ready) { return 0; }  // the runtime is shutting down
                signalfd_siginfo info{};
                if (::read(sfd, &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
                    std::fprintf(stderr, "%s: signal %u, %s\n", app, info.ssi_signo, doing);
                    stop();
                    return static_cast<int>(info.ssi_signo);
                }
            }
        },
        SpawnOptions{.name = "signals"});
}

}  // namespace spindle::apps
