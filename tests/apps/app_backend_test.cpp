// SPDX-License-Identifier: Apache-2.0
// The epoll fallback end to end, in the real binaries: spindle-hello and spindle-httpd run in a child
// whose io_uring_setup a seccomp filter answers with EPERM (as a container's profile or
// kernel.io_uring_disabled would), and must then run on epoll, say why once, and exit 0; with
// --backend io_uring they must refuse to start and say why.
//
// Why fork and exec (tests/apps/child_process.h): a seccomp filter outlives the test and would change
// every test after it; the child takes it to its grave, and the binaries are the ones a user runs.
// The child's environment drops SPINDLE_BACKEND (so --backend auto means the probe, whichever
// backend this suite's ctest entry names) and sets SPINDLE_LOG=warn (so the fallback's warning is
// the only log line expected).

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "tests/apps/child_process.h"

#ifndef SPINDLE_HELLO_BIN
#error "tests/CMakeLists.txt passes SPINDLE_HELLO_BIN, the path of spindle-hello"
#endif
#ifndef SPINDLE_HTTPD_BIN
#error "tests/CMakeLists.txt passes SPINDLE_HTTPD_BIN, the path of spindle-httpd"
#endif

namespace {

using namespace std::chrono_literals;
using spindle::testing_support::Child;
using spindle::testing_support::childEnvironment;
using spindle::testing_support::describeStatus;
using spindle::testing_support::spawn;

constexpr std::string_view kFallbackWords = "io_uring unavailable";

// A scratch file holding `text`, removed with the object.
class ScratchFile {
public:
    explicit ScratchFile(std::string_view text) {
        char tmpl[] = "/tmp/spindle-app-backend-XXXXXX";
        const int fd = ::mkstemp(tmpl);
        if (fd < 0) { return; }
        path_ = tmpl;
        const bool written = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
        ::close(fd);
        if (!written) {
            ::unlink(path_.c_str());
            path_.clear();
        }
    }
    ScratchFile(const ScratchFile&) = delete;
    ScratchFile& operator=(const ScratchFile&) = delete;
    ~ScratchFile() {
        if (!path_.empty()) { ::unlink(path_.c_str()); }
    }
    [[nodiscard]] const std::string& path() const { return path_; }  // "" when it could not be written

private:
    std::string path_;
};

constexpr std::string_view kFileText = "spindle app backend test\n";  // 25 bytes

// The lines of `text` that contain `words`.
std::vector<std::string> linesWith(const std::string& text, std::string_view words) {
    std::vector<std::string> lines;
    size_t start = 0;
    while (start < text.size()) {
        size_t end = text.find('\n', start);
        if (end == std::string::npos) { end = text.size(); }
        const std::string line = text.substr(start, end - start);
        if (line.find(words) != std::string::npos) { lines.push_back(line); }
        start = end + 1;
    }
    return lines;
}

// The port in spindle-httpd's "listening on 127.0.0.1:PORT ..." line, or 0.
uint16_t listeningPort(const std::string& text) {
    constexpr std::string_view kWords = "listening on 127.0.0.1:";
    const size_t at = text.find(kWords);
    if (at == std::string::npos) { return 0; }
    const unsigned long port = std::strtoul(text.c_str() + at + kWords.size(), nullptr, 10);
    return port > 0 && port <= 65535 ? static_cast<uint16_t>(port) : 0;
}

// Sends one GET to 127.0.0.1:port over a plain blocking socket and returns the response's head
// (up to its blank line), or "error: ..." when the connection, the send or the receive fails.
std::string getRoot(uint16_t port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) { return std::string("error: socket: ") + std::strerror(errno); }
    timeval tv{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    std::string result;
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
        result = std::string("error: connect: ") + std::strerror(errno);
    } else {
        constexpr std::string_view kRequest = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
        if (::send(fd, kRequest.data(), kRequest.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(kRequest.size())) {
            result = std::string("error: send: ") + std::strerror(errno);
        } else {
            char buf[4096];
            while (result.find("\r\n\r\n") == std::string::npos) {
                const ssize_t got = ::recv(fd, buf, sizeof buf, 0);
                if (got <= 0) {
                    result = std::string("error: recv: ") + (got == 0 ? "closed" : std::strerror(errno)) +
                             " after '" + result + "'";
                    break;
                }
                result.append(buf, static_cast<size_t>(got));
            }
        }
    }
    ::close(fd);
    return result;
}

// The read line names epoll, and the fallback's reason is logged exactly once.
TEST(AppBackend, HelloFallsBackToEpollWhenIoUringIsRefused) {
    ScratchFile file(kFileText);
    ASSERT_FALSE(file.path().empty()) << "cannot write a file in /tmp";
    Child child;
    ASSERT_NO_FATAL_FAILURE(
        spawn(child, {SPINDLE_HELLO_BIN, file.path()}, childEnvironment(), {.denyIoUring = true}));
    ASSERT_TRUE(child.finish(30s)) << "spindle-hello did not exit; stderr:\n" << child.stderrText;
    if (child.filterMissing()) { GTEST_SKIP() << child.stderrText; }
    EXPECT_TRUE(WIFEXITED(*child.status) && WEXITSTATUS(*child.status) == 0)
        << describeStatus(*child.status) << "; stderr:\n" << child.stderrText;
    EXPECT_EQ(child.stdoutText, "read " + std::to_string(kFileText.size()) + " bytes of " + file.path() +
                                    " through epoll\n");
    const auto reasons = linesWith(child.stderrText, kFallbackWords);
    ASSERT_EQ(reasons.size(), 1u) << "stderr:\n" << child.stderrText;
    EXPECT_NE(reasons[0].find("backend: epoll"), std::string::npos) << reasons[0];
    EXPECT_NE(reasons[0].find("Operation not permitted"), std::string::npos) << reasons[0];
}

// The daemon comes up on epoll, answers a request, and drains on SIGTERM.
TEST(AppBackend, HttpdFallsBackToEpollAndServesWhenIoUringIsRefused) {
    Child child;
    ASSERT_NO_FATAL_FAILURE(spawn(child,
                                  {SPINDLE_HTTPD_BIN, "--address", "127.0.0.1", "--port", "0", "--drain-timeout",
                                   "2"},
                                  childEnvironment(), {.denyIoUring = true}));
    const bool up = child.readUntil([&] { return listeningPort(child.stderrText) != 0; }, 30s);
    if (!up) {
        child.finish(5s);
        if (child.filterMissing()) { GTEST_SKIP() << child.stderrText; }
        FAIL() << "spindle-httpd did not say where it listens; stderr:\n" << child.stderrText;
    }
    const uint16_t port = listeningPort(child.stderrText);
    const std::string head = getRoot(port);
    EXPECT_TRUE(head.starts_with("HTTP/1.1 200 ")) << "response to GET /: " << head;
    ASSERT_EQ(::kill(child.pid, SIGTERM), 0) << std::strerror(errno);
    ASSERT_TRUE(child.finish(30s)) << "spindle-httpd did not exit after SIGTERM; stderr:\n" << child.stderrText;
    EXPECT_TRUE(WIFEXITED(*child.status) && WEXITSTATUS(*child.status) == 0)
        << describeStatus(*child.status) << "; stderr:\n" << child.stderrText;
    EXPECT_EQ(linesWith(child.stderrText, "listening on").size(), 1u) << child.stderrText;
    EXPECT_EQ(linesWith(child.stderrText, "backend epoll").size(), 1u) << child.stderrText;
    const auto reasons = linesWith(child.stderrText, kFallbackWords);
    ASSERT_EQ(reasons.size(), 1u) << "stderr:\n" << child.stderrText;
    EXPECT_NE(reasons[0].find("Operation not permitted"), std::string::npos) << reasons[0];
}

// --backend io_uring rules the fallback out: the daemon refuses to start and says why.
TEST(AppBackend, HttpdWithBackendIoUringFailsWhenIoUringIsRefused) {
    Child child;
    ASSERT_NO_FATAL_FAILURE(spawn(
        child, {SPINDLE_HTTPD_BIN, "--address", "127.0.0.1", "--port", "0", "--backend", "io_uring"},
        childEnvironment(), {.denyIoUring = true}));
    ASSERT_TRUE(child.finish(30s)) << "spindle-httpd did not exit; stderr:\n" << child.stderrText;
    if (child.filterMissing()) { GTEST_SKIP() << child.stderrText; }
    EXPECT_TRUE(WIFEXITED(*child.status) && WEXITSTATUS(*child.status) != 0)
        << describeStatus(*child.status) << "; stderr:\n" << child.stderrText;
    EXPECT_EQ(child.stderrText.find("listening on"), std::string::npos) << child.stderrText;
    EXPECT_TRUE(linesWith(child.stderrText, kFallbackWords).empty()) << child.stderrText;
    const auto failures = linesWith(child.stderrText, "io_uring");
    bool named = false;
    for (const std::string& line : failures) {
        named = named || line.find("Operation not permitted") != std::string::npos;
    }
    EXPECT_TRUE(named) << "no line names io_uring and EPERM; stderr:\n" << child.stderrText;
}

// Without a filter, SPINDLE_BACKEND reaches the binaries and an explicit --backend wins over it.
TEST(AppBackend, TheFlagWinsOverSpindleBackend) {
    Child child;
    ASSERT_NO_FATAL_FAILURE(spawn(child,
                                  {SPINDLE_HTTPD_BIN, "--address", "127.0.0.1", "--port", "0", "--backend", "epoll",
                                   "--drain-timeout", "2"},
                                  childEnvironment({"SPINDLE_BACKEND=io_uring"})));
    ASSERT_TRUE(child.readUntil([&] { return listeningPort(child.stderrText) != 0; }, 30s))
        << "spindle-httpd did not say where it listens; stderr:\n" << child.stderrText;
    EXPECT_EQ(linesWith(child.stderrText, "backend epoll").size(), 1u) << child.stderrText;
    EXPECT_TRUE(getRoot(listeningPort(child.stderrText)).starts_with("HTTP/1.1 200 "));
    ASSERT_EQ(::kill(child.pid, SIGTERM), 0) << std::strerror(errno);
    ASSERT_TRUE(child.finish(30s)) << "spindle-httpd did not exit after SIGTERM; stderr:\n" << child.stderrText;
    EXPECT_TRUE(WIFEXITED(*child.status) && WEXITSTATUS(*child.status) == 0)
        << describeStatus(*child.status) << "; stderr:\n" << child.stderrText;

    ScratchFile file(kFileText);
    ASSERT_FALSE(file.path().empty()) << "cannot write a file in /tmp";
    Child hello;
    ASSERT_NO_FATAL_FAILURE(
        spawn(hello, {SPINDLE_HELLO_BIN, file.path()}, childEnvironment({"SPINDLE_BACKEND=epoll"})));
    ASSERT_TRUE(hello.finish(30s)) << "spindle-hello did not exit; stderr:\n" << hello.stderrText;
    EXPECT_NE(hello.stdoutText.find(" through epoll\n"), std::string::npos) << hello.stdoutText << hello.stderrText;
    EXPECT_TRUE(hello.stderrText.empty()) << hello.stderrText;
}

}  // namespace
