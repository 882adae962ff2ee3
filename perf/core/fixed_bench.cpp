// SPDX-License-Identifier: Apache-2.0
// 4 KiB reads from a page-cache file on one carrier: read() into a FixedBuffer's memory, read_fixed()
// (IORING_OP_READ_FIXED), and read() through a FixedFile plus read_fixed (both registrations), in the
// same run. Arg: fibers in flight. Each reads the same 4 KiB-aligned offsets of a 64 MiB file that was
// read once before timing, so every read is a page-cache copy.
// The counters "fixed" and "fallback" show which path the timed reads took (a carrier whose
// registration the kernel refused, e.g. under RLIMIT_MEMLOCK, reads through the fallback).

#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <vector>

#include "core/fixed.h"
#include "core/io.h"
#include "core/runtime.h"
#include "perf/bench_support.h"

namespace {

using spindle::FiberHandle;
using spindle::SpawnOptions;

constexpr size_t kReadSize = 4096;
constexpr size_t kFileSize = size_t{64} << 20;

enum class Mode { kPlain, kFixedBuffer, kFixedBoth };

/// A temporary file of kFileSize bytes, read once so its pages are cached; unlinked at once.
int makeCachedFile(benchmark::State& state) {
    char path[] = "/tmp/spindle-fixed-bench-XXXXXX";
    const int fd = ::mkstemp(path);
    if (fd < 0) {
        state.SkipWithError("mkstemp failed");
        return -1;
    }
    ::unlink(path);
    std::vector<char> chunk(1 << 20, 'x');
    for (size_t off = 0; off < kFileSize; off += chunk.size()) {
        if (::pwrite(fd, chunk.data(), chunk.size(), static_cast<off_t>(off)) != static_cast<ssize_t>(chunk.size())) {
            state.SkipWithError("pwrite failed");
            ::close(fd);
            return -1;
        }
        (void)!::pread(fd, chunk.data(), chunk.size(), static_cast<off_t>(off));
    }
    return fd;
}

void readLoop(benchmark::State& state, Mode mode) {
    const int inFlight = static_cast<int>(state.range(0));
    const int fd = makeCachedFile(state);
    if (fd < 0) { return; }
    auto rt = spindle::bench::startRuntime(state, 1);
    if (!rt) {
        ::close(fd);
        return;
    }
    uint64_t total = 0;
    spindle::bench::runPinned(state, *rt, [&] {
        auto file = spindle::registerFile(::dup(fd));
        if (!file) {
            state.SkipWithError("registerFile failed");
            return;
        }
        // One read: every fiber cycles through the file's 4 KiB blocks from its own start.
        const auto once = [&](spindle::FixedBuffer& buf, uint64_t& block) {
            const uint64_t off = (block++ * kReadSize) % kFileSize;
            switch (mode) {
                case Mode::kPlain: (void)spindle::read(fd, buf.data(), kReadSize, off); break;
                case Mode::kFixedBuffer: (void)spindle::read_fixed(fd, buf, 0, kReadSize, off); break;
                case Mode::kFixedBoth: (void)spindle::read(*file, buf, 0, kReadSize, off); break;
            }
        };
        std::atomic<bool> stop{false};
        std::vector<FiberHandle<void>> workers;
        for (int i = 1; i < inFlight; ++i) {
            workers.push_back(*spindle::spawn(
                [&, i] {
                    auto buf = spindle::acquireFixedBuffer().value();
                    uint64_t block = static_cast<uint64_t>(i) * 997;
                    while (!stop.load(std::memory_order_relaxed)) { once(buf, block); }
                },
                SpawnOptions{.carrier = 0, .pinned = true}));
        }
        auto buf = spindle::acquireFixedBuffer().value();
        uint64_t block = 0;
        for (int i = 0; i < 16; ++i) { once(buf, block); }  // warm up
        const auto before = rt->stats()[0];
        for (auto _ : state) { once(buf, block); }
        const auto after = rt->stats()[0];
        stop.store(true);
        for (auto& w : workers) { w.join(); }
        total = after.cqesReaped - before.cqesReaped;  // every read in the timed window, by any fiber
        state.counters["fixed"] = static_cast<double>(after.fixedIo - before.fixedIo);
        state.counters["fallback"] = static_cast<double>(after.fixedFallbackIo - before.fixedFallbackIo);
    });
    ::close(fd);
    state.SetItemsProcessed(static_cast<int64_t>(total));
    state.SetBytesProcessed(static_cast<int64_t>(total * kReadSize));
}

void BM_Read4K(benchmark::State& state) { readLoop(state, Mode::kPlain); }
void BM_ReadFixed4K(benchmark::State& state) { readLoop(state, Mode::kFixedBuffer); }
void BM_ReadFixedFileAndBuffer4K(benchmark::State& state) { readLoop(state, Mode::kFixedBoth); }
BENCHMARK(BM_Read4K)->Arg(1)->Arg(16)->UseRealTime();
BENCHMARK(BM_ReadFixed4K)->Arg(1)->Arg(16)->UseRealTime();
BENCHMARK(BM_ReadFixedFileAndBuffer4K)->Arg(1)->Arg(16)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
