// SPDX-License-Identifier: Apache-2.0
#pragma once
/// offload(fn): runs a blocking call or long CPU work on the runtime's helper
/// thread pool and parks the calling fiber until it is done, so the carrier
/// keeps running its other fibers meanwhile.
///
/// The pool belongs to the Runtime of the calling fiber: RuntimeOptions::
/// offloadThreads plain threads named "spindle-off", started by the first
/// offload() and joined by Runtime::join() (and so by ~Runtime). Work runs in
/// FIFO order; the queue is unbounded.
///
/// Called off-fiber (a plain thread, including a pool thread itself) there is
/// no carrier to protect: fn runs inline on the caller's thread.
///
/// Thread-safety: offload() may be called from any fiber or thread. fn runs on
/// a pool thread, not the caller's: thread_local state differs, and spindle
/// calls made inside fn behave as calls from a plain thread.
/// Memory ordering: everything the caller wrote before offload() is visible to
/// fn; everything fn wrote is visible to the caller after offload() returns.
/// Errors: ECANCELED when the runtime is shutting down before the work started
/// (fn then never runs); EAGAIN when the first pool thread cannot be created.
/// An exception thrown by fn is not an error code: it is rethrown in the caller.
/// Cancellation: none once fn has started. At shutdown, work still queued is
/// completed with ECANCELED at once; work already running finishes first, and
/// Runtime::join() waits for it.
/// Cost: no heap allocation (the work item, the result slot and the
/// FiberFuture live on the caller's stack); one queue push under the pool's
/// mutex, one thread wake-up (a futex call when a pool thread sleeps), one
/// FiberFuture set (the fiber is posted back to its carrier's inbox).

#include <exception>
#include <functional>
#include <memory>
#include <type_traits>
#include <utility>

#include "base/result.h"
#include "core/fiber.h"
#include "core/fiber_future.h"
#include "core/runtime.h"

namespace spindle {

namespace detail {

/// One queued call, on the caller's stack; linked into the pool's intrusive FIFO.
struct OffloadItem {
    OffloadItem* next = nullptr;           // guarded by the pool's mutex while queued
    void (*run)(OffloadItem* self) noexcept = nullptr;
    FiberFuture done;                      // 0: run() returned; -ECANCELED: it never started
};

/// Queues `item` on rt's pool, starting the pool on first use.
/// Returns 0, or the errno (ECANCELED, EAGAIN) with nothing queued.
[[nodiscard]] int submitOffload(RuntimeImpl* rt, OffloadItem* item) noexcept;

/// Work items waiting for a pool thread (for tests).
[[nodiscard]] size_t offloadQueued(RuntimeImpl* rt) noexcept;

template <class F, class T>
struct OffloadCall : OffloadItem {
    explicit OffloadCall(std::remove_reference_t<F>* f) noexcept : fn(f) { run = &invoke; }

    std::remove_reference_t<F>* fn;        // the caller's callable, which outlives the call
    ResultSlot<T> slot;
    std::exception_ptr error;

    static void invoke(OffloadItem* self) noexcept {
        auto* c = static_cast<OffloadCall*>(self);
        try {
            if constexpr (std::is_void_v<T>) {
                std::invoke(std::forward<F>(*c->fn));
            } else {
                c->slot.value.emplace(std::invoke(std::forward<F>(*c->fn)));
            }
        } catch (...) {
            c->error = std::current_exception();
        }
    }
};

}  // namespace detail

/// Runs fn() on the runtime's offload pool and returns its value (see the file comment).
/// Precondition: fn's result is not a reference.
template <class F>
auto offload(F&& fn) -> Result<std::invoke_result_t<F>> {
    using T = std::invoke_result_t<F>;
    static_assert(!std::is_reference_v<T>, "offload() returns a value, not a reference");
    detail::RuntimeImpl* rt = detail::currentRuntime();
    if (rt == nullptr) {
        if constexpr (std::is_void_v<T>) {
            std::invoke(std::forward<F>(fn));
            return {};
        } else {
            return std::invoke(std::forward<F>(fn));
        }
    }
    detail::OffloadCall<F, T> call(std::addressof(fn));
    if (const int err = detail::submitOffload(rt, &call); err != 0) { return Error{err}; }
    // The pool thread touches `call` for the last time inside done.set().
    if (const int32_t res = call.done.wait(detail::WaitKind::kOffload, &call); res < 0) { return errorFromRes(res); }
    if (call.error) { std::rethrow_exception(std::move(call.error)); }
    if constexpr (std::is_void_v<T>) {
        return {};
    } else {
        return std::move(*call.slot.value);
    }
}

}  // namespace spindle
