// SPDX-License-Identifier: Apache-2.0
// spindle-echo: a TCP echo server on spindle fibers, and the ping-pong client that measures it (or
// any other echo server). The logic lives in apps/echo/echo.{h,cpp}; this file parses flags.
//
//   spindle-echo [server] [--address 0.0.0.0] [--port 7000] [--carriers N] [--reuse-port|--single-listener]
//                         [--poll-mode block|spin|hybrid] [--backend auto|io_uring|epoll]
//                         [--metrics-port N [--metrics-address ADDR]] ...
//   spindle-echo client --address 127.0.0.1 --port 7000 --connections N --duration S --size BYTES
//                       --warmup S [--carriers N] [--backend auto|io_uring|epoll] [--json] ...
//   spindle-echo server --udp [--dpdk --dpdk-port VDEV --ip ADDR/PREFIX [--eal "ARGS"]] --port P
//   spindle-echo client --udp [--dpdk --dpdk-port VDEV --ip ADDR/PREFIX] --address SERVER --port P
//                       --window W ...
//   spindle-echo udp-pair [--dpdk] --window W --size BYTES --duration S --warmup S
//
// --udp echoes datagrams (kernel sockets through the carriers' driver, or with --dpdk spindle's own
// stack on a DPDK port); the UDP client keeps --window datagrams outstanding, one per fiber. udp-pair
// runs the UDP server (carrier 0) and client (carrier 1) in one process: over kernel sockets on
// loopback, or with --dpdk over two net_ring ports wired back to back; it prints the client's line
// plus the process's CPU per message.
//
// The server runs until SIGINT or SIGTERM (read from a signalfd by a fiber), then stops accepting,
// ends its connections and exits 0. The client prints one line of key=value pairs (or one JSON object
// with --json) and exits 0 when every connection ran to the end without an error, 1 otherwise.
//
// The server's --stats-json FILE also writes the statistics it prints when it stops as one JSON object
// (apps/common/stats_json.h); the client's --json prints its report as one (both through nlohmann::json).
//
// Exit status: 0 done; 1 a set-up error, a failed connection or a --stats-json FILE that cannot be opened
// or written; 2 a bad flag value.

#include <signal.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <arpa/inet.h>
#include <chrono>
#include <sstream>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "apps/common/backend_flag.h"
#include "apps/common/cli.h"
#include "apps/common/metrics_flag.h"
#include "apps/common/stats_json.h"
#include "apps/common/stop_signals.h"
#include "apps/echo/echo.h"
#include "apps/echo/echo_metrics.h"
#include "apps/echo/udp_echo.h"
#include "core/io.h"
#include "core/runtime.h"

#if defined(SPINDLE_HAVE_DPDK)
#include <rte_eth_ring.h>
#include <rte_ring.h>

#include "net/dpdk/eal.h"
#include "net/dpdk/port.h"
#include "net/dpdk/stack.h"
#endif

namespace {

using spindle::apps::kExitFailure;
using spindle::apps::kExitUsage;

struct RuntimeFlags {
    unsigned carriers = 0;
    std::string pollMode = "block";
    unsigned spinMicros = 50;
    unsigned ringEntries = 256;
    bool noBind = false;
    std::string backend = "auto";

    void addTo(CLI::App& app) {
        app.add_option("--carriers", carriers, "carriers (0: one per core of the process cpuset)")
            ->check(CLI::Range(0u, spindle::kMaxCarriers));
        app.add_option("--poll-mode", pollMode, "what an idle carrier does: block, spin or hybrid")
            ->check(CLI::IsMember({"block", "spin", "hybrid"}));
        app.add_option("--spin-us", spinMicros, "hybrid: microseconds an idle carrier spins before it parks")
            ->check(CLI::Range(1u, 1000000u));
        app.add_option("--ring-entries", ringEntries, "SQ entries per carrier ring")->check(CLI::Range(8u, 32768u));
        app.add_flag("--no-bind", noBind, "do not pin carrier threads (taskset still applies)");
        spindle::apps::addBackendFlag(app, backend);
    }

    spindle::RuntimeOptions options() const {
        spindle::RuntimeOptions o;
        o.carriers = carriers;
        o.pollMode = spindle::apps::pollModeFromFlag(pollMode);
        o.spinMicros = spinMicros;
        o.ringEntries = ringEntries;
        o.bindCarriers = !noBind;
        o.backend = spindle::apps::backendFromFlag(backend);
        // Sockets use no registered buffers: do not pin 4 MiB per carrier for nothing.
        o.fixedBufferCount = 0;
        return o;
    }
};

// Raises the soft descriptor limit to the hard one: a thousand connections need more than 1024.
void raiseDescriptorLimit() {
    rlimit rl{};
    if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        (void)::setrlimit(RLIMIT_NOFILE, &rl);
    }
}

std::optional<spindle::net::SocketAddress> parseAddress(const std::string& host, unsigned port) {
    auto address = spindle::net::SocketAddress::parse(host, static_cast<uint16_t>(port));
    if (!address) {
        std::fprintf(stderr, "spindle-echo: not a numeric IPv4 or IPv6 address: %s\n", host.c_str());
        return std::nullopt;
    }
    return *address;
}


