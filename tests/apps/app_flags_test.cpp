// SPDX-License-Identifier: Apache-2.0
// Every app's command line, in the real binaries (apps/common/cli.h): a number out of its flag's range,
// or no number at all, ends the program with status 2 before it starts anything, and stderr begins with
// the flag's name; --help exits 0 and shows the ranges; a run with flags in range works.
//
// The refused runs happen under a 256 MiB address-space limit: a refusal needs nothing like that, and a
// value that slipped through (spindle-httpd --carriers 99999 once asked the runtime for tens of GB)
// then fails to allocate instead of growing until the OOM killer comes. Sanitizer builds go without
// the limit: their shadow memory alone reserves terabytes of address space.

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include "apps/common/backend_flag.h"
#include "core/runtime.h"
#include "tests/apps/child_process.h"

#if !defined(SPINDLE_HTTPD_BIN) || !defined(SPINDLE_ECHO_BIN) || !defined(SPINDLE_TOUR_BIN) || \
    !defined(SPINDLE_IDLE_BIN) || !defined(SPINDLE_TOPO_BIN) || !defined(SPINDLE_IOBENCH_BIN)
#error "tests/CMakeLists.txt passes SPINDLE_<APP>_BIN, the path of each app (SPINDLE_DPDK_FORWARD_BIN where built)"
#endif

