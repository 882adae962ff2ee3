// SPDX-License-Identifier: Apache-2.0
// The stack's wire formats (net/dpdk/packet.h), without EAL: frames built by the builders parse back
// to what was put in; every kind of bad frame is dropped with its reason; no prefix of a valid frame
// is read past its end (ASan) or taken for a whole one.
#include "net/dpdk/packet.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

namespace spindle::dpdk {
namespace {

uint32_t ip(const char* dotted) {
    in_addr a{};
    EXPECT_EQ(inet_pton(AF_INET, dotted, &a), 1);
    return a.s_addr;
}

const InterfaceAddress kUs{{0x02, 0, 0, 0, 0, 0x01}, ip("198.18.0.1")};
const InterfaceAddress kPeer{{0x02, 0, 0, 0, 0, 0x02}, ip("198.18.0.2")};

std::vector<uint8_t> udpFrame(const std::string& payload, const InterfaceAddress& from = kPeer,
                              const InterfaceAddress& to = kUs, bool checksum = true) {
    std::vector<uint8_t> f(kUdpFrameHeaders + payload.size());
    std::memcpy(f.data() + kUdpFrameHeaders, payload.data(), payload.size());
    const size_t n = buildUdpHeaders(f, from, to.mac, to.ip, 40000, 7, payload.size(), 1,
                                     checksum ? UdpChecksum::kCompute : UdpChecksum::kNone);
    EXPECT_EQ(n, f.size());
    return f;
}

// Recomputes the IPv4 header checksum after a test changed the header.
void fixIpChecksum(std::vector<uint8_t>& f) {
    uint8_t* h = f.data() + kEthernetHeader;
    const size_t ihl = static_cast<size_t>(h[0] & 0x0f) * 4;
    h[10] = h[11] = 0;
    const uint16_t c = checksumFinish(checksumAdd(0, {h, ihl}));
    h[10] = static_cast<uint8_t>(c >> 8);
    h[11] = static_cast<uint8_t>(c);
}

TEST(DpdkPacket, AUdpDatagramParsesBackWithItsAddressesPortsAndPayload) {
    for (const bool checksum : {true, false}) {
        const auto f = udpFrame("hello, bypass", kPeer, kUs, checksum);
        const ParsedFrame p = parseFrame(f, kUs);
        ASSERT_EQ(p.kind, FrameKind::kUdp) << dropReasonName(p.reason);
        EXPECT_EQ(p.srcMac, kPeer.mac);
        EXPECT_EQ(p.srcIp, kPeer.ip);
        EXPECT_EQ(p.dstIp, kUs.ip);
        EXPECT_EQ(p.srcPort, 40000);
        EXPECT_EQ(p.dstPort, 7);
        EXPECT_EQ(std::string(reinterpret_cast<const char*>(f.data() + p.payloadOffset), p.payloadLength),
                  "hello, bypass");
    }
    // Padding after the datagram (Ethernet's 60-byte minimum) is not payload.
    auto padded = udpFrame("x");
    padded.resize(60, 0);
    const ParsedFrame p = parseFrame(padded, kUs);
    ASSERT_EQ(p.kind, FrameKind::kUdp);
    EXPECT_EQ(p.payloadLength, 1);
}

TEST(DpdkPacket, ArpRequestsForUsAreAnsweredAndRepliesLearned) {
    std::vector<uint8_t> req(64);
    ASSERT_EQ(buildArpRequest(req, kPeer, kUs.ip), 42u);
    req.resize(42);
    ParsedFrame p = parseFrame(req, kUs);
    ASSERT_EQ(p.kind, FrameKind::kArpRequest);
    EXPECT_EQ(p.srcMac, kPeer.mac);
    EXPECT_EQ(p.srcIp, kPeer.ip);
    // For another address: not ours to answer.
    InterfaceAddress other = kUs;
    other.ip = ip("198.18.0.9");
    EXPECT_EQ(parseFrame(req, other).reason, DropReason::kNotForUs);

    std::vector<uint8_t> reply(42);
    ASSERT_EQ(buildArpReply(reply, kUs, p), 42u);
    const ParsedFrame r = parseFrame(reply, kPeer);
    ASSERT_EQ(r.kind, FrameKind::kArpReply);
    EXPECT_EQ(r.srcMac, kUs.mac);
    EXPECT_EQ(r.srcIp, kUs.ip);
    EXPECT_EQ(r.dstIp, kPeer.ip);
}

TEST(DpdkPacket, AnEchoRequestGetsAReplyWithItsIdentifierSequenceAndData) {
    // An echo request built by hand: id 0x1234, sequence 7, 16 bytes of data.
    std::vector<uint8_t> f(kEthernetHeader + kIpv4Header + 24);
    auto u = udpFrame(std::string(16, 'd'));  // borrow Ethernet + IP, then make it ICMP
    std::memcpy(f.data(), u.data(), kEthernetHeader + kIpv4Header);
    uint8_t* h = f.data() + kEthernetHeader;
    h[9] = 1;
    h[2] = 0;
    h[3] = static_cast<uint8_t>(kIpv4Header + 24);
    uint8_t* icmp = h + kIpv4Header;
    icmp[0] = 8;
    icmp[1] = 0;
    icmp[4] = 0x12;
    icmp[5] = 0x34;
    icmp[6] = 0;
    icmp[7] = 7;
    std::memset(icmp + 8, 'd', 16);
    const uint16_t c = checksumFinish(checksumAdd(0, {icmp, 24}));
    icmp[2] = static_cast<uint8_t>(c >> 8);
    icmp[3] = static_cast<uint8_t>(c);
    std::vector<uint8_t> fv(f.begin(), f.end());
    fixIpChecksum(fv);
    const ParsedFrame p = parseFrame(fv, kUs);
    ASSERT_EQ(p.kind, FrameKind::kIcmpEcho) << dropReasonName(p.reason);

    std::vector<uint8_t> reply(fv.size());
    ASSERT_EQ(buildEchoReply(reply, fv, p, kUs), fv.size());
    // At the peer: valid (checksums right), an ICMP type (0) it does not serve.
    EXPECT_EQ(parseFrame(reply, kPeer).reason, DropReason::kUnsupported);
    const uint8_t* r = reply.data() + kEthernetHeader + kIpv4Header;
    EXPECT_EQ(r[0], 0);
    EXPECT_EQ(r[4], 0x12);
    EXPECT_EQ(r[7], 7);
    EXPECT_EQ(std::memcmp(r + 8, icmp + 8, 16), 0);
    // In place, as the stack answers (the reply overwrites the request's mbuf).
    std::vector<uint8_t> same = fv;
    ASSERT_EQ(buildEchoReply(same, same, p, kUs), fv.size());
    EXPECT_EQ(same, reply);
}

TEST(DpdkPacket, BadFramesAreDroppedWithTheirReason) {
    const auto good = udpFrame("payload");
    auto withIpByte = [&](size_t at, uint8_t v, bool fix) {
        auto f = good;
        f[kEthernetHeader + at] = v;
        if (fix) { fixIpChecksum(f); }
        return parseFrame(f, kUs).reason;
    };
    EXPECT_EQ(withIpByte(10, static_cast<uint8_t>(good[kEthernetHeader + 10] ^ 1), false), DropReason::kBadChecksum);
    EXPECT_EQ(withIpByte(0, 0x65, true), DropReason::kMalformed);  // version 6
    EXPECT_EQ(withIpByte(0, 0x44, true), DropReason::kMalformed);  // header shorter than 20
    EXPECT_EQ(withIpByte(6, 0x20, true), DropReason::kFragment);   // MF
    EXPECT_EQ(withIpByte(7, 0x08, true), DropReason::kFragment);   // an offset
    EXPECT_EQ(withIpByte(9, 6, true), DropReason::kUnsupported);   // TCP
    EXPECT_EQ(withIpByte(3, 0xff, true), DropReason::kTruncated);  // states more than arrived

    auto f = good;
    f.back() ^= 0x55;  // payload changed under its checksum
    EXPECT_EQ(parseFrame(f, kUs).reason, DropReason::kBadChecksum);

    f = good;  // UDP length one short of what IP says
    f[kEthernetHeader + kIpv4Header + 5] = static_cast<uint8_t>(f[kEthernetHeader + kIpv4Header + 5] - 1);
    EXPECT_EQ(parseFrame(f, kUs).reason, DropReason::kMalformed);

    f = good;
    f[0] = 0x02;
    f[5] = 0x77;  // another unicast MAC
    EXPECT_EQ(parseFrame(f, kUs).reason, DropReason::kNotForUs);
    EXPECT_EQ(parseFrame(udpFrame("x", kPeer, kPeer), kUs).reason, DropReason::kNotForUs);  // another MAC and IP
    f = udpFrame("x", kPeer, InterfaceAddress{kUs.mac, ip("198.18.0.77")});
    EXPECT_EQ(parseFrame(f, kUs).reason, DropReason::kNotForUs);  // our MAC, another IP

    f = good;
    f[12] = 0x81;  // a VLAN tag
    f[13] = 0x00;
    EXPECT_EQ(parseFrame(f, kUs).reason, DropReason::kUnsupported);
}

TEST(DpdkPacket, IpOptionsAreSkippedNotMistakenForPayload) {
    const auto good = udpFrame("opt");
    // Insert 4 bytes of options (NOP NOP NOP EOL) after the 20-byte header.
    std::vector<uint8_t> f(good.begin(), good.begin() + kEthernetHeader + kIpv4Header);
    f.insert(f.end(), {1, 1, 1, 0});
    f.insert(f.end(), good.begin() + kEthernetHeader + kIpv4Header, good.end());
    f[kEthernetHeader] = 0x46;
    const uint16_t total = static_cast<uint16_t>(f.size() - kEthernetHeader);
    f[kEthernetHeader + 2] = static_cast<uint8_t>(total >> 8);
    f[kEthernetHeader + 3] = static_cast<uint8_t>(total);
    fixIpChecksum(f);
    const ParsedFrame p = parseFrame(f, kUs);
    ASSERT_EQ(p.kind, FrameKind::kUdp) << dropReasonName(p.reason);
    EXPECT_EQ(p.ipHeaderLength, 24);
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(f.data() + p.payloadOffset), p.payloadLength), "opt");
}

