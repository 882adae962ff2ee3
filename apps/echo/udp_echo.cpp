// SPDX-License-Identifier: Apache-2.0
#include "apps/echo/udp_echo.h"

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <span>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include "net/udp.h"

namespace spindle::echo {
namespace {

using Clock = std::chrono::steady_clock;

// Index, sequence number, then bytes that depend on both: an echo of another message cannot pass.
void fillMessage(char* m, size_t size, uint32_t index, uint64_t seq) {
    std::memcpy(m, &index, 4);
    std::memset(m + 4, 0, 4);
    std::memcpy(m + 8, &seq, 8);
    for (size_t i = 16; i < size; ++i) { m[i] = static_cast<char>((seq * 131 + i * 7 + index) & 0xff); }
}

/// What the client fibers share: the clock, the report under a lock.
struct ClientRun {
    UdpClientOptions options;
    Clock::time_point start;
    Clock::time_point measureFrom;
    Clock::time_point end;
    std::atomic<bool> cutShort{false};  // a spawn failed: the fibers started stop after their round trip
    std::mutex lock;
    UdpReport report;

    void fail(const std::string& what) {
        std::lock_guard<std::mutex> g(lock);
        ++report.errors;
        if (report.firstError.empty()) { report.firstError = what; }
    }
};

// One client fiber: `send(buf, n)` and `recv(buf, cap, timeout) -> Result<size_t>` over its socket.
template <class Send, class Recv>
void clientLoop(ClientRun& run, uint32_t index, Send&& send, Recv&& recv) {
    const size_t size = run.options.messageSize;
    std::vector<char> out(size);
    std::vector<char> in(kUdpMaxMessage + 64);
    LogLinearHistogram latency;
    uint64_t measured = 0, total = 0, lost = 0, stale = 0, mismatches = 0;
    bool failed = false;
    for (uint64_t seq = 0; !failed && !run.cutShort.load(std::memory_order_relaxed) && Clock::now() < run.end; ++seq) {
        fillMessage(out.data(), size, index, seq);
        const auto sent = Clock::now();
        if (auto r = send(out.data(), size); !r) {
            if (r.errorCode() == ENOBUFS) {  // the ring or the pool ran dry: a loss, not a failure
                ++lost;
                continue;
            }
            run.fail(fmt::format("send: {}", std::strerror(r.errorCode())));
            break;
        }
        const auto giveUp = sent + run.options.timeout;
        bool done = false;
        while (!done) {
            const auto now = Clock::now();
            if (now >= giveUp) {
                ++lost;
                break;
            }
            auto n = recv(in.data(), in.size(), std::chrono::duration_cast<std::chrono::nanoseconds>(giveUp - now));
            if (!n) {
                if (n.errorCode() == ETIMEDOUT) {
                    ++lost;
                    break;
                }
                run.fail(fmt::format("receive: {}", std::strerror(n.errorCode())));
                failed = true;
                break;
            }
            uint64_t echoedSeq = 0;
            uint32_t echoedIndex = 0;
            if (*n >= 16) {
                std::memcpy(&echoedIndex, in.data(), 4);
                std::memcpy(&echoedSeq, in.data() + 8, 8);
            }
            if (*n >= 16 && echoedIndex == index && echoedSeq < seq) {
                ++stale;  // the echo of a datagram already counted lost
                continue;
            }
            if (*n != size || std::memcmp(in.data(), out.data(), size) != 0) {
                ++mismatches;
                break;
            }
            const auto back = Clock::now();
            ++total;
            if (sent >= run.measureFrom && back <= run.end) {
                ++measured;
                latency.record(static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(back - sent).count()));
            }
            done = true;
        }
    }
    std::lock_guard<std::mutex> g(run.lock);
    run.report.messages += measured;
    run.report.totalMessages += total;
    run.report.lost += lost;
    run.report.stale += stale;
    run.report.mismatches += mismatches;
    run.report.latency.merge(latency);
}

Result<void> checkOptions(const UdpClientOptions& o) {
    if (o.window == 0 || o.messageSize < kUdpMinMessage || o.messageSize > kUdpMaxMessage) { return Error{EINVAL}; }
    return {};
}

void beginRun(ClientRun& run, const UdpClientOptions& o) {
    run.options = o;
    run.start = Clock::now();
    run.measureFrom = run.start + o.warmup;
    run.end = run.measureFrom + o.duration;
    run.report.window = o.window;
    run.report.messageSize = o.messageSize;
    run.report.seconds = std::chrono::duration<double>(o.duration).count();
}

// Runs `window` client fibers, fiber i on carrierOf(i), each with the socket open(i) gives it, and
// waits for them all. A spawn that fails ends the run at once and still joins the fibers already
// started (they hold references to `run`), then reports the spawn's errno.
template <class CarrierOf, class Open, class To>
Result<UdpReport> runClientFibers(Runtime& rt, const UdpClientOptions& o, const char* name, CarrierOf&& carrierOf,
                                  Open&& open, const To& to) {
    if (auto r = checkOptions(o); !r) { return Error{r.errorCode()}; }
    ClientRun run;
    beginRun(run, o);
    std::vector<FiberHandle<void>> fibers;
    int spawnError = 0;
    for (unsigned i = 0; i < o.window && spawnError == 0; ++i) {
        auto f = rt.spawn(
            [&run, &open, &to, i]() noexcept {
                auto s = open(i);
                if (!s) {
                    run.fail(fmt::format("socket: {}", std::strerror(s.errorCode())));
                    return;
                }
                clientLoop(
                    run, i, [&](const char* b, size_t n) -> Result<size_t> { return s->sendTo(b, n, to); },
                    [&](char* b, size_t cap, std::chrono::nanoseconds left) -> Result<size_t> {
                        return s->recvFrom(b, cap, nullptr, left);
                    });
                (void)s->close();
            },
            SpawnOptions{.name = name, .carrier = carrierOf(i), .pinned = true});
        if (f) {
            fibers.push_back(std::move(*f));
        } else {
            spawnError = f.errorCode();
            run.cutShort.store(true, std::memory_order_relaxed);
        }
    }
    for (auto& f : fibers) { f.join(); }
    if (spawnError != 0) { return Error{spawnError}; }
    return std::move(run.report);
}

// ---- kernel sockets --------------------------------------------------------------------------------

// A server fiber's loop, over kernel or DPDK sockets: each datagram back to its sender, until a
// receive fails (ECANCELED: stop()). Counts what went back.
template <class Socket, class Address>
void echoUntilStopped(Socket& sock, std::atomic<uint64_t>* count) noexcept {
    char buf[kUdpMaxMessage + 64];
    for (;;) {
        Address from;
        auto n = sock.recvFrom(buf, sizeof(buf), &from);
        if (!n) { return; }
        if (sock.sendTo(buf, *n, from)) { count->fetch_add(1, std::memory_order_relaxed); }
    }
}

class KernelEcho final : public UdpEchoServer {
public:
    std::vector<FiberHandle<void>> fibers;
    std::vector<std::unique_ptr<net::UdpSocket>> sockets;
    std::atomic<uint64_t> count{0};

