#pragma once
/// One io_uring instance, owned and driven by exactly one thread.
///
/// Ring is the only code that touches a ring's state. Code above it takes an SQE
/// from acquireSqe(), fills it with liburing's io_uring_prep_* helpers, tags its
/// user_data with encodeUserData(), and later receives the CQE through reap().
///
/// Set-up probes the kernel: it asks for SINGLE_ISSUER (6.0), DEFER_TASKRUN (6.1)
/// and COOP_TASKRUN with TASKRUN_FLAG (5.19), drops what the kernel refuses, and
/// records (and logs) what it got. Asked for SQPOLL (5.11 unprivileged), it sets
/// up a kernel submission thread (pinned with SQ_AFF when given a CPU) instead of
/// DEFER_TASKRUN, which SQPOLL excludes; when the kernel refuses SQPOLL it logs
/// why and sets the ring up without it. IORING_FEAT_NODROP (5.5) is required: with it the kernel keeps
/// overflowing completions instead of dropping them, so no CQE is ever lost.
///
/// Thread-safety: none. With SINGLE_ISSUER the thread that calls init() is the
/// only one that may submit; other threads reach this ring's owner by message
/// (MSG_RING from another ring, or an eventfd the owner reads).
/// Errors: init() returns the errno of the failed set-up and logs which flags and
/// limits were involved (RLIMIT_MEMLOCK on older kernels); submit calls return
/// `-errno` like liburing.

#include <liburing.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "base/result.h"

namespace spindle::uring {

/// What the low three bits of a CQE's user_data say about the rest of it.
enum class Tag : uint64_t {
    kFuture = 0,      // a FiberFuture* to set with cqe->res
    kWake = 1,        // a wake-up sent to a parked owner; carries nothing
    kCompletion = 2,  // a Completion* whose complete() runs on the owner
    kIgnore = 3,      // nothing to do (skip-success side effects, shutdown cancels)
    kLocalFuture = 4, // a FiberFuture* whose waiter parked on this ring's owner: setLocal()
};
inline constexpr uint64_t kTagMask = 7;

[[nodiscard]] inline uint64_t encodeUserData(const void* p, Tag tag) noexcept {
    return reinterpret_cast<uint64_t>(p) | static_cast<uint64_t>(tag);
}
[[nodiscard]] inline Tag tagOf(uint64_t userData) noexcept { return static_cast<Tag>(userData & kTagMask); }
template <class T>
[[nodiscard]] inline T* pointerOf(uint64_t userData) noexcept {
    return reinterpret_cast<T*>(userData & ~kTagMask);
}

struct RingOptions {
    unsigned entries = 256;     // SQ size; the CQ is twice as large (kernel default)
    bool singleIssuer = true;   // IORING_SETUP_SINGLE_ISSUER where the kernel has it
    bool deferTaskrun = true;   // IORING_SETUP_DEFER_TASKRUN where the kernel has it
    bool coopTaskrun = true;    // IORING_SETUP_COOP_TASKRUN where the kernel has it
    bool taskrunFlag = true;    // with COOP_TASKRUN: IORING_SETUP_TASKRUN_FLAG (5.19), see needsEnter()
    bool sqpoll = false;        // IORING_SETUP_SQPOLL (excludes DEFER_TASKRUN); falls back to none if refused
    int sqThreadCpu = -1;       // with sqpoll: pin the SQ thread there (IORING_SETUP_SQ_AFF); -1: do not pin
    unsigned sqThreadIdleMs = 10;  // with sqpoll: the SQ thread sleeps after this long without submissions
};

/// What set-up obtained from this kernel.
struct RingFeatures {
    bool singleIssuer = false;
    bool deferTaskrun = false;
    bool coopTaskrun = false;
    bool taskrunFlag = false;     // IORING_SQ_TASKRUN tells when deferred completions wait for an enter
    bool sqpoll = false;          // a kernel thread polls the SQ; submit enters only to wake it
    int sqThreadCpu = -1;         // the CPU the SQ thread is pinned to; -1: not pinned (or no SQ thread)
    bool msgRing = false;         // IORING_OP_MSG_RING (5.18)
    bool cancelAny = false;       // IORING_ASYNC_CANCEL_ANY (5.19)
    bool extArg = false;          // IORING_FEAT_EXT_ARG: wait with a timeout in one syscall (5.11)
    unsigned sqEntries = 0;
    unsigned cqEntries = 0;
    std::string describe() const;
};

/// Counters kept by the ring. Written by the owner only (a relaxed load and
/// store, no locked instruction); any thread may read a racy snapshot.
struct RingStats {
    std::atomic<uint64_t> enters{0};         // io_uring_enter calls (submit, wait, get-events)
    std::atomic<uint64_t> sqesSubmitted{0};
    std::atomic<uint64_t> cqesReaped{0};
    std::atomic<uint64_t> sqFull{0};         // times acquireSqe() found the SQ full
    std::atomic<uint64_t> busyRetries{0};    // -EBUSY/-EAGAIN from the kernel, reaped and retried

