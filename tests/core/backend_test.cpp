// SPDX-License-Identifier: Apache-2.0
// Tests for backend selection (core/driver/backend.h, RuntimeOptions::backend): the names, the io_uring
// feature probe, and the fallbacks, each proven in a forked child whose process io_uring has been taken
// from (a seccomp filter, RLIMIT_MEMLOCK without CAP_IPC_LOCK) or whose environment names a backend.
//
// Why fork: a seccomp filter, a lowered limit, a dropped capability and setenv() all outlive the test and
// would change every test after it; a child takes them to its grave. Why not gtest's death tests: plain
// fork() from this single-threaded binary is simpler under the sanitizers. A child reports through a pipe
// (its exit code and a line of text), never through gtest assertions, which would stay in the child.

#include "core/driver/backend.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <liburing.h>  // io_uring_params, for the raw io_uring_setup calls
#include <linux/capability.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/log.h"
#include "core/fiber.h"
#include "core/io.h"
#include "core/runtime.h"
#include "tests/core/deny_io_uring.h"
#include "tests/core/with_runtime.h"

namespace spindle {
namespace {

using namespace std::chrono_literals;
using namespace testing_support;

// ---- helpers ------------------------------------------------------------------------------------------

/// What a forked child reported.
struct ChildReport {
    int status = -1;   // its exit code; 128 + the signal's number when a signal ended it
    std::string text;  // why it failed or skipped (empty when it passed)
};

constexpr int kChildPassed = 0;
constexpr int kChildFailed = 1;
constexpr int kChildSkipped = 77;
constexpr unsigned kChildTimeoutS = 60;  // a hung runtime ends in SIGALRM rather than a hung suite

/// Runs `body(text)` in a forked child, which exits with body's return value after writing `text` to the
/// parent; returns both once the child has exited.
/// Precondition: the calling process is single-threaded (no runtime alive), so the child inherits no lock
/// held by another thread.
template <class Body>
ChildReport inChild(Body&& body) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) { return {-1, std::string("pipe2: ") + std::strerror(errno)}; }
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    if (pid < 0) {
        ::close(fds[0]);
        ::close(fds[1]);
        return {-1, std::string("fork: ") + std::strerror(errno)};
    }
    if (pid == 0) {
        ::close(fds[0]);
        ::alarm(kChildTimeoutS);
        std::string text;
        int code = kChildFailed;
        try {
            code = body(text);
        } catch (const std::exception& e) {
            text += std::string("exception: ") + e.what();
        }
        for (size_t done = 0; done < text.size();) {
            const ssize_t n = ::write(fds[1], text.data() + done, text.size() - done);
            if (n <= 0) { break; }
            done += static_cast<size_t>(n);
        }
        ::_exit(code);  // no atexit handlers, no gtest teardown, no leak check of the parent's objects
    }
    ::close(fds[1]);
    ChildReport report;
    char buf[4096];
    for (;;) {
        const ssize_t n = ::read(fds[0], buf, sizeof(buf));
        if (n > 0) {
            report.text.append(buf, static_cast<size_t>(n));
        } else if (n == 0 || errno != EINTR) {
            break;
        }
    }
    ::close(fds[0]);
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    if (WIFEXITED(status)) {
        report.status = WEXITSTATUS(status);
    } else if (WIFSIGNALED(status)) {
        report.status = 128 + WTERMSIG(status);
        report.text += std::string(" [child killed by signal ") + std::to_string(WTERMSIG(status)) +
                       (WTERMSIG(status) == SIGALRM ? ": timed out]" : "]");
    }
    return report;
}

/// Appends `what` to `text` and returns kChildFailed: `return failed(text, "...")` in a child body.
int failed(std::string& text, const std::string& what) {
    text += what;
    return kChildFailed;
}

/// The start of denyIoUringSetup()'s answer where seccomp filters cannot be installed at all.
constexpr const char* kNoSeccomp = "no seccomp filters here (qemu-user?): ";

