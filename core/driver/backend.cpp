// SPDX-License-Identifier: Apache-2.0
#include "core/driver/backend.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <liburing.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "base/log.h"

namespace spindle::detail {
namespace {

constexpr const char* kBackendEnv = "SPINDLE_BACKEND";

/// kernel.io_uring_disabled (6.6): 0 on, 1 only for privileged tasks and kernel.io_uring_group, 2 off;
/// -1 where the file is absent (older kernels) or unreadable.
int ioUringDisabledSysctl() noexcept {
    const int fd = ::open("/proc/sys/kernel/io_uring_disabled", O_RDONLY | O_CLOEXEC);
    if (fd < 0) { return -1; }
    char buf[8] = {};
    const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
    ::close(fd);
    if (n <= 0 || buf[0] < '0' || buf[0] > '2') { return -1; }
    return buf[0] - '0';
}

/// "8388608 bytes" or "unlimited": the soft RLIMIT_MEMLOCK.
std::string memlockSoftLimit() {
    rlimit lim{};
    if (::getrlimit(RLIMIT_MEMLOCK, &lim) != 0) { return "unknown"; }
    if (lim.rlim_cur == RLIM_INFINITY) { return "unlimited"; }
    return fmt::format("{} bytes", static_cast<unsigned long long>(lim.rlim_cur));
}

/// The CQ size a carrier's ring asks for, as Ring::init computes it.
unsigned cqEntriesOf(const uring::RingOptions& options) noexcept {
    return options.cqEntries != 0 ? options.cqEntries : std::max(2 * options.entries, 4096u);
}

/// Whether an EINVAL from setting up a carrier's ring is about its sizes (past the kernel's
/// maximum: 32768 SQ and 65536 CQ entries on 6.x without IORING_SETUP_CLAMP) rather than io_uring itself.
bool sizesRefused(int err) noexcept { return err == EINVAL && uringSetsUpWith(0); }

/// What most likely made io_uring set-up fail with `err`, for a log line; empty when nothing is known.
std::string whyFailed(int err, const uring::RingOptions& options) {
    if (err == EPERM || err == EACCES) {
        switch (ioUringDisabledSysctl()) {
            case 2: return "kernel.io_uring_disabled=2 (io_uring is off for every process)";
            case 1: return "kernel.io_uring_disabled=1 (only privileged processes and kernel.io_uring_group)";
            case 0: return "a seccomp filter or a security module (kernel.io_uring_disabled=0)";
            default: return "a seccomp filter or kernel.io_uring_disabled";
        }
    }
    // ENOTSUP and EOPNOTSUPP are one value on Linux; both are tested in case they ever differ.
    if (err == ENOTSUP || err == EOPNOTSUPP) {
        return "the kernel lacks IORING_FEAT_NODROP (5.5), which spindle requires";
    }
    switch (err) {
        case ENOMEM:
            // Without CAP_IPC_LOCK, ring memory counts against RLIMIT_MEMLOCK up to 5.11 and again on kernels
            // whose rings come from io_uring's region allocator (6.18 does: 8 KiB is the least for one entry);
            // 5.12 up to those charged it to the memory cgroup only.
            return fmt::format("RLIMIT_MEMLOCK {} too low for the ring without CAP_IPC_LOCK, or memory short",
                               memlockSoftLimit());
        case ENOSYS: return "no io_uring in this kernel or emulator";
        case EINVAL:
            if (sizesRefused(err)) {
                return fmt::format("this kernel refuses a ring of {} SQ and {} CQ entries, though it sets a small "
                                   "one up",
                                   options.entries, cqEntriesOf(options));
            }
            return "the kernel rejects io_uring set-up outright (io_uring older than 5.5)";
        default: return {};
    }
}

/// "Operation not permitted: a seccomp filter ..." (or the strerror alone).
std::string describeFailure(int err, const uring::RingOptions& options) {
    std::string why = whyFailed(err, options);
    return why.empty() ? std::string(std::strerror(err)) : fmt::format("{}: {}", std::strerror(err), why);
}

/// Sets up and closes a ring of a carrier's size with none of the optional flags, logging nothing.
/// Returns 0, the set-up errno, or ENOTSUP without IORING_FEAT_NODROP.
/// Why: Ring::init logs its own error line; a fallback to epoll should log one warning and nothing else.
int setUpQuietly(const uring::RingOptions& options) noexcept {
    io_uring ring{};
    io_uring_params params{};
    params.flags = IORING_SETUP_CQSIZE;
    params.cq_entries = cqEntriesOf(options);
    const int ret = io_uring_queue_init_params(options.entries, &ring, &params);
    if (ret < 0) { return -ret; }
    const bool nodrop = (params.features & IORING_FEAT_NODROP) != 0;
    io_uring_queue_exit(&ring);
    return nodrop ? 0 : ENOTSUP;
}

/// Sets a ring up exactly as a carrier would (uring::Ring, `options`) and closes it. Returns 0 or the errno.
int probeCarrierRing(const uring::RingOptions& options) noexcept {
    if (const int err = setUpQuietly(options); err != 0) { return err; }
    uring::Ring ring;
    auto r = ring.init(options, [](void*, const io_uring_cqe*) {}, nullptr);
    if (!r) { return r.errorCode(); }
    ring.close();
    return 0;
}

/// SPINDLE_BACKEND's backend, or kAuto's answer from the process's probe; warns once about a bad value.
Backend defaultThreadBackend() noexcept {
    Backend backend = Backend::kAuto;
    if (const char* env = std::getenv(kBackendEnv); env != nullptr && env[0] != '\0') {
        if (auto parsed = parseBackend(env)) {
            backend = *parsed;
        } else {
            log::warn("{}='{}' names no backend (auto, io_uring or epoll); plain threads use auto", kBackendEnv,
                      env);
        }
    }
    if (backend != Backend::kAuto) { return backend; }
    const int err = probeUring().setupError;
    return err != 0 && uringUnusable(err) ? Backend::kEpoll : Backend::kUring;
}

}  // namespace

bool uringUnusable(int err) noexcept {
    return err == ENOSYS || err == EPERM || err == EACCES || err == ENOMEM || err == ENOTSUP || err == EOPNOTSUPP ||
           err == EINVAL;
}

Result<BackendChoice> chooseBackend(Backend requested, const uring::RingOptions& ring) noexcept {
    try {
        const char* askedBy = "RuntimeOptions::backend";
        if (requested == Backend::kAuto) {
            if (const char* env = std::getenv(kBackendEnv); env != nullptr && env[0] != '\0') {
                auto parsed = parseBackend(env);
                if (!parsed) {
                    log::error("{}='{}' names no backend: use auto, io_uring or epoll", kBackendEnv, env);
                    return Error{EINVAL};
                }
                requested = *parsed;
                askedBy = kBackendEnv;
            }
        }
        BackendChoice choice;
        switch (requested) {
            case Backend::kEpoll:
                choice.backend = Backend::kEpoll;
                log::info("backend: epoll (asked for by {})", askedBy);
                return choice;
            case Backend::kUring: {
                if (const int err = probeCarrierRing(ring); err != 0) {
                    log::error("io_uring set-up failed: {} (backend io_uring asked for by {})",
                               describeFailure(err, ring), askedBy);
                    return Error{err};
                }
                choice.backend = Backend::kUring;
                log::info("backend: io_uring (asked for by {})", askedBy);
                return choice;
            }
            case Backend::kAuto: {
                const int err = probeCarrierRing(ring);
                if (err == 0) {
                    choice.backend = Backend::kUring;
                    log::info("backend: io_uring");
                    return choice;
                }
                // Sizes past the kernel's maximum are a configuration error, not a kernel without io_uring.
                if (!uringUnusable(err) || sizesRefused(err)) {
                    log::error("io_uring set-up failed: {} (not a sign that io_uring is unusable here, so no "
                               "fallback to epoll)",
                               describeFailure(err, ring));
                    return Error{err};
                }
                choice.backend = Backend::kEpoll;
                choice.uringError = err;
                choice.reason = fmt::format("io_uring unavailable: {}", describeFailure(err, ring));
                log::warn("backend: epoll ({})", choice.reason);
                return choice;
            }
        }
        log::error("invalid runtime options: backend {} (0 auto, 1 io_uring, 2 epoll)",
                   static_cast<unsigned>(requested));
        return Error{EINVAL};
    } catch (const std::bad_alloc&) {
        return Error{ENOMEM};
    }
}

Backend threadBackend() noexcept {
    static const Backend resolved = defaultThreadBackend();  // resolved once, so a bad value warns once
    return resolved;
}

}  // namespace spindle::detail
