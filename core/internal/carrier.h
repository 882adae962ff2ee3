// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Carrier: one OS thread, bound to one PU, that runs fibers and owns one I/O driver.
///
/// It owns a Chase-Lev deque of runnable fibers (owner LIFO, thieves FIFO), an
/// owner-only FIFO for fibers that yielded or are pinned, an MPSC inbox for
/// work sent by other threads, a deadline heap, a stack pool, its pollers and
/// its driver (core/driver/driver.h: an io_uring ring or an epoll set), which
/// does everything kernel-facing.
///
/// The loop: run local work; every kMaintenanceInterval fibers, or when out of
/// work, do maintenance (drain the inbox, let the driver submit and deliver
/// completions, expire timers, run the pollers); then steal; then, as the poll
/// mode says, park in the driver with the nearest deadline as the timeout
/// (kBlock), spin back into maintenance (kSpin), or spin for a while, then park
/// (kHybrid).
///
/// Thread-safety: everything is owner-only except post() (any thread), the
/// deque's steal side, parked_, and the stats (read racily).

#include <sched.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "base/counter.h"
#include "base/result.h"
#include "core/driver/driver.h"
#include "core/driver/uring_driver.h"
#include "core/poller.h"
#include "core/internal/chase_lev_deque.h"
#include "core/internal/deadline_heap.h"
#include "core/internal/fiber.h"
#include "core/internal/fixed_pool.h"
#include "core/internal/mpsc_queue.h"
#include "core/internal/stack_overflow.h"
#include "core/internal/stack_pool.h"
#include "core/internal/steal_policy.h"
#include "core/runtime.h"
#include "numa/topology.h"
#include "uring/ring.h"

namespace spindle::detail {

class RuntimeImpl;

/// A sleep or a waitWithTimeout's deadline, in the owner carrier's heap.
struct TimerEntry : HeapNode {
    FiberFuture* fired = nullptr;  // set(0) on expiry, set(-ECANCELED) on cancel/shutdown
    class Carrier* owner = nullptr;
    Fiber* waiter = nullptr;       // a fiber in a cancellable wait on this entry: its waitOn_ is cleared on firing
    Message cancelMsg;             // kCancelTimer, for a cancel from another thread
    FiberFuture cancelAck;         // set by the owner once it no longer touches this entry
};

struct CarrierConfig {
    unsigned index = 0;
    int pu = -1;                  // OS index to bind to; -1: do not bind
    int logicalPu = -1;           // the PU it stands for in the topology, bound or not (simulation); -1: none
    Backend backend = Backend::kUring;  // resolved: kUring or kEpoll
    uring::RingOptions ring;
    unsigned fixedBufferCount = 0;  // registered buffers (RuntimeOptions::fixedBufferCount)
    size_t fixedBufferSize = 0;
    unsigned fixedFileSlots = 0;    // registered-file table size (RuntimeOptions::fixedFileSlots)
    PollMode pollMode = PollMode::kBlock;
    uint64_t spinNs = 50'000;     // kHybrid: how long an idle spell spins before parking
    unsigned node = 0;            // logical NUMA node of logicalPu (0 without a topology)
    StealPolicy stealPolicy = StealPolicy::kNuma;
    unsigned crossNodeThreshold = 2;  // RuntimeOptions::crossNodeStealThreshold
    cpu_set_t workerCpus{};       // RuntimeOptions::workerCpus: where the ring's io-wq workers go (empty: left be)
};

class alignas(64) Carrier {
public:
    static constexpr unsigned kMaintenanceInterval = 64;
    /// Inline completions a fiber may have in one run before afterInlineCompletion() yields.
    static constexpr unsigned kInlineBudget = 8;
    /// How much of a queued fiber's stack, from its saved stack pointer up, is prefetched one pop before
    /// it runs: the frames its resumption returns through (the switch, the wait, the I/O call). With
    /// 1,000 HTTP connections on one carrier (epoll backend), 1.15 against 1.30 µs of user CPU per
    /// request (medians of 7 runs); no change at 100 (docs/PERFORMANCE-HISTORY.md).
    static constexpr size_t kResumePrefetchBytes = 1024;
    /// ... and below it, for writing: the frames its next calls push (a connection fiber woken by a
    /// receive goes on to send, through frames deeper than the ones it parked in). With 1,000
    /// connections on one carrier (io_uring), user CPU per request 1.28 against 1.43 µs for
    /// spindle-httpd and per message 0.96 against 1.09 µs for spindle-echo (medians of 6 and 8
    /// alternating runs, 2026-11-27); the same at 10 connections (docs/PERFORMANCE-HISTORY.md).
    static constexpr size_t kResumePrefetchBelowBytes = 512;

