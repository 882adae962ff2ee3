// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The properties every parse of a frame must have, whatever its bytes: shared by the libFuzzer
/// target (tests/fuzz/packet_parser_fuzz.cpp), which aborts on a violation, and the corpus test
/// (tests/dpdk/packet_corpus_test.cpp), which reports it.

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "net/dpdk/packet.h"

namespace spindle::dpdk::testing_support {

/// The interface the corpus frames are addressed to: 02:00:00:00:00:01, 198.18.0.1.
inline InterfaceAddress corpusInterface() noexcept {
    InterfaceAddress a;
    a.mac = {0x02, 0, 0, 0, 0, 0x01};
    const uint8_t ip[4] = {198, 18, 0, 1};
    std::memcpy(&a.ip, ip, 4);
    return a;
}

/// "" when parsing `frame` for `self` keeps every invariant; otherwise what broke.
inline std::string checkPacketInvariants(std::span<const uint8_t> frame, const InterfaceAddress& self) {
    const ParsedFrame p = parseFrame(frame, self);
    if ((p.kind == FrameKind::kDrop) != (p.reason != DropReason::kNone)) { return "kind and reason disagree"; }
    if (p.reason == DropReason::kCount) { return "reason out of range"; }
    const ParsedFrame again = parseFrame(frame, self);
    if (again.kind != p.kind || again.reason != p.reason) { return "not deterministic"; }
    const InterfaceAddress peer{p.srcMac, p.srcIp};
    switch (p.kind) {
        case FrameKind::kDrop:
            return "";
        case FrameKind::kArpRequest: {
            if (p.dstIp != self.ip) { return "an ARP request for another address accepted"; }
            std::vector<uint8_t> reply(kEthernetHeader + kArpPacket);
            if (buildArpReply(reply, self, p) != reply.size()) { return "no ARP reply built"; }
            const ParsedFrame r = parseFrame(reply, peer);
            if (r.kind != FrameKind::kArpReply || r.srcIp != self.ip || r.srcMac != self.mac) {
                return "the ARP reply does not parse back at the asker";
            }
            return "";
        }
        case FrameKind::kArpReply:
            return "";
        case FrameKind::kIcmpEcho: {
            if (p.payloadLength < kIcmpHeader || size_t{p.payloadOffset} + p.payloadLength > frame.size()) {
                return "ICMP message outside the frame";
            }
            std::vector<uint8_t> reply(kEthernetHeader + kIpv4Header + p.payloadLength);
            if (buildEchoReply(reply, frame, p, self) != reply.size()) { return "no echo reply built"; }
            // At the asker: checksums right, an ICMP type it does not serve (0, echo reply).
            const ParsedFrame r = parseFrame(reply, peer);
            if (r.reason != DropReason::kUnsupported) { return "the echo reply does not parse back at the asker"; }
            return "";
        }
        case FrameKind::kUdp: {
            if (p.dstIp != self.ip) { return "a datagram for another address accepted"; }
            if (p.payloadOffset < kUdpFrameHeaders || size_t{p.payloadOffset} + p.payloadLength > frame.size()) {
                return "UDP payload outside the frame";
            }
            // The same datagram rebuilt from the parsed fields parses to the same fields and bytes.
            std::vector<uint8_t> copy(kUdpFrameHeaders + p.payloadLength);
            std::memcpy(copy.data() + kUdpFrameHeaders, frame.data() + p.payloadOffset, p.payloadLength);
            if (buildUdpHeaders(copy, peer, self.mac, self.ip, p.srcPort, p.dstPort, p.payloadLength, 0) != copy.size()) {
                return "the datagram cannot be rebuilt";
            }
            const ParsedFrame r = parseFrame(copy, self);
            if (r.kind != FrameKind::kUdp || r.srcPort != p.srcPort || r.dstPort != p.dstPort ||
                r.payloadLength != p.payloadLength || r.srcIp != p.srcIp) {
                return "the rebuilt datagram parses differently";
            }
            return "";
        }
    }
    return "unknown kind";
}

}  // namespace spindle::dpdk::testing_support
