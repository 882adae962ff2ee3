// SPDX-License-Identifier: Apache-2.0
#include "apps/echo/echo.h"

#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "apps/common/json.h"
#include "base/log.h"
#include "core/fiber.h"
#include "core/io.h"
#include "net/posted_send.h"

namespace spindle::echo {

namespace {

using Clock = std::chrono::steady_clock;

// Errors that end a connection because its peer went away or the runtime is stopping: not the
// server's failure.
bool isPeerOrShutdown(int err) noexcept {
    return err == ECONNRESET || err == EPIPE || err == ENOTCONN || err == ECANCELED || err == ENODATA;
}

// One send(2) that never blocks: the bytes the socket took, or -errno. A raw system call rather than
// ::send: the descriptor came from an accept on the ring, which ThreadSanitizer cannot see, so its
// send interceptor would pair this call with an unrelated earlier socket(2) of the same number.
ssize_t sendNow(int fd, const void* buf, size_t len) noexcept {
    const long n = ::syscall(SYS_sendto, fd, buf, len, MSG_DONTWAIT | MSG_NOSIGNAL, nullptr, 0);
    return n >= 0 ? static_cast<ssize_t>(n) : -errno;
}

}  // namespace

EchoServer::EchoServer(const ServerOptions& options) noexcept : options_(options) {}

Result<std::unique_ptr<EchoServer>> EchoServer::start(Runtime& runtime, const ServerOptions& options) {
    if (options.bufferSize == 0) { return Error{EINVAL}; }
    std::unique_ptr<EchoServer> server(new EchoServer(options));
    if (options.multishotRecv) {
        auto pool = net::ProvidedBufferPool::create(
            net::ProvidedBufferOptions{.count = options.providedBuffers, .size = options.providedBufferSize});
        if (!pool) { return Error{pool.errorCode()}; }
        server->pool_ = std::move(*pool);
    }
    net::TcpServerOptions tcp;
    tcp.address = options.address;
    tcp.listenerPerCarrier = options.reusePort;
    tcp.name = "echo";
    tcp.drainTimeout = std::chrono::milliseconds(0);  // an echo has no request to finish: stop() ends them all
    auto tcpServer = net::TcpServer::start(runtime, tcp, [s = server.get()](net::TcpConnection& c) noexcept { s->serve(c); });
    if (!tcpServer) { return Error{tcpServer.errorCode()}; }
    server->server_ = std::move(*tcpServer);
    return server;
}

EchoServer::~EchoServer() { stop(); }

ServerStats EchoServer::stats() const noexcept {
    ServerStats s;
    const net::TcpServerStats t = server_->stats();
    s.accepted = t.accepted;
    s.closed = t.closed;
    s.acceptErrors = t.acceptErrors;
    s.bytesEchoed = bytesEchoed_.load(std::memory_order_relaxed);
    s.connectionErrors = connectionErrors_.load(std::memory_order_relaxed);
    if (pool_) { s.ringExhausted = pool_->stats().exhausted; }
    return s;
}

void EchoServer::stop() {
    if (!server_) { return; }
    server_->stop();
    server_->wait();
}

void EchoServer::serve(net::TcpConnection& connection) noexcept {
    // A stream has no request boundary the drain could wait for: stop() may cut it at any time.
    connection.setIdle(true);
    net::TcpStream& stream = connection.stream();
    int err = 0;
    if (options_.noDelay) {
        if (auto r = stream.setNoDelay(); !r) { log::debug("spindle-echo: TCP_NODELAY: {}", r.error().message()); }
    }
    uint64_t echoed = 0;
    // Sends what arrived: one send(2) first with --inline-send, the ring for the rest. 0 or an errno.
    auto echo = [&](const char* data, size_t len) -> int {
        size_t done = 0;
        if (options_.inlineSend) {
            const ssize_t n = sendNow(stream.fd(), data, len);
            if (n >= 0) {
                done = static_cast<size_t>(n);
            } else if (n != -EAGAIN && n != -EINTR) {
                return static_cast<int>(-n);
            }
        }
        if (done < len) {
            if (auto sent = stream.writeAll(data + done, len - done); !sent) { return sent.errorCode(); }
        }
        echoed += len;
        return 0;
    };
    // Without a ring on this carrier for good (a refused registration): a buffer per
    // connection, rather than a heap buffer per receive.
    if (pool_ && pool_->ringAvailable()) {
        // The receiver cancels its operation when it goes, before the server closes the descriptor.
        net::MultishotReceiver receiver(*pool_, stream.fd());
        // What the fiber reads first each time a receive wakes it, further up its stack than the
        // carrier's prefetch of the frames it parked in reaches.
        this_fiber::setResumeHint(&receiver, sizeof(receiver));
        // With posted sends the buffer a send reads stays leased until the next post() has waited for it.
        const bool posted = options_.postedSend && !options_.inlineSend;
        net::ProvidedBuffer sending;  // the buffer the posted send in flight reads (outlives the sender)
        net::PostedSend sender(stream.fd());
        // A send that left whole gives its buffer back to the ring from the completion, so that an
        // idle connection holds none (before Linux 6.12 each receive takes a whole buffer).
        sender.setSentHook([](void* lease) noexcept { static_cast<net::ProvidedBuffer*>(lease)->release(); }, &sending);
        size_t sendingBytes = 0;      // counted as echoed once the next call says that send ended well
        for (;;) {
            auto got = receiver.next();
            if (!got) {
                err = got.errorCode();
                break;
            }
            if (got->empty()) { break; }  // the client closed its side
            if (!posted) {
                if ((err = echo(got->data(), got->size())) != 0) { break; }
                continue;
            }
            if (auto r = sender.post(got->data(), got->size()); !r) {
                err = r.errorCode();
                break;
            }
            echoed += std::exchange(sendingBytes, got->size());
            if (sender.inFlight()) { sending = std::move(*got); }  // else it left at once: got goes now
        }
        if (auto r = sender.flush(); !r) {
            if (err == 0) { err = r.errorCode(); }
        } else {
            echoed += sendingBytes;
        }
        this_fiber::setResumeHint(nullptr, 0);
    } else {
        auto buffer = std::make_unique_for_overwrite<char[]>(options_.bufferSize);
        for (;;) {
            auto got = stream.recv(buffer.get(), options_.bufferSize);
            if (!got) {
                err = got.errorCode();
                break;
            }
            if (*got == 0) { break; }  // the client closed its side
            if ((err = echo(buffer.get(), *got)) != 0) { break; }
        }
    }
    if (err != 0 && !isPeerOrShutdown(err)) {
        connectionErrors_.fetch_add(1, std::memory_order_relaxed);
        log::warn("spindle-echo: connection on fd {}: {}", stream.fd(), std::strerror(err));
    }
    bytesEchoed_.fetch_add(echoed, std::memory_order_relaxed);
}

namespace {

// What the connection fibers of one carrier gather. They are pinned to that carrier, which runs one
// fiber at a time, so plain fields suffice; runClient reads them after joining every fiber.
struct alignas(64) CarrierTally {
    LogLinearHistogram latency;
    uint64_t messages = 0;
    uint64_t totalMessages = 0;
    unsigned connected = 0;
    unsigned failed = 0;
    uint64_t refused = 0;
    uint64_t connectErrors = 0;
    uint64_t earlyCloses = 0;
    uint64_t mismatches = 0;
    uint64_t timeouts = 0;
    uint64_t otherErrors = 0;
    std::string firstError;