/// Makes io_uring_setup(2) fail with EPERM for the calling thread and every thread it starts afterwards,
/// as a container's seccomp profile does. Returns "" or why it could not.
/// Precondition: single-threaded (a forked child): threads that already exist stay unfiltered.
std::string denyIoUringSetup() {
    if (const int err = testing_support::denyIoUringSetupFilter(); err != 0) {
        // qemu-user answers EINVAL: it cannot filter a foreign architecture's system calls.
        return std::string(err == EINVAL ? kNoSeccomp : "installing the filter: ") + std::strerror(err);
    }
    io_uring_params params{};
    const long fd = ::syscall(SYS_io_uring_setup, 1, &params);
    if (fd >= 0) {
        ::close(static_cast<int>(fd));
        return "io_uring_setup still works under the filter";
    }
    if (errno != EPERM) { return std::string("io_uring_setup under the filter: ") + std::strerror(errno); }
    return {};
}

/// Drops CAP_IPC_LOCK from the calling thread (threads it starts later inherit that), so that
/// RLIMIT_MEMLOCK binds even for root. Returns "" or why it could not.
std::string dropIpcLock() {
    __user_cap_header_struct header{};
    header.version = _LINUX_CAPABILITY_VERSION_3;
    __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};
    if (::syscall(SYS_capget, &header, data) != 0) { return std::string("capget: ") + std::strerror(errno); }
    const uint32_t bit = 1u << (CAP_IPC_LOCK % 32);
    data[CAP_IPC_LOCK / 32].effective &= ~bit;
    data[CAP_IPC_LOCK / 32].permitted &= ~bit;
    data[CAP_IPC_LOCK / 32].inheritable &= ~bit;
    if (::syscall(SYS_capset, &header, data) != 0) { return std::string("capset: ") + std::strerror(errno); }
    return {};
}

/// Sets the soft RLIMIT_MEMLOCK to `bytes`, or to the hard limit when that is lower (lowering needs no
/// privilege; raising the hard limit would). Returns the soft limit in force, or -1.
long long lowerMemlock(unsigned long long bytes) {
    rlimit lim{};
    if (::getrlimit(RLIMIT_MEMLOCK, &lim) != 0) { return -1; }
    lim.rlim_cur = lim.rlim_max == RLIM_INFINITY ? bytes : std::min<rlim_t>(bytes, lim.rlim_max);
    if (::setrlimit(RLIMIT_MEMLOCK, &lim) != 0) { return -1; }
    return static_cast<long long>(lim.rlim_cur);
}

/// 0 when a one-entry ring can be set up right now, else the errno (a raw system call, nothing logged).
int rawRingSetup() {
    io_uring_params params{};
    const long fd = ::syscall(SYS_io_uring_setup, 1, &params);
    if (fd < 0) { return errno; }
    ::close(static_cast<int>(fd));
    return 0;
}

