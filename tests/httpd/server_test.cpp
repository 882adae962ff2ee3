// SPDX-License-Identifier: Apache-2.0
// Conformance tests of spindle-httpd's server (apps/httpd/server.h): the server runs in-process on a
// runtime of two carriers, listening on 127.0.0.1 port 0; the client end is plain blocking sockets on
// the test thread. Timeouts are generous (sanitizer builds are slow); no test passes or fails on timing
// except through them.
#include <arpa/inet.h>
#include <fcntl.h>
#include <malloc.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "core/internal/stack_pool.h"
#include "apps/httpd/file_response.h"
#include "apps/httpd/server.h"
#include "base/inject.h"
#include "tests/core/with_runtime.h"

namespace spindle::httpd {
namespace {

using namespace std::chrono_literals;
using testing_support::WithScratchDir;

constexpr auto kIoTimeout = 30s;  // any single client wait; only a hung server reaches it

struct Response {
    std::string statusLine;
    std::vector<std::pair<std::string, std::string>> headers;
    std::string body;
    [[nodiscard]] int status() const { return statusLine.size() >= 12 ? std::stoi(statusLine.substr(9, 3)) : 0; }
    [[nodiscard]] std::optional<std::string> header(std::string_view name) const {
        for (const auto& [n, v] : headers) {
            if (equalsIgnoreCase(n, name)) { return v; }
        }
        return std::nullopt;
    }
};

/// A blocking TCP client with a receive buffer that keeps pipelined responses apart.
class Client {
public:
    /// `receiveBuffer`: SO_RCVBUF before the connect (0: the kernel's), for a client that keeps the
    /// server's window small.
    explicit Client(uint16_t port, int receiveBuffer = 0) {
        fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        EXPECT_GE(fd_, 0);
        if (receiveBuffer > 0) { ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &receiveBuffer, sizeof receiveBuffer); }
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(port);
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        EXPECT_EQ(::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << std::strerror(errno);
        const int one = 1;
        ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    ~Client() {
        if (fd_ >= 0) { ::close(fd_); }
    }
    Client(const Client&) = delete;
    Client& operator=(const Client&) = delete;

    [[nodiscard]] int fd() const { return fd_; }

    /// The MSS the kernel advertises for this connection (TCP_MAXSEG).
    int mss() const {
        int v = 0;
        socklen_t len = sizeof v;
        return ::getsockopt(fd_, IPPROTO_TCP, TCP_MAXSEG, &v, &len) == 0 ? v : 0;
    }

    /// SO_LINGER with a zero timeout: the destructor's close sends RST.
    bool setResetOnClose() {
        const linger l{.l_onoff = 1, .l_linger = 0};
        return ::setsockopt(fd_, SOL_SOCKET, SO_LINGER, &l, sizeof l) == 0;
    }

    bool send(std::string_view s) {
        while (!s.empty()) {
            const ssize_t n = ::send(fd_, s.data(), s.size(), MSG_NOSIGNAL);
            if (n <= 0) { return false; }
            s.remove_prefix(static_cast<size_t>(n));
        }
        return true;
    }

    /// Receives once into the buffer; false at end of stream, on an error or after kIoTimeout.
    bool receiveMore(std::chrono::milliseconds timeout = kIoTimeout) {
        pollfd p{fd_, POLLIN, 0};
        if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) { return false; }
        char chunk[16384];
        const ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
        if (n <= 0) { return false; }
        buf_.append(chunk, static_cast<size_t>(n));
        return true;
    }

    /// The next response (a HEAD's has no body); nullopt when the stream ended first.
    std::optional<Response> next(bool head = false) {
        size_t end;
        while ((end = buf_.find("\r\n\r\n")) == std::string::npos) {
            if (!receiveMore()) { return std::nullopt; }
        }
        Response r;
        std::string_view h(buf_.data(), end);
        const size_t firstLf = h.find("\r\n");
        r.statusLine = std::string(h.substr(0, firstLf));
        h.remove_prefix(firstLf == std::string_view::npos ? h.size() : firstLf + 2);
        while (!h.empty()) {
            const size_t lf = h.find("\r\n");
            const std::string_view line = h.substr(0, lf);
            const size_t colon = line.find(':');
            r.headers.emplace_back(std::string(line.substr(0, colon)), std::string(line.substr(colon + 2)));
            h.remove_prefix(lf == std::string_view::npos ? h.size() : lf + 2);
        }
        buf_.erase(0, end + 4);
        const size_t length = head ? 0 : std::stoul(r.header("Content-Length").value_or("0"));
        while (buf_.size() < length) {
            if (!receiveMore()) { return std::nullopt; }
        }
        r.body = buf_.substr(0, length);
        buf_.erase(0, length);
        return r;
    }

    /// Whether the server closes the connection (end of stream or reset) within kIoTimeout; bytes
    /// that arrive before the end are kept in the buffer.
    bool closedByPeer() {
        for (;;) {
            pollfd p{fd_, POLLIN, 0};
            if (::poll(&p, 1, static_cast<int>(std::chrono::milliseconds(kIoTimeout).count())) <= 0) { return false; }
            char chunk[4096];
            const ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
            if (n <= 0) { return true; }
            buf_.append(chunk, static_cast<size_t>(n));
        }
    }

    [[nodiscard]] const std::string& buffered() const { return buf_; }

private:
    int fd_ = -1;
    std::string buf_;
};

std::string get(std::string_view path, std::string_view extra = "") {
    return "GET " + std::string(path) + " HTTP/1.1\r\nHost: test\r\n" + std::string(extra) + "\r\n";
}

// Polls (for at most kIoTimeout) until pred() holds.
template <class Pred>
bool eventually(Pred pred) {
    const auto until = std::chrono::steady_clock::now() + kIoTimeout;
    while (!pred()) {
        if (std::chrono::steady_clock::now() > until) { return false; }
        std::this_thread::sleep_for(2ms);
    }
    return true;
}

class HttpServer : public WithScratchDir {
protected:
    void TearDown() override {
        server_.reset();  // stops and drains before the fixture counts fibers
        WithScratchDir::TearDown();
    }

    ServerOptions defaults() const {
        ServerOptions o;
        o.address = net::SocketAddress::ipv4Loopback(0);
        return o;
    }

    void startServer(const ServerOptions& o) {
        auto s = Server::start(rt(), o);
        ASSERT_TRUE(s) << s.error().message();
        server_ = std::move(*s);
        port_ = server_->localAddress().port();
        ASSERT_NE(port_, 0);
    }

    void writeFile(const char* name, std::string_view bytes) {
        std::ofstream f(path(name), std::ios::binary);
        f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
        ASSERT_TRUE(f.good());
    }

    /// Waits until `n` idle connections have given their fiber up to the sweep (fiberless).
    bool becameFiberless(uint64_t n) {
        return eventually([&] { return server_->stats().fiberless == n; });
    }