    Carrier(RuntimeImpl* runtime, const CarrierConfig& config) noexcept;
    ~Carrier();
    Carrier(const Carrier&) = delete;
    Carrier& operator=(const Carrier&) = delete;

    /// The carrier of the calling thread, or nullptr. Never inlined, so that a
    /// fiber that moved to another thread reads its new thread's value.
    static Carrier* current() noexcept;

    /// Starts the thread; returns once it is running its loop, or its set-up error.
    Result<void> start() noexcept;
    void joinThread() noexcept;

    [[nodiscard]] unsigned index() const noexcept { return config_.index; }
    [[nodiscard]] RuntimeImpl* runtime() const noexcept { return runtime_; }
    [[nodiscard]] Fiber* running() const noexcept { return current_; }
    [[nodiscard]] StackPool& stackPool() noexcept { return pool_; }
    [[nodiscard]] Driver& driver() noexcept { return *driver_; }
    /// driver().start(req), without the virtual call on io_uring (whose start() inlines here).
    int32_t startIo(op::IoRequest* req) noexcept {
        return uring_ != nullptr ? uring_->UringDriver::start(req) : driver_->start(req);
    }
    /// Whether the driver is the io_uring one (false: a readiness driver, which tries each call at once).
    [[nodiscard]] bool onRing() const noexcept { return uring_ != nullptr; }
    /// The io_uring ring, for registrations; null on the epoll backend.
    [[nodiscard]] uring::Ring* ring() noexcept { return driver_->ring(); }
    /// This carrier's registered buffers and files (core/fixed.h); see core/internal/fixed_pool.h.
    [[nodiscard]] FixedBufferPool& fixedBuffers() noexcept { return fixedBuffers_; }
    [[nodiscard]] FixedFileTable& fixedFiles() noexcept { return fixedFiles_; }
    /// Whether the runtime is shutting down (one relaxed load).
    [[nodiscard]] bool stopping() const noexcept { return stoppingFlag_->load(std::memory_order_relaxed); }

    // --- scheduling ---
    /// Makes a fiber runnable here. Precondition: on this carrier's thread.
    void pushReady(Fiber* fiber) noexcept;
    /// Queues a fiber that yielded behind the other runnable ones (owner thread).
    void pushYielded(Fiber* fiber) noexcept;
    /// Hands a message to this carrier from any thread and wakes it if parked.
    void post(Message* message) noexcept;
    /// Asks the driver to end `req` early (see Driver::cancel). Precondition: on this carrier's thread.
    void cancelOpHere(op::IoRequest* req) noexcept { driver_->cancel(req); }
    /// Wakes this carrier if it is parked (any thread).
    void wake() noexcept;
    /// Switches the running fiber out and runs `action` on the scheduler.
    /// Call only through detail::suspend(); `this` is stale after it returns.
    static void suspendRunning(SuspendAction action) noexcept;
    /// Lets the other runnable fibers here run first (this_fiber::yield). Precondition: on a fiber.
    void yieldRunning() noexcept;
    /// An I/O call completed without parking (a readiness driver's first try). As a parked call would
    /// have, it lets the carrier's other work (ready fibers, a due timer, the inbox, the driver's
    /// events) have a turn, but only every kInlineBudget such calls in one run of the fiber, so a
    /// fiber whose sockets always have room cannot starve the rest while a request's reply (a send, then
    /// a wait for the next request) costs no extra switch. A yield after every one cost the epoll
    /// backend an extra round of switches per message: at 1,000 echo connections, 1.6 against 0.9 µs of
    /// user CPU per message (docs/PERFORMANCE.md). Precondition: on a fiber of this carrier.
    void afterInlineCompletion() noexcept {
        if (++inlineRun_ >= kInlineBudget && !otherwiseIdle()) { yieldRunning(); }
    }
    /// The last switch of a finished fiber.
    [[noreturn]] static void exitRunning() noexcept;
    /// The first thing a new fiber does on its own stack.
    static void onFiberStart() noexcept;

