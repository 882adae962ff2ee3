// SPDX-License-Identifier: Apache-2.0
// NOPs through fibers (prepare, park, batch submit, reap, wake) against a raw
// liburing loop that submits the same NOPs in batches of the same size, on a
// ring with the same set-up flags, in the same binary.
// Arg: fibers in flight (spindle) or batch size (raw).

#include <benchmark/benchmark.h>
#include <liburing.h>

#include <atomic>
#include <cstdlib>
#include <vector>

#include "core/io.h"
#include "core/runtime.h"
#include "perf/bench_support.h"

namespace {

using spindle::FiberHandle;
using spindle::SpawnOptions;

void BM_SpindleFiberNop(benchmark::State& state) {
    const int inFlight = static_cast<int>(state.range(0));
    auto rt = spindle::bench::startRuntime(state, 1);
    if (!rt) { return; }
    uint64_t total = 0;
    spindle::bench::runPinned(state, *rt, [&] {
            std::atomic<bool> stop{false};
            std::atomic<uint64_t> ops{0};
            std::vector<FiberHandle<void>> workers;
            for (int i = 1; i < inFlight; ++i) {
                workers.push_back(*spindle::spawn(
                    [&] {
                        uint64_t n = 0;
                        while (!stop.load(std::memory_order_relaxed)) {
                            (void)spindle::nop();
                            ++n;
                        }
                        ops.fetch_add(n, std::memory_order_relaxed);
                    },
                    SpawnOptions{.carrier = 0, .pinned = true}));
            }
            for (int i = 0; i < 16; ++i) { (void)spindle::nop(); }  // warm up
            const auto before = rt->stats()[0];  // stats() allocates: outside the counted window
            const uint64_t allocs = spindle::bench::allocCount();
            for (auto _ : state) { (void)spindle::nop(); }
            spindle::bench::setAllocCounters(state, allocs);
            const auto after = rt->stats()[0];
            stop.store(true);
            for (auto& w : workers) { w.join(); }
            // Every NOP in the timed window, by any of the fibers, is one CQE.
            total = after.cqesReaped - before.cqesReaped;
            state.counters["sqes/enter"] = static_cast<double>(after.sqesSubmitted - before.sqesSubmitted) /
                                           static_cast<double>(after.enters - before.enters + 1);
    });
    state.SetItemsProcessed(static_cast<int64_t>(total));
}
BENCHMARK(BM_SpindleFiberNop)->Arg(1)->Arg(8)->Arg(64)->UseRealTime();

void BM_RawLiburingNop(benchmark::State& state) {
    const unsigned batch = static_cast<unsigned>(state.range(0));
    io_uring ring;
    io_uring_params p{};
    p.flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN;
    if (io_uring_queue_init_params(256, &ring, &p) != 0) {
        state.SkipWithError("io_uring set-up failed");
        return;
    }
    uint64_t total = 0;
    for (auto _ : state) {
        for (unsigned i = 0; i < batch; ++i) {
            io_uring_sqe* sqe = io_uring_get_sqe(&ring);
            if (sqe == nullptr) { std::abort(); }  // batch <= 256 entries: cannot happen
            io_uring_prep_nop(sqe);
            io_uring_sqe_set_data64(sqe, i);
        }
        io_uring_submit_and_wait(&ring, batch);
        unsigned head, n = 0;
        io_uring_cqe* cqe;
        io_uring_for_each_cqe(&ring, head, cqe) {
            benchmark::DoNotOptimize(cqe->res);
            ++n;
        }
        io_uring_cq_advance(&ring, n);
        total += n;
    }
    io_uring_queue_exit(&ring);
    state.SetItemsProcessed(static_cast<int64_t>(total));
}
BENCHMARK(BM_RawLiburingNop)->Arg(1)->Arg(8)->Arg(64)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
