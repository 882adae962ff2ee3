// SPDX-License-Identifier: Apache-2.0
// spindle-idle: what an idle runtime costs in CPU in each poll mode. Starts a
// runtime with N carriers in the chosen mode, optionally with one fiber per
// carrier that wakes every T ms (a mostly idle daemon), sleeps D seconds, and
// prints the process CPU time spent meanwhile as a percentage of one CPU per
// carrier, with the share of the kernel's SQPOLL threads (iou-sqp-*) apart, and
// the backend the runtime ran on (--backend; SPINDLE_BACKEND with auto).
//
// Exit status: 0 done; 1 the runtime did not start or a ticker fiber could not be spawned; 2 a bad flag
// value (README.md, "Flags and exit status").
#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "apps/common/backend_flag.h"
#include "apps/common/cli.h"
#include "core/io.h"
#include "core/runtime.h"

namespace {

double rusageSeconds() {
    rusage ru{};
    ::getrusage(RUSAGE_SELF, &ru);
    auto sec = [](const timeval& tv) { return static_cast<double>(tv.tv_sec) + static_cast<double>(tv.tv_usec) / 1e6; };
    return sec(ru.ru_utime) + sec(ru.ru_stime);
}

// CPU seconds (utime + stime) of this process's threads whose name starts with `prefix`.
double threadSeconds(const char* prefix) {
    double total = 0;
    const double tick = static_cast<double>(::sysconf(_SC_CLK_TCK));
    DIR* d = ::opendir("/proc/self/task");
    if (d == nullptr) { return 0; }
    while (dirent* e = ::readdir(d)) {
        if (e->d_name[0] == '.') { continue; }
        std::ifstream f(std::string("/proc/self/task/") + e->d_name + "/stat");
        std::string line;
        if (!std::getline(f, line)) { continue; }
        const auto open = line.find('(');
        const auto close = line.rfind(')');
        if (open == std::string::npos || close == std::string::npos) { continue; }
        if (line.compare(open + 1, std::strlen(prefix), prefix) != 0) { continue; }
        std::istringstream rest(line.substr(close + 2));
        std::string field;
        unsigned long utime = 0, stime = 0;
        for (int i = 3; i <= 15 && rest >> field; ++i) {  // field 3 is the state; 14 utime, 15 stime
            if (i == 14) { utime = std::stoul(field); }
            if (i == 15) { stime = std::stoul(field); }
        }
        total += static_cast<double>(utime + stime) / tick;
    }
    ::closedir(d);
    return total;
}

}  // namespace

int main(int argc, char** argv) {
    std::string mode = "block";
    unsigned carriers = 0;
    double seconds = 2.0;
    unsigned spinMicros = 50;
    unsigned tickMs = 0;
    bool sqpoll = false;
    unsigned sqIdleMs = 10;
    std::string backend = "auto";
    CLI::App app{"spindle-idle: CPU used by an idle runtime in each poll mode"};
    app.add_option("--mode", mode, "block, spin or hybrid")->check(CLI::IsMember({"block", "spin", "hybrid"}));
    app.add_option("--carriers", carriers, "carriers to start (0: one per core)")
        ->check(CLI::Range(0u, spindle::kMaxCarriers));
    app.add_option("--seconds", seconds, "how long to stay idle")->check(spindle::apps::realRange(0.1, 3600.0));
    app.add_option("--spin-us", spinMicros, "hybrid: spin window in microseconds")->check(CLI::Range(1u, 1000000u));
    app.add_option("--tick-ms", tickMs, "one fiber per carrier wakes every this many ms (0: no work at all)")
        ->check(CLI::Range(0u, 60000u));
    app.add_flag("--sqpoll", sqpoll, "rings with IORING_SETUP_SQPOLL");
    app.add_option("--sq-idle-ms", sqIdleMs, "with --sqpoll: SQ thread idle time before it sleeps")
        ->check(CLI::Range(1u, 60000u));
    spindle::apps::addBackendFlag(app, backend);
    if (auto status = spindle::apps::parseCommandLine(app, argc, argv)) { return *status; }

    spindle::RuntimeOptions o;
    o.carriers = carriers;
    o.pollMode = mode == "spin" ? spindle::PollMode::kSpin
                 : mode == "hybrid" ? spindle::PollMode::kHybrid
                                    : spindle::PollMode::kBlock;
    o.spinMicros = spinMicros;
    o.sqpoll = sqpoll;
    o.sqThreadIdleMs = sqIdleMs;
    o.backend = spindle::apps::backendFromFlag(backend);
    auto rt = spindle::Runtime::start(o);
    if (!rt) {
        std::fprintf(stderr, "spindle-idle: the runtime did not start: %s%s\n", rt.error().message().c_str(),
                     spindle::apps::startFailureNote(backend).c_str());
        return 1;
    }
    const unsigned n = rt->carrierCount();
    const spindle::Backend used = rt->backend();
    std::atomic<bool> stop{false};
    std::vector<spindle::FiberHandle<int>> tickers;
    if (tickMs > 0) {
        for (unsigned c = 0; c < n; ++c) {
            auto h = rt->spawn(
                [&stop, tickMs] {
                    int ticks = 0;
                    while (!stop.load(std::memory_order_relaxed) && spindle::sleep(std::chrono::milliseconds(tickMs))) {
                        ++ticks;
                    }
                    return ticks;
                },
                spindle::SpawnOptions{.name = "ticker", .carrier = static_cast<int>(c), .pinned = true});
            if (!h) {
                std::fprintf(stderr, "spindle-idle: spawn: %s\n", h.error().message().c_str());
                return 1;
            }
            tickers.push_back(std::move(*h));
        }
    }
    // Let start-up settle (hybrid windows, SQ threads going idle) before measuring.
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const double cpu0 = rusageSeconds();
    const double sq0 = threadSeconds("iou-sqp");
    const auto t0 = std::chrono::steady_clock::now();
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double cpu = rusageSeconds() - cpu0;
    const double sq = threadSeconds("iou-sqp") - sq0;
    const auto stats = rt->stats();
    stop.store(true);
    long ticks = 0;
    for (auto& h : tickers) { ticks += h.join(); }
    rt->shutdown();
    rt->join();
    uint64_t parks = 0;
    for (const auto& s : stats) { parks += s.parks; }
    std::printf("%s\n", fmt::format("backend={} mode={} sqpoll={} carriers={} tick_ms={} wall_s={:.2f} cpu_s={:.3f} "
                                    "cpu_pct_per_carrier={:.1f} sq_thread_cpu_pct_per_carrier={:.1f} parks={} ticks={}",
                                    spindle::toString(used), mode, sqpoll ? 1 : 0, n, tickMs, wall, cpu,
                                    100.0 * cpu / wall / n,
                                    100.0 * sq / wall / n, parks, ticks)
                            .c_str());
    return 0;
}
