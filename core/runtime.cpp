// SPDX-License-Identifier: Apache-2.0
#include "core/runtime.h"

#include <time.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "base/cpu_list.h"
#include "base/inject.h"
#include "base/log.h"
#include "core/internal/carrier.h"
#include "core/driver/backend.h"
#include "core/internal/runtime_impl.h"
#include "core/internal/waiter_table.h"

namespace spindle {
namespace detail {

namespace {

// The kernel's limits: IORING_MAX_REG_BUFFERS, 1 GiB per registered buffer, IORING_MAX_FIXED_FILES.
constexpr unsigned kMaxFixedBuffers = 16384;
constexpr size_t kMaxFixedBufferSize = size_t{1} << 30;
constexpr unsigned kMaxFixedFileSlots = 1u << 20;
// No carrier needs more pinned memory than this; a larger pool is a typo (a size in KiB taken for pages).
constexpr size_t kMaxFixedPoolBytes = size_t{16} << 30;
constexpr size_t kFixedBufferAlign = 4096;
constexpr unsigned kMaxStealThreshold = 1'000'000;

Result<void> validateFixedOptions(const RuntimeOptions& o) noexcept {
    if (o.fixedBufferCount > kMaxFixedBuffers) {
        log::error("invalid runtime options: fixedBufferCount {} (0..{})", o.fixedBufferCount, kMaxFixedBuffers);
        return Error{EINVAL};
    }
    if (o.fixedBufferCount > 0) {
        if (o.fixedBufferSize == 0 || o.fixedBufferSize % kFixedBufferAlign != 0 ||
            o.fixedBufferSize > kMaxFixedBufferSize) {
            log::error("invalid runtime options: fixedBufferSize {} (a non-zero multiple of {}, at most 1 GiB)",
                       o.fixedBufferSize, kFixedBufferAlign);
            return Error{EINVAL};
        }
        if (o.fixedBufferSize > kMaxFixedPoolBytes / o.fixedBufferCount) {
            log::error("invalid runtime options: fixedBufferCount {} x fixedBufferSize {} is more than {} GiB of "
                       "pinned memory per carrier",
                       o.fixedBufferCount, o.fixedBufferSize, kMaxFixedPoolBytes >> 30);
            return Error{EINVAL};
        }
    }
    if (o.fixedFileSlots > kMaxFixedFileSlots) {
        log::error("invalid runtime options: fixedFileSlots {} (0..{})", o.fixedFileSlots, kMaxFixedFileSlots);
        return Error{EINVAL};
    }
    return {};
}

}  // namespace

uint64_t nowNs() noexcept {
    timespec ts;
    ::clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<uint64_t>(ts.tv_sec) * 1000000000u + static_cast<uint64_t>(ts.tv_nsec);
}

RuntimeImpl::RuntimeImpl(const RuntimeOptions& options) noexcept
    : options_(options), offload_(options.offloadThreads) {}

RuntimeImpl::~RuntimeImpl() {
    shutdown();
    join();
    if (listedOnSignal_) { listOnSignal(false); }
    if (shownToDebuggers_) { showToDebuggers(false); }
}

Result<void> RuntimeImpl::loadTopology() noexcept {
    // Precedence: the option, then SPINDLE_TOPOLOGY, then this machine.
    std::string spec = options_.topology;
    const char* from = "RuntimeOptions::topology";
    if (spec.empty()) {
        if (const char* env = std::getenv(numa::kTopologyEnv); env != nullptr && env[0] != '\0') {
            spec = env;
            from = numa::kTopologyEnv;
            log::info("topology from {}: {}", from, spec);
        }
    }
    if (spec.empty() || spec == "machine") {
        auto topo = numa::Topology::machine();  // falls back to a flat topology itself, logged
        if (!topo) {
            log::warn("hwloc could not read this machine's topology ({}); carriers run unbound",
                      topo.error().message());
            return {};
        }
        topology_.emplace(std::move(*topo));
        return {};
    }
    if (spec.rfind("synthetic:", 0) != 0 && spec.rfind("xml:", 0) != 0) {
        log::error("{} must be empty, 'machine', 'synthetic:<hwloc string>' or 'xml:<path>', not '{}'", from, spec);
        return Error{EINVAL};
    }
    auto topo = numa::Topology::fromSpec(spec);
    if (!topo) {
        log::error("{} '{}': {}", from, spec, topo.error().message());
        return Error{topo.errorCode()};
    }
    topology_.emplace(std::move(*topo));
    return {};
}

Result<void> RuntimeImpl::placeWorkers(cpu_set_t& workers) noexcept {
    cpu_set_t mine;
    CPU_ZERO(&mine);
    int err = 0;
    SPINDLE_INJECT(inject::Point::kThreadAffinity, { err = injectedErrno; });  // in place of the call
    if (err == 0 && ::sched_getaffinity(0, sizeof mine, &mine) != 0) { err = errno; }
    if (err != 0) {
        if (options_.workerCpus.empty()) { return {}; }  // the pool's threads then stay where they are born
        log::error("workerCpus: this thread's CPUs are unknown (sched_getaffinity: {})", std::strerror(err));
        return Error{err};
    }
    for (const unsigned cpu : options_.workerCpus) {
        if (cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, &mine)) {
            log::error("invalid runtime options: workerCpus holds CPU {}, which the thread calling start() may "
                       "not run on (it may run on {})",
                       cpu, formatCpuList(cpusIn(mine)));
            return Error{EINVAL};
        }
        CPU_SET(cpu, &workers);
    }
    offload_.setCpus(options_.workerCpus.empty() ? mine : workers);
    return {};
}

Result<void> RuntimeImpl::start() noexcept {
    if (options_.carriers > kMaxCarriers) {
        log::error("invalid runtime options: carriers {} (0..{}; 0: the placement's natural count)", options_.carriers,
                   kMaxCarriers);
        return Error{EINVAL};
    }
    if (options_.stackSize < 16 * 1024 || options_.ringEntries == 0 || options_.ringEntries > 32768 ||
        options_.offloadThreads == 0 || options_.offloadThreads > 1024) {
        log::error("invalid runtime options: stackSize {} (>= 16 KiB), ringEntries {} (1..32768), offloadThreads {} "
                   "(1..1024)",
                   options_.stackSize, options_.ringEntries, options_.offloadThreads);
        return Error{EINVAL};
    }
    if (options_.cqEntries != 0 && (options_.cqEntries < options_.ringEntries || options_.cqEntries > 524288)) {
        log::error("invalid runtime options: cqEntries {} (0, or ringEntries {}..524288)", options_.cqEntries,
                   options_.ringEntries);
        return Error{EINVAL};
    }
    if (auto r = validateFixedOptions(options_); !r) { return r; }
    const auto mode = static_cast<unsigned>(options_.pollMode);
    if (mode > static_cast<unsigned>(PollMode::kHybrid) || options_.spinMicros == 0 ||
        options_.spinMicros > 1'000'000 || options_.sqThreadIdleMs == 0 || options_.sqThreadIdleMs > 60'000) {
        log::error("invalid runtime options: pollMode {} (0 block, 1 spin, 2 hybrid), spinMicros {} (1..1000000), "
                   "sqThreadIdleMs {} (1..60000)",
                   mode, options_.spinMicros, options_.sqThreadIdleMs);
        return Error{EINVAL};
    }
    const auto policy = static_cast<unsigned>(options_.stealPolicy);
    if (policy > static_cast<unsigned>(StealPolicy::kNone) || options_.crossNodeStealThreshold > kMaxStealThreshold) {
        log::error("invalid runtime options: stealPolicy {} (0 numa, 1 random, 2 local-only, 3 none), "
                   "crossNodeStealThreshold {} (0..{})",
                   policy, options_.crossNodeStealThreshold, kMaxStealThreshold);
        return Error{EINVAL};
    }
    stallThresholdMs_ = options_.stallThresholdMs;
    if (const char* env = std::getenv("SPINDLE_STALL_MS"); env != nullptr && env[0] != '\0') {
        char* end = nullptr;
        errno = 0;
        const unsigned long v = std::strtoul(env, &end, 10);
        if (errno != 0 || *end != '\0' || v > kMaxStallMs) {
            log::error("invalid SPINDLE_STALL_MS '{}': a number of milliseconds, 0 (off) to {}", env, kMaxStallMs);
            return Error{EINVAL};
        }
        stallThresholdMs_ = static_cast<unsigned>(v);
    }
    if (stallThresholdMs_ > kMaxStallMs || options_.shutdownReportMs > 3'600'000) {
        log::error("invalid runtime options: stallThresholdMs {} (0..{}), shutdownReportMs {} (0..3600000)",
                   stallThresholdMs_, kMaxStallMs, options_.shutdownReportMs);
        return Error{EINVAL};
    }
    cpu_set_t workerCpus;
    CPU_ZERO(&workerCpus);
    if (auto r = placeWorkers(workerCpus); !r) { return r; }
    if (auto r = loadTopology(); !r) { return r; }
    {
        uring::RingOptions probeRing;
        probeRing.entries = options_.ringEntries;
        probeRing.cqEntries = options_.cqEntries;
        probeRing.deferTaskrun = options_.deferTaskrun;
        auto choice = chooseBackend(options_.backend, probeRing);
        if (!choice) { return Error{choice.errorCode()}; }
        backend_ = choice->backend;
        if (backend_ == Backend::kEpoll && options_.sqpoll) {
            log::warn("sqpoll is an io_uring feature: the epoll backend runs without it");
        }
    }
    // The waiter table sizes itself and places its buckets from the machine's topology as seen by the
    // calling thread; built later, from a pinned carrier, it would see one PU.
    (void)WaiterTable::instance();

    unsigned count = options_.carriers;
    std::vector<unsigned> placed;  // the OS index of the PU each carrier stands for (numa/placement.h)
    if (topology_) {
        auto p = numa::placeCarriers(*topology_, options_.placement, count, options_.explicitPus);
        if (!p) {
            log::error("invalid runtime options: placement {} for {} carriers on {}: {}",
                       numa::toString(options_.placement), count, topology_->describe(), p.error().message());
            return Error{p.errorCode()};
        }
        placed = std::move(*p);
        count = static_cast<unsigned>(placed.size());
    } else {
        if (options_.placement != numa::Placement::kPerCore) {
            log::warn("no topology: placement {} is ignored and carriers run unbound", numa::toString(options_.placement));
        }
        if (count == 0) { count = std::max(1u, std::thread::hardware_concurrency()); }
    }
    if (count > kMaxCarriers) {  // a natural count: a synthetic topology of more PUs than that, say
        log::error("invalid runtime options: placement {} picks {} carriers, more than {}; set carriers",
                   numa::toString(options_.placement), count, kMaxCarriers);
        return Error{EINVAL};
    }
    const bool canBind = options_.bindCarriers && topology_ && !topology_->isSynthetic();
    if (canBind && !options_.workerCpus.empty()) {
        // The kernel narrows a new io-wq worker to the CPUs its carrier was bound to whenever the worker
        // set holds one of them: such a carrier's workers would stay on its CPU, unlike the others'.
        for (unsigned i = 0; i < count; ++i) {
            if (placed[i] < CPU_SETSIZE && CPU_ISSET(placed[i], &workerCpus)) {
                log::error("invalid runtime options: workerCpus holds CPU {}, where carrier {} is bound; the kernel "
                           "keeps a bound carrier's io_uring workers on its own CPU whenever the set holds it: leave "
                           "the carriers' CPUs out (fewer carriers, or placement list:...)",
                           placed[i], i);
                return Error{EINVAL};
            }
        }
    }
    if (!options_.workerCpus.empty()) {
        log::info("helper threads (io_uring's io-wq workers, the offload pool) on CPUs {}", formatCpuList(options_.workerCpus));
    }
    std::vector<int> sqThreadCpus;  // with SQPOLL on bound carriers: where each ring's SQ thread goes
    if (options_.sqpoll && canBind) {
        try {
            sqThreadCpus = numa::placeSqThreads(*topology_, placed);
        } catch (const std::bad_alloc&) {
            return Error{ENOMEM};
        }
        if (const auto n = std::count(sqThreadCpus.begin(), sqThreadCpus.end(), -1); n > 0) {
            log::info("SQPOLL: {} of {} SQ threads find no PU free of carriers and other SQ threads and are left to "
                      "the kernel (a spinning carrier then passes its CPU to an SQ thread only at the end of a time "
                      "slice; leave PUs free for them: fewer carriers)",
                      n, sqThreadCpus.size());
        }
    }
    try {
        carriers_.reserve(count);
        for (unsigned i = 0; i < count; ++i) {
            CarrierConfig cfg;
            cfg.index = i;
            cfg.logicalPu = topology_ ? static_cast<int>(placed[i]) : -1;
            cfg.pu = canBind ? cfg.logicalPu : -1;
            cfg.backend = backend_;
            cfg.ring.entries = options_.ringEntries;
            cfg.ring.cqEntries = options_.cqEntries;
            cfg.ring.deferTaskrun = options_.deferTaskrun;
            cfg.ring.sqpoll = options_.sqpoll;
            cfg.ring.sqThreadIdleMs = options_.sqThreadIdleMs;
            if (options_.sqpoll) { cfg.ring.sqThreadCpu = sqThreadCpus.empty() ? -1 : sqThreadCpus[i]; }
            cfg.fixedBufferCount = options_.fixedBufferCount;
            cfg.fixedBufferSize = options_.fixedBufferSize;
            cfg.fixedFileSlots = options_.fixedFileSlots;
            cfg.pollMode = options_.pollMode;
            cfg.spinNs = uint64_t{options_.spinMicros} * 1000u;
            cfg.node = cfg.logicalPu >= 0 ? topology_->nodeOf(static_cast<unsigned>(cfg.logicalPu)) : 0;
            cfg.stealPolicy = options_.stealPolicy;
            cfg.crossNodeThreshold = options_.crossNodeStealThreshold;
            cfg.workerCpus = workerCpus;
            carriers_.push_back(std::make_unique<Carrier>(this, cfg));
        }
    } catch (const std::bad_alloc&) {
        carriers_.clear();
        return Error{ENOMEM};
    }
    // Victims nearest first by the distance between logical PUs (bound or simulated alike); ties in index
    // order starting after the thief, so carriers of one class do not all try the same victim first.
    // Without a topology every victim counts as kSameNode: nothing is known to be far.
    try {
        for (auto& c : carriers_) {
            std::vector<StealVictim> victims;
            victims.reserve(count);
            for (unsigned k = 1; k < count; ++k) {
                Carrier* v = carriers_[(c->index() + k) % count].get();
                numa::Distance d = numa::Distance::kSameNode;
                if (topology_ && c->logicalPu() >= 0 && v->logicalPu() >= 0) {
                    d = topology_->distance(static_cast<unsigned>(c->logicalPu()), static_cast<unsigned>(v->logicalPu()));
                }
                victims.push_back(StealVictim{v, d});
            }
            std::stable_sort(victims.begin(), victims.end(),
                             [](const StealVictim& a, const StealVictim& b) { return a.distance < b.distance; });
            c->setVictims(std::move(victims));
        }
    } catch (const std::bad_alloc&) {
        carriers_.clear();
        return Error{ENOMEM};
    }
    for (auto& c : carriers_) {
        if (auto r = c->start(); !r) {
            log::error("carrier {} failed to start: {}", c->index(), r.error().message());
            shutdown();
            join();
            carriers_.clear();
            return r;
        }
    }
    if (stallThresholdMs_ != 0) {
        stallMonitor_ = std::make_unique<StallMonitor>(this, uint64_t{stallThresholdMs_} * 1'000'000);
        if (auto r = stallMonitor_->start(); !r) {
            log::warn("stall detector: no monitor thread ({}); stalls go unreported", r.error().message());
            stallMonitor_.reset();
        }
    }
    showToDebuggers(true);
    const char* onSignal = std::getenv("SPINDLE_FIBER_SIGNAL");
    if (options_.fiberListOnSignal || (onSignal != nullptr && std::strcmp(onSignal, "1") == 0)) {
        listOnSignal(true);
        listedOnSignal_ = true;
    }
    return {};
}

bool RuntimeImpl::admitFiber(bool fromOwnFiber) noexcept {
    if (fromOwnFiber) {
        // No shutdown check: a fiber of this runtime may spawn until the end (its carrier is running).
        Carrier* c = Carrier::current();
        uint32_t credits = c->liveCredits_.load(std::memory_order_relaxed);
        if (credits == 0) {
            // live_ first, then the credits: a concurrent liveFibers() may count high, never low.
            live_.fetch_add(kLiveCreditBatch, std::memory_order_seq_cst);
            credits = kLiveCreditBatch;
        }
        c->liveCredits_.store(credits - 1, std::memory_order_release);
        return true;
    }
    live_.fetch_add(1, std::memory_order_seq_cst);
    if (stopping_.load(std::memory_order_seq_cst)) {
        dropLive(1);
        return false;
    }
    return true;
}

void RuntimeImpl::retireFiber() noexcept {
    Carrier* c = Carrier::current();
    if (c == nullptr || c->runtime() != this) {
        dropLive(1);
        return;
    }
    const uint32_t credits = c->liveCredits_.load(std::memory_order_relaxed) + 1;
    if (credits <= 2 * kLiveCreditBatch) {
        c->liveCredits_.store(credits, std::memory_order_release);
        return;
    }
    // The credits first, then live_ (see liveFibers()).
    c->liveCredits_.store(kLiveCreditBatch, std::memory_order_release);
    dropLive(credits - kLiveCreditBatch);
}

void RuntimeImpl::flushLiveCredits(Carrier* c) noexcept {
    const uint32_t credits = c->liveCredits_.load(std::memory_order_relaxed);
    if (credits == 0) { return; }
    c->liveCredits_.store(0, std::memory_order_release);
    dropLive(credits);
}

void RuntimeImpl::dropLive(uint64_t n) noexcept {
    if (live_.fetch_sub(n, std::memory_order_seq_cst) == n) {
        live_.notify_all();
        if (stopping_.load(std::memory_order_seq_cst)) { wakeAll(); }
    }
}

uint64_t RuntimeImpl::liveFibers() const noexcept {
    // A carrier adds to live_ before its credits and takes from its credits before live_, so reading
    // live_ on both sides of the credits, and again if it moved, never counts a fiber that is not there
    // because of a refill or a give-back in between.
    for (;;) {
        const uint64_t before = live_.load(std::memory_order_seq_cst);
        uint64_t credits = 0;
        for (const auto& c : carriers_) { credits += c->liveCredits_.load(std::memory_order_acquire); }
        if (live_.load(std::memory_order_seq_cst) == before) { return before > credits ? before - credits : 0; }
    }
}

Carrier* RuntimeImpl::pickCarrier() noexcept {
    const uint32_t i = roundRobin_.fetch_add(1, std::memory_order_relaxed);
    return carriers_[i % carriers_.size()].get();
}

void RuntimeImpl::wakeIdle(const Carrier* from) noexcept {
    // Pairs with the seq_cst increment in Carrier::park(): either we see the
    // parked carrier, or it sees the work we just queued.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (parkedCount_.load(std::memory_order_relaxed) == 0) { return; }
    // Nearest parked carrier first, and only one whose steal policy lets it take from `from`: waking a
    // carrier that may not steal this work (kNone, another node under kLocalOnly, or under kNuma while
    // the backlog is within the threshold) would only make it park again.
    for (const StealVictim& v : from->victims()) {
        Carrier* c = v.carrier;
        if (c->isParked() && c->mayStealFrom(from)) {
            c->wake();
            return;
        }
    }
}

void RuntimeImpl::wakeAll() noexcept {
    for (auto& c : carriers_) { c->wake(); }
}

void RuntimeImpl::shutdown() noexcept {
    if (!stopping_.exchange(true, std::memory_order_seq_cst)) { wakeAll(); }
    offload_.close();  // after stopping_: a later submitOffload() sees either the flag or the closed pool
}

void RuntimeImpl::join() noexcept {
    if (joined_) { return; }
    checkJoinable("Runtime::join()");
    if (options_.shutdownReportMs != 0) {
        const auto report = std::chrono::milliseconds(options_.shutdownReportMs);
        if (!waitCarriersExited(report)) { reportAlive(report); }
    }
    if (stallMonitor_) { stallMonitor_->stop(); }  // before the threads it signals are joined
    for (auto& c : carriers_) { c->joinThread(); }
    // Every fiber is gone, so no offload() caller waits any more; a pool thread may still be leaving.
    offload_.join();
    joined_ = true;
}

void RuntimeImpl::waitIdle() noexcept {
    SPINDLE_CHECK_MSG(Carrier::current() == nullptr || Carrier::current()->runtime() != this,
                      "Runtime::waitIdle() called on one of its own carriers");
    uint64_t v;
    while ((v = live_.load(std::memory_order_seq_cst)) != 0) { live_.wait(v, std::memory_order_seq_cst); }
}

}  // namespace detail

