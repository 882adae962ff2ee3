// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The wire formats of spindle's small stack: Ethernet II, ARP, IPv4, ICMP echo and UDP. Frames are
/// read and written as bytes (no DPDK types), so the parser is fuzzed and tested without EAL.
///
/// parseFrame() classifies one received frame for an interface: what it is (an ARP request or
/// reply, an ICMP echo request, a UDP datagram) or why it is dropped (truncated, malformed, a bad
/// checksum, a fragment, not for this interface, a protocol not served). It reads only inside the
/// frame, never trusts a length field beyond what arrived, and writes nothing. The build*()
/// functions write a whole frame into a caller's buffer and return its length (0 when it does not
/// fit). Addresses are in network byte order (as in sockaddr_in); ports in host order.
/// Errors: none beyond the verdicts and the 0 return. Thread-safety: pure functions.

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace spindle::dpdk {

using Mac = std::array<uint8_t, 6>;
inline constexpr Mac kBroadcastMac{0xff, 0xff, 0xff, 0xff, 0xff, 0xff};

inline constexpr size_t kEthernetHeader = 14;
inline constexpr size_t kArpPacket = 28;
inline constexpr size_t kIpv4Header = 20;  // without options
inline constexpr size_t kUdpHeader = 8;
inline constexpr size_t kIcmpHeader = 8;
inline constexpr uint16_t kEtherTypeIpv4 = 0x0800;
inline constexpr uint16_t kEtherTypeArp = 0x0806;

/// What an interface answers to: its MAC and IPv4 address.
struct InterfaceAddress {
    Mac mac{};
    uint32_t ip = 0;  // network byte order
};

enum class FrameKind : uint8_t {
    kDrop,
    kArpRequest,  // someone asks for our IP: answer with buildArpReply()
    kArpReply,    // an answer (or a gratuitous announcement): learn sender -> MAC
    kIcmpEcho,    // an echo request to our IP: answer with buildEchoReply()
    kUdp,         // a datagram to our IP
};

/// Why a frame was dropped; each has a counter (see dropReasonName()).
enum class DropReason : uint8_t {
    kNone,
    kTruncated,       // shorter than its headers, or than the lengths it states
    kNotForUs,        // another MAC, another IP, an ARP request for another IP
    kBadChecksum,     // IPv4 header, ICMP or UDP checksum wrong
    kFragment,        // an IPv4 fragment (MF set or an offset): not reassembled
    kMalformed,       // a version, header length, hardware/protocol type or length that is not valid
    kUnsupported,     // an EtherType, IP protocol or ICMP type we do not serve (VLAN tags included)
    kCount,
};
[[nodiscard]] std::string_view dropReasonName(DropReason r) noexcept;

/// A classified frame: offsets into it, and the fields the reply or the socket needs.
struct ParsedFrame {
    FrameKind kind = FrameKind::kDrop;
    DropReason reason = DropReason::kNone;
    Mac srcMac{};
    uint32_t srcIp = 0;       // network order: ARP sender, IPv4 source
    uint32_t dstIp = 0;       // network order
    uint16_t srcPort = 0;     // UDP, host order
    uint16_t dstPort = 0;     // UDP, host order
    uint16_t ipOffset = 0;    // of the IPv4 header
    uint16_t ipHeaderLength = 0;
    uint16_t payloadOffset = 0;  // of the UDP payload, or of the ICMP header
    uint16_t payloadLength = 0;  // UDP payload bytes, or ICMP message bytes
    bool arpSender = false;      // a well-formed ARP packet (kept or not): srcIp/srcMac are its sender's
};

/// Checksums a device verified on receipt (its RX checksum offload), which parseFrame() then does
/// not compute again. A device that found one bad makes the caller drop the frame itself.
struct VerifiedChecksums {
    bool ipHeader = false;  // the IPv4 header checksum is right
    bool l4 = false;        // the UDP checksum is right
};

/// Classifies `frame` for `self` (see the file comment). Broadcast frames are for us when they are
/// ARP; IPv4 must be to our MAC and our IP.
[[nodiscard]] ParsedFrame parseFrame(std::span<const uint8_t> frame, const InterfaceAddress& self,
                                     VerifiedChecksums verified = {}) noexcept;

/// The internet checksum (RFC 1071) of `data`, folded, not complemented, added to `sum`.
[[nodiscard]] uint32_t checksumAdd(uint32_t sum, std::span<const uint8_t> data) noexcept;
/// The complemented 16-bit checksum of `sum` (as it goes on the wire, host order).
[[nodiscard]] uint16_t checksumFinish(uint32_t sum) noexcept;

/// An ARP request for `targetIp` from `self`, broadcast. Returns the frame length (42), or 0.
size_t buildArpRequest(std::span<uint8_t> out, const InterfaceAddress& self, uint32_t targetIp) noexcept;
/// The reply to `request` (a kArpRequest frame) from `self`. Returns the frame length, or 0.
size_t buildArpReply(std::span<uint8_t> out, const InterfaceAddress& self, const ParsedFrame& request) noexcept;
/// The echo reply to `request` (a kIcmpEcho frame, `frame` its bytes): same identifier, sequence
/// and data. Returns the frame length, or 0.
size_t buildEchoReply(std::span<uint8_t> out, std::span<const uint8_t> frame, const ParsedFrame& request,
                      const InterfaceAddress& self) noexcept;

/// How buildUdpHeaders() fills the checksums.
enum class UdpChecksum : uint8_t {
    kCompute,  // both computed here (the UDP one over the payload, which must be written first)
    kNone,     // the IPv4 one computed, the UDP one 0 ("none", as RFC 768 allows)
    kOffload,  // for a device's TX checksum offload: the IPv4 one 0, the UDP one the pseudo-header sum
};

/// Headers of a UDP datagram of `payloadLength` bytes: Ethernet, IPv4 (TTL 64, DF) and UDP, with
/// checksums as `checksum` says; the payload lies at `out[kUdpFrameHeaders...]`. Returns the frame
/// length, or 0 when `out` is too small or the datagram would exceed 65,507 bytes.
inline constexpr size_t kUdpFrameHeaders = kEthernetHeader + kIpv4Header + kUdpHeader;
size_t buildUdpHeaders(std::span<uint8_t> out, const InterfaceAddress& self, const Mac& dstMac, uint32_t dstIp,
                       uint16_t srcPort, uint16_t dstPort, size_t payloadLength, uint16_t ipId,
                       UdpChecksum checksum = UdpChecksum::kCompute) noexcept;

}  // namespace spindle::dpdk
