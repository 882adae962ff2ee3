// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Helpers shared by every benchmark program in perf/: a count of global heap allocations, so a benchmark
/// can show that its measured loop allocates nothing.
///
/// bench_support.cpp replaces the global operator new and delete (every form: array, nothrow, aligned), so
/// linking it into a program counts every allocation made through them, in any thread; malloc called directly
/// is not counted.
/// Thread-safety: allocCount() may be read from any thread.

#include <benchmark/benchmark.h>

#include <cstdint>
#include <optional>

#include "core/runtime.h"

namespace spindle::bench {

/// A runtime of `carriers` carriers for one benchmark run, or nullopt after
/// marking the run skipped (SkipWithError) when it cannot start.
std::optional<Runtime> startRuntime(benchmark::State& state, unsigned carriers);

/// Runs body() as a fiber pinned to carrier 0 of `rt`, waits for it and for
/// every fiber it spawned. Marks the run skipped if the fiber cannot start.
template <class Body>
void runPinned(benchmark::State& state, Runtime& rt, Body body) {
    auto h = rt.spawn(std::move(body), SpawnOptions{.name = "bench", .carrier = 0, .pinned = true});
    if (!h) {
        state.SkipWithError("spawn failed");
        return;
    }
    h->join();
    rt.waitIdle();
}

/// How many times any global operator new has run in this process so far.
[[nodiscard]] uint64_t allocCount() noexcept;

/// Sets the counter "allocs/iter": the allocations made since allocCount() returned before, divided by the
/// iterations state ran. Call it right after the timed loop, with before read right before it.
void setAllocCounters(benchmark::State& state, uint64_t before);

}  // namespace spindle::bench
