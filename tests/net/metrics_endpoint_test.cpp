// SPDX-License-Identifier: Apache-2.0
// MetricsEndpoint over loopback, scraped by a plain blocking socket as Prometheus would: the page and
// its Content-Type, counters that move between scrapes, a daemon's own families, keep-alive and close
// (HTTP/1.1 and 1.0, pipelined requests), HEAD, 404, 405, 400, 431 for an oversized head, 408, idle
// connections, the connection limit, a refused page (500), a taken port (EADDRINUSE), options out of
// range (EINVAL), and stop() with connections open.
#include "net/metrics_endpoint.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "core/io.h"
#include "tests/base/exposition_check.h"
#include "tests/core/with_runtime.h"

namespace spindle::net {
namespace {

using namespace std::chrono_literals;
using testing_support::expositionProblem;
using testing_support::samplesOf;
using testing_support::sumOf;
using testing_support::WithRuntime;

struct Response {
    int status = 0;  // 0: no response (the connection ended or failed first)
    std::map<std::string, std::string> headers;  // names in lower case
    std::string body;
};

// recv(2) that retries after EINTR: with a timeout set (SO_RCVTIMEO) the kernel does not restart it
// after a signal handler ran, and the test's thread does see interruptions.
ssize_t recvRetrying(int fd, void* buf, size_t len) {
    ssize_t n;
    do {
        n = ::recv(fd, buf, len, 0);
    } while (n < 0 && errno == EINTR);
    return n;
}

// A blocking IPv4 loopback client (5 s timeouts), run from the test's own thread.
class Client {
public:
    explicit Client(uint16_t port) {
        fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        timeval tv{5, 0};
        ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        sockaddr_in addr{};
        addr.sin_family = AF_INET;
        addr.sin_port = htons(port);
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        int rc;
        do {
            rc = ::connect(fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof addr);
        } while (rc != 0 && errno == EINTR);
        connected_ = rc == 0;
    }
    ~Client() { ::close(fd_); }
    Client(const Client&) = delete;
    Client& operator=(const Client&) = delete;

    [[nodiscard]] bool connected() const { return connected_; }
    bool send(std::string_view text) {
        size_t sent = 0;
        while (sent < text.size()) {
            const ssize_t n = ::send(fd_, text.data() + sent, text.size() - sent, MSG_NOSIGNAL);
            if (n < 0 && errno == EINTR) { continue; }
            if (n <= 0) { return false; }
            sent += static_cast<size_t>(n);
        }
        return true;
    }
    /// One response; with `headOnly` its body is not read (a HEAD's Content-Length describes a GET).
    Response read(bool headOnly = false) {
        Response r;
        size_t end;
        while ((end = buffer_.find("\r\n\r\n")) == std::string::npos) {
            if (!fill()) { return r; }
        }
        const std::string head = buffer_.substr(0, end + 2);
        buffer_.erase(0, end + 4);
        size_t pos = head.find("\r\n");
        const std::string statusLine = head.substr(0, pos);
        if (!statusLine.starts_with("HTTP/1.1 ") || statusLine.size() < 12) { return r; }
        for (pos += 2; pos < head.size();) {
            const size_t eol = head.find("\r\n", pos);
            const std::string line = head.substr(pos, eol - pos);
            pos = eol + 2;
            const size_t colon = line.find(':');
            std::string name = line.substr(0, colon);
            for (char& c : name) { c = static_cast<char>(std::tolower(static_cast<unsigned char>(c))); }
            r.headers[name] = line.substr(line.find_first_not_of(' ', colon + 1));
        }
        const size_t length = headOnly ? 0 : std::stoul(r.headers["content-length"]);
        while (buffer_.size() < length) {
            if (!fill()) { return r; }
        }
        r.body = buffer_.substr(0, length);
        buffer_.erase(0, length);
        r.status = std::stoi(statusLine.substr(9, 3));
        return r;
    }
    /// Whether the server ends the connection (end of stream, or a reset) within the 5 s timeout with
    /// no more bytes.
    bool closedByServer() {
        char c;
        const ssize_t n = recvRetrying(fd_, &c, 1);
        return n == 0 || (n < 0 && errno == ECONNRESET);
    }

private:
    bool fill() {
        char buf[4096];
        const ssize_t n = recvRetrying(fd_, buf, sizeof buf);
        if (n <= 0) { return false; }
        buffer_.append(buf, static_cast<size_t>(n));
        return true;
    }
    int fd_ = -1;
    bool connected_ = false;
    std::string buffer_;
};

constexpr std::string_view kGet = "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n";

/// Connects and sends `text`, and does both again (three tries at most) only when this thread took
/// `idle` or longer between the connect and the end of the send (a loaded machine, a sanitizer): the
/// endpoint may then rightly have closed the fresh connection as idle first. A send that ended sooner
/// reached the server before its idle deadline (which starts at the accept), so a server that closes
/// fresh connections early still fails the test.
std::unique_ptr<Client> connectAndSend(uint16_t port, std::string_view text, std::chrono::milliseconds idle) {
    for (int attempt = 1;; ++attempt) {
        const auto start = std::chrono::steady_clock::now();
        auto c = std::make_unique<Client>(port);
        const bool sent = c->send(text);
        if (std::chrono::steady_clock::now() - start < idle || attempt == 3) {
            EXPECT_TRUE(sent);
            return c;
        }
    }
}

class MetricsEndpointTest : public WithRuntime {
protected:
    void TearDown() override {
        endpoint_.reset();  // its fibers end before the runtime's check
        WithRuntime::TearDown();
    }