    static void bump(std::atomic<uint64_t>& counter, uint64_t n = 1) noexcept {
        counter.store(counter.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
    }
};

class Ring {
public:
    /// Called for each CQE that acquireSqe() or submit() must reap to make room.
    using OverflowHandler = void (*)(void* ctx, const io_uring_cqe* cqe);

    Ring() noexcept = default;
    ~Ring();
    Ring(const Ring&) = delete;
    Ring& operator=(const Ring&) = delete;

    /// Sets the ring up on the calling thread, which becomes its only submitter.
    /// `onReap` receives CQEs reaped while making room (SQ full, -EBUSY).
    /// Errors: the errno of io_uring_queue_init_params (ENOMEM: memlock limit;
    /// EPERM/ENOSYS: io_uring disabled), ENOTSUP without IORING_FEAT_NODROP.
    Result<void> init(const RingOptions& options, OverflowHandler onReap, void* ctx) noexcept;
    void close() noexcept;
    [[nodiscard]] bool initialized() const noexcept { return ring_.ring_fd > 0; }
    [[nodiscard]] int fd() const noexcept { return ring_.ring_fd; }
    [[nodiscard]] const RingFeatures& features() const noexcept { return features_; }
    [[nodiscard]] const RingStats& stats() const noexcept { return stats_; }

    /// An SQE to fill; never null. When the SQ is full it submits what is queued
    /// (reaping through the overflow handler if the kernel answers -EBUSY) and retries.
    io_uring_sqe* acquireSqe() noexcept;

    /// Makes sure the next `n` acquireSqe() calls find room without submitting in between, so a
    /// linked chain (an operation and its IORING_OP_LINK_TIMEOUT) leaves in one submission.
    /// Precondition: n <= the SQ size.
    void reserveSqes(unsigned n) noexcept;

    /// SQEs filled but not yet submitted.
    [[nodiscard]] unsigned pending() const noexcept;

    /// Submits every queued SQE and, with DEFER_TASKRUN, runs deferred completions
    /// so that they become visible to reap(). One io_uring_enter at most; none
    /// when nothing is queued and `getEvents` is false.
    /// Returns the number of SQEs submitted or -errno (not -EBUSY/-EAGAIN/-EINTR:
    /// those are retried here after reaping).
    int submit(bool getEvents) noexcept;

    /// Submits what is queued and blocks until at least one CQE is ready or the
    /// relative timeout passes (nullptr: no timeout). Returns 0, -ETIME on timeout,
    /// -EINTR when a signal interrupted the wait, or another -errno.
    int submitAndWait(const __kernel_timespec* timeout) noexcept;

    /// Calls fn(const io_uring_cqe*) for each ready CQE and marks them seen.
    template <class Fn>
    unsigned reap(Fn&& fn) noexcept {
        unsigned head;
        unsigned n = 0;
        io_uring_cqe* cqe;
        io_uring_for_each_cqe(&ring_, head, cqe) {
            fn(static_cast<const io_uring_cqe*>(cqe));
            ++n;
        }
        if (n != 0) {
            io_uring_cq_advance(&ring_, n);
            RingStats::bump(stats_.cqesReaped, n);
        }
        return n;
    }

    /// Whether the kernel holds completions that did not fit the CQ (NODROP backlog).
    [[nodiscard]] bool overflowed() const noexcept;

    /// Whether reap() can miss completions that an io_uring_enter with GETEVENTS would
    /// post: an overflow backlog, or (TASKRUN_FLAG) completions queued as task work.
    /// One load of the SQ flags, no system call. With DEFER_TASKRUN it cannot tell:
    /// deferred completions show only after an enter, so callers enter while I/O is in flight.
    [[nodiscard]] bool needsEnter() const noexcept;

private:
    int enter(bool wait, const __kernel_timespec* timeout) noexcept;
    void reapIntoHandler() noexcept;

    io_uring ring_{};
    RingFeatures features_;
    RingStats stats_;
    OverflowHandler onReap_ = nullptr;
    void* onReapCtx_ = nullptr;
};

}  // namespace spindle::uring