// Waits on a fiber for a signal from `sfd` (apps/common/stop_signals.h); returns its number (0 when the
// runtime went down first).
int waitForStopSignal(spindle::Runtime& rt, int sfd) {
    auto waiter = spindle::apps::watchStopSignals(rt, sfd, "spindle-echo", "stopping", [] {});
    if (!waiter) {
        std::fprintf(stderr, "spindle-echo: spawn: %s\n", waiter.error().message().c_str());
        return 0;
    }
    return waiter->join();
}

// User plus system CPU of the process so far, in seconds.
double processCpuSeconds() {
    rusage ru{};
    ::getrusage(RUSAGE_SELF, &ru);
    return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

struct UdpClientFlags {
    unsigned window = 1;
    size_t size = 64;
    double warmup = 1.0;
    double duration = 5.0;
    unsigned timeoutMs = 200;

    void addTo(CLI::App& app) {
        app.add_option("--window", window, "datagrams outstanding (one client fiber each)")->check(CLI::Range(1u, 4096u));
        app.add_option("--udp-timeout-ms", timeoutMs, "an echo later than this counts as lost")->check(CLI::Range(1u, 60000u));
    }
    spindle::echo::UdpClientOptions options(int carrier) const {
        spindle::echo::UdpClientOptions o;
        o.window = window;
        o.messageSize = size;
        o.warmup = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(warmup));
        o.duration = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(duration));
        o.timeout = std::chrono::milliseconds(timeoutMs);
        o.carrier = carrier;
        return o;
    }
};

#if defined(SPINDLE_HAVE_DPDK)

// --dpdk and what goes with it.
struct DpdkFlags {
    bool on = false;
    std::string eal;                       // extra EAL arguments, split on spaces
    std::string device = "net_tap0,iface=spindle0";
    std::string ip;                        // ADDR/PREFIX
    std::string gateway;
    unsigned memoryMb = 256;
    unsigned queues = 1;

    void addTo(CLI::App& app) {
        app.add_flag("--dpdk", on, "with --udp: spindle's own stack on a DPDK port instead of kernel sockets");
        app.add_option("--eal", eal, "extra EAL arguments (spindle passes --no-huge, --no-pci and a file prefix)");
        app.add_option("--dpdk-port", device, "the port: a vdev string or a PCI address")->capture_default_str();
        app.add_option("--ip", ip, "the interface's IPv4 address and prefix length, e.g. 198.18.0.1/24");
        app.add_option("--gateway", gateway, "IPv4 gateway for destinations off the subnet");
        app.add_option("--dpdk-memory-mb", memoryMb, "EAL memory without hugepages, MB")->check(CLI::Range(64u, 65536u));
        app.add_option("--dpdk-queues", queues,
                       "RX/TX queue pairs, queue q polled by carrier q (the server answers each queue on its carrier; "
                       "the client's fibers spread over them)")
            ->check(CLI::Range(1u, 64u))
            ->capture_default_str();
    }

    // The port's options: one queue pair per lane.
    [[nodiscard]] spindle::dpdk::PortOptions portOptions() const {
        spindle::dpdk::PortOptions o;
        o.queues = queues;
        return o;
    }

    bool startEal() const {
        spindle::dpdk::EalOptions o;
        o.memoryMb = memoryMb;
        std::istringstream words(eal);
        for (std::string w; words >> w;) { o.extraArgs.push_back(w); }
        std::string why;
        if (!spindle::dpdk::startEal(o, &why)) {
            std::fprintf(stderr, "spindle-echo: DPDK: %s\n", why.c_str());
            return false;
        }
        return true;
    }
};

std::optional<uint32_t> parseIpv4(const std::string& text) {
    in_addr a{};
    if (::inet_pton(AF_INET, text.c_str(), &a) != 1) { return std::nullopt; }
    return a.s_addr;
}

// "198.18.0.1/24" into the interface options; false (with a message) when it is not that.
bool parseIpPrefix(const std::string& text, const std::string& gateway, spindle::dpdk::InterfaceOptions& o) {
    const size_t slash = text.find('/');
    auto addr = parseIpv4(text.substr(0, slash));
    unsigned prefix = 24;
    if (slash != std::string::npos) {
        try {
            prefix = static_cast<unsigned>(std::stoul(text.substr(slash + 1)));
        } catch (...) {
            prefix = 99;
        }
    }
    if (!addr || prefix > 32 || *addr == 0) {
        std::fprintf(stderr, "spindle-echo: --ip wants an IPv4 address and prefix length, e.g. 198.18.0.1/24 (got '%s')\n",
                     text.c_str());
        return false;
    }
    o.ip = *addr;
    o.prefixLength = prefix;
    if (!gateway.empty()) {
        auto g = parseIpv4(gateway);
        if (!g) {
            std::fprintf(stderr, "spindle-echo: --gateway: not an IPv4 address: %s\n", gateway.c_str());
            return false;
        }
        o.gateway = *g;
    }
    return true;
}