/// Runs the fallback tests' fiber workload on `rt`: 100 fibers that each sleep 1 ms and pass a nop through
/// the driver, and a pipe written by one fiber and read by another. Returns "" or what failed.
std::string runWorkload(Runtime& rt) {
    auto main = rt.spawn([]() -> std::string {
        constexpr int kSleepers = 100;
        std::vector<FiberHandle<int>> sleepers;  // each returns 0 or the errno of its first failed call
        sleepers.reserve(kSleepers);
        for (int i = 0; i < kSleepers; ++i) {
            auto h = spindle::spawn([] {
                if (auto r = spindle::sleep(1ms); !r) { return r.errorCode(); }
                if (auto r = spindle::nop(); !r) { return r.errorCode(); }
                return 0;
            });
            if (!h) { return "spawn: " + h.error().message(); }
            sleepers.push_back(std::move(*h));
        }
        std::string failure;
        int pipeFds[2];
        if (::pipe2(pipeFds, O_CLOEXEC) != 0) { return std::string("pipe2: ") + std::strerror(errno); }
        // The writer goes first, so a failed spawn of the reader leaves nobody parked on the pipe.
        auto writer = spindle::spawn([fd = pipeFds[1]] {
            (void)spindle::sleep(2ms);  // lets the reader park on the empty pipe first, most likely
            auto w = spindle::write(fd, "hello", 5);
            return w ? static_cast<int>(*w) : -w.errorCode();
        });
        if (writer) {
            auto reader = spindle::spawn([fd = pipeFds[0]]() -> std::string {
                char buf[16] = {};
                auto r = spindle::read(fd, buf, sizeof(buf));
                return r ? std::string(buf, *r) : "(read failed: " + r.error().message() + ")";
            });
            const int wrote = writer->join();
            if (wrote != 5) { failure = "pipe write returned " + std::to_string(wrote); }
            if (!reader) {
                failure = "spawn of the reader: " + reader.error().message();
            } else if (std::string got = reader->join(); got != "hello" && failure.empty()) {
                failure = "pipe read returned '" + got + "'";
            }
        } else {
            failure = "spawn of the writer: " + writer.error().message();
        }
        ::close(pipeFds[0]);
        ::close(pipeFds[1]);
        for (auto& h : sleepers) {
            if (const int err = h.join(); err != 0 && failure.empty()) {
                failure = std::string("sleep or nop on a fiber: ") + std::strerror(err);
            }
        }
        return failure;
    });
    if (!main) { return "spawn of the main fiber: " + main.error().message(); }
    std::string failure = main->join();
    if (failure.empty() && settledLiveFibers(rt) != 0) { failure = "fibers outlived the workload"; }
    return failure;
}

/// Runtime::start with stderr captured (and log lines from info up shown) into `logged`.
Result<Runtime> startCapturing(const RuntimeOptions& options, std::string& logged) {
    log::setThreshold(log::Level::kInfo);  // only ever called in a child
    testing::internal::CaptureStderr();
    auto rt = Runtime::start(options);
    logged = testing::internal::GetCapturedStderr();
    return rt;
}

/// The lines of `text` that contain `needle`.
std::vector<std::string> linesWith(const std::string& text, std::string_view needle) {
    std::vector<std::string> found;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
        if (line.find(needle) != std::string::npos) { found.push_back(line); }
    }
    return found;
}

/// Options for a runtime of two carriers on `backend`.
RuntimeOptions optionsFor(Backend backend) {
    RuntimeOptions o = withCarriers(2);
    o.backend = backend;
    return o;
}

/// This kernel's version as major * 1000 + minor (6.18 → 6018), or 0 when uname cannot tell.
int kernelVersion() {
    utsname u{};
    int major = 0;
    int minor = 0;
    if (::uname(&u) != 0 || std::sscanf(u.release, "%d.%d", &major, &minor) != 2) { return 0; }
    return major * 1000 + minor;
}

// ---- names ------------------------------------------------------------------------------------------

TEST(BackendName, RoundTripsThroughItsSpelling) {
    for (Backend b : {Backend::kAuto, Backend::kUring, Backend::kEpoll}) {
        auto parsed = parseBackend(toString(b));
        ASSERT_TRUE(parsed) << toString(b);
        EXPECT_EQ(*parsed, b) << toString(b);
    }
    EXPECT_STREQ(toString(Backend::kAuto), "auto");
    EXPECT_STREQ(toString(Backend::kUring), "io_uring");
    EXPECT_STREQ(toString(Backend::kEpoll), "epoll");
}

TEST(BackendName, RejectsAnyOtherText) {
    for (std::string_view bad : {"", "uring", "iouring", "io-uring", "EPOLL", "Auto", " epoll", "epoll ", "epoll\n",
                                 "poll", "select"}) {
        auto parsed = parseBackend(bad);
        ASSERT_FALSE(parsed) << "'" << bad << "' parsed";
        EXPECT_EQ(parsed.errorCode(), EINVAL) << "'" << bad << "'";
    }
}

// ---- the probe and the choice, in this process ------------------------------------------------------------

