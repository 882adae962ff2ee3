// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Runtime: a group of carriers, one pinned thread and one io_uring ring each.
///
/// Two ways to use it:
///   - Runtime::run(fn): starts the carriers, runs fn as the first fiber, waits
///     until every fiber is done, shuts down, and returns fn's value.
///   - Runtime::start(options) for daemons, then spawn()/shutdown()/join().
///
/// Shutdown: shutdown() makes every fiber-blocking call return ECANCELED from
/// then on, cancels the I/O in flight on every ring (the cancelled calls
/// return ECANCELED once their CQE arrives) and wakes every sleeper with
/// ECANCELED. The carriers exit when no fiber is left; join() waits for that,
/// and for the offload pool's threads (core/offload.h).
/// A fiber that never returns keeps the runtime alive: check the results.
/// Thread-safety: every member may be called from any thread, except join()
/// and the destructor, which must not run on one of this runtime's fibers.
/// Errors: start() returns EINVAL for an option out of range (logged with its
/// name; more than kMaxCarriers carriers, asked for or picked by the placement,
/// is one), for a topology that does not load (a bad description, ENOENT for a
/// missing XML file) or a placement that does not fit it (an explicit PU not in
/// the topology, a duplicate, an empty list), or the errno of the first carrier that failed to come up (ring
/// set-up: ENOMEM for the memlock limit, EPERM when io_uring is disabled;
/// ENOMEM when its fixed buffers cannot be mapped) and logs why. Carrier
/// binding failures are logged and the carrier runs unbound; a refused
/// registration of fixed buffers or files is logged and the carrier runs with
/// the plain fallback (core/fixed.h); a refused SQPOLL is logged and the ring
/// runs without it.

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "base/result.h"
#include "core/fiber.h"
#include "numa/topology.h"
#include "numa/placement.h"

