// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The shared state of one Runtime: its carriers, the live-fiber count, and the
/// idle-carrier bookkeeping used to wake a parked carrier when work piles up.
///
/// Thread-safety: the carrier list is fixed after start(); the counters are atomics.

#include <sched.h>
#include <time.h>  // clockid_t

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "base/result.h"
#include "core/internal/carrier.h"
#include "core/internal/offload_pool.h"
#include "core/runtime.h"
#include "numa/topology.h"

namespace spindle::detail {

class RuntimeImpl;

/// The stall detector of one runtime (RuntimeOptions::stallThresholdMs; core/introspect.cpp): a thread
/// that looks at every carrier each half threshold and reports a fiber that has not switched out.
class StallMonitor {
public:
    StallMonitor(RuntimeImpl* rt, uint64_t thresholdNs) noexcept;
    ~StallMonitor();
    StallMonitor(const StallMonitor&) = delete;
    StallMonitor& operator=(const StallMonitor&) = delete;
    /// Starts the thread. Errors: EAGAIN (no thread), ENOMEM.
    Result<void> start() noexcept;
    /// Stops and joins the thread. Idempotent.
    void stop() noexcept;

private:
    struct Watch {
        uint64_t run = 0;                 // the carrier's fibersRun at the last look
        uint64_t since = 0;               // when it was last seen to move (or the carrier idle)
        uint64_t cpuSince = 0;            // its thread's CPU time then
        uint64_t reported = UINT64_MAX;   // the fibersRun of the stall last reported
        clockid_t clock{};                // its thread's CPU-time clock, once clockKnown
        bool clockKnown = false;
        int stat = -1;                    // /proc/self/task/TID/stat, open; -1: not (yet)
        bool statTried = false;
    };
    // The CPU time the carrier's thread has used (0 before it started, or if unreadable).
    static uint64_t threadCpuNs(Carrier* c, Watch& w) noexcept;
    // Whether the carrier's thread is waiting in the kernel now (not running and not runnable); true
    // when that cannot be told.
    static bool blockedInKernel(Carrier* c, Watch& w) noexcept;
    static constexpr unsigned kBurst = 8;                       // reports per window, at most
    static constexpr uint64_t kWindowNs = 10'000'000'000;       // 10 s
    void run() noexcept;
    void report(Carrier* c, uint64_t ranNs) noexcept;
    // Blocks while every carrier is parked (until one leaves park() or stop()); see run().
    void sleepWhileAllParked() noexcept;

    RuntimeImpl* rt_;
    uint64_t thresholdNs_;
    std::vector<Watch> watch_;            // one per carrier; the monitor thread's alone
    uint64_t windowStart_ = 0;
    unsigned inWindow_ = 0;
    uint64_t suppressed_ = 0;
    std::mutex mutex_;
    std::condition_variable cv_;
    bool stop_ = false;                   // guarded by mutex_
    std::atomic<bool> stopAsleep_{false}; // stop_, for the sleep without the mutex (see run())
    std::thread thread_;
};

class RuntimeImpl {
public:
    explicit RuntimeImpl(const RuntimeOptions& options) noexcept;
    ~RuntimeImpl();

    Result<void> start() noexcept;
    void shutdown() noexcept;
    void join() noexcept;
    /// Runtime::joinFor (core/introspect.cpp).
    Result<void> joinFor(std::chrono::nanoseconds limit) noexcept;
    void waitIdle() noexcept;
    /// Runtime::fibers (core/introspect.cpp). Any thread, fibers of this runtime included.
    FiberListing listFibers(bool backtraces, std::chrono::nanoseconds patience) const;

    [[nodiscard]] bool stopping() const noexcept { return stopping_.load(std::memory_order_relaxed); }
    [[nodiscard]] const std::atomic<bool>& stoppingFlag() const noexcept { return stopping_; }
    /// The live count itself: live fibers plus the credits the carriers hold (see admitFiber). Zero
    /// only when no fiber is live and every carrier has given its credits back (an idle carrier does).
    [[nodiscard]] uint64_t live() const noexcept { return live_.load(std::memory_order_seq_cst); }
    /// Live fibers (Runtime::liveFibers): live() less the credits. Exact while no fiber is being
    /// spawned or ending; during that it may be off by those in flight, never below zero. Any thread.
    [[nodiscard]] uint64_t liveFibers() const noexcept;
    [[nodiscard]] const RuntimeOptions& options() const noexcept { return options_; }
    [[nodiscard]] const std::vector<std::unique_ptr<Carrier>>& carriers() const noexcept { return carriers_; }
    [[nodiscard]] const numa::Topology* topology() const noexcept { return topology_ ? &*topology_ : nullptr; }
    [[nodiscard]] OffloadPool& offloadPool() noexcept { return offload_; }
    /// The backend start() chose (kUring before start()).
    [[nodiscard]] Backend backend() const noexcept { return backend_; }

