// SPDX-License-Identifier: Apache-2.0
// FiberFuture set -> wake latency, as a ping-pong round trip (A sets B's future
// and waits on its own; B does the reverse), against std::promise/std::future
// between two threads doing the same. Each round is a new one-shot result on
// both sides (ours re-arms a pair of stack futures with reset(); the std side
// makes a new promise pair): ours allocates nothing, each std promise
// allocates its shared state.
//   - same carrier: both fibers pinned to carrier 0 (switch, no thread wake);
//   - across carriers: fibers on carriers 0 and 1 (the wake goes through the
//     other carrier's inbox and, when it is parked, a MSG_RING).

#include <benchmark/benchmark.h>

#include <atomic>
#include <future>
#include <memory>
#include <thread>

#include "core/fiber_future.h"
#include "core/runtime.h"
#include "perf/bench_support.h"

namespace {

using spindle::FiberFuture;
using spindle::SpawnOptions;

// One round: ping is set by A and waited by B, pong the reverse. The slots are
// re-armed by the side that waited on them, after it woke.
struct PingPong {
    FiberFuture ping;
    FiberFuture pong;
    std::atomic<bool> stop{false};
};

void fiberPingPong(benchmark::State& state, int partnerCarrier) {
    auto rt = spindle::bench::startRuntime(state, 2);
    if (!rt) { return; }
    spindle::bench::runPinned(state, *rt, [&] {
        PingPong pp;
        auto partner = spindle::spawn(
            [&pp] {
                for (;;) {
                    (void)pp.ping.wait();
                    pp.ping.reset();
                    const bool last = pp.stop.load(std::memory_order_relaxed);
                    pp.pong.set(0);
                    if (last) { return; }
                }
            },
            SpawnOptions{.name = "partner", .carrier = partnerCarrier, .pinned = true});
        const uint64_t allocs = spindle::bench::allocCount();
        for (auto _ : state) {
            pp.ping.set(0);
            (void)pp.pong.wait();
            pp.pong.reset();
        }
        spindle::bench::setAllocCounters(state, allocs);
        pp.stop.store(true);
        pp.ping.set(0);
        (void)pp.pong.wait();
        partner->join();
    });
    state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}

void BM_FiberFutureRoundTripSameCarrier(benchmark::State& state) { fiberPingPong(state, 0); }
BENCHMARK(BM_FiberFutureRoundTripSameCarrier)->UseRealTime();

void BM_FiberFutureRoundTripAcrossCarriers(benchmark::State& state) { fiberPingPong(state, 1); }
BENCHMARK(BM_FiberFutureRoundTripAcrossCarriers)->UseRealTime();

void BM_StdPromiseRoundTripAcrossThreads(benchmark::State& state) {
    // Each round is a fresh promise pair; the ping carries the next round, so
    // neither thread ever spins: both block in future::get() as fibers park.
    struct Round {
        std::promise<Round*> ping;
        std::promise<void> pong;
    };
    auto cur = std::make_unique<Round>();
    std::thread partner([r = cur.get()]() mutable {
        while (r != nullptr) {
            Round* next = r->ping.get_future().get();
            r->pong.set_value();
            r = next;
        }
    });
    std::unique_ptr<Round> retired;  // a round's promises die one round later, once the partner is past them
    const uint64_t allocs = spindle::bench::allocCount();
    for (auto _ : state) {
        auto next = std::make_unique<Round>();
        auto pong = cur->pong.get_future();
        cur->ping.set_value(next.get());
        pong.get();
        retired = std::move(cur);
        cur = std::move(next);
    }
    spindle::bench::setAllocCounters(state, allocs);
    auto pong = cur->pong.get_future();
    cur->ping.set_value(nullptr);
    pong.get();
    partner.join();
    state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}
BENCHMARK(BM_StdPromiseRoundTripAcrossThreads)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
