// SPDX-License-Identifier: Apache-2.0
// The runtime's metric families (core/runtime_metrics.h): one sample per carrier with its index as the
// `carrier` label, steals by distance class, the page valid in the text format, counters that move with
// the work the carriers do, and, where Debian's prometheus package put promtool on the PATH, promtool's
// own verdict on a real page.
#include "core/runtime_metrics.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/io.h"
#include "tests/base/exposition_check.h"
#include "tests/core/with_runtime.h"

namespace spindle {
namespace {

using testing_support::expositionProblem;
using testing_support::samplesOf;
using testing_support::sumOf;
using testing_support::WithRuntime;

std::string pageOf(const std::vector<CarrierStats>& stats) {
    metrics::Writer w;
    metrics::writeCarrierStats(w, stats);
    auto page = w.take();
    EXPECT_TRUE(page) << w.error();
    return page ? *page : std::string();
}

TEST(RuntimeMetrics, OneSamplePerCarrierLabelledWithItsIndex) {
    std::vector<CarrierStats> stats(2);
    stats[0].index = 0;
    stats[1].index = 7;  // the label is the carrier's index, not its position in the vector
    stats[0].fibersRun = 11;
    stats[1].fibersRun = 22;
    stats[1].sqesSubmitted = 5;
    stats[1].cqesReaped = 4;
    stats[0].sqFull = 3;
    stats[1].stalls = 2;
    stats[0].stacksMapped = 9;
    stats[1].stacksInUse = 6;
    stats[0].parks = 13;
    stats[0].timedParks = 5;
    stats[1].wakesSent = 17;
    stats[0].stealSuccesses[static_cast<size_t>(numa::Distance::kSameCache)] = 5;
    stats[0].stealAttempts[static_cast<size_t>(numa::Distance::kSameCache)] = 8;
    stats[1].stealSuccesses[static_cast<size_t>(numa::Distance::kRemotePackage)] = 1;
    stats[1].idleNs = 1'500'000'000;
    stats[0].fixedFallbackIo = 4;
    stats[1].pu = -1;
    stats[1].logicalPu = 3;
    stats[1].node = 1;
    const std::string page = pageOf(stats);
    ASSERT_EQ(expositionProblem(page), "") << page;

    auto has = [&](const std::string& line) {
        EXPECT_NE(page.find("\n" + line + "\n"), std::string::npos) << "missing: " << line << "\n" << page;
    };
    has("spindle_carrier_fibers_run_total{carrier=\"0\"} 11");
    has("spindle_carrier_fibers_run_total{carrier=\"7\"} 22");
    has("spindle_carrier_sqes_submitted_total{carrier=\"7\"} 5");
    has("spindle_carrier_cqes_reaped_total{carrier=\"7\"} 4");
    has("spindle_carrier_ring_full_total{carrier=\"0\"} 3");
    has("spindle_carrier_stalls_total{carrier=\"7\"} 2");
    has("spindle_carrier_stacks_mapped_total{carrier=\"0\"} 9");
    has("spindle_carrier_stacks_in_use{carrier=\"7\"} 6");
    has("spindle_carrier_parks_total{carrier=\"0\"} 13");
    has("spindle_carrier_timed_parks_total{carrier=\"0\"} 5");
    has("spindle_carrier_wakes_sent_total{carrier=\"7\"} 17");
    has("spindle_carrier_steals_total{carrier=\"0\",distance=\"same-cache\"} 5");
    has("spindle_carrier_steal_attempts_total{carrier=\"0\",distance=\"same-cache\"} 8");
    has("spindle_carrier_steals_total{carrier=\"7\",distance=\"remote-package\"} 1");
    has("spindle_carrier_idle_seconds_total{carrier=\"7\"} 1.5");
    has("spindle_carrier_fixed_buffer_io_total{carrier=\"0\",path=\"fallback\"} 4");
    has("spindle_carrier_info{carrier=\"7\",pu=\"-1\",logical_pu=\"3\",node=\"1\"} 1");
    // Every distance class of every carrier is there, so a rate() never sees a series appear.
    EXPECT_EQ(samplesOf(page, "spindle_carrier_steals_total").size(), 2 * numa::kDistanceClassCount);
    EXPECT_EQ(samplesOf(page, "spindle_carrier_parks_total").size(), 2u);
}

TEST(RuntimeMetrics, NoCarriersStillMakeAValidPage) {
    const std::string page = pageOf({});
    EXPECT_EQ(expositionProblem(page), "") << page;
    EXPECT_TRUE(samplesOf(page, "spindle_carrier_fibers_run_total").empty());
}

class RuntimeMetricsLive : public WithRuntime {
protected:
    std::string page() {
        metrics::Writer w;
        metrics::writeRuntime(w, rt());
        auto text = w.take();
        EXPECT_TRUE(text) << w.error();
        return text ? *text : std::string();
    }
};

TEST_F(RuntimeMetricsLive, CountersMoveWithTheWork) {
    const std::string before = page();
    ASSERT_EQ(expositionProblem(before), "") << before;
    EXPECT_EQ(samplesOf(before, "spindle_carrier_fibers_run_total").size(), rt().carrierCount());
    EXPECT_EQ(samplesOf(before, "spindle_carriers").at(""), rt().carrierCount());
    EXPECT_EQ(samplesOf(before, "spindle_runtime_info").count(std::string("{backend=\"") +
                                                                 toString(rt().backend()) + "\"}"),
              1u);

    constexpr int kFibers = 40;
    std::vector<FiberHandle<void>> fibers;
    for (int i = 0; i < kFibers; ++i) {
        fibers.push_back(on(i % 2, [] {
            for (int k = 0; k < 3; ++k) { EXPECT_TRUE(nop()); }
        }));
    }
    for (auto& f : fibers) { f.join(); }

    const std::string after = page();
    ASSERT_EQ(expositionProblem(after), "") << after;
    // Each fiber was switched into at least once; each nop is one operation started and completed.
    EXPECT_GE(sumOf(after, "spindle_carrier_fibers_run_total") - sumOf(before, "spindle_carrier_fibers_run_total"),
              kFibers);
    EXPECT_GE(sumOf(after, "spindle_carrier_sqes_submitted_total") -
                  sumOf(before, "spindle_carrier_sqes_submitted_total"),
              kFibers * 3);
    EXPECT_GE(sumOf(after, "spindle_carrier_cqes_reaped_total") - sumOf(before, "spindle_carrier_cqes_reaped_total"),
              kFibers * 3);
    // Both carriers worked: each one's own sample moved.
    for (const char* carrier : {"{carrier=\"0\"}", "{carrier=\"1\"}"}) {
        EXPECT_GT(samplesOf(after, "spindle_carrier_fibers_run_total").at(carrier),
                  samplesOf(before, "spindle_carrier_fibers_run_total").at(carrier))
            << carrier;
    }
}

// The path of `program` on $PATH, or "".
std::string onPath(const std::string& program) {
    const char* path = std::getenv("PATH");
    if (path == nullptr) { return ""; }
    std::string dirs = path;
    size_t start = 0;
    while (start <= dirs.size()) {
        size_t end = dirs.find(':', start);
        if (end == std::string::npos) { end = dirs.size(); }
        const std::string candidate = dirs.substr(start, end - start) + "/" + program;
        if (end > start && ::access(candidate.c_str(), X_OK) == 0) { return candidate; }
        start = end + 1;
    }
    return "";
}

TEST_F(RuntimeMetricsLive, PromtoolAcceptsThePage) {
    const std::string promtool = onPath("promtool");
    if (promtool.empty()) { GTEST_SKIP() << "promtool not on PATH (Debian package prometheus)"; }
    for (int i = 0; i < 4; ++i) { onFiber([] { EXPECT_TRUE(nop()); }); }
    const std::string text = page();
    char path[] = "/tmp/spindle-metrics-XXXXXX";
    const int fd = ::mkstemp(path);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
    ::close(fd);
    // promtool reads the page on stdin; its findings (lint included) go to stdout and stderr.
    const std::string command = promtool + " check metrics < " + path + " 2>&1";
    FILE* p = ::popen(command.c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string said;
    char buf[512];
    while (size_t n = std::fread(buf, 1, sizeof buf, p)) { said.append(buf, n); }
    const int status = ::pclose(p);
    ::unlink(path);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << command << ":\n" << said << "\npage:\n" << text;
    EXPECT_EQ(said, "") << "promtool found problems:\n" << said;
}

}  // namespace
}  // namespace spindle
