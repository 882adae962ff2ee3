// SPDX-License-Identifier: Apache-2.0
#include "net/dpdk/packet.h"

#include <arpa/inet.h>

#include <cstring>

namespace spindle::dpdk {
namespace {

uint16_t load16(const uint8_t* p) noexcept { return static_cast<uint16_t>((p[0] << 8) | p[1]); }
void store16(uint8_t* p, uint16_t v) noexcept {
    p[0] = static_cast<uint8_t>(v >> 8);
    p[1] = static_cast<uint8_t>(v);
}
// IPv4 addresses stay in network order: copied as bytes.
uint32_t loadIp(const uint8_t* p) noexcept {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}
void storeIp(uint8_t* p, uint32_t v) noexcept { std::memcpy(p, &v, 4); }
Mac loadMac(const uint8_t* p) noexcept {
    Mac m;
    std::memcpy(m.data(), p, 6);
    return m;
}

ParsedFrame drop(ParsedFrame f, DropReason r) noexcept {
    f.kind = FrameKind::kDrop;
    f.reason = r;
    return f;
}

// The UDP pseudo-header's sum (RFC 768): addresses, protocol, UDP length.
uint32_t pseudoHeaderSum(uint32_t src, uint32_t dst, uint16_t udpLength) noexcept {
    uint8_t ph[12];
    storeIp(ph, src);
    storeIp(ph + 4, dst);
    ph[8] = 0;
    ph[9] = 17;
    store16(ph + 10, udpLength);
    return checksumAdd(0, ph);
}

void writeEthernet(uint8_t* p, const Mac& dst, const Mac& src, uint16_t type) noexcept {
    std::memcpy(p, dst.data(), 6);
    std::memcpy(p + 6, src.data(), 6);
    store16(p + 12, type);
}

// A 20-byte IPv4 header, with its checksum unless a device will compute it; TTL 64, DF set.
void writeIpv4(uint8_t* p, uint32_t src, uint32_t dst, uint8_t protocol, uint16_t totalLength, uint16_t id,
               bool checksum = true) noexcept {
    p[0] = 0x45;
    p[1] = 0;
    store16(p + 2, totalLength);
    store16(p + 4, id);
    store16(p + 6, 0x4000);  // DF, offset 0
    p[8] = 64;
    p[9] = protocol;
    store16(p + 10, 0);
    storeIp(p + 12, src);
    storeIp(p + 16, dst);
    if (checksum) { store16(p + 10, checksumFinish(checksumAdd(0, {p, kIpv4Header}))); }
}

// An Ethernet frame holding one IPv4-over-Ethernet ARP packet: operation `op` from `self` to
// (`targetMac`, `targetIp`), sent to `dst`. Returns its length (42), or 0 when `out` is shorter.
size_t writeArp(std::span<uint8_t> out, uint16_t op, const Mac& dst, const InterfaceAddress& self, const Mac& targetMac,
                uint32_t targetIp) noexcept {
    constexpr size_t kLength = kEthernetHeader + kArpPacket;
    if (out.size() < kLength) { return 0; }
    uint8_t* p = out.data();
    writeEthernet(p, dst, self.mac, kEtherTypeArp);
    uint8_t* a = p + kEthernetHeader;
    store16(a, 1);  // hardware: Ethernet
    store16(a + 2, kEtherTypeIpv4);
    a[4] = 6;
    a[5] = 4;
    store16(a + 6, op);
    std::memcpy(a + 8, self.mac.data(), 6);
    storeIp(a + 14, self.ip);
    std::memcpy(a + 18, targetMac.data(), 6);
    storeIp(a + 24, targetIp);
    return kLength;
}

ParsedFrame parseArp(std::span<const uint8_t> f, const InterfaceAddress& self, ParsedFrame out) noexcept {
    if (f.size() < kEthernetHeader + kArpPacket) { return drop(out, DropReason::kTruncated); }
    const uint8_t* a = f.data() + kEthernetHeader;
    if (load16(a) != 1 || load16(a + 2) != kEtherTypeIpv4 || a[4] != 6 || a[5] != 4) {
        return drop(out, DropReason::kMalformed);
    }
    const uint16_t op = load16(a + 6);
    out.srcMac = loadMac(a + 8);
    out.srcIp = loadIp(a + 14);
    out.dstIp = loadIp(a + 24);
    out.arpSender = op == 1 || op == 2;
    if (op == 1) {
        if (out.dstIp != self.ip) { return drop(out, DropReason::kNotForUs); }
        out.kind = FrameKind::kArpRequest;
        return out;
    }
    if (op == 2) {
        out.kind = FrameKind::kArpReply;
        return out;
    }
    return drop(out, DropReason::kMalformed);
}

ParsedFrame parseIpv4(std::span<const uint8_t> f, const InterfaceAddress& self, ParsedFrame out,
                      VerifiedChecksums verified) noexcept {
    if (f.size() < kEthernetHeader + kIpv4Header) { return drop(out, DropReason::kTruncated); }
    const uint8_t* ip = f.data() + kEthernetHeader;
    const size_t available = f.size() - kEthernetHeader;
    if ((ip[0] >> 4) != 4) { return drop(out, DropReason::kMalformed); }
    const size_t ihl = static_cast<size_t>(ip[0] & 0x0f) * 4;
    if (ihl < kIpv4Header) { return drop(out, DropReason::kMalformed); }
    if (ihl > available) { return drop(out, DropReason::kTruncated); }
    const size_t total = load16(ip + 2);
    if (total < ihl) { return drop(out, DropReason::kMalformed); }
    if (total > available) { return drop(out, DropReason::kTruncated); }  // bytes past `total`: padding
    if (!verified.ipHeader && checksumFinish(checksumAdd(0, {ip, ihl})) != 0) {
        return drop(out, DropReason::kBadChecksum);
    }
    out.srcIp = loadIp(ip + 12);
    out.dstIp = loadIp(ip + 16);
    out.ipOffset = static_cast<uint16_t>(kEthernetHeader);
    out.ipHeaderLength = static_cast<uint16_t>(ihl);
    if (out.dstIp != self.ip) { return drop(out, DropReason::kNotForUs); }
    if ((load16(ip + 6) & 0x3fff) != 0) { return drop(out, DropReason::kFragment); }  // MF or an offset
    const uint8_t* l4 = ip + ihl;
    const size_t l4Length = total - ihl;
    const auto l4Offset = static_cast<uint16_t>(kEthernetHeader + ihl);
    switch (ip[9]) {
        case 1: {  // ICMP
            if (l4Length < kIcmpHeader) { return drop(out, DropReason::kTruncated); }
            if (checksumFinish(checksumAdd(0, {l4, l4Length})) != 0) { return drop(out, DropReason::kBadChecksum); }
            if (l4[0] != 8 || l4[1] != 0) { return drop(out, DropReason::kUnsupported); }
            out.kind = FrameKind::kIcmpEcho;
            out.payloadOffset = l4Offset;
            out.payloadLength = static_cast<uint16_t>(l4Length);
            return out;
        }
        case 17: {  // UDP
            if (l4Length < kUdpHeader) { return drop(out, DropReason::kTruncated); }
            const size_t udpLength = load16(l4 + 4);
            if (udpLength != l4Length) { return drop(out, DropReason::kMalformed); }  // disagrees with IP's
            if (!verified.l4 && load16(l4 + 6) != 0) {  // 0: the sender computed none
                const uint32_t sum = checksumAdd(pseudoHeaderSum(out.srcIp, out.dstIp, static_cast<uint16_t>(udpLength)),
                                                 {l4, udpLength});
                if (checksumFinish(sum) != 0) { return drop(out, DropReason::kBadChecksum); }
            }
            out.kind = FrameKind::kUdp;
            out.srcPort = load16(l4);
            out.dstPort = load16(l4 + 2);
            out.payloadOffset = static_cast<uint16_t>(l4Offset + kUdpHeader);
            out.payloadLength = static_cast<uint16_t>(udpLength - kUdpHeader);
            return out;
        }
        default:
            return drop(out, DropReason::kUnsupported);
    }
}

}  // namespace

std::string_view dropReasonName(DropReason r) noexcept {
    switch (r) {
        case DropReason::kNone: return "none";
        case DropReason::kTruncated: return "truncated";
        case DropReason::kNotForUs: return "not_for_us";
        case DropReason::kBadChecksum: return "bad_checksum";
        case DropReason::kFragment: return "fragment";
        case DropReason::kMalformed: return "malformed";
        case DropReason::kUnsupported: return "unsupported";
        case DropReason::kCount: break;
    }
    return "unknown";
}

uint32_t checksumAdd(uint32_t sum, std::span<const uint8_t> data) noexcept {
    uint64_t s = sum;
    size_t i = 0;
    for (; i + 1 < data.size(); i += 2) { s += load16(data.data() + i); }
    if (i < data.size()) { s += static_cast<uint64_t>(data[i]) << 8; }
    while ((s >> 16) != 0) { s = (s & 0xffff) + (s >> 16); }
    return static_cast<uint32_t>(s);
}

uint16_t checksumFinish(uint32_t sum) noexcept {
    while ((sum >> 16) != 0) { sum = (sum & 0xffff) + (sum >> 16); }
    return static_cast<uint16_t>(~sum & 0xffff);
}

ParsedFrame parseFrame(std::span<const uint8_t> frame, const InterfaceAddress& self, VerifiedChecksums verified) noexcept {
    ParsedFrame out;
    if (frame.size() < kEthernetHeader) { return drop(out, DropReason::kTruncated); }
    const Mac dst = loadMac(frame.data());
    out.srcMac = loadMac(frame.data() + 6);
    const uint16_t type = load16(frame.data() + 12);
    const bool toUs = dst == self.mac;
    if (!toUs && dst != kBroadcastMac) { return drop(out, DropReason::kNotForUs); }
    if (type == kEtherTypeArp) { return parseArp(frame, self, out); }
    if (type != kEtherTypeIpv4) { return drop(out, DropReason::kUnsupported); }
    if (!toUs) { return drop(out, DropReason::kNotForUs); }  // IPv4 broadcast: not served
    return parseIpv4(frame, self, out, verified);
}

size_t buildArpRequest(std::span<uint8_t> out, const InterfaceAddress& self, uint32_t targetIp) noexcept {
    return writeArp(out, 1, kBroadcastMac, self, Mac{}, targetIp);
}

size_t buildArpReply(std::span<uint8_t> out, const InterfaceAddress& self, const ParsedFrame& request) noexcept {
    return writeArp(out, 2, request.srcMac, self, request.srcMac, request.srcIp);
}

size_t buildEchoReply(std::span<uint8_t> out, std::span<const uint8_t> frame, const ParsedFrame& request,
                      const InterfaceAddress& self) noexcept {
    const size_t icmpLength = request.payloadLength;
    const size_t length = kEthernetHeader + kIpv4Header + icmpLength;
    if (request.kind != FrameKind::kIcmpEcho || out.size() < length ||
        static_cast<size_t>(request.payloadOffset) + icmpLength > frame.size()) {
        return 0;
    }
    uint8_t* p = out.data();
    writeEthernet(p, request.srcMac, self.mac, kEtherTypeIpv4);
    // A plain header: the request's IP options (if any) are not echoed.
    writeIpv4(p + kEthernetHeader, self.ip, request.srcIp, 1, static_cast<uint16_t>(kIpv4Header + icmpLength), 0);
    uint8_t* icmp = p + kEthernetHeader + kIpv4Header;
    std::memmove(icmp, frame.data() + request.payloadOffset, icmpLength);
    icmp[0] = 0;  // echo reply
    icmp[1] = 0;
    store16(icmp + 2, 0);
    store16(icmp + 2, checksumFinish(checksumAdd(0, {icmp, icmpLength})));
    return length;
}

size_t buildUdpHeaders(std::span<uint8_t> out, const InterfaceAddress& self, const Mac& dstMac, uint32_t dstIp,
                       uint16_t srcPort, uint16_t dstPort, size_t payloadLength, uint16_t ipId,
                       UdpChecksum checksum) noexcept {
    constexpr size_t kMaxPayload = 65535 - kIpv4Header - kUdpHeader;
    if (payloadLength > kMaxPayload || out.size() < kUdpFrameHeaders + payloadLength) { return 0; }
    uint8_t* p = out.data();
    const auto udpLength = static_cast<uint16_t>(kUdpHeader + payloadLength);
    writeEthernet(p, dstMac, self.mac, kEtherTypeIpv4);
    writeIpv4(p + kEthernetHeader, self.ip, dstIp, 17, static_cast<uint16_t>(kIpv4Header + udpLength), ipId,
              checksum != UdpChecksum::kOffload);
    uint8_t* udp = p + kEthernetHeader + kIpv4Header;
    store16(udp, srcPort);
    store16(udp + 2, dstPort);
    store16(udp + 4, udpLength);
    store16(udp + 6, 0);
    if (checksum == UdpChecksum::kCompute) {
        uint16_t c = checksumFinish(checksumAdd(pseudoHeaderSum(self.ip, dstIp, udpLength), {udp, udpLength}));
        if (c == 0) { c = 0xffff; }  // 0 on the wire means "no checksum"
        store16(udp + 6, c);
    } else if (checksum == UdpChecksum::kOffload) {
        // The device adds the header and payload to this and complements (DPDK's convention).
        store16(udp + 6, static_cast<uint16_t>(pseudoHeaderSum(self.ip, dstIp, udpLength)));
    }
    return kUdpFrameHeaders + payloadLength;
}

}  // namespace spindle::dpdk
