// SPDX-License-Identifier: Apache-2.0
// spindle-topo: shows the topology the runtime sees, where each carrier sits and the order in which it
// steals; `spindle-topo experiment` runs a skewed workload under each steal policy and prints the results
// side by side (docs/RUNTIME.md, "Work stealing across NUMA nodes"; docs/PERFORMANCE.md).
//
// With a synthetic or XML topology the carriers run unbound ("simulation mode"): placement, victim orders
// and steal counts follow the described machine, but every carrier thread shares this machine's CPUs, so
// makespans measure the policy on this machine, not on the one described.
//
// `experiment --json` prints the same results as one JSON object on stdout instead of the table (through
// nlohmann::json, apps/common/json.h: a --topology path with quotes or backslashes stays valid JSON).
//
// Exit status: 0 done; 1 the runtime did not start or a fiber could not be spawned (the message says why);
// 2 a bad flag value.

#include <time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "apps/common/backend_flag.h"
#include "apps/common/cli.h"
#include "apps/common/json.h"
#include "base/cpu_list.h"
#include "core/fiber.h"
#include "core/runtime.h"
#include "numa/placement.h"
#include "numa/topology.h"

namespace {

using spindle::CarrierStats;
using spindle::Runtime;
using spindle::RuntimeOptions;
using spindle::StealPolicy;
namespace numa = spindle::numa;

using spindle::apps::kExitFailure;
using spindle::apps::kExitUsage;

struct Common {
    std::string topology;  // "", "synthetic:..." or "xml:..."
    std::string placementText = "per-core";
    numa::PlacementSpec placement;  // parsed from placementText
    unsigned carriers = 0;
    unsigned threshold = 2;
    std::string backend = "auto";
};

struct Experiment {
    std::vector<std::string> policies{"numa", "random", "local-only", "none"};
    unsigned fibers = 256;
    unsigned workUs = 200;
    unsigned slices = 4;
    std::string skew = "one-carrier";
    unsigned repetitions = 3;
    bool json = false;
};

RuntimeOptions runtimeOptions(const Common& c, StealPolicy policy) {
    RuntimeOptions o;
    o.topology = c.topology;
    o.placement = c.placement.policy;
    o.explicitPus = c.placement.pus;
    o.carriers = c.carriers;
    o.stealPolicy = policy;
    o.crossNodeStealThreshold = c.threshold;
    o.backend = spindle::apps::backendFromFlag(c.backend);
    o.fixedBufferCount = 0;  // not used here; many simulated carriers should not pin memory
    o.fixedFileSlots = 0;
    return o;
}

int showTopology(const Common& c) {
    auto rt = Runtime::start(runtimeOptions(c, StealPolicy::kNuma));
    if (!rt) {
        fmt::print(stderr, "spindle-topo: the runtime did not start: {}{}\n", rt.error().message(),
                   spindle::apps::startFailureNote(c.backend));
        return kExitFailure;
    }
    const numa::Topology* t = rt->topology();
    if (t == nullptr) {
        fmt::print("topology: unknown (hwloc could not read this machine); carriers run unbound, all same-node\n");
    } else {
        fmt::print("topology: {}\n", t->describe());
        fmt::print("NUMA nodes: {} (counting nodes without allowed PUs)\n", t->nodeCount());
        std::vector<unsigned> allowed;
        for (const numa::Pu& p : t->pus()) { allowed.push_back(p.os); }
        fmt::print("allowed cpuset: {}\n", spindle::formatCpuList(allowed));
        fmt::print("PUs (os index: package/node/core):\n");
        for (const numa::Pu& p : t->pus()) {
            fmt::print("  P#{:<4} package {} node {} core {}\n", p.os, p.package, p.node, p.core);
        }
    }
    const std::vector<CarrierStats> stats = rt->stats();
    const bool simulated = t != nullptr && t->isSynthetic();
    fmt::print("\ncarriers: {}, backend {}{}\n", stats.size(), spindle::toString(rt->backend()),
               simulated ? fmt::format(" (simulation: unbound, sharing this machine's {} CPUs)", sysconf(_SC_NPROCESSORS_ONLN))
                         : "");
    for (const CarrierStats& s : stats) {
        fmt::print("  carrier {:<3} logical PU {:<4} node {} bound to {}\n", s.index, s.logicalPu, s.node,
                   s.pu >= 0 ? fmt::format("P#{}", s.pu) : std::string("nothing"));
    }
    fmt::print("\nvictim order (nearest first; a steal crosses a node at same-package and beyond):\n");
    for (const CarrierStats& s : stats) {
        auto order = rt->victimOrder(s.index);
        if (!order) {
            fmt::print(stderr, "spindle-topo: victimOrder({}): {}\n", s.index, order.error().message());
            return kExitFailure;
        }
        std::string line;
        numa::Distance cls = numa::Distance::kSamePu;
        bool first = true;
        for (const spindle::Victim& v : *order) {
            if (first || v.distance != cls) {
                line += fmt::format("{}{}: ", first ? "" : " | ", numa::toString(v.distance));
                cls = v.distance;
                first = false;
            } else {
                line += ",";
            }
            line += fmt::format("{}", v.carrier);
        }
        fmt::print("  carrier {:<3} {}\n", s.index, line.empty() ? "(none)" : line);
    }
    return 0;
}

// Burns `ns` of the calling thread's CPU time (not wall time: a simulated carrier shares its CPU).
void burnCpu(uint64_t ns) {
    auto cpuNow = [] {
        timespec ts;
        ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
        return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(ts.tv_nsec);
    };
    const uint64_t until = cpuNow() + ns;
    while (cpuNow() < until) {}
}

struct RunResult {
    double makespanMs = 0;
    std::array<uint64_t, numa::kDistanceClassCount> steals{};
    uint64_t migrated = 0;
    double maxOverMean = 0;  // slices run per carrier: the busiest carrier over the mean
    double cv = 0;           // ... coefficient of variation
    double idleMs = 0;       // summed over carriers
};

int runOnce(const Common& c, const Experiment& e, StealPolicy policy, RunResult& out) {
    auto rt = Runtime::start(runtimeOptions(c, policy));
    if (!rt) {
        fmt::print(stderr, "spindle-topo: the runtime did not start: {}{}\n", rt.error().message(),
                   spindle::apps::startFailureNote(c.backend));
        return kExitFailure;
    }
    const std::vector<CarrierStats> before = rt->stats();
    std::vector<int> targets;
    for (const CarrierStats& s : before) {
        if (e.skew == "one-carrier" ? s.index == 0 : s.node == before[0].node) { targets.push_back(int(s.index)); }
    }
    const size_t n = before.size();
    std::unique_ptr<std::atomic<uint64_t>[]> slicesOn(new std::atomic<uint64_t>[n]);
    for (size_t i = 0; i < n; ++i) { slicesOn[i].store(0); }
    const uint64_t sliceNs = uint64_t{e.workUs} * 1000u / e.slices;

    std::vector<spindle::FiberHandle<void>> handles;
    handles.reserve(e.fibers);
    const auto start = std::chrono::steady_clock::now();
    for (unsigned i = 0; i < e.fibers; ++i) {
        auto h = rt->spawn(
            [&, sliceNs] {
                for (unsigned k = 0; k < e.slices; ++k) {
                    slicesOn[static_cast<size_t>(spindle::this_fiber::carrierIndex())].fetch_add(1, std::memory_order_relaxed);
                    burnCpu(sliceNs);
                    spindle::this_fiber::yield();
                }
            },
            spindle::SpawnOptions{.name = "work", .carrier = targets[i % targets.size()]});
        if (!h) {
            fmt::print(stderr, "spindle-topo: spawn: {}\n", h.error().message());
            return kExitFailure;
        }
        handles.push_back(std::move(*h));
    }
    for (auto& h : handles) { h.join(); }
    out.makespanMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    rt->shutdown();
    rt->join();
    const std::vector<CarrierStats> after = rt->stats();
    out.steals = {};
    out.migrated = 0;
    out.idleMs = 0;
    for (const CarrierStats& s : after) {
        for (size_t k = 0; k < numa::kDistanceClassCount; ++k) { out.steals[k] += s.stealSuccesses[k]; }
        out.migrated += s.fibersMigrated;
        out.idleMs += static_cast<double>(s.idleNs) / 1e6;
    }
    double sum = 0, sq = 0, mx = 0;
    for (size_t i = 0; i < n; ++i) {
        const double v = static_cast<double>(slicesOn[i].load());
        sum += v;
        sq += v * v;
        mx = std::max(mx, v);
    }
    const double mean = sum / static_cast<double>(n);
    out.maxOverMean = mean > 0 ? mx / mean : 0;
    out.cv = mean > 0 ? std::sqrt(std::max(0.0, sq / static_cast<double>(n) - mean * mean)) / mean : 0;
    return 0;
}

int runExperiment(const Common& c, const Experiment& e) {
    std::vector<StealPolicy> policies;
    for (const std::string& name : e.policies) {
        auto p = spindle::parseStealPolicy(name);
        if (!p) {
            fmt::print(stderr, "spindle-topo: unknown policy '{}' (numa, random, local-only, none)\n", name);
            return kExitUsage;
        }
        policies.push_back(*p);
    }
    if (e.skew != "one-carrier" && e.skew != "hot-node") {
        fmt::print(stderr, "spindle-topo: --skew is one-carrier or hot-node, not '{}'\n", e.skew);
        return kExitUsage;
    }
    spindle::apps::Json json;
    {
        auto probe = Runtime::start(runtimeOptions(c, StealPolicy::kNuma));
        if (!probe) {
            fmt::print(stderr, "spindle-topo: the runtime did not start: {}{}\n", probe.error().message(),
                       spindle::apps::startFailureNote(c.backend));
            return kExitFailure;
        }
        const numa::Topology* t = probe->topology();
        if (e.json) {
            json = {{"online_cpus", sysconf(_SC_NPROCESSORS_ONLN)},
                    {"topology_flag", c.topology},
                    {"topology", t != nullptr ? spindle::apps::Json(t->describe()) : spindle::apps::Json()},
                    {"simulation", t != nullptr && t->isSynthetic()},
                    {"carriers", probe->carrierCount()},
                    {"placement", c.placementText},
                    {"backend", spindle::toString(probe->backend())},
                    {"fibers", e.fibers},
                    {"work_us", e.workUs},
                    {"slices", e.slices},
                    {"skew", e.skew},
                    {"threshold", c.threshold},
                    {"repetitions", e.repetitions}};
        } else {
            fmt::print("machine: {} online CPUs; topology: {}\n", sysconf(_SC_NPROCESSORS_ONLN),
                       t != nullptr ? t->describe() : std::string("unknown"));
            fmt::print("carriers: {}{}, backend {}; workload: {} fibers x {} us CPU in {} slices, skew {}, threshold {}, "
                       "{} repetitions (median makespan; other rows from the median run)\n",
                       probe->carrierCount(),
                       t != nullptr && t->isSynthetic() ? " (SIMULATION: unbound threads sharing this machine's CPUs)" : "",
                       spindle::toString(probe->backend()), e.fibers, e.workUs, e.slices, e.skew, c.threshold,
                       e.repetitions);
        }
    }
    std::vector<RunResult> results;
    std::vector<double> spreads;
    for (StealPolicy p : policies) {
        std::vector<RunResult> runs(e.repetitions);
        for (RunResult& r : runs) {
            if (int rc = runOnce(c, e, p, r); rc != 0) { return rc; }
        }
        std::sort(runs.begin(), runs.end(), [](const RunResult& a, const RunResult& b) { return a.makespanMs < b.makespanMs; });
        results.push_back(runs[runs.size() / 2]);
        spreads.push_back(runs.back().makespanMs - runs.front().makespanMs);
    }
    auto crossFraction = [&](size_t i) {
        uint64_t all = 0, cross = 0;
        for (size_t k = 0; k < numa::kDistanceClassCount; ++k) {
            all += results[i].steals[k];
            if (numa::crossesNode(static_cast<numa::Distance>(k))) { cross += results[i].steals[k]; }
        }
        return all == 0 ? -1.0 : static_cast<double>(cross) / static_cast<double>(all);
    };
    if (e.json) {
        spindle::apps::Json rows = spindle::apps::Json::array();
        for (size_t i = 0; i < results.size(); ++i) {
            const RunResult& r = results[i];
            spindle::apps::Json steals = spindle::apps::Json::object();
            for (size_t k = 0; k < numa::kDistanceClassCount; ++k) {
                steals.set(numa::toString(static_cast<numa::Distance>(k)), r.steals[k]);
            }
            const double cross = crossFraction(i);
            rows.push({{"policy", spindle::toString(policies[i])},
                       {"makespan_ms_median", r.makespanMs},
                       {"makespan_spread_ms", spreads[i]},
                       {"steals", std::move(steals)},
                       {"cross_node_steal_fraction", cross < 0 ? spindle::apps::Json() : spindle::apps::Json(cross)},
                       {"fibers_migrated", r.migrated},
                       {"balance_max_over_mean", r.maxOverMean},
                       {"balance_cv", r.cv},
                       {"idle_ms", r.idleMs}});
        }
        json.set("results", std::move(rows));
        fmt::print("{}\n", json.dump());
        return 0;
    }
    auto row = [&](const std::string& name, auto cell) {
        fmt::print("{:<26}", name);
        for (size_t i = 0; i < results.size(); ++i) { fmt::print(" {:>14}", cell(i)); }
        fmt::print("\n");
    };
    row("policy", [&](size_t i) { return std::string(spindle::toString(policies[i])); });
    row("makespan ms (median)", [&](size_t i) { return fmt::format("{:.1f}", results[i].makespanMs); });
    row("makespan spread ms", [&](size_t i) { return fmt::format("{:.1f}", spreads[i]); });
    for (size_t k = 0; k < numa::kDistanceClassCount; ++k) {
        row(fmt::format("steals {}", numa::toString(static_cast<numa::Distance>(k))),
            [&](size_t i) { return fmt::format("{}", results[i].steals[k]); });
    }
    row("cross-node steal fraction", [&](size_t i) {
        const double cross = crossFraction(i);
        return cross < 0 ? std::string("-") : fmt::format("{:.3f}", cross);
    });
    row("fibers migrated", [&](size_t i) { return fmt::format("{}", results[i].migrated); });
    row("balance max/mean", [&](size_t i) { return fmt::format("{:.2f}", results[i].maxOverMean); });
    row("balance CV", [&](size_t i) { return fmt::format("{:.2f}", results[i].cv); });
    row("idle ms (all carriers)", [&](size_t i) { return fmt::format("{:.1f}", results[i].idleMs); });
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    Common c;
    Experiment e;
    CLI::App app{"spindle-topo: the topology, carrier placement and steal order; a work-stealing experiment"};
    auto addCommon = [&c](CLI::App* a) {
        a->add_option("--topology", c.topology, "'' (this machine), synthetic:<hwloc string> or xml:<path>");
        a->add_option("--placement", c.placementText,
                      "carrier placement: per-core, per-pu, compact, scatter or list:<os>,<os>,...");
        a->add_option("--carriers", c.carriers, "carriers (0: the placement's natural count)")
            ->check(CLI::Range(0u, spindle::kMaxCarriers));
        a->add_option("--threshold", c.threshold, "numa policy: a remote victim needs more than this many queued")
            ->check(CLI::Range(0u, 1'000'000u));
        spindle::apps::addBackendFlag(*a, c.backend);
    };
    addCommon(&app);
    CLI::App* exp = app.add_subcommand("experiment", "run a skewed workload under each steal policy");
    addCommon(exp);
    exp->add_option("--policy", e.policies, "policies, comma separated: numa,random,local-only,none")->delimiter(',');
    exp->add_option("--fibers", e.fibers, "fibers in the workload")->check(CLI::Range(1u, 1'000'000u));
    exp->add_option("--work-us", e.workUs, "CPU microseconds of work per fiber")->check(CLI::Range(1u, 10'000'000u));
    exp->add_option("--slices", e.slices, "the work is cut into this many slices, with a yield after each")
        ->check(CLI::Range(1u, 10'000u));
    exp->add_option("--skew", e.skew, "one-carrier (all spawned on carrier 0) or hot-node (on node 0's carriers)");
    exp->add_option("--repetitions", e.repetitions, "runs per policy; the median makespan is shown")
        ->check(CLI::Range(1u, 1000u));
    exp->add_flag("--json", e.json, "print one JSON object (the workload and each policy's results) instead of the table");
    if (auto status = spindle::apps::parseCommandLine(app, argc, argv)) { return *status; }
    auto placement = numa::parsePlacement(c.placementText);
    if (!placement) {
        fmt::print(stderr, "spindle-topo: bad --placement '{}': per-core, per-pu, compact, scatter or list:0,2,...\n",
                   c.placementText);
        return kExitUsage;
    }
    c.placement = std::move(*placement);
    if (*exp) { return runExperiment(c, e); }
    return showTopology(c);
}