namespace spindle {

/// What an idle carrier does (RuntimeOptions::pollMode; docs/RUNTIME.md, "Poll modes").
enum class PollMode : uint8_t {
    kBlock,   // park in io_uring_enter until a completion, a wake-up or the next timer: ~0% CPU idle
    kSpin,    // never sleep in the kernel: poll the CQ, inbox, timers and other carriers' deques;
              // burns 100% of each carrier's CPU when idle, and no waker ever pays for a wake-up
    kHybrid,  // spin for spinMicros after running out of work, then park as kBlock does
};

/// Where an idle carrier looks for work (RuntimeOptions::stealPolicy; docs/RUNTIME.md, "Work stealing
/// across NUMA nodes"). Distances are those of numa::Distance, from each carrier's logical PU.
enum class StealPolicy : uint8_t {
    kNuma,       // nearest victims first; another node only when every victim on this node is empty and the
                 // remote victim has more than crossNodeStealThreshold runnable fibers queued
    kRandom,     // a victim chosen at random on each attempt, any node (the baseline)
    kLocalOnly,  // only victims on this carrier's NUMA node
    kNone,       // never steal: a fiber runs where it was spawned or woken
};

/// Which I/O driver the carriers use (RuntimeOptions::backend; docs/RUNTIME.md, "Backends").
enum class Backend : uint8_t {
    kAuto,   // io_uring where it can be used at all, else epoll (probed once; the reason is logged)
    kUring,  // io_uring only: start() fails where it cannot be set up
    kEpoll,  // epoll readiness for sockets and pipes, the offload pool for files
};

/// "auto", "io_uring" or "epoll".
const char* toString(Backend backend) noexcept;
/// The backend named by toString()'s spelling. Errors: EINVAL for any other text.
[[nodiscard]] Result<Backend> parseBackend(std::string_view name) noexcept;

/// "numa", "random", "local-only" or "none".
const char* toString(StealPolicy policy) noexcept;
/// The policy named by toString()'s spelling.
/// Errors: EINVAL for any other text.
[[nodiscard]] Result<StealPolicy> parseStealPolicy(std::string_view name) noexcept;

/// The most carriers one runtime runs (RuntimeOptions::carriers, and the count a placement policy picks
/// when carriers is 0). Each carrier is a thread with its own ring and stack pool, and each keeps every
/// other carrier in its victim order, so the start-up cost grows with the square of the count: 1024
/// carriers hold 16 MiB of victim orders, 99,999 would ask for 160 GB. More than the cores of the
/// largest machines a process runs on, and several carriers per PU (oversubscription, a synthetic
/// topology) stay well inside it.
inline constexpr unsigned kMaxCarriers = 1024;

struct RuntimeOptions {
    // The I/O driver. Precedence: an explicit kUring or kEpoll here, then the SPINDLE_BACKEND environment
    // variable ("auto", "io_uring", "epoll"), then kAuto. With kAuto, start() probes io_uring once and
    // falls back to epoll only when io_uring cannot be used at all (ENOSYS, EPERM, ENOMEM at set-up, a
    // required feature missing), logging why; never on an error later in the run.
    Backend backend = Backend::kAuto;
    unsigned carriers = 0;          // 0: one per core of the process cpuset; at most kMaxCarriers
    unsigned ringEntries = 256;     // SQ entries per carrier ring
    unsigned cqEntries = 0;         // CQ entries per carrier ring (0: max(2 x ringEntries, 4096); else
                                    // ringEntries..524288): room for one completion per operation in flight
    size_t stackSize = 64 * 1024;   // default usable stack per fiber
    bool bindCarriers = true;       // pin each carrier thread to one PU with hwloc
    // "" (see below), "machine", "synthetic:<hwloc string>" or "xml:<path>". Precedence: this option, then
    // the SPINDLE_TOPOLOGY environment variable (same syntax), then this machine (where hwloc's own
    // HWLOC_XMLFILE / HWLOC_SYNTHETIC still apply). A synthetic or XML topology runs carriers unbound.
    std::string topology;
    // Which PU each carrier stands for (numa/placement.h); with carriers == 0, the policy's natural
    // count. explicitPus (OS indexes) is read for Placement::kExplicit only. numa::parsePlacement
    // turns "per-core", "per-pu", "compact", "scatter" or "list:0,2,4" into these two.
    numa::Placement placement = numa::Placement::kPerCore;
    std::vector<unsigned> explicitPus;
    bool deferTaskrun = true;       // ask for IORING_SETUP_DEFER_TASKRUN (probed)
    unsigned offloadThreads = 2;    // threads of the offload() pool (1..1024), started on first use
    // Where the runtime's helper threads run: the kernel's io_uring workers (io-wq), which carry out what
    // a ring cannot finish inline (buffered writes to ext4, fsync, fdatasync: every write-ahead log's
    // work), and the offload() pool. OS CPU indexes; start() fails with EINVAL, logging why, for a CPU the
    // thread calling start() may not run on, and for a CPU a carrier is bound to (the kernel narrows a
    // new worker to its bound creator's CPUs whenever the set holds them); the kernel's refusal of
    // IORING_REGISTER_IOWQ_AFF (5.14) fails it with its errno.
    // Empty: the io-wq workers of a bound carrier share its one CPU (that narrowing again); on a busy
    // carrier a woken worker waits for the CPU, and so does the fiber it works for. The offload pool
    // runs on the CPUs of the thread that called start().
    std::vector<unsigned> workerCpus;
    // Registered resources per carrier (core/fixed.h). The buffers are pinned memory: count * size
    // bytes per carrier, counted against RLIMIT_MEMLOCK unless the process has CAP_IPC_LOCK.
    unsigned fixedBufferCount = 64;        // registered buffers per carrier (0..16384; 0: no pool)
    size_t fixedBufferSize = 64 * 1024;    // bytes each: a multiple of 4096, at most 1 GiB (checked when count > 0)
    unsigned fixedFileSlots = 1024;        // registered-file slots per carrier (0..1048576; 0: no table)
    PollMode pollMode = PollMode::kBlock;
    unsigned spinMicros = 50;       // kHybrid: µs an idle carrier spins before it parks (1..1,000,000)
    // IORING_SETUP_SQPOLL: a kernel thread per ring takes SQEs from the SQ, so submitting costs no system
    // call while that thread is awake. Its thread is pinned next to its carrier (SMT sibling, else the next
    // PU) when carriers are bound. Excludes DEFER_TASKRUN. Refused by the kernel: logged, ring runs without.
    bool sqpoll = false;
    unsigned sqThreadIdleMs = 10;   // with sqpoll: the SQ thread sleeps after this long idle (1..60,000)
    StealPolicy stealPolicy = StealPolicy::kNuma;
    // kNuma: a steal crosses a NUMA node only from a victim with more than this many runnable fibers
    // queued (0..1,000,000; 0: any non-empty remote victim, once the local ones are empty).
    unsigned crossNodeStealThreshold = 2;
    // The stall detector (docs/RUNTIME.md, "Seeing inside"): a fiber that runs this long without
    // switching out is logged once per stall with its name, id, carrier, run time and backtrace, taken
    // on its own stack (0: off; 1..60,000). The SPINDLE_STALL_MS environment variable, when set,
    // overrides this. A monitor thread per runtime wakes every max(1, stallThresholdMs / 2) ms while
    // a carrier is awake, and sleeps while every carrier is parked (a parked carrier runs no fiber).
    unsigned stallThresholdMs = 10;
    // join() logs the fibers still alive (Runtime::fibers, with backtraces) once this long after it began
    // waiting for them, then waits on (0: never; at most 3,600,000). Runtime::joinFor returns instead.
    unsigned shutdownReportMs = 5000;
    // SIGUSR1 prints every runtime's fiber listing, with backtraces, to stderr (a process-wide handler,
    // installed by the first runtime that asks). SPINDLE_FIBER_SIGNAL=1 turns it on as well.
    bool fiberListOnSignal = false;
};

/// One live fiber, as Runtime::fibers() saw it.
struct FiberInfo {
    uint64_t id = 0;
    std::string name;
    std::string state;            // "created", "runnable", "running" or "suspended"
    int carrier = -1;             // the carrier it runs on, last ran on, or was sent to
    int home = -1;                // the carrier that lists it (where it was spawned or first ran)
    std::string waitKind;         // suspended: "io", "sleep", "mutex", "join", ... ("" when it did not say)
    std::string waitDetail;       // e.g. "recv fd 7", "fiber 12", "0x7f3a...", then "deadline in 5 ms"
    uint64_t suspendedMs = 0;     // suspended: for about this long (to the carriers' loop-turn clock)
    std::vector<std::string> backtrace;  // suspended, when asked: "#0 0x... function+0x1c"
};

/// What Runtime::fibers() returns.
struct FiberListing {
    // By home carrier, newest first. A fiber is listed from its first suspension on: one that has not
    // waited yet (just spawned, or running to its end in one go) is counted in `live` but not listed,
    // unless it is the caller.
    std::vector<FiberInfo> fibers;
    uint64_t live = 0;                    // liveFibers() as the listing began
    // Carriers that did not pause within the patience (a fiber that never yields holds one): the fibers
    // they list are missing, and no backtraces are taken.
    std::vector<unsigned> unanswered;
};

/// The listing as text: a header line, then one line per fiber and its backtrace frames, indented.
[[nodiscard]] std::string formatFiberListing(const FiberListing& listing);

/// One entry of a carrier's victim order (Runtime::victimOrder).
struct Victim {
    unsigned carrier = 0;                                        // the victim's index
    numa::Distance distance = numa::Distance::kRemotePackage;    // from the thief's logical PU to the victim's
};

/// Counters of one carrier (read racily; for reports and tests).
struct CarrierStats {
    unsigned index = 0;
    int pu = -1;                    // OS index of the PU it is bound to; -1: unbound
    uint64_t fibersRun = 0;         // switches into a fiber
    uint64_t steals = 0;            // fibers taken from other carriers
    uint64_t parks = 0;             // times it blocked in io_uring_enter
    uint64_t timedParks = 0;        // ... of which with a timeout (a timer, a deadline, a stack scavenge due)
    uint64_t idleSpins = 0;         // idle spells spent spinning instead of parking (kSpin, kHybrid)
    uint64_t wakesSent = 0;         // MSG_RING or eventfd wake-ups sent to parked carriers
    uint64_t enters = 0;            // io_uring_enter calls
    uint64_t sqesSubmitted = 0;
    uint64_t cqesReaped = 0;
    uint64_t sqFull = 0;
    uint64_t stacksMapped = 0;      // stacks obtained from mmap (pool misses; a slab counts its stacks)
    uint64_t stackTrims = 0;        // madvise calls giving idle stacks' pages back to the kernel
    uint64_t stackSlabs = 0;        // slabs of stacks its pool has mapped now
    uint64_t stacksWarm = 0;        // stacks its pool keeps with their pages, ready for reuse
    uint64_t stacksInUse = 0;       // stacks of its pool out with fibers (or set aside for other threads)
    uint64_t waitsCancelled = 0;    // waits it ended early for FiberHandle::cancel() (I/O cancel SQEs, timers)
    bool fixedBuffersRegistered = false;  // its buffer pool is registered with its ring
    bool fixedFilesRegistered = false;    // its file table is registered with its ring
    uint64_t fixedIo = 0;           // read_fixed/write_fixed submitted here with the registered buffer
    uint64_t fixedFallbackIo = 0;   // ... submitted here as plain read/write (buffer of another carrier, or unregistered)
    uint64_t fixedFileIo = 0;       // FixedFile calls submitted here with the registered slot
    uint64_t fixedFileFallbackIo = 0;  // ... submitted here with the plain fd
    std::string ring;               // the ring's probed features (sqpoll, sq_thread_cpu, taskrun_flag, ...)
    // Work stealing (RuntimeOptions::stealPolicy), indexed by numa::Distance from this carrier to the victim.
    // An attempt is a victim that looked stealable (non-empty; above the threshold for a kNuma cross-node
    // steal) and was tried; a success took a fiber. sum(stealSuccesses) == steals.
    int logicalPu = -1;             // the topology PU it stands for, bound or not; -1: no topology
    unsigned node = 0;              // logical NUMA node of logicalPu (0 without a topology)
    std::array<uint64_t, numa::kDistanceClassCount> stealAttempts{};
    std::array<uint64_t, numa::kDistanceClassCount> stealSuccesses{};
    uint64_t fibersMigrated = 0;    // fibers that started running here after last running on another carrier
    uint64_t idleNs = 0;            // time parked in io_uring_enter or spinning idle (kSpin, kHybrid)
    uint64_t stalls = 0;            // stalls the detector found here (RuntimeOptions::stallThresholdMs)