// With --dpdk: the interface options from --ip/--gateway, then EAL. Returns 0, or the exit status:
// kExitUsage for a flag that does not parse, kExitFailure when EAL does not start.
int prepareDpdk(const DpdkFlags& flags, spindle::dpdk::InterfaceOptions& io) {
    if (!flags.on) { return 0; }
    if (!parseIpPrefix(flags.ip, flags.gateway, io)) { return kExitUsage; }
    return flags.startEal() ? 0 : kExitFailure;
}

// A port and an interface on its queues, queue q run by carrier (`carrier` + q) mod the carrier
// count; torn down in order by its destructor.
struct DpdkPath {
    spindle::Runtime& rt;
    int carrier = 0;
    spindle::dpdk::Port port;
    std::unique_ptr<spindle::dpdk::Interface> iface;

    DpdkPath(spindle::Runtime& runtime, int c) : rt(runtime), carrier(c) {}
    ~DpdkPath() {
        if (iface) {
            // From a fiber: each running queue stops on its own carrier.
            auto f = rt.spawn([this]() noexcept { (void)iface->stop(); }, spindle::SpawnOptions{.carrier = carrier});
            if (f) { f->join(); }
        }
        iface.reset();
        if (port.isOpen()) { (void)port.close(); }
    }

    bool start(spindle::dpdk::Port p, const spindle::dpdk::InterfaceOptions& o) {
        port = std::move(p);
        std::vector<unsigned> queues;
        for (unsigned q = 0; q < port.queues(); ++q) { queues.push_back(q); }
        auto i = spindle::dpdk::Interface::create(port, queues, o);
        if (!i) {
            std::fprintf(stderr, "spindle-echo: interface: %s\n", i.error().message().c_str());
            return false;
        }
        iface = std::move(*i);
        for (const unsigned q : queues) {
            const int on = static_cast<int>((static_cast<unsigned>(carrier) + q) % rt.carrierCount());
            auto f = rt.spawn([this, q]() noexcept { return iface->start(q); },
                              spindle::SpawnOptions{.carrier = on, .pinned = true});
            if (!f) { return false; }
            if (auto r = f->join(); !r) {
                std::fprintf(stderr, "spindle-echo: polling queue %u of the port on carrier %d: %s\n", q, on,
                             r.error().message().c_str());
                return false;
            }
        }
        return true;
    }
};

#endif

int runServer(const RuntimeFlags& rtFlags, const std::string& host, unsigned port, spindle::echo::ServerOptions options,
              const spindle::apps::MetricsFlags& metricsFlags, spindle::apps::StatsJsonFlag& statsJson) {
    auto address = parseAddress(host, port);
    if (!address) { return kExitUsage; }
    // Before the carriers start, so that every thread inherits the mask and the signalfd is their only way in.
    const int sfd = spindle::apps::blockStopSignals("spindle-echo");
    if (sfd < 0) { return kExitFailure; }
    auto rt = spindle::Runtime::start(rtFlags.options());
    if (!rt) {
        std::fprintf(stderr, "spindle-echo: the runtime did not start: %s%s\n", rt.error().message().c_str(),
                     spindle::apps::startFailureNote(rtFlags.backend).c_str());
        return kExitFailure;
    }
    options.address = *address;
    auto server = spindle::echo::EchoServer::start(*rt, options);
    if (!server) {
        std::fprintf(stderr, "spindle-echo: cannot listen on %s: %s\n", address->toString().c_str(),
                     server.error().message().c_str());
        rt->shutdown();
        rt->join();
        return kExitFailure;
    }
    std::fprintf(stderr, "spindle-echo: listening on %s (%u listener%s, %u carrier%s, backend %s, poll mode %s)\n",
                 (*server)->localAddress().toString().c_str(), (*server)->listenerCount(),
                 (*server)->listenerCount() == 1 ? "" : "s", rt->carrierCount(), rt->carrierCount() == 1 ? "" : "s",
                 spindle::toString(rt->backend()), rtFlags.pollMode.c_str());
    spindle::echo::EchoServer* s = server->get();
    spindle::apps::Json json{{"program", "spindle-echo"},
                             {"transport", "tcp"},
                             {"address", s->localAddress().toString()},
                             {"backend", spindle::toString(rt->backend())},
                             {"carriers", rt->carrierCount()}};
    auto metrics = spindle::apps::startMetrics(
        *rt, metricsFlags, host, [s](spindle::metrics::Writer& w) { spindle::echo::writeServerMetrics(w, s->stats()); },
        "spindle-echo");
    if (metrics.exitStatus != 0) {
        server->reset();
        rt->shutdown();
        rt->join();
        return metrics.exitStatus;
    }
    const int signo = waitForStopSignal(*rt, sfd);
    metrics.endpoint.reset();  // before the server its collector reads
    (*server)->stop();
    const spindle::echo::ServerStats stats = (*server)->stats();
    // What the driver did, for syscalls per message: enters are io_uring_enter calls, or epoll_wait
    // calls on the epoll backend (whose sqes and cqes count operations started and completed).
    spindle::apps::Json perCarrier = spindle::apps::Json::array();
    for (const spindle::CarrierStats& c : rt->stats()) {
        perCarrier.push({{"carrier", c.index}, {"pu", c.pu}, {"enters", c.enters}, {"parks", c.parks},
                         {"idle_spins", c.idleSpins}, {"sqes", c.sqesSubmitted}, {"cqes", c.cqesReaped},
                         {"fibers_run", c.fibersRun}});
        std::fprintf(stderr,
                     "spindle-echo: carrier %u (pu %d): enters %llu parks %llu idle spins %llu sqes %llu cqes %llu "
                     "fibers run %llu\n",
                     c.index, c.pu, static_cast<unsigned long long>(c.enters), static_cast<unsigned long long>(c.parks),
                     static_cast<unsigned long long>(c.idleSpins), static_cast<unsigned long long>(c.sqesSubmitted),
                     static_cast<unsigned long long>(c.cqesReaped), static_cast<unsigned long long>(c.fibersRun));
    }
    server->reset();
    rt->shutdown();
    rt->join();
    ::close(sfd);
    std::fprintf(stderr,
                 "spindle-echo: %s; accepted %llu connections, echoed %llu bytes, %llu connection errors, "
                 "%llu accept errors\n",
                 signo != 0 ? strsignal(signo) : "stopped", static_cast<unsigned long long>(stats.accepted),
                 static_cast<unsigned long long>(stats.bytesEchoed),
                 static_cast<unsigned long long>(stats.connectionErrors),
                 static_cast<unsigned long long>(stats.acceptErrors));
    json.set("signal", signo != 0 ? spindle::apps::Json(strsignal(signo)) : spindle::apps::Json())
        .set("connections", stats.accepted)
        .set("closed", stats.closed)
        .set("bytes_echoed", stats.bytesEchoed)
        .set("connection_errors", stats.connectionErrors)
        .set("accept_errors", stats.acceptErrors)
        .set("buffer_ring_exhausted", stats.ringExhausted)
        .set("per_carrier", std::move(perCarrier));
    return spindle::apps::writeStatsJson(statsJson, json, "spindle-echo") ? 0 : kExitFailure;
}

