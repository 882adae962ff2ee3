// SPDX-License-Identifier: Apache-2.0
// What the programs print, in the real binaries: every app's --version (exit 0, "<name> <version>" from
// CMake and git describe, nothing on stderr), spindle-hello's usage errors (exit 2), and the JSON outputs
// (spindle-iobench --json, spindle-topo experiment --json, the daemons' --stats-json), which must stay
// valid JSON whatever the strings in them hold (quotes, backslashes, a newline), parsed with nlohmann::json.

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <hwloc.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "spindle_version.h"
#include "testing/scratch_dir.h"
#include "tests/apps/child_process.h"

#if !defined(SPINDLE_HELLO_BIN) || !defined(SPINDLE_HTTPD_BIN) || !defined(SPINDLE_ECHO_BIN) || \
    !defined(SPINDLE_TOUR_BIN) || !defined(SPINDLE_IDLE_BIN) || !defined(SPINDLE_TOPO_BIN) ||   \
    !defined(SPINDLE_IOBENCH_BIN) || !defined(SPINDLE_KV_BIN)
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
    std::vector<std::string> bins{SPINDLE_HELLO_BIN, SPINDLE_HTTPD_BIN, SPINDLE_ECHO_BIN,    SPINDLE_TOUR_BIN,
                                  SPINDLE_IDLE_BIN,  SPINDLE_TOPO_BIN,  SPINDLE_IOBENCH_BIN, SPINDLE_KV_BIN};
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

// A name that JSON must escape: quotes, backslashes, a tab.
constexpr const char* kAwkwardName = "a \"quoted\" back\\slash\tname";

// Parses `text` as one JSON object on one line; fails the test when it is not.
nlohmann::json parseObjectLine(const std::string& text) {
    EXPECT_FALSE(text.empty());
    EXPECT_EQ(text.find('\n'), text.size() - 1) << "not one line:\n" << text;
    auto json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    EXPECT_TRUE(json.is_object()) << "not a JSON object:\n" << text;
    return json;
}

TEST(AppOutput, TopoExperimentJsonIsValidForAnyTopologyPath) {
    const spindle::testing_support::ScratchDir dir;
    ASSERT_TRUE(dir.ok());
    // An XML topology (two NUMA nodes, one PU each) at a path JSON must escape; it runs unbound.
    const std::string xml = dir.path(kAwkwardName) + ".xml";
    hwloc_topology_t topology = nullptr;
    ASSERT_EQ(hwloc_topology_init(&topology), 0);
    ASSERT_EQ(hwloc_topology_set_synthetic(topology, "pack:1 numa:2 core:1 pu:1"), 0);
    ASSERT_EQ(hwloc_topology_load(topology), 0);
    ASSERT_EQ(hwloc_topology_export_xml(topology, xml.c_str(), 0), 0) << xml;
    hwloc_topology_destroy(topology);

    Child child;
    ASSERT_NO_FATAL_FAILURE(spawn(child,
                                  {SPINDLE_TOPO_BIN, "experiment", "--topology", "xml:" + xml, "--carriers", "2",
                                   "--policy", "numa,none", "--fibers", "8", "--work-us", "10", "--slices", "2",
                                   "--repetitions", "1", "--json"},
                                  childEnvironment()));
    ASSERT_TRUE(child.finish(60s)) << "spindle-topo: still running after 60 s; stderr:\n" << child.stderrText;
    ASSERT_TRUE(child.exitedWith(0)) << describeStatus(*child.status) << "; stderr:\n" << child.stderrText;
    const nlohmann::json json = parseObjectLine(child.stdoutText);
    ASSERT_TRUE(json.is_object());
    EXPECT_EQ(json.value("topology_flag", ""), "xml:" + xml);
    EXPECT_EQ(json.value("carriers", 0u), 2u);
    EXPECT_EQ(json.value("fibers", 0u), 8u);
    ASSERT_TRUE(json.contains("results") && json["results"].is_array());
    ASSERT_EQ(json["results"].size(), 2u);
    EXPECT_EQ(json["results"][0].value("policy", ""), "numa");
    EXPECT_EQ(json["results"][1].value("policy", ""), "none");
    for (const auto& r : json["results"]) {
        EXPECT_TRUE(r.contains("makespan_ms_median") && r["makespan_ms_median"].is_number());
        ASSERT_TRUE(r.contains("steals") && r["steals"].is_object());
        EXPECT_TRUE(r["steals"].contains("same-node")) << r.dump();
    }
    EXPECT_EQ(json["results"][1]["cross_node_steal_fraction"], nullptr);  // policy none steals nothing
}

