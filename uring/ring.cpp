#include "uring/ring.h"

#include <sys/resource.h>

#include <cerrno>
#include <cstring>

#include "base/log.h"
#include "uring/inject.h"

namespace spindle::uring {

std::string RingFeatures::describe() const {
    return fmt::format("sq={} cq={} single_issuer={} defer_taskrun={} coop_taskrun={} msg_ring={} cancel_any={} ext_arg={}",
                       sqEntries, cqEntries, singleIssuer, deferTaskrun, coopTaskrun, msgRing, cancelAny, extArg);
}

Ring::~Ring() { close(); }

Result<void> Ring::registerBuffers(const iovec* iov, unsigned count) noexcept {
    SPINDLE_INJECT(inject::Point::kRegisterBuffers, { return Error{injectedErrno}; });
    const int r = io_uring_register_buffers(&ring_, iov, count);
    if (r < 0) { return errorFromRes(r); }
    return {};
}

Result<void> Ring::unregisterBuffers() noexcept {
    const int r = io_uring_unregister_buffers(&ring_);
    if (r < 0) { return errorFromRes(r); }
    return {};
}

Result<void> Ring::registerFilesSparse(unsigned slots) noexcept {
    SPINDLE_INJECT(inject::Point::kRegisterFiles, { return Error{injectedErrno}; });
    const int r = io_uring_register_files_sparse(&ring_, slots);
    if (r < 0) { return errorFromRes(r); }
    return {};
}

Result<void> Ring::updateFile(unsigned slot, int fd) noexcept {
    int one = fd;
    const int r = io_uring_register_files_update(&ring_, slot, &one, 1);
    if (r < 0) { return errorFromRes(r); }
    // The kernel reports how many slots it updated; fewer than asked means it stopped at an error.
    if (r != 1) { return Error{EINVAL}; }
    return {};
}

Result<void> Ring::unregisterFiles() noexcept {
    const int r = io_uring_unregister_files(&ring_);
    if (r < 0) { return errorFromRes(r); }
    return {};
}

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
    unsigned want = 0;
    if (options.singleIssuer) { want |= IORING_SETUP_SINGLE_ISSUER; }
    if (options.singleIssuer && options.deferTaskrun) { want |= IORING_SETUP_DEFER_TASKRUN; }
    if (options.coopTaskrun && !(want & IORING_SETUP_DEFER_TASKRUN)) { want |= IORING_SETUP_COOP_TASKRUN; }
    const unsigned dropOrder[] = {IORING_SETUP_DEFER_TASKRUN, IORING_SETUP_COOP_TASKRUN, IORING_SETUP_SINGLE_ISSUER};

    SPINDLE_INJECT(inject::Point::kRingSetup, {
        log::error("io_uring set-up failed (injected): {}", std::strerror(injectedErrno));
        return Error{injectedErrno};
    });
    io_uring_params params{};
    int ret = 0;
    for (size_t i = 0;; ++i) {
        std::memset(&params, 0, sizeof(params));
        params.flags = want;
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
        log::info("io_uring set-up refused flags; retrying with 0x{:x}", want);
    }
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
    if (queued == 0 && !(getEvents && features_.deferTaskrun) && !overflowed()) { return 0; }
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
