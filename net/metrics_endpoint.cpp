// SPDX-License-Identifier: Apache-2.0
#include "net/metrics_endpoint.h"

#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "base/log.h"
#include "core/io.h"
#include "core/runtime_metrics.h"

namespace spindle::net {

namespace {

using Clock = std::chrono::steady_clock;

// After an error response, how long the client's remaining bytes are read and dropped before the close,
// so that the close does not reset the connection (and lose the response) while they are unread.
constexpr std::chrono::milliseconds kLinger{1000};

struct Request {
    std::string_view method;
    std::string_view path;  // the target without its query string
    bool http10 = false;
    bool close = false;     // the connection ends after the response
    bool hasBody = false;   // Content-Length > 0 or Transfer-Encoding: not read, so the connection ends
};

enum class Parse : uint8_t { kIncomplete, kOk, kBad, kTooLarge };

bool isTchar(char c) noexcept {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) { return true; }
    return std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

bool isToken(std::string_view s) noexcept {
    if (s.empty()) { return false; }
    for (const char c : s) {
        if (!isTchar(c)) { return false; }
    }
    return true;
}

bool equalsIgnoreCase(std::string_view a, std::string_view b) noexcept {
    if (a.size() != b.size()) { return false; }
    for (size_t i = 0; i < a.size(); ++i) {
        char x = a[i], y = b[i];
        if (x >= 'A' && x <= 'Z') { x = static_cast<char>(x - 'A' + 'a'); }
        if (y >= 'A' && y <= 'Z') { y = static_cast<char>(y - 'A' + 'a'); }
        if (x != y) { return false; }
    }
    return true;
}

std::string_view trimOws(std::string_view s) noexcept {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) { s.remove_prefix(1); }
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) { s.remove_suffix(1); }
    return s;
}

// The next line of `text` from `pos` without its terminator (CRLF, or a bare LF as RFC 9112 lets a
// recipient accept); false when no terminator arrived yet.
bool nextLine(std::string_view text, size_t& pos, std::string_view& line) noexcept {
    const size_t lf = text.find('\n', pos);
    if (lf == std::string_view::npos) { return false; }
    size_t end = lf;
    if (end > pos && text[end - 1] == '\r') { --end; }
    line = text.substr(pos, end - pos);
    pos = lf + 1;
    return true;
}

