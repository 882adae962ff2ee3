// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The seccomp filter the fallback tests install: io_uring_setup(2) fails with EPERM, as under a
/// container's default profile (Docker's). Shared by tests/core/backend_test.cpp and
/// tests/apps/app_backend_test.cpp.

#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>

#ifndef SYS_io_uring_setup
#define SYS_io_uring_setup 425  // the same number on x86-64 and AArch64 (5.1)
#endif

namespace spindle::testing_support {

/// Makes io_uring_setup fail with EPERM for the calling thread, the threads it starts afterwards and
/// the programs it execs; any other call, and any call of another architecture's ABI, passes.
/// Returns 0 or the errno of the prctl that failed (ENOSYS: no filter for this CPU here; EINVAL from
/// PR_SET_SECCOMP under qemu-user, which cannot filter a foreign architecture's calls).
/// Async-signal-safe, so it may run between fork and exec.
/// Precondition: single-threaded (a forked child): threads that already exist stay unfiltered.
inline int denyIoUringSetupFilter() noexcept {
#if defined(__x86_64__)
    constexpr uint32_t kArch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
    constexpr uint32_t kArch = AUDIT_ARCH_AARCH64;
#else
    return ENOSYS;
#endif
#if defined(__x86_64__) || defined(__aarch64__)
    sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, kArch, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_io_uring_setup, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    sock_fprog program{static_cast<unsigned short>(sizeof filter / sizeof filter[0]), filter};
    // Without CAP_SYS_ADMIN a filter needs no_new_privs, which exec keeps (and set-uid binaries lose).
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) { return errno; }
    if (::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) != 0) { return errno; }
    return 0;
#endif
}

}  // namespace spindle::testing_support