int runClient(const RuntimeFlags& rtFlags, const std::string& host, unsigned port, spindle::echo::ClientOptions options,
              double warmup, double duration, bool json) {
    auto address = parseAddress(host, port);
    if (!address) { return kExitUsage; }
    options.address = *address;
    options.warmup = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(warmup));
    options.duration = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(duration));
    auto rt = spindle::Runtime::start(rtFlags.options());
    if (!rt) {
        std::fprintf(stderr, "spindle-echo: the runtime did not start: %s%s\n", rt.error().message().c_str(),
                     spindle::apps::startFailureNote(rtFlags.backend).c_str());
        return kExitFailure;
    }
    auto report = spindle::echo::runClient(*rt, options);
    rt->shutdown();
    rt->join();
    if (!report) {
        std::fprintf(stderr, "spindle-echo: client: %s\n", report.error().message().c_str());
        return kExitFailure;
    }
    const std::string line = json ? spindle::echo::formatReportJson(*report) : spindle::echo::formatReport(*report);
    std::printf("%s\n", line.c_str());
    if (!report->ok()) {
        std::fprintf(stderr, "spindle-echo: %u of %u connections failed; first error: %s\n", report->failedConnections,
                     report->connections, report->firstError.c_str());
        return kExitFailure;
    }
    return 0;
}


#if defined(SPINDLE_HAVE_DPDK)
using DpdkFlagsArg = DpdkFlags;
#else
struct DpdkFlagsArg {
    bool on = false;
};
#endif