    std::unique_ptr<Server> server_;
    uint16_t port_ = 0;
};

TEST_F(HttpServer, HelloOverKeepAlive) {
    startServer(defaults());
    Client c(port_);
    for (const char* target : {"/", "/hello", "/"}) {
        ASSERT_TRUE(c.send(get(target)));
        auto r = c.next();
        ASSERT_TRUE(r);
        EXPECT_EQ(r->statusLine, "HTTP/1.1 200 OK");
        EXPECT_EQ(r->body, "Hello, World!");
        EXPECT_EQ(r->header("Content-Length"), "13");
        EXPECT_EQ(r->header("Content-Type"), "text/plain; charset=utf-8");
        EXPECT_TRUE(r->header("Date"));
        EXPECT_FALSE(r->header("Connection"));
    }
    EXPECT_EQ(server_->stats().requests, 3u);
}

// 200 pipelined requests of three kinds, whose answers fill the server's batch buffer several times.
void expectPipelinedAnswersInOrder(uint16_t port) {
    Client c(port);
    std::string batch;
    // Enough requests that their answers fill the server's batch buffer several times over.
    constexpr int kRequests = 200;
    for (int i = 0; i < kRequests; ++i) {
        batch += i % 3 == 0 ? get("/hello") : i % 3 == 1 ? get("/missing") : "HEAD /hello HTTP/1.1\r\nHost: t\r\n\r\n";
    }
    ASSERT_TRUE(c.send(batch));
    for (int i = 0; i < kRequests; ++i) {
        auto r = c.next(/*head=*/i % 3 == 2);
        ASSERT_TRUE(r) << i;
        if (i % 3 == 0) {
            EXPECT_EQ(r->status(), 200);
            EXPECT_EQ(r->body, "Hello, World!");
        } else if (i % 3 == 1) {
            EXPECT_EQ(r->status(), 404);
        } else {
            EXPECT_EQ(r->status(), 200);
            EXPECT_EQ(r->header("Content-Length"), "13");
            EXPECT_EQ(r->body, "");
        }
    }
    EXPECT_EQ(c.buffered(), "");  // no body after the HEAD answers
}

TEST_F(HttpServer, PipelinedRequestsAnsweredInOrder) {
    startServer(defaults());
    expectPipelinedAnswersInOrder(port_);
}

TEST_F(HttpServer, PipelinedRequestsAnsweredInOrderWithEverySendWaitedFor) {
    ServerOptions o = defaults();
    o.postedSend = false;
    startServer(o);
    expectPipelinedAnswersInOrder(port_);
}

// A client that keeps sending requests and never reads the answers: once its window is full, the
// server's next send waits sendTimeout (a posted send: the next response waits for it) and the
// connection is closed, on both send paths.
class SendTimeout : public HttpServer, public testing::WithParamInterface<bool> {};

TEST_P(SendTimeout, AClientThatNeverReadsIsClosedAfterTheSendTimeout) {
    // 48 KiB answers (copied, not spliced): a batch of them is more than the socket buffers can take,
    // so the server's send blocks whatever the kernel's autotuning did. (With small answers the kernel
    // may take them all and the connection then waits for a request, which idleTimeout ends instead.)
    writeFile("big.bin", std::string(48 * 1024, 'b'));
    ServerOptions o = defaults();
    o.root = dir_;
    o.postedSend = GetParam();
    o.sendTimeout = 300ms;
    startServer(o);
    Client c(port_, /*receiveBuffer=*/4096);
    std::string batch;
    for (int i = 0; i < 64; ++i) { batch += get("/big.bin"); }
    const auto t0 = std::chrono::steady_clock::now();
    const auto giveUp = t0 + 20s;
    bool closed = false;
    int err = 0;
    size_t sent = 0;
    while (!closed && std::chrono::steady_clock::now() < giveUp) {
        const ssize_t n = ::send(c.fd(), batch.data(), batch.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n < 0 && errno != EAGAIN) {  // reset by the server
            err = errno;
            break;
        }
        if (n > 0) { sent += static_cast<size_t>(n); }
        closed = server_->stats().active == 0 && server_->stats().accepted == 1;
        std::this_thread::sleep_for(n < 0 ? 5ms : 0ms);
    }
    ASSERT_TRUE(eventually([&] { return server_->stats().active == 0; }))
        << "the connection was never closed; requests " << server_->stats().requests << ", fiberless "
        << server_->stats().fiberless << ", client sent " << sent << ", its error " << std::strerror(err) << " after "
        << std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count() << " ms\n"
        << formatFiberListing(rt().fibers(true));
    EXPECT_GE(std::chrono::steady_clock::now() - t0, 300ms);
    EXPECT_GT(server_->stats().requests, 0u);
}

INSTANTIATE_TEST_SUITE_P(BothSendPaths, SendTimeout, testing::Values(true, false),
                         [](const testing::TestParamInfo<bool>& i) { return i.param ? "Posted" : "Waited"; });

TEST_F(HttpServer, HeadHasNoBody) {
    startServer(defaults());
    Client c(port_);
    ASSERT_TRUE(c.send("HEAD /hello HTTP/1.1\r\nHost: t\r\n\r\n" + get("/hello")));
    auto head = c.next(true);
    ASSERT_TRUE(head);
    EXPECT_EQ(head->status(), 200);
    EXPECT_EQ(head->header("Content-Length"), "13");
    auto r = c.next();  // the GET's answer follows at once: the HEAD's carried no body
    ASSERT_TRUE(r);
    EXPECT_EQ(r->statusLine, "HTTP/1.1 200 OK");
    EXPECT_EQ(r->body, "Hello, World!");
}

TEST_F(HttpServer, ChunkedBodiesAreReadAndDropped) {
    startServer(defaults());
    Client c(port_);
    // A GET with a chunked body, sent in two pieces, and a request pipelined after it.
    ASSERT_TRUE(c.send("GET /hello HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel"));
    auto r = c.next();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status(), 200);
    EXPECT_EQ(r->body, "Hello, World!");
    ASSERT_TRUE(c.send("lo\r\n0\r\nX-Trailer: 1\r\n\r\n" + get("/hello")));
    r = c.next();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status(), 200) << "the body was skipped";
    ASSERT_TRUE(c.send("POST /hello HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n" + get("/hello")));
    r = c.next();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status(), 405);
    r = c.next();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status(), 200);
    EXPECT_FALSE(r->header("Connection"));
}

TEST_F(HttpServer, MalformedOrOversizedChunkedBodiesCloseTheConnection) {
    ServerOptions o = defaults();
    o.limits.maxBodyBytes = 10;
    startServer(o);
    for (const char* body : {"zz\r\n", "b\r\nhello world\r\n0\r\n\r\n"}) {
        Client c(port_);
        ASSERT_TRUE(c.send(std::string("GET /hello HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n") + body));
        auto r = c.next();
        ASSERT_TRUE(r) << body;
        EXPECT_EQ(r->status(), 200) << "the request was answered before its body was read";
        EXPECT_TRUE(c.closedByPeer()) << body;
    }
    EXPECT_TRUE(eventually([&] { return server_->stats().errors == 2; }));
}

TEST_F(HttpServer, MalformedRequestLineIs400) {
    startServer(defaults());
    Client c(port_);
    ASSERT_TRUE(c.send("GET /hello HTTP/1.1 extra\r\nHost: t\r\n\r\n"));
    auto r = c.next();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status(), 400);
    EXPECT_EQ(r->header("Connection"), "close");
    EXPECT_TRUE(c.closedByPeer());
    EXPECT_GE(server_->stats().errors, 1u);
}

TEST_F(HttpServer, OversizedHeadersAre431) {
    startServer(defaults());
    Client c(port_);
    ASSERT_TRUE(c.send(get("/hello", "X-Big: " + std::string(9000, 'x') + "\r\n")));
    auto r = c.next();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status(), 431);
    EXPECT_TRUE(c.closedByPeer());

    Client many(port_);
    std::string fields;
    for (int i = 0; i < 101; ++i) { fields += "X-" + std::to_string(i) + ": v\r\n"; }
    ASSERT_TRUE(many.send(get("/hello", fields)));
    auto m = many.next();
    ASSERT_TRUE(m);
    EXPECT_EQ(m->status(), 431);
}

TEST_F(HttpServer, BodyTooLargeIs413) {
    ServerOptions o = defaults();
    o.limits.maxBodyBytes = 1000;
    startServer(o);
    Client c(port_);
    ASSERT_TRUE(c.send("POST /hello HTTP/1.1\r\nHost: t\r\nContent-Length: 1001\r\n\r\n" + std::string(1001, 'b')));
    auto r = c.next();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status(), 413);
    EXPECT_TRUE(c.closedByPeer());
}

TEST_F(HttpServer, OtherMethodsGet405WithAllowAndTheBodyIsSkipped) {
    startServer(defaults());
    Client c(port_);
    // The body arrives in two parts, so that the server has to read past what it buffered.
    ASSERT_TRUE(c.send("POST /hello HTTP/1.1\r\nHost: t\r\nContent-Length: 20000\r\n\r\n" + std::string(5000, 'p')));
    auto r = c.next();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status(), 405);
    EXPECT_EQ(r->header("Allow"), "GET, HEAD");
    ASSERT_TRUE(c.send(std::string(15000, 'q') + get("/hello")));
    auto after = c.next();
    ASSERT_TRUE(after);
    EXPECT_EQ(after->status(), 200);
    EXPECT_EQ(after->body, "Hello, World!");

    ASSERT_TRUE(c.send("BREW /pot HTTP/1.1\r\nHost: t\r\n\r\n"));
    auto brew = c.next();
    ASSERT_TRUE(brew);
    EXPECT_EQ(brew->status(), 501);
}

TEST_F(HttpServer, MissingIs404) {
    startServer(defaults());
    Client c(port_);
    ASSERT_TRUE(c.send(get("/nothing/here")));
    auto r = c.next();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status(), 404);
    EXPECT_FALSE(r->header("Connection"));  // a 404 keeps the connection
}

