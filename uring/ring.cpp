// SPDX-License-Identifier: Apache-2.0
#include "uring/ring.h"

#include <sys/resource.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <vector>

#include "base/counter.h"
#include "base/log.h"
#include "uring/inject.h"

namespace spindle::uring {

std::string RingFeatures::describe() const {
    return fmt::format("sq={} cq={} single_issuer={} defer_taskrun={} coop_taskrun={} taskrun_flag={} sqpoll={} "
                       "sq_thread_cpu={} msg_ring={} cancel_any={} ext_arg={}",
                       sqEntries, cqEntries, singleIssuer, deferTaskrun, coopTaskrun, taskrunFlag, sqpoll,
                       sqThreadCpu, msgRing, cancelAny, extArg);
}

// Fault injection state (uring/inject.h); defined here so that ~Ring can delete it.
struct Ring::FaultState {
    enum class Kind : uint8_t { kFail, kShort };
    /// What to do to the CQE that carries `userData`: replace its res (kFail), or maybe shorten it (kShort).
    struct Rewrite {
        uint64_t userData;
        int32_t res;
        Kind kind;
    };
    /// A CQE copied out of the CQ, delivered once passesLeft reaches 0.
    struct Held {
        uint64_t userData;
        int32_t res;
        uint32_t flags;
        uint32_t passesLeft;
    };
    std::vector<Rewrite> rewrites;  // few at a time: searched linearly
    std::vector<Held> held;
    // True while the submit walk is inside a chain (IOSQE_IO_LINK) whose head was failed; a chain
    // may go on into the next submission.
    bool chainFailing = false;

