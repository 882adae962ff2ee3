// SPDX-License-Identifier: Apache-2.0
// --metrics-port in the real daemons (apps/common/metrics_flag.h): spindle-echo and spindle-httpd start
// with it, do some work for a client, and curl scrapes /metrics as an operator would; the page is valid,
// carries the runtime's per-carrier families and the daemon's own, and its counters follow the work. A
// taken metrics port ends the daemon with status 1 and a message; a bad value exits 2. Skipped where
// curl is missing. The epoll entries run the daemons with --backend epoll.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "tests/apps/child_process.h"
#include "tests/base/exposition_check.h"

#if !defined(SPINDLE_ECHO_BIN) || !defined(SPINDLE_HTTPD_BIN) || !defined(SPINDLE_KV_BIN)
#error "tests/CMakeLists.txt passes SPINDLE_ECHO_BIN, SPINDLE_HTTPD_BIN and SPINDLE_KV_BIN"
#endif

namespace {

using namespace std::chrono_literals;
using spindle::testing_support::Child;
using spindle::testing_support::childEnvironment;
using spindle::testing_support::describeStatus;
using spindle::testing_support::expositionProblem;
using spindle::testing_support::samplesOf;
using spindle::testing_support::spawn;
using spindle::testing_support::sumOf;

// The path of `program` on $PATH, or "".
std::string onPath(const std::string& program) {
    const char* path = std::getenv("PATH");
    std::string dirs = path != nullptr ? path : "";
    size_t start = 0;
    while (start < dirs.size()) {
        size_t end = dirs.find(':', start);
        if (end == std::string::npos) { end = dirs.size(); }
        const std::string candidate = dirs.substr(start, end - start) + "/" + program;
        if (end > start && ::access(candidate.c_str(), X_OK) == 0) { return candidate; }
        start = end + 1;
    }
    return "";
}

// --backend epoll for the epoll entries of this suite; the others leave the daemon its probe (auto), which
// picks io_uring wherever it can be used, as the daemons' own users get it.
std::vector<std::string> backendArgs() {
    const char* b = std::getenv("SPINDLE_BACKEND");
    if (b == nullptr || std::string_view(b) != "epoll") { return {}; }
    return {"--backend", "epoll"};
}

// The port after `words` in `text` ("listening on 127.0.0.1:" -> 40123), or 0.
uint16_t portAfter(const std::string& text, std::string_view words) {
    const size_t at = text.find(words);
    if (at == std::string::npos) { return 0; }
    const unsigned long port = std::strtoul(text.c_str() + at + words.size(), nullptr, 10);
    return port > 0 && port <= 65535 ? static_cast<uint16_t>(port) : 0;
}

constexpr std::string_view kMetricsWords = "metrics on http://127.0.0.1:";

// Starts `bin` with `args` (plus backendArgs()) and waits until it says where its server and its metrics
// listen. Fails the test when it does not within 10 s.
void startDaemon(Child& child, const char* bin, std::vector<std::string> args, uint16_t* port, uint16_t* metricsPort) {
    std::vector<std::string> argv{bin};
    argv.insert(argv.end(), args.begin(), args.end());
    for (const std::string& a : backendArgs()) { argv.push_back(a); }
    ASSERT_NO_FATAL_FAILURE(spawn(child, argv, childEnvironment()));
    const bool up = child.readUntil(
        [&] {
            return portAfter(child.stderrText, "listening on 127.0.0.1:") != 0 &&
                   portAfter(child.stderrText, kMetricsWords) != 0 &&
                   child.stderrText.find("/metrics\n") != std::string::npos;
        },
        10s);
    ASSERT_TRUE(up) << "not listening after 10 s; stderr:\n" << child.stderrText;
    *port = portAfter(child.stderrText, "listening on 127.0.0.1:");
    *metricsPort = portAfter(child.stderrText, kMetricsWords);
}

// SIGTERM, then the daemon must exit 0 within 10 s.
void stopDaemon(Child& child) {
    ::kill(child.pid, SIGTERM);
    ASSERT_TRUE(child.finish(10s)) << "still running 10 s after SIGTERM; stderr:\n" << child.stderrText;
    EXPECT_TRUE(child.exitedWith(0)) << describeStatus(*child.status) << "; stderr:\n" << child.stderrText;
}

struct CurlResult {
    bool ran = false;
    int exitCode = -1;
    std::string out;
    std::string err;
};

CurlResult curl(const std::string& curlPath, const std::vector<std::string>& args) {
    std::vector<std::string> argv{curlPath, "--silent", "--show-error", "--max-time", "5"};
    argv.insert(argv.end(), args.begin(), args.end());
    Child child;
    spawn(child, argv, childEnvironment());
    CurlResult r;
    if (child.pid < 0 || !child.finish(10s)) { return r; }
    r.ran = true;
    r.exitCode = WIFEXITED(*child.status) ? WEXITSTATUS(*child.status) : -1;
    r.out = child.stdoutText;
    r.err = child.stderrText;
    return r;
}

// The body of `response` (curl --include's output: the head, a blank line, the body).
std::string bodyOf(const std::string& response) {
    const size_t at = response.find("\r\n\r\n");
    return at == std::string::npos ? std::string() : response.substr(at + 4);
}

// Scrapes until `done(body)` holds, at most 5 s (the daemon updates some counters when a connection
// ends, a moment after the client closed it). Returns the last body.
template <class Done>
std::string scrapeUntil(const std::string& curlPath, const std::string& url, Done done) {
    const auto until = std::chrono::steady_clock::now() + 5s;
    std::string body;
    do {
        const CurlResult r = curl(curlPath, {"--include", url});
        EXPECT_TRUE(r.ran && r.exitCode == 0) << "curl " << url << ": exit " << r.exitCode << ": " << r.err;
        if (!r.ran || r.exitCode != 0) { return body; }
        EXPECT_TRUE(r.out.starts_with("HTTP/1.1 200 OK\r\n")) << r.out.substr(0, 200);
        EXPECT_NE(r.out.find("Content-Type: text/plain; version=0.0.4"), std::string::npos) << r.out.substr(0, 300);
        body = bodyOf(r.out);
        if (done(body)) { return body; }
        std::this_thread::sleep_for(20ms);
    } while (std::chrono::steady_clock::now() < until);
    return body;
}

// Sends `text` over a plain socket to 127.0.0.1:port and reads until `want` bytes came back (default:
// as many as were sent, an echo); what came back, or "" on failure.
std::string echoOnce(uint16_t port, std::string_view text, size_t want = 0) {
    if (want == 0) { want = text.size(); }
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    timeval tv{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    std::string got;
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0 &&
        ::send(fd, text.data(), text.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(text.size())) {
        char buf[256];
        while (got.size() < want) {
            const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
            if (n < 0 && errno == EINTR) { continue; }  // SO_RCVTIMEO keeps the kernel from restarting it
            if (n <= 0) { break; }
            got.append(buf, static_cast<size_t>(n));
        }
    }
    ::close(fd);
    return got;
}

TEST(AppMetrics, EchoServesMetricsThatCurlScrapes) {
    const std::string curlPath = onPath("curl");
    if (curlPath.empty()) { GTEST_SKIP() << "curl not on PATH"; }
    Child echo;
    uint16_t port = 0, metricsPort = 0;
    ASSERT_NO_FATAL_FAILURE(startDaemon(echo, SPINDLE_ECHO_BIN,
                                         {"--address", "127.0.0.1", "--port", "0", "--carriers", "2", "--no-bind",
                                          "--metrics-port", "0"},
                                         &port, &metricsPort));
    const std::string url = "http://127.0.0.1:" + std::to_string(metricsPort) + "/metrics";
    const std::string before = scrapeUntil(curlPath, url, [](const std::string&) { return true; });
    EXPECT_EQ(expositionProblem(before), "") << before;
    EXPECT_EQ(samplesOf(before, "spindle_echo_connections_accepted_total").at(""), 0);
    EXPECT_EQ(samplesOf(before, "spindle_carrier_fibers_run_total").size(), 2u);

    ASSERT_EQ(echoOnce(port, "hello metrics"), "hello metrics");
    const std::string after = scrapeUntil(curlPath, url, [](const std::string& body) {
        const auto closed = samplesOf(body, "spindle_echo_connections_closed_total");
        return closed.count("") != 0 && closed.at("") == 1;
    });
    EXPECT_EQ(expositionProblem(after), "") << after;
    EXPECT_EQ(samplesOf(after, "spindle_echo_connections_accepted_total").at(""), 1) << after;
    EXPECT_EQ(samplesOf(after, "spindle_echo_connections_closed_total").at(""), 1) << after;
    EXPECT_EQ(samplesOf(after, "spindle_echo_connections_open").at(""), 0) << after;
    EXPECT_EQ(samplesOf(after, "spindle_echo_bytes_echoed_total").at(""), 13) << after;
    EXPECT_GT(sumOf(after, "spindle_carrier_fibers_run_total"), sumOf(before, "spindle_carrier_fibers_run_total"));

    // Another path is 404, another method 405.
    const CurlResult missing = curl(curlPath, {"--output", "/dev/null", "--write-out", "%{http_code}",
                                               "http://127.0.0.1:" + std::to_string(metricsPort) + "/other"});
    EXPECT_EQ(missing.out, "404") << missing.err;
    const CurlResult post = curl(curlPath, {"--output", "/dev/null", "--write-out", "%{http_code}", "--request",
                                            "POST", url});
    EXPECT_EQ(post.out, "405") << post.err;
    stopDaemon(echo);
}

TEST(AppMetrics, HttpdServesMetricsThatCurlScrapes) {
    const std::string curlPath = onPath("curl");
    if (curlPath.empty()) { GTEST_SKIP() << "curl not on PATH"; }
    Child httpd;
    uint16_t port = 0, metricsPort = 0;
    ASSERT_NO_FATAL_FAILURE(startDaemon(
        httpd, SPINDLE_HTTPD_BIN,
        {"--address", "127.0.0.1", "--port", "0", "--carriers", "1", "--drain-timeout", "1", "--metrics-port", "0"},
        &port, &metricsPort));
    const CurlResult hello = curl(curlPath, {"http://127.0.0.1:" + std::to_string(port) + "/hello"});
    ASSERT_EQ(hello.exitCode, 0) << hello.err;
    EXPECT_EQ(hello.out, "Hello, World!");
    const std::string url = "http://127.0.0.1:" + std::to_string(metricsPort) + "/metrics";
    const std::string page = scrapeUntil(curlPath, url, [](const std::string& body) {
        const auto closed = samplesOf(body, "spindle_httpd_connections_closed_total");
        return closed.count("") != 0 && closed.at("") == 1;
    });
    EXPECT_EQ(expositionProblem(page), "") << page;
    EXPECT_EQ(samplesOf(page, "spindle_httpd_requests_total").at(""), 1) << page;
    EXPECT_EQ(samplesOf(page, "spindle_httpd_connections_accepted_total").at(""), 1) << page;
    EXPECT_EQ(samplesOf(page, "spindle_httpd_connections_open").at(""), 0) << page;
    EXPECT_EQ(samplesOf(page, "spindle_carrier_fibers_run_total").size(), 1u) << page;
    stopDaemon(httpd);
}

TEST(AppMetrics, KvServesMetricsThatCurlScrapes) {
    const std::string curlPath = onPath("curl");
    if (curlPath.empty()) { GTEST_SKIP() << "curl not on PATH"; }
    Child kv;
    uint16_t port = 0, metricsPort = 0;
    ASSERT_NO_FATAL_FAILURE(startDaemon(kv, SPINDLE_KV_BIN,
                                         {"--address", "127.0.0.1", "--port", "0", "--carriers", "2", "--metrics-port", "0"},
                                         &port, &metricsPort));
    // Two inline commands in one write: "+OK\r\n" then "$5\r\nvalue\r\n".
    ASSERT_EQ(echoOnce(port, "SET metric-key value\r\nGET metric-key\r\n", 16), "+OK\r\n$5\r\nvalue\r\n");
    const std::string url = "http://127.0.0.1:" + std::to_string(metricsPort) + "/metrics";
    const std::string page = scrapeUntil(curlPath, url, [](const std::string& body) {
        const auto clients = samplesOf(body, "spindle_kv_clients");
        return clients.count("") != 0 && clients.at("") == 0;
    });
    EXPECT_EQ(expositionProblem(page), "") << page;
    EXPECT_EQ(samplesOf(page, "spindle_kv_connections_accepted_total").at(""), 1) << page;
    EXPECT_EQ(samplesOf(page, "spindle_kv_commands_total").at(""), 2) << page;
    EXPECT_EQ(samplesOf(page, "spindle_kv_keys").at(""), 1) << page;
    EXPECT_GT(samplesOf(page, "spindle_kv_used_memory_bytes").at(""), 0) << page;
    EXPECT_EQ(samplesOf(page, "spindle_kv_log_rewrites_total").size(), 2u) << page;
    // The two commands came in one write: at least one receive, into the provided-buffer ring.
    const auto receives = samplesOf(page, "spindle_kv_receives_total");
    ASSERT_EQ(receives.size(), 3u) << page;
    EXPECT_GE(receives.at("{buffer=\"provided\"}"), 1) << page;
    EXPECT_EQ(receives.at("{buffer=\"own\"}"), 0) << page;
    EXPECT_EQ(samplesOf(page, "spindle_kv_receive_ring_exhausted_total").at(""), 0) << page;
    EXPECT_EQ(samplesOf(page, "spindle_carrier_fibers_run_total").size(), 2u) << page;
    stopDaemon(kv);
}

TEST(AppMetrics, ATakenMetricsPortEndsTheDaemonWithAMessage) {
    // A listening socket of the test's own holds the port.
    const int holder = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::bind(holder, reinterpret_cast<const sockaddr*>(&addr), sizeof addr), 0) << std::strerror(errno);
    ASSERT_EQ(::listen(holder, 1), 0);
    socklen_t len = sizeof addr;
    ASSERT_EQ(::getsockname(holder, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    const std::string taken = std::to_string(ntohs(addr.sin_port));
    for (const char* bin : {SPINDLE_ECHO_BIN, SPINDLE_HTTPD_BIN, SPINDLE_KV_BIN}) {
        std::vector<std::string> argv{bin, "--address", "127.0.0.1", "--port", "0", "--carriers", "1",
                                      "--metrics-port", taken};
        for (const std::string& a : backendArgs()) { argv.push_back(a); }
        Child child;
        ASSERT_NO_FATAL_FAILURE(spawn(child, argv, childEnvironment()));
        ASSERT_TRUE(child.finish(10s)) << bin << ": still running; stderr:\n" << child.stderrText;
        EXPECT_TRUE(child.exitedWith(1)) << bin << ": " << describeStatus(*child.status) << "\n" << child.stderrText;
        EXPECT_NE(child.stderrText.find("cannot serve metrics on 127.0.0.1:" + taken + ": Address already in use"),
                  std::string::npos)
            << bin << ":\n" << child.stderrText;
    }
    ::close(holder);
}

TEST(AppMetrics, BadMetricsFlagsExit2) {
    struct Case {
        const char* bin;
        std::vector<std::string> args;
        std::string says;  // the start of stderr
    };
    const std::vector<Case> cases{
        {SPINDLE_ECHO_BIN, {"--metrics-port", "65536"}, "--metrics-port: "},
        {SPINDLE_KV_BIN, {"--metrics-port", "70000"}, "--metrics-port: "},
        {SPINDLE_ECHO_BIN, {"--metrics-port", "-1"}, "--metrics-port: "},
        {SPINDLE_HTTPD_BIN, {"--metrics-port", "x"}, "--metrics-port: "},
        {SPINDLE_HTTPD_BIN, {"--metrics-port", "0", "--metrics-address", "not-an-address"}, "--metrics-address: "},
        {SPINDLE_ECHO_BIN, {"--udp", "--metrics-port", "0"}, "spindle-echo: --metrics-port: "},
    };
    for (const Case& c : cases) {
        std::vector<std::string> argv{c.bin, "--address", "127.0.0.1", "--port", "0", "--carriers", "1"};
        argv.insert(argv.end(), c.args.begin(), c.args.end());
        Child child;
        ASSERT_NO_FATAL_FAILURE(spawn(child, argv, childEnvironment()));
        ASSERT_TRUE(child.finish(10s)) << c.bin << ": still running; stderr:\n" << child.stderrText;
        EXPECT_TRUE(child.exitedWith(2)) << c.bin << " " << c.args[0] << ": " << describeStatus(*child.status) << "\n"
                                         << child.stderrText;
        EXPECT_TRUE(child.stderrText.starts_with(c.says)) << c.bin << ":\n" << child.stderrText;
    }
}

}  // namespace