    void fail(uint64_t& kind, std::string what) {
        ++kind;
        ++failed;
        if (firstError.empty()) { firstError = std::move(what); }
    }
};

struct Window {
    Clock::time_point start;  // measuring starts (after the warm-up)
    Clock::time_point end;    // measuring ends; no round trip starts after it
    uint64_t count = 0;       // > 0: round trips per connection instead (all measured)
};

// Fills the bytes of a message that never change on this connection: distinct per connection, so
// that bytes echoed on the wrong stream do not compare equal.
void fillConnectionPattern(std::vector<unsigned char>& message, unsigned id) {
    uint64_t x = 0x9e3779b97f4a7c15ull * (uint64_t{id} + 1);
    for (size_t i = 0; i < message.size(); ++i) {
        x ^= x >> 29;
        x *= 0xbf58476d1ce4e5b9ull;
        message[i] = static_cast<unsigned char>(x >> 56);
    }
}

// Stamps the sequence number into the first and the last (up to) 8 bytes, so that a stale or
// repeated echo does not compare equal either.
void stampSequence(std::vector<unsigned char>& message, uint64_t seq) noexcept {
    const size_t n = std::min<size_t>(message.size(), sizeof seq);
    std::memcpy(message.data(), &seq, n);
    std::memcpy(message.data() + message.size() - n, &seq, n);
}

void classifyIoError(CarrierTally& tally, int err, const char* call, unsigned id) {
    std::string what = fmt::format("connection {}: {}: {}", id, call, std::strerror(err));
    if (err == ENODATA) { what = fmt::format("connection {}: {}: the server closed the connection", id, call); }
    if (err == ENODATA || err == ECONNRESET || err == EPIPE || err == ENOTCONN) {
        tally.fail(tally.earlyCloses, std::move(what));
    } else if (err == ETIMEDOUT) {
        tally.fail(tally.timeouts, std::move(what));
    } else {
        tally.fail(tally.otherErrors, std::move(what));
    }
}

void runConnection(CarrierTally& tally, unsigned id, const ClientOptions& options, const Window& window) {
    auto stream = net::TcpStream::connect(options.address, options.connectTimeout);
    if (!stream) {
        const int err = stream.errorCode();
        std::string what = fmt::format("connection {}: connect to {}: {}", id, options.address.toString(), std::strerror(err));
        tally.fail(err == ECONNREFUSED ? tally.refused : tally.connectErrors, std::move(what));
        return;
    }
    ++tally.connected;
    if (options.noDelay) {
        if (auto r = stream->setNoDelay(); !r) {
            classifyIoError(tally, r.errorCode(), "TCP_NODELAY", id);
            return;
        }
    }
    std::vector<unsigned char> sent(options.messageSize);
    std::vector<unsigned char> received(options.messageSize);
    fillConnectionPattern(sent, id);
    for (uint64_t seq = 0;; ++seq) {
        const Clock::time_point begin = Clock::now();
        if (window.count > 0 ? seq >= window.count : begin >= window.end) { break; }
        stampSequence(sent, seq);
        if (auto r = stream->writeAll(sent.data(), sent.size(), options.ioTimeout); !r) {
            classifyIoError(tally, r.errorCode(), "send", id);
            return;
        }
        if (auto r = stream->readExact(received.data(), received.size(), options.ioTimeout); !r) {
            classifyIoError(tally, r.errorCode(), "receive", id);
            return;
        }
        const Clock::time_point done = Clock::now();
        if (std::memcmp(sent.data(), received.data(), sent.size()) != 0) {
            tally.fail(tally.mismatches, fmt::format("connection {}: message {} came back altered", id, seq));
            return;
        }
        ++tally.totalMessages;
        if (window.count > 0 || (done >= window.start && done <= window.end)) {
            ++tally.messages;
            tally.latency.record(static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(done - begin).count()));
        }
    }
    // A clean end: FIN after the last echo; the server's fiber sees end of stream and closes.
    (void)stream->close();
}

}  // namespace