TEST_F(HttpServer, StaticFilesExactBytesAndTypes) {
    const std::vector<char> big = testing_support::pattern(300 * 1024 + 17, 7);
    writeFile("index.html", "<h1>home</h1>\n");
    writeFile("style.css", "body{}\n");
    writeFile("big.bin", std::string_view(big.data(), big.size()));
    ASSERT_EQ(::mkdir(path("sub").c_str(), 0755), 0);
    writeFile("sub/index.html", "sub index");
    writeFile("sub/a b.txt", "spaced");
    ServerOptions o = defaults();
    o.root = dir_;
    startServer(o);
    Client c(port_);
    struct Case {
        const char* target;
        int status;
        std::string body;
        const char* type;
    };
    const std::vector<Case> cases = {
        {"/", 200, "<h1>home</h1>\n", "text/html; charset=utf-8"},
        {"/index.html", 200, "<h1>home</h1>\n", "text/html; charset=utf-8"},
        {"/style.css", 200, "body{}\n", "text/css; charset=utf-8"},
        {"/sub/", 200, "sub index", "text/html; charset=utf-8"},
        {"/sub/a%20b.txt", 200, "spaced", "text/plain; charset=utf-8"},
        {"/big.bin", 200, std::string(big.data(), big.size()), "application/octet-stream"},
        {"/hello", 200, "Hello, World!", "text/plain; charset=utf-8"},
        {"/nope.html", 404, "Not Found\n", nullptr},
        {"/sub", 301, "Moved Permanently\n", nullptr},  // a directory without the slash
        {"/../etc/passwd", 400, "Bad Request\n", nullptr},
        {"/sub/%2e%2e/%2e%2e/etc/passwd", 400, "Bad Request\n", nullptr},
    };
    for (const Case& k : cases) {
        ASSERT_TRUE(c.send(get(k.target)));
        auto r = c.next();
        ASSERT_TRUE(r) << k.target;
        EXPECT_EQ(r->status(), k.status) << k.target;
        EXPECT_TRUE(r->body == k.body) << k.target << ": " << r->body.size() << " bytes";
        if (k.type != nullptr) { EXPECT_EQ(r->header("Content-Type"), k.type) << k.target; }
    }
    ASSERT_TRUE(c.send("HEAD /big.bin HTTP/1.1\r\nHost: t\r\n\r\n" + get("/style.css")));
    auto head = c.next(true);
    ASSERT_TRUE(head);
    EXPECT_EQ(head->header("Content-Length"), std::to_string(big.size()));
    auto css = c.next();
    ASSERT_TRUE(css);
    EXPECT_EQ(css->body, "body{}\n");
}

/// The HTTP-date of `t`, as the server writes Last-Modified.
std::string dateOf(int64_t t) {
    std::array<char, kHttpDateLength> text{};
    formatHttpDate(t, text.data());
    return {text.data(), text.size()};
}

/// A file's bytes and a fixed mtime, so that the validators are known in advance.
class StaticFiles : public HttpServer {
protected:
    static constexpr int64_t kMtime = 1'700'000'000;  // Tue, 14 Nov 2023 22:13:20 GMT

    void SetUp() override {
        HttpServer::SetUp();
        if (HasFatalFailure() || IsSkipped()) { return; }
        data_ = testing_support::pattern(100'000, 3);
        ASSERT_NO_FATAL_FAILURE(writeFile("data.bin", std::string_view(data_.data(), data_.size())));
        const timespec times[2] = {{kMtime, 0}, {kMtime, 0}};
        ASSERT_EQ(::utimensat(AT_FDCWD, path("data.bin").c_str(), times, 0), 0) << std::strerror(errno);
        ASSERT_EQ(::mkdir(path("dir").c_str(), 0755), 0);
        ASSERT_NO_FATAL_FAILURE(writeFile("dir/index.html", "dir index"));
        ASSERT_EQ(::mkdir(path("empty").c_str(), 0755), 0);
    }

    void start() {
        ServerOptions o = defaults();
        o.root = dir_;
        startServer(o);
    }

    std::string bytes(size_t from, size_t n) const { return std::string(data_.data() + from, n); }

    std::optional<Response> ask(Client& c, std::string_view target, std::string_view extra, bool head = false) {
        const std::string method = head ? "HEAD " : "GET ";
        if (!c.send(method + std::string(target) + " HTTP/1.1\r\nHost: t\r\n" + std::string(extra) + "\r\n")) { return std::nullopt; }
        return c.next(head);
    }

    std::vector<char> data_;
    const std::string etag_ = "\"6553f100-186a0\"";  // nginx's: mtime and size in hex
};

TEST_F(StaticFiles, ValidatorsOnEveryFileResponse) {
    start();
    Client c(port_);
    auto r = ask(c, "/data.bin", "");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status(), 200);
    EXPECT_EQ(r->header("Last-Modified"), dateOf(kMtime));
    EXPECT_EQ(r->header("Last-Modified"), "Tue, 14 Nov 2023 22:13:20 GMT");
    EXPECT_EQ(r->header("ETag"), etag_);
    EXPECT_EQ(r->header("Accept-Ranges"), "bytes");
    EXPECT_EQ(r->header("Content-Length"), "100000");
    EXPECT_TRUE(r->body == bytes(0, 100'000));
    // HEAD: the same head, no body; the connection goes on with the next answer in place.
    r = ask(c, "/data.bin", "", /*head=*/true);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status(), 200);
    EXPECT_EQ(r->header("Content-Length"), "100000");
    EXPECT_EQ(r->header("ETag"), etag_);
    r = ask(c, "/dir/", "");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->body, "dir index");
}

