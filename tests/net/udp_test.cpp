// SPDX-License-Identifier: Apache-2.0
// UdpSocket over loopback: sendTo/recvFrom, connected send/recv, sendMsg/recvMsg with truncation,
// deadlines, and bad arguments.
#include "net/udp.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <string>

#include "tests/core/with_runtime.h"

namespace spindle::net {
namespace {

using namespace std::chrono_literals;

class Udp : public testing_support::WithRuntime {};

TEST_F(Udp, DatagramsBothWaysWithTheirSource) {
    onFiber([] {
        auto a = UdpSocket::bind(SocketAddress::ipv4Loopback(0));
        auto b = UdpSocket::bind(SocketAddress::ipv4Loopback(0));
        ASSERT_TRUE(a && b);
        const SocketAddress aAddr = *a->localAddress();
        const SocketAddress bAddr = *b->localAddress();
        ASSERT_TRUE(a->sendTo("ping", 4, bAddr, 5s));
        char buf[16];
        SocketAddress from;
        auto n = b->recvFrom(buf, sizeof(buf), &from, 5s);
        ASSERT_TRUE(n);
        EXPECT_EQ(std::string(buf, *n), "ping");
        EXPECT_EQ(from, aAddr);
        ASSERT_TRUE(b->sendTo("pong", 4, from, 5s));
        n = a->recvFrom(buf, sizeof(buf), nullptr, 5s);
        ASSERT_TRUE(n);
        EXPECT_EQ(std::string(buf, *n), "pong");
    });
}

TEST_F(Udp, ConnectedSocketsAndMessagesWithTruncation) {
    onFiber([] {
        auto a = UdpSocket::bind(SocketAddress::ipv4Loopback(0));
        auto b = UdpSocket::bind(SocketAddress::ipv4Loopback(0));
        ASSERT_TRUE(a && b);
        ASSERT_TRUE(a->connect(*b->localAddress()));
        ASSERT_TRUE(a->send("0123456789", 10, 5s));
        // recvMsg into a 4-byte buffer: the datagram is cut and MSG_TRUNC says so.
        char small[4];
        iovec iov{small, sizeof(small)};
        msghdr msg{};
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        auto n = b->recvMsg(&msg, 0, 5s);
        ASSERT_TRUE(n);
        EXPECT_EQ(*n, 4u);
        EXPECT_NE(msg.msg_flags & MSG_TRUNC, 0);
        EXPECT_EQ(std::string(small, 4), "0123");
        // sendMsg with two buffers makes one datagram.
        iovec parts[2] = {{const_cast<char*>("ab"), 2}, {const_cast<char*>("cd"), 2}};
        msghdr out{};
        out.msg_iov = parts;
        out.msg_iovlen = 2;
        ASSERT_TRUE(a->sendMsg(&out, 0, 5s));
        char buf[8];
        auto m = b->recv(buf, sizeof(buf), 5s);
        ASSERT_TRUE(m);
        EXPECT_EQ(std::string(buf, *m), "abcd");
    });
}

TEST_F(Udp, ReceiveTimesOutAndErrorsAreReported) {
    onFiber([] {
        auto a = UdpSocket::bind(SocketAddress::ipv4Loopback(0));
        ASSERT_TRUE(a);
        char b;
        auto r = a->recv(&b, 1, 20ms);
        ASSERT_FALSE(r);
        EXPECT_EQ(r.errorCode(), ETIMEDOUT);
        EXPECT_EQ(UdpSocket::bind(SocketAddress{}).errorCode(), EINVAL);
        EXPECT_EQ(UdpSocket::open(AF_UNIX).errorCode(), EAFNOSUPPORT);
        EXPECT_EQ(a->sendMsg(nullptr).errorCode(), EFAULT);
        // An IPv6 destination from an IPv4 socket.
        auto wrong = a->sendTo("x", 1, SocketAddress::ipv6Loopback(9), 5s);
        ASSERT_FALSE(wrong);
        EXPECT_TRUE(wrong.errorCode() == EAFNOSUPPORT || wrong.errorCode() == EINVAL) << wrong.error().message();
        // A connected socket learns of an ICMP port unreachable as ECONNREFUSED.
        uint16_t deadPort = 0;
        {
            auto tmp = UdpSocket::bind(SocketAddress::ipv4Loopback(0));
            deadPort = tmp->localAddress()->port();
        }
        ASSERT_TRUE(a->connect(SocketAddress::ipv4Loopback(deadPort)));
        ASSERT_TRUE(a->send("x", 1, 5s));
        auto refused = a->recv(&b, 1, 5s);
        ASSERT_FALSE(refused);
        EXPECT_EQ(refused.errorCode(), ECONNREFUSED);
        ASSERT_TRUE(a->close());
        EXPECT_EQ(a->recv(&b, 1).errorCode(), EBADF);
        EXPECT_TRUE(a->close());
    });
}

}  // namespace
}  // namespace spindle::net
