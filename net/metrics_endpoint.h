// SPDX-License-Identifier: Apache-2.0
#pragma once
/// MetricsEndpoint: serves GET /metrics, the runtime's counters and a daemon's own in the Prometheus text
/// format (base/metrics_text.h, core/runtime_metrics.h), over HTTP/1.1 on spindle's own sockets.
///
/// One listener and its acceptor fiber, and a fiber per connection, all pinned to one carrier
/// (MetricsEndpointOptions::carrier); every wait is a fiber-blocking call with a deadline, so a slow or
/// silent scraper holds a fiber, never a carrier. A page is built when it is asked for: the runtime's
/// families, then those the daemon's collector writes; nothing is kept between scrapes.
///
/// The protocol: `GET /metrics` (a query string is ignored) answers 200 with Content-Type
/// metrics::kContentType; HEAD the same without the body. Another path gets 404, another method on
/// /metrics 405 with "Allow: GET, HEAD". A request that does not parse (request line, header line, a
/// bad Content-Length, an HTTP version other than 1.0 and 1.1) gets 400; a request line plus headers
/// longer than maxRequestBytes gets 431; a request body (Content-Length > 0 or any Transfer-Encoding)
/// is not read and the answer, whatever it is, closes the connection. Each of those errors closes the
/// connection after its response. Otherwise HTTP/1.1 keeps the connection open unless the request says
/// "Connection: close", and HTTP/1.0 closes it unless it says "Connection: keep-alive"; a kept
/// connection with no request begun for idleTimeout is closed. A request must be complete within
/// requestTimeout of its first byte (408, then close), and a response must leave within sendTimeout.
/// Connections past maxConnections are closed as soon as they are accepted. A collector whose writer
/// refused a call (a bad name, a repeated family) makes the scrape a 500 that names the refusal.
///
/// Errors: start() returns EINVAL for options out of range (a carrier index the runtime lacks, a zero
/// size, count or timeout), TcpListener::bind's errors (EADDRINUSE when the port is taken, EACCES,
/// EADDRNOTAVAIL, EMFILE) and spawn's (ENOMEM, ECANCELED). A failing connection is closed and counted.
/// Thread-safety: localAddress() and stats() from any thread or fiber. stop() and the destructor from a
/// plain thread or a fiber that is not the endpoint's.
/// Lifetime: the Runtime must outlive the endpoint; if it shuts down first, the endpoint's fibers end
/// with ECANCELED and stop() only waits for them.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "base/metrics_text.h"
#include "base/result.h"
#include "core/fiber.h"
#include "core/runtime.h"
#include "net/address.h"
#include "net/tcp.h"

namespace spindle::net {

struct MetricsEndpointOptions {
    SocketAddress address = SocketAddress::ipv4Loopback(9464);  // port 0: the kernel picks one
    unsigned carrier = 0;                         // the carrier its fibers are pinned to
    size_t maxRequestBytes = 8 * 1024;            // request line plus headers; more: 431 (64 .. 1 MiB)
    unsigned maxConnections = 16;                 // open at once; more are closed when accepted (1 .. 4096)
    std::chrono::milliseconds requestTimeout{10'000};  // from a request's first byte to its end: else 408
    std::chrono::milliseconds idleTimeout{60'000};     // a kept-alive connection waiting for its next request
    std::chrono::milliseconds sendTimeout{10'000};     // one response to leave
};

/// Counters of an endpoint (read racily).
struct MetricsEndpointStats {
    uint64_t accepted = 0;   // connections accepted (refused ones included)
    uint64_t refused = 0;    // connections closed at once, past maxConnections
    uint64_t scrapes = 0;    // 200 responses (GET or HEAD /metrics)
    uint64_t errors = 0;     // responses with a 4xx or 5xx status
};

/// Writes a daemon's own families into the page, after the runtime's. Runs on the endpoint's carrier,
/// on the connection's fiber: it may read atomics and take short locks, and must not block the thread.
using MetricsCollector = std::function<void(metrics::Writer&)>;

class MetricsEndpoint {
public:
    /// Binds the listener and starts the acceptor on options.carrier. Errors: as the class comment says.
    [[nodiscard]] static Result<std::unique_ptr<MetricsEndpoint>> start(Runtime& runtime,
                                                                         const MetricsEndpointOptions& options,
                                                                         MetricsCollector collector = {});
    MetricsEndpoint(const MetricsEndpoint&) = delete;
    MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;
    /// stop()s when still running.
    ~MetricsEndpoint();

    /// The bound address, with the port the kernel chose for port 0.
    [[nodiscard]] SocketAddress localAddress() const noexcept { return address_; }
    [[nodiscard]] MetricsEndpointStats stats() const noexcept;

    /// Stops accepting, ends every connection (a response being sent is cut short) and waits until the
    /// endpoint's fibers have ended. Idempotent.
    void stop() noexcept;

    struct Counters {
        std::atomic<uint64_t> accepted{0};
        std::atomic<uint64_t> refused{0};
        std::atomic<uint64_t> scrapes{0};
        std::atomic<uint64_t> errors{0};
    };

private:
    MetricsEndpoint(Runtime& runtime, const MetricsEndpointOptions& options, MetricsCollector collector,
                    SocketAddress address) noexcept;
    void acceptLoop(TcpListener& listener) noexcept;

    Runtime& runtime_;
    MetricsEndpointOptions options_;
    MetricsCollector collector_;
    SocketAddress address_;
    FiberHandle<void> acceptor_;
    std::atomic<bool> stopped_{false};
    Counters counters_;
};

}  // namespace spindle::net