    // Starts an endpoint on an ephemeral loopback port on carrier 1; fails the test when it cannot.
    void start(MetricsEndpointOptions options = {}, MetricsCollector collector = {}) {
        options.address = SocketAddress::ipv4Loopback(0);
        options.carrier = 1;
        auto e = MetricsEndpoint::start(rt(), options, std::move(collector));
        ASSERT_TRUE(e) << e.error().message();
        endpoint_ = std::move(*e);
        port_ = endpoint_->localAddress().port();
    }

    std::unique_ptr<MetricsEndpoint> endpoint_;
    uint16_t port_ = 0;
};

TEST_F(MetricsEndpointTest, ServesTheRuntimesCountersAndTheyMove) {
    ASSERT_NO_FATAL_FAILURE(start({}, [](metrics::Writer& w) {
        w.family("app_requests_total", metrics::Type::kCounter, "Requests of the app.");
        w.sample({{"route", "/a \"b\""}}, uint64_t{42});
    }));
    Client c(port_);
    ASSERT_TRUE(c.connected());
    ASSERT_TRUE(c.send(kGet));
    const Response first = c.read();
    ASSERT_EQ(first.status, 200);
    EXPECT_TRUE(first.headers.at("content-type").starts_with("text/plain; version=0.0.4"))
        << first.headers.at("content-type");
    EXPECT_EQ(first.headers.at("connection"), "keep-alive");
    EXPECT_EQ(expositionProblem(first.body), "") << first.body;
    EXPECT_EQ(samplesOf(first.body, "app_requests_total").at("{route=\"/a \\\"b\\\"\"}"), 42);
    EXPECT_EQ(samplesOf(first.body, "spindle_carrier_sqes_submitted_total").size(), rt().carrierCount());

    // Work on both carriers, then a second scrape on the same connection.
    std::vector<FiberHandle<void>> fibers;
    for (int i = 0; i < 20; ++i) {
        fibers.push_back(on(i % 2, [] {
            for (int k = 0; k < 2; ++k) { EXPECT_TRUE(nop()); }
        }));
    }
    for (auto& f : fibers) { f.join(); }
    ASSERT_TRUE(c.send(kGet));
    const Response second = c.read();
    ASSERT_EQ(second.status, 200);
    EXPECT_GE(sumOf(second.body, "spindle_carrier_fibers_run_total") -
                  sumOf(first.body, "spindle_carrier_fibers_run_total"),
              20);
    EXPECT_GE(sumOf(second.body, "spindle_carrier_sqes_submitted_total") -
                  sumOf(first.body, "spindle_carrier_sqes_submitted_total"),
              40);
    EXPECT_GE(sumOf(second.body, "spindle_carrier_cqes_reaped_total") -
                  sumOf(first.body, "spindle_carrier_cqes_reaped_total"),
              40);
    EXPECT_EQ(endpoint_->stats().scrapes, 2u);
    EXPECT_EQ(endpoint_->stats().accepted, 1u);
}

TEST_F(MetricsEndpointTest, KeepAliveAndCloseAsTheVersionAndHeaderSay) {
    ASSERT_NO_FATAL_FAILURE(start());
    {  // HTTP/1.1: two pipelined requests, the second asking to close.
        Client c(port_);
        ASSERT_TRUE(c.send(std::string(kGet) + "GET /metrics?x=1 HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"));
        const Response a = c.read();
        EXPECT_EQ(a.status, 200);
        EXPECT_EQ(a.headers.at("connection"), "keep-alive");
        const Response b = c.read();
        EXPECT_EQ(b.status, 200);
        EXPECT_EQ(b.headers.at("connection"), "close");
        EXPECT_TRUE(c.closedByServer());
    }
    {  // HTTP/1.0 closes by default (bare LF line ends are accepted too)...
        Client c(port_);
        ASSERT_TRUE(c.send("GET /metrics HTTP/1.0\n\n"));
        const Response a = c.read();
        EXPECT_EQ(a.status, 200);
        EXPECT_EQ(a.headers.at("connection"), "close");
        EXPECT_TRUE(c.closedByServer());
    }
    {  // ... and stays open when asked.
        Client c(port_);
        ASSERT_TRUE(c.send("GET /metrics HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n"));
        EXPECT_EQ(c.read().headers.at("connection"), "keep-alive");
        ASSERT_TRUE(c.send("GET /metrics HTTP/1.0\r\n\r\n"));
        EXPECT_EQ(c.read().status, 200);
        EXPECT_TRUE(c.closedByServer());
    }
}

TEST_F(MetricsEndpointTest, HeadGivesTheHeadersOnly) {
    ASSERT_NO_FATAL_FAILURE(start());
    Client c(port_);
    ASSERT_TRUE(c.send("HEAD /metrics HTTP/1.1\r\nHost: h\r\n\r\n"));
    const Response r = c.read(/*headOnly=*/true);
    EXPECT_EQ(r.status, 200);
    EXPECT_GT(std::stoul(r.headers.at("content-length")), 100u);
    // The next response follows at once: no body was sent in between.
    ASSERT_TRUE(c.send("GET /nothing HTTP/1.1\r\nHost: h\r\n\r\n"));
    EXPECT_EQ(c.read().status, 404);
}

TEST_F(MetricsEndpointTest, OtherPathsAre404AndOtherMethods405) {
    ASSERT_NO_FATAL_FAILURE(start());
    Client c(port_);
    ASSERT_TRUE(c.send("GET / HTTP/1.1\r\nHost: h\r\n\r\n"));
    EXPECT_EQ(c.read().status, 404);
    ASSERT_TRUE(c.send("GET /metricsx HTTP/1.1\r\nHost: h\r\n\r\n"));
    EXPECT_EQ(c.read().status, 404);
    ASSERT_TRUE(c.send("DELETE /metrics HTTP/1.1\r\nHost: h\r\n\r\n"));
    const Response r = c.read();
    EXPECT_EQ(r.status, 405);
    EXPECT_EQ(r.headers.at("allow"), "GET, HEAD");
    EXPECT_EQ(r.headers.at("connection"), "keep-alive");  // a bodiless request keeps the connection
    // A request with a body is answered and then closed: its body is never read.
    ASSERT_TRUE(c.send("POST /metrics HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc"));
    const Response p = c.read();
    EXPECT_EQ(p.status, 405);
    EXPECT_EQ(p.headers.at("connection"), "close");
    EXPECT_TRUE(c.closedByServer());
    EXPECT_EQ(endpoint_->stats().errors, 4u);
    EXPECT_EQ(endpoint_->stats().scrapes, 0u);
}

TEST_F(MetricsEndpointTest, MalformedRequestsGet400AndAreClosed) {
    ASSERT_NO_FATAL_FAILURE(start());
    for (const char* bad : {
             "GARBAGE\r\n\r\n",                                           // no target, no version
             "GET /metrics HTTP/2.0\r\nHost: h\r\n\r\n",                   // unknown version
             "GET /metrics HTTP/1.1\r\n\r\n",                              // HTTP/1.1 without Host
             "GET metrics HTTP/1.1\r\nHost: h\r\n\r\n",                    // not an origin-form target
             "GET /metrics HTTP/1.1\r\nHost : h\r\n\r\n",                  // space before the colon
             "GET /metrics HTTP/1.1\r\nHost: h\r\n folded\r\n\r\n",        // obsolete line folding
             "GET /metrics HTTP/1.1\r\nHost: h\r\nContent-Length: x\r\n\r\n",
             "GET /metrics HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
         }) {
        Client c(port_);
        ASSERT_TRUE(c.send(bad));
        Response r = c.read();
        EXPECT_EQ(r.status, 400) << bad;
        EXPECT_EQ(r.headers["connection"], "close") << bad;
        EXPECT_TRUE(c.closedByServer()) << bad;
    }
}

TEST_F(MetricsEndpointTest, AnOversizedRequestGets431AndIsClosed) {
    ASSERT_NO_FATAL_FAILURE(start({.maxRequestBytes = 256}));
    {  // Headers past the bound, with the end of the head never sent.
        Client c(port_);
        ASSERT_TRUE(c.send("GET /metrics HTTP/1.1\r\nHost: h\r\nX-Long: " + std::string(400, 'a') + "\r\n"));
        const Response r = c.read();
        EXPECT_EQ(r.status, 431);
        EXPECT_TRUE(c.closedByServer());
    }
    {  // One endless line.
        Client c(port_);
        ASSERT_TRUE(c.send("GET /" + std::string(1000, 'm')));
        EXPECT_EQ(c.read().status, 431);
        EXPECT_TRUE(c.closedByServer());
    }
    {  // A complete head just within the bound is served.
        Client c(port_);
        std::string req = "GET /metrics HTTP/1.1\r\nHost: h\r\nX-Pad: ";
        req += std::string(256 - req.size() - 4, 'p') + "\r\n\r\n";
        ASSERT_EQ(req.size(), 256u);
        ASSERT_TRUE(c.send(req));
        EXPECT_EQ(c.read().status, 200);
    }
}

TEST_F(MetricsEndpointTest, SlowRequestsGet408AndIdleConnectionsAreClosed) {
    ASSERT_NO_FATAL_FAILURE(start({.requestTimeout = 100ms, .idleTimeout = 100ms}));
    {
        auto c = connectAndSend(port_, "GET /metrics HTTP/1.1\r\n", 100ms);  // and never the rest
        EXPECT_EQ(c->read().status, 408);
        EXPECT_TRUE(c->closedByServer());
    }
    {
        auto c = connectAndSend(port_, kGet, 100ms);
        EXPECT_EQ(c->read().status, 200);
        const auto before = std::chrono::steady_clock::now();
        EXPECT_TRUE(c->closedByServer());  // idle past 100 ms: closed without a response
        EXPECT_LT(std::chrono::steady_clock::now() - before, 4s);
    }
}

TEST_F(MetricsEndpointTest, ConnectionsPastTheLimitAreClosedAtOnce) {
    ASSERT_NO_FATAL_FAILURE(start({.maxConnections = 1}));
    Client held(port_);
    ASSERT_TRUE(held.send(kGet));
    ASSERT_EQ(held.read().status, 200);  // accepted and served: it holds the one place
    Client extra(port_);
    ASSERT_TRUE(extra.connected());      // the kernel completes the handshake...
    EXPECT_TRUE(extra.closedByServer()); // ... and the endpoint closes it
    EXPECT_EQ(endpoint_->stats().refused, 1u);
    ASSERT_TRUE(held.send(kGet));
    EXPECT_EQ(held.read().status, 200);
}

TEST_F(MetricsEndpointTest, ARefusedPageIs500) {
    ASSERT_NO_FATAL_FAILURE(start({}, [](metrics::Writer& w) {
        w.family("spindle_fibers_live", metrics::Type::kGauge, "a name the runtime already wrote");
    }));
    Client c(port_);
    ASSERT_TRUE(c.send(kGet));
    const Response r = c.read();
    EXPECT_EQ(r.status, 500);
    EXPECT_NE(r.body.find("spindle_fibers_live"), std::string::npos) << r.body;
}

TEST_F(MetricsEndpointTest, ACollectorThatThrowsCostsOnlyItsConnection) {
    std::atomic<bool> fail{true};
    ASSERT_NO_FATAL_FAILURE(start({}, [&fail](metrics::Writer&) {
        if (fail.load()) { throw std::runtime_error("collector failed"); }
    }));
    {
        Client c(port_);
        ASSERT_TRUE(c.send(kGet));
        EXPECT_EQ(c.read().status, 0);  // no response: the connection is dropped
    }
    EXPECT_EQ(endpoint_->stats().errors, 1u);
    fail = false;
    Client c(port_);  // the endpoint serves on
    ASSERT_TRUE(c.send(kGet));
    EXPECT_EQ(c.read().status, 200);
}

TEST_F(MetricsEndpointTest, ATakenPortIsEaddrinuse) {
    ASSERT_NO_FATAL_FAILURE(start());
    MetricsEndpointOptions o;
    o.address = SocketAddress::ipv4Loopback(port_);
    auto second = MetricsEndpoint::start(rt(), o);
    ASSERT_FALSE(second);
    EXPECT_EQ(second.errorCode(), EADDRINUSE);
    EXPECT_NE(second.error().message().find("in use"), std::string::npos) << second.error().message();
}

TEST_F(MetricsEndpointTest, OptionsOutOfRangeAreEinval) {
    auto expectEinval = [&](MetricsEndpointOptions o, const char* what) {
        o.address = SocketAddress::ipv4Loopback(0);
        auto e = MetricsEndpoint::start(rt(), o);
        ASSERT_FALSE(e) << what;
        EXPECT_EQ(e.errorCode(), EINVAL) << what;
    };
    expectEinval({.carrier = 2}, "carrier past the runtime's");
    expectEinval({.maxRequestBytes = 10}, "tiny request bound");
    expectEinval({.maxConnections = 0}, "no connections");
    expectEinval({.requestTimeout = 0ms}, "zero request timeout");
    expectEinval({.sendTimeout = -1ms}, "negative send timeout");
}

TEST_F(MetricsEndpointTest, StopEndsOpenConnections) {
    ASSERT_NO_FATAL_FAILURE(start());
    Client idle(port_);
    Client partial(port_);
    ASSERT_TRUE(idle.send(kGet));
    ASSERT_EQ(idle.read().status, 200);
    ASSERT_TRUE(partial.send("GET /met"));
    const auto before = std::chrono::steady_clock::now();
    endpoint_->stop();
    EXPECT_LT(std::chrono::steady_clock::now() - before, 2s);
    EXPECT_TRUE(idle.closedByServer());
    EXPECT_TRUE(partial.closedByServer());
    endpoint_->stop();  // idempotent
    Client late(port_);
    EXPECT_FALSE(late.connected());  // the listener is gone
}

}  // namespace
}  // namespace spindle::net
