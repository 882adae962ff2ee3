// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Backend selection: which I/O driver a runtime's carriers use, and why.
///
/// chooseBackend() resolves RuntimeOptions::backend (and SPINDLE_BACKEND) once per Runtime::start.
/// kAuto sets a probe ring up the way a carrier would; if that fails in a way that says io_uring
/// cannot be used at all here (ENOSYS: no io_uring in this kernel or emulator; EPERM/EACCES: a seccomp
/// filter or kernel.io_uring_disabled; ENOMEM: RLIMIT_MEMLOCK too low for the ring without
/// CAP_IPC_LOCK; ENOTSUP: a feature spindle requires is missing, IORING_FEAT_NODROP; EINVAL: set-up
/// parameters refused outright), it picks epoll and says so in one warning naming the errno and the
/// sysctl value or limit involved. Any other error is returned as is.
///
/// probeUring() reports every io_uring feature spindle uses, each probed on this kernel (not inferred
/// from its version), for Runtime::describe() and spindle-tour.
/// Thread-safety: all may be called from any thread. chooseBackend() probes afresh on every call (a
/// seccomp filter or a lowered limit may have arrived since); probeUring() runs once per process and
/// is cached, so a fork()ed child sees its parent's answer.

#include <string>

#include "base/result.h"
#include "core/runtime.h"
#include "uring/ring.h"

namespace spindle::detail {

struct BackendChoice {
    Backend backend = Backend::kUring;  // kUring or kEpoll, never kAuto
    int uringError = 0;                 // why io_uring was not used (0: it was, or epoll was asked for)
    std::string reason;                 // the fallback's one-line reason, or empty
};

/// The backend for `requested`, after SPINDLE_BACKEND when `requested` is kAuto. Logs one line: info
/// naming the backend, or the fallback's warning ("backend: epoll (io_uring unavailable: ...)").
/// Errors: EINVAL for a SPINDLE_BACKEND value that names no backend, or a `requested` out of range
/// (logged); for kUring, the errno of the probe ring's set-up (logged with its reason); for kAuto, a
/// set-up errno for which uringUnusable() is false (logged).
[[nodiscard]] Result<BackendChoice> chooseBackend(Backend requested, const uring::RingOptions& ring) noexcept;

/// Whether `err`, from setting an io_uring up, means io_uring cannot be used in this process at all.
[[nodiscard]] bool uringUnusable(int err) noexcept;

/// What this kernel gives spindle's io_uring driver. setupError != 0: no ring could be set up (and
/// then every feature reads false).
struct UringProbe {
    int setupError = 0;
    bool singleIssuer = false;     // IORING_SETUP_SINGLE_ISSUER (6.0)
    bool deferTaskrun = false;     // IORING_SETUP_DEFER_TASKRUN (6.1)
    bool coopTaskrun = false;      // IORING_SETUP_COOP_TASKRUN (5.19)
    bool msgRing = false;          // IORING_OP_MSG_RING (5.18)
    bool multishotAccept = false;  // IORING_ACCEPT_MULTISHOT (5.19)
    bool multishotRecv = false;    // IORING_RECV_MULTISHOT (6.0)
    bool bufRing = false;          // IORING_REGISTER_PBUF_RING (5.19)
    bool registeredFiles = false;  // sparse registered-file tables (5.19)
    bool registeredBuffers = false;  // one 4 KiB buffer (5.1); false under a tiny RLIMIT_MEMLOCK without CAP_IPC_LOCK
    bool sqpoll = false;           // IORING_SETUP_SQPOLL for this user (5.11 unprivileged)
    bool cancelAny = false;        // IORING_ASYNC_CANCEL_ANY (5.19): res 0 (none matched) with nothing in flight
    /// "io_uring: single_issuer=yes defer_taskrun=yes ..." or "io_uring: unavailable (Operation not permitted)".
    [[nodiscard]] std::string describe() const;
};

/// Whether the kernel sets up a 4-entry ring with setup `flags` (created and destroyed at once).
[[nodiscard]] bool uringSetsUpWith(unsigned flags) noexcept;

/// The probe of this process's kernel (run on first call, then cached; core/driver/uring_probe.cpp).
[[nodiscard]] const UringProbe& probeUring() noexcept;

/// The backend a plain thread's fiber-blocking calls use (core/io.cpp): SPINDLE_BACKEND's, or kAuto's
/// answer (io_uring where the probe could set a ring up), resolved on the first call in the process.
[[nodiscard]] Backend threadBackend() noexcept;

}  // namespace spindle::detail
