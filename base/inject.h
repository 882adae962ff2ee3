// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Fault points: make the next N passes through a named site fail with a chosen
/// errno, or misbehave in a chosen way, so tests can prove every error path
/// returns a clear error and leaks nothing (STYLE: SPINDLE_INJECT).
///
/// The points live in base/ so that every layer may have some (numa/ cannot include uring/);
/// uring/inject.h forwards here.
///
/// Two kinds of point:
/// - Call-site points (kRingSetup, kStackMap, kRegisterBuffers, kRegisterFiles, kHwlocLoad, kMembind,
///   kRegisterBufRing, kMultishotRecv, kRegisterIowqAff, kThreadAffinity)
///   sit at one system call on a cold path; SPINDLE_INJECT there costs one relaxed load when disarmed.
/// - I/O fault classes (kSubmitFail, kShortIo, kSqFull, kDelayCompletion) are
///   applied by uring::Ring to the operations a caller waits on (user_data
///   tagged kFuture or kLocalFuture: every fiber-blocking call). The runtime's
///   own SQEs (wake-ups, the eventfd read, cancels, linked timeouts) are never
///   failed, shortened or delayed, so a fault cannot break the machinery that
///   delivers it. When disarmed, a ring pays one relaxed load of armedMask() per
///   submit batch and per reap batch, plus a test of one ring member per
///   acquireSqe() (for kSqFull); nothing per SQE beyond that.
///
/// arm(point, param, count, skip): let `skip` eligible passes through `point`
/// go by, then apply the fault to the next `count`. What `param` means:
///
/// | point            | a pass is                                   | param                    |
/// |------------------|---------------------------------------------|--------------------------|
/// | kRingSetup       | Ring::init                                  | the errno returned       |
/// | kStackMap        | StackPool mapping a slab or a lone stack    | the errno returned       |
/// | kSubmitFail      | a waited-on SQE leaving in a submission     | the errno its CQE gets   |
/// | kShortIo         | a completion of a read/write whose res >= 2 | divisor: res/param, >= 1 |
/// | kSqFull          | a Ring::acquireSqe() call                   | ignored (any errno)      |
/// | kDelayCompletion | a waited-on CQE being reaped                | reap passes to hold it   |
/// | kHwlocLoad       | numa::Topology::machine loading hwloc       | the errno it fails with  |
/// | kMembind         | a numa memory binding (area or thread)      | the errno it fails with  |
/// | kRegisterBufRing | registering a provided-buffer ring (or an epoll buffer group) | the errno it fails with |
/// | kMultishotRecv   | net::MultishotReceiver arming its receive   | the errno its only CQE says |
/// | kWakeFail        | a MSG_RING wake-up leaving a carrier's ring | ignored: the kernel says EBADF |
/// | kEnterFail       | a Ring::submitAndWait call                  | the errno it returns     |
/// | kGrowFail        | a carrier's run deque or timer heap growing | ignored: std::bad_alloc  |
/// | kLogWrite        | an app's durable-log write (spindle-kv)     | the errno it fails with  |
/// | kLogSync         | an app's durable-log fdatasync              | the errno it fails with  |
/// | kLogExtend       | a log preallocation's zero write, then its fdatasync (two passes) | the errno |
/// | kPipeCreate      | spindle-httpd creating a splice pipe        | the errno pipe2 fails with |
/// | kSpliceAgain     | a non-blocking try of a splice or tee (spindle::splice/tee on either backend) | ignored: EAGAIN |
/// | kRewriteEnd      | the end of a spindle-kv log rewrite         | ms the thread sleeps there |
/// | kRegisterIowqAff | Ring::setWorkerAffinity                     | the errno it fails with  |
/// | kThreadAffinity  | Runtime::start reading its thread's CPUs (placing the helper threads), or an offload pool thread placing itself | the errno it fails with |
///
/// kSubmitFail turns the SQE into an IORING_OP_NOP before the kernel sees it
/// (so the operation has no side effect) and rewrites its CQE's res to -param.
/// If the SQE heads a chain (IOSQE_IO_LINK), the whole chain fails as the
/// kernel fails a broken chain: the other members become NOPs whose CQEs say
/// -ECANCELED, except an IORING_OP_LINK_TIMEOUT, which stays and is cancelled
/// by the NOP's prompt completion (-ECANCELED on its own, ignored, CQE). So a
/// call with a deadline returns -param at once.
///
/// kShortIo applies to READ, WRITE, READV, WRITEV, READ_FIXED and WRITE_FIXED
/// at an explicit offset on a regular file or block device (checked with
/// fstat at submission while armed; fixed files are not eligible). The kernel
/// transferred everything; the CQE reports fewer bytes. The bytes beyond are in
/// the buffer (read) or on disk (write), which is what a legal short transfer
/// may leave, so a caller that loops until done ends with the right data. On
/// pipes and sockets a reported short count that was not really short would
/// lose or duplicate bytes, so those are never shortened.
///
/// kSqFull makes acquireSqe() take the SQ-full path (count RingStats::sqFull,
/// submit what is queued, retry) once per pass, except while a chain is open
/// (the last queued SQE has IOSQE_IO_LINK): a chain leaves in one submission.
/// The ring notices kSqFull being armed or disarmed at its next submission.
///
/// kDelayCompletion copies the CQE out of the CQ and delivers it after `param`
/// more reap passes (at least 1), or before the ring would block in a wait,
/// whichever comes first. Completions may change order; none is lost.
///
/// Thread-safety: arm() and take() may race freely; each armed failure is
/// consumed by exactly one take(). Points are global: every ring in the
/// process draws from the same counts.

