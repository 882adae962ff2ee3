// SPDX-License-Identifier: Apache-2.0
// SocketAddress: parsing and printing of IPv4, IPv6 and Unix addresses, and the errors for bad text.
#include "net/address.h"

#include <gtest/gtest.h>
#include <netinet/in.h>

#include <string>

namespace spindle::net {
namespace {

TEST(SocketAddress, ParsesAndPrintsEachFamilyRoundTrip) {
    for (const char* text : {"127.0.0.1:8080", "0.0.0.0:0", "255.255.255.255:65535", "[::1]:80", "[::]:443",
                             "[2001:db8::1]:9000", "[::ffff:10.0.0.1]:1", "unix:/tmp/spindle.sock", "unix:@abstract-name"}) {
        auto a = SocketAddress::parse(text);
        ASSERT_TRUE(a) << text << ": " << SocketAddress::parseError(text);
        EXPECT_EQ(a->toString(), text);
        auto again = SocketAddress::parse(a->toString());
        ASSERT_TRUE(again);
        EXPECT_EQ(*again, *a);
        EXPECT_EQ(SocketAddress::parseError(text), "");
    }
}

TEST(SocketAddress, FamiliesPortsAndSizes) {
    auto v4 = SocketAddress::parse("10.1.2.3:7000");
    ASSERT_TRUE(v4);
    EXPECT_EQ(v4->family(), AF_INET);
    EXPECT_EQ(v4->port(), 7000);
    EXPECT_EQ(v4->size(), sizeof(sockaddr_in));
    v4->setPort(7001);
    EXPECT_EQ(v4->toString(), "10.1.2.3:7001");
    auto v6 = SocketAddress::parse("::1", 53);
    ASSERT_TRUE(v6);
    EXPECT_EQ(v6->family(), AF_INET6);
    EXPECT_EQ(v6->toString(), "[::1]:53");
    EXPECT_EQ(SocketAddress::ipv4Any(1).toString(), "0.0.0.0:1");
    EXPECT_EQ(SocketAddress::ipv4Loopback(2).toString(), "127.0.0.1:2");
    EXPECT_EQ(SocketAddress::ipv6Any(3).toString(), "[::]:3");
    EXPECT_EQ(SocketAddress::ipv6Loopback(4).toString(), "[::1]:4");
    auto u = SocketAddress::parse("unix:/run/x");
    ASSERT_TRUE(u);
    EXPECT_EQ(u->family(), AF_UNIX);
    EXPECT_EQ(u->port(), 0);
    EXPECT_FALSE(u->isIp());
    EXPECT_EQ(SocketAddress{}.toString(), "unspecified");
    EXPECT_EQ(SocketAddress{}.family(), AF_UNSPEC);
    EXPECT_NE(*SocketAddress::parse("1.2.3.4:5"), *SocketAddress::parse("1.2.3.4:6"));
}

TEST(SocketAddress, ScopedIpv6ByNumberAndByInterfaceName) {
    auto n = SocketAddress::parse("[fe80::1%1]:80");
    ASSERT_TRUE(n);
    EXPECT_EQ(n->toString(), "[fe80::1%lo]:80");  // interface 1 is the loopback on Linux
    auto lo = SocketAddress::parse("[fe80::1%lo]:80");
    ASSERT_TRUE(lo);
    EXPECT_EQ(*lo, *n);
    EXPECT_EQ(SocketAddress::parse("[fe80::1%no-such-if0]:80").errorCode(), EINVAL);
    EXPECT_EQ(SocketAddress::parse("[fe80::1%]:80").errorCode(), EINVAL);
}

TEST(SocketAddress, BadTextIsRejectedWithAReason) {
    struct Case {
        const char* text;
        const char* reasonContains;
    };
    for (const Case& c : {Case{"", "no port"}, Case{"127.0.0.1", "no port"}, Case{"127.0.0.1:", "bad port"},
                          Case{"127.0.0.1:65536", "bad port"}, Case{"127.0.0.1:-1", "bad port"},
                          Case{"127.0.0.1:80x", "bad port"}, Case{"127.0.0.1:123456", "bad port"},
                          Case{"256.0.0.1:80", "bad host"}, Case{"1.2.3:80", "bad host"},
                          Case{"localhost:80", "bad host"}, Case{":80", "bad host"}, Case{"::1:80", "brackets"},
                          Case{"[::1:80", "closing"}, Case{"[::1]80", "port must follow"}, Case{"[::1]", "port must follow"},
                          Case{"[::g]:80", "bad host"}, Case{"unix:", "empty"}}) {
        auto a = SocketAddress::parse(c.text);
        EXPECT_FALSE(a) << c.text;
        if (!a) { EXPECT_EQ(a.errorCode(), EINVAL) << c.text; }
        const std::string why = SocketAddress::parseError(c.text);
        EXPECT_NE(why.find(c.reasonContains), std::string::npos) << c.text << " -> " << why;
    }
    const std::string longPath = "unix:/" + std::string(200, 'x');
    EXPECT_EQ(SocketAddress::parse(longPath).errorCode(), ENAMETOOLONG);
    EXPECT_NE(SocketAddress::parseError(longPath).find("107"), std::string::npos);
    EXPECT_EQ(SocketAddress::parse("", 80).errorCode(), EINVAL);
    EXPECT_EQ(SocketAddress::unixPath("").errorCode(), EINVAL);
}

TEST(SocketAddress, FromSockaddrChecksFamilyAndLength) {
    const SocketAddress v4 = SocketAddress::ipv4Loopback(9);
    auto copy = SocketAddress::fromSockaddr(v4.data(), v4.size());
    ASSERT_TRUE(copy);
    EXPECT_EQ(*copy, v4);
    EXPECT_EQ(SocketAddress::fromSockaddr(v4.data(), 4).errorCode(), EINVAL);
    EXPECT_EQ(SocketAddress::fromSockaddr(nullptr, 16).errorCode(), EINVAL);
    sockaddr bogus{};
    bogus.sa_family = AF_APPLETALK;
    EXPECT_EQ(SocketAddress::fromSockaddr(&bogus, sizeof(bogus)).errorCode(), EAFNOSUPPORT);
}

}  // namespace
}  // namespace spindle::net