    /// Whether the running fiber is all there is to do here: nothing else ready to run, no message
    /// waiting, no SQE to submit, no CQE or task work to reap, no timer due (owner thread; see
    /// spindle::carrierOtherwiseIdle).
    [[nodiscard]] bool otherwiseIdle() noexcept;

    // --- pollers ---
    /// Registers `poller`, which the loop runs every turn from now on (owner thread). See Poller.
    void addPoller(Poller* poller) noexcept;
    /// Unregisters it; it is not called again once this returns (owner thread).
    void removePoller(Poller* poller) noexcept;

    /// Ends `fiber`'s cancellable wait on this carrier early: queues an ASYNC_CANCEL for its I/O, or
    /// fires its timer with -ECANCELED. Precondition: on this carrier's thread, and fiber->waitOn_
    /// names this carrier (kCancelWait handling, or a cancel() made on this carrier).
    void cancelWaitHere(Fiber* fiber) noexcept;
    /// The carrier's side of a cancel() posted from elsewhere (fiber->cancelMsg_): ends the wait if it
    /// is still on here, passes the message on if the fiber now waits elsewhere. Owner thread.
    void handleCancelWait(Fiber* fiber) noexcept;

    // --- timers ---
    /// Arms `entry` to fire at `deadlineNs`. Returns 0, or (nothing armed) ECANCELED during shutdown,
    /// ENOMEM when the timer heap cannot grow.
    [[nodiscard]] int addTimer(TimerEntry* entry, uint64_t deadlineNs) noexcept;
    /// Disarms `entry` from any thread; returns once the owner no longer touches it.
    /// Afterwards entry->fired is set (0 if it had fired, -ECANCELED if disarmed).
    static void cancelTimer(TimerEntry* entry) noexcept;

    // --- stealing and parking (called by other carriers) ---
    Fiber* stealOne() noexcept;
    [[nodiscard]] bool hasStealable() const noexcept { return !deque_.emptyApprox(); }
    /// Runnable fibers queued here (owner's view; approximate for others).
    [[nodiscard]] size_t queuedApprox() const noexcept { return deque_.sizeApprox(); }
    [[nodiscard]] bool isParked() const noexcept { return parked_.load(std::memory_order_seq_cst); }
    /// Claims the right to wake this parked carrier (one waker wins).
    bool claimWake() noexcept { return parked_.load(std::memory_order_seq_cst) && parked_.exchange(false); }
    /// Installs the victim list. Precondition: before start(); `victims` sorted nearest first.
    void setVictims(std::vector<StealVictim> victims) noexcept;
    [[nodiscard]] const std::vector<StealVictim>& victims() const noexcept { return victims_; }
    /// Whether this carrier's policy lets it take a fiber from `victim` now (any thread; racy by nature):
    /// what a waker asks before waking a parked carrier for the work `victim` has queued.
    [[nodiscard]] bool mayStealFrom(const Carrier* victim) const noexcept;
    [[nodiscard]] unsigned node() const noexcept { return config_.node; }