TEST_F(StaticFiles, SingleRangesArePartialContent) {
    start();
    Client c(port_);
    struct Case {
        const char* range;
        size_t first, length;
    };
    for (const Case& k : {Case{"bytes=0-0", 0, 1}, Case{"bytes=100-199", 100, 100}, Case{"bytes=99990-", 99'990, 10},
                          Case{"bytes=-7", 99'993, 7}, Case{"bytes=99000-200000", 99'000, 1000},
                          Case{"bytes=-200000", 0, 100'000}}) {
        auto r = ask(c, "/data.bin", std::string("Range: ") + k.range + "\r\n");
        ASSERT_TRUE(r) << k.range;
        EXPECT_EQ(r->status(), 206) << k.range;
        EXPECT_EQ(r->header("Content-Range"), "bytes " + std::to_string(k.first) + "-" +
                                                  std::to_string(k.first + k.length - 1) + "/100000") << k.range;
        EXPECT_EQ(r->header("Content-Length"), std::to_string(k.length)) << k.range;
        EXPECT_TRUE(r->body == bytes(k.first, k.length)) << k.range;
    }
    auto r = ask(c, "/data.bin", "Range: bytes=10-19\r\n", /*head=*/true);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status(), 206);
    EXPECT_EQ(r->header("Content-Length"), "10");
    EXPECT_EQ(r->header("Content-Range"), "bytes 10-19/100000");
}

TEST_F(StaticFiles, UnsatisfiableMultipleAndInvalidRanges) {
    start();
    Client c(port_);
    auto r = ask(c, "/data.bin", "Range: bytes=100000-\r\n");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status(), 416);
    EXPECT_EQ(r->header("Content-Range"), "bytes */100000");
    EXPECT_FALSE(r->header("Connection")) << "a 416 keeps the connection";
    for (const char* range : {"bytes=0-1,5-9", "bytes=9-5", "lines=1-2", "bytes=x"}) {
        r = ask(c, "/data.bin", std::string("Range: ") + range + "\r\n");
        ASSERT_TRUE(r) << range;
        EXPECT_EQ(r->status(), 200) << range;
        EXPECT_FALSE(r->header("Content-Range")) << range;
        EXPECT_EQ(r->body.size(), 100'000u) << range;
    }
}

// Bodies past spliceMinBytes go file → pipe → socket; shorter ones, or all with 0, through the buffer.
// The bytes must be the same either way, whole or in ranges, and a pipelined request after a spliced
// body must still be answered in order.
TEST_F(StaticFiles, SplicedAndCopiedBodiesAreTheSame) {
    const std::vector<char> big = testing_support::pattern(3 * 1024 * 1024 + 11, 9);
    ASSERT_NO_FATAL_FAILURE(writeFile("big.bin", std::string_view(big.data(), big.size())));
    for (const uint64_t minBytes : {uint64_t{1}, uint64_t{0}}) {
        server_.reset();
        ServerOptions o = defaults();
        o.root = dir_;
        o.spliceMinBytes = minBytes;
        startServer(o);
        Client c(port_);
        ASSERT_TRUE(c.send(get("/big.bin") + get("/big.bin", "Range: bytes=1000000-2999999\r\n") + get("/dir/")));
        auto whole = c.next();
        ASSERT_TRUE(whole);
        EXPECT_EQ(whole->status(), 200);
        EXPECT_TRUE(whole->body == std::string(big.data(), big.size())) << "spliceMinBytes " << minBytes;
        auto part = c.next();
        ASSERT_TRUE(part);
        EXPECT_EQ(part->status(), 206);
        EXPECT_TRUE(part->body == std::string(big.data() + 1'000'000, 2'000'000)) << "spliceMinBytes " << minBytes;
        auto after = c.next();
        ASSERT_TRUE(after);
        EXPECT_EQ(after->body, "dir index");
    }
}

constexpr int kSplicePipeBytes = 1 << 20;  // the server grows its splice pipes to this

/// The splice pipes this process has open now (those of kSplicePipeBytes: a pipe the runtime or a
/// library makes, libunwind's for the stall detector's backtraces say, keeps the default), the
/// inode of each ("pipe:[INODE]"), once per end. Not while a spliced body waits for its client to
/// read: F_GETPIPE_SZ takes the pipe's lock, which io_uring's splice into a full socket holds while it
/// waits (in an io-wq worker), so the test thread would wait for the client it is.
std::vector<std::string> openPipeEnds() {
    std::vector<std::string> ends;
    for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
        std::error_code ec;
        const std::string target = std::filesystem::read_symlink(entry.path(), ec).string();
        if (ec || !target.starts_with("pipe:")) { continue; }
        const int fd = std::atoi(entry.path().filename().c_str());
        if (::fcntl(fd, F_GETPIPE_SZ) == kSplicePipeBytes) { ends.push_back(target); }
    }
    std::sort(ends.begin(), ends.end());
    return ends;
}

/// The pipe ends in `now` that `before` did not have.
std::vector<std::string> newPipeEnds(const std::vector<std::string>& before, const std::vector<std::string>& now) {
    std::vector<std::string> added;
    std::set_difference(now.begin(), now.end(), before.begin(), before.end(), std::back_inserter(added));
    return added;
}

/// Issue 19: spliced bodies go through a pipe lent for the body by the carrier's pool (kept empty, at
/// most kPoolCap per carrier); a pipe that cannot be made means a copied body. The pool tests run on a
/// runtime of one carrier, so that every connection borrows from the same pool.
class SplicedFiles : public StaticFiles {
protected:
    void SetUp() override {
        StaticFiles::SetUp();
        if (HasFatalFailure() || IsSkipped()) { return; }
        int probe[2];
        ASSERT_EQ(::pipe2(probe, O_CLOEXEC), 0);
        const int grown = ::fcntl(probe[1], F_SETPIPE_SZ, kSplicePipeBytes);
        ::close(probe[0]);
        ::close(probe[1]);
        if (grown != kSplicePipeBytes) { GTEST_SKIP() << "a pipe cannot grow to 1 MiB here (fs.pipe-max-size)"; }
        medium_ = testing_support::pattern(300 * 1024, 5);
        large_ = testing_support::pattern(2 * 1024 * 1024, 7);
        ASSERT_NO_FATAL_FAILURE(writeFile("medium.bin", std::string_view(medium_.data(), medium_.size())));
        ASSERT_NO_FATAL_FAILURE(writeFile("large.bin", std::string_view(large_.data(), large_.size())));
    }

    /// `carriers`: the runtime is started anew with that many when it is not 2 (the fixture's).
    void start(std::chrono::milliseconds idleFiberRelease, unsigned carriers = 2) {
        if (carriers != 2) {
            server_.reset();
            runtime_.reset();
            auto r = Runtime::start(testing_support::withCarriers(carriers));
            ASSERT_TRUE(r) << "Runtime::start: " << r.error().message();
            runtime_.emplace(std::move(*r));
        }
        ServerOptions o = defaults();
        o.root = dir_;
        o.idleFiberRelease = idleFiberRelease;
        startServer(o);
    }

    /// One request for `target` (with a Range when `range` is not empty) whose body must be
    /// `file`'s bytes [first, first + length), with 206 for a range and 200 otherwise.
    void expectBody(Client& c, std::string_view target, std::string_view range, const std::vector<char>& file,
                    size_t first, size_t length) {
        auto r = ask(c, target, range.empty() ? std::string() : "Range: " + std::string(range) + "\r\n");
        ASSERT_TRUE(r) << target << " " << range;
        EXPECT_EQ(r->status(), range.empty() ? 200 : 206) << target << " " << range;
        ASSERT_EQ(r->body.size(), length) << target << " " << range;
        EXPECT_TRUE(r->body == std::string(file.data() + first, length)) << target << " " << range << ": bytes differ";
    }

    /// The requests of the keep-alive tests: whole files and ranges of both, spliced (64 KiB or more)
    /// and copied (the short ranges), back to back.
    void fetchMixed(Client& c, const std::function<void()>& afterEach = [] {}) {
        struct Case {
            const char* target;
            const char* range;
            const std::vector<char>* file;
            size_t first, length;
        };
        const size_t m = medium_.size(), l = large_.size();
        for (const Case& k : {Case{"/medium.bin", "", &medium_, 0, m}, Case{"/large.bin", "", &large_, 0, l},
                              Case{"/large.bin", "bytes=1000-1500999", &large_, 1000, 1'500'000},
                              Case{"/medium.bin", "bytes=-100000", &medium_, m - 100'000, 100'000},
                              Case{"/large.bin", "bytes=10-19", &large_, 10, 10},  // copied, between spliced ones
                              Case{"/large.bin", "", &large_, 0, l},
                              Case{"/medium.bin", "bytes=200000-", &medium_, 200'000, m - 200'000},
                              Case{"/medium.bin", "", &medium_, 0, m}}) {
            ASSERT_NO_FATAL_FAILURE(expectBody(c, k.target, k.range, *k.file, k.first, k.length));
            afterEach();
        }
    }

    std::vector<char> medium_;
    std::vector<char> large_;
};

// The server's kPipePoolCap: pipes a carrier keeps between bodies.
constexpr size_t kPoolCap = 8;

/// Waits until no body is being spliced (its pipe is back in the pool or closed): a client has its
/// last byte a moment before the server's fiber sees the splice end.
bool noPipeLent(const Server& s) {
    return eventually([&] { return s.stats().splicePipesLent == 0; });
}

// Before, every connection made a pipe on its first spliced body and kept it until it ended or parked:
// two descriptors and 1 MiB of pipe buffer per keep-alive connection. Now the carrier's one pipe serves
// every response, on every connection, and connections that stay open idle hold none.
TEST_F(SplicedFiles, OnePooledPipeServesSuccessiveResponsesAcrossConnections) {
    ASSERT_NO_FATAL_FAILURE(start(/*idleFiberRelease=*/0ms, /*carriers=*/1));  // idle connections keep their fibers
    const std::vector<std::string> before = openPipeEnds();
    std::vector<std::string> seen;
    auto onePipe = [&](const char* when) {
        ASSERT_TRUE(noPipeLent(*server_)) << when;
        const std::vector<std::string> added = newPipeEnds(before, openPipeEnds());
        EXPECT_EQ(added.size(), 2u) << when << ": one pipe (two ends) open between responses";
        if (seen.empty()) { seen = added; }
        EXPECT_EQ(added, seen) << when << ": the same pipe for every response";
        EXPECT_EQ(server_->stats().splicePipes, 1u) << when;
    };
    std::vector<std::unique_ptr<Client>> clients;
    for (int i = 0; i < 4; ++i) {
        clients.push_back(std::make_unique<Client>(port_));
        ASSERT_NO_FATAL_FAILURE(fetchMixed(*clients.back(), [&] { onePipe("mixed"); })) << "connection " << i;
    }
    EXPECT_EQ(server_->stats().active, 4u) << "every connection stays open, idle, and holds no pipe";
    // Back on the first connection, then the others in turn: still the one pipe.
    for (auto& c : clients) {
        ASSERT_NO_FATAL_FAILURE(expectBody(*c, "/large.bin", "bytes=-70000", large_, large_.size() - 70'000, 70'000));
        onePipe("again");
    }
    clients.clear();
    EXPECT_TRUE(eventually([&] { return server_->stats().active == 0; }));
    EXPECT_EQ(newPipeEnds(before, openPipeEnds()), seen) << "the pool keeps its pipe when connections end";
}

// A parked connection holds its socket and nothing else: the pipe of its last body went back to the
// pool, and the same pipe serves it when it wakes.
TEST_F(SplicedFiles, AParkedConnectionHoldsNoPipe) {
    ASSERT_NO_FATAL_FAILURE(start(/*idleFiberRelease=*/20ms, /*carriers=*/1));
    const std::vector<std::string> before = openPipeEnds();
    Client c(port_);
    std::vector<std::string> seen;
    for (int round = 0; round < 3; ++round) {
        ASSERT_NO_FATAL_FAILURE(expectBody(c, "/large.bin", "", large_, 0, large_.size())) << "round " << round;
        ASSERT_TRUE(becameFiberless(1)) << "round " << round;
        EXPECT_EQ(server_->stats().splicePipesLent, 0u) << "round " << round;
        EXPECT_EQ(server_->stats().splicePipes, 1u) << "round " << round << ": the pool's, not the connection's";
        const std::vector<std::string> added = newPipeEnds(before, openPipeEnds());
        if (seen.empty()) { seen = added; }
        EXPECT_EQ(added.size(), 2u) << "round " << round;
        EXPECT_EQ(added, seen) << "round " << round;
    }
}

// A client that goes away in the middle of a spliced body leaves bytes of it in the pipe (the body is
// far larger than the socket buffers): that pipe is closed, not given back, and the next responses,
// through the same carrier's pool, are served byte for byte. Given back, the next body would start with
// the stale bytes.
TEST_F(SplicedFiles, APipeLeftWithBytesByAClientThatLeftMidBodyIsNotKept) {
    // Larger than the server's send buffer can ever hold (net.ipv4.tcp_wmem's maximum is some MiB)
    // plus a client window kept small: the body cannot have left when the client goes.
    const std::vector<char> huge = testing_support::pattern(24 * 1024 * 1024, 11);
    ASSERT_NO_FATAL_FAILURE(writeFile("huge.bin", std::string_view(huge.data(), huge.size())));
    ASSERT_NO_FATAL_FAILURE(start(/*idleFiberRelease=*/0ms, /*carriers=*/1));
    const std::vector<std::string> before = openPipeEnds();
    Client stays(port_);  // a keep-alive connection served before and after
    for (const bool lingerZero : {true, false}) {
        ASSERT_NO_FATAL_FAILURE(expectBody(stays, "/medium.bin", "", medium_, 0, medium_.size())) << "linger 0: " << lingerZero;
        ASSERT_TRUE(noPipeLent(*server_));
        const std::vector<std::string> kept = newPipeEnds(before, openPipeEnds());
        ASSERT_EQ(kept.size(), 2u) << "linger 0: " << lingerZero << ": the pool keeps one pipe";
        {
            Client c(port_, /*receiveBuffer=*/16 * 1024);
            ASSERT_TRUE(c.send(get("/huge.bin")));
            ASSERT_TRUE(c.receiveMore());  // the head and the first body bytes
            // The kept pipe is lent (no other is open). Not openPipeEnds() here: see its comment.
            EXPECT_EQ(server_->stats().splicePipesLent, 1u) << "linger 0: " << lingerZero;
            EXPECT_EQ(server_->stats().splicePipes, 1u) << "linger 0: " << lingerZero;
            if (lingerZero) { ASSERT_TRUE(c.setResetOnClose()); }
        }  // closed with body bytes unread: a reset either way
        EXPECT_TRUE(eventually([&] { return server_->stats().active == 1; })) << "linger 0: " << lingerZero;
        ASSERT_TRUE(noPipeLent(*server_));
        EXPECT_EQ(server_->stats().splicePipes, 0u) << "linger 0: " << lingerZero << ": the pipe with bytes is closed";
        EXPECT_TRUE(newPipeEnds(before, openPipeEnds()).empty()) << "linger 0: " << lingerZero;
        // The next bodies on this carrier, on a new connection and on the one that stayed.
        {
            Client next(port_);
            ASSERT_NO_FATAL_FAILURE(fetchMixed(next)) << "linger 0: " << lingerZero;
        }
        ASSERT_NO_FATAL_FAILURE(fetchMixed(stays)) << "linger 0: " << lingerZero;
        ASSERT_TRUE(noPipeLent(*server_));
        EXPECT_EQ(server_->stats().splicePipes, 1u) << "linger 0: " << lingerZero;
    }
}

/// net.ipv4.tcp_wmem's maximum: the most a socket's send buffer grows to (4 MiB by default).
size_t sendBufferMax() {
    std::ifstream f("/proc/sys/net/ipv4/tcp_wmem");
    size_t lo = 0, def = 0, max = 0;
    return f >> lo >> def >> max ? max : size_t{4} << 20;
}

// More bodies spliced at once than the pool keeps: each has a pipe of its own while it is sent, and when
// all are done the pool keeps kPoolCap of them and closes the rest. The server's stop closes those too.
TEST_F(SplicedFiles, ThePoolKeepsAtMostItsCapAndClosesThemAtStop) {
    // On both backends: the epoll driver's splice into a full socket waits on the carrier for room (before,
    // it blocked one of the offload pool's two threads, and no more than two bodies could wait at once).
    // Larger than a send buffer and a pipe together: a body waits, its pipe lent, until its client reads.
    const size_t size = sendBufferMax() + 3 * (size_t{1} << 20);
    const std::vector<char> big = testing_support::pattern(size, 17);
    ASSERT_NO_FATAL_FAILURE(writeFile("big.bin", std::string_view(big.data(), big.size())));
    ASSERT_NO_FATAL_FAILURE(start(/*idleFiberRelease=*/0ms, /*carriers=*/1));
    const std::vector<std::string> before = openPipeEnds();
    constexpr size_t kClients = kPoolCap + 4;
    std::vector<std::unique_ptr<Client>> clients;
    for (size_t i = 0; i < kClients; ++i) {
        clients.push_back(std::make_unique<Client>(port_, /*receiveBuffer=*/16 * 1024));
        ASSERT_TRUE(clients.back()->send(get("/big.bin")));
        ASSERT_TRUE(clients.back()->receiveMore()) << "client " << i;  // its body has begun: its pipe is lent
    }
    ASSERT_TRUE(eventually([&] { return server_->stats().splicePipesLent == kClients; }))
        << "every body waits for its client, with a pipe: " << server_->stats().splicePipesLent << " lent";
    EXPECT_EQ(server_->stats().splicePipes, kClients);  // not openPipeEnds() while bodies wait: see its comment
    for (size_t i = 0; i < kClients; ++i) {
        auto r = clients[i]->next();
        ASSERT_TRUE(r) << "client " << i;
        ASSERT_EQ(r->body.size(), size) << "client " << i;
        EXPECT_TRUE(r->body == std::string(big.data(), big.size())) << "client " << i << ": bytes differ";
    }
    ASSERT_TRUE(noPipeLent(*server_));
    EXPECT_EQ(server_->stats().splicePipes, kPoolCap);
    EXPECT_EQ(newPipeEnds(before, openPipeEnds()).size(), 2 * kPoolCap) << "the surplus is closed";
    // Served again one by one: a kept pipe serves each, and none is made.
    const std::vector<std::string> kept = newPipeEnds(before, openPipeEnds());
    for (size_t i = 0; i < kClients; ++i) {
        ASSERT_NO_FATAL_FAILURE(expectBody(*clients[i], "/medium.bin", "", medium_, 0, medium_.size())) << "client " << i;
    }
    ASSERT_TRUE(noPipeLent(*server_));
    EXPECT_EQ(newPipeEnds(before, openPipeEnds()), kept);
    server_->stop();
    server_->wait();
    EXPECT_EQ(server_->stats().splicePipes, 0u) << "the stop closes the kept pipes";
    EXPECT_TRUE(newPipeEnds(before, openPipeEnds()).empty());
}

/// The kernel's struct tcp_info up to tcpi_data_segs_in (Linux 4.6), which glibc's stops short of.
struct TcpInfoWithSegments {
    tcp_info base;  // glibc's: up to tcpi_total_retrans
    uint64_t pacingRate, maxPacingRate, bytesAcked, bytesReceived;
    uint32_t segsOut, segsIn, notsentBytes, minRtt, dataSegsIn, dataSegsOut;
};

/// Segments with data that `fd` has received so far, or nullopt where the kernel does not count them.
std::optional<uint32_t> dataSegmentsIn(int fd) {
    TcpInfoWithSegments info{};
    socklen_t len = sizeof info;
    if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0 ||
        len < offsetof(TcpInfoWithSegments, dataSegsIn) + sizeof info.dataSegsIn) {
        return std::nullopt;
    }
    return info.dataSegsIn;
}