// Parses the request head at the start of `text`; on kOk, `*headBytes` is its length with its blank line.
Parse parseHead(std::string_view text, size_t maxBytes, Request& req, size_t* headBytes) {
    size_t pos = 0;
    std::string_view line;
    // Empty lines before a request line are skipped (RFC 9112, 2.2), within the size bound.
    do {
        if (!nextLine(text, pos, line)) { return text.size() > maxBytes ? Parse::kTooLarge : Parse::kIncomplete; }
    } while (line.empty());
    // request-line = method SP request-target SP HTTP-version
    const size_t sp1 = line.find(' ');
    const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
    if (sp2 == std::string_view::npos) { return Parse::kBad; }
    req.method = line.substr(0, sp1);
    const std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
    const std::string_view version = line.substr(sp2 + 1);
    if (!isToken(req.method) || target.empty() || target.front() != '/') { return Parse::kBad; }
    for (const char c : target) {
        if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f) { return Parse::kBad; }
    }
    if (version == "HTTP/1.1") {
        req.http10 = false;
    } else if (version == "HTTP/1.0") {
        req.http10 = true;
    } else {
        return Parse::kBad;
    }
    req.path = target.substr(0, target.find('?'));
    bool keepAlive = false;
    bool host = false;
    bool haveLength = false;
    uint64_t length = 0;
    for (;;) {
        if (!nextLine(text, pos, line)) { return text.size() > maxBytes ? Parse::kTooLarge : Parse::kIncomplete; }
        if (line.empty()) { break; }
        if (pos > maxBytes) { return Parse::kTooLarge; }
        const size_t colon = line.find(':');
        // No name, whitespace before the colon, or an obsolete folded line: all refused (RFC 9112, 5).
        if (colon == std::string_view::npos || !isToken(line.substr(0, colon))) { return Parse::kBad; }
        const std::string_view name = line.substr(0, colon);
        const std::string_view value = trimOws(line.substr(colon + 1));
        for (const char c : value) {
            if ((static_cast<unsigned char>(c) < 0x20 && c != '\t') || c == 0x7f) { return Parse::kBad; }
        }
        if (equalsIgnoreCase(name, "host")) {
            host = true;
        } else if (equalsIgnoreCase(name, "connection")) {
            std::string_view rest = value;
            while (!rest.empty()) {
                const size_t comma = rest.find(',');
                const std::string_view option = trimOws(rest.substr(0, comma));
                if (equalsIgnoreCase(option, "close")) { req.close = true; }
                if (equalsIgnoreCase(option, "keep-alive")) { keepAlive = true; }
                rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
            }
        } else if (equalsIgnoreCase(name, "content-length")) {
            if (value.empty() || value.size() > 18) { return Parse::kBad; }
            uint64_t n = 0;
            for (const char c : value) {
                if (c < '0' || c > '9') { return Parse::kBad; }
                n = n * 10 + static_cast<uint64_t>(c - '0');
            }
            if (haveLength && n != length) { return Parse::kBad; }  // two different lengths: smuggling
            haveLength = true;
            length = n;
        } else if (equalsIgnoreCase(name, "transfer-encoding")) {
            req.hasBody = true;
        }
    }
    if (pos > maxBytes) { return Parse::kTooLarge; }
    if (!req.http10 && !host) { return Parse::kBad; }  // RFC 9112, 3.2: an HTTP/1.1 request names its host
    if (length > 0) { req.hasBody = true; }
    if (req.http10 && !keepAlive) { req.close = true; }
    if (req.hasBody) { req.close = true; }
    *headBytes = pos;
    return Parse::kOk;
}

const char* reason(int status) noexcept {
    switch (status) {
        case 200: return "OK";
        case 400: return "Bad Request";
        case 404: return "Not Found";
        case 405: return "Method Not Allowed";
        case 408: return "Request Timeout";
        case 431: return "Request Header Fields Too Large";
        case 500: return "Internal Server Error";
        default: return "Error";
    }
}

// Sends one response: the head, then `body` unless `headOnly`. False when the connection failed.
bool respond(TcpStream& stream, int status, std::string_view contentType, std::string_view body, bool close,
             bool headOnly, std::string_view extraHeaders, std::chrono::milliseconds timeout) {
    std::string head = fmt::format("HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n{}Connection: {}\r\n\r\n",
                                   status, reason(status), contentType, body.size(), extraHeaders,
                                   close ? "close" : "keep-alive");
    iovec iov[2] = {{head.data(), head.size()}, {const_cast<char*>(body.data()), body.size()}};
    const int count = headOnly || body.empty() ? 1 : 2;
    return static_cast<bool>(stream.writevAll(iov, count, Deadline(timeout)));
}

// After an error response: half-closes, then reads and drops what the client still sends, for at most
// kLinger, so that the close that follows does not turn into a reset that could discard the response.
void linger(TcpStream& stream) {
    (void)stream.shutdown(SHUT_WR, Deadline(kLinger));
    const Deadline until(kLinger);
    char sink[1024];
    for (;;) {
        auto got = stream.recv(sink, sizeof sink, until);
        if (!got || *got == 0) { return; }
    }
}