    // --- introspection (core/introspect.cpp) ---
    /// The fibers that first suspended here and have not ended (Fiber::home_), newest first. Owner-only,
    /// except while the carrier is paused by RuntimeImpl::listFibers.
    [[nodiscard]] Fiber* homeFibers() const noexcept { return homeHead_; }
    /// Makes this carrier `fiber`'s home (Fiber::home_): at the fiber's first suspension, here.
    /// Precondition: on this carrier's thread; not linked yet.
    void linkHome(Fiber* fiber) noexcept {
        fiber->home_ = this;
        fiber->homePrev_ = nullptr;
        fiber->homeNext_ = homeHead_;
        if (homeHead_ != nullptr) { homeHead_->homePrev_ = fiber; }
        homeHead_ = fiber;
    }
    /// CLOCK_MONOTONIC as of this carrier's last maintenance (Fiber::suspendedAtNs_). Owner-only.
    [[nodiscard]] uint64_t coarseNowNs() const noexcept { return coarseNowNs_; }
    /// The fiber running here now, or null (any thread, racy by nature): the stall detector's view, and
    /// fiberRunsOnACarrier's. Written at every switch into a fiber and on the way back to the scheduler.
    [[nodiscard]] const Fiber* runningNow() const noexcept { return runningNow_.load(std::memory_order_relaxed); }
    [[nodiscard]] bool inFiber() const noexcept { return runningNow() != nullptr; }
    [[nodiscard]] pthread_t threadHandle() noexcept { return thread_.native_handle(); }
    /// Its thread's kernel id (gettid), 0 until the thread has started (any thread).
    [[nodiscard]] int threadId() const noexcept { return threadId_.load(std::memory_order_acquire); }
    /// Whether its thread has left its loop for good (any thread).
    [[nodiscard]] bool exited() const noexcept { return exited_.load(std::memory_order_acquire); }
    /// What the stall signal's handler found on this carrier's thread (core/introspect.cpp).
    struct StallSample {
        // The monitor's request (a token, 0: none) and the handler's answer. The handler writes the
        // fields below only after taking the request (exchange to 0), and then stores the token in
        // `done` (release); a monitor that gives up withdraws its request first (CAS), so a signal that
        // comes late writes nothing while the monitor reads a later sample.
        std::atomic<uint32_t> requested{0};
        std::atomic<uint32_t> done{0};
        uint32_t nextToken = 0;          // the monitor's
        uint64_t fiberId = 0;            // 0: no fiber was running when the signal came
        uint64_t fibersRun = 0;          // Stats::fibersRun then: whether it is still the same run
        char name[32] = {};
        int depth = 0;
        int skip = 0;                    // ips[0, skip) are the handler's own frames and the signal frame
        void* ips[48] = {};
    };
    [[nodiscard]] StallSample& stallSample() noexcept { return stallSample_; }

