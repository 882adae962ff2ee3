// SPDX-License-Identifier: Apache-2.0
#pragma once
// A blocking RESP client for the kv tests (plain POSIX sockets on the test's thread): sends commands
// as arrays (or raw bytes) and reads one whole reply back as its raw bytes, so that a test compares
// exactly what a Redis client would see.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace spindle::kv::testing_support {

class RespClient {
public:
    explicit RespClient(uint16_t port, std::chrono::milliseconds timeout = std::chrono::milliseconds(5000))
        : timeout_(timeout) {
        fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(port);
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (fd_ >= 0 && ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
            ::close(fd_);
            fd_ = -1;
        }
        if (fd_ >= 0) {
            int one = 1;
            (void)::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        }
    }
    ~RespClient() {
        if (fd_ >= 0) { ::close(fd_); }
    }
    RespClient(const RespClient&) = delete;
    RespClient& operator=(const RespClient&) = delete;

    [[nodiscard]] bool connected() const { return fd_ >= 0; }
    void close() {
        if (fd_ >= 0) { ::close(fd_); }
        fd_ = -1;
    }

    /// Ends the client's sending side (a FIN); replies can still be read.
    void shutdownWrite() {
        if (fd_ >= 0) { (void)::shutdown(fd_, SHUT_WR); }
    }

    static std::string encode(const std::vector<std::string>& args) {
        std::string out = "*" + std::to_string(args.size()) + "\r\n";
        for (const std::string& a : args) { out += "$" + std::to_string(a.size()) + "\r\n" + a + "\r\n"; }
        return out;
    }

    bool sendRaw(std::string_view bytes) {
        while (!bytes.empty()) {
            const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
            if (n <= 0) { return false; }
            bytes.remove_prefix(static_cast<size_t>(n));
        }
        return true;
    }

    /// One reply's raw bytes, or nullopt on end of stream / timeout.
    std::optional<std::string> reply() {
        for (;;) {
            if (auto end = replyEnd(buf_, 0)) {
                std::string r = buf_.substr(0, *end);
                buf_.erase(0, *end);
                return r;
            }
            if (!fill()) { return std::nullopt; }
        }
    }

    /// Sends the command and returns its reply ("" when none came).
    std::string call(const std::vector<std::string>& args) {
        if (!sendRaw(encode(args))) { return ""; }
        return reply().value_or("");
    }

    /// True when the server closed the connection (end of stream within the timeout, nothing buffered).
    bool closedByPeer() {
        if (!buf_.empty()) { return false; }
        return !fill() && eof_;
    }

private:
    bool fill() {
        pollfd p{fd_, POLLIN, 0};
        if (::poll(&p, 1, static_cast<int>(timeout_.count())) <= 0) { return false; }
        char tmp[65536];
        const ssize_t n = ::recv(fd_, tmp, sizeof tmp, 0);
        if (n <= 0) {
            eof_ = true;
            return false;
        }
        buf_.append(tmp, static_cast<size_t>(n));
        return true;
    }

    // Where the reply starting at `at` ends, when it is all there.
    static std::optional<size_t> replyEnd(const std::string& b, size_t at) {
        if (at >= b.size()) { return std::nullopt; }
        const size_t crlf = b.find("\r\n", at);
        if (crlf == std::string::npos) { return std::nullopt; }
        const char type = b[at];
        const std::string line = b.substr(at + 1, crlf - at - 1);
        switch (type) {
            case '+': case '-': case ':': case '_': case ',': case '#': case '(':
                return crlf + 2;
            case '$': case '=': case '!': {
                const long long len = std::atoll(line.c_str());
                if (len < 0) { return crlf + 2; }
                const size_t end = crlf + 2 + static_cast<size_t>(len) + 2;
                return end <= b.size() ? std::optional<size_t>(end) : std::nullopt;
            }
            case '*': case '~': case '%': case '>': {
                long long n = std::atoll(line.c_str());
                if (n < 0) { return crlf + 2; }
                if (type == '%') { n *= 2; }
                size_t pos = crlf + 2;
                for (long long i = 0; i < n; ++i) {
                    auto e = replyEnd(b, pos);
                    if (!e) { return std::nullopt; }
                    pos = *e;
                }
                return pos;
            }
            default: return crlf + 2;
        }
    }

    int fd_ = -1;
    std::chrono::milliseconds timeout_;
    std::string buf_;
    bool eof_ = false;
};

}  // namespace spindle::kv::testing_support
