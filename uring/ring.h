// SPDX-License-Identifier: Apache-2.0
#pragma once
/// One io_uring instance, owned and driven by exactly one thread.
///
/// Ring is the only code that touches a ring's state. Its user (the io_uring driver,
/// core/driver/uring_driver.h) takes an SQE from acquireSqe(), fills it with
/// liburing's io_uring_prep_* helpers and its own user_data, and later receives
/// the CQE through reap(). The ring knows nothing of what user_data points at.
///
/// Set-up probes the kernel: it asks for SINGLE_ISSUER (6.0), DEFER_TASKRUN (6.1)
/// with TASKRUN_FLAG (or COOP_TASKRUN with TASKRUN_FLAG, 5.19, where DEFER_TASKRUN is
/// refused), drops what the kernel refuses, and
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
#include <sched.h>
#include <sys/uio.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "base/counter.h"
#include "base/result.h"
#include "uring/inject.h"

namespace spindle::uring {

/// user_data is the ring user's own, with one reservation: fault injection (uring/inject.h) applies
/// only to SQEs whose user_data is non-zero and has none of the bits in kNoFaultMask set, so a user
/// marks with those bits what no fault may touch (wake-ups, multishot operations, linked timeouts).
inline constexpr uint64_t kNoFaultMask = 3;

struct RingOptions {
    unsigned entries = 256;     // SQ size
    // CQ size (IORING_SETUP_CQSIZE, 5.5), rounded up to a power of two by the kernel; 0: max(2 x entries,
    // 4096). A CQ too small for the operations in flight (a recv per idle connection) overflows into the
    // kernel's backlog list, which costs a slow path per completion.
    unsigned cqEntries = 0;
    bool singleIssuer = true;   // IORING_SETUP_SINGLE_ISSUER where the kernel has it
    bool deferTaskrun = true;   // IORING_SETUP_DEFER_TASKRUN where the kernel has it
    bool coopTaskrun = true;    // IORING_SETUP_COOP_TASKRUN where the kernel has it
    bool taskrunFlag = true;    // with DEFER_ or COOP_TASKRUN: IORING_SETUP_TASKRUN_FLAG (5.19), see needsEnter()
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
    /// CQEs posted and not yet reaped (one load of the CQ tail, no system call).
    [[nodiscard]] unsigned cqReady() const noexcept;

    /// Submits every queued SQE and, with DEFER_TASKRUN and `getEvents`, runs deferred
    /// completions so that they become visible to reap(). One io_uring_enter at most;
    /// none when nothing is queued and needsEnter() is false, unless `getEvents` on a
    /// DEFER_TASKRUN ring without TASKRUN_FLAG, which cannot tell and always enters.
    /// Returns the number of SQEs submitted or -errno (not -EBUSY/-EAGAIN/-EINTR:
    /// those are retried here after reaping).
    int submit(bool getEvents) noexcept;

    /// Submits what is queued and blocks until at least one CQE is ready or the
    /// relative timeout passes (nullptr: no timeout). Returns 0, -ETIME on timeout,
    /// -EINTR when a signal interrupted the wait, or another -errno.
    int submitAndWait(const __kernel_timespec* timeout) noexcept;

    /// Calls fn(const io_uring_cqe*) for each ready CQE, each already marked seen (fn gets a copy);
    /// fn may fill SQEs, and so reap again, without any CQE being handled twice.
    /// Returns the number of CQEs taken from the CQ (with kDelayCompletion armed,
    /// some may be handed to fn in a later call instead).
    template <class Fn>
    unsigned reap(Fn&& fn) noexcept {
#if defined(SPINDLE_FAULT_INJECTION)
        // Disarmed: one relaxed load of a global and one member test per batch.
        if ((inject::armedMask() & inject::bit(inject::Point::kDelayCompletion)) != 0 || faultsLive_) [[unlikely]] {
            return reapWithFaults(fn);
        }
#endif
        unsigned n = 0;
        io_uring_cqe copy;
        while (takeCqe(&copy)) {
            fn(static_cast<const io_uring_cqe*>(&copy));
            ++n;
        }
        if (n != 0) { ownerAdd(stats_.cqesReaped, n); }
        return n;
    }