    struct Stats {
        std::atomic<uint64_t> fibersRun{0};
        std::atomic<uint64_t> steals{0};
        std::atomic<uint64_t> parks{0};
        std::atomic<uint64_t> timedParks{0};  // parks with a timeout (a timer, a deadline, a stack scavenge)
        std::atomic<uint64_t> idleSpins{0};   // idle spells begun by spinning (kSpin, kHybrid)
        std::atomic<uint64_t> wakesSent{0};
        std::atomic<uint64_t> cancelsSent{0};  // waits this carrier ended for FiberHandle::cancel()
        std::atomic<uint64_t> fixedIo{0};              // read_fixed/write_fixed through the registered buffer
        std::atomic<uint64_t> fixedFallbackIo{0};      // ... through plain read/write (other carrier, unregistered)
        std::atomic<uint64_t> fixedFileIo{0};          // FixedFile calls through the registered slot
        std::atomic<uint64_t> fixedFileFallbackIo{0};  // ... through the plain fd
        // Indexed by numa::Distance to the victim; see CarrierStats.
        std::array<std::atomic<uint64_t>, numa::kDistanceClassCount> stealAttempts{};
        std::array<std::atomic<uint64_t>, numa::kDistanceClassCount> stealSuccesses{};
        std::atomic<uint64_t> fibersMigrated{0};
        std::atomic<uint64_t> idleNs{0};
        std::atomic<uint64_t> stalls{0};     // fibers reported for running too long without yielding
    };
    [[nodiscard]] const Stats& stats() const noexcept { return stats_; }
    /// The counters, for the owner to bump. Precondition: on this carrier's thread.
    [[nodiscard]] Stats& ownStats() noexcept { return stats_; }
    [[nodiscard]] int boundPu() const noexcept { return boundPu_; }
    /// The topology PU (OS index) this carrier stands for, even when it runs unbound (a synthetic or
    /// XML topology); -1 without a topology. Steal order and distance classes use it.
    [[nodiscard]] int logicalPu() const noexcept { return config_.logicalPu; }
    /// The NUMA node (logical index) its memory comes from: Topology::memoryNodeOf(logicalPu());
    /// -1 without a topology.
    [[nodiscard]] int memoryNode() const noexcept { return memoryNode_; }
    /// Whether its thread's memory policy prefers memoryNode() (set before the ring, so the
    /// kernel's ring memory lands there too). Written once in set-up, before start() returns.
    [[nodiscard]] bool threadMemoryBound() const noexcept { return threadMemoryBound_; }

private:
    void threadMain() noexcept;
    Result<void> setUp() noexcept;
    // Binds its stacks and (when pinned) its thread's memory policy to memoryNode(); logs refusals.
    void setUpNodeMemory() noexcept;
    void tearDown() noexcept;
    void loop() noexcept;
    Fiber* nextLocal() noexcept;
    void runFiber(Fiber* fiber) noexcept;
    // The bookkeeping of a switch into `fiber` (current_, its carrier_ and state, the counters); the
    // switch itself is switchTo() in carrier.cpp.
    void prepareToRun(Fiber* fiber) noexcept;
    void runPendingAction() noexcept;
    void switchAway(Fiber* from, void** fakeStackSave) noexcept;
    /// beforePark: the loop found nothing to run; with a blocking park ahead and nothing to submit,
    /// the ring's completions are left to park()'s own io_uring_enter (reapOwed_) instead of one more.
    void maintenance(bool beforePark = false) noexcept;
    void drainInbox() noexcept;
    // Runs every poller once; returns whether any found work, and (out) whether all allow parking.
    bool runPollers(bool* mayPark) noexcept;
    void expireTimers() noexcept;
    /// Ends a timer wait (owner thread): clears its fiber's cancellable wait, then sets `fired`.
    static void fireTimer(TimerEntry* entry, int32_t res) noexcept;
    void idle() noexcept;
    void endSpin() noexcept;
    void park() noexcept;
    // One stealPass() over victims_ (core/internal/steal_policy.h).
    Fiber* trySteal() noexcept;
    /// Takes a fiber from `victim`, which the policy allowed, counting the attempt and the success.
    Fiber* stealFrom(const StealVictim& victim) noexcept;
    /// Whether trySteal() could find something now (park()'s last look): the same pass, taking nothing.
    bool canStealAny() const noexcept;
    /// A cheap per-carrier xorshift64 (kRandom's victim choice). Owner only.
    uint64_t nextRandom() noexcept;
    /// Adds the idle time since `since` to the stats. Owner only.
    void addIdle(uint64_t since) noexcept;
    void beginShutdown() noexcept;
    bool readyToExit() const noexcept;
    void pushFifo(Fiber* fiber) noexcept;
    Fiber* popFifo() noexcept;
    static void onFiberExit(Fiber* fiber, void* unused);
    // The end of a fiber that died away from its home carrier: on home's thread (a posted msg_).
    static void onAwayExit(Message* m) noexcept;
    static void finishFiber(Fiber* fiber) noexcept;
    void unlinkHome(Fiber* fiber) noexcept {
        if (fiber->homePrev_ != nullptr) {
            fiber->homePrev_->homeNext_ = fiber->homeNext_;
        } else {
            homeHead_ = fiber->homeNext_;
        }
        if (fiber->homeNext_ != nullptr) { fiber->homeNext_->homePrev_ = fiber->homePrev_; }
    }