// Serves one connection until it ends. Counts into `counters`.
void serveConnection(TcpStream& stream, Runtime& runtime, const MetricsEndpointOptions& options,
                     const MetricsCollector& collector, MetricsEndpoint::Counters& counters) {
    constexpr std::string_view kText = "text/plain; charset=utf-8";
    std::string buffer;
    std::optional<Clock::time_point> requestStart;  // first byte of the request being read
    char chunk[4096];
    for (;;) {
        Request req;
        size_t headBytes = 0;
        const Parse parsed = buffer.empty() ? Parse::kIncomplete
                                            : parseHead(buffer, options.maxRequestBytes, req, &headBytes);
        if (parsed == Parse::kIncomplete) {
            const Deadline deadline = requestStart ? Deadline(*requestStart + options.requestTimeout)
                                                   : Deadline(options.idleTimeout);
            // Up to one byte past the bound, so that parseHead can tell a head that is too long.
            const size_t room = std::min(sizeof chunk, options.maxRequestBytes + 1 - buffer.size());
            auto got = stream.recv(chunk, room, deadline);
            if (!got) {
                if (got.errorCode() == ETIMEDOUT && requestStart) {
                    counters.errors.fetch_add(1, std::memory_order_relaxed);
                    if (respond(stream, 408, kText, "the request did not arrive in time\n", true, false, {},
                                options.sendTimeout)) {
                        linger(stream);
                    }
                }
                return;  // idle timeout, the peer's reset, or ECANCELED (stop, shutdown)
            }
            if (*got == 0) { return; }  // the client closed
            if (!requestStart) { requestStart = Clock::now(); }
            buffer.append(chunk, *got);
            continue;
        }
        if (parsed == Parse::kBad || parsed == Parse::kTooLarge) {
            const bool large = parsed == Parse::kTooLarge;
            counters.errors.fetch_add(1, std::memory_order_relaxed);
            const std::string body = large ? fmt::format("request head longer than {} bytes\n", options.maxRequestBytes)
                                           : std::string("malformed HTTP/1.x request\n");
            if (respond(stream, large ? 431 : 400, kText, body, true, false, {}, options.sendTimeout)) {
                linger(stream);
            }
            return;
        }
        // req's views point into buffer: it is consumed only once the response is sent.
        const bool head = req.method == "HEAD";
        bool sent = false;
        if (req.path != "/metrics") {
            counters.errors.fetch_add(1, std::memory_order_relaxed);
            sent = respond(stream, 404, kText, "not found: this endpoint serves /metrics only\n", req.close, head, {},
                           options.sendTimeout);
        } else if (req.method != "GET" && !head) {
            counters.errors.fetch_add(1, std::memory_order_relaxed);
            sent = respond(stream, 405, kText, "method not allowed: use GET or HEAD\n", req.close, false,
                           "Allow: GET, HEAD\r\n", options.sendTimeout);
        } else {
            metrics::Writer writer;
            metrics::writeRuntime(writer, runtime);
            if (collector) { collector(writer); }
            auto page = writer.take();
            if (page) {
                counters.scrapes.fetch_add(1, std::memory_order_relaxed);
                sent = respond(stream, 200, metrics::kContentType, *page, req.close, head, {}, options.sendTimeout);
            } else {
                counters.errors.fetch_add(1, std::memory_order_relaxed);
                log::error("metrics endpoint: the page was refused: {}", writer.error());
                sent = respond(stream, 500, kText, "metrics page refused: " + writer.error() + "\n", req.close, head, {},
                               options.sendTimeout);
            }
        }
        if (!sent) { return; }
        buffer.erase(0, headBytes);
        requestStart.reset();
        if (!buffer.empty()) { requestStart = Clock::now(); }  // a pipelined request has begun
        if (req.close) {
            if (req.hasBody) {
                linger(stream);  // the body was not read
            } else {
                (void)stream.shutdown(SHUT_WR, Deadline(options.sendTimeout));
            }
            return;
        }
    }
}

}  // namespace

MetricsEndpoint::MetricsEndpoint(Runtime& runtime, const MetricsEndpointOptions& options, MetricsCollector collector,
                                 SocketAddress address) noexcept
    : runtime_(runtime), options_(options), collector_(std::move(collector)), address_(address) {}

