#include "uring/ring.h"

#include <sys/resource.h>

#include <cerrno>
#include <cstring>

#include "base/log.h"
#include "uring/inject.h"

namespace spindle::uring {

std::string RingFeatures::describe() const {
    return fmt::format("sq={} cq={} single_issuer={} defer_taskrun={} coop_taskrun={} taskrun_flag={} sqpoll={} "
                       "sq_thread_cpu={} msg_ring={} cancel_any={} ext_arg={}",
                       sqEntries, cqEntries, singleIssuer, deferTaskrun, coopTaskrun, taskrunFlag, sqpoll,
                       sqThreadCpu, msgRing, cancelAny, extArg);
}

Ring::~Ring() { close(); }

void Ring::close() noexcept {
    if (initialized()) {
        io_uring_queue_exit(&ring_);
        ring_ = io_uring{};
    }
}

Result<void> Ring::init(const RingOptions& options, OverflowHandler onReap, void* ctx) noexcept {
    SPINDLE_CHECK(!initialized());
    onReap_ = onReap;
    onReapCtx_ = ctx;

    // Ask for the most useful flag set first and drop flags one by one as the
    // kernel refuses them: DEFER_TASKRUN needs SINGLE_ISSUER, so it goes first.
    // SQPOLL excludes DEFER_TASKRUN, COOP_TASKRUN and TASKRUN_FLAG (6.x answers EINVAL):
    // the SQ thread issues the requests, so it runs their task work, not the owner.
    const auto flagsFor = [&options](bool sqpoll) {
        unsigned want = 0;
        if (options.singleIssuer) { want |= IORING_SETUP_SINGLE_ISSUER; }
        if (sqpoll) { return want; }
        if (options.singleIssuer && options.deferTaskrun) { want |= IORING_SETUP_DEFER_TASKRUN; }
        if (options.coopTaskrun && !(want & IORING_SETUP_DEFER_TASKRUN)) { want |= IORING_SETUP_COOP_TASKRUN; }
        return want;
    };
    const unsigned dropOrder[] = {IORING_SETUP_DEFER_TASKRUN, IORING_SETUP_COOP_TASKRUN, IORING_SETUP_SINGLE_ISSUER};

    SPINDLE_INJECT(inject::Point::kRingSetup, {
        log::error("io_uring set-up failed (injected): {}", std::strerror(injectedErrno));
        return Error{injectedErrno};
    });
    io_uring_params params{};
    unsigned want = 0;
    // One set-up attempt with `sq` (SQPOLL, SQ_AFF or nothing) kept and the other
    // flags dropped one by one while the kernel answers EINVAL.
    const auto initDropping = [&](unsigned flags, unsigned sq) {
        want = flags;
        int ret = 0;
        for (size_t i = 0;; ++i) {
            std::memset(&params, 0, sizeof(params));
            // TASKRUN_FLAG needs COOP_TASKRUN; it rides along with it and is dropped with it.
            const bool taskrunFlag = options.taskrunFlag && (want & IORING_SETUP_COOP_TASKRUN) != 0;
            params.flags = want | sq | (taskrunFlag ? IORING_SETUP_TASKRUN_FLAG : 0u);
            params.sq_thread_idle = options.sqThreadIdleMs;
            params.sq_thread_cpu = options.sqThreadCpu >= 0 ? static_cast<unsigned>(options.sqThreadCpu) : 0u;
            ret = io_uring_queue_init_params(options.entries, &ring_, &params);
            if (ret != -EINVAL || want == 0) { break; }
            // Find the next flag we still hold and drop it; COOP_TASKRUN is the useful
            // fallback once DEFER_TASKRUN is gone.
            while (i < 3 && !(want & dropOrder[i])) { ++i; }
            if (i >= 3) {
                want = 0;
            } else {
                if (dropOrder[i] == IORING_SETUP_DEFER_TASKRUN && options.coopTaskrun) {
                    want |= IORING_SETUP_COOP_TASKRUN;
                }
                want &= ~dropOrder[i];
            }
            log::info("io_uring set-up refused flags; retrying with 0x{:x}", want | sq);
        }
        return ret;
    };
    int ret = -EINVAL;
    bool sqpoll = false;
    if (options.sqpoll) {
        // SQPOLL, pinned next to the owner where a CPU was given; then unpinned; then none.
        bool injected = false;
        SPINDLE_INJECT(inject::Point::kSqpollSetup, {
            injected = true;
            log::warn("io_uring SQPOLL refused (injected): {}; the ring runs without an SQ thread",
                      std::strerror(injectedErrno));
        });
        if (!injected) {
            if (options.sqThreadCpu >= 0) {
                ret = initDropping(flagsFor(true), IORING_SETUP_SQPOLL | IORING_SETUP_SQ_AFF);
                if (ret < 0) {
                    log::warn("io_uring SQPOLL with its thread on CPU {} refused: {}; trying an unpinned SQ thread",
                              options.sqThreadCpu, std::strerror(-ret));
                }
            }
            if (ret < 0) { ret = initDropping(flagsFor(true), IORING_SETUP_SQPOLL); }
            if (ret < 0) {
                log::warn("io_uring SQPOLL refused: {} (it needs Linux 5.11 unprivileged, 5.4 with CAP_SYS_ADMIN); "
                          "the ring runs without an SQ thread",
                          std::strerror(-ret));
            }
            sqpoll = ret >= 0;
        }
    }
    if (!sqpoll) { ret = initDropping(flagsFor(false), 0); }
    if (ret < 0) {
        rlimit lim{};
        ::getrlimit(RLIMIT_MEMLOCK, &lim);
        log::error("io_uring_queue_init_params({} entries, flags 0x{:x}) failed: {} (RLIMIT_MEMLOCK soft={} bytes; "
                   "io_uring may also be disabled by seccomp or kernel.io_uring_disabled)",
                   options.entries, want, std::strerror(-ret), static_cast<long long>(lim.rlim_cur));
        ring_ = io_uring{};
        return Error{-ret};
    }
    if (!(params.features & IORING_FEAT_NODROP)) {
        log::error("io_uring lacks IORING_FEAT_NODROP (kernel 5.5+): completions could be lost; refusing to run");
        io_uring_queue_exit(&ring_);
        ring_ = io_uring{};
        return Error{ENOTSUP};
    }

    features_ = RingFeatures{};
    features_.singleIssuer = (params.flags & IORING_SETUP_SINGLE_ISSUER) != 0;
    features_.deferTaskrun = (params.flags & IORING_SETUP_DEFER_TASKRUN) != 0;
    features_.coopTaskrun = (params.flags & IORING_SETUP_COOP_TASKRUN) != 0;
    features_.taskrunFlag = (params.flags & IORING_SETUP_TASKRUN_FLAG) != 0;
    features_.sqpoll = (params.flags & IORING_SETUP_SQPOLL) != 0;
    features_.sqThreadCpu =
        features_.sqpoll && (params.flags & IORING_SETUP_SQ_AFF) != 0 ? static_cast<int>(params.sq_thread_cpu) : -1;
    features_.extArg = (params.features & IORING_FEAT_EXT_ARG) != 0;
    features_.sqEntries = params.sq_entries;
    features_.cqEntries = params.cq_entries;
    if (io_uring_probe* probe = io_uring_get_probe_ring(&ring_)) {
        features_.msgRing = io_uring_opcode_supported(probe, IORING_OP_MSG_RING) != 0;
        // ASYNC_CANCEL_ANY came with the 5.19 cancel rework, alongside SOCKET (5.19).
        features_.cancelAny = io_uring_opcode_supported(probe, IORING_OP_SOCKET) != 0;
        io_uring_free_probe(probe);
    }
    log::debug("io_uring ready: {}", features_.describe());
    return {};
}

unsigned Ring::pending() const noexcept { return io_uring_sq_ready(&ring_); }

bool Ring::overflowed() const noexcept { return IO_URING_READ_ONCE(*ring_.sq.kflags) & IORING_SQ_CQ_OVERFLOW; }

bool Ring::needsEnter() const noexcept {
    return IO_URING_READ_ONCE(*ring_.sq.kflags) & (IORING_SQ_CQ_OVERFLOW | IORING_SQ_TASKRUN);
}

io_uring_sqe* Ring::acquireSqe() noexcept {
    for (;;) {
        if (io_uring_sqe* sqe = io_uring_get_sqe(&ring_)) { return sqe; }
        RingStats::bump(stats_.sqFull);
        int ret = submit(false);
        if (ret < 0 && ret != -EBUSY && ret != -EAGAIN) {
            // The SQ cannot drain: the ring is unusable (EBADR would mean lost CQEs).
            log::error("io_uring submit failed with the SQ full: {}", std::strerror(-ret));
            SPINDLE_CHECK_MSG(false, "io_uring submission failed while the SQ was full");
        }
    }
}

void Ring::reserveSqes(unsigned n) noexcept {
    SPINDLE_ASSERT(n <= features_.sqEntries);
    while (io_uring_sq_space_left(&ring_) < n) {
        RingStats::bump(stats_.sqFull);
        int ret = submit(false);
        if (ret < 0 && ret != -EBUSY && ret != -EAGAIN) {
            log::error("io_uring submit failed with the SQ full: {}", std::strerror(-ret));
            SPINDLE_CHECK_MSG(false, "io_uring submission failed while the SQ was full");
        }
    }
}

void Ring::reapIntoHandler() noexcept {
    SPINDLE_CHECK(onReap_ != nullptr);
    reap([this](const io_uring_cqe* cqe) { onReap_(onReapCtx_, cqe); });
}

int Ring::enter(bool wait, const __kernel_timespec* timeout) noexcept {
    RingStats::bump(stats_.enters);
    if (!wait) {
        return features_.deferTaskrun ? io_uring_submit_and_get_events(&ring_) : io_uring_submit(&ring_);
    }
    io_uring_cqe* cqe = nullptr;
    if (timeout != nullptr) {
        return io_uring_submit_and_wait_timeout(&ring_, &cqe, 1, const_cast<__kernel_timespec*>(timeout), nullptr);
    }
    return io_uring_submit_and_wait(&ring_, 1);
}

int Ring::submit(bool getEvents) noexcept {
    unsigned queued = pending();
    if (queued == 0 && !(getEvents && features_.deferTaskrun) && !needsEnter()) { return 0; }
    for (;;) {
        int ret = enter(false, nullptr);
        if (ret >= 0) {
            RingStats::bump(stats_.sqesSubmitted, static_cast<unsigned>(ret));
            return ret;
        }
        if (ret == -EINTR) { continue; }
        if (ret == -EBUSY || ret == -EAGAIN) {
            // The kernel holds completions we have not reaped (NODROP backlog) or
            // is short of memory for requests: make room, then try again.
            RingStats::bump(stats_.busyRetries);
            reapIntoHandler();
            continue;
        }
        return ret;
    }
}

int Ring::submitAndWait(const __kernel_timespec* timeout) noexcept {
    for (;;) {
        unsigned queued = pending();
        int ret = enter(true, timeout);
        if (ret >= 0) {
            RingStats::bump(stats_.sqesSubmitted, queued);
            return 0;
        }
        if (ret == -EBUSY || ret == -EAGAIN) {
            RingStats::bump(stats_.busyRetries);
            reapIntoHandler();
            return 0;  // reaping produced work; the caller looks again
        }
        return ret;
    }
}

}  // namespace spindle::uring
