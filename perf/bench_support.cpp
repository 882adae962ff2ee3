// SPDX-License-Identifier: Apache-2.0
#include "perf/bench_support.h"

#include "testing/alloc_hook.h"

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>

namespace spindle::bench {

uint64_t allocCount() noexcept { return alloc_hook::processAllocations(); }

void setAllocCounters(benchmark::State& state, uint64_t before) {
    state.counters["allocs/iter"] =
        benchmark::Counter(static_cast<double>(allocCount() - before), benchmark::Counter::kAvgIterations);
}

}  // namespace spindle::bench

namespace spindle::bench {

std::optional<Runtime> startRuntime(benchmark::State& state, unsigned carriers) {
    RuntimeOptions o;
    o.carriers = carriers;
    auto rt = Runtime::start(o);
    if (!rt) {
        state.SkipWithError(("runtime did not start: " + rt.error().message()).c_str());
        return std::nullopt;
    }
    return std::move(*rt);
}

}  // namespace spindle::bench
