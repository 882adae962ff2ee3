// SPDX-License-Identifier: Apache-2.0
// spindle-httpd: an HTTP/1.1 server on spindle fibers (apps/httpd/server.h).
//
// With no flags it serves "Hello, World!" on 0.0.0.0:8080 with one carrier per core, on io_uring
// (or epoll where io_uring cannot be used; --backend picks one); --root DIR serves files from DIR
// too. SIGINT or SIGTERM begins a graceful shutdown: no new connections, requests in flight
// finish, idle connections close, and the process exits 0 within the drain time. --metrics-port N
// serves Prometheus metrics (the runtime's and the server's counters) at /metrics on port N.
//
// --stats-json FILE also writes the statistics printed at exit as one JSON object (apps/common/stats_json.h).
//
// Exit status: 0 after a graceful shutdown; 1 when the server cannot start (or --stats-json's FILE cannot be
// opened or written); 2 for a bad flag.

#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <string>

#include <fmt/format.h>

#include "apps/common/backend_flag.h"
#include "apps/common/cli.h"
#include "apps/common/metrics_flag.h"
#include "apps/common/stats_json.h"
#include "apps/common/stop_signals.h"
#include "apps/httpd/httpd_metrics.h"
#include "apps/httpd/server.h"
#include "core/io.h"
#include "core/runtime.h"

namespace {

std::chrono::milliseconds millis(double seconds) {
    return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
}

}  // namespace