// Issue 19: the head of a spliced body leaves with MSG_MORE, so that it shares its segment with the
// first body bytes; before, it was sent alone, and a body that fits one segment took two.
TEST_F(SplicedFiles, TheHeadSharesASegmentWithTheFirstBodyBytes) {
    // A head and 20,000 bytes fit one loopback segment (an MSS of 32-64 KiB) and the first window.
    const std::vector<char> body = testing_support::pattern(20'000, 13);
    ASSERT_NO_FATAL_FAILURE(writeFile("small.bin", std::string_view(body.data(), body.size())));
    ServerOptions o = defaults();
    o.root = dir_;
    o.spliceMinBytes = 16 * 1024;
    o.idleFiberRelease = 0ms;
    startServer(o);
    Client c(port_);
    if (!dataSegmentsIn(c.fd())) { GTEST_SKIP() << "TCP_INFO without tcpi_data_segs_in (Linux 4.6)"; }
    if (c.mss() < 24 * 1024) { GTEST_SKIP() << "a loopback MSS of " << c.mss() << " bytes: the body needs several segments"; }
    for (int i = 0; i < 4; ++i) {
        const uint32_t before = *dataSegmentsIn(c.fd());
        ASSERT_NO_FATAL_FAILURE(expectBody(c, "/small.bin", "", body, 0, body.size()));
        EXPECT_EQ(*dataSegmentsIn(c.fd()) - before, 1u) << "response " << i << ": head and body in one segment";
    }
}

// No pipe can be had (the descriptor table is full): each body is copied through the buffer instead,
// the right bytes, with nothing logged per request; once pipes can be had again, they are used.
TEST_F(SplicedFiles, APipeThatCannotBeMadeMeansACopiedBody) {
#if !defined(SPINDLE_FAULT_INJECTION)
    GTEST_SKIP() << "built without SPINDLE_FAULT_INJECTION";
#endif
    start(/*idleFiberRelease=*/0ms);
    const std::vector<std::string> before = openPipeEnds();
    Client c(port_);
    {
        inject::ArmedFault f(inject::Point::kPipeCreate, EMFILE, 1000);
        testing::internal::CaptureStderr();
        ASSERT_NO_FATAL_FAILURE(fetchMixed(c, [&] { EXPECT_TRUE(newPipeEnds(before, openPipeEnds()).empty()); }));
        const std::string logged = testing::internal::GetCapturedStderr();
        EXPECT_EQ(logged, "") << "nothing is logged per request";
        EXPECT_EQ(inject::remaining(inject::Point::kPipeCreate), 1000u - 7u) << "a try per spliced body";
    }
    ASSERT_NO_FATAL_FAILURE(expectBody(c, "/large.bin", "", large_, 0, large_.size()));
    EXPECT_EQ(newPipeEnds(before, openPipeEnds()).size(), 2u) << "the next spliced body makes the pipe";
}

TEST_F(StaticFiles, ConditionalRequests) {
    start();
    Client c(port_);
    auto r = ask(c, "/data.bin", "If-None-Match: " + etag_ + "\r\n");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status(), 304);
    EXPECT_FALSE(r->header("Content-Length")) << "a 304 has no body and says no length";
    EXPECT_EQ(r->header("ETag"), etag_);
    EXPECT_EQ(r->header("Last-Modified"), dateOf(kMtime));
    EXPECT_TRUE(r->body.empty());
    r = ask(c, "/data.bin", "If-Modified-Since: " + dateOf(kMtime) + "\r\n");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status(), 304);
    r = ask(c, "/data.bin", "If-Modified-Since: " + dateOf(kMtime - 1) + "\r\n", /*head=*/true);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status(), 200);
    r = ask(c, "/data.bin", "If-None-Match: \"stale\"\r\nIf-Modified-Since: " + dateOf(kMtime) + "\r\n", true);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status(), 200) << "If-None-Match decides alone";
    r = ask(c, "/data.bin", "If-Match: \"stale\"\r\n");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status(), 412);
    r = ask(c, "/data.bin", "If-Unmodified-Since: " + dateOf(kMtime - 60) + "\r\n");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status(), 412);
    // If-Range: the range only while the client's copy is the current one.
    r = ask(c, "/data.bin", "Range: bytes=5-9\r\nIf-Range: " + etag_ + "\r\n");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status(), 206);
    EXPECT_TRUE(r->body == bytes(5, 5));
    r = ask(c, "/data.bin", "Range: bytes=5-9\r\nIf-Range: " + dateOf(kMtime) + "\r\n");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status(), 206);
    r = ask(c, "/data.bin", "Range: bytes=5-9\r\nIf-Range: \"stale\"\r\n");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status(), 200);
    EXPECT_EQ(r->body.size(), 100'000u);
    // The file changes: the old validators no longer match.
    const timespec later[2] = {{kMtime + 3600, 0}, {kMtime + 3600, 0}};
    ASSERT_EQ(::utimensat(AT_FDCWD, path("data.bin").c_str(), later, 0), 0);
    r = ask(c, "/data.bin", "If-None-Match: " + etag_ + "\r\n", true);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status(), 200);
    EXPECT_EQ(r->header("ETag"), "\"6553ff10-186a0\"");
}