    /// Steals that left the NUMA node (stealSuccesses at numa::crossesNode distances).
    [[nodiscard]] uint64_t crossNodeSteals() const noexcept;
    // Node-local memory (numa/placement.h, numa::Topology::memoryNodeOf).
    int memoryNode = -1;            // logical NUMA node its memory comes from (node, or a node with memory); -1: none
    bool stacksNodeBound = false;   // its fiber stacks are bound to that node (hwloc membind)
    bool threadMemoryBound = false; // its thread's memory policy (rings included) prefers that node
};

/// One line per carrier with its steal counters by distance class, migrations and idle time, e.g.
/// "carrier 3 (pu 6, node 1): run 40 steals same-core 0/0 same-cache 4/5 ... migrated 4 idle 12.5 ms"
/// (steals: successes/attempts per distance class).
[[nodiscard]] std::string formatStealStats(const std::vector<CarrierStats>& stats);

namespace detail {
class RuntimeImpl;
Result<Fiber*> createFiber(RuntimeImpl* rt, const SpawnOptions& options, size_t payloadSize,
                           size_t payloadAlign) noexcept;
void launchFiber(Fiber* fiber) noexcept;
/// The runtime of the fiber running on this thread, or nullptr.
RuntimeImpl* currentRuntime() noexcept;

/// Has `call(ctx)` run on carrier `carrier`'s thread and waits until it ran (see Runtime::runOnCarrier).
[[nodiscard]] Result<void> runOnCarrier(RuntimeImpl* rt, unsigned carrier, void (*call)(void* ctx) noexcept,
                                        void* ctx) noexcept;

template <class F>
auto spawnOn(RuntimeImpl* rt, F&& fn, const SpawnOptions& options)
    -> Result<FiberHandle<std::invoke_result_t<std::decay_t<F>>>> {
    using Fn = std::decay_t<F>;
    using T = std::invoke_result_t<Fn>;
    static_assert(!std::is_reference_v<T>, "a fiber returns a value, not a reference");
    using Payload = FiberPayload<Fn, T>;
    static_assert(alignof(Payload) <= 64, "over-aligned captures are not supported");
    auto fiber = createFiber(rt, options, sizeof(Payload), alignof(Payload));
    if (!fiber) { return Error{fiber.errorCode()}; }
    Fiber* f = *fiber;
    auto* payload = new (f->payload_) Payload(std::forward<F>(fn));
    f->payload_ = static_cast<ResultSlot<T>*>(payload);
    f->entry_ = &Payload::run;
    f->destroyPayload_ = &Payload::destroy;
    launchFiber(f);
    return FiberHandle<T>(f);
}
}  // namespace detail

class Runtime {
public:
    /// Starts the carriers and returns once each has its thread, its binding and its ring.
    static Result<Runtime> start(const RuntimeOptions& options = {}) noexcept;

