// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The I/O-driver seam: everything a carrier needs from the kernel, behind one interface.
///
/// A carrier schedules fibers; its driver submits operations, reaps their completions, parks the
/// carrier until a completion, a wake-up or a timeout, wakes it from other threads, and drains what
/// is in flight before the carrier exits. Two drivers implement it: UringDriver (an io_uring ring,
/// core/driver/uring_driver.h) and EpollDriver (readiness from epoll, files on the offload pool,
/// core/driver/epoll_driver.h). Backend selection is in core/driver/backend.h.
///
/// Thread-safety: every member runs on the owner carrier's thread, except wakeFrom() (any thread).
/// Completions: every IoRequest started here completes here, on the owner's thread, inside poll(),
/// park() or drainForExit() (never inside start(): a result known at once is returned instead, its
/// completion flags in IoRequest::inlineFlags).

#include <cstdint>
#include <string>

#include "base/result.h"
#include "core/driver/op.h"
#include "core/runtime.h"

namespace spindle::uring {
class Ring;
}

namespace spindle::detail {

class Carrier;
class BufferGroup;

/// start()'s answer for an op that will complete later through its IoRequest::complete.
inline constexpr int32_t kPending = INT32_MIN;

class Driver {
public:
    virtual ~Driver() = default;

    [[nodiscard]] virtual Backend backend() const noexcept = 0;
    /// Sets the driver up on the carrier's thread. Errors: the errno of the failed set-up, logged.
    [[nodiscard]] virtual Result<void> init(Carrier* owner) noexcept = 0;
    /// Releases what init() took; on the owner thread after the loop ended (nothing in flight).
    virtual void close() noexcept = 0;

    // --- the hot path ---
    /// Starts `req` (alive until its last completion). Returns kPending, or the result of an op that
    /// finished at once (no completion follows). Never fails to queue: a full queue is drained first.
    virtual int32_t start(op::IoRequest* req) noexcept = 0;
    /// Asks the kernel (or the driver) to end `req` early: it then completes with -ECANCELED, or with
    /// its own result if that came first. No effect on a request that has completed.
    virtual void cancel(op::IoRequest* req) noexcept = 0;
    /// Shutdown: cancels every request in flight here.
    virtual void cancelAll() noexcept = 0;

    /// Submits what is queued and delivers what has completed, without blocking. `getEvents`: also
    /// collect completions the kernel holds back until asked (io_uring's deferred task work).
    virtual void poll(bool getEvents) noexcept = 0;
    /// Whether poll() would deliver or submit anything now (cheap: no system call).
    [[nodiscard]] virtual bool hasWork() const noexcept = 0;
    /// Blocks until a completion or a wake-up is ready, or `timeoutNs` (relative, > 0; < 0: none)
    /// passes; delivers nothing (reap() does, once the carrier is no longer marked parked).
    virtual void wait(int64_t timeoutNs) noexcept = 0;
    /// Delivers what has completed (after wait(), or in place of it), without a system call where
    /// the driver can avoid one.
    virtual void reap() noexcept = 0;
    /// Whether park() may skip the system call that collects completions before parking (the
    /// io_uring driver with DEFER_TASKRUN: the park's own enter does it; the epoll driver: the park's
    /// own epoll_wait does).
    [[nodiscard]] virtual bool parkCollects() const noexcept = 0;
    /// The nearest deadline of a request here (absolute ns), or UINT64_MAX: park() wakes for it.
    [[nodiscard]] virtual uint64_t nextDeadline() const noexcept = 0;

    /// Wakes the owner if parked. `from`: the carrier of the calling thread, or null (a plain thread).
    virtual void wakeFrom(Carrier* from) noexcept = 0;
    /// Requests in flight that the owner must see complete before it exits.
    [[nodiscard]] virtual uint32_t inflight() const noexcept = 0;
    /// Completes everything in flight (after cancelAll or with nothing left); the loop's last act.
    virtual void drainForExit() noexcept = 0;

    /// The io_uring ring, for registered resources; null where there is none (epoll).
    [[nodiscard]] virtual uring::Ring* ring() noexcept { return nullptr; }
    /// Makes `group` the buffer group `id` that op::kBufferSelect receives here pick from, for a
    /// driver that picks receive buffers itself (epoll). `group` must stay alive until
    /// unregisterBufferGroup(id). Errors: ENOTSUP where buffer groups are kernel rings registered
    /// through ring() (io_uring); EEXIST when `id` is registered already; ENOMEM.
    [[nodiscard]] virtual Result<void> registerBufferGroup(uint16_t id, BufferGroup* group) noexcept {
        (void)id;
        (void)group;
        return Error{ENOTSUP};
    }
    /// Forgets buffer group `id` (no receive may still pick from it). Errors: ENOENT when not registered.
    [[nodiscard]] virtual Result<void> unregisterBufferGroup(uint16_t id) noexcept {
        (void)id;
        return Error{ENOTSUP};
    }
    /// One line: the backend and what it got from the kernel.
    [[nodiscard]] virtual std::string describe() const = 0;
    /// System calls made to submit, reap or wait (io_uring_enter, epoll_wait), SQEs or ops started,
    /// completions delivered (for CarrierStats).
    struct Counters {
        uint64_t enters = 0;
        uint64_t submitted = 0;
        uint64_t completed = 0;
        uint64_t queueFull = 0;
    };
    [[nodiscard]] virtual Counters counters() const noexcept = 0;
};

}  // namespace spindle::detail
