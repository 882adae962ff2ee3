// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Fibers: spawn options, the join handle, and what a fiber can ask about itself.
///
/// A fiber is a stackful coroutine run by a carrier. It is created by
/// Runtime::spawn() (from any thread) or spindle::spawn() (from inside a
/// fiber), and may move between carriers when an idle one steals it, unless it
/// is pinned.
///
/// Errors: spawning returns Result (ENOMEM: no stack; EINVAL: bad options;
/// ECANCELED: the runtime is shutting down). An exception thrown by the fiber's
/// function is caught, kept, and rethrown by join(); if nobody joins (the
/// handle was dropped or detached) it is logged and the process aborts.
/// Limitations: thread_local variables belong to the carrier thread, not the
/// fiber, and a fiber may resume on another thread after any blocking call
/// (per-fiber state goes in a FiberLocal, core/fiber_local.h);
/// do not block inside a catch block (the C++ runtime keeps the caught
/// exception per thread).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <string_view>
#include <type_traits>
#include <utility>

#include "base/result.h"
#include "core/internal/fiber.h"

namespace spindle {

using FiberId = uint64_t;

struct SpawnOptions {
    static constexpr int kAnyCarrier = -1;

    const char* name = nullptr;  // copied; at most 31 characters are kept
    size_t stackSize = 0;        // usable bytes; 0: the runtime's default (64 KiB)
    int carrier = kAnyCarrier;   // start on this carrier index; default: the caller's, or round robin
    bool pinned = false;         // never stolen: stays on the carrier it starts on
};

namespace detail {
template <class T>
struct ResultSlot {
    std::optional<T> value;
};
template <>
struct ResultSlot<void> {};

/// The callable and its result slot, placed just under the Fiber on its stack.
template <class F, class T>
struct FiberPayload : ResultSlot<T> {
    explicit FiberPayload(F&& f) : fn(std::move(f)) {}
    explicit FiberPayload(const F& f) : fn(f) {}
    std::optional<F> fn;

    static FiberPayload* of(Fiber* f) noexcept {
        return static_cast<FiberPayload*>(static_cast<ResultSlot<T>*>(f->payload_));
    }
    static void run(Fiber* f) {
        FiberPayload* p = of(f);
        try {
            if constexpr (std::is_void_v<T>) {
                std::invoke(std::move(*p->fn));
            } else {
                p->value.emplace(std::invoke(std::move(*p->fn)));
            }
        } catch (...) {
            f->exception_ = std::current_exception();
        }
        p->fn.reset();  // captures die with the fiber, not with the handle
    }
    static void destroy(Fiber* f) noexcept { of(f)->~FiberPayload(); }
};
}  // namespace detail

/// Owns the right to join one fiber. Move-only; dropping it detaches the fiber.
template <class T>
class FiberHandle {
public:
    FiberHandle() noexcept = default;
    explicit FiberHandle(detail::Fiber* fiber) noexcept : fiber_(fiber) {}
    FiberHandle(FiberHandle&& o) noexcept : fiber_(std::exchange(o.fiber_, nullptr)) {}
    FiberHandle& operator=(FiberHandle&& o) noexcept {
        if (this != &o) {
            detach();
            fiber_ = std::exchange(o.fiber_, nullptr);
        }
        return *this;
    }
    FiberHandle(const FiberHandle&) = delete;
    FiberHandle& operator=(const FiberHandle&) = delete;
    ~FiberHandle() { detach(); }

    [[nodiscard]] bool joinable() const noexcept { return fiber_ != nullptr; }
    [[nodiscard]] FiberId id() const noexcept { return fiber_ != nullptr ? fiber_->id() : 0; }
    /// Whether the fiber has finished (join() would not wait).
    [[nodiscard]] bool done() const noexcept { return fiber_ != nullptr && fiber_->done_.isSet(); }

    /// Waits for the fiber (parks a fiber, blocks a thread), then returns its
    /// value or rethrows its exception. Precondition: joinable(), and not the
    /// fiber itself.
    T join() {
        SPINDLE_CHECK_MSG(fiber_ != nullptr, "join() on an empty FiberHandle");
        SPINDLE_CHECK_MSG(fiber_ != detail::runningFiber(), "a fiber cannot join itself");
        detail::Fiber* f = std::exchange(fiber_, nullptr);
        (void)f->done_.wait(detail::WaitKind::kJoin, f);
        f->joined_ = true;
        if (f->exception_) {
            std::exception_ptr e = std::move(f->exception_);  // the joiner alone owns it now
            detail::releaseFiber(f);
            std::rethrow_exception(e);
        }
        if constexpr (std::is_void_v<T>) {
            detail::releaseFiber(f);
        } else {
            auto* slot = static_cast<detail::ResultSlot<T>*>(f->payload_);
            T v = std::move(*slot->value);
            detail::releaseFiber(f);
            return v;
        }
    }