int runUdpServer(const RuntimeFlags& rtFlags, const std::string& host, unsigned port, const DpdkFlagsArg& dpdkFlags,
                 spindle::apps::StatsJsonFlag& statsJson) {
    const int sfd = spindle::apps::blockStopSignals("spindle-echo");
    if (sfd < 0) { return kExitFailure; }
#if defined(SPINDLE_HAVE_DPDK)
    spindle::dpdk::InterfaceOptions io;
    if (const int rc = prepareDpdk(dpdkFlags, io); rc != 0) { return rc; }
#endif
    auto rt = spindle::Runtime::start(rtFlags.options());
    if (!rt) {
        std::fprintf(stderr, "spindle-echo: the runtime did not start: %s%s\n", rt.error().message().c_str(),
                     spindle::apps::startFailureNote(rtFlags.backend).c_str());
        return kExitFailure;
    }
    std::unique_ptr<spindle::echo::UdpEchoServer> server;
#if defined(SPINDLE_HAVE_DPDK)
    std::unique_ptr<DpdkPath> path;
    if (dpdkFlags.on) {
        std::string why;
        auto p = spindle::dpdk::Port::open(dpdkFlags.device, dpdkFlags.portOptions(), &why);
        if (!p) {
            std::fprintf(stderr, "spindle-echo: DPDK port: %s\n", why.c_str());
            return kExitFailure;
        }
        path = std::make_unique<DpdkPath>(*rt, 0);
        if (!path->start(std::move(*p), io)) { return kExitFailure; }
        auto s = spindle::echo::startDpdkUdpEcho(*rt, *path->iface, static_cast<uint16_t>(port));
        if (!s) {
            std::fprintf(stderr, "spindle-echo: UDP port %u: %s\n", port, s.error().message().c_str());
            return kExitFailure;
        }
        server = std::move(*s);
        const auto mac = path->port.mac();
        std::fprintf(stderr,
                     "spindle-echo: UDP echo over DPDK port %s (MAC %02x:%02x:%02x:%02x:%02x:%02x, %u queue%s), %s port %u\n",
                     path->port.name().c_str(), mac[0], mac[1], mac[2], mac[3], mac[4], mac[5], path->port.queues(),
                     path->port.queues() == 1 ? "" : "s", dpdkFlags.ip.c_str(), port);
    }
#endif
    unsigned boundPort = port;  // the kernel's choice for --port 0
    if (!dpdkFlags.on) {
        auto address = parseAddress(host, port);
        if (!address) { return kExitUsage; }
        uint16_t bound = 0;
        auto s = spindle::echo::startKernelUdpEcho(*rt, *address, &bound);
        if (!s) {
            std::fprintf(stderr, "spindle-echo: cannot bind UDP %s: %s\n", address->toString().c_str(),
                         s.error().message().c_str());
            return kExitFailure;
        }
        server = std::move(*s);
        boundPort = bound;
        std::fprintf(stderr, "spindle-echo: UDP echo on %s port %u (%u carriers, backend %s)\n", host.c_str(), bound,
                     rt->carrierCount(), spindle::toString(rt->backend()));
    }
    const int signo = waitForStopSignal(*rt, sfd);
    server->stop();
    const uint64_t echoed = server->echoed();
    server.reset();
#if defined(SPINDLE_HAVE_DPDK)
    if (path) {
        const spindle::dpdk::InterfaceStats st = path->iface->stats();
        std::fprintf(stderr,
                     "spindle-echo: arp answered %llu, echo replies %llu, udp received %llu, drops: truncated %llu "
                     "not-for-us %llu bad-checksum %llu fragment %llu malformed %llu unsupported %llu\n",
                     static_cast<unsigned long long>(st.arpRequestsAnswered), static_cast<unsigned long long>(st.echoReplies),
                     static_cast<unsigned long long>(st.udpReceived),
                     static_cast<unsigned long long>(st.drops[1]), static_cast<unsigned long long>(st.drops[2]),
                     static_cast<unsigned long long>(st.drops[3]), static_cast<unsigned long long>(st.drops[4]),
                     static_cast<unsigned long long>(st.drops[5]), static_cast<unsigned long long>(st.drops[6]));
        for (unsigned q = 0; q < path->port.queues(); ++q) {
            const spindle::dpdk::QueueStats qs = path->port.stats(q);
            std::fprintf(stderr, "spindle-echo: queue %u: rx %llu tx %llu dropped %llu no-mbuf %llu\n", q,
                         static_cast<unsigned long long>(qs.rxPackets), static_cast<unsigned long long>(qs.txPackets),
                         static_cast<unsigned long long>(qs.dropped), static_cast<unsigned long long>(qs.noMbuf));
        }
    }
    path.reset();
#endif
    rt->shutdown();
    rt->join();
    ::close(sfd);
    std::fprintf(stderr, "spindle-echo: %s; echoed %llu datagrams\n", signo != 0 ? strsignal(signo) : "stopped",
                 static_cast<unsigned long long>(echoed));
    const spindle::apps::Json json{
        {"program", "spindle-echo"},
        {"transport", dpdkFlags.on ? "udp-dpdk" : "udp"},
        {"port", boundPort},
        {"backend", spindle::toString(rt->backend())},
        {"carriers", rt->carrierCount()},
        {"signal", signo != 0 ? spindle::apps::Json(strsignal(signo)) : spindle::apps::Json()},
        {"datagrams_echoed", echoed},
    };
    return spindle::apps::writeStatsJson(statsJson, json, "spindle-echo") ? 0 : kExitFailure;
}

int printUdpReport(const spindle::Result<spindle::echo::UdpReport>& report, const std::string& extra) {
    if (!report) {
        std::fprintf(stderr, "spindle-echo: client: %s\n", report.error().message().c_str());
        return kExitFailure;
    }
    std::printf("%s\n", spindle::echo::formatUdpReport(*report, extra).c_str());
    if (!report->ok()) {
        std::fprintf(stderr, "spindle-echo: the UDP client failed: %s\n", report->firstError.c_str());
        return kExitFailure;
    }
    return 0;
}

