// SPDX-License-Identifier: Apache-2.0
#pragma once
/// SPINDLE_CHECK (every build) and SPINDLE_ASSERT (debug builds only): a failed
/// condition is a bug, so the process prints where and why, then aborts.
///
/// Both are async-signal-safe on the failure path (they use write(2), not stdio),
/// so they may be used inside the scheduler and in signal handlers.

namespace spindle::detail {
[[noreturn]] void checkFailed(const char* expr, const char* file, int line, const char* msg) noexcept;
}  // namespace spindle::detail

#define SPINDLE_CHECK(cond)                                                              \
    do {                                                                                 \
        if (__builtin_expect(!(cond), 0)) {                                              \
            ::spindle::detail::checkFailed(#cond, __FILE__, __LINE__, nullptr);          \
        }                                                                                \
    } while (0)

#define SPINDLE_CHECK_MSG(cond, msg)                                                     \
    do {                                                                                 \
        if (__builtin_expect(!(cond), 0)) {                                              \
            ::spindle::detail::checkFailed(#cond, __FILE__, __LINE__, (msg));            \
        }                                                                                \
    } while (0)

#ifdef NDEBUG
#define SPINDLE_ASSERT(cond) \
    do {                     \
        (void)sizeof(cond);  \
    } while (0)
#else
#define SPINDLE_ASSERT(cond) SPINDLE_CHECK(cond)
#endif
