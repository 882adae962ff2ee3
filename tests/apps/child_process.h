// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Runs an app binary as a child of the test, the way a user runs it, and collects its stdout, stderr
/// and exit status. Shared by tests/apps/app_backend_test.cpp and tests/apps/app_flags_test.cpp.
///
/// Why fork and exec: what the child is given (a seccomp filter, a resource limit) stays with it and
/// changes no test after it. Between fork and exec the child makes only system calls (dup2, prctl,
/// setrlimit, execve); everything it needs is built before the fork.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstddef>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "tests/core/deny_io_uring.h"

extern char** environ;

namespace spindle::testing_support {

/// The child's exit status when it could not install the io_uring filter; its stderr then says why.
inline constexpr int kNoFilterExit = 125;
inline constexpr std::string_view kNoFilterTag = "child_process: no seccomp filter: ";
/// The child's exit status when it could not set its resource limit, or exec failed.
inline constexpr int kNoExecExit = 127;

/// The environment of the test process without SPINDLE_BACKEND and SPINDLE_LOG, plus SPINDLE_LOG=warn
/// and `extra` ("NAME=value" entries). Without SPINDLE_BACKEND, --backend auto means the probe,
/// whichever backend the test's ctest entry names.
inline std::vector<std::string> childEnvironment(const std::vector<std::string>& extra = {}) {
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
        const std::string_view entry(*e);
        if (entry.starts_with("SPINDLE_BACKEND=") || entry.starts_with("SPINDLE_LOG=")) { continue; }
        env.emplace_back(entry);
    }
    env.emplace_back("SPINDLE_LOG=warn");
    env.insert(env.end(), extra.begin(), extra.end());
    return env;
}

/// A program started by spawn(): its pid and the read ends of its stdout and stderr, with everything
/// read from them so far.
struct Child {
    using Clock = std::chrono::steady_clock;

    pid_t pid = -1;
    int out = -1;
    int err = -1;
    std::string stdoutText;
    std::string stderrText;
    std::optional<int> status;  // waitpid's status once reaped

    Child() = default;
    Child(const Child&) = delete;
    Child& operator=(const Child&) = delete;
    ~Child() {
        if (pid > 0 && !status) {
            ::kill(pid, SIGKILL);
            int st = 0;
            ::waitpid(pid, &st, 0);
        }
        if (out >= 0) { ::close(out); }
        if (err >= 0) { ::close(err); }
    }

    /// Reads what stdout and stderr have for up to `wait` (less once both are at EOF); true when
    /// `done` is satisfied, checked after every read.
    template <class Done>
    bool readUntil(Done&& done, std::chrono::milliseconds wait) {
        const auto until = Clock::now() + wait;
        while (!done()) {
            pollfd fds[2] = {{out, POLLIN, 0}, {err, POLLIN, 0}};
            const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
            if (left <= std::chrono::milliseconds(0) || (out < 0 && err < 0)) { return false; }
            const int n = ::poll(fds, 2, static_cast<int>(left.count()));
            if (n < 0 && errno != EINTR) { return false; }
            for (int i = 0; i < 2 && n > 0; ++i) {
                if (fds[i].fd < 0 || fds[i].revents == 0) { continue; }
                char buf[4096];
                const ssize_t got = ::read(fds[i].fd, buf, sizeof buf);
                if (got > 0) {
                    (i == 0 ? stdoutText : stderrText).append(buf, static_cast<size_t>(got));
                } else if (got == 0 || errno != EINTR) {
                    ::close(fds[i].fd);
                    (i == 0 ? out : err) = -1;
                }
            }
        }
        return true;
    }

    /// Reads both pipes to EOF and reaps the child, within `wait`; then status holds its status.
    /// Returns false (the child is killed by the destructor) when it does not exit in time.
    bool finish(std::chrono::milliseconds wait) {
        const auto until = Clock::now() + wait;
        readUntil([this] { return out < 0 && err < 0; }, wait);
        while (!status) {
            int st = 0;
            const pid_t r = ::waitpid(pid, &st, WNOHANG);
            if (r == pid) {
                status = st;
            } else if (Clock::now() >= until) {
                return false;
            } else {
                std::this_thread::sleep_for(std::chrono::milliseconds(10));
            }
        }
        return true;
    }

    /// Whether the child exited because it could not install the io_uring filter.
    [[nodiscard]] bool filterMissing() const {
        return status && WIFEXITED(*status) && WEXITSTATUS(*status) == kNoFilterExit &&
               stderrText.find(kNoFilterTag) != std::string::npos;
    }

    /// Whether the child exited with `code`.
    [[nodiscard]] bool exitedWith(int code) const {
        return status && WIFEXITED(*status) && WEXITSTATUS(*status) == code;
    }
};

/// What the child gets besides its arguments and environment.
struct ChildOptions {
    bool denyIoUring = false;  // under denyIoUringSetupFilter(): io_uring_setup fails with EPERM
    rlim_t addressSpace = 0;   // RLIMIT_AS in bytes (a runaway fails to allocate); 0: the test's own
};

/// Starts `argv` with `env` and `options`. Precondition: argv[0] is a path. Fails the test (and leaves
/// pid -1) when fork or a pipe fails.
inline void spawn(Child& child, const std::vector<std::string>& argv, const std::vector<std::string>& env,
                  ChildOptions options = {}) {
    std::vector<char*> args, envp;
    for (const std::string& a : argv) { args.push_back(const_cast<char*>(a.c_str())); }
    args.push_back(nullptr);
    for (const std::string& e : env) { envp.push_back(const_cast<char*>(e.c_str())); }
    envp.push_back(nullptr);
    const rlimit addressSpace{options.addressSpace, options.addressSpace};
    int outPipe[2], errPipe[2];
    ASSERT_EQ(::pipe2(outPipe, O_CLOEXEC), 0) << std::strerror(errno);
    ASSERT_EQ(::pipe2(errPipe, O_CLOEXEC), 0) << std::strerror(errno);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0) << "fork: " << std::strerror(errno);
    if (pid == 0) {
        // dup2 clears O_CLOEXEC on the copies, so 1 and 2 survive the exec and the pipes' ends do not.
        if (::dup2(outPipe[1], STDOUT_FILENO) < 0 || ::dup2(errPipe[1], STDERR_FILENO) < 0) {
            ::_exit(kNoExecExit);
        }
        if (options.denyIoUring) {
            if (const int e = denyIoUringSetupFilter(); e != 0) {
                (void)!::write(STDERR_FILENO, kNoFilterTag.data(), kNoFilterTag.size());
                const char* why = ::strerrordesc_np(e);
                (void)!::write(STDERR_FILENO, why, std::strlen(why));
                ::_exit(kNoFilterExit);
            }
        }
        if (options.addressSpace != 0 && ::setrlimit(RLIMIT_AS, &addressSpace) != 0) { ::_exit(kNoExecExit); }
        ::execve(args[0], args.data(), envp.data());
        ::_exit(kNoExecExit);
    }
    ::close(outPipe[1]);
    ::close(errPipe[1]);
    child.pid = pid;
    child.out = outPipe[0];
    child.err = errPipe[0];
}

/// waitpid's `status` in words: "exit 2", "killed by Killed".
inline std::string describeStatus(int status) {
    if (WIFEXITED(status)) { return "exit " + std::to_string(WEXITSTATUS(status)); }
    if (WIFSIGNALED(status)) { return std::string("killed by ") + ::strsignal(WTERMSIG(status)); }
    return "status " + std::to_string(status);
}

}  // namespace spindle::testing_support