    /// Asks the fiber to stop: from now until it calls this_fiber::acknowledgeCancellation(), every
    /// cancellable call it makes fails with ECANCELED, and the one it may be blocked in now ends
    /// early with ECANCELED. Cancellable: the calls of core/io.h and core/fixed.h (an operation in
    /// flight is cancelled on the ring that holds it, by the carrier that owns that ring, and the
    /// call returns once the kernel answered; an operation that completed first keeps its result),
    /// this_fiber::sleep_for/sleep_until, and every timed wait of the sync primitives (they all end
    /// in FiberFuture::waitWithTimeout: FiberFutex::waitFor, FiberCondVar::wait_for/wait_until,
    /// FiberSemaphore::try_acquire_for, ...). Untimed waits (lock(), wait(), join()) and offload()
    /// cannot report ECANCELED and are not interrupted; the fiber sees the request at its next
    /// cancellable call. Returns at once; no effect on a fiber that has finished.
    /// Thread-safety: any fiber or thread. Precondition: joinable().
    void cancel() noexcept {
        SPINDLE_CHECK_MSG(fiber_ != nullptr, "cancel() on an empty FiberHandle");
        detail::requestCancel(fiber_);
    }

    /// Lets the fiber run on unobserved; an exception it throws then aborts the process.
    void detach() noexcept {
        if (fiber_ != nullptr) { detail::releaseFiber(std::exchange(fiber_, nullptr)); }
    }

private:
    detail::Fiber* fiber_ = nullptr;
};

namespace this_fiber {
/// Lets the other runnable fibers of this carrier run first; on a plain thread, std::this_thread::yield().
void yield() noexcept;
/// Parks the fiber until `deadline` (CLOCK_MONOTONIC); a plain thread sleeps.
/// Errors: ECANCELED when the runtime shuts down first; ENOMEM when the carrier's timer heap must grow
/// and cannot (nothing is armed; the fiber did not sleep).
Result<void> sleep_until(std::chrono::steady_clock::time_point deadline) noexcept;
/// Parks the fiber for `duration`. Errors: as sleep_until.
Result<void> sleep_for(std::chrono::nanoseconds duration) noexcept;
/// The running fiber's id; a plain thread gets the id of its proxy fiber.
FiberId id() noexcept;
/// The running fiber's name ("" when unnamed; "thread" for a plain thread).
std::string_view name() noexcept;
/// Whether FiberHandle::cancel() was called for the running fiber and not yet acknowledged
/// (false on a plain thread).
bool cancellationRequested() noexcept;
/// Clears a pending cancellation of the running fiber, so that its blocking calls work again (to
/// clean up, say); returns whether one was pending. False on a plain thread.
bool acknowledgeCancellation() noexcept;
/// Whether the caller runs on a fiber (not a plain thread or a scheduler).
bool inFiber() noexcept;
/// Whether the caller runs on a pinned fiber (SpawnOptions::pinned): one that stays on its carrier
/// across every park and yield. False on a plain thread.
bool pinned() noexcept;
/// The index of the carrier running the caller, or -1 off-carrier.
int carrierIndex() noexcept;
/// The most of a resume hint that is prefetched (setResumeHint).
inline constexpr size_t kResumeHintMaxBytes = detail::kResumeHintMaxBytes;
/// Names memory the running fiber reads first each time it resumes, which its stack does not hold (a
/// connection's state on the heap): one pop before its carrier runs it, the carrier prefetches the
/// cache lines of [p, p + bytes), at most kResumeHintMaxBytes of them, as it prefetches the fiber's
/// stack, so that with thousands of connections the miss overlaps the fiber that runs before. A hint
/// and nothing more: any address may be named (a prefetch never faults, nor reads what it names), a
/// null `p` or 0 bytes clears it, and it ends with the fiber. No effect on a plain thread, nor for
/// an address above 2^56 (none of a user process's on x86-64 or AArch64).
void setResumeHint(const void* p, size_t bytes) noexcept;
}  // namespace this_fiber

}  // namespace spindle