int runUdpClient(const RuntimeFlags& rtFlags, const std::string& host, unsigned port, const UdpClientFlags& flags,
                 const DpdkFlagsArg& dpdkFlags) {
#if defined(SPINDLE_HAVE_DPDK)
    spindle::dpdk::InterfaceOptions io;
    if (const int rc = prepareDpdk(dpdkFlags, io); rc != 0) { return rc; }
#endif
    auto rt = spindle::Runtime::start(rtFlags.options());
    if (!rt) {
        std::fprintf(stderr, "spindle-echo: the runtime did not start: %s\n", rt.error().message().c_str());
        return kExitFailure;
    }
    int rc = kExitFailure;
#if defined(SPINDLE_HAVE_DPDK)
    if (dpdkFlags.on) {
        auto serverIp = parseIpv4(host);
        if (!serverIp) {
            std::fprintf(stderr, "spindle-echo: --address: not an IPv4 address: %s\n", host.c_str());
            return kExitUsage;
        }
        std::string why;
        auto p = spindle::dpdk::Port::open(dpdkFlags.device, dpdkFlags.portOptions(), &why);
        if (!p) {
            std::fprintf(stderr, "spindle-echo: DPDK port: %s\n", why.c_str());
            return kExitFailure;
        }
        {
            DpdkPath path(*rt, 0);
            if (path.start(std::move(*p), io)) {
                const double cpu0 = processCpuSeconds();
                auto report = spindle::echo::runDpdkUdpClient(
                    *rt, *path.iface, spindle::dpdk::Endpoint{*serverIp, static_cast<uint16_t>(port)}, flags.options(0));
                rc = printUdpReport(report, fmt::format("transport=dpdk client_cpu_s={:.3f}", processCpuSeconds() - cpu0));
            }
        }
        rt->shutdown();
        rt->join();
        return rc;
    }
#endif
    auto address = parseAddress(host, port);
    if (!address) { return kExitUsage; }
    const double cpu0 = processCpuSeconds();
    auto report = spindle::echo::runKernelUdpClient(*rt, *address, flags.options(-1));
    rc = printUdpReport(report, fmt::format("transport=kernel client_cpu_s={:.3f}", processCpuSeconds() - cpu0));
    rt->shutdown();
    rt->join();
    return rc;
}

// Server on carrier 0, client on carrier 1, in this process.
int runUdpPair(const RuntimeFlags& rtFlags, const UdpClientFlags& flags, bool overDpdk) {
    RuntimeFlags two = rtFlags;
    two.carriers = 2;
#if defined(SPINDLE_HAVE_DPDK)
    DpdkFlags dpdkFlags;
    if (overDpdk && !dpdkFlags.startEal()) { return kExitFailure; }
#else
    if (overDpdk) {
        std::fprintf(stderr, "spindle-echo: built without DPDK (libdpdk-dev was not found)\n");
        return kExitFailure;
    }
#endif
    auto rt = spindle::Runtime::start(two.options());
    if (!rt) {
        std::fprintf(stderr, "spindle-echo: the runtime did not start: %s\n", rt.error().message().c_str());
        return kExitFailure;
    }
    int rc = kExitFailure;
    double cpu0 = 0;
    double cpu1 = 0;
    spindle::Result<spindle::echo::UdpReport> report = spindle::Error{EINVAL};
    if (!overDpdk) {
        uint16_t bound = 0;
        auto server = spindle::echo::startKernelUdpEcho(*rt, spindle::net::SocketAddress::ipv4Loopback(0), &bound, 0);
        if (!server) {
            std::fprintf(stderr, "spindle-echo: UDP echo: %s\n", server.error().message().c_str());
            return kExitFailure;
        }
        cpu0 = processCpuSeconds();
        report = spindle::echo::runKernelUdpClient(*rt, spindle::net::SocketAddress::ipv4Loopback(bound), flags.options(1));
        cpu1 = processCpuSeconds();
        (*server)->stop();
    }
#if defined(SPINDLE_HAVE_DPDK)
    if (overDpdk) {
        // Two ring ports wired back to back: what A sends, B receives, and the other way round.
        const std::string tag = std::to_string(::getpid());
        rte_ring* ab = rte_ring_create(("echo-ab-" + tag).c_str(), 1024, SOCKET_ID_ANY, RING_F_SP_ENQ | RING_F_SC_DEQ);
        rte_ring* ba = rte_ring_create(("echo-ba-" + tag).c_str(), 1024, SOCKET_ID_ANY, RING_F_SP_ENQ | RING_F_SC_DEQ);
        const int idA = ab && ba ? rte_eth_from_rings(("echoA" + tag).c_str(), &ba, 1, &ab, 1, SOCKET_ID_ANY) : -1;
        const int idB = ab && ba ? rte_eth_from_rings(("echoB" + tag).c_str(), &ab, 1, &ba, 1, SOCKET_ID_ANY) : -1;
        if (idA < 0 || idB < 0) {
            std::fprintf(stderr, "spindle-echo: cannot make two ring ports\n");
            return kExitFailure;
        }
        auto pa = spindle::dpdk::Port::attach(static_cast<uint16_t>(idA));
        auto pb = spindle::dpdk::Port::attach(static_cast<uint16_t>(idB));
        if (!pa || !pb) { return kExitFailure; }
        {
            DpdkPath server(*rt, 0);
            DpdkPath client(*rt, 1);
            spindle::dpdk::InterfaceOptions oa;
            oa.ip = *parseIpv4("198.18.0.1");
            spindle::dpdk::InterfaceOptions ob = oa;
            ob.ip = *parseIpv4("198.18.0.2");
            if (server.start(std::move(*pa), oa) && client.start(std::move(*pb), ob)) {
                auto echo = spindle::echo::startDpdkUdpEcho(*rt, *server.iface, 7);
                if (echo) {
                    cpu0 = processCpuSeconds();
                    report = spindle::echo::runDpdkUdpClient(*rt, *client.iface, spindle::dpdk::Endpoint{oa.ip, 7},
                                                             flags.options(1));
                    cpu1 = processCpuSeconds();
                    (*echo)->stop();
                }
            }
        }
        rte_ring_free(ab);
        rte_ring_free(ba);
    }
#endif
    std::string extra = fmt::format("transport={}", overDpdk ? "dpdk" : "kernel");
    if (report) {
        extra += fmt::format(" cpu_s={:.3f} cpu_us_per_msg={:.3f}", cpu1 - cpu0,
                             report->totalMessages > 0 ? (cpu1 - cpu0) * 1e6 / static_cast<double>(report->totalMessages) : 0.0);
    }
    rc = printUdpReport(report, extra);
    rt->shutdown();
    rt->join();
    return rc;
}

}  // namespace