    ~KernelEcho() override { stop(); }
    void stop() noexcept override {
        for (auto& f : fibers) { f.cancel(); }
        for (auto& f : fibers) {
            if (f.joinable()) { f.join(); }
        }
        fibers.clear();
        for (auto& s : sockets) { (void)s->close(); }
        sockets.clear();
    }
    [[nodiscard]] uint64_t echoed() const noexcept override { return count.load(std::memory_order_relaxed); }
};

}  // namespace

std::string formatUdpReport(const UdpReport& r, const std::string& extra) {
    std::string s = fmt::format(
        "window={} size={} messages={} total_messages={} seconds={:.3f} msg_per_s={:.1f} p50_us={:.1f} "
        "p99_us={:.1f} p999_us={:.1f} lost={} stale={} mismatches={} errors={}",
        r.window, r.messageSize, r.messages, r.totalMessages, r.seconds, r.messagesPerSecond(),
        static_cast<double>(r.latency.percentile(0.5)) / 1e3, static_cast<double>(r.latency.percentile(0.99)) / 1e3,
        static_cast<double>(r.latency.percentile(0.999)) / 1e3, r.lost, r.stale, r.mismatches, r.errors);
    if (!extra.empty()) { s += " " + extra; }
    return s;
}

Result<std::unique_ptr<UdpEchoServer>> startKernelUdpEcho(Runtime& rt, const net::SocketAddress& address,
                                                          uint16_t* boundPort, int carrier) {
    auto server = std::make_unique<KernelEcho>();
    net::SocketAddress at = address;
    const unsigned sockets = carrier >= 0 ? 1 : rt.carrierCount();
    for (unsigned c = 0; c < sockets; ++c) {
        auto s = net::UdpSocket::bind(at, /*reusePort=*/true);
        if (!s) { return Error{s.errorCode()}; }
        if (c == 0) {
            auto local = s->localAddress();
            if (!local) { return Error{local.errorCode()}; }
            at = *local;  // the port the kernel chose, for the others to share
            if (boundPort != nullptr) { *boundPort = at.port(); }
        }
        server->sockets.push_back(std::make_unique<net::UdpSocket>(std::move(*s)));
    }
    for (unsigned c = 0; c < sockets; ++c) {
        net::UdpSocket* sock = server->sockets[c].get();
        std::atomic<uint64_t>* count = &server->count;
        auto f = rt.spawn(
            [sock, count]() noexcept { echoUntilStopped<net::UdpSocket, net::SocketAddress>(*sock, count); },
            SpawnOptions{.name = "udp-echo", .carrier = carrier >= 0 ? carrier : static_cast<int>(c), .pinned = true});
        if (!f) { return Error{f.errorCode()}; }
        server->fibers.push_back(std::move(*f));
    }
    return std::unique_ptr<UdpEchoServer>(std::move(server));
}