    // Owner-only hot state.
    Fiber* current_ = nullptr;
    void* schedSp_ = nullptr;
    SuspendAction action_;              // run by whichever context gains control next
    Fiber* actionFiber_ = nullptr;      // the fiber that recorded action_
    unsigned sinceMaintenance_ = 0;
    unsigned inlineRun_ = 0;  // inline completions in the running fiber's current run
    bool preferFifo_ = false;           // alternate between deque and FIFO so neither starves
    // While true, fibers made runnable go to the FIFO: a batch of wake-ups
    // (inbox, CQEs, timers) then runs in the order it happened, not reversed by
    // the deque's LIFO end. Maintenance hands the FIFO to thieves when any idle.
    bool inMaintenance_ = false;
    bool reapOwed_ = false;             // maintenance(true) left the driver's completions to park()
    void settleReap() noexcept;         // does the owed driver poll when the loop did not park after all
    bool shutdownSeen_ = false;
    bool spinning_ = false;             // in an idle spell, polling (counted in runtime_->spinningCount_)
    uint64_t spinSince_ = 0;            // when the current idle spell began (kHybrid)
    void* schedFakeStack_ = nullptr;    // ASan's fake stack of the scheduler context
    Fiber* fifoHead_ = nullptr;         // yielded and pinned fibers, FIFO
    Fiber* fifoTail_ = nullptr;
    ChaseLevDeque<Fiber*> deque_;
    DeadlineHeap timers_;
    std::unique_ptr<Driver> driver_;
    UringDriver* uring_ = nullptr;  // driver_, when it is the io_uring driver (startIo)
    Poller* pollers_ = nullptr;         // intrusive list, owner-only
    StackPool pool_;
    FixedBufferPool fixedBuffers_;
    FixedFileTable fixedFiles_;
    // Sorted nearest first; victims_[0, localVictims_) share this carrier's NUMA node.
    std::vector<StealVictim> victims_;
    size_t localVictims_ = 0;
    uint64_t rng_ = 0;                  // xorshift64 state, never 0
    Fiber* homeHead_ = nullptr;         // see homeFibers()
    uint64_t coarseNowNs_ = 0;          // see coarseNowNs()

    // Shared with other threads.
    alignas(64) IntrusiveMpscQueue inbox_;
    // Credits of the runtime's live count (RuntimeImpl::admitFiber): written by this carrier's thread
    // only, read by RuntimeImpl::liveFibers() from any thread.
    std::atomic<uint32_t> liveCredits_{0};
    friend class RuntimeImpl;
    alignas(64) std::atomic<bool> parked_{false};
    Stats stats_;
    std::atomic<const Fiber*> runningNow_{nullptr};  // owner-written beside the counters; see runningNow()
    std::atomic<bool> exited_{true};    // false from start() until threadMain ends
    Carrier* debugNext_ = nullptr;      // the runtime's next carrier, for debuggers (tools/gdb/spindle.py)
    StallSample stallSample_;
    std::atomic<int> threadId_{0};

    RuntimeImpl* runtime_;
    const std::atomic<bool>* stoppingFlag_;
    CarrierConfig config_;
    int boundPu_ = -1;
    int memoryNode_ = -1;             // see memoryNode(); set in the constructor
    bool threadMemoryBound_ = false;  // see threadMemoryBound(); set in setUp()
    std::thread thread_;
    std::atomic<int> startState_{0};    // 0 starting, 1 running, -errno failed
    const void* schedStackBottom_ = nullptr;  // for ASan's switch annotations
    size_t schedStackSize_ = 0;
    void* tsanSched_ = nullptr;
    AltSignalStack altStack_;           // a stack overflow is reported on it (core/internal/stack_overflow.h)
};

}  // namespace spindle::detail
