// SPDX-License-Identifier: Apache-2.0
// offload() round trip: a fiber pinned to carrier 0 offloads an empty function and waits for it (queue push,
// pool thread wake-up, FiberFuture set back to the carrier), against std::async(std::launch::async, fn).get()
// from a plain thread (a new thread and a shared state per call) in the same run. Ours allocates nothing per
// call once the pool is up; allocs/iter shows it.

#include <benchmark/benchmark.h>

#include <future>

#include "core/offload.h"
#include "core/runtime.h"
#include "perf/bench_support.h"

namespace {

void BM_OffloadEmptyRoundTrip(benchmark::State& state) {
    auto rt = spindle::bench::startRuntime(state, 1);
    if (!rt) { return; }
    spindle::bench::runPinned(state, *rt, [&] {
        if (!spindle::offload([] {})) {  // starts the pool outside the timed loop
            state.SkipWithError("offload failed");
            return;
        }
        const uint64_t allocs = spindle::bench::allocCount();
        for (auto _ : state) {
            auto r = spindle::offload([] { return 1; });
            benchmark::DoNotOptimize(r);
        }
        spindle::bench::setAllocCounters(state, allocs);
    });
    state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}
BENCHMARK(BM_OffloadEmptyRoundTrip)->UseRealTime();

void BM_StdAsyncEmptyRoundTrip(benchmark::State& state) {
    const uint64_t allocs = spindle::bench::allocCount();
    for (auto _ : state) {
        int r = std::async(std::launch::async, [] { return 1; }).get();
        benchmark::DoNotOptimize(r);
    }
    spindle::bench::setAllocCounters(state, allocs);
    state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}
BENCHMARK(BM_StdAsyncEmptyRoundTrip)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
