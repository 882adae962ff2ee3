// SPDX-License-Identifier: Apache-2.0
#include "core/internal/carrier.h"

#include <pthread.h>

#include <cerrno>
#include <cstdio>
#include <system_error>
#include <utility>

#include "base/counter.h"
#include "base/log.h"
#include "base/relax.h"
#include "core/driver/epoll_driver.h"
#include "core/driver/uring_driver.h"
#include "core/internal/context.h"
#include "core/internal/runtime_impl.h"
#include "core/internal/sanitizer.h"

namespace spindle::detail {
namespace {

thread_local Carrier* tlsCarrier = nullptr;

// The stack-overflow reporter's view of this thread (RunningFiberFn): async-signal-safe, one TLS read.
Fiber* runningForFaultReport(unsigned* carrierIndex) noexcept {
    Carrier* c = tlsCarrier;
    if (c == nullptr) { return nullptr; }
    *carrierIndex = c->index();
    return c->running();
}

// ---- the switch ------------------------------------------------------------------------
// Every switch between the scheduler and a fiber, or between two fibers, is one switchTo().

// Where a switch lands: the context's saved sp, the stack it runs on (for ASan) and its TSan fiber.
struct SwitchTarget {
    void* sp;
    const void* stackBottom;
    size_t stackSize;
    void* tsanFiber;
};

[[gnu::always_inline]] inline SwitchTarget targetOf(const Fiber* fiber) noexcept {
#if defined(SPINDLE_TSAN)
    void* tsan = fiber->tsanFiber_;
#else
    void* tsan = nullptr;
#endif
    return SwitchTarget{fiber->sp_, fiber->stack_.usableBottom(), fiber->stack_.usableSize(), tsan};
}

// Where `fiber` keeps ASan's fake stack while switched out; nullptr without ASan.
[[gnu::always_inline]] inline void** fakeStackOf([[maybe_unused]] Fiber* fiber) noexcept {
#if defined(SPINDLE_ASAN)
    return &fiber->asanFakeStack_;
#else
    return nullptr;
#endif
}

// Which assembly entry a switch takes (core/internal/context.h): kFull, spindle_context_switch; kSibling,
// spindle_context_switch_sibling, only from one fiber to another, both suspended through the same call chain.
enum class SwitchEntry : uint8_t { kFull, kSibling };

// Saves the running context's sp in *saveSp and resumes `to`; returns when some context switches back,
// perhaps on another carrier. fakeStack: where the leaving context keeps ASan's fake stack meanwhile
// (nullptr: it never comes back). Touches nothing of the carrier after the switch, so a fiber that
// resumes elsewhere is safe here.
template <SwitchEntry kEntry>
[[gnu::always_inline]] inline void switchTo(void** saveSp, const SwitchTarget& to, void** fakeStack) noexcept {
    san::startSwitch(fakeStack, to.stackBottom, to.stackSize);
    san::tsanSwitchTo(to.tsanFiber);
    if constexpr (kEntry == SwitchEntry::kSibling) {
        spindle_context_switch_sibling(saveSp, to.sp);
    } else {
        spindle_context_switch(saveSp, to.sp);
    }
    san::finishSwitch(fakeStack != nullptr ? *fakeStack : nullptr, nullptr, nullptr);
}

}  // namespace

// Deliberately out of line: a fiber can resume on another thread, and an inlined
// TLS address computed before a switch would still point at the old thread's slot.
__attribute__((noinline)) Carrier* Carrier::current() noexcept {
    Carrier* c = tlsCarrier;
    asm volatile("" ::: "memory");
    return c;
}

Carrier::Carrier(RuntimeImpl* runtime, const CarrierConfig& config) noexcept
    : deque_(8), runtime_(runtime), stoppingFlag_(&runtime->stoppingFlag()), config_(config) {
    // Distinct, non-zero xorshift seeds per carrier (splitmix64 of the index).
    uint64_t z = (uint64_t{config.index} + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    rng_ = (z ^ (z >> 31)) | 1;
    if (runtime->topology() != nullptr && config.logicalPu >= 0) {
        memoryNode_ = static_cast<int>(runtime->topology()->memoryNodeOf(static_cast<unsigned>(config.logicalPu)));
    }
}

Carrier::~Carrier() {
    joinThread();
    // Every carrier thread has been joined (RuntimeImpl::join), so no fiber and no carrier can touch a
    // buffer or a slot any more; what users still hold is a precondition violation, checked here.
    fixedBuffers_.destroy();
    fixedFiles_.destroy();
    // Closed only now, with every carrier thread joined: until then another
    // thread may still be waking this one through its driver's descriptors, and
    // a descriptor closed earlier could be reused under its feet.
    if (driver_) { driver_->close(); }
}

Result<void> Carrier::start() noexcept {
    installStackOverflowReporter(&runningForFaultReport);
    try {
        exited_.store(false, std::memory_order_relaxed);
        thread_ = std::thread([this] { threadMain(); });
    } catch (const std::system_error& e) {
        log::error("carrier {}: cannot create its thread: {}", config_.index, e.what());
        return Error{e.code().value() != 0 ? e.code().value() : EAGAIN};
    }
    int s;
    while ((s = startState_.load(std::memory_order_acquire)) == 0) { startState_.wait(0, std::memory_order_acquire); }
    if (s < 0) {
        joinThread();
        return Error{-s};
    }
    return {};
}

void Carrier::joinThread() noexcept {
    if (thread_.joinable()) { thread_.join(); }
}

void Carrier::threadMain() noexcept {
    tlsCarrier = this;
    threadId_.store(static_cast<int>(::gettid()), std::memory_order_release);
    auto ok = setUp();
    startState_.store(ok ? 1 : -ok.errorCode(), std::memory_order_release);
    startState_.notify_all();
    if (ok) {
        loop();
    }
    tearDown();
    tlsCarrier = nullptr;
    exited_.store(true, std::memory_order_release);
}

Result<void> Carrier::setUp() noexcept {
    pool_.claimForThisThread();
    char name[16];
    std::snprintf(name, sizeof(name), "spindle-c%u", config_.index);
    ::pthread_setname_np(::pthread_self(), name);
    log::setThreadTag(config_.index);

    if (config_.pu >= 0 && runtime_->topology() != nullptr) {
        if (runtime_->topology()->bindCurrentThread(static_cast<unsigned>(config_.pu))) {
            boundPu_ = config_.pu;
        } else {
            log::warn("carrier {} runs unbound (binding to PU {} failed)", config_.index, config_.pu);
        }
    }
    setUpNodeMemory();

    if (!altStack_.install()) {
        log::warn("carrier {}: no alternate signal stack; stack overflows will be reported as a bare SIGSEGV",
                  config_.index);
    }

    pthread_attr_t attr;
    if (::pthread_getattr_np(::pthread_self(), &attr) == 0) {
        void* addr = nullptr;
        size_t size = 0;
        ::pthread_attr_getstack(&attr, &addr, &size);
        schedStackBottom_ = addr;
        schedStackSize_ = size;
        ::pthread_attr_destroy(&attr);
    }
    tsanSched_ = san::tsanCurrent();

    if (config_.backend == Backend::kEpoll) {
        driver_ = std::make_unique<EpollDriver>(runtime_);
    } else {
        auto d = std::make_unique<UringDriver>(config_.ring);
        uring_ = d.get();
        driver_ = std::move(d);
    }
    if (auto r = driver_->init(this); !r) { return r; }
    // On the thread that set the ring up (its io-wq is this thread's), before anything goes to a worker.
    // The epoll backend has no io-wq: its file work goes to the offload pool, which the runtime places
    // on the same CPUs.
    if (CPU_COUNT(&config_.workerCpus) > 0 && uring_ != nullptr) {
        if (auto r = uring_->ring()->setWorkerAffinity(config_.workerCpus); !r) {
            log::error("carrier {}: io_uring refused the worker CPUs (IORING_REGISTER_IOWQ_AFF): {}", config_.index,
                       r.error().message());
            return r;
        }
    }
    log::info("carrier {}: PU {} {}", config_.index, boundPu_, driver_->describe());

    // Registered resources last: their set-up only logs when the kernel refuses a registration.
    if (auto r = fixedBuffers_.setUp(driver_->ring(), config_.index, config_.fixedBufferCount, config_.fixedBufferSize,
                                     runtime_->topology(), boundPu_);
        !r) {
        return r;
    }
    if (auto r = fixedFiles_.setUp(this, driver_->ring(), config_.fixedFileSlots); !r) { return r; }
    return {};
}

void Carrier::setUpNodeMemory() noexcept {
    const numa::Topology* topo = runtime_->topology();
    if (topo == nullptr || memoryNode_ < 0) { return; }
    const auto node = static_cast<unsigned>(memoryNode_);
    pool_.bindToNode(topo, node);
    // liburing 2.3 cannot hand the ring memory we allocate (io_uring_queue_init_mem came in 2.5), so
    // the thread's policy is set before the ring: the kernel allocates the rings for this thread, on
    // this node. It stays for the thread's life, so its other allocations prefer the node too.
    // An unbound thread may run anywhere: no node to prefer. The fallback topology knows no node
    // (machine() said so when it fell back).
    if (boundPu_ < 0 || topo->isFallback()) { return; }
    if (auto r = topo->bindCurrentThreadMemory(node)) {
        threadMemoryBound_ = true;
    } else if (r.errorCode() == ENOTSUP) {
        log::info("carrier {}: ring and thread memory not bound to NUMA node {}: hwloc has no thread memory binding "
                  "here", config_.index, node);
    } else {
        log::warn("carrier {}: ring and thread memory not bound to NUMA node {}: {}", config_.index, node,
                  r.error().message());
    }
}

void Carrier::tearDown() noexcept {
    // Pollers still registered outlive the loop that ran them: unregister each and tell it, on this
    // thread (a DPDK queue unregisters the thread from DPDK here).
    while (Poller* p = pollers_) {
        removePoller(p);
        if (p->detached != nullptr) { p->detached(p); }
    }
    // On this thread, with the ring still open and nothing in flight (the loop has drained it); the
    // memory itself is freed by ~Carrier once every carrier thread is gone.
    if (driver_ && driver_->ring() != nullptr && driver_->ring()->initialized()) {
        fixedBuffers_.unregister();
        fixedFiles_.unregister();
    }
    altStack_.remove();
    log::clearThreadTag();
}

// ---- the loop ------------------------------------------------------------------

void Carrier::loop() noexcept {
    for (;;) {
        if (Fiber* f = nextLocal()) {
            if (spinning_) { endSpin(); }
            runFiber(f);
            if (++sinceMaintenance_ >= kMaintenanceInterval) { maintenance(); }
            continue;
        }
        maintenance(/*beforePark=*/true);
        if (!deque_.emptyApprox() || fifoHead_ != nullptr) {
            settleReap();
            continue;
        }
        if (Fiber* f = trySteal()) {
            settleReap();
            if (spinning_) { endSpin(); }
            runFiber(f);
            continue;
        }
        if (readyToExit()) {
            settleReap();
            break;
        }
        idle();
    }
    if (spinning_) { endSpin(); }
    driver_->drainForExit();
}

Fiber* Carrier::nextLocal() noexcept {
    // Alternate between the deque and the FIFO so that neither starves the other.
#if defined(SPINDLE_SHUFFLE_RUN_QUEUE)
    preferFifo_ = (nextRandom() & 1) != 0;  // which queue goes first is not promised: vary it
#else
    preferFifo_ = !preferFifo_;
#endif
    if (preferFifo_ && fifoHead_ != nullptr) { return popFifo(); }
    if (!deque_.emptyApprox()) {
        if (auto f = deque_.pop()) { return *f; }
    }
    return popFifo();
}

Fiber* Carrier::popFifo() noexcept {
    Fiber* f = fifoHead_;
    if (f != nullptr) {
        Fiber* next = f->nextLocal_;
        fifoHead_ = next;
        if (next == nullptr) {
            fifoTail_ = nullptr;
        } else {
            // With many connections each fiber's block and stack are cold by the time it runs: fetch
            // the next one's saved context now, with the frames above it that its return path reads
            // (kResumePrefetchBytes), and the block of the one after it, whose link the next pop reads
            // (that block was fetched by this pop's predecessor, so these loads hit).
            const auto* sp = static_cast<const char*>(next->sp_);
            for (size_t off = 0; off < kResumePrefetchBytes; off += 64) { __builtin_prefetch(sp + off); }
            for (size_t off = 64; off <= kResumePrefetchBelowBytes; off += 64) { __builtin_prefetch(sp - off, 1); }
            __builtin_prefetch(next->nextLocal_);
            if (const uintptr_t hint = next->resumeHint_; hint != 0) {  // this_fiber::setResumeHint
                const char* p = resumeHintAddress(hint);
                for (unsigned i = 0, n = resumeHintLines(hint); i < n; ++i) { __builtin_prefetch(p + i * 64); }
            }
        }
        f->nextLocal_ = nullptr;
    }
    return f;
}

void Carrier::pushFifo(Fiber* fiber) noexcept {
    fiber->nextLocal_ = nullptr;
    if (fifoTail_ != nullptr) {
        fifoTail_->nextLocal_ = fiber;
    } else {
        fifoHead_ = fiber;
    }
    fifoTail_ = fiber;
}

void Carrier::pushReady(Fiber* fiber) noexcept {
    SPINDLE_ASSERT(tlsCarrier == this);
    fiber->state_.store(FiberState::kRunnable, std::memory_order_relaxed);
    if (fiber->pinCount_ > 0 || inMaintenance_) {
        pushFifo(fiber);
        return;
    }
    try {
        deque_.push(fiber);
    } catch (const std::bad_alloc&) {
        // The deque could not grow. A wake-up cannot fail: the FIFO takes the fiber (intrusive, it never
        // allocates), and maintenance offers it to thieves again later.
        pushFifo(fiber);
    }
}

void Carrier::pushYielded(Fiber* fiber) noexcept {
    fiber->state_.store(FiberState::kRunnable, std::memory_order_relaxed);
    pushFifo(fiber);
}

void Carrier::prepareToRun(Fiber* fiber) noexcept {
    current_ = fiber;
    runningNow_.store(fiber, std::memory_order_relaxed);
    inlineRun_ = 0;
    if (fiber->carrier_ != this && fiber->hasRun_) { ownerAdd(stats_.fibersMigrated); }
    fiber->hasRun_ = true;
    fiber->carrier_ = this;
    fiber->waitKind_ = WaitKind::kNone;
    fiber->state_.store(FiberState::kRunning, std::memory_order_relaxed);
    ownerAdd(stats_.fibersRun);
}

void Carrier::runPendingAction() noexcept {
    if (action_.fn != nullptr) {
        SuspendAction a = action_;
        action_ = SuspendAction{};
        a.fn(actionFiber_, a.arg);
    }
}

void Carrier::runFiber(Fiber* fiber) noexcept {
    prepareToRun(fiber);
    switchTo<SwitchEntry::kFull>(&schedSp_, targetOf(fiber), &schedFakeStack_);
    // Back on the scheduler: from `fiber`, or from another fiber it switched to.
    runningNow_.store(nullptr, std::memory_order_relaxed);
    current_ = nullptr;
    runPendingAction();
}

// Leaves `from` (whose SuspendAction is already recorded) for the next local
// fiber if one is ready and maintenance is not due, else for the scheduler.
// Saves one switch per suspension on a busy carrier.
void Carrier::switchAway(Fiber* from, void** fakeStackSave) noexcept {
    Fiber* next = nullptr;
    if (sinceMaintenance_ + 1 < kMaintenanceInterval) { next = nextLocal(); }
    if (next != nullptr) {
        ++sinceMaintenance_;
        prepareToRun(next);
        switchTo<SwitchEntry::kSibling>(&from->sp_, targetOf(next), fakeStackSave);
        return;
    }
    switchTo<SwitchEntry::kFull>(&from->sp_, SwitchTarget{schedSp_, schedStackBottom_, schedStackSize_, tsanSched_},
                                 fakeStackSave);
}

void Carrier::suspendRunning(SuspendAction action) noexcept {
    Carrier* c = current();
    Fiber* f = c->current_;
    SPINDLE_ASSERT(f != nullptr);
    f->state_.store(FiberState::kSuspended, std::memory_order_relaxed);
    f->suspendedAtNs_ = c->coarseNowNs_;
    // Listed from its first suspension on: a fiber that runs to its end in one go (most short ones)
    // never touches the list.
    if (f->home_ == nullptr) { c->linkHome(f); }
    c->action_ = action;
    c->actionFiber_ = f;
    c->switchAway(f, fakeStackOf(f));
    // Resumed, possibly by another carrier: `c` is stale from here on.
    current()->runPendingAction();
}

void Carrier::yieldRunning() noexcept {
    Fiber* f = current_;
    if (sinceMaintenance_ + 1 < kMaintenanceInterval) {
        ++sinceMaintenance_;
        Fiber* next = nextLocal();
        if (next == nullptr) { return; }  // nobody else is runnable here; maintenance comes soon
        // The FIFO is owner-only, so queueing ourselves before the switch is safe:
        // no one can pick us up until this thread has switched away.
        pushYielded(f);
        prepareToRun(next);
        switchTo<SwitchEntry::kSibling>(&f->sp_, targetOf(next), fakeStackOf(f));
        current()->runPendingAction();
        return;
    }
    // Maintenance is due: go through the scheduler, which queues us after the switch.
    suspendRunning(SuspendAction{[](Fiber* fiber, void*) { Carrier::current()->pushYielded(fiber); }, nullptr});
}

void Carrier::exitRunning() noexcept {
    Carrier* c = current();
    Fiber* f = c->current_;
    f->state_.store(FiberState::kDead, std::memory_order_relaxed);
    c->action_ = SuspendAction{&Carrier::onFiberExit, nullptr};
    c->actionFiber_ = f;
    c->switchAway(f, nullptr);  // nullptr: this stack is never resumed
    __builtin_unreachable();
}

bool fiberRunsOnACarrier(const Fiber* f) noexcept {
    const Carrier* self = Carrier::current();
    if (self == nullptr) { return false; }
    for (const auto& c : self->runtime()->carriers()) {
        if (c->runningNow() == f) { return true; }
    }
    return false;
}

void Carrier::onFiberStart() noexcept {
    san::finishSwitch(nullptr, nullptr, nullptr);
    current()->runPendingAction();
}

void Carrier::onFiberExit(Fiber* fiber, void*) {
    if (fiber->home_ == nullptr) {  // never suspended, so never listed
        finishFiber(fiber);
        return;
    }
    Carrier* c = current();
    if (fiber->home_ == c) {
        c->unlinkHome(fiber);
        finishFiber(fiber);
        return;
    }
    // It died away from the carrier whose list holds it (it migrated after its first run): only that
    // carrier's thread may unlink it. It stays counted live until then, so that carrier cannot exit
    // first; its msg_ is free (nobody wakes a dead fiber).
    fiber->msg_.run = &Carrier::onAwayExit;
    fiber->msg_.target = fiber;
    fiber->home_->post(&fiber->msg_);
}

void Carrier::onAwayExit(Message* m) noexcept {
    auto* fiber = static_cast<Fiber*>(m->target);
    current()->unlinkHome(fiber);
    finishFiber(fiber);
}

void Carrier::finishFiber(Fiber* fiber) noexcept {
    // Uncount first, so that liveFibers() no longer counts a fiber whose join()
    // has returned. The carriers cannot exit under us: we are one of them.
    fiber->runtime_->retireFiber();
    fiber->done_.set(0);
    releaseFiber(fiber);
}

// ---- maintenance -----------------------------------------------------------------

void Carrier::maintenance(bool beforePark) noexcept {
    sinceMaintenance_ = 0;
    if (!shutdownSeen_ && stopping()) { beginShutdown(); }
    inMaintenance_ = true;
    drainInbox();
    if (beforePark && config_.pollMode == PollMode::kBlock && pollers_ == nullptr && driver_->parkCollects() &&
        fifoHead_ == nullptr && deque_.emptyApprox()) {
        // Nothing to submit and nothing to run: unless a steal finds work, park() is next, and its
        // io_uring_enter runs the deferred task work and returns at once if that completes anything.
        // Entering here as well would be one system call per idle transition that finds nothing new.
        reapOwed_ = true;
    } else {
        driver_->poll(true);
    }
    coarseNowNs_ = nowNs();  // one clock read per maintenance: the timers' and the suspensions' clock
    if (!timers_.empty()) { expireTimers(); }
    if (pollers_ != nullptr) {
        bool mayPark = true;
        (void)runPollers(&mayPark);
    }
    inMaintenance_ = false;
    pool_.maintain();
    if (runtime_->parkedCount_.load(std::memory_order_relaxed) > 0 ||
        runtime_->spinningCount_.load(std::memory_order_relaxed) > 0) {
        // Idle carriers can only steal from the deque: hand them the yielded fibers too.
        Fiber* keep = nullptr;
        Fiber* keepTail = nullptr;
        while (Fiber* f = popFifo()) {
            bool kept = f->pinCount_ > 0;
            if (!kept) {
                try {
                    deque_.push(f);
                } catch (const std::bad_alloc&) {
                    kept = true;  // no room to grow the deque: it stays in the FIFO, runnable here
                }
            }
            if (kept) {
                f->nextLocal_ = nullptr;
                if (keepTail != nullptr) { keepTail->nextLocal_ = f; } else { keep = f; }
                keepTail = f;
            }
        }
        fifoHead_ = keep;
        fifoTail_ = keepTail;
        if (deque_.sizeApprox() >= 2) { runtime_->wakeIdle(this); }
    }
}

void Carrier::drainInbox() noexcept {
    MpscNode* n = inbox_.popAll();
    while (n != nullptr) {
        // Read the link first: once handled, the node may be reused by another thread.
        MpscNode* next = n->next;
        auto* m = static_cast<Message*>(n);
        m->run(m);
        n = next;
    }
}

void Carrier::handleCancelWait(Fiber* fiber) noexcept {
    // Cleared first: a cancel() that finds the flag set from here on relies on the checks below.
    fiber->cancelMsgQueued_.store(false, std::memory_order_seq_cst);
    if (fiber->cancelRequested_.load(std::memory_order_seq_cst)) {
        Carrier* on = fiber->waitOn_.load(std::memory_order_seq_cst);
        if (on == this) {
            cancelWaitHere(fiber);
        } else if (on != nullptr && !fiber->cancelMsgQueued_.exchange(true, std::memory_order_seq_cst)) {
            // The wait this message was sent for ended, and the fiber waits elsewhere now (a wait it
            // began before the request): pass the message, and the reference it holds, on.
            on->post(&fiber->cancelMsg_);
            return;
        }
    }
    releaseFiber(fiber);
}

void Carrier::cancelWaitHere(Fiber* fiber) noexcept {
    // waitOn_ names this carrier, and only this thread clears it: the wait is still on.
    const CancelPoint point = fiber->waitPoint_;
    switch (point.kind) {
        case CancelPoint::Kind::kIo: {
            // Queued behind the operation itself, so the kernel sees the operation first. The operation
            // completes with -ECANCELED (or its result, had it finished); its completion ends the wait.
            driver_->cancel(static_cast<op::IoRequest*>(point.what));
            break;
        }
        case CancelPoint::Kind::kTimer: {
            auto* e = static_cast<TimerEntry*>(point.what);
            if (e->inHeap()) {
                timers_.remove(e);
                fireTimer(e, -ECANCELED);
            }
            break;
        }
    }
    ownerAdd(stats_.cancelsSent);
}

void Carrier::fireTimer(TimerEntry* entry, int32_t res) noexcept {
    if (entry->waiter != nullptr) { entry->waiter->waitOn_.store(nullptr, std::memory_order_relaxed); }
    entry->fired->set(res);
}

void Carrier::expireTimers() noexcept {
    const uint64_t now = coarseNowNs_;  // maintenance read the clock just before
    while (HeapNode* n = timers_.top()) {
        if (n->deadline > now) { break; }
        timers_.pop();
        fireTimer(static_cast<TimerEntry*>(n), 0);
    }
}

int Carrier::addTimer(TimerEntry* entry, uint64_t deadlineNs) noexcept {
    SPINDLE_ASSERT(tlsCarrier == this);
    if (stopping()) { return ECANCELED; }
    entry->owner = this;
    try {
        timers_.push(entry, deadlineNs);
    } catch (const std::bad_alloc&) {
        return ENOMEM;  // the heap could not grow; it is unchanged
    }
    return 0;
}

void Carrier::cancelTimer(TimerEntry* entry) noexcept {
    Carrier* self = current();
    if (self == entry->owner) {
        if (entry->inHeap()) {
            self->timers_.remove(entry);
            fireTimer(entry, -ECANCELED);
        }
        return;
    }
    entry->cancelMsg.run = [](Message* m) noexcept {
        auto* e = static_cast<TimerEntry*>(m->target);
        if (e->inHeap()) {
            current()->timers_.remove(e);
            fireTimer(e, -ECANCELED);
        }
        e->cancelAck.set(0);  // the last touch of e
    };
    entry->cancelMsg.target = entry;
    entry->cancelAck.reset();
    entry->owner->post(&entry->cancelMsg);
    (void)entry->cancelAck.wait();
}

void Carrier::beginShutdown() noexcept {
    shutdownSeen_ = true;
    // Every blocking call made from now on fails at once; cancel what is in flight.
    while (HeapNode* n = timers_.pop()) { fireTimer(static_cast<TimerEntry*>(n), -ECANCELED); }
    driver_->cancelAll();
}

bool Carrier::readyToExit() const noexcept {
    return shutdownSeen_ && driver_->inflight() == 0 && runtime_->live() == 0 && inbox_.empty();
}

// ---- stealing, parking, waking ------------------------------------------------------

Fiber* Carrier::stealOne() noexcept {
    for (int attempt = 0; attempt < 4 && !deque_.emptyApprox(); ++attempt) {
        if (auto f = deque_.steal()) { return *f; }
    }
    return nullptr;
}

void Carrier::setVictims(std::vector<StealVictim> victims) noexcept {
    victims_ = std::move(victims);
    localVictims_ = 0;
    while (localVictims_ < victims_.size() && !numa::crossesNode(victims_[localVictims_].distance)) {
        ++localVictims_;
    }
}

uint64_t Carrier::nextRandom() noexcept {
    rng_ ^= rng_ << 13;
    rng_ ^= rng_ >> 7;
    rng_ ^= rng_ << 17;
    return rng_;
}

Fiber* Carrier::stealFrom(const StealVictim& v) noexcept {
    const auto cls = static_cast<size_t>(v.distance);
    ownerAdd(stats_.stealAttempts[cls]);
    Fiber* f = v.carrier->stealOne();
    if (f != nullptr) {
        ownerAdd(stats_.stealSuccesses[cls]);
        ownerAdd(stats_.steals);
    }
    return f;
}

namespace {
size_t queuedAt(const StealVictim& v) noexcept { return v.carrier->queuedApprox(); }
}  // namespace

// The idle path: no allocation, one pass over the victims at most. Pinned fibers never reach a deque
// (pushReady and maintenance's hand-off keep them in the owner-only FIFO), so none can be stolen here.
//
// A thief that leaves a backlog behind passes the wake-up on. A busy carrier offers its queue with one
// wake-up per maintenance (every kMaintenanceInterval fibers it runs, so milliseconds apart when they
// compute), and a burst that reaches it from outside, through its inbox, gets one wake-up in all: without
// the relay, the thieves came one per maintenance of the victim, and on 16 cores a skewed workload ran
// no faster on 16 carriers than on 8 (spindle-topo experiment, docs/PERFORMANCE.md). Each thief wakes
// at most one more, only while the victim still has fibers queued.
Fiber* Carrier::trySteal() noexcept {
    Fiber* got = nullptr;
    Carrier* victim = nullptr;
    stealPass(config_.stealPolicy, config_.crossNodeThreshold, victims_, localVictims_, queuedAt,
              [this] { return nextRandom(); },
              [this, &got, &victim](const StealVictim& v) {
                  got = stealFrom(v);
                  victim = v.carrier;
                  return got != nullptr;
              });
    if (got != nullptr && !victim->deque_.emptyApprox()) { runtime_->wakeIdle(victim); }
    return got;
}

bool Carrier::mayStealFrom(const Carrier* victim) const noexcept {
    return victim != this && stealAllowed(config_.stealPolicy, victim->config_.node != config_.node,
                                          victim->queuedApprox(), config_.crossNodeThreshold);
}

bool Carrier::canStealAny() const noexcept {
    // Any victim will do, so kRandom's pass may start at the first.
    return stealPass(config_.stealPolicy, config_.crossNodeThreshold, victims_, localVictims_, queuedAt,
                     [] { return uint64_t{0}; }, [](const StealVictim&) { return true; });
}

bool Carrier::otherwiseIdle() noexcept {
    // Nothing ready to run, nothing queued to submit, no completion or task work waiting for the loop
    // (a fiber it would resume), and no timer due.
    return fifoHead_ == nullptr && deque_.emptyApprox() && inbox_.empty() && !driver_->hasWork() &&
           (timers_.empty() || timers_.nextDeadline() > nowNs());
}

void Carrier::addIdle(uint64_t since) noexcept {
    const uint64_t now = nowNs();
    if (now > since) {
        ownerAdd(stats_.idleNs, now - since);
    }
}

// Out of work: park, or (kSpin, kHybrid) pause once and let the loop poll again.
// A spinning carrier is never parked_, so nobody sends it a wake-up: it finds
// new work in its inbox, its CQ or another carrier's deque on its next pass.
void Carrier::idle() noexcept {
    // Nothing to run here: give the live count's credits back, so that waitIdle() and shutdown, which
    // wait for it to reach zero, are not kept waiting by an idle carrier.
    if (liveCredits_.load(std::memory_order_relaxed) != 0) { runtime_->flushLiveCredits(this); }
    bool mayPark = true;
    if (pollers_ != nullptr && runPollers(&mayPark)) { return; }  // found work: back to the loop
    if (config_.pollMode == PollMode::kBlock && mayPark) {
        park();
        return;
    }
    if (!spinning_) {
        spinning_ = true;
        runtime_->spinningCount_.fetch_add(1, std::memory_order_relaxed);
        ownerAdd(stats_.idleSpins);
        spinSince_ = nowNs();  // kHybrid's spin budget, and the idle time counted by endSpin()
    } else if (config_.pollMode != PollMode::kSpin && mayPark) {
        const uint64_t now = nowNs();
        if (now - spinSince_ >= config_.spinNs) {
            coarseNowNs_ = now;  // park() counts from it
            endSpin();
            park();
            return;
        }
    }
    cpuRelax();
}

void Carrier::endSpin() noexcept {
    addIdle(spinSince_);
    spinning_ = false;
    runtime_->spinningCount_.fetch_sub(1, std::memory_order_relaxed);
}

void Carrier::settleReap() noexcept {
    if (!reapOwed_) { return; }
    reapOwed_ = false;
    inMaintenance_ = true;
    driver_->poll(true);
    inMaintenance_ = false;
}

void Carrier::park() noexcept {
    const bool owed = std::exchange(reapOwed_, false);
    parked_.store(true, std::memory_order_seq_cst);
    runtime_->parkedCount_.fetch_add(1, std::memory_order_seq_cst);
    // Look again now that wakers can see us parked (each side of the handshake
    // stores, then loads, with seq_cst; one of the two sees the other).
    const bool work = !inbox_.empty() || canStealAny() || (!shutdownSeen_ && stopping()) ||
                      readyToExit();
    int64_t timeout = 0;  // 0: do not block
    if (!work) {
        uint64_t next = driver_->nextDeadline();
        if (!timers_.empty()) { next = std::min(next, timers_.nextDeadline()); }
        // The clock as maintenance read it just before (idle() comes right after it, or refreshes it
        // after a spin): the timeout can only come out longer by that much, never shorter, and saves
        // two clock reads per park (0.7 parks per request at 10 HTTP connections).
        const uint64_t now = coarseNowNs_;
        if (pool_.nextScavengeNs() != UINT64_MAX) {
            // Idle stacks go back to the kernel one scavenge period after they were last used, also
            // when the carrier has nothing else to do: wake for it.
            pool_.scavenge(now);
            next = std::min(next, pool_.nextScavengeNs());
        }
        timeout = next == UINT64_MAX ? -1 : next > now ? static_cast<int64_t>(next - now) : 0;
    }
    if (timeout != 0) {
        ownerAdd(stats_.parks);
        if (timeout > 0) {
            ownerAdd(stats_.timedParks);
        }
        const uint64_t parkedAt = coarseNowNs_;
        driver_->wait(timeout);
        addIdle(parkedAt);
    }
    parked_.store(false, std::memory_order_seq_cst);
    // seq_cst, then the load: pairs with the stall monitor's store-then-load before it sleeps (one of
    // the two sees the other), so a carrier that may run a fiber again never leaves it asleep.
    runtime_->parkedCount_.fetch_sub(1, std::memory_order_seq_cst);
    if (runtime_->stallMonitorAsleep_.load(std::memory_order_seq_cst) != 0) { runtime_->wakeStallMonitor(); }
    inMaintenance_ = true;
    if (owed && timeout == 0) {
        driver_->poll(true);  // the collecting enter maintenance left to the park
    } else {
        driver_->reap();
    }
    inMaintenance_ = false;
}

void Carrier::post(Message* message) noexcept {
    inbox_.push(message);
    wake();
}

void Carrier::wake() noexcept {
    if (!claimWake()) { return; }
    Carrier* self = current();
    driver_->wakeFrom(self);
    if (self != nullptr && self != this) { ownerAdd(self->stats_.wakesSent); }
}

bool Carrier::runPollers(bool* mayPark) noexcept {
    bool found = false;
    for (Poller* p = pollers_; p != nullptr;) {
        Poller* next = p->next;  // poll() may remove p
        if (p->poll(p)) { found = true; }
        p = next;
    }
    if (!found) {
        for (Poller* p = pollers_; p != nullptr; p = p->next) {
            if (p->mayPark != nullptr && !p->mayPark(p)) {
                *mayPark = false;
                break;
            }
        }
    }
    return found;
}

void Carrier::addPoller(Poller* poller) noexcept {
    SPINDLE_ASSERT(tlsCarrier == this);
    poller->prev = nullptr;
    poller->next = pollers_;
    if (pollers_ != nullptr) { pollers_->prev = poller; }
    pollers_ = poller;
    poller->carrier = this;
}

void Carrier::removePoller(Poller* poller) noexcept {
    SPINDLE_ASSERT(tlsCarrier == this && poller->carrier == this);
    if (poller->prev != nullptr) { poller->prev->next = poller->next; } else { pollers_ = poller->next; }
    if (poller->next != nullptr) { poller->next->prev = poller->prev; }
    poller->next = poller->prev = nullptr;
    poller->carrier = nullptr;
}

}  // namespace spindle::detail

namespace spindle {

namespace detail {

Result<void> runOnCarrier(RuntimeImpl* rt, unsigned carrier, void (*call)(void* ctx) noexcept, void* ctx) noexcept {
    if (rt == nullptr || carrier >= rt->carriers().size()) { return Error{EINVAL}; }
    Carrier* target = rt->carriers()[carrier].get();
    Carrier* self = Carrier::current();
    if (self == target) {
        call(ctx);
        return {};
    }
    // A fiber of this runtime keeps live() above zero, so its carriers cannot exit before the message
    // is handled; anyone else could post to a carrier that has already left its loop.
    const bool ownFiber = self != nullptr && self->running() != nullptr && self->runtime() == rt;
    if (rt->stopping() && !ownFiber) { return Error{ECANCELED}; }
    struct Call : Message {
        void (*fn)(void*) noexcept;
        void* ctx;
        FiberFuture done;
    } m;
    m.fn = call;
    m.ctx = ctx;
    m.target = &m;
    m.run = [](Message* msg) noexcept {
        auto* c = static_cast<Call*>(msg->target);
        c->fn(c->ctx);
        c->done.set(0);  // the last touch of the message
    };
    target->post(&m);
    (void)m.done.wait();
    return {};
}

}  // namespace detail

Result<unsigned> addPoller(Poller* poller) noexcept {
    detail::Carrier* c = detail::Carrier::current();
    if (c == nullptr || c->running() == nullptr) { return Error{EPERM}; }
    if (poller == nullptr || poller->poll == nullptr) { return Error{EINVAL}; }
    if (poller->carrier != nullptr) { return Error{EBUSY}; }
    c->addPoller(poller);
    return c->index();
}

Result<void> removePoller(Poller* poller) noexcept {
    detail::Carrier* c = detail::Carrier::current();
    if (poller == nullptr || poller->carrier == nullptr) { return Error{EINVAL}; }
    if (c == nullptr || poller->carrier != c) { return Error{EPERM}; }
    c->removePoller(poller);
    return {};
}

}  // namespace spindle