    /// Runs fn as a fiber on a fresh runtime, waits for every fiber, shuts down
    /// and returns fn's value (or rethrows its exception).
    /// Errors: as start().
    template <class F>
    static auto run(F&& fn, const RuntimeOptions& options = {}) -> Result<std::invoke_result_t<std::decay_t<F>>> {
        using T = std::invoke_result_t<std::decay_t<F>>;
        auto rt = start(options);
        if (!rt) { return Error{rt.errorCode()}; }
        auto handle = rt->spawn(std::forward<F>(fn), SpawnOptions{.name = "main"});
        if (!handle) { return Error{handle.errorCode()}; }
        if constexpr (std::is_void_v<T>) {
            handle->join();  // an exception unwinds through ~Runtime, which shuts down and joins
            rt->waitIdle();
            return {};
        } else {
            T value = handle->join();
            rt->waitIdle();
            return value;
        }
    }

    Runtime(Runtime&&) noexcept;
    Runtime& operator=(Runtime&&) noexcept;
    Runtime(const Runtime&) = delete;
    Runtime& operator=(const Runtime&) = delete;
    /// Shuts down and joins if still running.
    ~Runtime();

    /// Starts fn as a new fiber. From a fiber of this runtime it starts on the
    /// caller's carrier (others may steal it); from a plain thread, round robin.
    /// Errors: ENOMEM (no stack), EINVAL (carrier index out of range),
    /// ECANCELED (shutdown has begun and the caller is not one of its fibers).
    template <class F>
    auto spawn(F&& fn, const SpawnOptions& options = {}) -> Result<FiberHandle<std::invoke_result_t<std::decay_t<F>>>> {
        return detail::spawnOn(impl_.get(), std::forward<F>(fn), options);
    }