TEST_F(StaticFiles, DirectoryWithoutTheSlashIsRedirected) {
    start();
    Client c(port_);
    auto r = ask(c, "/dir", "");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status(), 301);
    EXPECT_EQ(r->header("Location"), "/dir/");
    r = ask(c, "/dir?a=1&b", "", /*head=*/true);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status(), 301);
    EXPECT_EQ(r->header("Location"), "/dir/?a=1&b");
    r = ask(c, "/empty/", "");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status(), 404) << "a directory without index.html";
    r = ask(c, "/data.bin/", "");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status(), 404) << "a file named as a directory";
}

TEST_F(StaticFiles, ContentTypeFromTheMimeTypesFile) {
    ASSERT_NO_FATAL_FAILURE(writeFile("types", "application/x-spindle-test spt\ntext/x-mine mine\n"));
    ASSERT_NO_FATAL_FAILURE(writeFile("a.spt", "x"));
    ASSERT_NO_FATAL_FAILURE(writeFile("a.MINE", "x"));
    ASSERT_NO_FATAL_FAILURE(writeFile("a.css", "x"));
    ASSERT_NO_FATAL_FAILURE(writeFile("a.qqq", "x"));
    for (const std::string& file : {path("types"), path("missing")}) {
        server_.reset();
        ServerOptions o = defaults();
        o.root = dir_;
        o.mimeTypes = file;
        startServer(o);
        const bool loaded = file == path("types");
        Client c(port_);
        struct Case {
            const char* target;
            const char* type;
        };
        for (const Case& k : {Case{"/a.spt", loaded ? "application/x-spindle-test" : "application/octet-stream"},
                              Case{"/a.MINE", loaded ? "text/x-mine; charset=utf-8" : "application/octet-stream"},
                              Case{"/a.css", "text/css; charset=utf-8"},  // the built-in table
                              Case{"/a.qqq", "application/octet-stream"}}) {
            auto r = ask(c, k.target, "", /*head=*/true);
            ASSERT_TRUE(r) << k.target;
            EXPECT_EQ(r->header("Content-Type"), k.type) << k.target << " with " << file;
        }
    }
}

// Every symlink policy, with openat2 and with the fallback, on the same tree: a link to a file inside,
// a link to a directory inside, a relative link out of the root, an absolute link out of it.
TEST_F(StaticFiles, SymlinkPolicies) {
    const std::string outside = dir_ + "-outside";
    ASSERT_EQ(::mkdir(outside.c_str(), 0755), 0) << std::strerror(errno);
    struct RemoveOutside {
        std::string d;
        ~RemoveOutside() {
            ::unlink((d + "/secret").c_str());
            ::rmdir(d.c_str());
        }
    } cleanup{outside};
    {
        std::ofstream f(outside + "/secret");
        f << "secret";
    }
    const std::string outsideName = outside.substr(outside.rfind('/') + 1);
    ASSERT_EQ(::symlink("data.bin", path("to-data").c_str()), 0);
    ASSERT_EQ(::symlink("dir", path("to-dir").c_str()), 0);
    ASSERT_EQ(::symlink(("../" + outsideName + "/secret").c_str(), path("escape").c_str()), 0);
    ASSERT_EQ(::symlink((outside + "/secret").c_str(), path("absolute").c_str()), 0);
    struct Expect {
        int toData, toDir, escape, absolute;
    };
    struct Case {
        SymlinkPolicy policy;
        Expect expect;
    };
    for (const bool openat2 : {true, false}) {
        for (const Case& k : {Case{SymlinkPolicy::kFollow, {200, 200, 200, 200}},
                              Case{SymlinkPolicy::kBeneath, {200, 200, 403, 403}},
                              Case{SymlinkPolicy::kNone, {403, 403, 403, 403}}}) {
            server_.reset();
            ServerOptions o = defaults();
            o.root = dir_;
            o.symlinks = k.policy;
            o.useOpenat2 = openat2;
            startServer(o);
            Client c(port_);
            const std::string what = "policy " + std::to_string(static_cast<int>(k.policy)) + (openat2 ? " openat2" : " fallback");
            for (const auto& [target, status] : {std::pair{"/to-data", k.expect.toData}, std::pair{"/to-dir/", k.expect.toDir},
                                                 std::pair{"/escape", k.expect.escape}, std::pair{"/absolute", k.expect.absolute}}) {
                auto r = ask(c, target, "");
                ASSERT_TRUE(r) << target << ", " << what;
                EXPECT_EQ(r->status(), status) << target << ", " << what;
                if (status == 200 && std::string_view(target) == "/escape") { EXPECT_EQ(r->body, "secret"); }
            }
            auto plain = ask(c, "/dir/index.html", "");
            ASSERT_TRUE(plain);
            EXPECT_EQ(plain->status(), 200) << "no link at all, " << what;
        }
    }
}

