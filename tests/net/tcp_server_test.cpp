// SPDX-License-Identifier: Apache-2.0
// net::TcpServer over loopback: a handler per connection on every carrier, exclusive ports (EADDRINUSE
// for a second server unless sharing is asked for), one listener dealt round robin, and the drain
// (idle connections at once, busy ones allowed to finish, then cut after drainTimeout).
#include "net/tcp_server.h"

#include <gtest/gtest.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <set>
#include <string>
#include <thread>

#include "core/io.h"
#include "tests/core/with_runtime.h"

namespace spindle::net {
namespace {

using namespace std::chrono_literals;
using testing_support::WithRuntime;

class TcpServerTest : public WithRuntime {};

// Echoes lines of one byte until end of stream, marking itself idle while it waits.
void echoBytes(TcpConnection& c) noexcept {
    char ch = 0;
    for (;;) {
        c.setIdle(true);
        auto n = c.stream().recv(&ch, 1, 5s);
        c.setIdle(false);
        if (!n || *n == 0) { return; }
        if (!c.stream().writeAll(&ch, 1, 5s)) { return; }
    }
}

TEST_F(TcpServerTest, ServesConnectionsOnEveryCarrierAndCountsThem) {
    std::atomic<unsigned> carriersSeen{0};
    auto server = TcpServer::start(rt(), TcpServerOptions{}, [&](TcpConnection& c) noexcept {
        carriersSeen.fetch_or(1u << c.carrier());
        echoBytes(c);
    });
    ASSERT_TRUE(server) << server.error().message();
    EXPECT_EQ((*server)->listenerCount(), rt().carrierCount());
    const SocketAddress addr = (*server)->localAddress();
    EXPECT_NE(addr.port(), 0);
    onFiber([&] {
        for (int i = 0; i < 8; ++i) {
            auto s = TcpStream::connect(addr, 5s);
            ASSERT_TRUE(s) << s.error().message();
            char out = static_cast<char>('a' + i), in = 0;
            ASSERT_TRUE(s->writeAll(&out, 1, 5s));
            ASSERT_TRUE(s->readExact(&in, 1, 5s));
            EXPECT_EQ(in, out);
        }
    });
    (*server)->stop();
    (*server)->wait();
    const TcpServerStats st = (*server)->stats();
    EXPECT_EQ(st.accepted, 8u);
    EXPECT_EQ(st.closed, 8u);
    EXPECT_EQ(st.active, 0u);
    EXPECT_NE(carriersSeen.load(), 0u);
}

TEST_F(TcpServerTest, SecondServerOnABusyPortFailsWithEaddrinuse) {
    auto first = TcpServer::start(rt(), TcpServerOptions{}, echoBytes);
    ASSERT_TRUE(first) << first.error().message();
    TcpServerOptions again;
    again.address = (*first)->localAddress();
    for (bool perCarrier : {true, false}) {
        again.listenerPerCarrier = perCarrier;
        auto second = TcpServer::start(rt(), again, echoBytes);
        ASSERT_FALSE(second);
        EXPECT_EQ(second.errorCode(), EADDRINUSE);
    }
    // A foreign socket without SO_REUSEPORT is refused too: the first server holds the port alone.
    auto plain = TcpListener::bind(again.address, ListenOptions{.reusePort = false});
    ASSERT_FALSE(plain);
    EXPECT_EQ(plain.errorCode(), EADDRINUSE);
}

TEST_F(TcpServerTest, SharingIsAllowedWhenBothAskForIt) {
    TcpServerOptions shared;
    shared.shareAddress = true;
    auto first = TcpServer::start(rt(), shared, echoBytes);
    ASSERT_TRUE(first) << first.error().message();
    shared.address = (*first)->localAddress();
    auto second = TcpServer::start(rt(), shared, echoBytes);
    ASSERT_TRUE(second) << second.error().message();
    EXPECT_EQ((*second)->localAddress().port(), shared.address.port());
    // An exclusive server cannot join a shared port either.
    TcpServerOptions exclusive;
    exclusive.address = shared.address;
    auto third = TcpServer::start(rt(), exclusive, echoBytes);
    ASSERT_FALSE(third);
    EXPECT_EQ(third.errorCode(), EADDRINUSE);
}

TEST_F(TcpServerTest, OneListenerDealsConnectionsToEveryCarrier) {
    std::atomic<unsigned> carriersSeen{0};
    TcpServerOptions o;
    o.listenerPerCarrier = false;
    auto server = TcpServer::start(rt(), o, [&](TcpConnection& c) noexcept {
        carriersSeen.fetch_or(1u << c.carrier());
        echoBytes(c);
    });
    ASSERT_TRUE(server) << server.error().message();
    EXPECT_EQ((*server)->listenerCount(), 1u);
    onFiber([&] {
        for (unsigned i = 0; i < 2 * rt().carrierCount(); ++i) {
            auto s = TcpStream::connect((*server)->localAddress(), 5s);
            ASSERT_TRUE(s) << s.error().message();
            char ch = 'x';
            ASSERT_TRUE(s->writeAll(&ch, 1, 5s));
            ASSERT_TRUE(s->readExact(&ch, 1, 5s));
        }
    });
    EXPECT_EQ(carriersSeen.load(), (1u << rt().carrierCount()) - 1);
}

TEST_F(TcpServerTest, DrainClosesIdleAtOnceAndLetsBusyFinishUntilTheTimeout) {
    TcpServerOptions o;
    o.drainTimeout = 300ms;
    std::atomic<int> busyStarted{0};
    std::atomic<bool> sawDraining{false};
    auto server = TcpServer::start(rt(), o, [&](TcpConnection& c) noexcept {
        char ch = 0;
        c.setIdle(true);
        auto n = c.stream().recv(&ch, 1, 5s);
        c.setIdle(false);
        if (!n || *n == 0) { return; }
        if (ch == 'b') {  // busy: works until the drain, then finishes its answer
            busyStarted.fetch_add(1);
            while (!c.draining()) { (void)spindle::sleep(1ms); }
            sawDraining = true;
            (void)c.stream().writeAll("done", 4, 5s);
        } else if (ch == 's') {  // stuck: ignores the drain and waits for bytes that never come
            busyStarted.fetch_add(1);
            (void)c.stream().recv(&ch, 1, 10s);
        }
    });
    ASSERT_TRUE(server) << server.error().message();
    const SocketAddress addr = (*server)->localAddress();
    onFiber([&] {
        auto idle = TcpStream::connect(addr, 5s);
        auto busy = TcpStream::connect(addr, 5s);
        auto stuck = TcpStream::connect(addr, 5s);
        ASSERT_TRUE(idle && busy && stuck);
        ASSERT_TRUE(busy->writeAll("b", 1, 5s));
        ASSERT_TRUE(stuck->writeAll("s", 1, 5s));
        while (busyStarted.load() < 2 || (*server)->stats().accepted < 3) { (void)spindle::sleep(1ms); }
        const auto t0 = std::chrono::steady_clock::now();
        (*server)->stop();
        char buf[4];
        // The idle connection sees end of stream at once.
        auto n = idle->recv(buf, sizeof buf, 2s);
        ASSERT_TRUE(n) << n.error().message();
        EXPECT_EQ(*n, 0u);
        EXPECT_LT(std::chrono::steady_clock::now() - t0, 250ms);
        // The busy one gets its answer.
        ASSERT_TRUE(busy->readExact(buf, 4, 2s));
        EXPECT_EQ(std::string(buf, 4), "done");
        // The stuck one is cut after the drain timeout.
        n = stuck->recv(buf, sizeof buf, 3s);
        ASSERT_TRUE(n) << n.error().message();
        EXPECT_EQ(*n, 0u);
        EXPECT_GE(std::chrono::steady_clock::now() - t0, 250ms);
        // Nobody is accepted any more.
        auto late = TcpStream::connect(addr, 2s);
        EXPECT_FALSE(late);
    });
    (*server)->wait();
    EXPECT_TRUE(sawDraining.load());
    const TcpServerStats st = (*server)->stats();
    EXPECT_EQ(st.accepted, 3u);
    EXPECT_EQ(st.closed, 3u);
    EXPECT_EQ(st.drainClosed, 2u);  // the idle one, and the stuck one after the timeout
}

TEST_F(TcpServerTest, RejectsBadOptions) {
    EXPECT_EQ(TcpServer::start(rt(), TcpServerOptions{}, nullptr).errorCode(), EINVAL);
    TcpServerOptions o;
    o.acceptBackoffMin = 100ms;
    o.acceptBackoffMax = 10ms;
    EXPECT_EQ(TcpServer::start(rt(), o, echoBytes).errorCode(), EINVAL);
    o = TcpServerOptions{};
    o.backlog = 0;
    EXPECT_EQ(TcpServer::start(rt(), o, echoBytes).errorCode(), EINVAL);
}

}  // namespace
}  // namespace spindle::net