Result<ClientReport> runClient(Runtime& runtime, const ClientOptions& options) {
    if (options.connections == 0 || options.messageSize == 0 || options.messageSize > kMaxMessageSize ||
        options.duration <= std::chrono::nanoseconds::zero() || options.warmup < std::chrono::nanoseconds::zero()) {
        return Error{EINVAL};
    }
    const unsigned carriers = runtime.carrierCount();
    std::vector<CarrierTally> tallies(carriers);
    const Clock::time_point begin = Clock::now();
    Window window;
    window.start = begin + std::chrono::duration_cast<Clock::duration>(options.warmup);
    window.end = window.start + std::chrono::duration_cast<Clock::duration>(options.duration);
    window.count = options.messagesPerConnection;

    std::vector<FiberHandle<void>> fibers;
    fibers.reserve(options.connections);
    int spawnError = 0;
    for (unsigned id = 0; id < options.connections; ++id) {
        const unsigned carrier = id % carriers;
        auto fiber = runtime.spawn([&tallies, carrier, id, &options, &window] { runConnection(tallies[carrier], id, options, window); },
                                   SpawnOptions{.name = "echo-client", .carrier = static_cast<int>(carrier), .pinned = true});
        if (!fiber) {
            spawnError = fiber.errorCode();
            break;
        }
        fibers.push_back(std::move(*fiber));
    }
    for (auto& fiber : fibers) { fiber.join(); }
    if (spawnError != 0) { return Error{spawnError}; }

    ClientReport report;
    report.connections = options.connections;
    report.messageSize = options.messageSize;
    report.seconds = options.messagesPerConnection > 0 ? std::chrono::duration<double>(Clock::now() - begin).count()
                                                       : std::chrono::duration<double>(options.duration).count();
    for (const CarrierTally& t : tallies) {
        report.latency.merge(t.latency);
        report.messages += t.messages;
        report.totalMessages += t.totalMessages;
        report.connected += t.connected;
        report.failedConnections += t.failed;
        report.refused += t.refused;
        report.connectErrors += t.connectErrors;
        report.earlyCloses += t.earlyCloses;
        report.mismatches += t.mismatches;
        report.timeouts += t.timeouts;
        report.otherErrors += t.otherErrors;
        if (report.firstError.empty()) { report.firstError = t.firstError; }
    }
    return report;
}

