// SPDX-License-Identifier: Apache-2.0
// spindle-httpd serving files to the clients people use: the real binary (SPINDLE_HTTPD_BIN) on
// 127.0.0.1, talked to by curl and wget as a user would run them (`curl -C -`, `curl -z`, curl's
// ETag cache, `wget -c`), and beside nginx on the same files where nginx is installed: for the
// requests of issue 19 both must give the same status and the same framing headers. A missing
// client skips its test. The daemon runs on the backend of the test's ctest entry.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tests/apps/child_process.h"
#include "tests/core/with_runtime.h"

namespace spindle {
namespace {

using namespace std::chrono_literals;
using testing_support::Child;
using testing_support::childEnvironment;
using testing_support::spawn;

bool executable(const char* path) { return ::access(path, X_OK) == 0; }

std::string readFile(const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void writeBytes(const std::string& p, std::string_view bytes) {
    std::ofstream f(p, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    ASSERT_TRUE(f.good()) << p;
}

/// Runs a client to its end (10 s at most); its stdout, or the test fails.
std::string run(const std::vector<std::string>& argv) {
    Child child;
    spawn(child, argv, childEnvironment());
    if (!child.finish(10s)) {
        ADD_FAILURE() << argv[0] << " did not finish; stderr:\n" << child.stderrText;
        return {};
    }
    EXPECT_TRUE(child.exitedWith(0)) << argv[0] << ": " << testing_support::describeStatus(*child.status)
                                     << "; stderr:\n" << child.stderrText;
    return child.stdoutText;
}

struct Answer {
    int status = 0;
    std::vector<std::pair<std::string, std::string>> headers;
    std::string body;
    [[nodiscard]] std::optional<std::string> header(std::string_view name) const {
        for (const auto& [n, v] : headers) {
            if (n.size() == name.size() && ::strncasecmp(n.c_str(), name.data(), n.size()) == 0) { return v; }
        }
        return std::nullopt;
    }
};

/// One request on a fresh connection that the request closes; the answer read to the end.
std::optional<Answer> exchange(uint16_t port, const std::string& request) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) { return std::nullopt; }
    timeval tv{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    std::string text;
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
        ::send(fd, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size())) {
        char buf[16384];
        for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) { text.append(buf, static_cast<size_t>(n)); }
    }
    ::close(fd);
    const size_t end = text.find("\r\n\r\n");
    if (text.size() < 12 || end == std::string::npos) { return std::nullopt; }
    Answer r;
    r.status = std::atoi(text.c_str() + 9);
    size_t at = text.find("\r\n") + 2;
    while (at < end) {
        const size_t eol = text.find("\r\n", at);
        const std::string line = text.substr(at, eol - at);
        const size_t colon = line.find(':');
        r.headers.emplace_back(line.substr(0, colon), line.substr(line.find_first_not_of(' ', colon + 1)));
        at = eol + 2;
    }
    r.body = text.substr(end + 4);
    return r;
}

/// A loopback port that was free a moment ago.
uint16_t freePort() {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
    ::close(fd);
    return ok ? ntohs(a.sin_port) : 0;
}

bool accepts(uint16_t port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(fd);
    return ok;
}

/// spindle-httpd on a scratch root with a 300 KB file, a directory and an index.
class HttpdClients : public testing::Test {
protected:
    void SetUp() override {
        scratch_.emplace();
        ASSERT_TRUE(scratch_->ok());
        root_ = scratch_->path("root");
        ASSERT_EQ(::mkdir(root_.c_str(), 0755), 0);
        ASSERT_EQ(::mkdir((root_ + "/dir").c_str(), 0755), 0);
        const std::vector<char> p = testing_support::pattern(300'017, 5);
        data_.assign(p.begin(), p.end());
        ASSERT_NO_FATAL_FAILURE(writeBytes(root_ + "/data.bin", data_));
        ASSERT_NO_FATAL_FAILURE(writeBytes(root_ + "/dir/index.html", "<p>dir</p>\n"));
        ASSERT_NO_FATAL_FAILURE(writeBytes(root_ + "/page.html", "<p>page</p>\n"));
        const char* backend = std::getenv("SPINDLE_BACKEND");
        spawn(httpd_,
              {SPINDLE_HTTPD_BIN, "--address", "127.0.0.1", "--port", "0", "--carriers", "1", "--root", root_,
               "--drain-timeout", "1", "--backend", backend != nullptr ? backend : "auto"},
              childEnvironment());
        constexpr std::string_view kWords = "listening on 127.0.0.1:";
        const bool up = httpd_.readUntil([&] { return httpd_.stderrText.find(kWords) != std::string::npos &&
                                                      httpd_.stderrText.find(" with ") != std::string::npos; },
                                         20s);
        ASSERT_TRUE(up) << "spindle-httpd did not start; stderr:\n" << httpd_.stderrText;
        port_ = static_cast<uint16_t>(std::atoi(httpd_.stderrText.c_str() + httpd_.stderrText.find(kWords) + kWords.size()));
        ASSERT_NE(port_, 0);
    }

    void TearDown() override {
        if (httpd_.pid > 0 && !httpd_.status) {
            ::kill(httpd_.pid, SIGTERM);
            EXPECT_TRUE(httpd_.finish(20s)) << httpd_.stderrText;
            EXPECT_TRUE(httpd_.exitedWith(0)) << httpd_.stderrText;
        }
    }

    std::string url(std::string_view path) const { return "http://127.0.0.1:" + std::to_string(port_) + std::string(path); }
    std::string scratch(const char* name) const { return scratch_->path(name); }

    std::optional<testing_support::ScratchDir> scratch_;
    std::string root_;
    std::string data_;
    Child httpd_;
    uint16_t port_ = 0;
};

TEST_F(HttpdClients, CurlResumesAPartialDownload) {
    if (!executable("/usr/bin/curl")) { GTEST_SKIP() << "no /usr/bin/curl (Debian package curl)"; }
    const std::string out = scratch("partial");
    ASSERT_NO_FATAL_FAILURE(writeBytes(out, std::string_view(data_).substr(0, 123'456)));
    const std::string code = run({"/usr/bin/curl", "-sS", "-C", "-", "-o", out, "-w", "%{http_code}", url("/data.bin")});
    EXPECT_EQ(code, "206");
    EXPECT_TRUE(readFile(out) == data_) << "the resumed file differs";
    // Resuming a complete file: the range starts at the end, 416, and curl leaves the file alone.
    Child again;
    spawn(again, {"/usr/bin/curl", "-sS", "-C", "-", "-o", out, "-w", "%{http_code}", url("/data.bin")}, childEnvironment());
    ASSERT_TRUE(again.finish(10s));
    EXPECT_EQ(again.stdoutText, "416");
    EXPECT_TRUE(readFile(out) == data_);
}

TEST_F(HttpdClients, CurlTimeConditionAndETagCache) {
    if (!executable("/usr/bin/curl")) { GTEST_SKIP() << "no /usr/bin/curl (Debian package curl)"; }
    const std::string copy = scratch("copy");
    // curl -z FILE: If-Modified-Since from the local file's mtime, as a mirror script uses it.
    EXPECT_EQ(run({"/usr/bin/curl", "-sS", "-R", "-o", copy, "-w", "%{http_code}", url("/data.bin")}), "200");
    EXPECT_EQ(run({"/usr/bin/curl", "-sS", "-z", copy, "-o", "/dev/null", "-w", "%{http_code}", url("/data.bin")}), "304");
    const timespec old[2] = {{1'000'000'000, 0}, {1'000'000'000, 0}};
    ASSERT_EQ(::utimensat(AT_FDCWD, copy.c_str(), old, 0), 0);
    EXPECT_EQ(run({"/usr/bin/curl", "-sS", "-z", copy, "-o", "/dev/null", "-w", "%{http_code}", url("/data.bin")}), "200");
    // A browser's cache: the ETag kept from the first answer makes the second one a 304.
    const std::string tag = scratch("etag");
    EXPECT_EQ(run({"/usr/bin/curl", "-sS", "--etag-save", tag, "-o", "/dev/null", "-w", "%{http_code}", url("/page.html")}), "200");
    EXPECT_NE(readFile(tag).find('"'), std::string::npos) << "no ETag saved";
    EXPECT_EQ(run({"/usr/bin/curl", "-sS", "--etag-compare", tag, "-o", "/dev/null", "-w", "%{http_code}", url("/page.html")}), "304");
    // A directory without its slash: curl -L follows the 301 to the index.
    EXPECT_EQ(run({"/usr/bin/curl", "-sS", "-L", url("/dir")}), "<p>dir</p>\n");
}

TEST_F(HttpdClients, WgetContinuesAPartialDownload) {
    if (!executable("/usr/bin/wget")) { GTEST_SKIP() << "no /usr/bin/wget (Debian package wget)"; }
    const std::string dir = scratch("wget");
    ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
    ASSERT_NO_FATAL_FAILURE(writeBytes(dir + "/data.bin", std::string_view(data_).substr(0, 77'777)));
    run({"/usr/bin/wget", "-q", "-c", "-P", dir, url("/data.bin")});
    EXPECT_TRUE(readFile(dir + "/data.bin") == data_) << "the continued file differs";
}

// The same requests to nginx (with its defaults: sendfile, etag, if_modified_since exact) and to
// spindle-httpd, on the same root: the same status, and the same framing and validator headers.
TEST_F(HttpdClients, AnswersAsNginxDoes) {
    if (!executable("/usr/sbin/nginx")) { GTEST_SKIP() << "no /usr/sbin/nginx (Debian package nginx-light or nginx)"; }
    const std::string prefix = scratch("nginx");
    ASSERT_EQ(::mkdir(prefix.c_str(), 0755), 0);
    const uint16_t nginxPort = freePort();
    ASSERT_NE(nginxPort, 0);
    {
        std::ofstream conf(prefix + "/nginx.conf");
        conf << "daemon off; master_process off; worker_processes 1; error_log stderr warn; pid nginx.pid;\n"
                "events { worker_connections 64; }\n"
                "http { access_log off; types { text/html html; } default_type application/octet-stream;\n"
                "  client_body_temp_path body; proxy_temp_path proxy; fastcgi_temp_path fcgi;\n"
                "  uwsgi_temp_path uwsgi; scgi_temp_path scgi;\n"
                "  server { listen 127.0.0.1:"
             << nginxPort << "; root " << root_ << "; } }\n";
    }
    Child nginx;
    spawn(nginx, {"/usr/sbin/nginx", "-p", prefix, "-c", prefix + "/nginx.conf", "-e", "stderr"}, childEnvironment());
    const auto until = std::chrono::steady_clock::now() + 5s;
    while (!accepts(nginxPort)) {
        if (std::chrono::steady_clock::now() > until) {
            // An nginx that cannot run here (no permission for its prefix, a port taken) is no verdict on ours.
            if (nginx.finish(1s)) { GTEST_SKIP() << "nginx did not start: " << nginx.stderrText; }
            FAIL() << "nginx does not accept; stderr:\n" << nginx.stderrText;
        }
        (void)nginx.readUntil([] { return false; }, 10ms);  // a pause that also drains its stderr
    }
    const auto plain = exchange(nginxPort, "GET /data.bin HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    ASSERT_TRUE(plain);
    const std::string etag = plain->header("ETag").value_or("?");
    const std::string modified = plain->header("Last-Modified").value_or("?");
    struct Case {
        std::string method, target, headers;
    };
    const std::vector<Case> cases = {
        {"GET", "/data.bin", ""},
        {"HEAD", "/data.bin", ""},
        {"GET", "/data.bin", "Range: bytes=0-99\r\n"},
        {"GET", "/data.bin", "Range: bytes=300000-\r\n"},
        {"GET", "/data.bin", "Range: bytes=-17\r\n"},
        {"GET", "/data.bin", "Range: bytes=299990-400000\r\n"},
        {"GET", "/data.bin", "Range: bytes=300017-\r\n"},
        {"HEAD", "/data.bin", "Range: bytes=5-9\r\n"},
        {"GET", "/data.bin", "If-None-Match: " + etag + "\r\n"},
        {"GET", "/data.bin", "If-None-Match: \"other\"\r\n"},
        {"GET", "/data.bin", "If-Modified-Since: " + modified + "\r\n"},
        {"GET", "/data.bin", "If-Match: \"other\"\r\n"},
        {"GET", "/data.bin", "Range: bytes=10-19\r\nIf-Range: " + etag + "\r\n"},
        {"GET", "/data.bin", "Range: bytes=10-19\r\nIf-Range: \"other\"\r\n"},
        {"GET", "/data.bin", "Range: bytes=10-19\r\nIf-Range: " + modified + "\r\n"},
        {"GET", "/dir", ""},
        {"GET", "/dir?q=1", ""},
        {"GET", "/dir/", ""},
        {"GET", "/page.html", ""},
        {"GET", "/missing", ""},
    };
    for (const Case& k : cases) {
        const std::string request = k.method + " " + k.target + " HTTP/1.1\r\nHost: t\r\nConnection: close\r\n" + k.headers + "\r\n";
        const auto theirs = exchange(nginxPort, request);
        const auto ours = exchange(port_, request);
        const std::string what = k.method + " " + k.target + " " + k.headers;
        ASSERT_TRUE(theirs) << what;
        ASSERT_TRUE(ours) << what;
        EXPECT_EQ(ours->status, theirs->status) << what;
        for (const char* h : {"Content-Range", "ETag", "Last-Modified"}) {
            EXPECT_EQ(ours->header(h), theirs->header(h)) << h << " for " << what;
        }
        if (theirs->status != 301 && theirs->status < 400) {  // error pages' bodies differ by design
            EXPECT_EQ(ours->header("Content-Length"), theirs->header("Content-Length")) << what;
            EXPECT_TRUE(ours->body == theirs->body) << what;
            if (k.target == "/page.html" || k.target == "/data.bin") {
                EXPECT_EQ(ours->header("Content-Type").value_or("").substr(0, theirs->header("Content-Type").value_or("").size()),
                          theirs->header("Content-Type").value_or("")) << what;
            }
        }
        if (theirs->status == 301) {  // nginx's Location is absolute, ours a path
            const std::string location = theirs->header("Location").value_or("");
            EXPECT_TRUE(location.ends_with(ours->header("Location").value_or("?"))) << location << " for " << what;
        }
    }
    ::kill(nginx.pid, SIGTERM);
    EXPECT_TRUE(nginx.finish(5s));
}

}  // namespace
}  // namespace spindle