    /// Runs fn() on carrier `carrier`'s own thread, in its loop between fibers, and returns once it has
    /// run: the one way to have work done by a given carrier (a registration only its thread may make,
    /// state that only it touches). fn must be quick, must not block (it holds up every fiber there)
    /// and must not throw. From a fiber this parks the fiber; from a plain thread it blocks the thread;
    /// from the target carrier's own thread it runs fn at once.
    /// Memory ordering: what the caller wrote before is visible to fn; what fn wrote, after the return.
    /// Errors: EINVAL for a carrier index out of range; ECANCELED once shutdown has begun, unless the
    /// caller is one of this runtime's fibers (whose carrier cannot exit under it).
    template <class F>
    Result<void> runOnCarrier(unsigned carrier, F&& fn) {
        auto call = [](void* ctx) noexcept { (*static_cast<std::remove_reference_t<F>*>(ctx))(); };
        return detail::runOnCarrier(impl_.get(), carrier, call, static_cast<void*>(std::addressof(fn)));
    }

    /// Blocks until no fiber is left (new ones may be spawned afterwards).
    void waitIdle() noexcept;
    /// Begins shutdown (see the class comment); returns at once. Idempotent.
    void shutdown() noexcept;
    /// Waits for every carrier thread to exit. After RuntimeOptions::shutdownReportMs it logs the fibers
    /// still alive (each keeps join() waiting: an untimed lock(), join() or offload() that nothing
    /// ends), then waits on. Precondition, checked (abort with a message): shutdown() was called, and
    /// the caller is not one of this runtime's fibers.
    void join() noexcept;
    /// join() with a limit: returns ETIMEDOUT, having logged the fibers still alive as join() does,
    /// when carriers are still running after `limit`; the runtime stays as it was (call again, or
    /// join()). Precondition: as join().
    [[nodiscard]] Result<void> joinFor(std::chrono::nanoseconds limit) noexcept;
    /// Every live fiber: id, name, state, carrier, what it waits for and since when, and with
    /// `backtraces` the frames of each suspended one, unwound from its saved context. Each carrier is
    /// paused at its next loop turn while the list is read, so the listing is exact when they all
    /// pause within `patience` (see FiberListing::unanswered). Costs a few microseconds of every
    /// carrier's time plus the unwinding; listings are taken one at a time. Any thread or fiber.
    [[nodiscard]] FiberListing fibers(bool backtraces = false,
                                      std::chrono::milliseconds patience = std::chrono::milliseconds(1000)) const;