Result<Runtime> Runtime::start(const RuntimeOptions& options) noexcept {
    std::unique_ptr<detail::RuntimeImpl> impl;
    try {
        impl = std::make_unique<detail::RuntimeImpl>(options);
    } catch (const std::bad_alloc&) {
        return Error{ENOMEM};
    }
    if (auto r = impl->start(); !r) { return Error{r.errorCode()}; }
    return Runtime(std::move(impl));
}

Runtime::Runtime(std::unique_ptr<detail::RuntimeImpl> impl) noexcept : impl_(std::move(impl)) {}
Runtime::Runtime(Runtime&&) noexcept = default;
Runtime& Runtime::operator=(Runtime&& o) noexcept {
    if (this != &o) {
        impl_.reset();
        impl_ = std::move(o.impl_);
    }
    return *this;
}
Runtime::~Runtime() = default;

void Runtime::waitIdle() noexcept { impl_->waitIdle(); }
void Runtime::shutdown() noexcept { impl_->shutdown(); }
void Runtime::join() noexcept { impl_->join(); }
unsigned Runtime::carrierCount() const noexcept { return static_cast<unsigned>(impl_->carriers().size()); }
uint64_t Runtime::liveFibers() const noexcept { return impl_->liveFibers(); }

std::vector<CarrierStats> Runtime::stats() const {
    std::vector<CarrierStats> out;
    for (const auto& c : impl_->carriers()) {
        CarrierStats s;
        s.index = c->index();
        s.pu = c->boundPu();
        s.fibersRun = c->stats().fibersRun.load(std::memory_order_relaxed);
        s.steals = c->stats().steals.load(std::memory_order_relaxed);
        s.parks = c->stats().parks.load(std::memory_order_relaxed);
        s.timedParks = c->stats().timedParks.load(std::memory_order_relaxed);
        s.idleSpins = c->stats().idleSpins.load(std::memory_order_relaxed);
        s.wakesSent = c->stats().wakesSent.load(std::memory_order_relaxed);
        const detail::Driver::Counters dc = c->driver().counters();
        s.enters = dc.enters;
        s.sqesSubmitted = dc.submitted;
        s.cqesReaped = dc.completed;
        s.sqFull = dc.queueFull;
        s.stacksMapped = c->stackPool().mapped();
        s.stackTrims = c->stackPool().trims();
        s.stackSlabs = c->stackPool().slabs();
        s.stacksWarm = c->stackPool().warm();
        s.stacksInUse = c->stackPool().inUse();
        s.waitsCancelled = c->stats().cancelsSent.load(std::memory_order_relaxed);
        s.fixedBuffersRegistered = c->fixedBuffers().registered();
        s.fixedFilesRegistered = c->fixedFiles().registered();
        s.fixedIo = c->stats().fixedIo.load(std::memory_order_relaxed);
        s.fixedFallbackIo = c->stats().fixedFallbackIo.load(std::memory_order_relaxed);
        s.fixedFileIo = c->stats().fixedFileIo.load(std::memory_order_relaxed);
        s.fixedFileFallbackIo = c->stats().fixedFileFallbackIo.load(std::memory_order_relaxed);
        s.ring = c->driver().describe();
        s.logicalPu = c->logicalPu();
        s.node = c->node();
        for (size_t k = 0; k < numa::kDistanceClassCount; ++k) {
            s.stealAttempts[k] = c->stats().stealAttempts[k].load(std::memory_order_relaxed);
            s.stealSuccesses[k] = c->stats().stealSuccesses[k].load(std::memory_order_relaxed);
        }
        s.fibersMigrated = c->stats().fibersMigrated.load(std::memory_order_relaxed);
        s.idleNs = c->stats().idleNs.load(std::memory_order_relaxed);
        s.stalls = c->stats().stalls.load(std::memory_order_relaxed);
        s.memoryNode = c->memoryNode();
        s.stacksNodeBound = c->stackPool().nodeBound();
        s.threadMemoryBound = c->threadMemoryBound();
        out.push_back(std::move(s));
    }
    return out;
}