int main(int argc, char** argv) {
    // No subcommand means `server`, flags included: `spindle-echo --port 7001`.
    std::vector<char*> args(argv, argv + argc);
    static char serverWord[] = "server";
    const bool wantsHelp = argc > 1 && (std::strcmp(argv[1], "-h") == 0 || std::strcmp(argv[1], "--help") == 0 ||
                                        std::strcmp(argv[1], "--help-all") == 0 ||
                                        std::strcmp(argv[1], "--version") == 0);
    if (argc == 1 || (argv[1][0] == '-' && !wantsHelp)) { args.insert(args.begin() + 1, serverWord); }

    CLI::App app{"spindle-echo: a TCP echo server on spindle fibers, and a ping-pong load generator"};
    app.require_subcommand(1);

    CLI::App* server = app.add_subcommand("server", "echo every byte back (the default)");
    RuntimeFlags serverRt;
    std::string serverHost = "0.0.0.0";
    unsigned serverPort = 7000;
    bool reusePort = true;
    size_t bufferSize = 16 * 1024;
    server->add_option("--address", serverHost, "numeric IPv4 or IPv6 address to listen on");
    server->add_option("--port", serverPort, "TCP port")->check(CLI::Range(0u, 65535u));
    server->add_flag("--reuse-port,!--single-listener", reusePort,
                     "a listener per carrier with SO_REUSEPORT (default), or one listener for all");
    server->add_option("--buffer-size", bufferSize, "receive buffer per connection, bytes")
        ->check(CLI::Range(size_t{1}, size_t{16} << 20));
    bool inlineSend = false;
    server->add_flag("--inline-send", inlineSend,
                     "echo with send(2) MSG_DONTWAIT first, through the ring only when the socket is full");
    spindle::echo::ServerOptions serverOptions;
    server->add_flag("--posted-send,!--wait-send", serverOptions.postedSend,
                     "echo a multishot receive without waiting for the send's completion (default), or wait for "
                     "every send");
    bool noMultishotRecv = false;
    server->add_flag("--no-multishot-recv", noMultishotRecv,
                     "one receive per message into the connection's own buffer, instead of one multishot receive "
                     "per connection into provided buffers");
    server->add_option("--provided-buffers", serverOptions.providedBuffers,
                       "provided receive buffers per carrier (a power of two)")
        ->check(CLI::Range(1u, 32768u))->check(spindle::apps::powerOfTwo())->capture_default_str();
    server->add_option("--provided-buffer-size", serverOptions.providedBufferSize, "bytes of each provided buffer")
        ->check(CLI::Range(size_t{1}, size_t{1} << 20))->capture_default_str();
    serverRt.addTo(*server);
    bool serverUdp = false;
    server->add_flag("--udp", serverUdp, "echo UDP datagrams instead of TCP streams");
    DpdkFlagsArg serverDpdk;
#if defined(SPINDLE_HAVE_DPDK)
    serverDpdk.addTo(*server);
#endif
    spindle::apps::MetricsFlags metricsFlags;
    metricsFlags.addTo(*server);
    spindle::apps::StatsJsonFlag statsJson;
    statsJson.addTo(*server);

    CLI::App* client = app.add_subcommand("client", "ping-pong load: send, read the echo back, check it, time it");
    RuntimeFlags clientRt;
    std::string clientHost = "127.0.0.1";
    unsigned clientPort = 7000;
    spindle::echo::ClientOptions clientOptions;
    double warmup = 1.0;
    double duration = 5.0;
    bool json = false;
    unsigned connectTimeoutMs = 5000;
    unsigned ioTimeoutMs = 10000;
    client->add_option("--address", clientHost, "numeric IPv4 or IPv6 address of the server");
    client->add_option("--port", clientPort, "TCP port")->check(CLI::Range(1u, 65535u));
    // Every connection to the one server address needs a local port of its own: no more than 65535 exist.
    client->add_option("--connections", clientOptions.connections, "concurrent connections, each a ping-pong fiber")
        ->check(CLI::Range(1u, 65535u));
    client->add_option("--size", clientOptions.messageSize, "bytes per message")
        ->check(CLI::Range(size_t{1}, spindle::echo::kMaxMessageSize));
    client->add_option("--duration", duration, "measured seconds, after the warm-up")
        ->check(spindle::apps::realRange(0.001, 86400.0));
    // 10^12 round trips take years; times 65535 connections, the count still fits the report's 64 bits.
    client->add_option("--messages", clientOptions.messagesPerConnection,
                       "round trips per connection, all measured, instead of --warmup and --duration (0: use those)")
        ->check(CLI::Range(uint64_t{0}, uint64_t{1'000'000'000'000}));
    client->add_option("--warmup", warmup, "seconds of load before measuring")->check(spindle::apps::realRange(0.0, 3600.0));
    client->add_option("--connect-timeout-ms", connectTimeoutMs, "a connect taking longer fails")
        ->check(CLI::Range(1u, 3600000u));
    client->add_option("--io-timeout-ms", ioTimeoutMs, "one send or echo taking longer fails the connection")
        ->check(CLI::Range(1u, 3600000u));
    client->add_flag("--json", json, "print one JSON object instead of key=value pairs");
    clientRt.addTo(*client);
    bool clientUdp = false;
    client->add_flag("--udp", clientUdp, "UDP datagrams instead of TCP streams (--window of them outstanding)");
    UdpClientFlags udpFlags;
    udpFlags.addTo(*client);
    DpdkFlagsArg clientDpdk;
#if defined(SPINDLE_HAVE_DPDK)
    clientDpdk.addTo(*client);
#endif

    CLI::App* pair = app.add_subcommand("udp-pair", "UDP echo server (carrier 0) and client (carrier 1) in one process");
    RuntimeFlags pairRt;
    UdpClientFlags pairFlags;
    bool pairDpdk = false;
    pair->add_flag("--dpdk", pairDpdk, "over two net_ring ports wired back to back instead of kernel sockets on loopback");
    pair->add_option("--size", pairFlags.size, "bytes per datagram")
        ->check(CLI::Range(spindle::echo::kUdpMinMessage, spindle::echo::kUdpMaxMessage));
    pair->add_option("--duration", pairFlags.duration, "measured seconds, after the warm-up")
        ->check(spindle::apps::realRange(0.001, 86400.0));
    pair->add_option("--warmup", pairFlags.warmup, "seconds of load before measuring")
        ->check(spindle::apps::realRange(0.0, 3600.0));
    pairFlags.addTo(*pair);
    pairRt.addTo(*pair);

    if (auto status = spindle::apps::parseCommandLine(app, static_cast<int>(args.size()), args.data())) {
        return *status;
    }
    if (!statsJson.open("spindle-echo")) { return kExitFailure; }
    raiseDescriptorLimit();
    if (pair->parsed()) { return runUdpPair(pairRt, pairFlags, pairDpdk); }
    if (client->parsed() && clientUdp) {
        if (json) {
            std::fprintf(stderr, "spindle-echo: --json: the UDP client's report is key=value pairs only (TCP has --json)\n");
            return kExitUsage;
        }
        if (clientOptions.messageSize < spindle::echo::kUdpMinMessage || clientOptions.messageSize > spindle::echo::kUdpMaxMessage) {
            std::fprintf(stderr, "spindle-echo: --udp: --size must be %zu..%zu bytes\n", spindle::echo::kUdpMinMessage,
                         spindle::echo::kUdpMaxMessage);
            return kExitUsage;
        }
        udpFlags.size = clientOptions.messageSize;
        udpFlags.warmup = warmup;
        udpFlags.duration = duration;
        return runUdpClient(clientRt, clientHost, clientPort, udpFlags, clientDpdk);
    }
    if (server->parsed() && serverUdp && metricsFlags.on()) {
        std::fprintf(stderr, "spindle-echo: --metrics-port: served by the TCP echo server only, not with --udp\n");
        return kExitUsage;
    }
    if (server->parsed() && serverUdp) { return runUdpServer(serverRt, serverHost, serverPort, serverDpdk, statsJson); }
    if (serverDpdk.on || clientDpdk.on) {
        std::fprintf(stderr, "spindle-echo: --dpdk goes with --udp\n");
        return kExitUsage;
    }
    if (client->parsed()) {
        clientOptions.connectTimeout = std::chrono::milliseconds(connectTimeoutMs);
        clientOptions.ioTimeout = std::chrono::milliseconds(ioTimeoutMs);
        return runClient(clientRt, clientHost, clientPort, clientOptions, warmup, duration, json);
    }
    serverOptions.reusePort = reusePort;
    serverOptions.bufferSize = bufferSize;
    serverOptions.inlineSend = inlineSend;
    serverOptions.multishotRecv = !noMultishotRecv;
    return runServer(serverRt, serverHost, serverPort, serverOptions, metricsFlags, statsJson);
}