TEST_F(HttpServer, AccessLogHasALinePerRequestInTheCombinedFormat) {
    ServerOptions o = defaults();
    o.accessLog = path("access.log");
    startServer(o);
    {
        Client c(port_);
        ASSERT_TRUE(c.send(get("/hello", "User-Agent: test/1.0\r\nReferer: http://r/\r\n")));
        ASSERT_TRUE(c.next());
        ASSERT_TRUE(c.send("HEAD /hello HTTP/1.1\r\nHost: t\r\n\r\n" + get("/missing")));
        ASSERT_TRUE(c.next(true));
        ASSERT_TRUE(c.next());
    }
    server_.reset();  // the drain writes what is buffered
    std::ifstream in(path("access.log"));
    std::vector<std::string> lines;
    for (std::string l; std::getline(in, l);) { lines.push_back(l); }
    ASSERT_EQ(lines.size(), 3u);
    const std::regex stamp(R"(^127\.0\.0\.1 - - \[\d\d/[A-Z][a-z]{2}/\d{4}:\d\d:\d\d:\d\d \+0000\] )");
    for (const std::string& l : lines) { EXPECT_TRUE(std::regex_search(l, stamp)) << l; }
    EXPECT_TRUE(lines[0].ends_with("\"GET /hello HTTP/1.1\" 200 13 \"http://r/\" \"test/1.0\"")) << lines[0];
    EXPECT_TRUE(lines[1].ends_with("\"HEAD /hello HTTP/1.1\" 200 0 \"-\" \"-\"")) << lines[1];
    EXPECT_TRUE(lines[2].ends_with("\"GET /missing HTTP/1.1\" 404 10 \"-\" \"-\"")) << lines[2];
}

TEST_F(HttpServer, AnAccessLogThatCannotBeOpenedFailsTheStart) {
    ServerOptions o = defaults();
    o.accessLog = path("no-such-dir/access.log");
    auto s = Server::start(rt(), o);
    ASSERT_FALSE(s);
    EXPECT_EQ(s.errorCode(), ENOENT);
}

TEST_F(HttpServer, Http10ClosesUnlessKeepAlive) {
    startServer(defaults());
    Client keep(port_);
    ASSERT_TRUE(keep.send("GET /hello HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"));
    auto k = keep.next();
    ASSERT_TRUE(k);
    EXPECT_EQ(k->statusLine, "HTTP/1.0 200 OK");
    EXPECT_EQ(k->header("Connection"), "keep-alive");
    ASSERT_TRUE(keep.send("GET /hello HTTP/1.0\r\n\r\n"));
    auto r = keep.next();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->statusLine, "HTTP/1.0 200 OK");
    EXPECT_EQ(r->header("Connection"), "close");
    EXPECT_EQ(r->body, "Hello, World!");
    EXPECT_TRUE(keep.closedByPeer());

    Client close11(port_);
    ASSERT_TRUE(close11.send(get("/hello", "Connection: close\r\n")));
    auto c = close11.next();
    ASSERT_TRUE(c);
    EXPECT_EQ(c->header("Connection"), "close");
    EXPECT_TRUE(close11.closedByPeer());
}

TEST_F(HttpServer, SlowlorisIsCutOffByTheHeaderTimeout) {
    ServerOptions o = defaults();
    o.headerTimeout = 300ms;
    startServer(o);
    Client c(port_);
    // One byte every 20 ms of a head that never ends: the server must close long before we stop.
    const std::string drip = "GET /hello HTTP/1.1\r\nHost: t\r\nX-Slow: " + std::string(100000, 'a');
    const auto start = std::chrono::steady_clock::now();
    bool cut = false;
    for (size_t i = 0; i < drip.size() && std::chrono::steady_clock::now() - start < kIoTimeout; ++i) {
        if (!c.send(drip.substr(i, 1))) {
            cut = true;
            break;
        }
        pollfd p{c.fd(), POLLIN, 0};
        if (::poll(&p, 1, 20) > 0) {
            cut = true;
            break;
        }
    }
    ASSERT_TRUE(cut) << "the connection outlived " << kIoTimeout.count() << " s of dripping";
    auto r = c.next();
    if (r) { EXPECT_EQ(r->status(), 408); }
    EXPECT_EQ(server_->stats().headerTimeouts, 1u);
}

TEST_F(HttpServer, SilentConnectionIsCutOffByTheHeaderTimeout) {
    ServerOptions o = defaults();
    o.headerTimeout = 200ms;
    startServer(o);
    Client c(port_);
    auto r = c.next();  // sends nothing; the server answers 408 and closes
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status(), 408);
    EXPECT_TRUE(c.closedByPeer());
    EXPECT_EQ(server_->stats().headerTimeouts, 1u);
    EXPECT_EQ(server_->stats().errors, 1u) << "a 408 is a 4xx response from a timeout";
}

TEST_F(HttpServer, IdleKeepAliveConnectionIsClosed) {
    ServerOptions o = defaults();
    o.idleTimeout = 200ms;
    startServer(o);
    Client c(port_);
    ASSERT_TRUE(c.send(get("/hello")));
    auto r = c.next();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status(), 200);
    EXPECT_TRUE(c.closedByPeer());
    EXPECT_EQ(c.buffered(), "");  // closed silently: an idle connection gets no 408
    EXPECT_EQ(server_->stats().idleTimeouts, 1u);
}

TEST_F(HttpServer, NewConnectionGetsTheHeaderTimeoutNotTheIdleOne) {
    ServerOptions o = defaults();
    o.idleTimeout = 50ms;  // swept every 6 ms
    o.headerTimeout = 60s;
    startServer(o);
    Client c(port_);
    std::this_thread::sleep_for(500ms);  // ten idle timeouts, well inside the header timeout
    ASSERT_TRUE(c.send(get("/hello")));
    auto r = c.next();
    ASSERT_TRUE(r) << "a connection that had not sent its first request was closed as idle";
    EXPECT_EQ(r->status(), 200);
    EXPECT_EQ(server_->stats().idleTimeouts, 0u);
}

TEST_F(HttpServer, GracefulShutdownDeliversResponsesInFlight) {
    const std::vector<char> big = testing_support::pattern(8 * 1024 * 1024, 3);
    writeFile("big.bin", std::string_view(big.data(), big.size()));
    ServerOptions o = defaults();
    o.root = dir_;
    o.drainTimeout = 60s;
    startServer(o);

    // A: a large response in flight, read slowly.
    Client a(port_);
    ASSERT_TRUE(a.send(get("/big.bin")));
    ASSERT_TRUE(a.receiveMore());  // the answer has begun
    // B: idle keep-alive connections, which the shutdown closes.
    Client b(port_);
    ASSERT_TRUE(b.send(get("/hello")));
    ASSERT_TRUE(b.next());
    Client idle(port_);

    server_->stop();
    std::thread waiter([&] { server_->wait(); });
    std::this_thread::sleep_for(50ms);  // (not needed for correctness: lets the drain begin first)

    auto r = a.next();
    ASSERT_TRUE(r) << "the response in flight was cut off";
    EXPECT_EQ(r->status(), 200);
    EXPECT_EQ(r->header("Connection"), std::nullopt);  // it was answered before the shutdown began
    EXPECT_TRUE(r->body == std::string(big.data(), big.size()));
    EXPECT_TRUE(b.closedByPeer());
    EXPECT_TRUE(idle.closedByPeer());
    EXPECT_TRUE(a.closedByPeer());  // once its answer is out, A is idle and closed too
    waiter.join();
    // New connections are refused once the listeners are closed.
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port_);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_NE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    ::close(fd);
    EXPECT_EQ(server_->stats().active, 0u);
}

TEST_F(HttpServer, IdleConnectionsGiveTheirFibersUpAndAreServedAgain) {
    ServerOptions o = defaults();
    o.idleFiberRelease = 20ms;  // swept every 10 ms
    startServer(o);
    const uint64_t baseline = rt().liveFibers();  // acceptors and sweeps
    constexpr int kClients = 8;
    std::vector<std::unique_ptr<Client>> clients;
    for (int i = 0; i < kClients; ++i) { clients.push_back(std::make_unique<Client>(port_)); }
    for (int round = 0; round < 3; ++round) {
        for (auto& c : clients) { ASSERT_TRUE(c->send(get("/hello"))); }
        for (auto& c : clients) {
            auto r = c->next();
            ASSERT_TRUE(r) << "round " << round;
            EXPECT_EQ(r->body, "Hello, World!");
        }
        // Idle now: every connection gives its fiber up and waits on its receive alone.
        ASSERT_TRUE(becameFiberless(kClients)) << "round " << round;
        EXPECT_TRUE(eventually([&] { return rt().liveFibers() == baseline; }))
            << rt().liveFibers() << " fibers live, " << baseline << " expected (as before the connections)";
    }
    // Pipelined requests wake a fiberless connection as one does.
    ASSERT_TRUE(clients[0]->send(get("/hello") + get("/") + get("/hello")));
    for (int i = 0; i < 3; ++i) {
        auto r = clients[0]->next();
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status(), 200);
    }
    const ServerStats st = server_->stats();
    EXPECT_EQ(st.requests, static_cast<uint64_t>(3 * kClients + 3));
    EXPECT_GE(st.fiberReleases, static_cast<uint64_t>(3 * kClients));
    EXPECT_EQ(st.active, static_cast<uint64_t>(kClients));
    // A client that leaves while its connection has no fiber: the end of stream starts one, which ends it.
    clients[1].reset();
    EXPECT_TRUE(eventually([&] { return server_->stats().active == kClients - 1; }));
}

