// SPDX-License-Identifier: Apache-2.0
// spindle-echo's server and client (apps/echo/echo.h) in one process over loopback: the server on one
// runtime, the client on another, as the two programs would run. Every check is on counts and bytes
// (the client compares each echo with what it sent); the runs are bounded by message counts, not by
// time, so a slow or sanitized build checks the same things.

#include "apps/echo/echo.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/runtime.h"
#include "tests/core/with_runtime.h"

namespace spindle::echo {
namespace {

using namespace std::chrono_literals;
using testing_support::kSanitized;
using testing_support::settledLiveFibers;
using testing_support::withCarriers;

// A server runtime and a client runtime of two carriers each (two even on a one-core machine).
class EchoTest : public ::testing::Test {
protected:
    void SetUp() override {
        auto server = Runtime::start(withCarriers(2));
        auto client = Runtime::start(withCarriers(2));
        if (!server || !client) { GTEST_SKIP() << "runtime unavailable"; }
        serverRt_.emplace(std::move(*server));
        clientRt_.emplace(std::move(*client));
    }
    void TearDown() override {
        if (clientRt_) { EXPECT_EQ(settledLiveFibers(*clientRt_), 0u); }
        if (serverRt_) { EXPECT_EQ(settledLiveFibers(*serverRt_), 0u); }
    }

    std::unique_ptr<EchoServer> startServer(bool reusePort = true, size_t bufferSize = 16 * 1024, bool inlineSend = false,
                                            bool multishotRecv = true, unsigned providedBuffers = 1024,
                                            bool postedSend = true) {
        ServerOptions options;
        options.postedSend = postedSend;
        options.inlineSend = inlineSend;
        options.multishotRecv = multishotRecv;
        options.providedBuffers = providedBuffers;
        options.address = net::SocketAddress::ipv4Loopback(0);
        options.reusePort = reusePort;
        options.bufferSize = bufferSize;
        auto server = EchoServer::start(*serverRt_, options);
        EXPECT_TRUE(server) << server.error().message();
        if (!server) { return nullptr; }
        EXPECT_NE((*server)->localAddress().port(), 0);
        return std::move(*server);
    }

    static ClientOptions countedLoad(const EchoServer& server, unsigned connections, size_t size, uint64_t messages) {
        ClientOptions options;
        options.address = server.localAddress();
        options.connections = connections;
        options.messageSize = size;
        options.messagesPerConnection = messages;
        options.ioTimeout = 60s;  // a hang, not slowness, should fail a run
        return options;
    }

    // Counts, percentiles and bytes that a clean counted run must show.
    static void expectCleanRun(const ClientReport& report, const ServerStats& stats, unsigned connections, size_t size,
                               uint64_t messages) {
        EXPECT_TRUE(report.ok()) << report.firstError;
        EXPECT_EQ(report.connected, connections);
        EXPECT_EQ(report.failedConnections, 0u);
        EXPECT_EQ(report.messages, connections * messages);
        EXPECT_EQ(report.totalMessages, connections * messages);
        EXPECT_EQ(report.latency.count(), report.messages);
        const uint64_t p50 = report.latency.percentile(0.5);
        const uint64_t p99 = report.latency.percentile(0.99);
        const uint64_t p999 = report.latency.percentile(0.999);
        EXPECT_GT(p50, 0u);
        EXPECT_LE(p50, p99);
        EXPECT_LE(p99, p999);
        EXPECT_LE(p999, report.latency.max());
        EXPECT_GT(report.seconds, 0.0);
        EXPECT_GT(report.messagesPerSecond(), 0.0);
        // The server saw every connection, and echoed exactly what the client sent and checked.
        EXPECT_EQ(stats.accepted, connections);
        EXPECT_EQ(stats.closed, connections);
        EXPECT_EQ(stats.bytesEchoed, connections * messages * size);
        EXPECT_EQ(stats.connectionErrors, 0u);
        EXPECT_EQ(stats.acceptErrors, 0u);
    }

