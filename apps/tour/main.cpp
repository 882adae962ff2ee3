// SPDX-License-Identifier: Apache-2.0
// spindle-tour: starts a runtime on every core, runs a fiber workload that reads
// a file through its I/O backend (io_uring, or epoll where io_uring cannot be used
// or --backend asks for it), and prints the backend, what this kernel's io_uring
// offers, what the workload did and how fast.
//
// Exit status: 0 done; 1 the runtime did not start, an I/O error, or a block read back wrong; 2 a bad
// flag value (README.md, "Flags and exit status").
#include <fcntl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "apps/common/backend_flag.h"
#include "apps/common/cli.h"
#include "core/driver/backend.h"
#include "core/io.h"
#include "core/runtime.h"

namespace {

struct TourOptions {
    unsigned carriers = 0;
    unsigned fibers = 64;
    size_t fileMiB = 64;
    size_t blockKiB = 4;
    unsigned passes = 4;
    std::string path;
    std::string backend = "auto";
};

// Writes a file of known content through the backend, from fibers, so the read pass
// can check every byte.
uint8_t patternAt(uint64_t off) { return static_cast<uint8_t>((off * 2654435761u) >> 13); }

// Why the runtime runs on `chosen`: the flag, SPINDLE_BACKEND, or kAuto's probe.
std::string whyBackend(const std::string& flag, spindle::Backend chosen) {
    if (flag != "auto") { return "--backend " + flag; }
    if (const char* env = std::getenv("SPINDLE_BACKEND"); env != nullptr && env[0] != '\0' &&
                                                          std::string_view(env) != "auto") {
        return fmt::format("SPINDLE_BACKEND={}", env);
    }
    const int err = spindle::detail::probeUring().setupError;
    if (chosen == spindle::Backend::kEpoll && err != 0) {
        return fmt::format("auto: io_uring unavailable: {}", std::strerror(err));
    }
    return "auto";
}

}  // namespace

