// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Stack-overflow reporting: the other half of the stack pool's guard page (core/internal/stack_pool.h).
///
/// A SIGSEGV or SIGBUS inside the guard page of the fiber running on the faulting thread is a stack
/// overflow: the handler says so, with the fiber's name and id and its carrier, then aborts. It runs on
/// the thread's alternate signal stack, since the fiber's own stack is the one that ran out. Any other
/// fault goes to the handler that was installed before ours. The handler knows nothing of carriers: it
/// asks the RunningFiberFn it was installed with, so this file sits below core/internal/carrier.h.
///
/// Thread-safety: installStackOverflowReporter() from any thread, any number of times (the first call
/// wins); an AltSignalStack belongs to the thread that installed it.

#include <cstddef>

namespace spindle::detail {

class Fiber;

/// The fiber running on the calling thread, and (out) the index of the carrier running it; nullptr off a
/// carrier or on its scheduler. Called from the signal handler: must be async-signal-safe.
using RunningFiberFn = Fiber* (*)(unsigned* carrierIndex) noexcept;

/// Installs the SIGSEGV/SIGBUS handler, once per process. Precondition: before the first thread that may
/// overflow a fiber's stack starts (so that thread sees `running`).
void installStackOverflowReporter(RunningFiberFn running) noexcept;

/// The calling thread's alternate signal stack, on which the handler runs. Installed and removed on the
/// thread it serves (a carrier's set-up and tear-down), so it has no destructor: another thread could
/// not disable it.
class AltSignalStack {
public:
    static constexpr size_t kSize = 64 * 1024;

    AltSignalStack() noexcept = default;
    AltSignalStack(const AltSignalStack&) = delete;
    AltSignalStack& operator=(const AltSignalStack&) = delete;

    /// Maps the stack and makes it the calling thread's (sigaltstack).
    /// Errors: false when it cannot be mapped; an overflow then dies as a bare SIGSEGV.
    [[nodiscard]] bool install() noexcept;
    /// Disables it for the calling thread and unmaps it; nothing if none is installed.
    /// Precondition: on the thread that installed it.
    void remove() noexcept;

private:
    void* memory_ = nullptr;  // null: not installed
};

}  // namespace spindle::detail
