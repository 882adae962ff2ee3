// SPDX-License-Identifier: Apache-2.0
#pragma once
/// ProxyFiber: the stand-in fiber of a plain OS thread.
///
/// Every primitive keys off the current fiber. A thread that is not a carrier
/// gets one of these, created on first use and destroyed at thread exit; to
/// "suspend" it the thread sleeps on a POSIX semaphore, and making it
/// runnable posts the semaphore. So a thread and a fiber meet through the same
/// FiberFuture (or mutex, or condition variable) with no special code.
///
/// Thread-safety: block() on the owning thread only; post() from any thread.

#include <semaphore.h>
#include <time.h>

#include "core/internal/fiber.h"

namespace spindle::detail {

class ProxyFiber final : public Fiber {
public:
    ProxyFiber() noexcept;
    ~ProxyFiber();

    /// Sleeps until post().
    void block() noexcept;
    /// Sleeps until post() or the CLOCK_MONOTONIC deadline; false on timeout.
    bool blockUntil(const timespec& deadline) noexcept;
    void post() noexcept;

private:
    sem_t sem_;
};

/// The calling thread's proxy fiber (created on first use).
ProxyFiber& threadProxy() noexcept;

}  // namespace spindle::detail