#include <atomic>
#include <cstdint>

namespace spindle::inject {

enum class Point : uint8_t {
    kRingSetup,        // uring::Ring::init, before io_uring_queue_init_params
    kStackMap,         // core's StackPool, before the mmap of a slab or a lone stack
    kSubmitFail,       // uring::Ring, each waited-on SQE at submission
    kShortIo,          // uring::Ring, each eligible read/write CQE at reap
    kSqFull,           // uring::Ring::acquireSqe
    kDelayCompletion,  // uring::Ring, each waited-on CQE at reap
    kRegisterBuffers,  // uring::Ring::registerBuffers, before io_uring_register_buffers
    kRegisterFiles,    // uring::Ring::registerFilesSparse, before io_uring_register_files_sparse
    kSqpollSetup,      // uring::Ring::init, before setting up a ring with SQPOLL (then it runs without)
    kHwlocLoad,        // numa::Topology::machine, in place of hwloc_topology_load (then the flat fallback)
    kMembind,          // numa::Topology's memory binding (area and thread), in place of the hwloc call
    kRegisterBufRing,  // uring::Ring::registerBufRing, before io_uring_register_buf_ring; EpollDriver::registerBufferGroup
    kMultishotRecv,    // net::MultishotReceiver::next, in place of arming (as a kernel that refuses it: EINVAL)
    kWakeFail,         // core's UringDriver, a carrier-to-carrier MSG_RING wake-up: aimed at no ring (EBADF)
    kEnterFail,        // uring::Ring::submitAndWait, in place of io_uring_enter (nothing submitted or reaped)
    kGrowFail,         // ChaseLevDeque::grow and DeadlineHeap::push when it must grow: std::bad_alloc, as if out of memory
    kLogWrite,         // apps: a durable log's write, in place of the call (nothing is written)
    kLogSync,          // apps: a durable log's fdatasync, in place of the call
    kLogExtend,        // apps: a durable log's preallocation: its write of zeros, then its fdatasync
    kPipeCreate,       // apps: spindle-httpd's pipe2 for splicing file bodies, in place of the call (EMFILE, ENFILE)
    kSpliceAgain,      // core: a non-blocking try of a splice or tee answers EAGAIN without the call, as a TCP
                       // stack out of memory answers it though both ends poll ready
    kRewriteEnd,       // apps: spindle-kv, a log rewrite's end, between "not active" and "idle": the carrier's
                       // thread sleeps param ms there, as a preempted one would
    kRegisterIowqAff,  // uring::Ring::setWorkerAffinity, before io_uring_register_iowq_aff
    kThreadAffinity,   // core: Runtime::start's sched_getaffinity (workerCpus), an offload pool thread's
                       // pthread_setaffinity_np, in place of the call
    kCount,
};

/// The bit of `point` in armedMask().
[[nodiscard]] constexpr uint32_t bit(Point point) noexcept { return 1u << static_cast<unsigned>(point); }

/// From now on, let `skip` passes through `point` go by, then apply the fault
/// to the next `count`. `param` (see the table above) must be positive.
void arm(Point point, int param, uint32_t count = 1, uint32_t skip = 0) noexcept;
/// Cancels whatever is armed at `point`.
void disarm(Point point) noexcept;
/// Consumes one pass: the param to fail with, or 0 to go ahead.
int take(Point point) noexcept;
/// Faults still to be applied at `point` (not counting the skips).
[[nodiscard]] uint32_t remaining(Point point) noexcept;

namespace detail {
extern std::atomic<uint32_t> gArmedMask;
}  // namespace detail

/// Arms `point` for the life of the object and disarms it at the end (tests).
class ArmedFault {
public:
    ArmedFault(Point point, int param, uint32_t count = 1, uint32_t skip = 0) noexcept : point_(point) {
        arm(point, param, count, skip);
    }
    ~ArmedFault() { disarm(point_); }
    ArmedFault(const ArmedFault&) = delete;
    ArmedFault& operator=(const ArmedFault&) = delete;

private:
    Point point_;
};

/// The points armed since their last disarm(), as bit(point) flags (one relaxed
/// load). A bit stays set after its count is used up, until disarm().
[[nodiscard]] inline uint32_t armedMask() noexcept { return detail::gArmedMask.load(std::memory_order_relaxed); }

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
