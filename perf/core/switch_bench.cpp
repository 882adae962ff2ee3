// SPDX-License-Identifier: Apache-2.0
// The raw cost of a context switch: spindle_context_switch against Boost.Context's jump_fcontext, measured in
// the same run (DESIGN.md: a fiber switch costs no more than jump_fcontext). Both ping-pong between the
// benchmark thread and one context on a 64 KiB mmap'd stack; an iteration is a round trip, two switches.

#include <benchmark/benchmark.h>
#include <sys/mman.h>
#include <time.h>

#include <boost/context/detail/fcontext.hpp>
#include <cstddef>
#include <cstdint>

#include "core/internal/context.h"
#include "perf/bench_support.h"

namespace {

namespace fctx = boost::context::detail;

constexpr size_t kStackSize = 64 * 1024;

/// A stack mmap'd for one benchmark run; the context left parked on it is simply unmapped.
class MappedStack {
public:
    MappedStack() noexcept {
        void* p = ::mmap(nullptr, kStackSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        base_ = p == MAP_FAILED ? nullptr : static_cast<char*>(p);
    }
    ~MappedStack() {
        if (base_ != nullptr) { ::munmap(base_, kStackSize); }
    }
    MappedStack(const MappedStack&) = delete;
    MappedStack& operator=(const MappedStack&) = delete;

    [[nodiscard]] bool ok() const noexcept { return base_ != nullptr; }
    [[nodiscard]] char* top() const noexcept { return base_ + kStackSize; }

private:
    char* base_ = nullptr;
};

// This thread's CPU time: the clock Google Benchmark uses for rates in benchmarks without UseRealTime(), so
// "ns/switch" and items_per_second describe the same measurement.
[[nodiscard]] int64_t threadCpuNs() noexcept {
    timespec ts{};
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// Two switches per iteration: items/s counts switches; "ns/switch" is the loop's CPU time per switch.
void setSwitchCounters(benchmark::State& state, int64_t loopCpuNs) {
    const auto switches = static_cast<int64_t>(state.iterations()) * 2;
    state.SetItemsProcessed(switches);
    state.counters["ns/switch"] = static_cast<double>(loopCpuNs) / static_cast<double>(switches);
}

struct SpindlePair {
    void* mainSp = nullptr;
    void* contextSp = nullptr;
};

[[noreturn]] void spindleEcho(void* arg) {
    auto* pair = static_cast<SpindlePair*>(arg);
    for (;;) { spindle::detail::spindle_context_switch(&pair->contextSp, pair->mainSp); }
}

void BM_SpindleSwitch(benchmark::State& state) {  // main -> context -> main with spindle_context_switch
    MappedStack stack;
    if (!stack.ok()) {
        state.SkipWithError("mmap of the stack failed");
        return;
    }
    SpindlePair pair;
    pair.contextSp = spindle::detail::makeContext(stack.top(), spindleEcho, &pair);
    const uint64_t allocsBefore = spindle::bench::allocCount();
    const int64_t cpuBefore = threadCpuNs();
    for (auto _ : state) { spindle::detail::spindle_context_switch(&pair.mainSp, pair.contextSp); }
    const int64_t cpuAfter = threadCpuNs();
    spindle::bench::setAllocCounters(state, allocsBefore);
    setSwitchCounters(state, cpuAfter - cpuBefore);
}
BENCHMARK(BM_SpindleSwitch);

[[noreturn]] void boostEcho(fctx::transfer_t from) {
    for (;;) { from = fctx::jump_fcontext(from.fctx, nullptr); }
}

void BM_BoostJumpFcontext(benchmark::State& state) {  // the same round trip with Boost.Context's fcontext
    MappedStack stack;
    if (!stack.ok()) {
        state.SkipWithError("mmap of the stack failed");
        return;
    }
    fctx::fcontext_t context = fctx::make_fcontext(stack.top(), kStackSize, boostEcho);
    const uint64_t allocsBefore = spindle::bench::allocCount();
    const int64_t cpuBefore = threadCpuNs();
    for (auto _ : state) { context = fctx::jump_fcontext(context, nullptr).fctx; }
    const int64_t cpuAfter = threadCpuNs();
    spindle::bench::setAllocCounters(state, allocsBefore);
    setSwitchCounters(state, cpuAfter - cpuBefore);
}
BENCHMARK(BM_BoostJumpFcontext);

}  // namespace

BENCHMARK_MAIN();