// The port after `words` in `text` ("listening on 127.0.0.1:" -> 40123), or 0.
uint16_t portAfter(const std::string& text, std::string_view words) {
    const size_t at = text.find(words);
    if (at == std::string::npos) { return 0; }
    const unsigned long port = std::strtoul(text.c_str() + at + words.size(), nullptr, 10);
    return port > 0 && port <= 65535 ? static_cast<uint16_t>(port) : 0;
}

// Starts a daemon and waits until its stderr says where it listens ("<words><port>"); returns the port.
uint16_t startDaemon(Child& child, const std::vector<std::string>& argv, std::string_view words) {
    spawn(child, argv, childEnvironment());
    if (child.pid < 0) { return 0; }
    child.readUntil([&] { return portAfter(child.stderrText, words) != 0; }, 10s);
    return portAfter(child.stderrText, words);
}

// Sends `request` to 127.0.0.1:port over TCP and reads until `expect` has arrived (or EOF); returns what came.
std::string exchange(uint16_t port, const std::string& request, std::string_view expect) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) { return "socket: " + std::string(std::strerror(errno)); }
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const timeval tv{10, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    std::string got;
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) != 0 ||
        ::send(fd, request.data(), request.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(request.size())) {
        got = "connect/send: " + std::string(std::strerror(errno));
    } else {
        char buf[4096];
        while (got.find(expect) == std::string::npos) {
            const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
            if (n <= 0) { break; }
            got.append(buf, static_cast<size_t>(n));
        }
    }
    ::close(fd);
    return got;
}

// SIGTERM, then the daemon must exit with `status` within 10 s.
void stopDaemon(Child& child, int status = 0) {
    ::kill(child.pid, SIGTERM);
    ASSERT_TRUE(child.finish(10s)) << "still running 10 s after SIGTERM; stderr:\n" << child.stderrText;
    EXPECT_TRUE(child.exitedWith(status)) << describeStatus(*child.status) << "; stderr:\n" << child.stderrText;
}

std::string readFile(const std::string& path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
}

TEST(AppOutput, HttpdStatsJsonOnStdout) {
    const spindle::testing_support::ScratchDir dir;
    ASSERT_TRUE(dir.ok());
    const std::string root = dir.path(kAwkwardName);
    ASSERT_TRUE(std::filesystem::create_directory(root));
    Child child;
    const uint16_t port = startDaemon(child,
                                      {SPINDLE_HTTPD_BIN, "--address", "127.0.0.1", "--port", "0", "--carriers", "1",
                                       "--root", root, "--stats-json", "-"},
                                      "listening on 127.0.0.1:");
    ASSERT_NE(port, 0) << "not listening after 10 s; stderr:\n" << child.stderrText;
    const std::string reply = exchange(port, "GET /hello HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", "Hello");
    EXPECT_TRUE(reply.starts_with("HTTP/1.1 200")) << reply;
    ASSERT_NO_FATAL_FAILURE(stopDaemon(child));
    const nlohmann::json json = parseObjectLine(child.stdoutText);
    ASSERT_TRUE(json.is_object());
    EXPECT_EQ(json.value("program", ""), "spindle-httpd");
    EXPECT_EQ(json.value("root", ""), root);
    EXPECT_EQ(json.value("address", ""), "127.0.0.1:" + std::to_string(port));
    EXPECT_EQ(json.value("carriers", 0u), 1u);
    EXPECT_EQ(json.value("connections", 0u), 1u);
    EXPECT_EQ(json.value("requests", 0u), 1u);
    EXPECT_EQ(json.value("error_responses", 99u), 0u);
    ASSERT_TRUE(json.contains("receives") && json["receives"].is_object());
}

// A FILE that cannot be opened stops each daemon at start-up, before it serves, with status 1.
TEST(AppOutput, StatsJsonToAFileThatCannotBeOpenedExits1AtStart) {
    const std::vector<std::vector<std::string>> runs{
        {SPINDLE_HTTPD_BIN, "--address", "127.0.0.1", "--port", "0", "--carriers", "1"},
        {SPINDLE_KV_BIN, "--port", "0", "--carriers", "1"},
        {SPINDLE_ECHO_BIN, "server", "--address", "127.0.0.1", "--port", "0", "--carriers", "1"}};
    for (std::vector<std::string> argv : runs) {
        argv.insert(argv.end(), {"--stats-json", "/nonexistent/stats.json"});
        Child child;
        ASSERT_NO_FATAL_FAILURE(spawn(child, argv, childEnvironment()));
        ASSERT_TRUE(child.finish(10s)) << argv[0] << ": still running after 10 s; stderr:\n" << child.stderrText;
        EXPECT_TRUE(child.exitedWith(1)) << argv[0] << ": " << describeStatus(*child.status);
        EXPECT_EQ(child.stderrText,
                  std::filesystem::path(argv[0]).filename().string() +
                      ": --stats-json /nonexistent/stats.json: No such file or directory\n");
        EXPECT_EQ(child.stdoutText, "");
    }
}

