// spindle-echo: a TCP echo server on spindle fibers, and the ping-pong client that measures it (or
// any other echo server). The logic lives in apps/echo/echo.{h,cpp}; this file parses flags.
//
//   spindle-echo [server] [--address 0.0.0.0] [--port 7000] [--carriers N] [--reuse-port|--single-listener]
//                         [--poll-mode block|spin|hybrid] [--backend auto|io_uring|epoll] ...
//   spindle-echo client --address 127.0.0.1 --port 7000 --connections N --duration S --size BYTES
//                       --warmup S [--carriers N] [--backend auto|io_uring|epoll] [--json] ...
//
// The server runs until SIGINT or SIGTERM (read from a signalfd by a fiber), then stops accepting,
// ends its connections and exits 0. The client prints one line of key=value pairs (or one JSON object
// with --json) and exits 0 when every connection ran to the end without an error, 1 otherwise.
//
// Exit status: 0 done; 1 a set-up error or a failed connection; 2 a bad flag value.

#include <signal.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "apps/common/backend_flag.h"
#include "apps/echo/echo.h"
#include "core/io.h"
#include "core/runtime.h"

namespace {

constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

struct RuntimeFlags {
    unsigned carriers = 0;
    std::string pollMode = "block";
    unsigned spinMicros = 50;
    unsigned ringEntries = 256;
    bool noBind = false;
    std::string backend = "auto";

    void addTo(CLI::App& app) {
        app.add_option("--carriers", carriers, "carriers (0: one per core of the process cpuset)");
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
        o.pollMode = pollMode == "spin"     ? spindle::PollMode::kSpin
                     : pollMode == "hybrid" ? spindle::PollMode::kHybrid
                                            : spindle::PollMode::kBlock;
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

int runServer(const RuntimeFlags& rtFlags, const std::string& host, unsigned port, spindle::echo::ServerOptions options) {
    auto address = parseAddress(host, port);
    if (!address) { return kExitUsage; }
    // Block the signals before the carriers start, so that every thread inherits the mask and the
    // signalfd is their only way in.
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGTERM);
    if (::pthread_sigmask(SIG_BLOCK, &signals, nullptr) != 0) {
        std::perror("spindle-echo: pthread_sigmask");
        return kExitFailure;
    }
    const int sfd = ::signalfd(-1, &signals, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sfd < 0) {
        std::perror("spindle-echo: signalfd");
        return kExitFailure;
    }
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
    auto waiter = rt->spawn(
        [sfd]() -> int {
            for (;;) {
                auto ready = spindle::poll(sfd, POLLIN);
                if (!ready) { return 0; }  // ECANCELED: the runtime is going down anyway
                signalfd_siginfo info{};
                if (::read(sfd, &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
                    return static_cast<int>(info.ssi_signo);
                }
            }
        },
        spindle::SpawnOptions{.name = "echo-signals"});
    if (!waiter) {
        std::fprintf(stderr, "spindle-echo: spawn: %s\n", waiter.error().message().c_str());
        return kExitFailure;
    }
    const int signo = waiter->join();
    (*server)->stop();
    const spindle::echo::ServerStats stats = (*server)->stats();
    // What the driver did, for syscalls per message: enters are io_uring_enter calls, or epoll_wait
    // calls on the epoll backend (whose sqes and cqes count operations started and completed).
    for (const spindle::CarrierStats& c : rt->stats()) {
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
    return 0;
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

}  // namespace

int main(int argc, char** argv) {
    // No subcommand means `server`, flags included: `spindle-echo --port 7001`.
    std::vector<char*> args(argv, argv + argc);
    static char serverWord[] = "server";
    const bool wantsHelp = argc > 1 && (std::strcmp(argv[1], "-h") == 0 || std::strcmp(argv[1], "--help") == 0);
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
    bool noMultishotRecv = false;
    server->add_flag("--no-multishot-recv", noMultishotRecv,
                     "one receive per message into the connection's own buffer, instead of one multishot receive "
                     "per connection into provided buffers");
    server->add_option("--provided-buffers", serverOptions.providedBuffers,
                       "provided receive buffers per carrier (a power of two)")
        ->check(CLI::Range(1u, 32768u))->capture_default_str();
    server->add_option("--provided-buffer-size", serverOptions.providedBufferSize, "bytes of each provided buffer")
        ->check(CLI::Range(size_t{1}, size_t{1} << 20))->capture_default_str();
    serverRt.addTo(*server);

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
    client->add_option("--connections", clientOptions.connections, "concurrent connections, each a ping-pong fiber")
        ->check(CLI::Range(1u, 1000000u));
    client->add_option("--size", clientOptions.messageSize, "bytes per message")
        ->check(CLI::Range(size_t{1}, spindle::echo::kMaxMessageSize));
    client->add_option("--duration", duration, "measured seconds, after the warm-up")->check(CLI::Range(0.001, 86400.0));
    client->add_option("--messages", clientOptions.messagesPerConnection,
                       "round trips per connection, all measured, instead of --warmup and --duration");
    client->add_option("--warmup", warmup, "seconds of load before measuring")->check(CLI::Range(0.0, 3600.0));
    client->add_option("--connect-timeout-ms", connectTimeoutMs, "a connect taking longer fails")
        ->check(CLI::Range(1u, 3600000u));
    client->add_option("--io-timeout-ms", ioTimeoutMs, "one send or echo taking longer fails the connection")
        ->check(CLI::Range(1u, 3600000u));
    client->add_flag("--json", json, "print one JSON object instead of key=value pairs");
    clientRt.addTo(*client);

    try {
        app.parse(static_cast<int>(args.size()), args.data());
    } catch (const CLI::ParseError& e) {
        const int rc = app.exit(e);
        return rc == 0 ? 0 : kExitUsage;
    }
    raiseDescriptorLimit();
    if (client->parsed()) {
        clientOptions.connectTimeout = std::chrono::milliseconds(connectTimeoutMs);
        clientOptions.ioTimeout = std::chrono::milliseconds(ioTimeoutMs);
        return runClient(clientRt, clientHost, clientPort, clientOptions, warmup, duration, json);
    }
    serverOptions.reusePort = reusePort;
    serverOptions.bufferSize = bufferSize;
    serverOptions.inlineSend = inlineSend;
    serverOptions.multishotRecv = !noMultishotRecv;
    return runServer(serverRt, serverHost, serverPort, serverOptions);
}
