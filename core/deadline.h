// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Deadline: the point on CLOCK_MONOTONIC at which a fiber-blocking call gives up with ETIMEDOUT.
///
/// Every call in core/io.h takes one as its last argument. A default-constructed Deadline never
/// expires. A duration converts implicitly to "that long from now", and a steady_clock time point
/// to "then", so `read(fd, buf, n, 0, 50ms)` reads with a 50 ms limit.
///
/// On the ring a deadline is an IORING_OP_LINK_TIMEOUT linked to the operation: no timer of the
/// carrier's, no extra wake-up, and the operation is cancelled by the kernel when the time comes.
/// The call still returns only after the operation's own completion has arrived; an operation that
/// completed (even partly) before the kernel could cancel it returns its result, not ETIMEDOUT, so
/// no transferred byte is lost.
///
/// A deadline already in the past makes a call return ETIMEDOUT without starting the operation.
/// Cost: 8 bytes; a call with a deadline reads the clock once and submits one more SQE.

#include <chrono>
#include <cstdint>
#include <limits>
#include <ratio>
#include <type_traits>

namespace spindle {

class Deadline {
public:
    /// Never expires.
    constexpr Deadline() noexcept = default;

    /// `timeout` from now; zero or negative: already expired. Saturates instead of overflowing.
    template <class Rep, class Period>
    Deadline(std::chrono::duration<Rep, Period> timeout) noexcept  // NOLINT(google-explicit-constructor)
        : ns_(fromNow(saturatingNs(timeout))) {}

    /// At `when` (steady_clock, which is CLOCK_MONOTONIC).
    template <class Duration>
    Deadline(std::chrono::time_point<std::chrono::steady_clock, Duration> when) noexcept  // NOLINT
        : ns_(fromEpoch(saturatingNs(when.time_since_epoch()))) {}

    [[nodiscard]] static constexpr Deadline never() noexcept { return {}; }

    /// Whether this deadline can expire at all.
    [[nodiscard]] constexpr bool isSet() const noexcept { return ns_ != 0; }
    /// Nanoseconds since the CLOCK_MONOTONIC epoch. Precondition: isSet().
    [[nodiscard]] constexpr uint64_t ns() const noexcept { return ns_; }
    /// Whether it has passed (reads the clock); false when not set.
    [[nodiscard]] bool expired() const noexcept;

private:
    template <class Rep, class Period>
    static int64_t saturatingNs(std::chrono::duration<Rep, Period> d) noexcept {
        using PerTick = std::ratio_divide<Period, std::nano>;  // nanoseconds per tick
        if constexpr (std::is_integral_v<Rep> && std::is_signed_v<Rep> && sizeof(Rep) <= sizeof(int64_t) &&
                      PerTick::den == 1) {
            // Whole nanoseconds per tick (ns, us, ms, s, ...): integer compares. The long double path
            // below costs an x87 control-word switch (fnstcw/fldcw) on every Deadline built from a
            // timeout, a send's for instance.
            constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
            constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
            const auto ticks = static_cast<int64_t>(d.count());
            if (ticks > kMax / PerTick::num) { return kMax; }
            if (ticks < kMin / PerTick::num) { return kMin; }
            return ticks * static_cast<int64_t>(PerTick::num);
        }
        using Ns = std::chrono::duration<long double, std::nano>;
        const long double v = std::chrono::duration_cast<Ns>(d).count();
        if (v >= static_cast<long double>(std::numeric_limits<int64_t>::max())) {
            return std::numeric_limits<int64_t>::max();
        }
        if (v <= static_cast<long double>(std::numeric_limits<int64_t>::min())) {
            return std::numeric_limits<int64_t>::min();
        }
        return static_cast<int64_t>(v);
    }
    static uint64_t fromNow(int64_t deltaNs) noexcept;
    static uint64_t fromEpoch(int64_t ns) noexcept { return ns <= 0 ? 1 : static_cast<uint64_t>(ns); }

    uint64_t ns_ = 0;  // 0: never; otherwise CLOCK_MONOTONIC nanoseconds (>= 1)
};

}  // namespace spindle
