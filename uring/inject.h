#pragma once
/// Fault points: make the next N passes through a named system-call site fail
/// with a chosen errno, so tests can prove every error path returns a clear
/// error and leaks nothing (STYLE: SPINDLE_INJECT).
///
/// The points exist only in builds with SPINDLE_FAULT_INJECTION (every build
/// that has the tests); elsewhere SPINDLE_INJECT expands to nothing. Each point
/// costs one relaxed load when disarmed, and they sit on cold paths only
/// (ring set-up, stack mapping), never on the submit or switch path.
///
/// Thread-safety: arm() and take() may race freely; each armed failure is
/// consumed by exactly one take().

#include <cstdint>

namespace spindle::inject {

enum class Point : uint8_t {
    kRingSetup,  // uring::Ring::init, before io_uring_queue_init_params
    kStackMap,   // core's StackPool::map, before mmap
    kSqpollSetup,  // uring::Ring::init, before setting up a ring with SQPOLL (then it runs without)
    kCount,
};

/// From now on, let `skip` passes through `point` succeed, then fail the next
/// `count` with `err` (a positive errno).
void arm(Point point, int err, uint32_t count = 1, uint32_t skip = 0) noexcept;
/// Cancels whatever is armed at `point`.
void disarm(Point point) noexcept;
/// Consumes one pass: the errno to fail with, or 0 to go ahead.
int take(Point point) noexcept;

}  // namespace spindle::inject

#if defined(SPINDLE_FAULT_INJECTION)
/// Runs `action` (with `injectedErrno` in scope) when the point is armed.
#define SPINDLE_INJECT(point, action)                                                   \
    do {                                                                                \
        if (const int injectedErrno = ::spindle::inject::take(point); injectedErrno != 0) { \
            action                                                                      \
        }                                                                               \
    } while (0)
#else
#define SPINDLE_INJECT(point, action) \
    do {                              \
    } while (0)
#endif
