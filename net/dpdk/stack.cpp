#include "net/dpdk/stack.h"

#include <rte_mbuf.h>
#include <time.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/fiber.h"
#include "core/fiber_future.h"
#include "core/internal/sync_support.h"
#include "core/runtime.h"
#include "net/dpdk/mbuf.h"

namespace spindle::dpdk {
namespace {

using spindle::detail::SpinLock;

// CLOCK_MONOTONIC_COARSE: ARP lifetimes and retry times need no better than a tick.
uint64_t coarseNowNs() noexcept {
    timespec t{};
    ::clock_gettime(CLOCK_MONOTONIC_COARSE, &t);
    return static_cast<uint64_t>(t.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(t.tv_nsec);
}

// CLOCK_MONOTONIC, the clock of Deadline.
uint64_t monoNowNs() noexcept {
    timespec t{};
    ::clock_gettime(CLOCK_MONOTONIC, &t);
    return static_cast<uint64_t>(t.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(t.tv_nsec);
}

// The bytes an mbuf's one segment can hold from its data start.
size_t room(const rte_mbuf* m) noexcept { return static_cast<size_t>(m->buf_len) - m->data_off; }

void bump(std::atomic<uint64_t>& c, uint64_t by = 1) noexcept {
    c.store(c.load(std::memory_order_relaxed) + by, std::memory_order_relaxed);  // one writer
}

uint32_t maskOf(unsigned prefix) noexcept {
    const uint32_t host = prefix == 0 ? 0 : ~uint32_t{0} << (32 - prefix);
    return __builtin_bswap32(host);  // to network order
}

uint8_t* frameOf(rte_mbuf* m) noexcept { return rte_pktmbuf_mtod(m, uint8_t*); }

// Sets an mbuf's one segment to hold `length` bytes from its start.
void setLength(rte_mbuf* m, size_t length) noexcept {
    m->data_len = static_cast<uint16_t>(length);
    m->pkt_len = static_cast<uint32_t>(length);
}

constexpr size_t kIpUdpHeaders = kIpv4Header + kUdpHeader;

}  // namespace

// ---- socket state ----------------------------------------------------------------------------------

struct UdpSocket::State {
    struct Datagram {
        rte_mbuf* mbuf;
        uint16_t offset;
        uint16_t length;
        Endpoint from;
    };
    Interface::Impl* iface = nullptr;
    uint16_t port = 0;
    SpinLock lock;  // guards everything below
    std::vector<Datagram> ring;  // capacity: the interface's socketQueue
    size_t head = 0;
    size_t count = 0;
    FiberFuture* waiter = nullptr;
    bool closed = false;
    std::atomic<unsigned> receivers{0};  // recvFrom()/recvBurst() calls inside: close() waits for them
    std::atomic<bool> open{true};        // false once close() began

    // Frees what is queued. Under `lock`.
    void drainLocked() noexcept {
        while (count > 0) {
            freePackets(&ring[head].mbuf, 1);
            head = (head + 1) % ring.size();
            --count;
        }
    }
};

// ---- the interface -----------------------------------------------------------------------------------

struct Interface::Impl {
    // A fiber waiting for a peer's MAC (on the interface's carrier).
    struct ArpWaiter {
        FiberFuture done;  // 0: resolved; -EHOSTUNREACH: given up
    };
    struct ArpEntry {
        Mac mac{};
        bool resolved = false;
        uint64_t expiresNs = 0;    // resolved: when to ask again
        unsigned attempts = 0;     // unresolved: requests sent
        uint64_t nextTryNs = 0;    // unresolved: when the next request is due
        std::vector<ArpWaiter*> waiters;
    };
    struct Counters {
        std::atomic<uint64_t> drops[static_cast<size_t>(DropReason::kCount)] = {};
        std::atomic<uint64_t> arpRequestsAnswered{0}, arpRequestsSent{0}, arpResolved{0}, arpFailed{0};
        std::atomic<uint64_t> echoReplies{0}, udpReceived{0}, udpSent{0}, udpNoSocket{0}, udpQueueFull{0};
        std::atomic<uint64_t> multiSegment{0};
    };

    Port* port = nullptr;
    unsigned queue = 0;
    InterfaceOptions options;
    InterfaceAddress self;
    uint32_t mask = 0;
    uint16_t mtu = 1500;
    UdpChecksum txChecksum = UdpChecksum::kCompute;  // the device's offload where it has one
    bool rxChecksum = false;                          // the device flags received checksums
    std::atomic<int> carrier{-1};  // -1: stopped (or stopping)

    // The carrier running the stack, or -1: stopped, stopping, or gone with the runtime's shutdown.
    int liveCarrier() const noexcept {
        const int c = carrier.load(std::memory_order_acquire);
        return c >= 0 && port->polled(queue) ? c : -1;
    }
    Counters counters;
    uint16_t ipId = 0;  // carrier thread only

    std::unordered_map<uint32_t, ArpEntry> arp;  // carrier thread only

    SpinLock socketsLock;  // guards sockets, nextPort
    std::unordered_map<uint16_t, UdpSocket::State*> sockets;
    uint16_t nextPort = 49152;

    // ---- receive: the port's handler, on the carrier ----------------------------------------------

    static void onBurst(void* arg, unsigned, rte_mbuf** pkts, uint16_t n) noexcept {
        static_cast<Impl*>(arg)->handle(pkts, n);
    }

    void handle(rte_mbuf** pkts, uint16_t n) noexcept {
        rte_mbuf* replies[Port::kBurst];
        uint16_t nReplies = 0;
        QueueStats delta;
        std::lock_guard<SpinLock> g(socketsLock);  // once per burst: datagrams find their sockets under it
        for (uint16_t i = 0; i < n; ++i) {
            rte_mbuf* m = pkts[i];
            if (m->nb_segs != 1) {
                bump(counters.multiSegment);
                ++delta.dropped;
                freePackets(&m, 1);
                continue;
            }
            const std::span<const uint8_t> frame(frameOf(m), rte_pktmbuf_data_len(m));
            VerifiedChecksums verified;
            if (rxChecksum) {
                // Only a device's "good" is taken on trust. Its "bad" (or "unknown") leaves the check to
                // the parser, which also says why: a UDP length that disagrees with IP's is malformed
                // before its checksum is wrong, and a checksum of 0 means none was sent.
                verified.ipHeader = (m->ol_flags & RTE_MBUF_F_RX_IP_CKSUM_MASK) == RTE_MBUF_F_RX_IP_CKSUM_GOOD;
                verified.l4 = (m->ol_flags & RTE_MBUF_F_RX_L4_CKSUM_MASK) == RTE_MBUF_F_RX_L4_CKSUM_GOOD;
            }
            const ParsedFrame p = parseFrame(frame, self, verified);
            switch (p.kind) {
                case FrameKind::kDrop:
                    // An ARP request for another address still updates a peer we know (RFC 826's
                    // merge; a gratuitous announcement after a fail-over is one).
                    if (p.arpSender) { learn(p.srcIp, p.srcMac, /*create=*/false); }
                    bump(counters.drops[static_cast<size_t>(p.reason)]);
                    if (p.reason == DropReason::kBadChecksum) {
                        ++delta.badChecksum;
                    } else if (p.reason == DropReason::kNotForUs || p.reason == DropReason::kUnsupported) {
                        ++delta.notForUs;
                    } else {
                        ++delta.dropped;
                    }
                    freePackets(&m, 1);
                    break;
                case FrameKind::kArpRequest: {
                    learn(p.srcIp, p.srcMac, /*create=*/true);
                    // The answer goes out in the request's own mbuf.
                    const size_t len = buildArpReply({frameOf(m), room(m)}, self, p);
                    setLength(m, len);
                    replies[nReplies++] = m;
                    bump(counters.arpRequestsAnswered);
                    break;
                }
                case FrameKind::kArpReply:
                    learn(p.srcIp, p.srcMac, /*create=*/p.dstIp == self.ip);
                    freePackets(&m, 1);
                    break;
                case FrameKind::kIcmpEcho: {
                    uint8_t* f = frameOf(m);
                    const size_t len = buildEchoReply({f, room(m)}, {f, frame.size()}, p, self);
                    setLength(m, len);
                    replies[nReplies++] = m;
                    bump(counters.echoReplies);
                    break;
                }
                case FrameKind::kUdp:
                    deliver(m, p, delta);
                    break;
            }
        }
        if (nReplies > 0) {
            const uint16_t sent = port->transmit(queue, replies, nReplies);
            if (sent < nReplies) {
                freePackets(replies + sent, static_cast<unsigned>(nReplies - sent));
                delta.dropped += nReplies - sent;
            }
        }
        port->count(queue, delta);
    }

    // Under socketsLock.
    void deliver(rte_mbuf* m, const ParsedFrame& p, QueueStats& delta) noexcept {
        const auto it = sockets.find(p.dstPort);
        if (it == sockets.end()) {
            bump(counters.udpNoSocket);
            ++delta.notForUs;
            freePackets(&m, 1);
            return;
        }
        UdpSocket::State& s = *it->second;
        std::lock_guard<SpinLock> g(s.lock);
        if (s.count == s.ring.size()) {
            bump(counters.udpQueueFull);
            ++delta.dropped;
            freePackets(&m, 1);
            return;
        }
        s.ring[(s.head + s.count) % s.ring.size()] =
            UdpSocket::State::Datagram{m, p.payloadOffset, p.payloadLength, Endpoint{p.srcIp, p.srcPort}};
        ++s.count;
        bump(counters.udpReceived);
        if (FiberFuture* w = std::exchange(s.waiter, nullptr)) { w->set(0); }
    }

    // The cache holds at most this many peers: requests from spoofed senders cannot grow it without
    // bound. When full, expired entries nobody waits on go first; then nothing new is added.
    static constexpr size_t kArpCacheLimit = 4096;

    // Whether a new entry fits, pruning expired ones when the cache is full.
    bool arpRoom() noexcept {
        if (arp.size() < kArpCacheLimit) { return true; }
        const uint64_t now = coarseNowNs();
        for (auto it = arp.begin(); it != arp.end();) {
            if (it->second.waiters.empty() && (!it->second.resolved || it->second.expiresNs <= now)) {
                it = arp.erase(it);
            } else {
                ++it;
            }
        }
        return arp.size() < kArpCacheLimit;
    }

    // RFC 826's merge: update a known peer; add one only when the frame was meant for us.
    void learn(uint32_t ip, const Mac& mac, bool create) noexcept {
        if (ip == 0) { return; }  // an ARP probe says nothing about the sender
        auto it = arp.find(ip);
        if (it == arp.end()) {
            if (!create || !arpRoom()) { return; }
            try {
                it = arp.emplace(ip, ArpEntry{}).first;
            } catch (...) {
                return;  // no memory: the peer will be asked when we need it
            }
        }
        ArpEntry& e = it->second;
        if (!e.resolved) { bump(counters.arpResolved); }
        e.mac = mac;
        e.resolved = true;
        e.expiresNs = coarseNowNs() + static_cast<uint64_t>(std::chrono::nanoseconds(options.arpLifetime).count());
        for (ArpWaiter* w : e.waiters) { w->done.set(0); }
        e.waiters.clear();
    }

    // ---- send: on the carrier, from a pinned fiber ----------------------------------------------

    bool sendArpRequest(uint32_t ip) noexcept {
        rte_mbuf* m = nullptr;
        if (!allocPackets(port->pool(queue), &m, 1)) {
            QueueStats d;
            d.noMbuf = 1;
            port->count(queue, d);
            return false;
        }
        char* data = rte_pktmbuf_append(m, kEthernetHeader + kArpPacket);
        (void)buildArpRequest({reinterpret_cast<uint8_t*>(data), kEthernetHeader + kArpPacket}, self, ip);
        if (port->transmit(queue, &m, 1) != 1) {
            freePackets(&m, 1);
            return false;
        }
        bump(counters.arpRequestsSent);
        return true;
    }

    // The MAC of `ip` (on our subnet): from the cache, or asked for and waited on.
    Result<Mac> resolve(uint32_t ip, Deadline deadline) noexcept {
        for (;;) {
            const uint64_t now = coarseNowNs();
            auto it = arp.find(ip);
            if (it == arp.end()) {
                if (!arpRoom()) { return Error{ENOBUFS}; }  // as many peers resolving or fresh as the cache holds
                try {
                    it = arp.emplace(ip, ArpEntry{}).first;
                } catch (...) {
                    return Error{ENOBUFS};
                }
            }
            ArpEntry& e = it->second;
            if (e.resolved && now < e.expiresNs) { return e.mac; }
            if (e.resolved) {  // expired: ask again, keep using nothing stale
                e.resolved = false;
                e.attempts = 0;
                e.nextTryNs = 0;
            }
            if (now >= e.nextTryNs) {
                if (e.attempts >= options.arpAttempts) {
                    // Given up: everyone waiting hears it, and the next send starts afresh.
                    bump(counters.arpFailed);
                    for (ArpWaiter* w : e.waiters) { w->done.set(-EHOSTUNREACH); }
                    arp.erase(it);
                    return Error{EHOSTUNREACH};
                }
                ++e.attempts;
                e.nextTryNs = now + static_cast<uint64_t>(std::chrono::nanoseconds(options.arpTimeout).count());
                (void)sendArpRequest(ip);  // a lost request is a retry later
            }
            ArpWaiter w;
            try {
                e.waiters.push_back(&w);
            } catch (...) {
                return Error{ENOBUFS};
            }
            // Until the retry is due (or the deadline, if sooner); cancellable.
            uint64_t waitNs = e.nextTryNs > now ? e.nextTryNs - now : 0;
            const uint64_t nowFine = monoNowNs();
            if (deadline.isSet()) {
                if (deadline.ns() <= nowFine) {
                    withdraw(ip, &w);
                    return Error{ETIMEDOUT};
                }
                waitNs = std::min(waitNs, deadline.ns() - nowFine);
            }
            const int32_t r = FiberFuture::waitWithTimeout(&w.done, std::chrono::nanoseconds(waitNs + 1));
            if (r == -ETIMEDOUT || r == -ECANCELED) {
                if (w.done.isSet()) {  // set in the same turn: take its answer
                    if (w.done.result() < 0) { return Error{-w.done.result()}; }
                    continue;
                }
                withdraw(ip, &w);
                if (r == -ECANCELED) { return Error{ECANCELED}; }
                if (deadline.isSet() && monoNowNs() >= deadline.ns()) { return Error{ETIMEDOUT}; }
                continue;  // a retry is due
            }
            if (r < 0) { return Error{-r}; }
            // Resolved: the loop finds it in the cache.
        }
    }

    void withdraw(uint32_t ip, ArpWaiter* w) noexcept {
        auto it = arp.find(ip);
        if (it == arp.end()) { return; }
        auto& ws = it->second.waiters;
        for (size_t i = 0; i < ws.size(); ++i) {
            if (ws[i] == w) {
                ws.erase(ws.begin() + static_cast<std::ptrdiff_t>(i));
                return;
            }
        }
    }

    // Asks the device for the checksums buildUdpHeaders() left to it.
    void flagChecksums(rte_mbuf* m) const noexcept {
        if (txChecksum != UdpChecksum::kOffload) { return; }
        m->ol_flags |= RTE_MBUF_F_TX_IPV4 | RTE_MBUF_F_TX_IP_CKSUM | RTE_MBUF_F_TX_UDP_CKSUM;
        m->l2_len = kEthernetHeader;
        m->l3_len = kIpv4Header;
    }

    // The MAC to send to `ip` through: itself on the subnet, else the gateway.
    Result<Mac> nextHopMac(uint32_t ip, Deadline deadline) noexcept {
        uint32_t nextHop = ip;
        if ((ip & mask) != (self.ip & mask)) {
            if (options.gateway == 0) { return Error{ENETUNREACH}; }
            nextHop = options.gateway;
        }
        return resolve(nextHop, deadline);
    }

    // sendBurst() on the interface's carrier: headers for every datagram whose peer resolves, one
    // transmit for them all; what cannot go is freed.
    Result<size_t> sendBurstHere(uint16_t srcPort, rte_mbuf** mbufs, const Endpoint* to, size_t n, Deadline deadline) noexcept {
        size_t ready = 0;
        int error = 0;
        for (; ready < n; ++ready) {
            rte_mbuf* m = mbufs[ready];
            const size_t frame = rte_pktmbuf_data_len(m);
            if (m->nb_segs != 1 || frame < kUdpFrameHeaders || to[ready].ip == 0 || to[ready].port == 0) {
                error = EINVAL;
                break;
            }
            auto mac = nextHopMac(to[ready].ip, deadline);
            if (!mac) {
                error = mac.errorCode();
                break;
            }
            (void)buildUdpHeaders({frameOf(m), frame}, self, *mac, to[ready].ip, srcPort, to[ready].port,
                                  frame - kUdpFrameHeaders, ipId++, txChecksum);
            flagChecksums(m);
        }
        if (ready < n) { freePackets(mbufs + ready, static_cast<unsigned>(n - ready)); }
        size_t sent = 0;
        for (size_t done = 0; done < ready;) {  // each chunk is sent, or freed and counted, by transmitAll
            const auto chunk = static_cast<uint16_t>(std::min<size_t>(ready - done, 32768));
            sent += port->transmitAll(queue, mbufs + done, chunk, 1024);
            done += chunk;
        }
        bump(counters.udpSent, sent);
        if (sent == 0 && error != 0) { return Error{error}; }
        if (sent == 0 && ready > 0) { return Error{ENOBUFS}; }
        return sent;
    }
};

Interface::Interface(std::unique_ptr<Impl> impl) noexcept : impl_(std::move(impl)) {}

Interface::~Interface() = default;

Result<std::unique_ptr<Interface>> Interface::create(Port& port, unsigned queue, const InterfaceOptions& o) noexcept {
    if (!port.isOpen() || queue >= port.queues() || o.ip == 0 || o.prefixLength > 32 || o.arpAttempts == 0 ||
        o.socketQueue == 0) {
        return Error{EINVAL};
    }
    std::unique_ptr<Impl> impl(new (std::nothrow) Impl);
    if (!impl) { return Error{ENOMEM}; }
    impl->port = &port;
    impl->queue = queue;
    impl->options = o;
    impl->self = InterfaceAddress{port.mac(), o.ip};
    impl->mask = maskOf(o.prefixLength);
    impl->mtu = port.mtu();
    impl->txChecksum = !o.udpChecksum ? UdpChecksum::kNone
                       : port.txChecksumOffload() ? UdpChecksum::kOffload
                                                  : UdpChecksum::kCompute;
    impl->rxChecksum = port.rxChecksumOffload();
    std::unique_ptr<Interface> iface(new (std::nothrow) Interface(std::move(impl)));
    if (!iface) { return Error{ENOMEM}; }
    return iface;
}

Result<void> Interface::start() noexcept {
    if (auto r = impl_->port->startPolling(impl_->queue, &Impl::onBurst, impl_.get()); !r) { return r; }
    impl_->carrier.store(this_fiber::carrierIndex(), std::memory_order_release);
    return {};
}

Result<void> Interface::stop() noexcept {
    int was = -1;
    {
        // Marked stopping in the same step that finds no socket: a bind() after it gets EBADF.
        std::lock_guard<SpinLock> g(impl_->socketsLock);
        if (!impl_->sockets.empty()) { return Error{EBUSY}; }
        was = impl_->carrier.exchange(-1, std::memory_order_acq_rel);
    }
    // Not polled any more: stopped already, or its carrier left with the runtime's shutdown.
    if (impl_->port->polled(impl_->queue)) {
        if (auto r = impl_->port->stopPolling(impl_->queue); !r) {
            impl_->carrier.store(was, std::memory_order_release);  // still running: undo the mark
            return r;
        }
    }
    for (auto& [ip, e] : impl_->arp) {
        for (Impl::ArpWaiter* w : e.waiters) { w->done.set(-EHOSTUNREACH); }
        e.waiters.clear();
    }
    return {};
}

const InterfaceAddress& Interface::address() const noexcept { return impl_->self; }
int Interface::carrier() const noexcept { return impl_->liveCarrier(); }

InterfaceStats Interface::stats() const noexcept {
    const Impl::Counters& c = impl_->counters;
    InterfaceStats s;
    for (size_t i = 0; i < static_cast<size_t>(DropReason::kCount); ++i) { s.drops[i] = c.drops[i].load(std::memory_order_relaxed); }
    s.arpRequestsAnswered = c.arpRequestsAnswered.load(std::memory_order_relaxed);
    s.arpRequestsSent = c.arpRequestsSent.load(std::memory_order_relaxed);
    s.arpResolved = c.arpResolved.load(std::memory_order_relaxed);
    s.arpFailed = c.arpFailed.load(std::memory_order_relaxed);
    s.echoReplies = c.echoReplies.load(std::memory_order_relaxed);
    s.udpReceived = c.udpReceived.load(std::memory_order_relaxed);
    s.udpSent = c.udpSent.load(std::memory_order_relaxed);
    s.udpNoSocket = c.udpNoSocket.load(std::memory_order_relaxed);
    s.udpQueueFull = c.udpQueueFull.load(std::memory_order_relaxed);
    s.multiSegment = c.multiSegment.load(std::memory_order_relaxed);
    return s;
}

// ---- UdpSocket -----------------------------------------------------------------------------------

UdpSocket::UdpSocket() noexcept = default;
UdpSocket::UdpSocket(std::unique_ptr<State> s) noexcept : state_(std::move(s)) {}
UdpSocket::UdpSocket(UdpSocket&&) noexcept = default;
UdpSocket& UdpSocket::operator=(UdpSocket&& o) noexcept {
    if (this != &o) {
        if (state_) { (void)close(); }
        state_ = std::move(o.state_);
    }
    return *this;
}
UdpSocket::~UdpSocket() {
    if (state_) { (void)close(); }  // EBADF when closed already: either way no receiver is inside
}

uint16_t UdpSocket::localPort() const noexcept { return isOpen() ? state_->port : 0; }
bool UdpSocket::isOpen() const noexcept { return state_ && state_->open.load(std::memory_order_acquire); }

Result<UdpSocket> UdpSocket::bind(Interface& iface, uint16_t port) noexcept {
    Interface::Impl& im = *iface.impl_;
    std::unique_ptr<State> s(new (std::nothrow) State);
    if (!s) { return Error{ENOMEM}; }
    s->iface = &im;
    try {
        s->ring.resize(im.options.socketQueue);
    } catch (...) {
        return Error{ENOMEM};
    }
    std::lock_guard<SpinLock> g(im.socketsLock);
    if (im.liveCarrier() < 0) { return Error{EBADF}; }
    if (port == 0) {
        for (unsigned tries = 0; tries < 16384; ++tries) {
            const uint16_t p = im.nextPort;
            im.nextPort = p == 65535 ? 49152 : static_cast<uint16_t>(p + 1);
            if (im.sockets.count(p) == 0) {
                port = p;
                break;
            }
        }
        if (port == 0) { return Error{EADDRINUSE}; }
    } else if (im.sockets.count(port) != 0) {
        return Error{EADDRINUSE};
    }
    s->port = port;
    try {
        im.sockets.emplace(port, s.get());
    } catch (...) {
        return Error{ENOMEM};
    }
    return UdpSocket(std::move(s));
}

Result<void> UdpSocket::close() noexcept {
    // The state stays allocated until the destructor: a receiver that is just entering recvFrom()
    // on another thread finds it closed (EBADF) instead of freed.
    if (!state_ || !state_->open.exchange(false, std::memory_order_acq_rel)) { return Error{EBADF}; }
    State& s = *state_;
    {
        // Out of the table first: from then on no burst finds the socket.
        std::lock_guard<SpinLock> g(s.iface->socketsLock);
        s.iface->sockets.erase(s.port);
    }
    {
        std::lock_guard<SpinLock> g(s.lock);
        s.closed = true;
        if (FiberFuture* w = std::exchange(s.waiter, nullptr)) { w->set(-ECANCELED); }
        s.drainLocked();
    }
    // A receiver woken above may still be on its way out of recvFrom(): wait for it.
    while (s.receivers.load(std::memory_order_acquire) != 0) { this_fiber::yield(); }
    return {};
}

namespace {

// The receive loop of recvFrom() and recvBurst(): `take(s)` runs under the socket's lock when
// datagrams are queued and returns what the call returns; otherwise the caller parks until one comes.
template <class Take>
Result<size_t> receiveWith(UdpSocket::State& s, Deadline deadline, Take&& take) noexcept {
    s.receivers.fetch_add(1, std::memory_order_acq_rel);
    struct Leave {
        UdpSocket::State& s;
        ~Leave() { s.receivers.fetch_sub(1, std::memory_order_acq_rel); }
    } leave{s};
    for (;;) {
        FiberFuture wake;
        {
            std::lock_guard<SpinLock> g(s.lock);
            if (s.closed) { return Error{EBADF}; }
            if (s.count > 0) { return take(s); }
            if (s.waiter != nullptr) { return Error{EBUSY}; }  // another receiver: one at a time
            s.waiter = &wake;
        }
        std::chrono::nanoseconds left = std::chrono::hours(24 * 365);
        if (deadline.isSet()) {
            const uint64_t now = monoNowNs();
            left = std::chrono::nanoseconds(deadline.ns() > now ? deadline.ns() - now : 0);
        }
        const int32_t r = left.count() == 0 ? -ETIMEDOUT : FiberFuture::waitWithTimeout(&wake, left);
        if (r == -ETIMEDOUT || r == -ECANCELED) {
            bool mine = false;
            {
                std::lock_guard<SpinLock> g(s.lock);
                if (s.waiter == &wake) {
                    s.waiter = nullptr;
                    mine = true;
                }
            }
            if (mine) {
                if (r == -ETIMEDOUT && !deadline.isSet()) { continue; }  // the stand-in year ran out
                return Error{-r};
            }
            (void)wake.wait();  // the poller (or close) claimed it: its set is on the way
        }
        if (wake.isSet() && wake.result() == -ECANCELED) { return Error{ECANCELED}; }  // closed under us
    }
}

}  // namespace

Result<size_t> UdpSocket::recvFrom(void* buf, size_t len, Endpoint* from, Deadline deadline, size_t* fullLength) noexcept {
    if (!state_) { return Error{EBADF}; }
    return receiveWith(*state_, deadline, [&](State& s) noexcept -> Result<size_t> {
        const State::Datagram d = s.ring[s.head];
        s.head = (s.head + 1) % s.ring.size();
        --s.count;
        const size_t n = std::min<size_t>(len, d.length);
        std::memcpy(buf, rte_pktmbuf_mtod_offset(d.mbuf, const char*, d.offset), n);
        rte_mbuf* m = d.mbuf;
        freePackets(&m, 1);
        if (from != nullptr) { *from = d.from; }
        if (fullLength != nullptr) { *fullLength = d.length; }
        return n;
    });
}

Result<size_t> UdpSocket::recvBurst(DatagramView* out, size_t n, Deadline deadline) noexcept {
    if (!state_) { return Error{EBADF}; }
    if (n == 0) { return size_t{0}; }
    return receiveWith(*state_, deadline, [&](State& s) noexcept -> Result<size_t> {
        size_t taken = 0;
        while (taken < n && s.count > 0) {
            const State::Datagram& d = s.ring[s.head];
            out[taken++] = DatagramView{d.mbuf, rte_pktmbuf_mtod_offset(d.mbuf, uint8_t*, d.offset), d.length, d.from};
            s.head = (s.head + 1) % s.ring.size();
            --s.count;
        }
        return taken;
    });
}

Result<rte_mbuf*> UdpSocket::allocDatagram(size_t length, uint8_t** payload) noexcept {
    if (!isOpen()) { return Error{EBADF}; }
    Interface::Impl& im = *state_->iface;
    if (length + kIpUdpHeaders > im.mtu) { return Error{EMSGSIZE}; }
    rte_mbuf* m = nullptr;
    if (!allocPackets(im.port->pool(im.queue), &m, 1)) {
        QueueStats d;
        d.noMbuf = 1;
        im.port->count(im.queue, d);
        return Error{ENOBUFS};
    }
    char* data = rte_pktmbuf_append(m, static_cast<uint16_t>(kUdpFrameHeaders + length));
    if (data == nullptr) {
        freePackets(&m, 1);
        return Error{EMSGSIZE};
    }
    *payload = reinterpret_cast<uint8_t*>(data) + kUdpFrameHeaders;
    return m;
}

Result<void> UdpSocket::prepareReply(const DatagramView& v) noexcept {
    if (v.mbuf == nullptr || v.mbuf->nb_segs != 1) { return Error{EINVAL}; }
    uint8_t* start = rte_pktmbuf_mtod(v.mbuf, uint8_t*);
    if (v.data < start + kUdpFrameHeaders || v.data + v.length > start + rte_pktmbuf_data_len(v.mbuf)) {
        return Error{EINVAL};
    }
    // Where sendBurst() builds the headers: the payload right after 42 bytes of them.
    if (v.data != start + kUdpFrameHeaders) { std::memmove(start + kUdpFrameHeaders, v.data, v.length); }
    setLength(v.mbuf, kUdpFrameHeaders + v.length);
    return {};
}

Result<size_t> UdpSocket::sendBurst(rte_mbuf** mbufs, const Endpoint* to, size_t n, Deadline deadline) noexcept {
    if (!isOpen()) {
        freePackets(mbufs, static_cast<unsigned>(n));
        return Error{EBADF};
    }
    Interface::Impl& im = *state_->iface;
    const int c = im.liveCarrier();
    const uint16_t port = state_->port;
    if (c >= 0 && this_fiber::carrierIndex() == c && this_fiber::pinned()) {
        return im.sendBurstHere(port, mbufs, to, n, deadline);
    }
    if (c < 0 || !this_fiber::inFiber()) {
        freePackets(mbufs, static_cast<unsigned>(n));
        return Error{c < 0 ? ENETDOWN : EPERM};
    }
    auto f = spindle::spawn([&]() noexcept -> Result<size_t> { return im.sendBurstHere(port, mbufs, to, n, deadline); },
                            SpawnOptions{.name = "dpdk-send", .carrier = c, .pinned = true});
    if (!f) {
        freePackets(mbufs, static_cast<unsigned>(n));
        return Error{f.errorCode()};
    }
    return f->join();
}

Result<size_t> UdpSocket::sendTo(const void* buf, size_t len, const Endpoint& to, Deadline deadline) noexcept {
    if (!isOpen()) { return Error{EBADF}; }
    if (to.ip == 0 || to.port == 0) { return Error{EINVAL}; }
    if (this_fiber::cancellationRequested()) { return Error{ECANCELED}; }
    // A burst of one: the payload copied into a fresh mbuf, which sendBurst() takes whatever happens.
    uint8_t* payload = nullptr;
    auto m = allocDatagram(len, &payload);
    if (!m) { return Error{m.errorCode()}; }
    std::memcpy(payload, buf, len);
    rte_mbuf* one = *m;
    auto sent = sendBurst(&one, &to, 1, deadline);
    if (!sent) { return Error{sent.errorCode()}; }
    return len;
}

}  // namespace spindle::dpdk
