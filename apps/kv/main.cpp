// SPDX-License-Identifier: Apache-2.0
// spindle-kv: a Redis-protocol key-value store on spindle fibers (apps/kv/server.h).
//
// With no flags it listens on 127.0.0.1:6379 with one carrier (and one shard) per core and keeps no
// log; --dir DIR keeps a write-ahead log per shard there (--appendfsync always|everysec|no). Without
// --requirepass it binds to loopback unless --address says otherwise. SIGINT or SIGTERM (or SHUTDOWN)
// stops accepting, lets connections finish the batch in hand, writes and syncs the logs, and exits 0.
//
// --stats-json FILE also writes the statistics printed at exit as one JSON object (apps/common/stats_json.h).
//
// Exit status: 0 after a clean stop; 1 when the server cannot start, a log failed or --stats-json's FILE
// cannot be opened or written; 2 for a bad flag.

#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "apps/common/backend_flag.h"
#include "apps/common/cli.h"
#include "apps/common/metrics_flag.h"
#include "apps/common/stats_json.h"
#include "apps/common/stop_signals.h"
#include "apps/kv/kv_metrics.h"
#include "apps/kv/server.h"
#include "core/io.h"
#include "core/runtime.h"

int main(int argc, char** argv) {
    std::string address;
    unsigned port = 6379;
    unsigned carriers = 0;
    std::string dir;
    std::string appendFsync = "everysec";
    uint64_t maxClients = 10000;
    uint64_t maxMemory = 0;
    std::string requirePass;
    int64_t maxBulk = 512ll * 1024 * 1024;
    uint64_t queryBufferLimit = 1ull << 30;
    bool truncateCorrupt = false;
    uint64_t autoRewritePct = 100;
    std::string autoRewriteMin = "64mb";
    std::string preallocate = "4mb";  // kDefaultPreallocate
    bool sharePort = false;
    unsigned ringEntries = 4096;
    std::string pollMode = "block";
    unsigned spinMicros = 50;
    std::string backend = "auto";
    unsigned providedBuffers = 512;
    size_t providedBufferSize = 8192;
    bool noProvidedBuffers = false;

    CLI::App app{"spindle-kv: a Redis-protocol key-value store on spindle fibers, a shard per carrier"};
    app.add_option("--address", address,
                   "numeric IPv4 or IPv6 address to listen on (default: 127.0.0.1, or 0.0.0.0 with --requirepass)");
    app.add_option("--port", port, "TCP port (0: any free port)")->check(CLI::Range(0u, 65535u))->capture_default_str();
    app.add_option("--carriers", carriers, "carriers, one shard and one listener each (0: one per core)")
        ->check(CLI::Range(0u, spindle::kMaxCarriers))->capture_default_str();
    app.add_option("--dir", dir, "data directory for the write-ahead logs (none: nothing is kept)");
    app.add_option("--appendfsync", appendFsync, "always (acknowledge after fdatasync), everysec, or no")
        ->check(CLI::IsMember({"always", "everysec", "no"}))->capture_default_str();
    app.add_option("--maxclients", maxClients, "connected clients; more get an error and are closed")
        ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 24))->capture_default_str();
    app.add_option("--maxmemory", maxMemory, "bytes of keys and values; past it writes get -OOM (0: no limit)")
        ->check(CLI::Range(uint64_t{0}, uint64_t{INT64_MAX}))->capture_default_str();
    app.add_option("--requirepass", requirePass, "password clients must give with AUTH or HELLO");
    app.add_option("--proto-max-bulk-len", maxBulk, "largest bulk string a request may carry")
        ->check(CLI::Range(int64_t{1024 * 1024}, int64_t{INT64_MAX}))->capture_default_str();
    app.add_option("--client-query-buffer-limit", queryBufferLimit, "unparsed bytes a client may have buffered")
        ->check(CLI::Range(uint64_t{1024 * 1024}, uint64_t{INT64_MAX}))->capture_default_str();
    app.add_flag("--truncate-corrupt-log", truncateCorrupt,
                 "recovery: drop a log's records from a corruption in the middle on, instead of refusing to start");
    app.add_option("--auto-aof-rewrite-percentage", autoRewritePct,
                   "rewrite a shard's log once it has grown this many percent over its size after the last rewrite "
                   "(0: never on its own)")
        ->check(CLI::Range(uint64_t{0}, uint64_t{1} << 32))->capture_default_str();
    app.add_option("--auto-aof-rewrite-min-size", autoRewriteMin,
                   "no automatic rewrite of a shard's log smaller than this (bytes, or with k, kb, m, mb, g, gb)")
        ->check([](const std::string& v) {
            uint64_t n = 0;
            return spindle::kv::parseMemorySize(v, n) ? std::string() : "not a size: " + v;
        })
        ->capture_default_str();
    app.add_option("--log-preallocate-bytes", preallocate,
                   "with --appendfsync always, write and sync this many bytes of zeros ahead of each log's end, so that "
                   "an fdatasync after a write does not have to grow the file (bytes, or with k, kb, m, mb, g, gb; 0: "
                   "append as the log grows)")
        ->check([](const std::string& v) {
            uint64_t n = 0;
            return spindle::kv::parseMemorySize(v, n) && n <= (uint64_t{1} << 30) ? std::string()
                                                                                 : "not a size up to 1gb: " + v;
        })
        ->capture_default_str();
    app.add_flag("--share-port", sharePort, "SO_REUSEPORT: let other processes bind the same port and split the clients");
    app.add_option("--ring-entries", ringEntries, "io_uring SQ entries per carrier (the CQ has twice as many)")
        ->check(CLI::Range(64u, 32768u))->capture_default_str();
    app.add_option("--provided-buffers", providedBuffers, "provided receive buffers per carrier (a power of two)")
        ->check(CLI::Range(1u, 32768u))->check(spindle::apps::powerOfTwo())->capture_default_str();
    app.add_option("--provided-buffer-size", providedBufferSize, "bytes of each provided receive buffer")
        ->check(CLI::Range(size_t{256}, size_t{1} << 20))->capture_default_str();
    app.add_flag("--no-provided-buffers", noProvidedBuffers,
                 "one receive at a time into each connection's own buffer, instead of one multishot receive per "
                 "connection into provided buffers");
    bool postedSend = true;
    app.add_flag("--posted-send,!--wait-send", postedSend,
                 "send replies without waiting for the send's completion (default), or wait for every send");
    spindle::apps::addBackendFlag(app, backend);
    std::string workerCpus;
    spindle::apps::addWorkerCpusFlag(app, workerCpus);
    app.add_option("--poll-mode", pollMode, "idle carriers: block, spin, or hybrid (spin --spin-us, then block)")
        ->check(CLI::IsMember({"block", "spin", "hybrid"}))->capture_default_str();
    app.add_option("--spin-us", spinMicros, "hybrid: microseconds an idle carrier spins before it blocks")
        ->check(CLI::Range(1u, 1000000u))->capture_default_str();
    spindle::apps::MetricsFlags metricsFlags;
    metricsFlags.addTo(app);
    spindle::apps::StatsJsonFlag statsJson;
    statsJson.addTo(app);
    if (auto status = spindle::apps::parseCommandLine(app, argc, argv)) { return *status; }
    if (!statsJson.open("spindle-kv")) { return spindle::apps::kExitFailure; }

    if (address.empty()) { address = requirePass.empty() ? "127.0.0.1" : "0.0.0.0"; }
    auto listen = spindle::net::SocketAddress::parse(address, static_cast<uint16_t>(port));
    if (!listen) {
        std::fprintf(stderr, "spindle-kv: --address %s: %s\n", address.c_str(),
                     spindle::net::SocketAddress::parseError(address).c_str());
        return spindle::apps::kExitUsage;
    }

    // Before the carriers start, so that they arrive only through the signalfd.
    ::signal(SIGPIPE, SIG_IGN);
    const int sfd = spindle::apps::blockStopSignals("spindle-kv");
    if (sfd < 0) { return spindle::apps::kExitFailure; }

    spindle::RuntimeOptions ro;
    ro.carriers = carriers;
    ro.ringEntries = ringEntries;
    ro.pollMode = spindle::apps::pollModeFromFlag(pollMode);
    ro.spinMicros = spinMicros;
    ro.backend = spindle::apps::backendFromFlag(backend);
    ro.workerCpus = spindle::apps::workerCpusFromFlag(workerCpus);
    auto rt = spindle::Runtime::start(ro);
    if (!rt) {
        std::fprintf(stderr, "spindle-kv: the runtime did not start: %s%s\n", rt.error().message().c_str(),
                     spindle::apps::startFailureNote(backend).c_str());
        return spindle::apps::kExitFailure;
    }

    spindle::kv::ServerOptions so;
    so.address = *listen;
    so.dir = dir;
    so.appendFsync = appendFsync == "always"     ? spindle::kv::Fsync::kAlways
                     : appendFsync == "everysec" ? spindle::kv::Fsync::kEverySec
                                                 : spindle::kv::Fsync::kNo;
    so.maxClients = maxClients;
    so.maxMemory = maxMemory;
    so.requirePass = requirePass;
    so.limits.maxBulkLength = maxBulk;
    so.queryBufferLimit = queryBufferLimit;
    so.truncateCorrupt = truncateCorrupt;
    so.autoRewritePercentage = autoRewritePct;
    (void)spindle::kv::parseMemorySize(autoRewriteMin, so.autoRewriteMinSize);
    (void)spindle::kv::parseMemorySize(preallocate, so.logPreallocate);
    so.shareAddress = sharePort;
    so.providedBuffers = !noProvidedBuffers;
    so.postedSend = postedSend;
    so.providedBufferCount = providedBuffers;
    so.providedBufferSize = providedBufferSize;
    auto server = spindle::kv::Server::start(*rt, so);
    if (!server) {
        std::fprintf(stderr, "spindle-kv: cannot start: %s\n", server.error().message().c_str());
        rt->shutdown();
        rt->join();
        return spindle::apps::kExitFailure;
    }
    spindle::kv::Server* s = server->get();
    const std::string bound = s->localAddress().toString();
    const unsigned carrierCount = rt->carrierCount();
    const char* backendName = spindle::toString(rt->backend());
    auto metrics = spindle::apps::startMetrics(
        *rt, metricsFlags, address, [s](spindle::metrics::Writer& w) { spindle::kv::writeServerMetrics(w, s->stats()); },
        "spindle-kv");
    if (metrics.exitStatus != 0) {
        server->reset();
        rt->shutdown();
        rt->join();
        return metrics.exitStatus;
    }
    std::fprintf(stderr, "%s\n",
                 fmt::format("spindle-kv: listening on {} with {} carrier(s), backend {}, {}", s->localAddress().toString(),
                             rt->carrierCount(), spindle::toString(rt->backend()),
                             dir.empty() ? std::string("no log") : "log in " + dir + ", appendfsync " + appendFsync)
                     .c_str());

    auto watcher = spindle::apps::watchStopSignals(*rt, sfd, "spindle-kv", "stopping", [s] { s->stop(); });
    if (!watcher) {
        std::fprintf(stderr, "spindle-kv: cannot watch signals: %s\n", watcher.error().message().c_str());
        s->stop();
    }
    const int logError = s->wait();
    const spindle::kv::ServerStats st = s->stats();
    metrics.endpoint.reset();  // before the server its collector reads
    server->reset();
    if (watcher) {
        watcher->cancel();  // after SHUTDOWN no signal came
        (void)watcher->join();
    }
    rt->shutdown();
    rt->join();
    ::close(sfd);
    std::fprintf(stderr, "%s\n",
                 fmt::format("spindle-kv: stopped after {} connections, {} commands; log: {} records, {} fdatasyncs{}",
                             st.connections, st.commands, st.log.records, st.log.syncs,
                             logError != 0 ? std::string(", failed: ") + std::strerror(logError) : std::string())
                     .c_str());
    const spindle::apps::Json json{
        {"program", "spindle-kv"},
        {"address", bound},
        {"dir", dir},
        {"appendfsync", appendFsync},
        {"backend", backendName},
        {"carriers", carrierCount},
        {"connections", st.connections},
        {"rejected_clients", st.rejectedClients},
        {"commands", st.commands},
        {"keys", st.keys},
        {"used_memory_bytes", st.usedMemory},
        {"log", spindle::apps::Json{{"records", st.log.records},
                                    {"bytes", st.log.bytes},
                                    {"fdatasyncs", st.log.syncs},
                                    {"synced_records", st.log.syncedRecords},
                                    {"error", logError != 0 ? spindle::apps::Json(std::strerror(logError))
                                                            : spindle::apps::Json()}}},
        {"replayed_records", st.replayedRecords},
        {"dropped_tail_bytes", st.droppedTailBytes},
        {"receives", spindle::apps::Json{{"provided", st.providedReceives},
                                         {"heap", st.heapReceives},
                                         {"own", st.ownBufferReceives},
                                         {"ring_exhausted", st.receiveRingExhausted}}},
    };
    const bool written = spindle::apps::writeStatsJson(statsJson, json, "spindle-kv");
    return logError != 0 || !written ? spindle::apps::kExitFailure : spindle::apps::kExitOk;
}