TEST(UringProbe, FindsEveryFeatureThisKernelVersionHas) {
    const detail::UringProbe& probe = detail::probeUring();
    EXPECT_EQ(&probe, &detail::probeUring()) << "probed once, then cached";
    if (probe.setupError != 0) { GTEST_SKIP() << "io_uring unusable here: " << probe.describe(); }
    const int v = kernelVersion();
    SCOPED_TRACE(probe.describe());
    // Each feature is probed for real; a kernel at least as new as the one that brought it must show it.
    EXPECT_EQ(probe.singleIssuer, v >= 6000);
    EXPECT_EQ(probe.deferTaskrun, v >= 6001);
    EXPECT_EQ(probe.coopTaskrun, v >= 5019);
    EXPECT_EQ(probe.msgRing, v >= 5018);
    EXPECT_EQ(probe.multishotAccept, v >= 5019);
    EXPECT_EQ(probe.multishotRecv, v >= 6000);
    EXPECT_EQ(probe.bufRing, v >= 5019);
    EXPECT_EQ(probe.registeredFiles, v >= 5019);
    EXPECT_EQ(probe.cancelAny, v >= 5019);
    if (v >= 5011) { EXPECT_TRUE(probe.sqpoll) << "unprivileged SQPOLL since 5.11"; }
    // One 4 KiB page: refused only under a tiny RLIMIT_MEMLOCK without CAP_IPC_LOCK.
    rlimit lim{};
    if (::getrlimit(RLIMIT_MEMLOCK, &lim) == 0 && lim.rlim_cur >= (1u << 20)) { EXPECT_TRUE(probe.registeredBuffers); }

    const std::string line = probe.describe();
    EXPECT_EQ(line.rfind("io_uring: single_issuer=", 0), 0u) << line;
    for (const char* name : {"defer_taskrun=", "coop_taskrun=", "msg_ring=", "multishot_accept=", "multishot_recv=",
                             "buf_ring=", "registered_files=", "registered_buffers=", "sqpoll=", "cancel_any="}) {
        EXPECT_NE(line.find(std::string(" ") + name), std::string::npos) << name << " missing from " << line;
    }
    EXPECT_EQ(line.find("=no") == std::string::npos, probe.singleIssuer && probe.deferTaskrun && probe.coopTaskrun &&
                                                          probe.msgRing && probe.multishotAccept &&
                                                          probe.multishotRecv && probe.bufRing &&
                                                          probe.registeredFiles && probe.registeredBuffers &&
                                                          probe.sqpoll && probe.cancelAny);
}

TEST(UringProbe, DescribesAnUnusableRing) {
    detail::UringProbe probe;
    probe.setupError = EPERM;
    EXPECT_EQ(probe.describe(), std::string("io_uring: unavailable (") + std::strerror(EPERM) + ")");
}

TEST(BackendChoice, NamesTheErrnosThatMeanNoIoUringAtAll) {
    for (int err : {ENOSYS, EPERM, EACCES, ENOMEM, ENOTSUP, EOPNOTSUPP, EINVAL}) {
        EXPECT_TRUE(detail::uringUnusable(err)) << std::strerror(err);
    }
    for (int err : {EBADF, EFAULT, EMFILE, ENFILE, EBUSY, EAGAIN, EINTR}) {
        EXPECT_FALSE(detail::uringUnusable(err)) << std::strerror(err);
    }
}

TEST(BackendChoice, AnExplicitBackendWins) {
    uring::RingOptions ring;
    auto epoll = detail::chooseBackend(Backend::kEpoll, ring);
    ASSERT_TRUE(epoll) << epoll.error().message();
    EXPECT_EQ(epoll->backend, Backend::kEpoll);
    EXPECT_EQ(epoll->uringError, 0);
    EXPECT_TRUE(epoll->reason.empty()) << epoll->reason;

    if (const int err = detail::probeUring().setupError; err != 0) {
        GTEST_SKIP() << "io_uring unusable here: " << std::strerror(err);
    }
    auto uring = detail::chooseBackend(Backend::kUring, ring);
    ASSERT_TRUE(uring) << uring.error().message();
    EXPECT_EQ(uring->backend, Backend::kUring);
    EXPECT_TRUE(uring->reason.empty()) << uring->reason;
}

