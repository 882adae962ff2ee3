// SPDX-License-Identifier: Apache-2.0
#pragma once
/// FiberFuture: a one-shot result slot for a single waiter, living in the waiter's frame.
///
/// It is the leaf of every blocking call in spindle: an I/O call puts the
/// address of a FiberFuture on its own stack into the SQE's user_data, and the
/// CQE sets it. The whole state is one packed 64-bit word plus the result
/// (16 bytes); there is no shared heap state and no reference count, which is
/// what the single-producer/single-consumer contract buys.
///
/// The result is an int32_t in the kernel's convention: `>= 0` is a value,
/// `< 0` is `-errno`.
///
/// Thread-safety: set() may run on any carrier or thread, once per reset();
/// wait(), isSet() and reset() belong to the one consumer. The consumer may be a
/// fiber (it parks) or a plain thread (it sleeps on its proxy's semaphore).
/// Memory ordering: everything written before set() is visible after wait()
/// or a true isSet() returns.
/// Cost: set() is one atomic exchange, plus a wake-up when a waiter is parked;
/// wait() on a set future is one acquire load.
/// Lifetime: the future must outlive the set() call that targets it; for I/O
/// that means until the CQE arrived, which every spindle call waits for.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>

namespace spindle {

namespace detail {
class Fiber;
struct MultiWaitState;

/// What a suspended fiber waits for (Runtime::fibers). Fiber::waitObject_ says which one: for kIo
/// the op::Op being run, for kJoin the Fiber joined, for the others the primitive's address.
enum class WaitKind : uint8_t {
    kNone,       // not waiting (running, runnable), or a wait that says nothing of itself
    kIo,         // an I/O operation (core/io.h)
    kMultishot,  // the next completion of a multishot operation
    kSleep,      // this_fiber::sleep_for/sleep_until
    kFuture,     // a FiberFuture (set by another fiber, thread or completion)
    kFutex,
    kMutex,      // FiberMutex, FairFiberMutex
    kCondVar,
    kSemaphore,
    kMultiLock,
    kSequencer,  // FiberSequencer, FiberEvent
    kJoin,       // FiberHandle::join
    kOffload,    // offload(): a call on the offload pool
};
}  // namespace detail

class FiberFuture {
public:
    FiberFuture() noexcept = default;
    FiberFuture(const FiberFuture&) = delete;
    FiberFuture& operator=(const FiberFuture&) = delete;

    /// Publishes `res` and wakes the waiter if one is parked.
    /// Precondition: not set since construction or the last reset().
    void set(int32_t res) noexcept;

    /// Returns the result, parking the calling fiber (or blocking the calling
    /// thread) until set() has run.
    [[nodiscard]] int32_t wait() noexcept { return wait(detail::WaitKind::kFuture, this); }

    /// For waitWithTimeout(): wait without a limit, but end the wait when the fiber is cancelled.
    static constexpr std::chrono::nanoseconds kNoTimeout = std::chrono::nanoseconds::max();
    /// wait(), telling Runtime::fibers what the caller waits for (recorded only if it parks); for the
    /// fiber-aware primitives built on futures.
    [[nodiscard]] int32_t wait(detail::WaitKind kind, const void* object, uint64_t deadlineNs = 0) noexcept;

    [[nodiscard]] bool isSet() const noexcept { return (state_.load(std::memory_order_acquire) & kSet) != 0; }

    /// The result of a set future. Precondition: isSet().
    [[nodiscard]] int32_t result() const noexcept { return res_; }

    /// Makes the future reusable. Precondition: no waiter and no set() in flight.
    void reset() noexcept { state_.store(0, std::memory_order_relaxed); }

    /// The carrier-local pair used by fiber-blocking I/O: the consumer is a fiber
    /// on the carrier whose thread will call setLocal(), and nothing else touches
    /// the future. Both sides run on one thread, so no locked instruction is
    /// needed; the fiber, once runnable, reaches other threads only through the
    /// carrier's run queues, which publish with release/acquire.
    /// Precondition (waitLocal): on a fiber; the SQE that will set the future has
    /// not been submitted yet, so the set cannot come before the switch.
    [[nodiscard]] int32_t waitLocal() noexcept;
    /// Precondition: on the thread of the carrier the waiter parked on.
    void setLocal(int32_t res) noexcept;

    /// Waits until at least one of `futures[0..count)` is set and returns the
    /// index of the first set one. Every future is detached again before this
    /// returns, so the caller may destroy or reuse the unset ones.
    /// Precondition: the caller is the consumer of every future; count > 0.
    static size_t waitForMultiple(FiberFuture* const* futures, size_t count) noexcept;

    /// wait() with a limit: returns the result, or -ETIMEDOUT when `timeout`
    /// passes first. The future stays armed after a timeout: a later set() is
    /// legal and a later wait() returns it. -ECANCELED during shutdown or for a
    /// cancelled fiber; -ENOMEM (without waiting) when the carrier's timer heap
    /// must grow and cannot. The primitives' timed waits take either as a timeout.
    /// kNoTimeout (or any timeout of 2^62 ns, 146 years, or more) is no limit: only the result or a
    /// cancel ends the wait (a cancel does not end wait()), and the carrier parks without a timeout
    /// for it, where a finite one costs the kernel a timer armed and cancelled at every park.
    static int32_t waitWithTimeout(FiberFuture* future, std::chrono::nanoseconds timeout) noexcept {
        return waitWithTimeout(future, timeout, detail::WaitKind::kFuture, future);
    }
    /// waitWithTimeout(), with what the caller waits for (see wait(kind, ...)).
    static int32_t waitWithTimeout(FiberFuture* future, std::chrono::nanoseconds timeout, detail::WaitKind kind,
                                   const void* object) noexcept;

private:
    friend struct detail::MultiWaitState;
    friend class FiberFutureAccess;

    static size_t waitForMultipleNoted(FiberFuture* const* futures, size_t count, detail::WaitKind kind,
                                       const void* object, uint64_t deadlineNs) noexcept;

    // Invariant: state_ is 0 (empty, no waiter), kSet (set; res_ is valid), a
    // Fiber* (its waiter, parked or about to park), or a MultiWaitState* | kMulti
    // (attached to a waitForMultiple). Fiber and MultiWaitState are at least
    // 8-byte aligned, so the low three bits are free for the tags.
    static constexpr uint64_t kSet = 1;
    static constexpr uint64_t kMulti = 2;
    static constexpr uint64_t kTagBits = 7;

    std::atomic<uint64_t> state_{0};
    int32_t res_ = 0;
};

static_assert(sizeof(FiberFuture) == 16, "FiberFuture is one word plus the result");

}  // namespace spindle