// Issue 19 (memory per idle connection): a connection that gives its fiber up gives its Connection
// back too (the reader with its multishot receive, some 770 bytes) and waits in an IdleConnection of
// some 230; before, the fiber's stack went and the Connection stayed.
TEST_F(HttpServer, AFiberlessConnectionGivesMostOfItsHeapBack) {
    if (testing_support::kSanitized) { GTEST_SKIP() << "the sanitizers' allocator: mallinfo2 says nothing"; }
    ServerOptions o = defaults();
    o.idleFiberRelease = 3s;  // long enough to count the heap while the connections still have theirs
    startServer(o);
    constexpr int kClients = 200;
    std::vector<std::unique_ptr<Client>> clients;
    for (int i = 0; i < kClients; ++i) {
        clients.push_back(std::make_unique<Client>(port_));
        ASSERT_TRUE(clients.back()->send(get("/hello")));
        ASSERT_TRUE(clients.back()->next());
    }
    const size_t withFibers = ::mallinfo2().uordblks;
    ASSERT_EQ(server_->stats().fiberless, 0u) << "released before the heap was counted";
    ASSERT_TRUE(becameFiberless(kClients));
    const size_t fiberless = ::mallinfo2().uordblks;
    const double freedPerConnection = (static_cast<double>(withFibers) - static_cast<double>(fiberless)) / kClients;
    EXPECT_GE(freedPerConnection, 300.0) << "heap bytes given back per idle connection";
    // And each is served again as before.
    for (auto& c : clients) { ASSERT_TRUE(c->send(get("/hello"))); }
    for (auto& c : clients) {
        auto r = c->next();
        ASSERT_TRUE(r);
        EXPECT_EQ(r->body, "Hello, World!");
    }
}

// No fiber for the wake-up of a fiberless connection (stacks cannot be mapped): the connection is
// ended from the receiver's callback, on the carrier's thread, and counted out.
TEST_F(HttpServer, AFiberlessConnectionThatCannotGetAFiberBackIsEndedAndCountedOut) {
    ServerOptions o = defaults();
    o.idleFiberRelease = 10ms;
    // Above the stack pool's largest class: every spawn maps a stack of its own, which the fault refuses.
    o.connectionStackSize = detail::StackPool::kMaxClassSize + 64 * 1024;
    startServer(o);
    Client c(port_);
    ASSERT_TRUE(c.send(get("/hello")));
    ASSERT_TRUE(c.next());
    ASSERT_TRUE(eventually([&] { return server_->stats().fiberless == 1; }));
    {
        inject::ArmedFault f(inject::Point::kStackMap, ENOMEM, 1000);
        ASSERT_TRUE(c.send(get("/hello")));
        EXPECT_TRUE(c.closedByPeer());
        EXPECT_TRUE(eventually([&] { return server_->stats().active == 0; }));
    }
    EXPECT_EQ(server_->stats().fiberless, 0u);
}

// Where a connection cannot give its fiber up (here: no multishot receive, as on a kernel before 6.0),
// the sweep asks once per keep-alive wait, not on every pass: its receive is not cancelled and posted
// again every few milliseconds for nothing.
TEST_F(HttpServer, TheSweepAsksAConnectionThatCannotGoFiberlessOncePerWait) {
    inject::ArmedFault f(inject::Point::kMultishotRecv, EINVAL, 1000000);
    ServerOptions o = defaults();
    o.idleFiberRelease = 10ms;  // swept every 5 ms
    startServer(o);
    Client c(port_);
    ASSERT_TRUE(c.send(get("/hello")));
    ASSERT_TRUE(c.next());
    auto cancels = [&] {
        uint64_t n = 0;
        for (const auto& cs : rt().stats()) { n += cs.waitsCancelled; }
        return n;
    };
    std::this_thread::sleep_for(50ms);
    const uint64_t before = cancels();
    std::this_thread::sleep_for(300ms);  // some 60 sweeps
    EXPECT_LT(cancels() - before, 3u) << "the idle connection's receive was cancelled on sweep after sweep";
    EXPECT_EQ(server_->stats().fiberReleases, 0u);
    ASSERT_TRUE(c.send(get("/hello")));  // still served, with its fiber
    auto r = c.next();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status(), 200);
}

TEST_F(HttpServer, AFiberlessConnectionStillMeetsTheIdleTimeout) {
    ServerOptions o = defaults();
    o.idleFiberRelease = 10ms;
    o.idleTimeout = 300ms;
    startServer(o);
    Client c(port_);
    ASSERT_TRUE(c.send(get("/hello")));
    ASSERT_TRUE(c.next());
    ASSERT_TRUE(becameFiberless(1));
    EXPECT_TRUE(c.closedByPeer());
    EXPECT_EQ(c.buffered(), "");
    EXPECT_EQ(server_->stats().idleTimeouts, 1u);
    EXPECT_TRUE(eventually([&] { return server_->stats().active == 0; }));
    EXPECT_EQ(server_->stats().fiberless, 0u);
}

TEST_F(HttpServer, GracefulShutdownClosesFiberlessConnections) {
    ServerOptions o = defaults();
    o.idleFiberRelease = 10ms;
    startServer(o);
    std::vector<std::unique_ptr<Client>> clients;
    for (int i = 0; i < 6; ++i) {
        clients.push_back(std::make_unique<Client>(port_));
        ASSERT_TRUE(clients.back()->send(get("/hello")));
        ASSERT_TRUE(clients.back()->next());
    }
    ASSERT_TRUE(becameFiberless(6));
    server_->stop();
    server_->wait();
    for (auto& c : clients) { EXPECT_TRUE(c->closedByPeer()); }
    EXPECT_EQ(server_->stats().active, 0u);
    EXPECT_EQ(server_->stats().fiberless, 0u);
}

TEST_F(HttpServer, RuntimeShutdownEndsFiberlessConnections) {
    ServerOptions o = defaults();
    o.idleFiberRelease = 10ms;
    startServer(o);
    Client a(port_);
    Client b(port_);
    for (Client* c : {&a, &b}) {
        ASSERT_TRUE(c->send(get("/hello")));
        ASSERT_TRUE(c->next());
    }
    ASSERT_TRUE(becameFiberless(2));
    // No stop(): the runtime's own shutdown cancels the receives, and no fiber can be had any more.
    rt().shutdown();
    EXPECT_TRUE(a.closedByPeer());
    EXPECT_TRUE(b.closedByPeer());
    // Each is counted out just after its descriptor is closed (and its buffers are back).
    EXPECT_TRUE(eventually([&] { return server_->stats().active == 0; }));
    EXPECT_EQ(server_->stats().fiberless, 0u);
}

TEST_F(HttpServer, ManyConnectionsAcrossCarriers) {
    startServer(defaults());
    constexpr int kClients = 64;
    std::vector<std::unique_ptr<Client>> clients;
    for (int i = 0; i < kClients; ++i) { clients.push_back(std::make_unique<Client>(port_)); }
    for (int round = 0; round < 3; ++round) {
        for (auto& c : clients) { ASSERT_TRUE(c->send(get("/hello"))); }
        for (auto& c : clients) {
            auto r = c->next();
            ASSERT_TRUE(r);
            EXPECT_EQ(r->body, "Hello, World!");
        }
    }
    EXPECT_EQ(server_->stats().accepted, static_cast<uint64_t>(kClients));
    EXPECT_EQ(server_->stats().requests, static_cast<uint64_t>(3 * kClients));
}

TEST_F(HttpServer, SecondServerOnTheSamePortFailsWithEaddrinuseUnlessShared) {
    startServer(defaults());
    ServerOptions again = defaults();
    again.address = server_->localAddress();
    auto second = Server::start(rt(), again);
    ASSERT_FALSE(second);
    EXPECT_EQ(second.errorCode(), EADDRINUSE);
    // The first still serves everything.
    Client c(port_);
    ASSERT_TRUE(c.send(get("/hello")));
    auto r = c.next();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->body, "Hello, World!");
    // Two servers that both ask for sharing may split a port.
    ServerOptions shared = defaults();
    shared.shareAddress = true;
    auto a = Server::start(rt(), shared);
    ASSERT_TRUE(a) << a.error().message();
    shared.address = (*a)->localAddress();
    auto b = Server::start(rt(), shared);
    ASSERT_TRUE(b) << b.error().message();
    EXPECT_EQ((*b)->localAddress().port(), shared.address.port());
}

}  // namespace
}  // namespace spindle::httpd
