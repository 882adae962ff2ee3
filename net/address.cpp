// SPDX-License-Identifier: Apache-2.0
#include "net/address.h"

#include <arpa/inet.h>
#include <net/if.h>

#include <cerrno>
#include <charconv>
#include <cstring>

#include <fmt/format.h>

namespace spindle::net {
namespace {

constexpr std::string_view kUnixPrefix = "unix:";

// A decimal port 0..65535, nothing else.
bool parsePort(std::string_view text, uint16_t* port) noexcept {
    if (text.empty() || text.size() > 5) { return false; }
    unsigned v = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc{} || end != text.data() + text.size() || v > 65535) { return false; }
    *port = static_cast<uint16_t>(v);
    return true;
}

// The reason `text` is not an address, or "" with *out filled.
std::string parseInto(std::string_view text, SocketAddress* out) {
    if (text.substr(0, kUnixPrefix.size()) == kUnixPrefix) {
        auto r = SocketAddress::unixPath(text.substr(kUnixPrefix.size()));
        if (!r) {
            return r.errorCode() == ENAMETOOLONG ? "a Unix socket path holds at most 107 bytes" : "an empty Unix socket path";
        }
        *out = *r;
        return {};
    }
    std::string_view host;
    std::string_view port;
    if (!text.empty() && text.front() == '[') {
        const size_t close = text.find(']');
        if (close == std::string_view::npos) { return "an IPv6 address opens '[' without a closing ']'"; }
        host = text.substr(1, close - 1);
        std::string_view rest = text.substr(close + 1);
        if (rest.empty() || rest.front() != ':') { return "a port must follow ']' as \":PORT\""; }
        port = rest.substr(1);
    } else {
        const size_t colon = text.rfind(':');
        if (colon == std::string_view::npos) { return "no port: write HOST:PORT, [IPV6]:PORT or unix:PATH"; }
        host = text.substr(0, colon);
        port = text.substr(colon + 1);
        if (host.find(':') != std::string_view::npos) { return "an IPv6 address needs brackets: [ADDR]:PORT"; }
    }
    uint16_t p = 0;
    if (!parsePort(port, &p)) { return fmt::format("bad port '{}': a number 0..65535", port); }
    auto r = SocketAddress::parse(host, p);
    if (!r) { return fmt::format("bad host '{}': a numeric IPv4 or IPv6 address", host); }
    *out = *r;
    return {};
}

}  // namespace

SocketAddress::SocketAddress() noexcept {
    std::memset(&storage_, 0, sizeof(storage_));
    storage_.any.sa_family = AF_UNSPEC;
}

Result<SocketAddress> SocketAddress::parse(std::string_view text) noexcept {
    try {
        SocketAddress a;
        if (!parseInto(text, &a).empty()) {
            if (text.substr(0, kUnixPrefix.size()) == kUnixPrefix && text.size() - kUnixPrefix.size() > sizeof(sockaddr_un::sun_path) - 1) {
                return Error{ENAMETOOLONG};
            }
            return Error{EINVAL};
        }
        return a;
    } catch (...) {
        return Error{ENOMEM};
    }
}

std::string SocketAddress::parseError(std::string_view text) {
    SocketAddress a;
    return parseInto(text, &a);
}

Result<SocketAddress> SocketAddress::parse(std::string_view host, uint16_t port) noexcept {
    char buf[INET6_ADDRSTRLEN + IF_NAMESIZE + 2];
    if (host.empty() || host.size() >= sizeof(buf)) { return Error{EINVAL}; }
    std::memcpy(buf, host.data(), host.size());
    buf[host.size()] = '\0';
    SocketAddress a;
    if (host.find(':') == std::string_view::npos) {
        if (inet_pton(AF_INET, buf, &a.storage_.v4.sin_addr) != 1) { return Error{EINVAL}; }
        a.storage_.v4.sin_family = AF_INET;
        a.storage_.v4.sin_port = htons(port);
        a.len_ = sizeof(sockaddr_in);
        return a;
    }
    char* scope = std::strchr(buf, '%');
    if (scope != nullptr) { *scope++ = '\0'; }
    if (inet_pton(AF_INET6, buf, &a.storage_.v6.sin6_addr) != 1) { return Error{EINVAL}; }
    if (scope != nullptr) {
        if (*scope == '\0') { return Error{EINVAL}; }
        unsigned id = 0;
        const std::string_view s(scope);
        auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), id);
        if (ec != std::errc{} || end != s.data() + s.size()) { id = if_nametoindex(scope); }
        if (id == 0) { return Error{EINVAL}; }
        a.storage_.v6.sin6_scope_id = id;
    }
    a.storage_.v6.sin6_family = AF_INET6;
    a.storage_.v6.sin6_port = htons(port);
    a.len_ = sizeof(sockaddr_in6);
    return a;
}

SocketAddress SocketAddress::ipv4Any(uint16_t port) noexcept {
    SocketAddress a;
    a.storage_.v4.sin_family = AF_INET;
    a.storage_.v4.sin_addr.s_addr = htonl(INADDR_ANY);
    a.storage_.v4.sin_port = htons(port);
    a.len_ = sizeof(sockaddr_in);
    return a;
}