    // 64-byte messages and ones of kMaxMessageSize on four connections each, then stops the server:
    // every byte came back, and the server counted exactly those.
    void expectSmallAndLargeEchoed(EchoServer& server) {
        const uint64_t messages = kSanitized ? 20 : 200;
        auto small = runClient(*clientRt_, countedLoad(server, 4, 64, messages));
        ASSERT_TRUE(small) << small.error().message();
        auto large = runClient(*clientRt_, countedLoad(server, 4, kMaxMessageSize, messages / 10));
        ASSERT_TRUE(large) << large.error().message();
        server.stop();
        EXPECT_TRUE(small->ok()) << small->firstError;
        EXPECT_TRUE(large->ok()) << large->firstError;
        EXPECT_EQ(small->messages, 4 * messages);
        EXPECT_EQ(large->messages, 4 * (messages / 10));
        EXPECT_EQ(server.stats().bytesEchoed, small->messages * 64 + large->messages * kMaxMessageSize);
        EXPECT_EQ(server.stats().connectionErrors, 0u);
    }

    std::optional<Runtime> serverRt_;
    std::optional<Runtime> clientRt_;
};

TEST_F(EchoTest, EchoesEveryByteOverSeveralConnections) {
    auto server = startServer();
    ASSERT_NE(server, nullptr);
    EXPECT_EQ(server->listenerCount(), serverRt_->carrierCount());
    const unsigned connections = 8;
    const uint64_t messages = kSanitized ? 50 : 500;
    auto report = runClient(*clientRt_, countedLoad(*server, connections, 64, messages));
    ASSERT_TRUE(report) << report.error().message();
    server->stop();  // waits for every connection fiber, so the counts below are final
    expectCleanRun(*report, server->stats(), connections, 64, messages);
}

// send(2) first, the ring for the rest: with messages larger than the socket takes at once (64 KiB
// through a 4 KiB buffer, and small ones), both halves of the path run.
TEST_F(EchoTest, InlineSendEchoesEveryByte) {
    auto server = startServer(/*reusePort=*/true, /*bufferSize=*/4096, /*inlineSend=*/true);
    ASSERT_NE(server, nullptr);
    expectSmallAndLargeEchoed(*server);
}

// Every send waited for (--wait-send) rather than posted, small messages and ones larger than a
// provided buffer.
TEST_F(EchoTest, WaitedSendsEchoEveryByte) {
    auto server = startServer(/*reusePort=*/true, /*bufferSize=*/4096, /*inlineSend=*/false, /*multishotRecv=*/true,
                              /*providedBuffers=*/1024, /*postedSend=*/false);
    ASSERT_NE(server, nullptr);
    expectSmallAndLargeEchoed(*server);
}

// One receive per message into the connection's own buffer (--no-multishot-recv), small messages and
// ones larger than that buffer.
TEST_F(EchoTest, OneReceivePerMessageEchoesEveryByte) {
    auto server = startServer(/*reusePort=*/true, /*bufferSize=*/4096, /*inlineSend=*/false, /*multishotRecv=*/false);
    ASSERT_NE(server, nullptr);
    expectSmallAndLargeEchoed(*server);
}

// Two provided buffers per carrier for eight connections of 64 KiB messages: the rings run dry all
// the time, each multishot receive ends with ENOBUFS and falls back once, and not a byte is lost.
TEST_F(EchoTest, AFewProvidedBuffersForManyConnectionsLoseNothing) {
    auto server = startServer(/*reusePort=*/true, 16 * 1024, /*inlineSend=*/false, /*multishotRecv=*/true,
                              /*providedBuffers=*/2);
    ASSERT_NE(server, nullptr);
    const unsigned connections = 8;
    const uint64_t messages = kSanitized ? 3 : 30;
    auto report = runClient(*clientRt_, countedLoad(*server, connections, kMaxMessageSize, messages));
    ASSERT_TRUE(report) << report.error().message();
    server->stop();
    expectCleanRun(*report, server->stats(), connections, kMaxMessageSize, messages);
    EXPECT_GT(server->stats().ringExhausted, 0u) << "the rings never ran dry: the fallback went untested";
}

TEST_F(EchoTest, SingleListenerDealsConnectionsToEveryCarrier) {
    auto server = startServer(/*reusePort=*/false);
    ASSERT_NE(server, nullptr);
    EXPECT_EQ(server->listenerCount(), 1u);
    const unsigned connections = 6;
    const uint64_t messages = kSanitized ? 30 : 300;
    auto report = runClient(*clientRt_, countedLoad(*server, connections, 100, messages));
    ASSERT_TRUE(report) << report.error().message();
    server->stop();
    expectCleanRun(*report, server->stats(), connections, 100, messages);
}

// One byte, and the largest message: 64 KiB crosses the server's small buffer in many receives and
// comes back in pieces that readExact must put together.
TEST_F(EchoTest, SmallestAndLargestMessagesComeBackWhole) {
    auto server = startServer(/*reusePort=*/true, /*bufferSize=*/4096);
    ASSERT_NE(server, nullptr);
    auto tiny = runClient(*clientRt_, countedLoad(*server, 3, 1, 100));
    ASSERT_TRUE(tiny) << tiny.error().message();
    auto large = runClient(*clientRt_, countedLoad(*server, 3, kMaxMessageSize, kSanitized ? 5 : 40));
    ASSERT_TRUE(large) << large.error().message();
    server->stop();
    EXPECT_TRUE(tiny->ok()) << tiny->firstError;
    EXPECT_TRUE(large->ok()) << large->firstError;
    EXPECT_EQ(tiny->messages, 300u);
    EXPECT_EQ(large->messages, 3u * (kSanitized ? 5 : 40));
    const ServerStats stats = server->stats();
    EXPECT_EQ(stats.accepted, 6u);
    EXPECT_EQ(stats.bytesEchoed, 300u + large->messages * kMaxMessageSize);
}

TEST_F(EchoTest, RejectsOptionsOutOfRange) {
    ClientOptions options;
    options.connections = 0;
    EXPECT_EQ(runClient(*clientRt_, options).errorCode(), EINVAL);
    options.connections = 1;
    options.messageSize = kMaxMessageSize + 1;
    EXPECT_EQ(runClient(*clientRt_, options).errorCode(), EINVAL);
    options.messageSize = 0;
    EXPECT_EQ(runClient(*clientRt_, options).errorCode(), EINVAL);
}

// A port that is bound but not listening answers every SYN with a reset: each connection is refused,
// counted as such, and the run is not ok.
TEST_F(EchoTest, RefusedConnectionsAreCountedAndFailTheRun) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(fd, 0);
    const net::SocketAddress any = net::SocketAddress::ipv4Loopback(0);
    ASSERT_EQ(::bind(fd, any.data(), any.size()), 0);
    net::SocketAddress bound;
    socklen_t len = net::SocketAddress::capacity();
    ASSERT_EQ(::getsockname(fd, bound.data(), &len), 0);
    bound.setSize(len);
    ClientOptions options;
    options.address = bound;
    options.connections = 4;
    options.messagesPerConnection = 10;
    auto report = runClient(*clientRt_, options);
    ::close(fd);
    ASSERT_TRUE(report) << report.error().message();
    EXPECT_FALSE(report->ok());
    EXPECT_EQ(report->connected, 0u);
    EXPECT_EQ(report->refused, 4u);
    EXPECT_EQ(report->failedConnections, 4u);
    EXPECT_EQ(report->messages, 0u);
    EXPECT_FALSE(report->firstError.empty());
    EXPECT_NE(formatReport(*report).find("refused=4"), std::string::npos);
    EXPECT_NE(formatReportJson(*report).find("\"refused\":4"), std::string::npos);
}

// The client's --json report stays valid JSON whatever its first error says (a peer's or the kernel's
// words): quotes, backslashes and control bytes come back as they went in.
TEST(EchoReport, JsonIsValidForAnyFirstError) {
    ClientReport report;
    report.connections = 2;
    report.connected = 1;
    report.failedConnections = 1;
    report.otherErrors = 1;
    report.seconds = 1.5;
    report.firstError = "a \"quoted\" back\\slash\tand\nnewline";
    const std::string text = formatReportJson(report);
    const auto json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    ASSERT_TRUE(json.is_object()) << text;
    EXPECT_EQ(json.value("first_error", ""), report.firstError);
    EXPECT_EQ(json.value("connections", 0u), 2u);
    EXPECT_EQ(json.value("duration_s", 0.0), 1.5);
    ASSERT_TRUE(json.contains("errors") && json["errors"].is_object());
    EXPECT_EQ(json["errors"].value("other", 0u), 1u);
    ASSERT_TRUE(json.contains("lat_us") && json["lat_us"].is_object());
    EXPECT_TRUE(json["lat_us"]["p99"].is_number());
}

// Waits (with no time limit of its own: ctest's timeout is the backstop) until the server has accepted
// `connections`; the client's fibers ping-pong from their connect on.
void awaitConnections(const EchoServer& server, unsigned connections) {
    while (server.stats().accepted < connections) { std::this_thread::sleep_for(1ms); }
}

// stop() while clients are mid-run: it returns, every server fiber is gone, and each client
// connection sees the stream end early (an error of the run, not a hang).
TEST_F(EchoTest, StopWhileClientsAreConnectedEndsCleanly) {
    auto server = startServer();
    ASSERT_NE(server, nullptr);
    const unsigned connections = 5;
    ClientOptions options = countedLoad(*server, connections, 64, /*messages=*/uint64_t{1} << 40);
    std::optional<Result<ClientReport>> report;
    std::thread client([&] { report.emplace(runClient(*clientRt_, options)); });
    awaitConnections(*server, connections);
    server->stop();
    EXPECT_EQ(settledLiveFibers(*serverRt_), 0u);
    client.join();
    ASSERT_TRUE(report.has_value());
    ASSERT_TRUE(*report) << report->error().message();
    const ClientReport& r = **report;
    EXPECT_FALSE(r.ok());
    EXPECT_EQ(r.connected, connections);
    EXPECT_EQ(r.failedConnections, connections);
    EXPECT_EQ(r.earlyCloses, connections) << r.firstError;
    EXPECT_EQ(server->stats().closed, connections);
    EXPECT_EQ(server->stats().connectionErrors, 0u);
}

// The daemon's other way down: the runtime shuts down under a running server (every call returns
// ECANCELED); the server's fibers end by themselves and stop() then only waits.
TEST_F(EchoTest, RuntimeShutdownEndsTheServerFibers) {
    auto server = startServer();
    ASSERT_NE(server, nullptr);
    const unsigned connections = 3;
    ClientOptions options = countedLoad(*server, connections, 64, /*messages=*/uint64_t{1} << 40);
    std::optional<Result<ClientReport>> report;
    std::thread client([&] { report.emplace(runClient(*clientRt_, options)); });
    awaitConnections(*server, connections);
    serverRt_->shutdown();
    serverRt_->join();
    server->stop();
    client.join();
    ASSERT_TRUE(report.has_value() && *report);
    EXPECT_EQ((**report).failedConnections, connections);
    EXPECT_EQ((**report).earlyCloses, connections) << (**report).firstError;
    EXPECT_EQ(server->stats().closed, connections);
    server.reset();
    serverRt_.reset();  // TearDown has nothing left to check on it
}

}  // namespace
}  // namespace spindle::echo