TEST(BackendChoice, AutoDoesNotMistakeRefusedSizesForNoIoUring) {
    if (const int err = detail::probeUring().setupError; err != 0) {
        GTEST_SKIP() << "io_uring unusable here: " << std::strerror(err);
    }
    // 6.x takes at most 65536 CQ entries without IORING_SETUP_CLAMP: EINVAL, though io_uring works here.
    uring::RingOptions ring;
    ring.cqEntries = 1u << 20;
    auto choice = detail::chooseBackend(Backend::kUring, ring);
    if (choice) { GTEST_SKIP() << "this kernel takes a CQ of 2^20 entries"; }
    ASSERT_EQ(choice.errorCode(), EINVAL);
    const ChildReport r = inChild([&ring](std::string& text) {
        ::unsetenv("SPINDLE_BACKEND");
        auto autoChoice = detail::chooseBackend(Backend::kAuto, ring);
        if (autoChoice) { return failed(text, std::string("auto chose ") + toString(autoChoice->backend)); }
        if (autoChoice.errorCode() != EINVAL) { return failed(text, "auto: " + autoChoice.error().message()); }
        return kChildPassed;
    });
    EXPECT_EQ(r.status, kChildPassed) << r.text;
}

/// In a child: installs the filter and returns kChildPassed, or says why in `text` and returns the
/// child's exit code (kChildSkipped where filters cannot be installed at all, kChildFailed otherwise).
int denyOrReport(std::string& text) {
    const std::string why = denyIoUringSetup();
    if (why.empty()) { return kChildPassed; }
    if (why.rfind(kNoSeccomp, 0) == 0) {
        text += why;
        return kChildSkipped;
    }
    return failed(text, "seccomp: " + why);
}

// ---- fallbacks, each in a forked child ------------------------------------------------------------------

TEST(BackendFallback, AutoRunsOnEpollWhenSeccompDeniesIoUring) {
    const ChildReport r = inChild([](std::string& text) {
        ::unsetenv("SPINDLE_BACKEND");
        if (const int code = denyOrReport(text); code != kChildPassed) { return code; }
        std::string logged;
        auto rt = startCapturing(withCarriers(2), logged);
        if (!rt) { return failed(text, "auto must fall back, not fail: " + rt.error().message() + "\n" + logged); }
        if (rt->backend() != Backend::kEpoll) {
            return failed(text, std::string("backend ") + toString(rt->backend()) + ", not epoll");
        }
        // One warning names the backend and the errno; no error line about io_uring's set-up precedes it.
        const auto choice = linesWith(logged, "backend: ");
        const std::string expect = std::string("backend: epoll (io_uring unavailable: ") + std::strerror(EPERM);
        if (choice.size() != 1 || choice[0].find("[warn]") == std::string::npos ||
            choice[0].find(expect) == std::string::npos || choice[0].find("seccomp") == std::string::npos) {
            return failed(text, "expected one warning with '" + expect + "' and 'seccomp'; the log:\n" + logged);
        }
        for (const std::string& line : linesWith(logged, "[error]")) {
            if (line.find("io_uring") != std::string::npos) { return failed(text, "an error was logged:\n" + logged); }
        }
        if (std::string why = runWorkload(*rt); !why.empty()) { return failed(text, "on epoll: " + why); }
        rt->shutdown();
        rt->join();

        // Runtime::run (default options: backend auto) takes the same way.
        auto ran = Runtime::run([] { return spindle::nop().ok() && spindle::sleep(1ms).ok(); });
        if (!ran || !*ran) { return failed(text, "Runtime::run under the filter failed"); }
        return kChildPassed;
    });
    if (r.status == kChildSkipped) { GTEST_SKIP() << r.text; }
    EXPECT_EQ(r.status, kChildPassed) << r.text;
}