    [[nodiscard]] bool live() const noexcept { return !rewrites.empty() || !held.empty() || chainFailing; }
};

Ring::~Ring() {
    close();
    delete faults_;
}

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

Result<void> Ring::registerBufRing(io_uring_buf_ring* ring, unsigned entries, uint16_t bgid, uint16_t flags) noexcept {
    SPINDLE_INJECT(inject::Point::kRegisterBufRing, { return Error{injectedErrno}; });
    io_uring_buf_reg reg{};
    reg.ring_addr = reinterpret_cast<uint64_t>(ring);
    reg.ring_entries = entries;
    reg.bgid = bgid;
    // The 16 bits after `bgid`: `flags` in the uapi since 6.12, `pad` in liburing 2.3's copy of it;
    // written by offset so that both headers compile.
    std::memcpy(reinterpret_cast<char*>(&reg) + offsetof(io_uring_buf_reg, bgid) + sizeof(reg.bgid), &flags,
                sizeof flags);
    const int r = io_uring_register_buf_ring(&ring_, &reg, 0);
    if (r < 0) { return errorFromRes(r); }
    return {};
}

Result<void> Ring::unregisterBufRing(uint16_t bgid) noexcept {
    const int r = io_uring_unregister_buf_ring(&ring_, bgid);
    if (r < 0) { return errorFromRes(r); }
    return {};
}

Result<void> Ring::setWorkerAffinity(const cpu_set_t& cpus) noexcept {
    SPINDLE_INJECT(inject::Point::kRegisterIowqAff, { return Error{injectedErrno}; });
    const int r = io_uring_register_iowq_aff(&ring_, sizeof cpus, &cpus);
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
            // TASKRUN_FLAG needs COOP_TASKRUN or DEFER_TASKRUN (6.1 accepts it with either); it rides
            // along with them and is dropped with the last of them.
            const bool taskrunFlag =
                options.taskrunFlag && (want & (IORING_SETUP_COOP_TASKRUN | IORING_SETUP_DEFER_TASKRUN)) != 0;
            params.flags = want | sq | (taskrunFlag ? IORING_SETUP_TASKRUN_FLAG : 0u) | IORING_SETUP_CQSIZE;
            params.cq_entries = options.cqEntries != 0 ? options.cqEntries : std::max(2 * options.entries, 4096u);
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

unsigned Ring::cqReady() const noexcept { return io_uring_cq_ready(&ring_); }

bool Ring::overflowed() const noexcept { return IO_URING_READ_ONCE(*ring_.sq.kflags) & IORING_SQ_CQ_OVERFLOW; }

bool Ring::needsEnter() const noexcept {
    return IO_URING_READ_ONCE(*ring_.sq.kflags) & (IORING_SQ_CQ_OVERFLOW | IORING_SQ_TASKRUN);
}

io_uring_sqe* Ring::acquireSqe() noexcept {
#if defined(SPINDLE_FAULT_INJECTION)
    // kSqFull: take the SQ-full path once, as if io_uring_get_sqe had found no room.
    if (injectSqFull_ && sqFullInjected()) { onSqFull(); }
#endif
    for (;;) {
        if (io_uring_sqe* sqe = io_uring_get_sqe(&ring_)) { return sqe; }
        onSqFull();
    }
}

void Ring::onSqFull() noexcept {
    ownerAdd(stats_.sqFull);
    int ret = submit(false);
    if (ret < 0 && ret != -EBUSY && ret != -EAGAIN) {
        // The SQ cannot drain: the ring is unusable (EBADR would mean lost CQEs).
        log::error("io_uring submit failed with the SQ full: {}", std::strerror(-ret));
        SPINDLE_CHECK_MSG(false, "io_uring submission failed while the SQ was full");
    }
}

void Ring::reserveSqes(unsigned n) noexcept {
    SPINDLE_ASSERT(n <= features_.sqEntries);
    while (io_uring_sq_space_left(&ring_) < n) {
        ownerAdd(stats_.sqFull);
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
    ownerAdd(stats_.enters);
#if defined(SPINDLE_FAULT_INJECTION)
    // Disarmed: one relaxed load of a global and one member test per submission.
    const uint32_t armed = inject::armedMask();
    injectSqFull_ = (armed & inject::bit(inject::Point::kSqFull)) != 0;
    if ((armed & (inject::bit(inject::Point::kSubmitFail) | inject::bit(inject::Point::kShortIo))) != 0 ||
        faultsLive_) [[unlikely]] {
        applySubmitFaults(armed);
    }
#endif
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
    // With DEFER_TASKRUN, completions wait as task work until an enter runs it. TASKRUN_FLAG says when
    // some does (IORING_SQ_TASKRUN, in needsEnter()); without it, a caller asking for events must enter.
    const bool blindDefer = getEvents && features_.deferTaskrun && !features_.taskrunFlag;
    if (queued == 0 && !blindDefer && !needsEnter()) { return 0; }
    for (;;) {
        int ret = enter(false, nullptr);
        if (ret >= 0) {
            ownerAdd(stats_.sqesSubmitted, static_cast<unsigned>(ret));
            return ret;
        }
        if (ret == -EINTR) { continue; }
        if (ret == -EBUSY || ret == -EAGAIN) {
            // The kernel holds completions we have not reaped (NODROP backlog) or
            // is short of memory for requests: make room, then try again.
            ownerAdd(stats_.busyRetries);
            reapIntoHandler();
            continue;
        }
        return ret;
    }
}

int Ring::submitAndWait(const __kernel_timespec* timeout) noexcept {
    SPINDLE_INJECT(inject::Point::kEnterFail, { return -injectedErrno; });
#if defined(SPINDLE_FAULT_INJECTION)
    // A held CQE is a completion someone waits for: never sleep on it. Make them all due and
    // only submit, so that the caller's next reap delivers them.
    if (faultsLive_ && releaseHeldCqes()) {
        const int ret = submit(true);
        return ret < 0 ? ret : 0;
    }
#endif
    for (;;) {
        unsigned queued = pending();
        int ret = enter(true, timeout);
        if (ret >= 0) {
            ownerAdd(stats_.sqesSubmitted, queued);
            return 0;
        }
        if (ret == -EBUSY || ret == -EAGAIN) {
            ownerAdd(stats_.busyRetries);
            reapIntoHandler();
            return 0;  // reaping produced work; the caller looks again
        }
        return ret;
    }
}

// ---- fault injection (uring/inject.h) --------------------------------------------------------------------

namespace {

// Only the operations a caller waits on take faults; the runtime's own SQEs never do.
bool waitedOn(uint64_t userData) noexcept {
    return userData != 0 && (userData & kNoFaultMask) == 0;
}

bool isReadWrite(uint8_t opcode) noexcept {
    switch (opcode) {
        case IORING_OP_READ:
        case IORING_OP_WRITE:
        case IORING_OP_READV:
        case IORING_OP_WRITEV:
        case IORING_OP_READ_FIXED:
        case IORING_OP_WRITE_FIXED:
            return true;
        default:
            return false;
    }
}

// Whether a short count reported for this read or write is one the kernel could legally give and a
// retry loop recovers from: an explicit offset on a regular file or block device.
bool canShorten(const io_uring_sqe* sqe) noexcept {
    if (!isReadWrite(sqe->opcode) || sqe->off == ~uint64_t{0} || (sqe->flags & IOSQE_FIXED_FILE) != 0) {
        return false;
    }
    struct stat st {};
    if (::fstat(sqe->fd, &st) != 0) { return false; }
    return S_ISREG(st.st_mode) || S_ISBLK(st.st_mode);
}

// Turns `sqe` into a NOP with the same user_data and chain flags: no side effect, and a CQE that
// always comes (CQE_SKIP_SUCCESS dropped).
void makeNop(io_uring_sqe* sqe) noexcept {
    const uint64_t userData = sqe->user_data;
    const uint8_t keep = sqe->flags & (IOSQE_IO_LINK | IOSQE_IO_HARDLINK | IOSQE_IO_DRAIN);
    io_uring_prep_nop(sqe);
    sqe->flags = keep;
    sqe->user_data = userData;
}

}  // namespace

Ring::FaultState& Ring::faults() noexcept {
    if (faults_ == nullptr) { faults_ = new FaultState; }
    return *faults_;
}

void Ring::applySubmitFaults(uint32_t armed) noexcept {
    FaultState& fs = faults();
    io_uring_sq& sq = ring_.sq;
    const unsigned shift = (ring_.flags & IORING_SETUP_SQE128) != 0 ? 1 : 0;
    // [sqe_head, sqe_tail) are the SQEs filled since the last flush to the kernel: each is seen once.
    for (unsigned i = sq.sqe_head; i != sq.sqe_tail; ++i) {
        io_uring_sqe* sqe = &sq.sqes[(i & sq.ring_mask) << shift];
        const bool links = (sqe->flags & (IOSQE_IO_LINK | IOSQE_IO_HARDLINK)) != 0;
        if (fs.chainFailing) {
            // The rest of a failed chain fails as the kernel fails a broken chain. A linked timeout stays:
            // the NOP before it completes at once and cancels it.
            if (sqe->opcode != IORING_OP_LINK_TIMEOUT) {
                if (waitedOn(sqe->user_data)) { fs.rewrites.push_back({sqe->user_data, -ECANCELED, FaultState::Kind::kFail}); }
                makeNop(sqe);
            }
            fs.chainFailing = links;
            continue;
        }
        if (!waitedOn(sqe->user_data) || sqe->opcode == IORING_OP_LINK_TIMEOUT) { continue; }
        if ((armed & inject::bit(inject::Point::kSubmitFail)) != 0) {
            if (const int err = inject::take(inject::Point::kSubmitFail); err != 0) {
                fs.rewrites.push_back({sqe->user_data, -err, FaultState::Kind::kFail});
                makeNop(sqe);
                fs.chainFailing = links;
                continue;
            }
        }
        if ((armed & inject::bit(inject::Point::kShortIo)) != 0 && canShorten(sqe)) {
            fs.rewrites.push_back({sqe->user_data, 0, FaultState::Kind::kShort});
        }
    }
    faultsLive_ = fs.live();
}

bool Ring::sqFullInjected() noexcept {
    // Never between the members of a chain: reserveSqes() promised the chain one submission.
    io_uring_sq& sq = ring_.sq;
    if (sq.sqe_tail != sq.sqe_head) {
        const unsigned shift = (ring_.flags & IORING_SETUP_SQE128) != 0 ? 1 : 0;
        const io_uring_sqe* last = &sq.sqes[((sq.sqe_tail - 1) & sq.ring_mask) << shift];
        if ((last->flags & (IOSQE_IO_LINK | IOSQE_IO_HARDLINK)) != 0) { return false; }
    }
    return inject::take(inject::Point::kSqFull) != 0;
}

void Ring::beginFaultReap() noexcept {
    if (faults_ == nullptr) { return; }
    for (FaultState::Held& h : faults_->held) {
        if (h.passesLeft > 0) { --h.passesLeft; }
    }
}

bool Ring::filterCqe(const io_uring_cqe* in, io_uring_cqe* out) noexcept {
    out->user_data = in->user_data;
    out->res = in->res;
    out->flags = in->flags;
    if (!waitedOn(in->user_data)) { return true; }
    FaultState& fs = faults();
    for (size_t i = 0; i < fs.rewrites.size(); ++i) {
        if (fs.rewrites[i].userData != in->user_data) { continue; }
        const FaultState::Rewrite r = fs.rewrites[i];
        fs.rewrites[i] = fs.rewrites.back();
        fs.rewrites.pop_back();
        if (r.kind == FaultState::Kind::kFail) {
            out->res = r.res;
        } else if (out->res >= 2) {
            if (const int divisor = inject::take(inject::Point::kShortIo); divisor != 0) {
                const int32_t shorter = out->res / divisor;
                out->res = shorter >= 1 ? shorter : 1;
            }
        }
        break;
    }
    bool deliver = true;
    if ((inject::armedMask() & inject::bit(inject::Point::kDelayCompletion)) != 0) {
        if (const int passes = inject::take(inject::Point::kDelayCompletion); passes != 0) {
            fs.held.push_back({out->user_data, out->res, out->flags, static_cast<uint32_t>(passes)});
            deliver = false;
        }
    }
    faultsLive_ = fs.live();
    return deliver;
}

bool Ring::takeDueCqe(io_uring_cqe* out) noexcept {
    if (faults_ == nullptr) { return false; }
    std::vector<FaultState::Held>& held = faults_->held;
    for (size_t i = 0; i < held.size(); ++i) {
        if (held[i].passesLeft != 0) { continue; }
        out->user_data = held[i].userData;
        out->res = held[i].res;
        out->flags = held[i].flags;
        held.erase(held.begin() + static_cast<std::ptrdiff_t>(i));  // keeps the held ones in order
        faultsLive_ = faults_->live();
        return true;
    }
    return false;
}

bool Ring::releaseHeldCqes() noexcept {
    if (faults_ == nullptr || faults_->held.empty()) { return false; }
    for (FaultState::Held& h : faults_->held) { h.passesLeft = 0; }
    return true;
}

}  // namespace spindle::uring