int main(int argc, char** argv) {
    TourOptions o;
    CLI::App app{"spindle-tour: fibers on pinned carriers reading a file through io_uring (or epoll)"};
    app.add_option("--carriers", o.carriers, "carriers to start (0: one per core)")
        ->check(CLI::Range(0u, spindle::kMaxCarriers));
    app.add_option("--fibers", o.fibers, "reader fibers")->check(CLI::Range(1u, 100000u));
    app.add_option("--file-mib", o.fileMiB, "size of the scratch file in MiB")->check(CLI::Range(size_t{1}, size_t{4096}));
    app.add_option("--block-kib", o.blockKiB, "read size in KiB")->check(CLI::Range(size_t{1}, size_t{1024}));
    app.add_option("--passes", o.passes, "times each block is read")->check(CLI::Range(1u, 1000u));
    app.add_option("--file", o.path, "scratch file (default: a temporary file, removed afterwards)");
    spindle::apps::addBackendFlag(app, o.backend);
    if (auto status = spindle::apps::parseCommandLine(app, argc, argv)) { return *status; }

    bool ownFile = false;
    if (o.path.empty()) {
        char tmpl[] = "/tmp/spindle-tour-XXXXXX";
        int fd = ::mkstemp(tmpl);
        if (fd < 0) {
            std::perror("spindle-tour: mkstemp");
            return 1;
        }
        ::close(fd);
        o.path = tmpl;
        ownFile = true;
    }

    spindle::RuntimeOptions ro;
    ro.carriers = o.carriers;
    ro.backend = spindle::apps::backendFromFlag(o.backend);
    const size_t block = o.blockKiB * 1024;
    const size_t fileBytes = o.fileMiB * 1024 * 1024 / block * block;
    const size_t blocks = fileBytes / block;

    struct Totals {
        std::atomic<uint64_t> bytes{0}, reads{0}, mismatches{0}, errors{0};
    } totals;
    std::string describe;
    spindle::Backend backend = spindle::Backend::kUring;
    std::vector<spindle::CarrierStats> stats;
    double writeSec = 0, readSec = 0;

    auto rt = spindle::Runtime::start(ro);
    if (!rt) {
        std::fprintf(stderr, "spindle-tour: the runtime did not start: %s%s\n", rt.error().message().c_str(),
                     spindle::apps::startFailureNote(o.backend).c_str());
        return 1;
    }
    describe = rt->describe();
    backend = rt->backend();

    auto mainFiber = rt->spawn([&]() -> int {
        auto fd = spindle::open(o.path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
        if (!fd) {
            fmt::print(stderr, "spindle-tour: open {}: {}\n", o.path, fd.error().message());
            return 1;
        }
        // Write pass: fibers each write a share of the blocks.
        auto t0 = std::chrono::steady_clock::now();
        std::vector<spindle::FiberHandle<void>> writers;
        for (unsigned w = 0; w < o.fibers; ++w) {
            auto h = spindle::spawn([&, w] {
                std::vector<uint8_t> buf(block);
                for (size_t b = w; b < blocks; b += o.fibers) {
                    for (size_t i = 0; i < block; ++i) { buf[i] = patternAt(b * block + i); }
                    auto n = spindle::write(*fd, buf.data(), block, b * block);
                    if (!n || *n != block) { totals.errors.fetch_add(1); }
                }
            });
            if (!h) { totals.errors.fetch_add(1); continue; }
            writers.push_back(std::move(*h));
        }
        for (auto& h : writers) { h.join(); }
        if (!spindle::fsync(*fd)) { totals.errors.fetch_add(1); }
        writeSec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

        // Read pass: every fiber reads its blocks `passes` times and checks them.
        t0 = std::chrono::steady_clock::now();
        std::vector<spindle::FiberHandle<void>> readers;
        for (unsigned r = 0; r < o.fibers; ++r) {
            auto h = spindle::spawn([&, r] {
                std::vector<uint8_t> buf(block);
                for (unsigned p = 0; p < o.passes; ++p) {
                    for (size_t b = (r + p) % o.fibers; b < blocks; b += o.fibers) {
                        auto n = spindle::read(*fd, buf.data(), block, b * block);
                        if (!n || *n != block) {
                            totals.errors.fetch_add(1);
                            continue;
                        }
                        totals.bytes.fetch_add(*n, std::memory_order_relaxed);
                        totals.reads.fetch_add(1, std::memory_order_relaxed);
                        if (buf[block / 2] != patternAt(b * block + block / 2) || buf[0] != patternAt(b * block)) {
                            totals.mismatches.fetch_add(1);
                        }
                    }
                }
            });
            if (!h) { totals.errors.fetch_add(1); continue; }
            readers.push_back(std::move(*h));
        }
        for (auto& h : readers) { h.join(); }
        readSec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        (void)spindle::close(*fd);
        return 0;
    });
    if (!mainFiber) {
        std::fprintf(stderr, "spindle-tour: spawn failed: %s\n", mainFiber.error().message().c_str());
        return 1;
    }
    int rc = mainFiber->join();
    rt->waitIdle();
    stats = rt->stats();
    rt->shutdown();
    rt->join();
    if (ownFile) { ::unlink(o.path.c_str()); }

    fmt::print("spindle tour\n");
    fmt::print("  backend   : {} ({})\n", spindle::toString(backend), whyBackend(o.backend, backend));
    fmt::print("  runtime   : {}\n", describe);
    fmt::print("  driver    : {}\n", stats.empty() ? "" : stats[0].ring);
    fmt::print("  workload  : {} fibers, {} MiB file in {} KiB blocks, read {} times\n", o.fibers, fileBytes >> 20,
               o.blockKiB, o.passes);
    fmt::print("  write     : {:.1f} MiB in {:.3f} s ({:.0f} MiB/s, page cache)\n", fileBytes / 1048576.0, writeSec,
               fileBytes / 1048576.0 / writeSec);
    fmt::print("  read      : {} reads, {:.1f} MiB in {:.3f} s: {:.0f} reads/s, {:.0f} MiB/s\n", totals.reads.load(),
               totals.bytes.load() / 1048576.0, readSec, totals.reads.load() / readSec,
               totals.bytes.load() / 1048576.0 / readSec);
    fmt::print("  checked   : {} mismatches, {} errors\n", totals.mismatches.load(), totals.errors.load());
    // The driver's counters under its own names: io_uring_enter calls, SQEs and CQEs, or epoll_wait
    // calls, operations started and completed (files run on the offload pool there).
    const bool uring = backend == spindle::Backend::kUring;
    const char* enterName = uring ? "io_uring_enter" : "epoll_wait";
    const char* startName = uring ? "SQEs" : "ops";
    const char* doneName = uring ? "CQEs" : "done";
    uint64_t enters = 0, sqes = 0;
    for (const auto& s : stats) {
        fmt::print("  carrier {} : PU {:>2}  fibers run {:>8}  steals {:>6}  parks {:>6}  "
                   "{} {:>7}  {} {:>8}  {} {:>8}\n",
                   s.index, s.pu, s.fibersRun, s.steals, s.parks, enterName, s.enters, startName, s.sqesSubmitted,
                   doneName, s.cqesReaped);
        enters += s.enters;
        sqes += s.sqesSubmitted;
    }
    if (uring) {
        fmt::print("  batching  : {:.1f} SQEs per io_uring_enter\n", enters ? double(sqes) / double(enters) : 0.0);
    }
    return rc != 0 || totals.mismatches.load() != 0 || totals.errors.load() != 0 ? 1 : 0;
}