TEST(BackendFallback, ExplicitIoUringFailsWithEpermUnderSeccomp) {
    const ChildReport r = inChild([](std::string& text) {
        if (const int code = denyOrReport(text); code != kChildPassed) { return code; }
        std::string logged;
        auto rt = startCapturing(optionsFor(Backend::kUring), logged);
        if (rt) { return failed(text, std::string("start succeeded on ") + toString(rt->backend())); }
        if (rt.errorCode() != EPERM) {
            return failed(text, "start failed with " + rt.error().message() + ", not EPERM");
        }
        const std::string expect = std::string("io_uring set-up failed: ") + std::strerror(EPERM);
        if (linesWith(logged, expect).empty()) { return failed(text, "no '" + expect + "' in the log:\n" + logged); }
        // SPINDLE_BACKEND=io_uring asks for the same thing.
        ::setenv("SPINDLE_BACKEND", "io_uring", 1);
        auto fromEnv = startCapturing(withCarriers(2), logged);
        if (fromEnv || fromEnv.errorCode() != EPERM) {
            return failed(text, "SPINDLE_BACKEND=io_uring did not fail with EPERM");
        }
        return kChildPassed;
    });
    if (r.status == kChildSkipped) { GTEST_SKIP() << r.text; }
    EXPECT_EQ(r.status, kChildPassed) << r.text;
}

// Without CAP_IPC_LOCK, whether io_uring ring memory counts against RLIMIT_MEMLOCK depends on the kernel:
// it did up to 5.11; from 5.12 rings were charged to the memory cgroup instead; kernels that allocate rings
// as io_uring "regions" charge RLIMIT_MEMLOCK again (6.18 does, 8 KiB for the smallest ring). So the child
// asks the kernel first (a raw io_uring_setup under a limit of 0) and checks the runtime against that answer.
// As root, CAP_IPC_LOCK exempts everything: the child drops it first.
TEST(BackendFallback, MemlockOfZeroGivesEpollWhereRingsAreCharged) {
    if (const int err = detail::probeUring().setupError; err != 0) {
        GTEST_SKIP() << "io_uring unusable here: " << std::strerror(err);
    }
    const ChildReport r = inChild([](std::string& text) {
        ::unsetenv("SPINDLE_BACKEND");
        if (std::string why = dropIpcLock(); !why.empty()) { return failed(text, why); }
        if (lowerMemlock(0) != 0) { return failed(text, std::string("setrlimit: ") + std::strerror(errno)); }
        const int raw = rawRingSetup();
        std::string logged;
        auto rt = startCapturing(withCarriers(2), logged);
        if (!rt) { return failed(text, "auto must not fail: " + rt.error().message() + "\n" + logged); }
        if (raw == ENOMEM) {
            // Rings are charged: io_uring cannot be used at all under this limit.
            if (rt->backend() != Backend::kEpoll) { return failed(text, "rings are charged, yet auto chose io_uring"); }
            const auto choice = linesWith(logged, "backend: epoll (io_uring unavailable: ");
            if (choice.size() != 1 || choice[0].find("RLIMIT_MEMLOCK 0 bytes") == std::string::npos) {
                return failed(text, "expected one warning naming 'RLIMIT_MEMLOCK 0 bytes'; the log:\n" + logged);
            }
            auto explicitUring = Runtime::start(optionsFor(Backend::kUring));
            if (explicitUring || explicitUring.errorCode() != ENOMEM) {
                return failed(text, "an explicit io_uring did not fail with ENOMEM");
            }
        } else if (raw == 0) {
            // Rings are not charged (5.12 up to the region allocator): io_uring works.
            if (rt->backend() != Backend::kUring) {
                return failed(text, "rings are not charged, yet auto chose epoll");
            }
        } else {
            return failed(text, std::string("a raw io_uring_setup failed with ") + std::strerror(raw));
        }
        if (std::string why = runWorkload(*rt); !why.empty()) { return failed(text, why); }
        return kChildPassed;
    });
    EXPECT_EQ(r.status, kChildPassed) << r.text;
}