    /// Whether the kernel holds completions that did not fit the CQ (NODROP backlog).
    [[nodiscard]] bool overflowed() const noexcept;

    // --- registered resources (owner thread only: with SINGLE_ISSUER the kernel answers EEXIST to
    // a registration from any other task) ---

    /// Registers `count` buffers (io_uring_register_buffers, 5.1); their indexes are positions in `iov`.
    /// Errors: the kernel's errno, not logged here: ENOMEM when the pages would pass RLIMIT_MEMLOCK
    /// (without CAP_IPC_LOCK), EBUSY when buffers are already registered, EFAULT/EINVAL for a bad iovec
    /// (a buffer over 1 GiB, file-backed memory), EOVERFLOW, EPERM; the injected errno at kRegisterBuffers.
    [[nodiscard]] Result<void> registerBuffers(const iovec* iov, unsigned count) noexcept;
    /// Drops the registered buffers (io_uring_unregister_buffers). Errors: ENXIO when none are registered.
    [[nodiscard]] Result<void> unregisterBuffers() noexcept;
    /// Confines the kernel's io-wq workers, the threads that run what the ring cannot finish inline
    /// (buffered file writes, fsync, ...), to the CPUs in `cpus` (IORING_REGISTER_IOWQ_AFF, 5.14). The
    /// setting belongs to the calling thread's io-wq (the thread that set this ring up has one from then
    /// on); with SQPOLL, to the SQ thread's. It applies to workers created afterwards: call it before
    /// the ring hands anything to a worker. The kernel narrows a new worker to the CPUs its creator
    /// asked for with sched_setaffinity, when those and `cpus` share any: a thread bound to a CPU in
    /// `cpus` keeps its workers on its own CPU.
    /// Errors: the kernel's errno: EINVAL when a CPU is outside the process's cpuset or the thread has no
    /// io-wq; ENOMEM; EFAULT; the injected errno at kRegisterIowqAff.
    [[nodiscard]] Result<void> setWorkerAffinity(const cpu_set_t& cpus) noexcept;
    /// Registers an empty table of `slots` direct descriptors (io_uring_register_files_sparse, 5.19).
    /// Errors: the kernel's errno, not logged here: EMFILE past RLIMIT_NOFILE, EINVAL for 0 or more than
    /// the kernel's maximum, EBUSY when a table exists, ENOMEM; the injected errno at kRegisterFiles.
    [[nodiscard]] Result<void> registerFilesSparse(unsigned slots) noexcept;
    /// Puts `fd` (or -1: empties the slot) into slot `slot` of the table (io_uring_register_files_update).
    /// The slot takes its own reference to the file; `fd` stays the caller's.
    /// Errors: EBADF for a bad `fd`, EINVAL for a slot outside the table, ENXIO without a table.
    [[nodiscard]] Result<void> updateFile(unsigned slot, int fd) noexcept;
    /// Drops the file table (io_uring_unregister_files). Errors: ENXIO when none is registered.
    [[nodiscard]] Result<void> unregisterFiles() noexcept;
    /// Registers a provided-buffer ring of `entries` (a power of two) at `ring` as buffer group `bgid`
    /// (IORING_REGISTER_PBUF_RING, 5.19); `ring` must be page-aligned and stay mapped until unregistered.
    /// `flags` go to io_uring_buf_reg::flags (the uapi's name for liburing 2.3's `pad`), e.g.
    /// kPbufRingIncremental.
    /// Errors: EINVAL on kernels without it, without a flag asked for, or for bad arguments, EEXIST for
    /// a group in use, ENOMEM; the injected errno at kRegisterBufRing.
    [[nodiscard]] Result<void> registerBufRing(io_uring_buf_ring* ring, unsigned entries, uint16_t bgid,
                                               uint16_t flags = 0) noexcept;
    /// IOU_PBUF_RING_INC (Linux 6.12; the uapi value, which liburing 2.3 does not define): the kernel
    /// consumes each buffer of the ring incrementally, one receive after another, and says in a CQE
    /// (kCqeBufMore) when it keeps the buffer for more. A kernel without it answers EINVAL.
    static constexpr uint16_t kPbufRingIncremental = 2;
    /// IORING_CQE_F_BUF_MORE (6.12): the buffer this CQE names stays the kernel's, partly filled.
    static constexpr uint32_t kCqeBufMore = 1u << 4;
    /// Drops buffer group `bgid`'s ring. Errors: EINVAL/ENOENT when the group has none.
    [[nodiscard]] Result<void> unregisterBufRing(uint16_t bgid) noexcept;
    /// Whether reap() can miss completions that an io_uring_enter with GETEVENTS would
    /// post: an overflow backlog, or (TASKRUN_FLAG) completions queued as task work.
    /// One load of the SQ flags, no system call. With DEFER_TASKRUN but without
    /// TASKRUN_FLAG (features().taskrunFlag false) it cannot tell:
    /// deferred completions show only after an enter, so callers enter while I/O is in flight.
    [[nodiscard]] bool needsEnter() const noexcept;

private:
    struct FaultState;

