// SPDX-License-Identifier: Apache-2.0
#pragma once
/// --metrics-port and --metrics-address, the flags with which a daemon serves GET /metrics
/// (net/metrics_endpoint.h) on a port of its own, and the start-up that goes with them.
///
/// --metrics-port N (0..65535; 0: any free port, which the start-up line names) turns the endpoint on;
/// without it there is none. --metrics-address (default: the daemon's own --address) is where it listens;
/// one that does not parse is refused with the other bad flags.
/// The endpoint's fibers run on carrier 0. A bad value exits 2 like every flag (apps/common/cli.h); a
/// port that cannot be bound (EADDRINUSE, EACCES) is a start-up failure: a message on stderr, exit 1.

#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "apps/common/cli.h"
#include "core/runtime.h"
#include "net/address.h"
#include "net/metrics_endpoint.h"

namespace spindle::apps {

struct MetricsFlags {
    unsigned port = 0;
    std::string address;           // "": the daemon's --address
    CLI::Option* portOption = nullptr;

    void addTo(CLI::App& app) {
        portOption = app.add_option("--metrics-port", port,
                                    "serve Prometheus metrics at http://ADDRESS:PORT/metrics (0: any free port; "
                                    "default: no metrics endpoint)")
                         ->check(CLI::Range(0u, 65535u));
        app.add_option("--metrics-address", address,
                       "numeric IPv4 or IPv6 address of the metrics endpoint (default: --address)")
            ->check(CLI::Validator(
                [](std::string& text) {
                    return net::SocketAddress::parse(text, 0) ? std::string() : net::SocketAddress::parseError(text);
                },
                "ADDRESS"));
    }
    /// Whether --metrics-port was given.
    [[nodiscard]] bool on() const { return portOption != nullptr && portOption->count() > 0; }
};

/// What startMetrics() gives back: the endpoint (null when the flags leave it off), or the exit status.
struct MetricsStart {
    std::unique_ptr<net::MetricsEndpoint> endpoint;
    int exitStatus = 0;  // 0: go on; kExitUsage: the address does not parse; kExitFailure: it did not start
};

/// Starts the endpoint the flags ask for on `runtime`, with the daemon's families from `collector`, and
/// says where on stderr ("<app>: metrics on http://127.0.0.1:9464/metrics"). Errors: a message naming
/// the address and the reason on stderr, and the exit status in the result.
[[nodiscard]] inline MetricsStart startMetrics(Runtime& runtime, const MetricsFlags& flags,
                                               const std::string& daemonAddress, net::MetricsCollector collector,
                                               const char* app) {
    MetricsStart out;
    if (!flags.on()) { return out; }
    const std::string host = flags.address.empty() ? daemonAddress : flags.address;
    auto address = net::SocketAddress::parse(host, static_cast<uint16_t>(flags.port));
    if (!address) {
        std::fprintf(stderr, "%s: --metrics-address %s: %s\n", app, host.c_str(),
                     net::SocketAddress::parseError(host).c_str());
        out.exitStatus = kExitUsage;
        return out;
    }
    net::MetricsEndpointOptions options;
    options.address = *address;
    auto endpoint = net::MetricsEndpoint::start(runtime, options, std::move(collector));
    if (!endpoint) {
        std::fprintf(stderr, "%s: cannot serve metrics on %s: %s\n", app, address->toString().c_str(),
                     endpoint.error().message().c_str());
        out.exitStatus = kExitFailure;
        return out;
    }
    out.endpoint = std::move(*endpoint);
    std::fprintf(stderr, "%s: metrics on http://%s/metrics\n", app, out.endpoint->localAddress().toString().c_str());
    return out;
}

}  // namespace spindle::apps
