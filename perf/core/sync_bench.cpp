// SPDX-License-Identifier: Apache-2.0
// Sync primitives against their peers, in the same binary:
//   - FiberMutex uncontended lock+unlock against std::mutex (one thread, no waiters);
//   - FiberMutex and FairFiberMutex hand-off among 4 fibers on one carrier against
//     boost::fibers::mutex among 4 Boost fibers on one thread: each holder yields
//     inside the critical section (so the others park behind it) and once more
//     after unlocking (so a woken waiter runs before the holder comes back; an
//     unfair mutex would otherwise be re-taken by the holder every time);
//   - FiberCondVar ping-pong round trip between two fibers against
//     boost::fibers::condition_variable between two Boost fibers;
//   - FiberSequencer: 1,000 registered waiters woken in token order by 1,000
//     increments (per waiter), and FairFiberMutex uncontended.

#include <benchmark/benchmark.h>

#include <array>
#include <atomic>
#include <boost/fiber/all.hpp>
#include <memory>
#include <mutex>
#include <vector>

#include "core/fair_fiber_mutex.h"
#include "core/fiber_condvar.h"
#include "core/fiber_mutex.h"
#include "core/fiber_sequencer.h"
#include "core/runtime.h"
#include "perf/bench_support.h"

namespace {

using spindle::SpawnOptions;

template <class Body>
void onOneCarrier(benchmark::State& state, Body body) {
    auto rt = spindle::bench::startRuntime(state, 1);
    if (rt) { spindle::bench::runPinned(state, *rt, std::move(body)); }
}

// ---- uncontended ---------------------------------------------------------------------

template <class Mutex>
void lockUnlockLoop(benchmark::State& state) {
    Mutex m;
    for (auto _ : state) {
        m.lock();
        m.unlock();
    }
    state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}

void BM_FiberMutexUncontended(benchmark::State& state) {
    onOneCarrier(state, [&state] { lockUnlockLoop<spindle::FiberMutex>(state); });
}
BENCHMARK(BM_FiberMutexUncontended)->UseRealTime();

void BM_FiberMutexUncontendedFromThread(benchmark::State& state) { lockUnlockLoop<spindle::FiberMutex>(state); }
BENCHMARK(BM_FiberMutexUncontendedFromThread)->UseRealTime();

void BM_StdMutexUncontended(benchmark::State& state) { lockUnlockLoop<std::mutex>(state); }
BENCHMARK(BM_StdMutexUncontended)->UseRealTime();

void BM_FairFiberMutexUncontended(benchmark::State& state) {
    onOneCarrier(state, [&state] { lockUnlockLoop<spindle::FairFiberMutex>(state); });
}
BENCHMARK(BM_FairFiberMutexUncontended)->UseRealTime();

// ---- contended hand-off ------------------------------------------------------------------

constexpr int kContenders = 4;

// One contender's round: lock, count, yield holding the lock, unlock, yield.
template <class Mutex, class Yield>
void contendOnce(Mutex& m, uint64_t& counter, Yield yield) {
    {
        std::lock_guard g(m);
        ++counter;
        yield();
    }
    yield();
}

template <class Mutex>
void fiberHandoff(benchmark::State& state) {
    onOneCarrier(state, [&state] {
        Mutex m;
        std::atomic<bool> stop{false};
        uint64_t counter = 0;
        auto yield = [] { spindle::this_fiber::yield(); };
        std::vector<spindle::FiberHandle<void>> others;
        for (int i = 1; i < kContenders; ++i) {
            others.push_back(*spindle::spawn(
                [&] {
                    while (!stop.load(std::memory_order_relaxed)) { contendOnce(m, counter, yield); }
                },
                SpawnOptions{.carrier = 0, .pinned = true}));
        }
        yield();
        const uint64_t allocs = spindle::bench::allocCount();
        for (auto _ : state) { contendOnce(m, counter, yield); }
        spindle::bench::setAllocCounters(state, allocs);
        stop.store(true);
        for (auto& h : others) { h.join(); }
        benchmark::DoNotOptimize(counter);
    });
    state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}

void BM_FiberMutexHandoff(benchmark::State& state) { fiberHandoff<spindle::FiberMutex>(state); }
BENCHMARK(BM_FiberMutexHandoff)->UseRealTime();

void BM_FairFiberMutexHandoff(benchmark::State& state) { fiberHandoff<spindle::FairFiberMutex>(state); }
BENCHMARK(BM_FairFiberMutexHandoff)->UseRealTime();

void BM_BoostFiberMutexHandoff(benchmark::State& state) {
    boost::fibers::mutex m;
    bool stop = false;
    uint64_t counter = 0;
    auto yield = [] { boost::this_fiber::yield(); };
    std::vector<boost::fibers::fiber> others;
    for (int i = 1; i < kContenders; ++i) {
        others.emplace_back([&] {
            while (!stop) { contendOnce(m, counter, yield); }
        });
    }
    yield();
    const uint64_t allocs = spindle::bench::allocCount();
    for (auto _ : state) { contendOnce(m, counter, yield); }
    spindle::bench::setAllocCounters(state, allocs);
    stop = true;
    for (auto& f : others) { f.join(); }
    benchmark::DoNotOptimize(counter);
    state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}
BENCHMARK(BM_BoostFiberMutexHandoff)->UseRealTime();

// ---- condition variable ping-pong ------------------------------------------------------------

// turn: 0 is the measuring side's turn, 1 the partner's, 2 tells the partner to stop.
template <class Mutex, class CondVar>
void pingPongPartner(Mutex& m, CondVar& cv, int& turn) {
    std::unique_lock lk(m);
    for (;;) {
        cv.wait(lk, [&] { return turn != 0; });
        if (turn == 2) { return; }
        turn = 0;
        cv.notify_one();
    }
}

// One iteration is one round trip: hand the turn over and wait for it to come back.
template <class Mutex, class CondVar>
void pingPongMeasure(benchmark::State& state, Mutex& m, CondVar& cv, int& turn) {
    const uint64_t allocs = spindle::bench::allocCount();
    std::unique_lock lk(m);
    for (auto _ : state) {
        turn = 1;
        cv.notify_one();
        cv.wait(lk, [&] { return turn == 0; });
    }
    spindle::bench::setAllocCounters(state, allocs);
    turn = 2;
    cv.notify_one();
}

void BM_FiberCondVarPingPong(benchmark::State& state) {
    onOneCarrier(state, [&state] {
        spindle::FiberMutex m;
        spindle::FiberCondVar cv;
        int turn = 0;
        auto partner = spindle::spawn([&] { pingPongPartner(m, cv, turn); }, SpawnOptions{.carrier = 0, .pinned = true});
        pingPongMeasure(state, m, cv, turn);
        partner->join();
    });
    state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}
BENCHMARK(BM_FiberCondVarPingPong)->UseRealTime();

void BM_BoostFiberCondVarPingPong(benchmark::State& state) {
    boost::fibers::mutex m;
    boost::fibers::condition_variable cv;
    int turn = 0;
    boost::fibers::fiber partner([&] { pingPongPartner(m, cv, turn); });
    pingPongMeasure(state, m, cv, turn);
    partner.join();
    state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}
BENCHMARK(BM_BoostFiberCondVarPingPong)->UseRealTime();

// ---- sequencer ----------------------------------------------------------------------------------

void BM_SequencerWakesThousandInOrder(benchmark::State& state) {  // per waiter
    constexpr int kWaiters = 1000;
    onOneCarrier(state, [&state] {
        spindle::FiberSequencer seq;
        auto futures = std::make_unique<std::array<spindle::FiberSequencer::Future, kWaiters>>();
        uint64_t outOfOrder = 0;
        const uint64_t allocs = spindle::bench::allocCount();
        for (auto _ : state) {
            const uint64_t base = seq.value();
            // Register in reverse, so the sequencer has to order them.
            for (int i = kWaiters - 1; i >= 0; --i) {
                (*futures)[i].reset();
                seq.wait(base + 1 + static_cast<uint64_t>(i), &(*futures)[i]);
            }
            for (int i = 0; i < kWaiters; ++i) {
                seq.increment();
                if (!(*futures)[i].isSet() || (i + 1 < kWaiters && (*futures)[i + 1].isSet())) { ++outOfOrder; }
            }
        }
        spindle::bench::setAllocCounters(state, allocs);
        state.counters["out_of_order"] = static_cast<double>(outOfOrder);
    });
    state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * kWaiters);
}
BENCHMARK(BM_SequencerWakesThousandInOrder)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