    [[nodiscard]] unsigned carrierCount() const noexcept;
    /// Fibers spawned and not yet ended. Exact once nothing is being spawned or ending; meanwhile it may
    /// be off by the fibers in flight (carriers count spawns against credits, docs/RUNTIME.md). Any thread.
    [[nodiscard]] uint64_t liveFibers() const noexcept;
    [[nodiscard]] std::vector<CarrierStats> stats() const;
    /// The victims carrier `carrier` tries, in the order its steal policy walks them when every one is
    /// non-empty (kRandom: the order its random start rotates through), with each victim's distance.
    /// Errors: EINVAL for a carrier index out of range.
    [[nodiscard]] Result<std::vector<Victim>> victimOrder(unsigned carrier) const;
    /// The topology the carriers were placed on, or nullptr when hwloc could not read this machine.
    [[nodiscard]] const numa::Topology* topology() const noexcept;
    /// One line about the machine and the carriers' placement.
    [[nodiscard]] std::string describe() const;
    /// The I/O driver its carriers use (kUring or kEpoll; never kAuto once started).
    [[nodiscard]] Backend backend() const noexcept;

private:
    explicit Runtime(std::unique_ptr<detail::RuntimeImpl> impl) noexcept;
    std::unique_ptr<detail::RuntimeImpl> impl_;
};

/// Starts fn as a new fiber of the caller's runtime. Precondition: called on a fiber.
/// Errors: as Runtime::spawn; EPERM off-fiber.
template <class F>
auto spawn(F&& fn, const SpawnOptions& options = {}) -> Result<FiberHandle<std::invoke_result_t<std::decay_t<F>>>> {
    detail::RuntimeImpl* rt = detail::currentRuntime();
    if (rt == nullptr) { return Error{EPERM}; }
    return detail::spawnOn(rt, std::forward<F>(fn), options);
}

}  // namespace spindle
