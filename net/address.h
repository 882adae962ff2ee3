// SPDX-License-Identifier: Apache-2.0
#pragma once
/// SocketAddress: an IPv4, IPv6 or Unix-domain socket address, parsed from and printed to text.
///
/// Text forms (parse() and toString() agree, so a printed address parses back to an equal one):
///   IPv4  "127.0.0.1:8080"
///   IPv6  "[::1]:8080", "[fe80::1%eth0]:80" (a scope id by interface name or number)
///   Unix  "unix:/run/spindle.sock"; "unix:@name" for the Linux abstract namespace
/// Only numeric hosts: resolving names is a blocking libc call and belongs in offload().
/// Errors: parse() returns EINVAL for text that is none of the forms above (a missing or
/// non-numeric port, a port above 65535, a bad IPv4 or IPv6 literal, an unknown scope,
/// an IPv6 literal without brackets), and ENAMETOOLONG for a Unix path that does not fit
/// sockaddr_un (107 bytes). parseError() gives the reason in words.
/// Cost: 116 bytes (a sockaddr_storage alone is 128), copyable, no allocation.

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "base/result.h"

namespace spindle::net {

class SocketAddress {
public:
    /// AF_UNSPEC: no address (what an unconnected accept fills in for a Unix peer, say).
    SocketAddress() noexcept;

    /// One of the text forms in the header comment. Errors: EINVAL, ENAMETOOLONG.
    [[nodiscard]] static Result<SocketAddress> parse(std::string_view text) noexcept;
    /// A numeric IPv4 or IPv6 host (no brackets needed) and a port. Errors: EINVAL.
    [[nodiscard]] static Result<SocketAddress> parse(std::string_view host, uint16_t port) noexcept;
    /// Why `text` does not parse, in words ("" when it does).
    [[nodiscard]] static std::string parseError(std::string_view text);

    [[nodiscard]] static SocketAddress ipv4Any(uint16_t port) noexcept;       // 0.0.0.0:port
    [[nodiscard]] static SocketAddress ipv4Loopback(uint16_t port) noexcept;  // 127.0.0.1:port
    [[nodiscard]] static SocketAddress ipv6Any(uint16_t port) noexcept;       // [::]:port
    [[nodiscard]] static SocketAddress ipv6Loopback(uint16_t port) noexcept;  // [::1]:port
    /// A filesystem path, or "@name" for the abstract namespace. Errors: EINVAL (empty), ENAMETOOLONG.
    [[nodiscard]] static Result<SocketAddress> unixPath(std::string_view path) noexcept;
    /// Copies what the kernel filled in (accept, getsockname, recvfrom). Errors: EAFNOSUPPORT for a
    /// family other than AF_INET, AF_INET6, AF_UNIX; EINVAL for a length too short for its family.
    [[nodiscard]] static Result<SocketAddress> fromSockaddr(const sockaddr* sa, socklen_t len) noexcept;

    [[nodiscard]] int family() const noexcept { return storage_.any.sa_family; }
    [[nodiscard]] bool isIp() const noexcept { return family() == AF_INET || family() == AF_INET6; }
    /// The port of an IP address; 0 for Unix and AF_UNSPEC.
    [[nodiscard]] uint16_t port() const noexcept;
    /// Changes the port of an IP address; no effect on others.
    void setPort(uint16_t port) noexcept;

    [[nodiscard]] const sockaddr* data() const noexcept { return &storage_.any; }
    [[nodiscard]] sockaddr* data() noexcept { return &storage_.any; }
    [[nodiscard]] socklen_t size() const noexcept { return len_; }
    /// Capacity for calls that fill an address in (recvfrom, accept); then call setSize().
    [[nodiscard]] static constexpr socklen_t capacity() noexcept { return sizeof(Storage); }
    void setSize(socklen_t len) noexcept { len_ = len; }

    /// The text form; "unspecified" for AF_UNSPEC.
    [[nodiscard]] std::string toString() const;

    friend bool operator==(const SocketAddress& a, const SocketAddress& b) noexcept;

private:
    union Storage {
        sockaddr any;
        sockaddr_in v4;
        sockaddr_in6 v6;
        sockaddr_un un;
    };
    Storage storage_;
    socklen_t len_ = 0;
};

}  // namespace spindle::net
