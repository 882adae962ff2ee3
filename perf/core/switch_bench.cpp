// The raw cost of a context switch: spindle_context_switch against Boost.Context's jump_fcontext, measured in
// the same run (DESIGN.md: a fiber switch costs no more than jump_fcontext). Both ping-pong between the
// benchmark thread and one context on a 64 KiB mmap'd stack; an iteration is a round trip, two switches.

#include <benchmark/benchmark.h>
#include <sys/mman.h>

#include <boost/context/detail/fcontext.hpp>
#include <cstddef>
#include <cstdint>

#include "base/check.h"
#include "core/internal/context.h"
#include "perf/bench_support.h"

namespace {

namespace fctx = boost::context::detail;

constexpr size_t kStackSize = 64 * 1024;

/// A stack mmap'd for the benchmark's lifetime; the context left parked on it is simply unmapped.
class MappedStack {
public:
    MappedStack() {
        void* p = ::mmap(nullptr, kStackSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        SPINDLE_CHECK(p != MAP_FAILED);
        base_ = static_cast<char*>(p);
    }
    ~MappedStack() { ::munmap(base_, kStackSize); }
    MappedStack(const MappedStack&) = delete;
    MappedStack& operator=(const MappedStack&) = delete;

    [[nodiscard]] char* top() const noexcept { return base_ + kStackSize; }

private:
    char* base_ = nullptr;
};

// Two switches per iteration: items/s counts switches, and "ns/switch" is elapsed time per switch. The
// counter is a rate of (switches * 1e-9), inverted: elapsed seconds / (switches * 1e-9) = ns per switch.
void setSwitchCounters(benchmark::State& state) {
    const auto switches = static_cast<int64_t>(state.iterations()) * 2;
    state.SetItemsProcessed(switches);
    state.counters["ns/switch"] = benchmark::Counter(static_cast<double>(switches) * 1e-9,
                                                     benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
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
    SpindlePair pair;
    pair.contextSp = spindle::detail::makeContext(stack.top(), spindleEcho, &pair);
    const uint64_t allocsBefore = spindle::bench::allocCount();
    for (auto _ : state) { spindle::detail::spindle_context_switch(&pair.mainSp, pair.contextSp); }
    spindle::bench::setAllocCounters(state, allocsBefore);
    setSwitchCounters(state);
}
BENCHMARK(BM_SpindleSwitch);

[[noreturn]] void boostEcho(fctx::transfer_t from) {
    for (;;) { from = fctx::jump_fcontext(from.fctx, nullptr); }
}

void BM_BoostJumpFcontext(benchmark::State& state) {  // the same round trip with Boost.Context's fcontext
    MappedStack stack;
    fctx::fcontext_t context = fctx::make_fcontext(stack.top(), kStackSize, boostEcho);
    const uint64_t allocsBefore = spindle::bench::allocCount();
    for (auto _ : state) { context = fctx::jump_fcontext(context, nullptr).fctx; }
    spindle::bench::setAllocCounters(state, allocsBefore);
    setSwitchCounters(state);
}
BENCHMARK(BM_BoostJumpFcontext);

}  // namespace

BENCHMARK_MAIN();