Result<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::start(Runtime& runtime, const MetricsEndpointOptions& options,
                                                                 MetricsCollector collector) {
    if (options.carrier >= runtime.carrierCount() || options.maxRequestBytes < 64 ||
        options.maxRequestBytes > (size_t{1} << 20) || options.maxConnections == 0 || options.maxConnections > 4096 ||
        options.requestTimeout.count() <= 0 || options.idleTimeout.count() <= 0 || options.sendTimeout.count() <= 0) {
        return Error{EINVAL};
    }
    auto listener = TcpListener::bind(options.address, ListenOptions{.backlog = 64});
    if (!listener) { return Error{listener.errorCode()}; }
    std::unique_ptr<MetricsEndpoint> endpoint(
        new (std::nothrow) MetricsEndpoint(runtime, options, std::move(collector), listener->localAddress()));
    if (!endpoint) { return Error{ENOMEM}; }
    MetricsEndpoint* self = endpoint.get();
    auto acceptor = runtime.spawn([self, l = std::move(*listener)]() mutable noexcept { self->acceptLoop(l); },
                                  SpawnOptions{.name = "metrics-accept", .carrier = static_cast<int>(options.carrier),
                                               .pinned = true});
    if (!acceptor) { return Error{acceptor.errorCode()}; }
    endpoint->acceptor_ = std::move(*acceptor);
    return endpoint;
}

MetricsEndpoint::~MetricsEndpoint() { stop(); }

MetricsEndpointStats MetricsEndpoint::stats() const noexcept {
    MetricsEndpointStats s;
    s.accepted = counters_.accepted.load(std::memory_order_relaxed);
    s.refused = counters_.refused.load(std::memory_order_relaxed);
    s.scrapes = counters_.scrapes.load(std::memory_order_relaxed);
    s.errors = counters_.errors.load(std::memory_order_relaxed);
    return s;
}

void MetricsEndpoint::stop() noexcept {
    if (stopped_.exchange(true, std::memory_order_acq_rel)) { return; }
    if (!acceptor_.joinable()) { return; }
    acceptor_.cancel();
    acceptor_.join();
}

void MetricsEndpoint::acceptLoop(TcpListener& listener) noexcept {
    // Connection fibers are pinned here too, so this vector is only ever touched by this fiber.
    std::vector<FiberHandle<void>> connections;
    for (;;) {
        auto stream = listener.accept();
        if (!stream) {
            const int err = stream.errorCode();
            if (err == ECANCELED || err == EBADF) { break; }
            log::warn("metrics endpoint: accept: {}", std::strerror(err));
            if (!sleep(std::chrono::milliseconds(10))) { break; }  // ECANCELED at stop or shutdown
            continue;
        }
        counters_.accepted.fetch_add(1, std::memory_order_relaxed);
        std::erase_if(connections, [](FiberHandle<void>& h) {
            if (!h.done()) { return false; }
            h.join();
            return true;
        });
        if (connections.size() >= options_.maxConnections) {
            counters_.refused.fetch_add(1, std::memory_order_relaxed);
            continue;  // the stream closes here
        }
        auto fiber = runtime_.spawn(
            [this, s = std::move(*stream)]() mutable noexcept {
                try {
                    serveConnection(s, runtime_, options_, collector_, counters_);
                } catch (const std::exception& e) {  // std::bad_alloc building a page, or a collector's
                    counters_.errors.fetch_add(1, std::memory_order_relaxed);
                    log::warn("metrics endpoint: connection dropped: {}", e.what());
                } catch (...) {  // a collector's, of any type: the acceptor's join must not rethrow it
                    counters_.errors.fetch_add(1, std::memory_order_relaxed);
                    log::warn("metrics endpoint: connection dropped: an exception from the collector");
                }
            },
            SpawnOptions{.name = "metrics-conn", .carrier = static_cast<int>(options_.carrier), .pinned = true});
        if (!fiber) {
            log::warn("metrics endpoint: no fiber for a connection: {}", std::strerror(fiber.errorCode()));
            continue;
        }
        try {
            connections.push_back(std::move(*fiber));
        } catch (const std::bad_alloc&) {
            fiber->cancel();
            fiber->join();
        }
    }
    for (FiberHandle<void>& h : connections) { h.cancel(); }
    for (FiberHandle<void>& h : connections) { h.join(); }
    // Closing awaits the multishot accept's last completion, which a pending cancel would cut short.
    (void)this_fiber::acknowledgeCancellation();
    listener.close();
}

}  // namespace spindle::net