int main(int argc, char** argv) {
    std::string address = "0.0.0.0";
    unsigned port = 8080;
    unsigned carriers = 0;
    std::string root;
    double headerTimeout = 10;
    double idleTimeout = 60;
    double sendTimeout = 30;
    double drainTimeout = 10;
    size_t maxHeaderBytes = 8 * 1024;
    size_t maxHeaders = 100;
    uint64_t maxBodyBytes = 1 << 20;
    size_t stackKib = spindle::httpd::kDefaultConnectionStack / 1024;
    unsigned providedBuffers = 4096;
    size_t providedBufferSize = 2048;
    bool noProvidedBuffers = false;
    unsigned ringEntries = 4096;
    std::string pollMode = "block";
    unsigned spinMicros = 50;
    std::string backend = "auto";

    CLI::App app{"spindle-httpd: HTTP/1.1 on spindle fibers (hello route, static files)"};
    app.add_option("--address", address, "numeric IPv4 or IPv6 address to listen on")->capture_default_str();
    app.add_option("--port", port, "TCP port (0: any free port)")->check(CLI::Range(0u, 65535u))->capture_default_str();
    app.add_option("--carriers", carriers, "carriers, one listener each (0: one per core)")
        ->check(CLI::Range(0u, spindle::kMaxCarriers))->capture_default_str();
    app.add_option("--root", root, "document root for static files (none: only the hello route)")
        ->check(CLI::ExistingDirectory);
    app.add_option("--header-timeout", headerTimeout, "seconds to receive a request head")
        ->check(spindle::apps::realRange(0.001, 3600.0))->capture_default_str();
    app.add_option("--idle-timeout", idleTimeout, "seconds a keep-alive connection may stay idle")
        ->check(spindle::apps::realRange(0.001, 86400.0))->capture_default_str();
    app.add_option("--send-timeout", sendTimeout, "seconds for one batch of responses to leave")
        ->check(spindle::apps::realRange(0.001, 3600.0))->capture_default_str();
    app.add_option("--drain-timeout", drainTimeout, "seconds requests in flight get after SIGINT/SIGTERM")
        ->check(spindle::apps::realRange(0.0, 3600.0))->capture_default_str();
    app.add_option("--max-header-bytes", maxHeaderBytes, "request line + headers; more: 431")
        ->check(CLI::Range(size_t{64}, size_t{1} << 20))->capture_default_str();
    app.add_option("--max-headers", maxHeaders, "header fields per request; more: 431")
        ->check(CLI::Range(size_t{1}, size_t{10000}))->capture_default_str();
    // Bodies are read and dropped, so any size works; the bound refuses -1, which CLI11 would take as 2^64 - 1.
    app.add_option("--max-body-bytes", maxBodyBytes, "request body size; more: 413")
        ->check(CLI::Range(uint64_t{0}, uint64_t{INT64_MAX}))->capture_default_str();
    app.add_option("--stack-kib", stackKib, "stack of each connection fiber in KiB")
        ->check(CLI::Range(size_t{16}, size_t{8192}))->capture_default_str();
    app.add_option("--provided-buffers", providedBuffers, "provided receive buffers per carrier (a power of two)")
        ->check(CLI::Range(1u, 32768u))->check(spindle::apps::powerOfTwo())->capture_default_str();
    app.add_option("--ring-entries", ringEntries, "io_uring SQ entries per carrier (the CQ has twice as many)")
        ->check(CLI::Range(64u, 32768u))->capture_default_str();
    spindle::apps::addBackendFlag(app, backend);
    std::string workerCpus;
    spindle::apps::addWorkerCpusFlag(app, workerCpus);
    app.add_option("--poll-mode", pollMode, "idle carriers: block, spin, or hybrid (spin --spin-us, then block)")
        ->check(CLI::IsMember({"block", "spin", "hybrid"}))->capture_default_str();
    app.add_option("--spin-us", spinMicros, "hybrid: microseconds an idle carrier spins before it blocks")
        ->check(CLI::Range(1u, 1000000u))->capture_default_str();
    app.add_option("--provided-buffer-size", providedBufferSize, "bytes of each provided receive buffer")
        ->check(CLI::Range(size_t{256}, size_t{1} << 20))->capture_default_str();
    app.add_flag("--no-provided-buffers", noProvidedBuffers, "each connection keeps its own receive buffer");
    bool noMultishotRecv = false;
    double idleFiberRelease = 1;
    app.add_option("--idle-fiber-release", idleFiberRelease,
                   "seconds after which an idle keep-alive connection gives its fiber up (0: never)")
        ->check(spindle::apps::realRange(0.0, 86400.0))->capture_default_str();
    app.add_flag("--no-multishot-recv", noMultishotRecv,
                 "with provided buffers: one receive per read instead of one multishot receive per connection");
    bool postedSend = true;
    app.add_flag("--posted-send,!--wait-send", postedSend,
                 "send responses without waiting for the send's completion (default), or wait for every send");
    spindle::apps::MetricsFlags metricsFlags;
    metricsFlags.addTo(app);
    std::string symlinks = "beneath";
    bool noSymlinks = false;
    std::string mimeTypes = "/etc/mime.types";
    app.add_option("--symlinks", symlinks,
                   "symbolic links under --root: beneath (followed while they stay under it), none, or follow")
        ->check(CLI::IsMember({"beneath", "none", "follow"}))->capture_default_str();
    app.add_flag("--no-symlinks", noSymlinks, "refuse every symbolic link under --root (--symlinks none)");
    app.add_option("--mime-types", mimeTypes, "Content-Type by extension (\"\" or missing: the built-in table)")
        ->capture_default_str();
    uint64_t spliceMinBytes = spindle::httpd::ServerOptions{}.spliceMinBytes;
    app.add_option("--splice-min-bytes", spliceMinBytes,
                   "file bodies of this many bytes or more leave by splice(2), file -> pipe -> socket; shorter "
                   "ones are copied, with their head (0: always copy)")
        ->check(CLI::Range(uint64_t{0}, uint64_t{INT64_MAX}))->capture_default_str();
    std::string accessLog;
    app.add_option("--access-log", accessLog, "append a line per request to FILE (nginx's combined format)");
    spindle::apps::StatsJsonFlag statsJson;
    statsJson.addTo(app);
    if (auto status = spindle::apps::parseCommandLine(app, argc, argv)) { return *status; }
    if (!statsJson.open("spindle-httpd")) { return 1; }

    auto listen = spindle::net::SocketAddress::parse(address, static_cast<uint16_t>(port));
    if (!listen) {
        std::fprintf(stderr, "spindle-httpd: --address %s: %s\n", address.c_str(),
                     spindle::net::SocketAddress::parseError(address).c_str());
        return 2;
    }

    // Before the carriers start, so that every thread inherits the mask and the signals arrive only
    // through the signalfd.
    ::signal(SIGPIPE, SIG_IGN);
    const int sfd = spindle::apps::blockStopSignals("spindle-httpd");
    if (sfd < 0) { return 1; }

    spindle::RuntimeOptions ro;
    ro.carriers = carriers;
    ro.ringEntries = ringEntries;  // thousands of connections keep a receive each in flight
    ro.pollMode = spindle::apps::pollModeFromFlag(pollMode);
    ro.spinMicros = spinMicros;
    ro.backend = spindle::apps::backendFromFlag(backend);
    ro.workerCpus = spindle::apps::workerCpusFromFlag(workerCpus);
    auto rt = spindle::Runtime::start(ro);
    if (!rt) {
        std::fprintf(stderr, "spindle-httpd: the runtime did not start: %s%s\n", rt.error().message().c_str(),
                     spindle::apps::startFailureNote(backend).c_str());
        return 1;
    }

    spindle::httpd::ServerOptions so;
    so.address = *listen;
    so.root = root;
    so.symlinks = noSymlinks || symlinks == "none" ? spindle::httpd::SymlinkPolicy::kNone
                  : symlinks == "follow"           ? spindle::httpd::SymlinkPolicy::kFollow
                                                   : spindle::httpd::SymlinkPolicy::kBeneath;
    so.mimeTypes = mimeTypes;
    so.accessLog = accessLog;
    so.spliceMinBytes = spliceMinBytes;
    so.limits = spindle::httpd::ParserLimits{.maxHeaderBytes = maxHeaderBytes, .maxHeaders = maxHeaders, .maxBodyBytes = maxBodyBytes};
    so.headerTimeout = millis(headerTimeout);
    so.idleTimeout = millis(idleTimeout);
    so.sendTimeout = millis(sendTimeout);
    so.drainTimeout = millis(drainTimeout);
    so.connectionStackSize = stackKib * 1024;
    so.providedBuffers = !noProvidedBuffers;
    so.multishotRecv = !noMultishotRecv;
    so.postedSend = postedSend;
    so.idleFiberRelease = millis(idleFiberRelease);
    so.providedBufferCount = providedBuffers;
    so.providedBufferSize = providedBufferSize;
    auto server = spindle::httpd::Server::start(*rt, so);
    if (!server) {
        std::fprintf(stderr, "spindle-httpd: cannot start: %s\n", server.error().message().c_str());
        rt->shutdown();
        rt->join();
        return 1;
    }
    spindle::httpd::Server* s = server->get();
    const std::string bound = s->localAddress().toString();
    const unsigned carrierCount = rt->carrierCount();
    const char* backendName = spindle::toString(rt->backend());
    std::fprintf(stderr, "%s\n",
                 fmt::format("spindle-httpd: listening on {} with {} carrier(s), backend {}{}",
                             s->localAddress().toString(), rt->carrierCount(), spindle::toString(rt->backend()),
                             root.empty() ? std::string() : ", root " + root)
                     .c_str());
    auto metrics = spindle::apps::startMetrics(
        *rt, metricsFlags, address,
        [s](spindle::metrics::Writer& w) { spindle::httpd::writeServerMetrics(w, s->stats()); }, "spindle-httpd");
    if (metrics.exitStatus != 0) {
        server->reset();
        rt->shutdown();
        rt->join();
        return metrics.exitStatus;
    }

    // The signal watcher: one poll on the signalfd through the backend.
    auto watcher = spindle::apps::watchStopSignals(*rt, sfd, "spindle-httpd", "draining", [s] { s->stop(); });
    if (!watcher) {
        std::fprintf(stderr, "spindle-httpd: cannot watch signals: %s\n", watcher.error().message().c_str());
        s->stop();
    }
    s->wait();
    metrics.endpoint.reset();  // before the server its collector reads
    const spindle::httpd::ServerStats st = s->stats();
    server->reset();
    if (watcher) { (void)watcher->join(); }
    rt->shutdown();
    rt->join();
    ::close(sfd);
    std::fprintf(stderr, "%s\n",
                 fmt::format("spindle-httpd: stopped after {} connections, {} requests ({} errors, {} header "
                             "timeouts, {} idle timeouts; receives: {} into provided buffers, {} into heap buffers)",
                             st.accepted, st.requests, st.errors, st.headerTimeouts, st.idleTimeouts, st.providedRecvs,
                             st.fallbackRecvs)
                     .c_str());
    const spindle::apps::Json json{
        {"program", "spindle-httpd"},
        {"address", bound},
        {"root", root},
        {"backend", backendName},
        {"carriers", carrierCount},
        {"connections", st.accepted},
        {"requests", st.requests},
        {"error_responses", st.errors},
        {"header_timeouts", st.headerTimeouts},
        {"idle_timeouts", st.idleTimeouts},
        {"fiber_releases", st.fiberReleases},
        {"receives", spindle::apps::Json{{"provided", st.providedRecvs}, {"heap", st.fallbackRecvs}}},
    };
    return spindle::apps::writeStatsJson(statsJson, json, "spindle-httpd") ? 0 : 1;
}