Result<std::vector<Victim>> Runtime::victimOrder(unsigned carrier) const {
    const auto& carriers = impl_->carriers();
    if (carrier >= carriers.size()) { return Error{EINVAL}; }
    std::vector<Victim> out;
    for (const detail::StealVictim& v : carriers[carrier]->victims()) {
        out.push_back(Victim{v.carrier->index(), v.distance});
    }
    return out;
}

const numa::Topology* Runtime::topology() const noexcept { return impl_->topology(); }

const char* toString(StealPolicy policy) noexcept {
    switch (policy) {
        case StealPolicy::kNuma: return "numa";
        case StealPolicy::kRandom: return "random";
        case StealPolicy::kLocalOnly: return "local-only";
        case StealPolicy::kNone: return "none";
    }
    return "unknown";
}

const char* toString(Backend backend) noexcept {
    switch (backend) {
        case Backend::kAuto: return "auto";
        case Backend::kUring: return "io_uring";
        case Backend::kEpoll: return "epoll";
    }
    return "unknown";
}

Result<Backend> parseBackend(std::string_view name) noexcept {
    for (Backend b : {Backend::kAuto, Backend::kUring, Backend::kEpoll}) {
        if (name == toString(b)) { return b; }
    }
    return Error{EINVAL};
}

Backend Runtime::backend() const noexcept { return impl_->backend(); }

