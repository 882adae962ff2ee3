// SPDX-License-Identifier: Apache-2.0
// What the programs print, in the real binaries: every app's --version (exit 0, "<name> <version>" from
// CMake and git describe, nothing on stderr), spindle-hello's usage errors (exit 2), and spindle-iobench
// --json, which must stay valid JSON whatever the file's name holds (quotes, backslashes, a newline).

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "spindle_version.h"
#include "testing/scratch_dir.h"
#include "tests/apps/child_process.h"

#if !defined(SPINDLE_HELLO_BIN) || !defined(SPINDLE_HTTPD_BIN) || !defined(SPINDLE_ECHO_BIN) || \
    !defined(SPINDLE_TOUR_BIN) || !defined(SPINDLE_IDLE_BIN) || !defined(SPINDLE_TOPO_BIN) ||   \
    !defined(SPINDLE_IOBENCH_BIN)
#error "tests/CMakeLists.txt passes SPINDLE_<APP>_BIN, the path of each app (SPINDLE_DPDK_FORWARD_BIN where built)"
#endif

namespace {

using namespace std::chrono_literals;
using spindle::testing_support::Child;
using spindle::testing_support::childEnvironment;
using spindle::testing_support::describeStatus;
using spindle::testing_support::spawn;

std::string baseName(const std::string& path) { return std::filesystem::path(path).filename().string(); }

TEST(AppOutput, EveryAppPrintsItsVersion) {
    std::vector<std::string> bins{SPINDLE_HELLO_BIN, SPINDLE_HTTPD_BIN, SPINDLE_ECHO_BIN,   SPINDLE_TOUR_BIN,
                                  SPINDLE_IDLE_BIN,  SPINDLE_TOPO_BIN,  SPINDLE_IOBENCH_BIN};
#if defined(SPINDLE_DPDK_FORWARD_BIN)
    bins.push_back(SPINDLE_DPDK_FORWARD_BIN);
#endif
    const std::string version = SPINDLE_VERSION_STRING;
    ASSERT_FALSE(version.empty());
    for (const std::string& bin : bins) {
        Child child;
        ASSERT_NO_FATAL_FAILURE(spawn(child, {bin, "--version"}, childEnvironment()));
        ASSERT_TRUE(child.finish(10s)) << bin << " --version: still running after 10 s";
        EXPECT_TRUE(child.exitedWith(0)) << bin << " --version: " << describeStatus(*child.status) << "; stderr:\n"
                                         << child.stderrText;
        EXPECT_EQ(child.stdoutText, baseName(bin) + " " + version + "\n") << bin;
        EXPECT_EQ(child.stderrText, "") << bin;
    }
}

TEST(AppOutput, HelloRefusesABadCommandLine) {
    for (const std::vector<std::string>& argv : {std::vector<std::string>{SPINDLE_HELLO_BIN, "--frobnicate"},
                                                 std::vector<std::string>{SPINDLE_HELLO_BIN, "/etc/hostname", "x"}}) {
        Child child;
        ASSERT_NO_FATAL_FAILURE(spawn(child, argv, childEnvironment()));
        ASSERT_TRUE(child.finish(10s)) << argv[1] << ": still running after 10 s";
        EXPECT_TRUE(child.exitedWith(2)) << argv[1] << ": " << describeStatus(*child.status);
        EXPECT_TRUE(child.stderrText.starts_with("usage: spindle-hello")) << child.stderrText;
        EXPECT_EQ(child.stdoutText, "");
    }
}

TEST(AppOutput, IobenchJsonIsValidForAnyFileName) {
    const spindle::testing_support::ScratchDir dir;
    ASSERT_TRUE(dir.ok()) << "mkdtemp under " << std::filesystem::temp_directory_path();
    const std::string file = dir.path("a \"quoted\" back\\slash\tand\nnewline");
    Child child;
    ASSERT_NO_FATAL_FAILURE(spawn(child,
                                  {SPINDLE_IOBENCH_BIN, "--file", file, "--size", "64k", "--bs", "4k", "--duration",
                                   "0.05", "--carriers", "1", "--no-bind", "--json"},
                                  childEnvironment()));
    ASSERT_TRUE(child.finish(30s)) << "spindle-iobench: still running after 30 s; stderr:\n" << child.stderrText;
    ASSERT_TRUE(child.exitedWith(0)) << describeStatus(*child.status) << "; stderr:\n" << child.stderrText;

    const auto json = nlohmann::json::parse(child.stdoutText, nullptr, /*allow_exceptions=*/false);
    ASSERT_FALSE(json.is_discarded()) << "not JSON:\n" << child.stdoutText;
    ASSERT_TRUE(json.is_object());
    EXPECT_EQ(json.value("file", ""), file);
    EXPECT_EQ(json.value("rw", ""), "randread");
    EXPECT_EQ(json.value("bs", 0u), 4096u);
    EXPECT_EQ(json.value("size", 0u), 65536u);
    ASSERT_TRUE(json.contains("lat_us") && json["lat_us"].is_object());
    for (const char* key : {"min", "avg", "p50", "p90", "p99", "p99.9", "max"}) {
        EXPECT_TRUE(json["lat_us"].contains(key) && json["lat_us"][key].is_number()) << key;
    }
    ASSERT_TRUE(json.contains("per_carrier") && json["per_carrier"].is_array());
    EXPECT_EQ(json["per_carrier"].size(), 1u);
    EXPECT_TRUE(json.value("ios", uint64_t{0}) > 0) << child.stdoutText;
    // One object on one line: a line-oriented reader (jq -c, a log) gets it whole.
    EXPECT_EQ(child.stdoutText.find('\n'), child.stdoutText.size() - 1) << child.stdoutText;
}

TEST(AppOutput, IobenchJsonPrintsNothingWhenItFails) {
    Child child;
    ASSERT_NO_FATAL_FAILURE(spawn(
        child, {SPINDLE_IOBENCH_BIN, "--file", "/nonexistent/\"x\"", "--duration", "0.05", "--json"}, childEnvironment()));
    ASSERT_TRUE(child.finish(30s)) << "spindle-iobench: still running after 30 s";
    EXPECT_TRUE(child.exitedWith(1)) << describeStatus(*child.status) << "; stderr:\n" << child.stderrText;
    EXPECT_EQ(child.stdoutText, "");
    EXPECT_NE(child.stderrText, "");
}

}  // namespace
