// SPDX-License-Identifier: Apache-2.0
// Scheduler costs, each against its peer in the same binary:
//   - a yield round trip between two fibers on one carrier, against Boost.Fiber's
//     this_fiber::yield() between two fibers on one thread;
//   - spawn + join of an empty fiber from a warm stack pool, against Boost.Fiber's
//     fiber + join; ours must make no heap allocation and no system call.
// Each spindle case runs its timed loop inside a fiber, so it uses real time.

#include <benchmark/benchmark.h>

#include <atomic>
#include <boost/fiber/all.hpp>

#include "core/runtime.h"
#include "perf/bench_support.h"

namespace {

using spindle::SpawnOptions;

/// Runs body() as a fiber pinned to carrier 0 of a one-carrier runtime.
template <class Body>
void onOneCarrier(benchmark::State& state, Body body) {
    auto rt = spindle::bench::startRuntime(state, 1);
    if (rt) { spindle::bench::runPinned(state, *rt, std::move(body)); }
}

void BM_SpindleYieldRoundTrip(benchmark::State& state) {  // A yields to B, B yields back to A
    onOneCarrier(state, [&state] {
        std::atomic<bool> stop{false};
        auto partner = spindle::spawn(
            [&stop] {
                while (!stop.load(std::memory_order_relaxed)) { spindle::this_fiber::yield(); }
            },
            SpawnOptions{.name = "partner", .carrier = 0, .pinned = true});
        spindle::this_fiber::yield();  // let the partner start
        const uint64_t allocs = spindle::bench::allocCount();
        for (auto _ : state) { spindle::this_fiber::yield(); }
        spindle::bench::setAllocCounters(state, allocs);
        stop.store(true);
        partner->join();
    });
    state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}
BENCHMARK(BM_SpindleYieldRoundTrip)->UseRealTime();

void BM_BoostFiberYieldRoundTrip(benchmark::State& state) {
    bool stop = false;
    boost::fibers::fiber partner([&stop] {
        while (!stop) { boost::this_fiber::yield(); }
    });
    boost::this_fiber::yield();
    const uint64_t allocs = spindle::bench::allocCount();
    for (auto _ : state) { boost::this_fiber::yield(); }
    spindle::bench::setAllocCounters(state, allocs);
    stop = true;
    partner.join();
    state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}
BENCHMARK(BM_BoostFiberYieldRoundTrip)->UseRealTime();

void BM_SpindleSpawnJoin(benchmark::State& state) {  // empty fiber, warm pool, same carrier
    auto rt = spindle::bench::startRuntime(state, 1);
    if (!rt) { return; }
    spindle::bench::runPinned(state, *rt, [&state, &rt] {
            // Warm the pool and the deque.
            for (int i = 0; i < 64; ++i) { spindle::spawn([] {})->join(); }
            const auto before = rt->stats()[0];  // stats() allocates: outside the counted window
            const uint64_t allocs = spindle::bench::allocCount();
            for (auto _ : state) {
                auto child = spindle::spawn([] {});
                child->join();
            }
            spindle::bench::setAllocCounters(state, allocs);
            const auto after = rt->stats()[0];
            const double it = static_cast<double>(state.iterations());
            // Every system call the runtime makes goes through io_uring_enter or mmap.
            state.counters["enters/iter"] = static_cast<double>(after.enters - before.enters) / it;
            state.counters["mmaps/iter"] = static_cast<double>(after.stacksMapped - before.stacksMapped) / it;
            state.counters["parks/iter"] = static_cast<double>(after.parks - before.parks) / it;
    });
    state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}
BENCHMARK(BM_SpindleSpawnJoin)->UseRealTime();

void BM_BoostFiberSpawnJoin(benchmark::State& state) {
    const uint64_t allocs = spindle::bench::allocCount();
    for (auto _ : state) {
        boost::fibers::fiber child([] {});
        child.join();
    }
    spindle::bench::setAllocCounters(state, allocs);
    state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}
BENCHMARK(BM_BoostFiberSpawnJoin)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
