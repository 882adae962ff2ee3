// SPDX-License-Identifier: Apache-2.0
#include "core/runtime_metrics.h"

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace spindle::metrics {

namespace {

// A family read from one uint64_t of CarrierStats.
struct Field {
    const char* name;
    Type type;
    const char* help;
    uint64_t CarrierStats::*member;
};

constexpr Field kFields[] = {
    {"spindle_carrier_fibers_run_total", Type::kCounter, "Switches into a fiber.", &CarrierStats::fibersRun},
    {"spindle_carrier_fibers_migrated_total", Type::kCounter,
     "Fibers that started running here after last running on another carrier.", &CarrierStats::fibersMigrated},
    {"spindle_carrier_parks_total", Type::kCounter, "Times the carrier blocked in the kernel, idle.",
     &CarrierStats::parks},
    {"spindle_carrier_timed_parks_total", Type::kCounter,
     "Parks with a timeout (a timer or a deadline to wake for); each costs the kernel a timer armed and cancelled.",
     &CarrierStats::timedParks},
    {"spindle_carrier_idle_spins_total", Type::kCounter,
     "Idle spells spent spinning instead of parking (poll modes spin and hybrid).", &CarrierStats::idleSpins},
    {"spindle_carrier_wakes_sent_total", Type::kCounter,
     "Wake-ups (MSG_RING or eventfd) this carrier sent to parked carriers.", &CarrierStats::wakesSent},
    {"spindle_carrier_enters_total", Type::kCounter,
     "System calls to submit, reap or wait: io_uring_enter (io_uring) or epoll_wait (epoll).",
     &CarrierStats::enters},
    {"spindle_carrier_sqes_submitted_total", Type::kCounter,
     "SQEs submitted to the ring (io_uring) or operations started (epoll).", &CarrierStats::sqesSubmitted},
    {"spindle_carrier_cqes_reaped_total", Type::kCounter, "Completions reaped and delivered.",
     &CarrierStats::cqesReaped},
    {"spindle_carrier_ring_full_total", Type::kCounter,
     "Times the submission queue was full and had to be flushed before an SQE could be taken.",
     &CarrierStats::sqFull},
    {"spindle_carrier_stalls_total", Type::kCounter,
     "Fibers the stall detector found running too long without yielding.", &CarrierStats::stalls},
    {"spindle_carrier_stacks_mapped_total", Type::kCounter, "Fiber stacks obtained from mmap (stack-pool misses).",
     &CarrierStats::stacksMapped},
    {"spindle_carrier_stack_trims_total", Type::kCounter,
     "madvise calls giving idle stacks' pages back to the kernel.", &CarrierStats::stackTrims},
    {"spindle_carrier_waits_cancelled_total", Type::kCounter,
     "Waits this carrier ended early for FiberHandle::cancel().", &CarrierStats::waitsCancelled},
    {"spindle_carrier_stacks_in_use", Type::kGauge, "Stacks of this carrier's pool out with fibers now.",
     &CarrierStats::stacksInUse},
    {"spindle_carrier_stacks_warm", Type::kGauge, "Stacks this carrier's pool keeps with their pages for reuse.",
     &CarrierStats::stacksWarm},
    {"spindle_carrier_stack_slabs", Type::kGauge, "Slabs of stacks this carrier's pool has mapped now.",
     &CarrierStats::stackSlabs},
};

// A family split by a second label: the first member for one value of it, the second for the other.
struct SplitField {
    const char* name;
    const char* help;
    const char* label;
    const char* firstValue;
    uint64_t CarrierStats::*first;
    const char* secondValue;
    uint64_t CarrierStats::*second;
};

constexpr SplitField kSplitFields[] = {
    {"spindle_carrier_fixed_buffer_io_total",
     "Reads and writes of registered buffers: through the registration, or as plain I/O (another carrier's "
     "buffer, or none registered).",
     "path", "registered", &CarrierStats::fixedIo, "fallback", &CarrierStats::fixedFallbackIo},
    {"spindle_carrier_fixed_file_io_total",
     "Calls on fixed files: through the registered slot, or with the plain descriptor.", "path", "registered",
     &CarrierStats::fixedFileIo, "fallback", &CarrierStats::fixedFileFallbackIo},
};

}  // namespace

void writeCarrierStats(Writer& out, std::span<const CarrierStats> stats) {
    std::vector<std::string> index;
    index.reserve(stats.size());
    for (const CarrierStats& s : stats) { index.push_back(std::to_string(s.index)); }

    for (const Field& f : kFields) {
        out.family(f.name, f.type, f.help);
        for (size_t i = 0; i < stats.size(); ++i) { out.sample({{"carrier", index[i]}}, stats[i].*f.member); }
    }
    for (const SplitField& f : kSplitFields) {
        out.family(f.name, Type::kCounter, f.help);
        for (size_t i = 0; i < stats.size(); ++i) {
            out.sample({{"carrier", index[i]}, {f.label, f.firstValue}}, stats[i].*f.first);
            out.sample({{"carrier", index[i]}, {f.label, f.secondValue}}, stats[i].*f.second);
        }
    }
    // Steals by distance class from the thief to the victim (numa::Distance's spellings).
    out.family("spindle_carrier_steals_total", Type::kCounter,
               "Fibers this carrier took from another carrier's run queue, by distance to the victim.");
    for (size_t i = 0; i < stats.size(); ++i) {
        for (size_t k = 0; k < numa::kDistanceClassCount; ++k) {
            out.sample({{"carrier", index[i]}, {"distance", numa::toString(static_cast<numa::Distance>(k))}},
                       stats[i].stealSuccesses[k]);
        }
    }
    out.family("spindle_carrier_steal_attempts_total", Type::kCounter,
               "Victims that looked stealable and were tried, by distance to the victim.");
    for (size_t i = 0; i < stats.size(); ++i) {
        for (size_t k = 0; k < numa::kDistanceClassCount; ++k) {
            out.sample({{"carrier", index[i]}, {"distance", numa::toString(static_cast<numa::Distance>(k))}},
                       stats[i].stealAttempts[k]);
        }
    }
    out.family("spindle_carrier_idle_seconds_total", Type::kCounter,
               "Time spent parked in the kernel or spinning idle.");
    for (size_t i = 0; i < stats.size(); ++i) {
        out.sample({{"carrier", index[i]}}, static_cast<double>(stats[i].idleNs) / 1e9);
    }
    out.family("spindle_carrier_info", Type::kGauge,
               "Always 1; the labels say where the carrier runs: the PU it is bound to (-1: unbound), the "
               "topology PU it stands for and its NUMA node.");
    for (size_t i = 0; i < stats.size(); ++i) {
        const std::string pu = std::to_string(stats[i].pu);
        const std::string logicalPu = std::to_string(stats[i].logicalPu);
        const std::string node = std::to_string(stats[i].node);
        out.sample({{"carrier", index[i]}, {"pu", pu}, {"logical_pu", logicalPu}, {"node", node}}, uint64_t{1});
    }
}

void writeRuntime(Writer& out, const Runtime& runtime) {
    out.family("spindle_runtime_info", Type::kGauge, "Always 1; the labels say which I/O driver the carriers use.");
    out.sample({{"backend", toString(runtime.backend())}}, uint64_t{1});
    out.family("spindle_carriers", Type::kGauge, "Carriers of the runtime.");
    out.sample({}, uint64_t{runtime.carrierCount()});
    out.family("spindle_fibers_live", Type::kGauge, "Fibers spawned and not yet ended.");
    out.sample({}, runtime.liveFibers());
    const std::vector<CarrierStats> stats = runtime.stats();
    writeCarrierStats(out, stats);
}

}  // namespace spindle::metrics