    /// Copies the oldest CQE out and marks it seen before anyone acts on it, so that a reap nested
    /// in a handler (one that fills an SQE, finds the SQ full and must reap to make room) starts
    /// after it and no CQE is handled twice. Cost: a plain store of the head per CQE on x86.
    bool takeCqe(io_uring_cqe* out) noexcept {
        const unsigned head = *ring_.cq.khead;  // only this thread moves the head
        if (head == io_uring_smp_load_acquire(ring_.cq.ktail)) { return false; }
        *out = ring_.cq.cqes[head & ring_.cq.ring_mask];
        io_uring_smp_store_release(ring_.cq.khead, head + 1);
        return true;
    }

    int enter(bool wait, const __kernel_timespec* timeout) noexcept;
    void reapIntoHandler() noexcept;
    void onSqFull() noexcept;

    // Fault injection (uring/inject.h): called only in builds with SPINDLE_FAULT_INJECTION.
    FaultState& faults() noexcept;
    void applySubmitFaults(uint32_t armed) noexcept;
    [[nodiscard]] bool sqFullInjected() noexcept;
    /// Ages the held CQEs by one reap pass.
    void beginFaultReap() noexcept;
    /// Copies `in` to `out` with any injected fault applied; false when the CQE is held back.
    [[nodiscard]] bool filterCqe(const io_uring_cqe* in, io_uring_cqe* out) noexcept;
    /// Takes one held CQE that is due into `out`; false when none is.
    [[nodiscard]] bool takeDueCqe(io_uring_cqe* out) noexcept;
    /// Makes every held CQE due; false when none is held.
    bool releaseHeldCqes() noexcept;

    template <class Fn>
    unsigned reapWithFaults(Fn& fn) noexcept {
        beginFaultReap();
        unsigned n = 0;
        io_uring_cqe in;
        io_uring_cqe out{};
        while (takeCqe(&in)) {
            if (filterCqe(&in, &out)) { fn(static_cast<const io_uring_cqe*>(&out)); }
            ++n;
        }
        if (n != 0) { ownerAdd(stats_.cqesReaped, n); }
        // Taken out one at a time, so that a reap nested in fn (SQ full, -EBUSY) cannot deliver one twice.
        while (takeDueCqe(&out)) { fn(static_cast<const io_uring_cqe*>(&out)); }
        return n;
    }

    io_uring ring_{};
    RingFeatures features_;
    RingStats stats_;
    OverflowHandler onReap_ = nullptr;
    void* onReapCtx_ = nullptr;
    // Fault injection state, made on first use. Invariant: faultsLive_ is true while faults_ holds a
    // rewrite, a held CQE or an open failed chain, so reap() and submit visit it.
    FaultState* faults_ = nullptr;  // owned; deleted by ~Ring (a unique_ptr would need the type here)
    bool faultsLive_ = false;
    bool injectSqFull_ = false;  // kSqFull was armed at this ring's last submission
};

}  // namespace spindle::uring