Result<StealPolicy> parseStealPolicy(std::string_view name) noexcept {
    for (StealPolicy p : {StealPolicy::kNuma, StealPolicy::kRandom, StealPolicy::kLocalOnly, StealPolicy::kNone}) {
        if (name == toString(p)) { return p; }
    }
    return Error{EINVAL};
}

uint64_t CarrierStats::crossNodeSteals() const noexcept {
    uint64_t n = 0;
    for (size_t k = 0; k < numa::kDistanceClassCount; ++k) {
        if (numa::crossesNode(static_cast<numa::Distance>(k))) { n += stealSuccesses[k]; }
    }
    return n;
}

std::string formatStealStats(const std::vector<CarrierStats>& stats) {
    std::string out;
    for (const CarrierStats& s : stats) {
        out += fmt::format("carrier {} (pu {}, node {}): run {} steals", s.index, s.logicalPu, s.node, s.fibersRun);
        for (size_t k = 1; k < numa::kDistanceClassCount; ++k) {  // kSamePu only for carriers sharing a PU
            out += fmt::format(" {} {}/{}", numa::toString(static_cast<numa::Distance>(k)), s.stealSuccesses[k],
                               s.stealAttempts[k]);
        }
        if (s.stealSuccesses[0] + s.stealAttempts[0] > 0) {
            out += fmt::format(" same-pu {}/{}", s.stealSuccesses[0], s.stealAttempts[0]);
        }
        out += fmt::format(" migrated {} idle {:.1f} ms\n", s.fibersMigrated, static_cast<double>(s.idleNs) / 1e6);
    }
    return out;
}

std::string Runtime::describe() const {
    std::string pus;
    for (const auto& c : impl_->carriers()) {
        pus += fmt::format("{}{}", pus.empty() ? "" : ",", c->boundPu() >= 0 ? std::to_string(c->boundPu()) : "-");
    }
    const numa::Topology* t = impl_->topology();
    return fmt::format("{} carriers on PUs [{}]; {}; backend {}; {}", impl_->carriers().size(), pus,
                       t != nullptr ? t->describe() : std::string("topology unknown"), toString(impl_->backend()),
                       detail::probeUring().describe());
}

}  // namespace spindle