    /// Counts a new fiber; false (nothing counted) if a stranger spawns during shutdown.
    /// A spawn from one of this runtime's fibers takes a credit of its carrier's instead of touching
    /// the shared count: a carrier adds kLiveCreditBatch to live_ at a time and spends it spawn by
    /// spawn, so that carriers spawning and ending fibers at the same time do not bounce live_'s
    /// cache line between their CPUs on every fiber.
    bool admitFiber(bool fromOwnFiber) noexcept;
    /// Uncounts a fiber that died or never started. On one of this runtime's carriers, as a credit of
    /// that carrier (past 2 * kLiveCreditBatch credits, the surplus goes back to live_).
    void retireFiber() noexcept;
    /// Gives all of carrier `c`'s credits back to live_ (on c's thread): an idle carrier holds none.
    void flushLiveCredits(Carrier* c) noexcept;
    static constexpr uint32_t kLiveCreditBatch = 64;
    Carrier* pickCarrier() noexcept;

    /// Wakes one parked carrier other than `from`, if any is parked: called when
    /// `from` has more runnable fibers than it can run at once.
    void wakeIdle(const Carrier* from) noexcept;
    void wakeAll() noexcept;

    std::atomic<uint32_t> parkedCount_{0};
    /// 1 while the stall monitor sleeps because every carrier was parked (no fiber can stall then); a
    /// carrier leaving park() clears it and wakes the monitor (wakeStallMonitor). Beside parkedCount_,
    /// whose line a carrier leaving park() has just written.
    std::atomic<uint32_t> stallMonitorAsleep_{0};
    /// Clears stallMonitorAsleep_ and wakes the monitor if it was set. Any thread.
    void wakeStallMonitor() noexcept {
        if (stallMonitorAsleep_.exchange(0, std::memory_order_seq_cst) != 0) { stallMonitorAsleep_.notify_one(); }
    }
    /// Carriers idle but spinning (kSpin, kHybrid): they steal, and need no wake-up.
    std::atomic<uint32_t> spinningCount_{0};

private:
    Result<void> loadTopology() noexcept;
    // Checks RuntimeOptions::workerCpus against the calling thread's CPUs, fills `workers` with them and
    // places the offload pool (there, or on the calling thread's CPUs when none are given). EINVAL.
    Result<void> placeWorkers(cpu_set_t& workers) noexcept;
    // join()'s checked preconditions: not on one of its carriers, and after shutdown().
    void checkJoinable(const char* what) const noexcept;
    [[nodiscard]] bool carriersExited() const noexcept;
    // Polls carriersExited() every millisecond for at most `limit`; whether they all exited.
    [[nodiscard]] bool waitCarriersExited(std::chrono::nanoseconds limit) const noexcept;
    // Logs the fibers still alive (join() after shutdownReportMs, joinFor at its limit).
    void reportAlive(std::chrono::nanoseconds waited) const noexcept;
    // Adds this runtime to (or removes it from) those SIGUSR1 lists.
    void listOnSignal(bool on) noexcept;
    // Adds this runtime to (or removes it from) spindle_debug_runtimes, the list debuggers read.
    void showToDebuggers(bool on) noexcept;
    // Takes n from live_; the last one out wakes waitIdle() and, during shutdown, the carriers.
    void dropLive(uint64_t n) noexcept;

    RuntimeOptions options_;
    std::optional<numa::Topology> topology_;
    std::vector<std::unique_ptr<Carrier>> carriers_;
    alignas(64) std::atomic<uint64_t> live_{0};
    std::atomic<bool> stopping_{false};
    std::atomic<uint32_t> roundRobin_{0};
    bool joined_ = false;
    Backend backend_ = Backend::kUring;
    OffloadPool offload_;  // closed by shutdown(), joined by join() after the carriers
    unsigned stallThresholdMs_ = 0;  // the option, or SPINDLE_STALL_MS
    static constexpr unsigned long kMaxStallMs = 60'000;
    std::unique_ptr<StallMonitor> stallMonitor_;  // null when the detector is off
    bool listedOnSignal_ = false;
    // For debuggers (tools/gdb/spindle.py reads these by name): the next runtime of
    // spindle_debug_runtimes, and the first carrier (Carrier::debugNext_ links the others).
    RuntimeImpl* debugNext_ = nullptr;
    Carrier* debugCarriers_ = nullptr;
    bool shownToDebuggers_ = false;
    mutable std::mutex listMutex_;  // one listing at a time (each pauses every carrier)
};

/// Monotonic clock in nanoseconds (CLOCK_MONOTONIC, the steady_clock epoch).
uint64_t nowNs() noexcept;

}  // namespace spindle::detail
