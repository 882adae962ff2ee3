// SPDX-License-Identifier: Apache-2.0
// FiberLocal<T> (core/fiber_local.h): what an access costs once the value exists, against Boost.Fiber's
// fiber_specific_ptr measured in the same run, and what a fiber's first access adds to spawn plus join
// (the table, the value, and their destruction as the fiber ends), against spawn plus join alone.

#include <benchmark/benchmark.h>

#include <boost/fiber/all.hpp>

#include "core/fiber.h"
#include "core/fiber_local.h"
#include "core/runtime.h"
#include "perf/bench_support.h"

namespace {

using spindle::SpawnOptions;

void BM_SpindleFiberLocalGet(benchmark::State& state) {  // the value exists; a fiber pinned to carrier 0
    auto rt = spindle::bench::startRuntime(state, 1);
    if (!rt) { return; }
    spindle::FiberLocal<uint64_t> local;
    spindle::bench::runPinned(state, *rt, [&state, &local] {
        *local = 1;
        const uint64_t allocs = spindle::bench::allocCount();
        for (auto _ : state) {
            uint64_t& v = local.get();
            benchmark::DoNotOptimize(v);
            ++v;
        }
        spindle::bench::setAllocCounters(state, allocs);
    });
    state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}
BENCHMARK(BM_SpindleFiberLocalGet)->UseRealTime();

void BM_BoostFiberSpecificPtrGet(benchmark::State& state) {  // the peer: main fiber of this thread
    boost::fibers::fiber_specific_ptr<uint64_t> local;
    boost::fibers::fiber([&state, &local] {
        local.reset(new uint64_t(1));
        const uint64_t allocs = spindle::bench::allocCount();
        for (auto _ : state) {
            uint64_t* v = local.get();
            benchmark::DoNotOptimize(v);
            ++*v;
        }
        spindle::bench::setAllocCounters(state, allocs);
    }).join();
    state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}
BENCHMARK(BM_BoostFiberSpecificPtrGet)->UseRealTime();

// Arg 0: the child touches no FiberLocal (the baseline); 1: it touches one; 4: four.
void BM_SpindleSpawnJoinWithFiberLocals(benchmark::State& state) {
    auto rt = spindle::bench::startRuntime(state, 1);
    if (!rt) { return; }
    const int64_t touched = state.range(0);
    spindle::FiberLocal<uint64_t> locals[4];
    spindle::bench::runPinned(state, *rt, [&state, &locals, touched] {
        auto child = [&locals, touched] {
            for (int64_t i = 0; i < touched; ++i) { ++*locals[i]; }
        };
        for (int i = 0; i < 64; ++i) { spindle::spawn(child)->join(); }  // warm the pool
        const uint64_t allocs = spindle::bench::allocCount();
        for (auto _ : state) { spindle::spawn(child)->join(); }
        spindle::bench::setAllocCounters(state, allocs);
    });
    state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}
BENCHMARK(BM_SpindleSpawnJoinWithFiberLocals)->Arg(0)->Arg(1)->Arg(4)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
