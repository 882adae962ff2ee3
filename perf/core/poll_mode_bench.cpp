// SPDX-License-Identifier: Apache-2.0
// What spinning buys: cross-carrier round trips with each poll mode
// (RuntimeOptions::pollMode). Two carriers, one fiber pinned on each:
//   - FutureRoundTrip: A sets B's FiberFuture and waits on its own, B the
//     reverse (the wake travels by inbox and, if the peer is parked, MSG_RING);
//   - PipeRoundTrip: A writes a byte into one pipe and reads the other, B the
//     reverse; every hop is an io_uring read completing on the other carrier.
// Arg 0 picks the mode: 0 block, 1 hybrid (50 µs), 2 spin with DEFER_TASKRUN
// (an enter with GETEVENTS on every idle pass while a read is in flight),
// 3 spin with COOP_TASKRUN + TASKRUN_FLAG (enter only when the kernel flags
// task work), 4 spin with SQPOLL.
// With two carriers on a two-CPU machine, block mode halts the idle vCPU,
// and waking it is what a round trip costs; spin keeps both CPUs busy.

#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <optional>
#include <string>

#include "core/fiber_future.h"
#include "core/io.h"
#include "core/runtime.h"
#include "perf/bench_support.h"

namespace {

using spindle::FiberFuture;
using spindle::PollMode;
using spindle::RuntimeOptions;
using spindle::SpawnOptions;

std::optional<spindle::Runtime> startInMode(benchmark::State& state) {
    RuntimeOptions o;
    o.carriers = 2;
    switch (state.range(0)) {
        case 0: o.pollMode = PollMode::kBlock; state.SetLabel("block"); break;
        case 1: o.pollMode = PollMode::kHybrid; o.spinMicros = 50; state.SetLabel("hybrid-50us"); break;
        case 2: o.pollMode = PollMode::kSpin; state.SetLabel("spin-defer-taskrun"); break;
        case 3: o.pollMode = PollMode::kSpin; o.deferTaskrun = false; state.SetLabel("spin-coop-taskrun"); break;
        default: o.pollMode = PollMode::kSpin; o.sqpoll = true; state.SetLabel("spin-sqpoll"); break;
    }
    auto rt = spindle::Runtime::start(o);
    if (!rt) {
        state.SkipWithError(("Runtime::start: " + rt.error().message()).c_str());
        return std::nullopt;
    }
    return std::move(*rt);
}

void addRuntimeCounters(benchmark::State& state, const spindle::Runtime& rt) {
    uint64_t parks = 0, wakes = 0, enters = 0;
    for (const auto& s : rt.stats()) {
        parks += s.parks;
        wakes += s.wakesSent;
        enters += s.enters;
    }
    const double it = static_cast<double>(state.iterations());
    state.counters["parks/iter"] = static_cast<double>(parks) / it;
    state.counters["wakes/iter"] = static_cast<double>(wakes) / it;
    state.counters["enters/iter"] = static_cast<double>(enters) / it;
}

void BM_PollModeFutureRoundTrip(benchmark::State& state) {
    auto rt = startInMode(state);
    if (!rt) { return; }
    spindle::bench::runPinned(state, *rt, [&] {
        FiberFuture ping;
        FiberFuture pong;
        std::atomic<bool> stop{false};
        auto partner = spindle::spawn(
            [&] {
                for (;;) {
                    (void)ping.wait();
                    ping.reset();
                    const bool last = stop.load(std::memory_order_relaxed);
                    pong.set(0);
                    if (last) { return; }
                }
            },
            SpawnOptions{.name = "partner", .carrier = 1, .pinned = true});
        for (auto _ : state) {
            ping.set(0);
            (void)pong.wait();
            pong.reset();
        }
        stop.store(true);
        ping.set(0);
        (void)pong.wait();
        partner->join();
    });
    addRuntimeCounters(state, *rt);
    state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}
BENCHMARK(BM_PollModeFutureRoundTrip)->DenseRange(0, 4)->UseRealTime();

void BM_PollModePipeRoundTrip(benchmark::State& state) {
    int ab[2];
    int ba[2];
    if (::pipe2(ab, O_CLOEXEC) != 0 || ::pipe2(ba, O_CLOEXEC) != 0) {
        state.SkipWithError("pipe2 failed");
        return;
    }
    auto rt = startInMode(state);
    if (rt) {
        spindle::bench::runPinned(state, *rt, [&] {
            auto partner = spindle::spawn(
                [&] {
                    char c = 0;
                    for (;;) {
                        auto r = spindle::read(ab[0], &c, 1);
                        if (!r || *r != 1) { return; }
                        if (!spindle::write(ba[1], &c, 1)) { return; }
                        if (c == 'q') { return; }
                    }
                },
                SpawnOptions{.name = "partner", .carrier = 1, .pinned = true});
            char c = 'p';
            for (auto _ : state) {
                if (!spindle::write(ab[1], &c, 1) || !spindle::read(ba[0], &c, 1)) {
                    state.SkipWithError("pipe I/O failed");
                    break;
                }
            }
            c = 'q';
            (void)spindle::write(ab[1], &c, 1);
            (void)spindle::read(ba[0], &c, 1);
            partner->join();
        });
        addRuntimeCounters(state, *rt);
        state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
    }
    for (int fd : {ab[0], ab[1], ba[0], ba[1]}) { ::close(fd); }
}
BENCHMARK(BM_PollModePipeRoundTrip)->DenseRange(0, 4)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