TEST(DpdkPacket, EveryPrefixOfAValidFrameIsTruncatedNeverValid) {
    const auto frames = {udpFrame("0123456789abcdef"), [] {
                             std::vector<uint8_t> a(42);
                             (void)buildArpRequest(a, kPeer, kUs.ip);
                             return a;
                         }()};
    for (const auto& whole : frames) {
        for (size_t n = 0; n < whole.size(); ++n) {
            // A copy of exactly n bytes: ASan catches any read past it.
            std::vector<uint8_t> cut(whole.begin(), whole.begin() + static_cast<std::ptrdiff_t>(n));
            const ParsedFrame p = parseFrame(cut, kUs);
            EXPECT_EQ(p.kind, FrameKind::kDrop) << n;
            EXPECT_EQ(p.reason, DropReason::kTruncated) << n;
        }
    }
}

// For a device's TX checksum offload the IPv4 checksum is left 0 and the UDP one holds the
// pseudo-header sum; finishing them as a device would gives the computed frame, byte for byte.
TEST(DpdkPacket, OffloadedChecksumsAreWhatTheDeviceFinishes) {
    const std::string payload = "offload me";
    std::vector<uint8_t> soft(kUdpFrameHeaders + payload.size());
    std::vector<uint8_t> off(soft.size());
    for (auto* f : {&soft, &off}) { std::memcpy(f->data() + kUdpFrameHeaders, payload.data(), payload.size()); }
    ASSERT_EQ(buildUdpHeaders(soft, kPeer, kUs.mac, kUs.ip, 5, 7, payload.size(), 9), soft.size());
    ASSERT_EQ(buildUdpHeaders(off, kPeer, kUs.mac, kUs.ip, 5, 7, payload.size(), 9, UdpChecksum::kOffload), off.size());
    uint8_t* ipHeader = off.data() + kEthernetHeader;
    EXPECT_EQ(ipHeader[10], 0);
    EXPECT_EQ(ipHeader[11], 0);
    // The device: the IPv4 checksum over the header; the UDP one over the datagram, seeded with the field.
    uint16_t c = checksumFinish(checksumAdd(0, {ipHeader, kIpv4Header}));
    ipHeader[10] = static_cast<uint8_t>(c >> 8);
    ipHeader[11] = static_cast<uint8_t>(c);
    uint8_t* udp = ipHeader + kIpv4Header;
    c = checksumFinish(checksumAdd(0, {udp, kUdpHeader + payload.size()}));
    udp[6] = static_cast<uint8_t>(c >> 8);
    udp[7] = static_cast<uint8_t>(c);
    EXPECT_EQ(off, soft);
    // A frame whose checksums a device vouched for is not checked again: a wrong one passes.
    std::vector<uint8_t> wrong = soft;
    wrong[kEthernetHeader + 10] ^= 0xff;
    wrong.back() ^= 0x0f;
    EXPECT_EQ(parseFrame(wrong, kUs).reason, DropReason::kBadChecksum);
    EXPECT_EQ(parseFrame(wrong, kUs, VerifiedChecksums{true, true}).kind, FrameKind::kUdp);
}

TEST(DpdkPacket, BuildersRefuseBuffersTooSmall) {
    std::vector<uint8_t> small(41);
    EXPECT_EQ(buildArpRequest(small, kUs, kPeer.ip), 0u);
    std::vector<uint8_t> f(kUdpFrameHeaders + 3);
    EXPECT_EQ(buildUdpHeaders(f, kUs, kPeer.mac, kPeer.ip, 1, 2, 4, 0), 0u);
    EXPECT_EQ(buildUdpHeaders(f, kUs, kPeer.mac, kPeer.ip, 1, 2, 3, 0), f.size());
    std::vector<uint8_t> huge(70000);
    EXPECT_EQ(buildUdpHeaders(huge, kUs, kPeer.mac, kPeer.ip, 1, 2, 65508, 0), 0u);
}

}  // namespace
}  // namespace spindle::dpdk
