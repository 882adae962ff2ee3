// SPDX-License-Identifier: Apache-2.0
#include "net/tcp_server.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "base/log.h"
#include "core/io.h"

namespace spindle::net {

namespace {

using namespace std::chrono_literals;

// One writer per counter (the carrier that owns it), readers anywhere: no read-modify-write needed.
void bump(std::atomic<uint64_t>& c) noexcept { c.store(c.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed); }

}  // namespace

bool TcpConnection::draining() const noexcept { return server_->draining(); }

TcpServer::TcpServer(Runtime& runtime, const TcpServerOptions& options, Handler handler)
    : runtime_(runtime), options_(options), handler_(std::move(handler)), address_(options.address) {}

Result<std::unique_ptr<TcpServer>> TcpServer::start(Runtime& runtime, const TcpServerOptions& options, Handler handler) {
    if (!handler || options.backlog <= 0 || options.acceptBackoffMin < 0ms ||
        options.acceptBackoffMax < options.acceptBackoffMin || options.drainTimeout < 0ms) {
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
    std::unique_lock lock(mutex_);
    drained_.wait(lock, [this] { return live_ == 0; });
}

void TcpServer::acceptLoop(unsigned carrier) noexcept {
    Carrier& c = *carriers_[carrier];
    if (!c.accepts) {
        // One listener for all: this carrier only drains what it was dealt. The sleep ends with
        // ECANCELED when stop() cancels this fiber (or the runtime shuts down).
        while (!draining_.load(std::memory_order_acquire) && spindle::sleep(std::chrono::hours(1))) {}
        drain(c);
        return;
    }
    std::chrono::milliseconds backoff = options_.acceptBackoffMin;
    for (;;) {
        auto stream = c.listener.accept();
        if (!stream) {
            const int err = stream.errorCode();
            if (draining_.load(std::memory_order_acquire) || err == ECANCELED || err == EBADF) { break; }
            bump(c.acceptErrors);
            log::warn("{}: accept on carrier {}: {} (retrying in {} ms)", options_.name, carrier, std::strerror(err),
                      backoff.count());
            // A persistent error would otherwise spin; the sleep ends with ECANCELED at stop().
            if (!spindle::sleep(backoff)) { break; }
            backoff = std::min(backoff * 2, options_.acceptBackoffMax);
            continue;
        }
        backoff = options_.acceptBackoffMin;
        bump(c.accepted);
        // With a listener per carrier the connection stays where the kernel delivered it; one shared
        // listener deals connections out to the carriers in turn.
        const unsigned target = options_.listenerPerCarrier
                                    ? carrier
                                    : nextCarrier_.fetch_add(1, std::memory_order_relaxed) % runtime_.carrierCount();
        spawnConnection(target, stream->release());
    }
    drain(c);
}

void TcpServer::drain(Carrier& c) noexcept {
    // The cancellation that ended the loop above must not fail the calls below.
    (void)this_fiber::acknowledgeCancellation();
    draining_.store(true, std::memory_order_release);
    if (c.accepts) { c.listener.close(); }  // awaits the multishot accept's last completion
    auto shutDown = [&c](bool idleOnly) noexcept {
        for (TcpConnection* n = c.connections; n != nullptr; n = n->next_) {
            if (!idleOnly || n->idle_) {
                bump(c.drainClosed);
                n->idle_ = false;  // counted once; a second shutdown(2) is harmless
                (void)::shutdown(n->stream_.fd(), SHUT_RDWR);  // its pending receive returns 0
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
}

void TcpServer::spawnConnection(unsigned carrier, int fd) noexcept {
    {
        std::lock_guard lock(mutex_);
        ++live_;
    }
    Carrier& c = *carriers_[carrier];
    // Counted before the fiber starts, so that the target carrier's drain waits for it.
    c.active.fetch_add(1, std::memory_order_relaxed);
    const uint64_t id = nextId_.fetch_add(1, std::memory_order_relaxed);
    const std::string name = options_.name + "-conn";
    auto fiber = runtime_.spawn([this, carrier, fd, id]() noexcept { runConnection(carrier, fd, id); },
                                SpawnOptions{.name = name.c_str(),
                                             .stackSize = options_.connectionStackSize,
                                             .carrier = static_cast<int>(carrier),
                                             .pinned = true});
    if (fiber) { return; }  // dropping the handle detaches the fiber: it reports its own end
    log::warn("{}: no fiber for a connection: {}", options_.name, std::strerror(fiber.errorCode()));
    ::close(fd);
    c.active.fetch_sub(1, std::memory_order_relaxed);
    c.acceptErrors.fetch_add(1, std::memory_order_relaxed);  // from another carrier with one listener
    connectionEnded();
}

void TcpServer::runConnection(unsigned carrier, int fd, uint64_t id) noexcept {
    Carrier& c = *carriers_[carrier];
    {
        TcpConnection conn(*this, fd, carrier, id);
        conn.next_ = c.connections;
        if (c.connections != nullptr) { c.connections->prev_ = &conn; }
        c.connections = &conn;
        if (draining_.load(std::memory_order_acquire)) { conn.idle_ = true; }  // the drain may have swept already
        handler_(conn);
        if (conn.prev_ != nullptr) { conn.prev_->next_ = conn.next_; } else { c.connections = conn.next_; }
        if (conn.next_ != nullptr) { conn.next_->prev_ = conn.prev_; }
        // Through the ring, as every other call on the stream. Once the runtime shuts down the ring
        // refuses new operations with ECANCELED and the descriptor is still open: close(2) it then.
        if (conn.stream_.isOpen()) {
            const int own = conn.stream_.release();
            if (auto closed = spindle::close(own); !closed && closed.errorCode() == ECANCELED) { (void)::close(own); }
        }
    }
    bump(c.closed);
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