namespace {

using namespace std::chrono_literals;
using spindle::testing_support::Child;
using spindle::testing_support::childEnvironment;
using spindle::testing_support::describeStatus;
using spindle::testing_support::spawn;

// A bad command line's status (kExitUsage in apps/common/cli.h; README.md, "Flags and exit status").
constexpr int kExitUsage = 2;

#if defined(SPINDLE_ASAN) || defined(SPINDLE_TSAN)
constexpr rlim_t kAddressSpace = 0;
#else
constexpr rlim_t kAddressSpace = rlim_t{256} << 20;
#endif

// A file no test creates: iobench runs that got past their flags fail to open it (status 1).
constexpr const char* kNoFile = "/nonexistent/spindle-app-flags-test";

std::string joined(const std::vector<std::string>& argv) {
    std::string out;
    for (const std::string& a : argv) { out += (out.empty() ? "" : " ") + a; }
    return out;
}

// `flag` refused with `value`: `bin` [`before`...] `flag` `value` ends within 10 s with status 2, prints
// nothing on stdout, and its stderr begins "<flag>: " and ends by pointing at --help.
void expectRefused(const char* bin, const std::vector<std::string>& before, const std::string& flag,
                   const std::string& value) {
    std::vector<std::string> argv{bin};
    argv.insert(argv.end(), before.begin(), before.end());
    argv.push_back(flag);
    argv.push_back(value);
    const std::string what = joined(argv);
    Child child;
    ASSERT_NO_FATAL_FAILURE(spawn(child, argv, childEnvironment(), {.addressSpace = kAddressSpace}));
    ASSERT_TRUE(child.finish(10s)) << what << ": still running after 10 s; stderr:\n" << child.stderrText;
    EXPECT_TRUE(child.exitedWith(kExitUsage))
        << what << ": " << describeStatus(*child.status) << "; stderr:\n" << child.stderrText;
    EXPECT_TRUE(child.stderrText.starts_with(flag + ": ")) << what << ": stderr does not begin with the flag:\n"
                                                           << child.stderrText;
    EXPECT_TRUE(child.stderrText.ends_with("Run with --help for more information.\n")) << what << ":\n"
                                                                                        << child.stderrText;
    EXPECT_EQ(child.stdoutText, "") << what;
}

// `bin` `args` (a --help) exits 0 within 10 s with each of `shown` on stdout.
void expectHelp(const char* bin, const std::vector<std::string>& args, const std::vector<std::string>& shown) {
    std::vector<std::string> argv{bin};
    argv.insert(argv.end(), args.begin(), args.end());
    const std::string what = joined(argv);
    Child child;
    ASSERT_NO_FATAL_FAILURE(spawn(child, argv, childEnvironment(), {.addressSpace = kAddressSpace}));
    ASSERT_TRUE(child.finish(10s)) << what << ": still running after 10 s";
    EXPECT_TRUE(child.exitedWith(0)) << what << ": " << describeStatus(*child.status) << "; stderr:\n"
                                     << child.stderrText;
    for (const std::string& s : shown) {
        EXPECT_NE(child.stdoutText.find(s), std::string::npos) << what << ": no '" << s << "' in\n" << child.stdoutText;
    }
}

const std::string kMaxCarriers = std::to_string(spindle::kMaxCarriers);

// The case first: 99,999 carriers made spindle-httpd grow to 24 GB before the OOM killer came.
TEST(AppFlags, HttpdRefusesBadNumbers) {
    expectRefused(SPINDLE_HTTPD_BIN, {}, "--carriers", "99999");
    expectRefused(SPINDLE_HTTPD_BIN, {}, "--carriers", std::to_string(spindle::kMaxCarriers + 1));
    expectRefused(SPINDLE_HTTPD_BIN, {}, "--carriers", "-1");
    expectRefused(SPINDLE_HTTPD_BIN, {}, "--carriers", "many");
    expectRefused(SPINDLE_HTTPD_BIN, {}, "--port", "65536");
    expectRefused(SPINDLE_HTTPD_BIN, {}, "--port", "80x");
    expectRefused(SPINDLE_HTTPD_BIN, {}, "--idle-timeout", "nan");
    expectRefused(SPINDLE_HTTPD_BIN, {}, "--header-timeout", "0");
    expectRefused(SPINDLE_HTTPD_BIN, {}, "--max-body-bytes", "-1");
    expectRefused(SPINDLE_HTTPD_BIN, {}, "--provided-buffers", "3");
    expectRefused(SPINDLE_HTTPD_BIN, {}, "--stack-kib", "big");
    expectRefused(SPINDLE_HTTPD_BIN, {}, "--symlinks", "sometimes");
    expectRefused(SPINDLE_HTTPD_BIN, {}, "--worker-cpus", "0-");
    expectRefused(SPINDLE_HTTPD_BIN, {}, "--worker-cpus", "1 2");
}

TEST(AppFlags, EchoRefusesBadNumbers) {
    const std::vector<std::string> server{"server", "--address", "127.0.0.1", "--port", "0"};
    expectRefused(SPINDLE_ECHO_BIN, server, "--carriers", "99999");
    expectRefused(SPINDLE_ECHO_BIN, {"--port", "0"}, "--carriers", "x");  // no subcommand: server
    expectRefused(SPINDLE_ECHO_BIN, server, "--provided-buffers", "100");
    expectRefused(SPINDLE_ECHO_BIN, server, "--buffer-size", "0");
    expectRefused(SPINDLE_ECHO_BIN, {"client"}, "--connections", "70000");
    expectRefused(SPINDLE_ECHO_BIN, {"client"}, "--duration", "nan");
    expectRefused(SPINDLE_ECHO_BIN, {"client"}, "--messages", "-1");
    expectRefused(SPINDLE_ECHO_BIN, {"client"}, "--port", "0");
    expectRefused(SPINDLE_ECHO_BIN, {"udp-pair"}, "--warmup", "nan");
    expectRefused(SPINDLE_ECHO_BIN, {"udp-pair"}, "--window", "0");
}

// The UDP client has no JSON report: --json with --udp is refused, not ignored.
TEST(AppFlags, EchoRefusesJsonForTheUdpClient) {
    const std::vector<std::string> argv{SPINDLE_ECHO_BIN, "client", "--udp", "--json", "--port", "9"};
    Child child;
    ASSERT_NO_FATAL_FAILURE(spawn(child, argv, childEnvironment(), {.addressSpace = kAddressSpace}));
    ASSERT_TRUE(child.finish(10s)) << joined(argv) << ": still running after 10 s";
    EXPECT_TRUE(child.exitedWith(kExitUsage)) << describeStatus(*child.status) << "; stderr:\n" << child.stderrText;
    EXPECT_TRUE(child.stderrText.starts_with("spindle-echo: --json: ")) << child.stderrText;
    EXPECT_EQ(child.stdoutText, "");
}

// --worker-cpus's text as RuntimeOptions::workerCpus gets it (base/cpu_list_test.cpp tests the parser;
// the binaries' refusals are below).
TEST(AppFlags, WorkerCpusFlagGivesTheParsedList) {
    EXPECT_EQ(spindle::apps::workerCpusFromFlag(""), std::vector<unsigned>{});
    EXPECT_EQ(spindle::apps::workerCpusFromFlag("5,4"), (std::vector<unsigned>{4, 5}));
}

TEST(AppFlags, KvRefusesBadNumbers) {
#if defined(SPINDLE_KV_BIN)
    expectRefused(SPINDLE_KV_BIN, {}, "--carriers", "99999");
    expectRefused(SPINDLE_KV_BIN, {}, "--port", "65536");
    expectRefused(SPINDLE_KV_BIN, {}, "--maxclients", "0");
    expectRefused(SPINDLE_KV_BIN, {}, "--maxmemory", "-1");
    expectRefused(SPINDLE_KV_BIN, {}, "--proto-max-bulk-len", "1000");
    expectRefused(SPINDLE_KV_BIN, {}, "--ring-entries", "32");
    expectRefused(SPINDLE_KV_BIN, {}, "--worker-cpus", "3-1");
    expectRefused(SPINDLE_KV_BIN, {}, "--worker-cpus", "1,,2");
    expectRefused(SPINDLE_KV_BIN, {}, "--worker-cpus", "99999");
    expectRefused(SPINDLE_KV_BIN, {}, "--worker-cpus", "-1");
    expectRefused(SPINDLE_KV_BIN, {}, "--provided-buffers", "3");
    expectRefused(SPINDLE_KV_BIN, {}, "--provided-buffers", "65536");
    expectRefused(SPINDLE_KV_BIN, {}, "--provided-buffer-size", "255");
    expectRefused(SPINDLE_KV_BIN, {}, "--provided-buffer-size", "1048577");
#else
    GTEST_SKIP() << "spindle-kv is not built";
#endif
}

TEST(AppFlags, TourRefusesBadNumbers) {
    expectRefused(SPINDLE_TOUR_BIN, {}, "--carriers", "2000");
    expectRefused(SPINDLE_TOUR_BIN, {}, "--carriers", "x");
    expectRefused(SPINDLE_TOUR_BIN, {}, "--fibers", "0");
    expectRefused(SPINDLE_TOUR_BIN, {}, "--file-mib", "-1");
    expectRefused(SPINDLE_TOUR_BIN, {}, "--block-kib", "2k");
    expectRefused(SPINDLE_TOUR_BIN, {}, "--passes", "1001");
}

TEST(AppFlags, IdleRefusesBadNumbers) {
    expectRefused(SPINDLE_IDLE_BIN, {}, "--carriers", "2000");
    expectRefused(SPINDLE_IDLE_BIN, {}, "--seconds", "nan");
    expectRefused(SPINDLE_IDLE_BIN, {}, "--seconds", "soon");
    expectRefused(SPINDLE_IDLE_BIN, {}, "--spin-us", "0");
    expectRefused(SPINDLE_IDLE_BIN, {}, "--tick-ms", "60001");
    expectRefused(SPINDLE_IDLE_BIN, {}, "--sq-idle-ms", "x");
}

TEST(AppFlags, TopoRefusesBadNumbers) {
    expectRefused(SPINDLE_TOPO_BIN, {}, "--carriers", std::to_string(spindle::kMaxCarriers + 1));
    expectRefused(SPINDLE_TOPO_BIN, {"experiment"}, "--carriers", std::to_string(spindle::kMaxCarriers + 1));
    expectRefused(SPINDLE_TOPO_BIN, {}, "--threshold", "x");
    expectRefused(SPINDLE_TOPO_BIN, {"experiment"}, "--fibers", "0");
    expectRefused(SPINDLE_TOPO_BIN, {"experiment"}, "--work-us", "x");
    expectRefused(SPINDLE_TOPO_BIN, {"experiment"}, "--slices", "10001");
    expectRefused(SPINDLE_TOPO_BIN, {"experiment"}, "--repetitions", "0");
}

TEST(AppFlags, IobenchRefusesBadNumbers) {
    const std::vector<std::string> file{"--file", kNoFile};
    expectRefused(SPINDLE_IOBENCH_BIN, file, "--carriers", std::to_string(spindle::kMaxCarriers + 1));
    expectRefused(SPINDLE_IOBENCH_BIN, file, "--depth", "0");
    expectRefused(SPINDLE_IOBENCH_BIN, file, "--bs", "0");
    expectRefused(SPINDLE_IOBENCH_BIN, file, "--bs", "65m");
    expectRefused(SPINDLE_IOBENCH_BIN, file, "--bs", "4x");
    expectRefused(SPINDLE_IOBENCH_BIN, file, "--size", "0");
    expectRefused(SPINDLE_IOBENCH_BIN, file, "--duration", "nan");
    expectRefused(SPINDLE_IOBENCH_BIN, file, "--ramp", "-1");
    expectRefused(SPINDLE_IOBENCH_BIN, file, "--seed", "x");
}

TEST(AppFlags, DpdkForwardRefusesBadNumbers) {
#if defined(SPINDLE_DPDK_FORWARD_BIN)
    expectRefused(SPINDLE_DPDK_FORWARD_BIN, {}, "--duration", "nan");
    expectRefused(SPINDLE_DPDK_FORWARD_BIN, {}, "--duration", "0");
    expectRefused(SPINDLE_DPDK_FORWARD_BIN, {}, "--burst", "33");
    expectRefused(SPINDLE_DPDK_FORWARD_BIN, {}, "--burst", "x");
    expectRefused(SPINDLE_DPDK_FORWARD_BIN, {}, "--dpdk-memory-mb", "63");
#else
    GTEST_SKIP() << "spindle-dpdk-forward is not built (no libdpdk)";
#endif
}

// --help exits 0 and shows each numeric flag's range (CLI11 prints the validators' descriptions).
TEST(AppFlags, HelpExitsZeroAndShowsTheRanges) {
    const std::string carriers = "--carriers UINT:UINT in [0 - " + kMaxCarriers + "]";
    expectHelp(SPINDLE_HTTPD_BIN, {"--help"},
               {carriers, "--port UINT:UINT in [0 - 65535]", "--idle-timeout FLOAT:FLOAT in [0.001 - 86400]",
                "--max-body-bytes UINT:UINT in [0 - 9223372036854775807]",
                "--provided-buffers UINT:UINT in [1 - 32768]:POWER OF TWO"});
    expectHelp(SPINDLE_ECHO_BIN, {"server", "--help"}, {carriers, "--port UINT:UINT in [0 - 65535]"});
    expectHelp(SPINDLE_ECHO_BIN, {"client", "--help"},
               {carriers, "--connections UINT:UINT in [1 - 65535]", "--messages UINT:UINT in [0 - 1000000000000]"});
    expectHelp(SPINDLE_TOUR_BIN, {"--help"}, {carriers, "--file-mib UINT:UINT in [1 - 4096]"});
    expectHelp(SPINDLE_IDLE_BIN, {"--help"}, {carriers, "--seconds FLOAT:FLOAT in [0.1 - 3600]"});
    expectHelp(SPINDLE_TOPO_BIN, {"--help"}, {carriers});
    expectHelp(SPINDLE_TOPO_BIN, {"experiment", "--help"}, {carriers, "--fibers UINT:UINT in [1 - 1000000]"});
    expectHelp(SPINDLE_IOBENCH_BIN, {"--help"},
               {"--carriers UINT:UINT in [1 - " + kMaxCarriers + "]", "--bs TEXT:SIZE in [1 - 64m]",
                "--size TEXT:SIZE in [1 - 2^63-1]"});
#if defined(SPINDLE_DPDK_FORWARD_BIN)
    expectHelp(SPINDLE_DPDK_FORWARD_BIN, {"--help"}, {"--burst UINT:UINT in [1 - 32]"});
#endif
#if defined(SPINDLE_KV_BIN)
    expectHelp(SPINDLE_KV_BIN, {"--help"},
               {carriers, "--port UINT:UINT in [0 - 65535]", "--maxclients UINT:UINT in [1 - 16777216]",
                "--maxmemory UINT:UINT in [0 - 9223372036854775807]", "--stats-json FILE"});
#endif
    // --help-all (what the man pages are made from): the subcommands' flags, with their ranges, too.
    expectHelp(SPINDLE_ECHO_BIN, {"--help-all"},
               {"--connections UINT:UINT in [1 - 65535]", "--buffer-size UINT:UINT in [1 - 16777216]",
                "--stats-json FILE", "udp-pair"});
    expectHelp(SPINDLE_TOPO_BIN, {"--help-all"}, {"--fibers UINT:UINT in [1 - 1000000]", "--json"});
}

// Flags in range, some at their bounds, get past the parser: spindle-idle runs with them and exits 0.
TEST(AppFlags, IdleRunsWithFlagsInRange) {
    const std::vector<std::string> argv{SPINDLE_IDLE_BIN, "--carriers", "1", "--seconds", "0.1", "--tick-ms", "5",
                                        "--spin-us", "1000000", "--mode", "hybrid"};
    Child child;
    ASSERT_NO_FATAL_FAILURE(spawn(child, argv, childEnvironment()));
    ASSERT_TRUE(child.finish(60s)) << "spindle-idle did not exit; stderr:\n" << child.stderrText;
    EXPECT_TRUE(child.exitedWith(0)) << describeStatus(*child.status) << "; stderr:\n" << child.stderrText;
    EXPECT_NE(child.stdoutText.find(" carriers=1 "), std::string::npos) << child.stdoutText;
}

}  // namespace