namespace {

double micros(uint64_t ns) { return static_cast<double>(ns) / 1e3; }

}  // namespace

std::string formatReport(const ClientReport& r) {
    const LogLinearHistogram& h = r.latency;
    return fmt::format(
        "connections={} connected={} size={} duration_s={:.3f} messages={} total_messages={} msg_per_s={:.1f} "
        "mb_per_s={:.3f} p50_us={:.2f} p99_us={:.2f} p999_us={:.2f} max_us={:.2f} failed_connections={} refused={} "
        "connect_errors={} early_closes={} mismatches={} timeouts={} other_errors={}",
        r.connections, r.connected, r.messageSize, r.seconds, r.messages, r.totalMessages, r.messagesPerSecond(),
        r.megabytesPerSecond(), micros(h.percentile(0.5)), micros(h.percentile(0.99)), micros(h.percentile(0.999)),
        micros(h.max()), r.failedConnections, r.refused, r.connectErrors, r.earlyCloses, r.mismatches, r.timeouts,
        r.otherErrors);
}

std::string formatReportJson(const ClientReport& r) {
    const LogLinearHistogram& h = r.latency;
    // The same figures and decimals as the text form; nlohmann::json (apps/common/json.h) escapes
    // first_error (a peer's or the kernel's words, which may hold quotes, backslashes or control bytes).
    auto rounded = [](double v, double scale) { return std::round(v * scale) / scale; };
    const apps::Json out{
        {"connections", r.connections},
        {"connected", r.connected},
        {"size", r.messageSize},
        {"duration_s", rounded(r.seconds, 1e3)},
        {"messages", r.messages},
        {"total_messages", r.totalMessages},
        {"msg_per_s", rounded(r.messagesPerSecond(), 1e1)},
        {"mb_per_s", rounded(r.megabytesPerSecond(), 1e3)},
        {"lat_us",
         apps::Json{{"p50", rounded(micros(h.percentile(0.5)), 1e2)},
                    {"p99", rounded(micros(h.percentile(0.99)), 1e2)},
                    {"p999", rounded(micros(h.percentile(0.999)), 1e2)},
                    {"max", rounded(micros(h.max()), 1e2)},
                    {"mean", rounded(h.mean() / 1e3, 1e2)}}},
        {"failed_connections", r.failedConnections},
        {"errors",
         apps::Json{{"refused", r.refused},
                    {"connect", r.connectErrors},
                    {"early_close", r.earlyCloses},
                    {"mismatch", r.mismatches},
                    {"timeout", r.timeouts},
                    {"other", r.otherErrors}}},
        {"first_error", r.firstError},
    };
    return out.dump();
}

}  // namespace spindle::echo
