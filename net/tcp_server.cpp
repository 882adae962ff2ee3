// SPDX-License-Identifier: Apache-2.0
#include "net/tcp_server.h"

#include <malloc.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <new>
#include <utility>

#include "base/counter.h"
#include "base/log.h"
#include "core/io.h"
#include "core/ring_ops.h"

namespace spindle::net {

namespace {

using namespace std::chrono_literals;

// The counters have one writer each (the carrier that owns them), readers anywhere: ownerAdd/ownerSub.

/// CLOCK_MONOTONIC_COARSE in nanoseconds: a vDSO read of a few ns, precise to a tick (1-4 ms).
uint64_t coarseNowNs() noexcept {
    timespec t{};
    ::clock_gettime(CLOCK_MONOTONIC_COARSE, &t);
    return static_cast<uint64_t>(t.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(t.tv_nsec);
}

uint64_t toNs(std::chrono::milliseconds ms) noexcept {
    return static_cast<uint64_t>(std::chrono::nanoseconds(ms).count());
}

}  // namespace

/// A parked connection: what waiting needs, and the poll's completion (232 bytes with glibc's x86-64
/// layout, a 240-byte malloc chunk: spindle-httpd's memory per idle connection). Owned by its poll:
/// freed by onParkedReady(), the poll's one completion.
struct TcpServer::Parked : MultishotCompletion {
    detail::TcpConnectionNode node;
    TcpServer* server = nullptr;
    uint64_t id = 0;
};

void TcpConnection::beginIdleWait() noexcept {
    node_.idle = true;
    node_.idleWait = true;
    node_.parkRefused = false;
    node_.idleSinceNs = coarseNowNs();
}

bool TcpConnection::takeParkRequest() noexcept {
    if (!node_.parkAsked) { return false; }
    node_.parkAsked = false;
    (void)this_fiber::acknowledgeCancellation();
    return true;
}

void TcpServer::Carrier::link(detail::TcpConnectionNode* n) noexcept {
    n->prev = nullptr;
    n->next = connections;
    if (connections != nullptr) { connections->prev = n; }
    connections = n;
}

void TcpServer::Carrier::unlink(detail::TcpConnectionNode* n) noexcept {
    if (n->prev != nullptr) { n->prev->next = n->next; } else { connections = n->next; }
    if (n->next != nullptr) { n->next->prev = n->prev; }
    n->prev = n->next = nullptr;
}

TcpServer::TcpServer(Runtime& runtime, const TcpServerOptions& options, Handler handler)
    : runtime_(runtime), options_(options), handler_(std::move(handler)), address_(options.address) {}

Result<std::unique_ptr<TcpServer>> TcpServer::start(Runtime& runtime, const TcpServerOptions& options, Handler handler) {
    if (!handler || options.backlog <= 0 || options.acceptBackoffMin < 0ms ||
        options.acceptBackoffMax < options.acceptBackoffMin || options.drainTimeout < 0ms || options.idleTimeout < 0ms ||
        options.idleRelease < 0ms) {
        return Error{EINVAL};
    }
    std::unique_ptr<TcpServer> server(new TcpServer(runtime, options, std::move(handler)));
    const unsigned carriers = runtime.carrierCount();
    const unsigned listeners = options.listenerPerCarrier ? carriers : 1;
    server->listeners_ = listeners;
    for (unsigned i = 0; i < carriers; ++i) { server->carriers_.push_back(std::make_unique<Carrier>()); }
    for (unsigned i = 0; i < listeners; ++i) {
        // The first bind settles the port (the kernel's choice for port 0) and, unless sharing is asked
        // for, proves that nobody else holds it; the others join it.
        ListenOptions lo;
        lo.backlog = options.backlog;
        lo.reuseAddress = true;
        lo.reusePort = options.shareAddress || i > 0;
        lo.reusePortAfterBind = !lo.reusePort && listeners > 1;
        auto listener = TcpListener::bind(server->address_, lo);
        if (!listener) {
            log::error("{}: cannot listen on {}: {}", options.name, server->address_.toString(), listener.error().message());
            return Error{listener.errorCode()};  // nothing was spawned yet: the listeners close with the server
        }
        if (i == 0) { server->address_ = listener->localAddress(); }
        server->carriers_[i]->listener = std::move(*listener);
        server->carriers_[i]->accepts = true;
    }
    if (options.idleTimeout > 0ms || options.idleRelease > 0ms || options.carrierTick) {
        // Before the acceptors: each acceptor ends its carrier's sweep when it has drained.
        const std::string sweepName = options.name + "-idle";
        for (unsigned i = 0; i < carriers; ++i) {
            auto sweeper = runtime.spawn([s = server.get(), i]() noexcept { s->sweepLoop(i); },
                                         SpawnOptions{.name = sweepName.c_str(), .carrier = static_cast<int>(i), .pinned = true});
            if (!sweeper) {
                log::error("{}: cannot start the idle sweep of carrier {}: {}", options.name, i, sweeper.error().message());
                server->stop();
                server->wait();
                return Error{sweeper.errorCode()};
            }
            server->carriers_[i]->sweeper = std::move(*sweeper);
        }
    }
    const std::string acceptName = options.name + "-accept";
    for (unsigned i = 0; i < carriers; ++i) {
        auto acceptor = runtime.spawn([s = server.get(), i]() noexcept { s->acceptLoop(i); },
                                      SpawnOptions{.name = acceptName.c_str(), .carrier = static_cast<int>(i), .pinned = true});
        if (!acceptor) {
            log::error("{}: cannot start the acceptor of carrier {}: {}", options.name, i, acceptor.error().message());
            server->stop();
            server->wait();
            return Error{acceptor.errorCode()};
        }
        std::lock_guard lock(server->mutex_);
        server->acceptors_.push_back(std::move(*acceptor));
    }
    return server;
}

TcpServer::~TcpServer() {
    stop();
    wait();
}

TcpServerStats TcpServer::stats() const noexcept {
    TcpServerStats s;
    for (const auto& c : carriers_) {
        s.accepted += c->accepted.load(std::memory_order_relaxed);
        s.active += c->active.load(std::memory_order_relaxed);
        s.closed += c->closed.load(std::memory_order_relaxed);
        s.acceptErrors += c->acceptErrors.load(std::memory_order_relaxed);
        s.drainClosed += c->drainClosed.load(std::memory_order_relaxed);
        s.idleTimeouts += c->idleTimeouts.load(std::memory_order_relaxed);
        s.parked += c->parked.load(std::memory_order_relaxed);
        s.parks += c->parks.load(std::memory_order_relaxed);
    }
    return s;
}

void TcpServer::stop() noexcept {
    std::lock_guard lock(mutex_);
    if (stopped_) { return; }
    stopped_ = true;
    draining_.store(true, std::memory_order_release);
    for (auto& a : acceptors_) {
        if (a.joinable()) { a.cancel(); }
    }
    drained_.notify_all();  // a wait() that came first
}

void TcpServer::wait() noexcept {
    std::vector<FiberHandle<void>> acceptors;
    {
        std::unique_lock lock(mutex_);
        drained_.wait(lock, [this] { return stopped_; });
        if (waited_) { return; }
        waited_ = true;
        acceptors = std::move(acceptors_);
    }
    // Each acceptor drains its carrier's connections before it ends.
    for (auto& a : acceptors) {
        if (a.joinable()) { a.join(); }
    }
    // Each acceptor ended its carrier's sweep; one whose acceptor never started (start() failed) ends here.
    for (auto& c : carriers_) {
        if (c->sweeper.joinable()) {
            c->sweeper.cancel();
            c->sweeper.join();
        }
    }
    std::unique_lock lock(mutex_);
    drained_.wait(lock, [this] { return live_ == 0; });
}

void TcpServer::acceptLoop(unsigned carrier) noexcept {
    Carrier& c = *carriers_[carrier];
    if (!c.accepts) {
        // One listener for all: this carrier only drains what it was dealt. The sleep ends with
        // ECANCELED when stop() cancels this fiber (or the runtime shuts down).
        while (!draining_.load(std::memory_order_acquire) && spindle::sleep(std::chrono::hours(1))) {}
        drain(carrier);
        return;
    }
    std::chrono::milliseconds backoff = options_.acceptBackoffMin;
    for (;;) {
        auto stream = c.listener.accept();
        if (!stream) {
            const int err = stream.errorCode();
            if (draining_.load(std::memory_order_acquire) || err == ECANCELED || err == EBADF) { break; }
            ownerAdd(c.acceptErrors);
            log::warn("{}: accept on carrier {}: {} (retrying in {} ms)", options_.name, carrier, std::strerror(err),
                      backoff.count());
            // A persistent error would otherwise spin; the sleep ends with ECANCELED at stop().
            if (!spindle::sleep(backoff)) { break; }
            backoff = std::min(backoff * 2, options_.acceptBackoffMax);
            continue;
        }
        backoff = options_.acceptBackoffMin;
        ownerAdd(c.accepted);
        // With a listener per carrier the connection stays where the kernel delivered it; one shared
        // listener deals connections out to the carriers in turn.
        const unsigned target = options_.listenerPerCarrier
                                    ? carrier
                                    : nextCarrier_.fetch_add(1, std::memory_order_relaxed) % runtime_.carrierCount();
        spawnConnection(target, stream->release(), nextId_.fetch_add(1, std::memory_order_relaxed), /*resumed=*/false);
    }
    drain(carrier);
}

void TcpServer::sweepLoop(unsigned carrier) noexcept {
    Carrier& c = *carriers_[carrier];
    const auto timeout = options_.idleTimeout;
    const auto release = options_.idleRelease;
    auto period = timeout > 0ms ? std::clamp<std::chrono::milliseconds>(timeout / 8, 1ms, 1000ms) : 1000ms;
    if (release > 0ms) { period = std::min(period, std::max<std::chrono::milliseconds>(release / 2, 1ms)); }
    const uint64_t timeoutNs = toNs(timeout);
    const uint64_t releaseNs = toNs(release);
    uint64_t parkedSinceTrim = 0;
    // Ends with ECANCELED when the drain (or wait()) cancels it, or the runtime shuts down.
    while (spindle::sleep(period)) {
        const uint64_t now = coarseNowNs();
        uint64_t askedNow = 0;
        for (detail::TcpConnectionNode* n = c.connections; n != nullptr; n = n->next) {
            if (!n->idleWait || n->timedOut) { continue; }
            if (timeout > 0ms && now - n->idleSinceNs >= timeoutNs) {
                n->timedOut = true;
                ownerAdd(c.idleTimeouts);          // counted before the client can see the end of stream
                ::shutdown(n->fd, SHUT_RDWR);  // its receive (or its poll, when parked) ends
            } else if (release > 0ms && n->fiber != nullptr && !n->parkAsked && !n->parkRefused &&
                       now - n->idleSinceNs >= releaseNs) {
                // The cancel ends the handler's receive with ECANCELED (takeParkRequest() says why).
                n->parkAsked = true;
                spindle::detail::requestCancel(n->fiber);
                ++askedNow;
            }
        }
        if (options_.carrierTick) { options_.carrierTick(carrier, /*final=*/false); }
        // A burst of parks has ended (the last pass asked some connections to park, this one none):
        // their handlers' state was freed in a burst too, and glibc keeps freed memory resident while a
        // chunk above it lives (the top of the heap alone goes back by itself). malloc_trim(3) gives the
        // whole free pages back (spindle-httpd: 0.52 -> 0.30 KiB per idle connection, issue 19). At
        // most once per pass, and only after a few hundred parks.
        parkedSinceTrim += askedNow;
        if (askedNow == 0 && parkedSinceTrim >= kTrimAfterParks) {
            (void)::malloc_trim(0);
            parkedSinceTrim = 0;
        }
    }
}

void TcpServer::drain(unsigned carrier) noexcept {
    Carrier& c = *carriers_[carrier];
    // The cancellation that ended the loop above must not fail the calls below.
    (void)this_fiber::acknowledgeCancellation();
    draining_.store(true, std::memory_order_release);
    if (c.accepts) { c.listener.close(); }  // awaits the multishot accept's last completion
    auto shutDown = [&c](bool idleOnly) noexcept {
        for (detail::TcpConnectionNode* n = c.connections; n != nullptr; n = n->next) {
            if (!idleOnly || n->idle) {
                if (!n->timedOut) { ownerAdd(c.drainClosed); }
                n->idle = false;      // counted once; a second shutdown(2) is harmless
                n->timedOut = true;   // a parked one is closed without a fiber when its poll ends
                (void)::shutdown(n->fd, SHUT_RDWR);  // its pending receive returns 0, its poll ends
            }
        }
    };
    // Connections of this carrier are linked and unlinked on this carrier only; `active` may also
    // count a connection dealt here whose fiber has not started yet.
    const auto until = std::chrono::steady_clock::now() + options_.drainTimeout;
    while (c.active.load(std::memory_order_relaxed) > 0 && std::chrono::steady_clock::now() < until) {
        shutDown(/*idleOnly=*/true);
        if (!spindle::sleep(5ms)) {
            (void)this_fiber::acknowledgeCancellation();
            break;  // the runtime is shutting down: its cancellation ends the connections' calls
        }
    }
    while (c.active.load(std::memory_order_relaxed) > 0) {
        shutDown(/*idleOnly=*/false);
        this_fiber::yield();
        if (!spindle::sleep(1ms)) { (void)this_fiber::acknowledgeCancellation(); }
    }
    if (c.sweeper.joinable()) {
        c.sweeper.cancel();
        c.sweeper.join();
    }
    if (options_.carrierTick) { options_.carrierTick(carrier, /*final=*/true); }
}

void TcpServer::spawnConnection(unsigned carrier, int fd, uint64_t id, bool resumed) noexcept {
    Carrier& c = *carriers_[carrier];
    if (!resumed) {
        {
            std::lock_guard lock(mutex_);
            ++live_;
        }
        // Counted before the fiber starts, so that the target carrier's drain waits for it.
        c.active.fetch_add(1, std::memory_order_relaxed);
    }
    const std::string name = options_.name + "-conn";
    auto fiber = runtime_.spawn([this, carrier, fd, id, resumed]() noexcept { runConnection(carrier, fd, id, resumed); },
                                SpawnOptions{.name = name.c_str(),
                                             .stackSize = options_.connectionStackSize,
                                             .carrier = static_cast<int>(carrier),
                                             .pinned = true});
    if (fiber) { return; }  // dropping the handle detaches the fiber: it reports its own end
    if (fiber.errorCode() != ECANCELED) {
        log::warn("{}: no fiber for a connection: {}", options_.name, std::strerror(fiber.errorCode()));
    }
    if (resumed) {
        closeWithoutFiber(c, fd);  // from the parked poll's completion, on the carrier's thread
        return;
    }
    ::close(fd);
    c.active.fetch_sub(1, std::memory_order_relaxed);
    c.acceptErrors.fetch_add(1, std::memory_order_relaxed);  // from another carrier with one listener
    connectionEnded();
}

void TcpServer::runConnection(unsigned carrier, int fd, uint64_t id, bool resumed) noexcept {
    Carrier& c = *carriers_[carrier];
    {
        TcpConnection conn(*this, fd, carrier, id);
        conn.resumed_ = resumed;
        conn.node_.fiber = spindle::detail::runningFiber();
        c.link(&conn.node_);
        if (draining_.load(std::memory_order_acquire)) { conn.node_.idle = true; }  // the drain may have swept already
        for (;;) {
            handler_(conn);
            // A park asked for and not taken (the handler ended first) must not fail the close below.
            if (conn.node_.parkAsked) {
                conn.node_.parkAsked = false;
                (void)this_fiber::acknowledgeCancellation();
            }
            if (!std::exchange(conn.parkRequested_, false) || draining_.load(std::memory_order_acquire) ||
                !conn.stream_.isOpen()) {
                break;
            }
            if (park(c, conn)) { return; }  // the fiber ends; the parked record holds the connection now
            // No park (no memory, or input is there already): the handler goes on with this fiber.
            conn.resumed_ = true;
            conn.node_.idle = false;
            conn.node_.idleWait = false;
        }
        c.unlink(&conn.node_);
        // Through the ring, as every other call on the stream. Once the runtime shuts down the ring
        // refuses new operations with ECANCELED and the descriptor is still open: close(2) it then.
        if (conn.stream_.isOpen()) {
            const int own = conn.stream_.release();
            if (auto closed = spindle::close(own); !closed && closed.errorCode() == ECANCELED) { (void)::close(own); }
        }
    }
    ownerAdd(c.closed);
    c.active.fetch_sub(1, std::memory_order_relaxed);
    connectionEnded();
}

bool TcpServer::park(Carrier& c, TcpConnection& conn) noexcept {
    // What an idle connection costs (issue 19): grow it only knowingly.
    static_assert(sizeof(Parked) <= 232 || sizeof(void*) != 8, "a parked connection outgrew its 240-byte malloc chunk");
    auto* p = new (std::nothrow) Parked;
    if (p == nullptr) { return false; }
    p->fn = &TcpServer::onParkedReady;
    p->server = this;
    p->id = conn.id_;
    p->node.carrier = conn.node_.carrier;
    p->node.fd = conn.node_.fd;
    p->node.idle = true;
    p->node.idleWait = true;
    p->node.timedOut = conn.node_.timedOut;
    p->node.idleSinceNs = conn.node_.idleWait ? conn.node_.idleSinceNs : coarseNowNs();
    // The socket is the record's from here, before its poll is armed: the poll's completion may come
    // as soon as the carrier reaps.
    c.unlink(&conn.node_);
    c.link(&p->node);
    const int fd = conn.stream_.release();
    ownerAdd(c.parks);
    ownerAdd(c.parked);
    if (!armMultishot(op::poll(fd, POLLIN), p)) {
        // Refused (a driver that found the socket ready at once, the runtime shutting down): no
        // completion comes; the connection stays the handler's.
        ownerSub(c.parked);
        ownerSub(c.parks);
        conn.stream_ = TcpStream(fd);
        c.unlink(&p->node);
        c.link(&conn.node_);
        delete p;
        return false;
    }
    return true;
}

void TcpServer::onParkedReady(MultishotCompletion* done, int32_t res, uint32_t /*flags*/) noexcept {
    // On the carrier's thread, perhaps on some other fiber's stack (a completion reaped inside its
    // submit): nothing here may block. The poll has ended (it is one-shot): the record goes.
    auto* p = static_cast<Parked*>(done);
    TcpServer& s = *p->server;
    const unsigned carrier = p->node.carrier;
    Carrier& c = *s.carriers_[carrier];
    const int fd = p->node.fd;
    const uint64_t id = p->id;
    const bool close = p->node.timedOut || res < 0 || s.draining_.load(std::memory_order_acquire);
    c.unlink(&p->node);
    delete p;
    ownerSub(c.parked);
    if (close) {
        // Shut down by the sweep or the drain, or the runtime's shutdown ended the poll: nothing to
        // serve (a request that came with a drain is refused as the idle connections' are).
        s.closeWithoutFiber(c, fd);
        return;
    }
    s.spawnConnection(carrier, fd, id, /*resumed=*/true);
}

void TcpServer::closeWithoutFiber(Carrier& c, int fd) noexcept {
    ::close(fd);  // on the carrier's thread, between fibers: not through the ring
    ownerAdd(c.closed);
    c.active.fetch_sub(1, std::memory_order_relaxed);
    connectionEnded();
}

void TcpServer::connectionEnded() noexcept {
    // Under the lock: wait() cannot see live_ reach 0 and destroy the server before this fiber is
    // done with its members.
    std::lock_guard lock(mutex_);
    if (--live_ == 0) { drained_.notify_all(); }
}

}  // namespace spindle::net
