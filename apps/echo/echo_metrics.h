// SPDX-License-Identifier: Apache-2.0
#pragma once
/// spindle-echo's own metric families (README.md, "Metrics"): what EchoServer::stats() counts, the same
/// numbers the server prints when it stops, for the page that --metrics-port serves.

#include <cstdint>

#include "apps/echo/echo.h"
#include "base/metrics_text.h"

namespace spindle::echo {

/// Writes the spindle_echo_* families of `s`. Errors: as metrics::Writer's.
inline void writeServerMetrics(metrics::Writer& w, const ServerStats& s) {
    using metrics::Type;
    w.family("spindle_echo_connections_accepted_total", Type::kCounter, "Connections accepted.");
    w.sample({}, s.accepted);
    w.family("spindle_echo_connections_closed_total", Type::kCounter, "Connections whose fiber has ended.");
    w.sample({}, s.closed);
    // Read one after the other, while connections come and go: never below zero.
    w.family("spindle_echo_connections_open", Type::kGauge, "Connections open now.");
    w.sample({}, s.accepted > s.closed ? s.accepted - s.closed : uint64_t{0});
    w.family("spindle_echo_bytes_echoed_total", Type::kCounter, "Bytes written back to clients.");
    w.sample({}, s.bytesEchoed);
    w.family("spindle_echo_connection_errors_total", Type::kCounter,
             "Connections that ended on an error other than the peer's close.");
    w.sample({}, s.connectionErrors);
    w.family("spindle_echo_accept_errors_total", Type::kCounter, "accept() failures other than the stop itself.");
    w.sample({}, s.acceptErrors);
    w.family("spindle_echo_buffer_ring_exhausted_total", Type::kCounter,
             "Multishot receives that a carrier's provided-buffer ring ran dry under (ENOBUFS).");
    w.sample({}, s.ringExhausted);
}

}  // namespace spindle::echo