// Fixed buffers are pinned memory charged to RLIMIT_MEMLOCK without CAP_IPC_LOCK on every kernel: with a limit
// that holds the rings but not the buffers, start() succeeds, on io_uring, with the pools unregistered.
TEST(BackendFallback, FixedBuffersFallBackUnderMemlock) {
    if (const int err = detail::probeUring().setupError; err != 0) {
        GTEST_SKIP() << "io_uring unusable here: " << std::strerror(err);
    }
    const ChildReport r = inChild([](std::string& text) {
        if (std::string why = dropIpcLock(); !why.empty()) { return failed(text, why); }
        constexpr unsigned long long kLimit = 2ull << 20;
        const long long limit = lowerMemlock(kLimit);
        if (limit < 0) { return failed(text, std::string("setrlimit: ") + std::strerror(errno)); }
        RuntimeOptions o = optionsFor(Backend::kUring);
        o.fixedBufferCount = 4;
        o.fixedBufferSize = 1u << 20;  // 4 MiB per carrier: more than the limit whatever the rings take
        std::string logged;
        auto rt = startCapturing(o, logged);
        if (!rt && rt.errorCode() == ENOMEM) {
            text = "the rings alone pass RLIMIT_MEMLOCK " + std::to_string(limit) +
                   " here (other processes of this user hold locked memory, or the hard limit is lower)";
            return kChildSkipped;
        }
        if (!rt) { return failed(text, "start: " + rt.error().message() + "\n" + logged); }
        if (rt->backend() != Backend::kUring) { return failed(text, "not on io_uring"); }
        for (const CarrierStats& s : rt->stats()) {
            if (s.fixedBuffersRegistered) {
                return failed(text, "carrier " + std::to_string(s.index) + " registered 4 MiB under a 2 MiB limit");
            }
        }
        if (linesWith(logged, "io_uring_register_buffers").empty()) {
            return failed(text, "the refused registration was not logged:\n" + logged);
        }
        if (std::string why = runWorkload(*rt); !why.empty()) { return failed(text, why); }
        return kChildPassed;
    });
    if (r.status == kChildSkipped) { GTEST_SKIP() << r.text; }
    EXPECT_EQ(r.status, kChildPassed) << r.text;
}

TEST(BackendFallback, SpindleBackendChoosesOrRejects) {
    const ChildReport r = inChild([](std::string& text) {
        std::string logged;
        ::setenv("SPINDLE_BACKEND", "bogus", 1);
        auto bogus = startCapturing(withCarriers(2), logged);
        if (bogus || bogus.errorCode() != EINVAL) {
            return failed(text, "SPINDLE_BACKEND=bogus did not fail with EINVAL");
        }
        if (linesWith(logged, "SPINDLE_BACKEND='bogus'").empty()) {
            return failed(text, "the bad value was not named in the log:\n" + logged);
        }
        // An explicit backend in the options wins over the environment, bad or not.
        auto explicitEpoll = Runtime::start(optionsFor(Backend::kEpoll));
        if (!explicitEpoll || explicitEpoll->backend() != Backend::kEpoll) {
            return failed(text, "RuntimeOptions::backend = kEpoll did not win over SPINDLE_BACKEND=bogus");
        }
        explicitEpoll->shutdown();
        explicitEpoll->join();

        ::setenv("SPINDLE_BACKEND", "epoll", 1);
        auto rt = startCapturing(withCarriers(2), logged);
        if (!rt) { return failed(text, "SPINDLE_BACKEND=epoll: " + rt.error().message()); }
        if (rt->backend() != Backend::kEpoll) { return failed(text, "SPINDLE_BACKEND=epoll did not give epoll"); }
        if (linesWith(logged, "backend: epoll").size() != 1) {
            return failed(text, "expected one line 'backend: epoll'; the log:\n" + logged);
        }
        if (std::string why = runWorkload(*rt); !why.empty()) { return failed(text, "on epoll: " + why); }
        return kChildPassed;
    });
    EXPECT_EQ(r.status, kChildPassed) << r.text;
}

}  // namespace
}  // namespace spindle
