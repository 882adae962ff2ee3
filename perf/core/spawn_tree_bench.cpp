// SPDX-License-Identifier: Apache-2.0
// A tree of spawn+join (issue 17, item 2): every fiber spawns kFanOut children, joins them, and returns;
// kDepth levels below the root, 1 + 10 + ... + 10^6 = 1,111,111 fibers in all. It measures the stack pool
// under a load that keeps a few dozen fibers alive at a time and ends one every ~0.5 µs:
//   - with the default stack size and with SpawnOptions::stackSize = 16 KiB (a size class of its own),
//     on one carrier and on two (fibers are stolen, so stacks go back to the pool of another carrier);
//   - against the same tree on Boost.Fiber with a pooled_fixedsize_stack of the same sizes, on one thread,
//     in the same binary.
// Counters: fibers/s (items), and per tree the stacks mapped and the madvise calls the pools made.

#include <benchmark/benchmark.h>

#include <boost/fiber/all.hpp>
#include <cstddef>

#include "core/runtime.h"
#include "perf/bench_support.h"

namespace {

using spindle::SpawnOptions;

constexpr int kFanOut = 10;
constexpr int kDepth = 6;
constexpr int64_t kTreeFibers = 1'111'111;  // sum of 10^k, k = 0..6

void spindleTree(int depth, size_t stackSize) {
    if (depth == 0) { return; }
    spindle::FiberHandle<void> kids[kFanOut];
    for (auto& k : kids) {
        auto h = spindle::spawn([depth, stackSize] { spindleTree(depth - 1, stackSize); },
                                SpawnOptions{.stackSize = stackSize});
        if (!h) { std::abort(); }
        k = std::move(*h);
    }
    for (auto& k : kids) { k.join(); }
}

// Args: {carriers, stack KiB (0: the runtime's default)}.
void BM_SpindleSpawnTree(benchmark::State& state) {
    const auto carriers = static_cast<unsigned>(state.range(0));
    const size_t stackSize = static_cast<size_t>(state.range(1)) * 1024;
    auto rt = spindle::bench::startRuntime(state, carriers);
    if (!rt) { return; }
    uint64_t mapped = 0;
    uint64_t trims = 0;
    uint64_t steals = 0;
    uint64_t parks = 0;
    for (auto _ : state) {
        state.PauseTiming();
        uint64_t mapped0 = 0;
        uint64_t trims0 = 0;
        uint64_t steals0 = 0;
        uint64_t parks0 = 0;
        for (const auto& s : rt->stats()) {
            mapped0 += s.stacksMapped;
            trims0 += s.stackTrims;
            steals0 += s.steals;
            parks0 += s.parks;
        }
        state.ResumeTiming();
        auto root = rt->spawn([stackSize] { spindleTree(kDepth, stackSize); }, SpawnOptions{.name = "root"});
        if (!root) {
            state.SkipWithError("spawn failed");
            return;
        }
        root->join();
        state.PauseTiming();
        for (const auto& s : rt->stats()) {
            mapped += s.stacksMapped;
            trims += s.stackTrims;
            steals += s.steals;
            parks += s.parks;
        }
        mapped -= mapped0;
        trims -= trims0;
        steals -= steals0;
        parks -= parks0;
        state.ResumeTiming();
    }
    const double it = static_cast<double>(state.iterations());
    state.counters["stacks mapped/tree"] = static_cast<double>(mapped) / it;
    state.counters["madvise/tree"] = static_cast<double>(trims) / it;
    state.counters["steals/tree"] = static_cast<double>(steals) / it;
    state.counters["parks/tree"] = static_cast<double>(parks) / it;
    state.SetItemsProcessed(state.iterations() * kTreeFibers);
}
BENCHMARK(BM_SpindleSpawnTree)
    ->Args({1, 0})
    ->Args({1, 16})
    ->Args({2, 0})
    ->Args({2, 16})
    ->ArgNames({"carriers", "stackKiB"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(10);

template <class Alloc>
void boostTree(int depth, Alloc alloc) {
    if (depth == 0) { return; }
    boost::fibers::fiber kids[kFanOut];
    for (auto& k : kids) {
        k = boost::fibers::fiber(std::allocator_arg, alloc, [depth, alloc] { boostTree(depth - 1, alloc); });
    }
    for (auto& k : kids) { k.join(); }
}

// Arg: stack KiB. One thread (Boost.Fiber's schedulers do not share fibers unless asked to).
void BM_BoostFiberSpawnTree(benchmark::State& state) {
    const size_t stackSize = static_cast<size_t>(state.range(0)) * 1024;
    boost::fibers::pooled_fixedsize_stack alloc(stackSize);
    for (auto _ : state) { boostTree(kDepth, alloc); }
    state.SetItemsProcessed(state.iterations() * kTreeFibers);
}
BENCHMARK(BM_BoostFiberSpawnTree)
    ->Arg(64)
    ->Arg(16)
    ->ArgName("stackKiB")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(10);

}  // namespace

BENCHMARK_MAIN();