SocketAddress SocketAddress::ipv4Loopback(uint16_t port) noexcept {
    SocketAddress a = ipv4Any(port);
    a.storage_.v4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return a;
}

SocketAddress SocketAddress::ipv6Any(uint16_t port) noexcept {
    SocketAddress a;
    a.storage_.v6.sin6_family = AF_INET6;
    a.storage_.v6.sin6_addr = in6addr_any;
    a.storage_.v6.sin6_port = htons(port);
    a.len_ = sizeof(sockaddr_in6);
    return a;
}

SocketAddress SocketAddress::ipv6Loopback(uint16_t port) noexcept {
    SocketAddress a = ipv6Any(port);
    a.storage_.v6.sin6_addr = in6addr_loopback;
    return a;
}

Result<SocketAddress> SocketAddress::unixPath(std::string_view path) noexcept {
    if (path.empty()) { return Error{EINVAL}; }
    SocketAddress a;
    if (path.size() > sizeof(a.storage_.un.sun_path) - 1) { return Error{ENAMETOOLONG}; }
    a.storage_.un.sun_family = AF_UNIX;
    std::memcpy(a.storage_.un.sun_path, path.data(), path.size());
    if (path.front() == '@') {
        // Abstract: a leading NUL, and the length (not a terminator) bounds the name.
        a.storage_.un.sun_path[0] = '\0';
        a.len_ = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size());
    } else {
        a.len_ = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + 1);
    }
    return a;
}

Result<SocketAddress> SocketAddress::fromSockaddr(const sockaddr* sa, socklen_t len) noexcept {
    if (sa == nullptr || len < static_cast<socklen_t>(sizeof(sa_family_t))) { return Error{EINVAL}; }
    SocketAddress a;
    switch (sa->sa_family) {
        case AF_INET:
            if (len < static_cast<socklen_t>(sizeof(sockaddr_in))) { return Error{EINVAL}; }
            std::memcpy(&a.storage_.v4, sa, sizeof(sockaddr_in));
            a.len_ = sizeof(sockaddr_in);
            return a;
        case AF_INET6:
            if (len < static_cast<socklen_t>(sizeof(sockaddr_in6))) { return Error{EINVAL}; }
            std::memcpy(&a.storage_.v6, sa, sizeof(sockaddr_in6));
            a.len_ = sizeof(sockaddr_in6);
            return a;
        case AF_UNIX:
            if (len > static_cast<socklen_t>(sizeof(sockaddr_un))) { return Error{EINVAL}; }
            std::memcpy(&a.storage_.un, sa, len);
            a.len_ = len;
            return a;
        default:
            return Error{EAFNOSUPPORT};
    }
}

uint16_t SocketAddress::port() const noexcept {
    switch (family()) {
        case AF_INET: return ntohs(storage_.v4.sin_port);
        case AF_INET6: return ntohs(storage_.v6.sin6_port);
        default: return 0;
    }
}

void SocketAddress::setPort(uint16_t port) noexcept {
    if (family() == AF_INET) {
        storage_.v4.sin_port = htons(port);
    } else if (family() == AF_INET6) {
        storage_.v6.sin6_port = htons(port);
    }
}

std::string SocketAddress::toString() const {
    char buf[INET6_ADDRSTRLEN];
    switch (family()) {
        case AF_INET:
            inet_ntop(AF_INET, &storage_.v4.sin_addr, buf, sizeof(buf));
            return fmt::format("{}:{}", buf, port());
        case AF_INET6: {
            inet_ntop(AF_INET6, &storage_.v6.sin6_addr, buf, sizeof(buf));
            if (storage_.v6.sin6_scope_id != 0) {
                char name[IF_NAMESIZE];
                if (if_indextoname(storage_.v6.sin6_scope_id, name) != nullptr) {
                    return fmt::format("[{}%{}]:{}", buf, name, port());
                }
                return fmt::format("[{}%{}]:{}", buf, storage_.v6.sin6_scope_id, port());
            }
            return fmt::format("[{}]:{}", buf, port());
        }
        case AF_UNIX: {
            const size_t pathLen = len_ > offsetof(sockaddr_un, sun_path) ? len_ - offsetof(sockaddr_un, sun_path) : 0;
            if (pathLen == 0) { return "unix:"; }  // an unnamed socket (a connect()ing peer)
            if (storage_.un.sun_path[0] == '\0') {
                return fmt::format("unix:@{}", std::string_view(storage_.un.sun_path + 1, pathLen - 1));
            }
            return fmt::format("unix:{}", std::string_view(storage_.un.sun_path, strnlen(storage_.un.sun_path, pathLen)));
        }
        default:
            return "unspecified";
    }
}

bool operator==(const SocketAddress& a, const SocketAddress& b) noexcept {
    return a.len_ == b.len_ && a.family() == b.family() && std::memcmp(&a.storage_, &b.storage_, a.len_) == 0;
}

}  // namespace spindle::net