TEST(AppOutput, KvStatsJsonToAFile) {
    const spindle::testing_support::ScratchDir dir;
    ASSERT_TRUE(dir.ok());
    const std::string data = dir.path(kAwkwardName);
    ASSERT_TRUE(std::filesystem::create_directory(data));
    const std::string statsFile = dir.path("stats \"1\".json");
    Child child;
    const uint16_t port = startDaemon(child,
                                      {SPINDLE_KV_BIN, "--port", "0", "--carriers", "1", "--dir", data,
                                       "--appendfsync", "always", "--stats-json", statsFile},
                                      "listening on 127.0.0.1:");
    ASSERT_NE(port, 0) << "not listening after 10 s; stderr:\n" << child.stderrText;
    const std::string reply = exchange(port, "SET k v\r\nGET k\r\n", "$1\r\nv\r\n");
    EXPECT_EQ(reply, "+OK\r\n$1\r\nv\r\n");
    ASSERT_NO_FATAL_FAILURE(stopDaemon(child));
    EXPECT_EQ(child.stdoutText, "");
    const nlohmann::json json = parseObjectLine(readFile(statsFile));
    ASSERT_TRUE(json.is_object());
    EXPECT_EQ(json.value("program", ""), "spindle-kv");
    EXPECT_EQ(json.value("dir", ""), data);
    EXPECT_EQ(json.value("appendfsync", ""), "always");
    EXPECT_EQ(json.value("connections", 0u), 1u);
    EXPECT_EQ(json.value("commands", 0u), 2u);
    EXPECT_EQ(json.value("keys", 0u), 1u);
    ASSERT_TRUE(json.contains("log") && json["log"].is_object());
    EXPECT_EQ(json["log"].value("records", 0u), 1u);
    EXPECT_EQ(json["log"]["error"], nullptr);
}

TEST(AppOutput, EchoServerStatsJsonToAFile) {
    const spindle::testing_support::ScratchDir dir;
    ASSERT_TRUE(dir.ok());
    const std::string statsFile = dir.path(kAwkwardName);
    Child child;
    const uint16_t port = startDaemon(child,
                                      {SPINDLE_ECHO_BIN, "server", "--address", "127.0.0.1", "--port", "0",
                                       "--carriers", "1", "--stats-json", statsFile},
                                      "listening on 127.0.0.1:");
    ASSERT_NE(port, 0) << "not listening after 10 s; stderr:\n" << child.stderrText;
    EXPECT_EQ(exchange(port, "hello", "hello"), "hello");
    ASSERT_NO_FATAL_FAILURE(stopDaemon(child));
    const nlohmann::json json = parseObjectLine(readFile(statsFile));
    ASSERT_TRUE(json.is_object());
    EXPECT_EQ(json.value("program", ""), "spindle-echo");
    EXPECT_EQ(json.value("transport", ""), "tcp");
    EXPECT_EQ(json.value("signal", ""), "Terminated");
    EXPECT_EQ(json.value("connections", 0u), 1u);
    EXPECT_EQ(json.value("bytes_echoed", 0u), 5u);
    ASSERT_TRUE(json.contains("per_carrier") && json["per_carrier"].is_array());
    EXPECT_EQ(json["per_carrier"].size(), 1u);
}

TEST(AppOutput, EchoUdpServerStatsJsonOnStdout) {
    Child child;
    const uint16_t port = startDaemon(child,
                                      {SPINDLE_ECHO_BIN, "server", "--udp", "--address", "127.0.0.1", "--port", "0",
                                       "--carriers", "1", "--stats-json", "-"},
                                      "UDP echo on 127.0.0.1 port ");
    ASSERT_NE(port, 0) << "not listening after 10 s; stderr:\n" << child.stderrText;
    const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const timeval tv{10, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    const std::string datagram = "a datagram of 32 bytes, or so...";
    ASSERT_EQ(::sendto(fd, datagram.data(), datagram.size(), 0, reinterpret_cast<const sockaddr*>(&sa), sizeof sa),
              static_cast<ssize_t>(datagram.size()))
        << std::strerror(errno);
    char buf[256];
    const ssize_t got = ::recv(fd, buf, sizeof buf, 0);
    ::close(fd);
    EXPECT_EQ(std::string(buf, static_cast<size_t>(std::max<ssize_t>(got, 0))), datagram);
    ASSERT_NO_FATAL_FAILURE(stopDaemon(child));
    const nlohmann::json json = parseObjectLine(child.stdoutText);
    ASSERT_TRUE(json.is_object());
    EXPECT_EQ(json.value("program", ""), "spindle-echo");
    EXPECT_EQ(json.value("transport", ""), "udp");
    EXPECT_EQ(json.value("port", 0u), port);
    EXPECT_EQ(json.value("datagrams_echoed", 0u), 1u);
}

}  // namespace