Result<UdpReport> runKernelUdpClient(Runtime& rt, const net::SocketAddress& server, const UdpClientOptions& o) {
    return runClientFibers(
        rt, o, "udp-client",
        [&](unsigned i) { return o.carrier >= 0 ? o.carrier : static_cast<int>(i % rt.carrierCount()); },
        [&](unsigned) { return net::UdpSocket::open(server.family()); }, server);
}

#if defined(SPINDLE_HAVE_DPDK)

namespace {

class DpdkEcho final : public UdpEchoServer {
public:
    std::vector<FiberHandle<void>> fibers;
    std::atomic<uint64_t> count{0};

    ~DpdkEcho() override { stop(); }
    void stop() noexcept override {
        for (auto& f : fibers) {
            if (f.joinable()) { f.cancel(); }
        }
        for (auto& f : fibers) {
            if (f.joinable()) { f.join(); }
        }
        fibers.clear();
    }
    [[nodiscard]] uint64_t echoed() const noexcept override { return count.load(std::memory_order_relaxed); }
};

}  // namespace

Result<std::unique_ptr<UdpEchoServer>> startDpdkUdpEcho(Runtime& rt, dpdk::Interface& iface, uint16_t port) {
    // One queue: a socket that hears it, on its carrier. Several: a socket per queue, each answered
    // by a fiber on the carrier that polls it, so no datagram crosses carriers.
    const std::span<const unsigned> queues = iface.queues();
    auto server = std::make_unique<DpdkEcho>();
    for (const unsigned q : queues) {
        const int carrier = iface.carrier(q);
        if (carrier < 0) { return Error{ENETDOWN}; }
        auto sock = dpdk::UdpSocket::bind(iface, port, queues.size() == 1 ? -1 : static_cast<int>(q));
        if (!sock) { return Error{sock.errorCode()}; }
        auto owned = std::make_shared<dpdk::UdpSocket>(std::move(*sock));
        std::atomic<uint64_t>* count = &server->count;
        auto f = rt.spawn(
            [owned, count]() noexcept {
                echoUntilStopped<dpdk::UdpSocket, dpdk::Endpoint>(*owned, count);
                (void)owned->close();
            },
            SpawnOptions{.name = "udp-echo-dpdk", .carrier = carrier, .pinned = true});
        if (!f) { return Error{f.errorCode()}; }
        server->fibers.push_back(std::move(*f));
    }
    return std::unique_ptr<UdpEchoServer>(std::move(server));
}

Result<UdpReport> runDpdkUdpClient(Runtime& rt, dpdk::Interface& iface, const dpdk::Endpoint& server,
                                   const UdpClientOptions& o) {
    // The client's fibers spread over the carriers of the interface's queues; their sockets hear
    // every queue (the server's side decides on which one an answer comes back).
    std::vector<int> carriers;
    for (const unsigned q : iface.queues()) {
        if (iface.carrier(q) < 0) { return Error{ENETDOWN}; }
        carriers.push_back(iface.carrier(q));
    }
    return runClientFibers(
        rt, o, "udp-client-dpdk", [carriers](unsigned i) { return carriers[i % carriers.size()]; },
        [&](unsigned) { return dpdk::UdpSocket::bind(iface, 0); }, server);
}

#endif

}  // namespace spindle::echo
