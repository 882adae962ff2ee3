// SPDX-License-Identifier: Apache-2.0
#pragma once
/// spindle-httpd's own metric families (README.md, "Metrics"): what Server::stats() counts, the same
/// numbers the server prints when it stops, for the page that --metrics-port serves.

#include <cstdint>

#include "apps/httpd/server.h"
#include "base/metrics_text.h"

namespace spindle::httpd {

/// Writes the spindle_httpd_* families of `s`. Errors: as metrics::Writer's.
inline void writeServerMetrics(metrics::Writer& w, const ServerStats& s) {
    using metrics::Type;
    w.family("spindle_httpd_connections_accepted_total", Type::kCounter, "Connections accepted.");
    w.sample({}, s.accepted);
    w.family("spindle_httpd_connections_open", Type::kGauge, "Connections open now.");
    w.sample({}, s.active);
    // The per-carrier counters are read one after the other, while connections come and go: never below zero.
    w.family("spindle_httpd_connections_closed_total", Type::kCounter, "Connections closed (accepted less open).");
    w.sample({}, s.accepted > s.active ? s.accepted - s.active : uint64_t{0});
    w.family("spindle_httpd_requests_total", Type::kCounter, "Complete request heads answered.");
    w.sample({}, s.requests);
    w.family("spindle_httpd_error_responses_total", Type::kCounter,
             "Responses with a 4xx or 5xx status from the parser or a timeout.");
    w.sample({}, s.errors);
    w.family("spindle_httpd_timeouts_total", Type::kCounter,
             "Connections closed for a timeout: a request head too slow (408), or idle keep-alive.");
    w.sample({{"kind", "header"}}, s.headerTimeouts);
    w.sample({{"kind", "idle"}}, s.idleTimeouts);
    w.family("spindle_httpd_connections_fiberless", Type::kGauge, "Idle connections waiting with no fiber now.");
    w.sample({}, s.fiberless);
    w.family("spindle_httpd_fiber_releases_total", Type::kCounter, "Times an idle connection gave its fiber up.");
    w.sample({}, s.fiberReleases);
    w.family("spindle_httpd_receives_total", Type::kCounter,
             "Receives, into a buffer of the provided-buffer ring or into a heap buffer instead.");
    w.sample({{"buffer", "provided"}}, s.providedRecvs);
    w.sample({{"buffer", "heap"}}, s.fallbackRecvs);
}

}  // namespace spindle::httpd
