// SPDX-License-Identifier: Apache-2.0
#include "net/dpdk/stack.h"

#include <rte_mbuf.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "base/counter.h"
#include "core/fiber.h"
#include "core/fiber_future.h"
#include "core/internal/sync_support.h"
#include "core/poller.h"
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
    int queue = -1;  // the one queue whose datagrams it hears, or -1: every queue of the interface
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
    // A peer in a lane's ARP cache.
    struct ArpEntry {
        enum class State : uint8_t { kResolving, kReachable, kFailed };
        State state = State::kResolving;
        Mac mac{};
        uint64_t untilNs = 0;     // reachable: expiry; resolving: next request due; failed: end of hold-down
        unsigned attempts = 0;    // resolving: requests sent
        std::vector<rte_mbuf*> pending;  // resolving: datagrams waiting for the MAC, oldest first
    };
    // One lane's counters: written by its carrier only, summed by stats().
    struct Counters {
        std::atomic<uint64_t> drops[static_cast<size_t>(DropReason::kCount)] = {};
        std::atomic<uint64_t> arpRequestsAnswered{0}, arpRequestsSent{0}, arpResolved{0}, arpFailed{0};
        std::atomic<uint64_t> echoReplies{0}, udpReceived{0}, udpSent{0}, udpNoSocket{0}, udpQueueFull{0};
        std::atomic<uint64_t> multiSegment{0};
        std::atomic<uint64_t> arpQueued{0}, arpQueueDropped{0};
    };
    struct Lane;
    // A lane's ARP timer and mailbox: a poller on its carrier that has work only while peers
    // resolve or another lane has told it something.
    struct ArpTimer : Poller {
        Lane* lane = nullptr;
        bool live = false;  // registered; false again once removed or detached at the runtime's shutdown
    };
    // A peer one lane learned, for the others.
    struct Learned {
        uint32_t ip;
        Mac mac;
        bool create;
    };
    // Mail a lane may hold before further news is dropped (the sender asks again when it needs to).
    static constexpr size_t kMailLimit = 4096;

    // One queue of the interface and the carrier that polls it: that carrier's share of the stack.
    // ARP is replicated per lane (each sends and retries its own requests); a reply can arrive on
    // any queue, so what a lane learns from a reply, or newly, goes to the others' mailboxes.
    struct Lane {
        Impl* im = nullptr;
        unsigned queue = 0;
        std::atomic<int> carrier{-1};  // -1: not started, stopped, or stopping
        Counters counters;
        uint16_t ipId = 0;

        // The carrier's only (or any thread's once it has left with the runtime's shutdown).
        std::unordered_map<uint32_t, ArpEntry> arp;
        std::vector<uint32_t> resolving;  // the peers in kResolving: the timer's work list
        size_t pendingTotal = 0;          // datagrams in every peer's `pending`
        uint64_t nextDueNs = UINT64_MAX;  // the earliest request due among `resolving`
        ArpTimer timer;

        // The bound sockets, a copy per lane: a burst takes its own lane's lock, and only bind()
        // and close() (which update every lane) contend for it.
        SpinLock socketsLock;
        std::unordered_map<uint16_t, UdpSocket::State*> sockets;

        SpinLock mailLock;  // guards mail
        std::vector<Learned> mail;
        std::atomic<bool> hasMail{false};

        // The carrier polling this lane's queue, or -1 (also once the runtime's shutdown took it).
        int live() const noexcept {
            const int c = carrier.load(std::memory_order_acquire);
            return c >= 0 && im->port->polled(queue) ? c : -1;
        }
    };

    Port* port = nullptr;
    InterfaceOptions options;
    InterfaceAddress self;
    uint32_t mask = 0;
    uint16_t mtu = 1500;
    UdpChecksum txChecksum = UdpChecksum::kCompute;  // the device's offload where it has one
    bool rxChecksum = false;                          // the device flags received checksums
    std::vector<std::unique_ptr<Lane>> lanes;
    std::vector<unsigned> queues;  // the lanes' queues, in order

    SpinLock bindLock;  // guards bound, nextPort, stopping; orders bind(), close() and stop()
    std::unordered_multimap<uint16_t, UdpSocket::State*> bound;  // several per port only on distinct queues
    uint16_t nextPort = 49152;
    bool stopping = false;

    // The lane the calling fiber may send on directly: one its carrier polls, the fiber pinned
    // there (an unpinned fiber could move while it waits for ring space).
    Lane* laneHere() const noexcept {
        if (!this_fiber::inFiber() || !this_fiber::pinned()) { return nullptr; }
        const int c = this_fiber::carrierIndex();
        for (const auto& l : lanes) {
            if (l->carrier.load(std::memory_order_acquire) == c) { return l->live() == c ? l.get() : nullptr; }
        }
        return nullptr;
    }
    // A running lane, the first queue's first; nullptr when none runs.
    Lane* anyLiveLane() const noexcept {
        for (const auto& l : lanes) {
            if (l->live() >= 0) { return l.get(); }
        }
        return nullptr;
    }

    // ---- receive: the port's handler, on the lane's carrier ---------------------------------------

    static void onBurst(void* arg, unsigned, rte_mbuf** pkts, uint16_t n) noexcept {
        auto* lane = static_cast<Lane*>(arg);
        lane->im->handle(*lane, pkts, n);
    }

    void handle(Lane& l, rte_mbuf** pkts, uint16_t n) noexcept {
        rte_mbuf* replies[Port::kBurst];
        uint16_t nReplies = 0;
        QueueStats delta;
        Counters& c = l.counters;
        std::lock_guard<SpinLock> g(l.socketsLock);  // once per burst: datagrams find their sockets under it
        for (uint16_t i = 0; i < n; ++i) {
            rte_mbuf* m = pkts[i];
            if (m->nb_segs != 1) {
                ownerAdd(c.multiSegment);
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
                    if (p.arpSender) { learn(l, p.srcIp, p.srcMac, /*create=*/false, /*reply=*/false); }
                    ownerAdd(c.drops[static_cast<size_t>(p.reason)]);
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
                    learn(l, p.srcIp, p.srcMac, /*create=*/true, /*reply=*/false);
                    // The answer goes out in the request's own mbuf.
                    const size_t len = buildArpReply({frameOf(m), room(m)}, self, p);
                    setLength(m, len);
                    replies[nReplies++] = m;
                    ownerAdd(c.arpRequestsAnswered);
                    break;
                }
                case FrameKind::kArpReply:
                    learn(l, p.srcIp, p.srcMac, /*create=*/p.dstIp == self.ip, /*reply=*/true);
                    freePackets(&m, 1);
                    break;
                case FrameKind::kIcmpEcho: {
                    uint8_t* f = frameOf(m);
                    const size_t len = buildEchoReply({f, room(m)}, {f, frame.size()}, p, self);
                    setLength(m, len);
                    replies[nReplies++] = m;
                    ownerAdd(c.echoReplies);
                    break;
                }
                case FrameKind::kUdp:
                    deliver(l, m, p, delta);
                    break;
            }
        }
        if (nReplies > 0) {
            const uint16_t sent = port->transmit(l.queue, replies, nReplies);
            if (sent < nReplies) {
                freePackets(replies + sent, static_cast<unsigned>(nReplies - sent));
                delta.dropped += nReplies - sent;
            }
        }
        port->count(l.queue, delta);
    }

    // Under the lane's socketsLock.
    void deliver(Lane& l, rte_mbuf* m, const ParsedFrame& p, QueueStats& delta) noexcept {
        const auto it = l.sockets.find(p.dstPort);
        if (it == l.sockets.end()) {
            ownerAdd(l.counters.udpNoSocket);
            ++delta.notForUs;
            freePackets(&m, 1);
            return;
        }
        UdpSocket::State& s = *it->second;
        std::lock_guard<SpinLock> g(s.lock);
        if (s.count == s.ring.size()) {
            ownerAdd(l.counters.udpQueueFull);
            ++delta.dropped;
            freePackets(&m, 1);
            return;
        }
        s.ring[(s.head + s.count) % s.ring.size()] =
            UdpSocket::State::Datagram{m, p.payloadOffset, p.payloadLength, Endpoint{p.srcIp, p.srcPort}};
        ++s.count;
        ownerAdd(l.counters.udpReceived);
        if (FiberFuture* w = std::exchange(s.waiter, nullptr)) { w->set(0); }
    }

    // ---- ARP: one lane's cache, on its carrier ---------------------------------------------------

    // A lane's cache holds at most this many peers: requests from spoofed senders cannot grow it
    // without bound. When full, expired and failed entries go first; then nothing new is added.
    static constexpr size_t kArpCacheLimit = 4096;

    static uint64_t ns(std::chrono::nanoseconds d) noexcept { return static_cast<uint64_t>(d.count()); }

    // Whether a new entry fits, pruning stale ones when the cache is full. Peers being resolved stay.
    static bool arpRoom(Lane& l) noexcept {
        if (l.arp.size() < kArpCacheLimit) { return true; }
        const uint64_t now = coarseNowNs();
        for (auto it = l.arp.begin(); it != l.arp.end();) {
            if (it->second.state != ArpEntry::State::kResolving && it->second.untilNs <= now) {
                it = l.arp.erase(it);
            } else {
                ++it;
            }
        }
        return l.arp.size() < kArpCacheLimit;
    }

    // Frees datagrams that will not go: their peer did not answer, its queue overflowed, or the
    // interface stopped. Counted in arpQueueDropped and the queue's `dropped`.
    void dropPending(Lane& l, rte_mbuf** mbufs, size_t n) noexcept {
        if (n == 0) { return; }
        freePackets(mbufs, static_cast<unsigned>(n));
        ownerAdd(l.counters.arpQueueDropped, n);
        QueueStats d;
        d.dropped = n;
        port->count(l.queue, d);
    }

    static void forgetResolving(Lane& l, uint32_t ip) noexcept {
        for (size_t i = 0; i < l.resolving.size(); ++i) {
            if (l.resolving[i] == ip) {
                l.resolving[i] = l.resolving.back();
                l.resolving.pop_back();
                return;
            }
        }
    }

    // RFC 826's merge: update a known peer; add one only when the frame was meant for us. A peer
    // being resolved gets its waiting datagrams sent, addressed to the MAC just learned. What is new
    // here, and every reply (another lane may have asked), goes to the other lanes when `share`.
    void learn(Lane& l, uint32_t ip, const Mac& mac, bool create, bool reply, bool share = true) noexcept {
        if (ip == 0) { return; }  // an ARP probe says nothing about the sender
        auto it = l.arp.find(ip);
        bool news = false;
        if (it == l.arp.end()) {
            if (create && arpRoom(l)) {
                try {
                    it = l.arp.emplace(ip, ArpEntry{}).first;
                    it->second.state = ArpEntry::State::kFailed;  // not waited on: nothing to flush below
                    news = true;
                } catch (...) {
                    // no memory: the peer will be asked when we need it
                }
            }
        }
        if (it != l.arp.end()) {
            ArpEntry& e = it->second;
            news = news || e.state != ArpEntry::State::kReachable || e.mac != mac;
            if (e.state != ArpEntry::State::kReachable) { ownerAdd(l.counters.arpResolved); }
            const bool wasResolving = e.state == ArpEntry::State::kResolving;
            e.mac = mac;
            e.state = ArpEntry::State::kReachable;
            e.untilNs = coarseNowNs() + ns(options.arpLifetime);
            if (wasResolving) { flush(l, ip, e); }
        }
        if (share && (news || reply) && lanes.size() > 1) { tellOthers(l, Learned{ip, mac, create}); }
    }

    // Sends the datagrams that waited for `e`'s MAC. On the poller, which must not wait: what the
    // ring refuses now is dropped.
    void flush(Lane& l, uint32_t ip, ArpEntry& e) noexcept {
        forgetResolving(l, ip);
        const size_t n = e.pending.size();
        l.pendingTotal -= n;
        for (rte_mbuf* m : e.pending) { std::memcpy(frameOf(m), e.mac.data(), e.mac.size()); }
        size_t sent = 0;
        while (sent < n) {
            const auto chunk = static_cast<uint16_t>(std::min<size_t>(n - sent, Port::kBurst));
            const uint16_t k = port->transmit(l.queue, e.pending.data() + sent, chunk);
            sent += k;
            if (k < chunk) { break; }
        }
        ownerAdd(l.counters.udpSent, sent);
        dropPending(l, e.pending.data() + sent, n - sent);
        e.pending.clear();
        e.pending.shrink_to_fit();
    }

    void tellOthers(const Lane& from, const Learned& what) noexcept {
        for (const auto& other : lanes) {
            if (other.get() == &from || other->carrier.load(std::memory_order_acquire) < 0) { continue; }
            std::lock_guard<SpinLock> g(other->mailLock);
            if (other->mail.size() >= kMailLimit) { continue; }
            try {
                other->mail.push_back(what);
            } catch (...) {
                continue;
            }
            other->hasMail.store(true, std::memory_order_release);
        }
    }

    void readMail(Lane& l) noexcept {
        std::vector<Learned> got;
        {
            std::lock_guard<SpinLock> g(l.mailLock);
            l.hasMail.store(false, std::memory_order_relaxed);
            got.swap(l.mail);
        }
        for (const Learned& m : got) { learn(l, m.ip, m.mac, m.create, /*reply=*/false, /*share=*/false); }
    }

    // ---- the ARP timer: mail, retries and give-ups, on the lane's carrier -------------------------

    static bool pollArp(Poller* p) noexcept {
        Lane& l = *static_cast<ArpTimer*>(p)->lane;
        bool worked = false;
        if (l.hasMail.load(std::memory_order_acquire)) [[unlikely]] {
            l.im->readMail(l);
            worked = true;
        }
        if (l.resolving.empty()) { return worked; }
        const uint64_t now = coarseNowNs();
        if (now < l.nextDueNs) { return worked; }
        l.im->runArpTimer(l, now);
        return true;
    }
    // A carrier whose other pollers let it park must still wake for the next retry.
    static bool arpMayPark(Poller* p) noexcept {
        const Lane& l = *static_cast<ArpTimer*>(p)->lane;
        return l.resolving.empty() && !l.hasMail.load(std::memory_order_acquire);
    }
    static void arpDetached(Poller* p) noexcept { static_cast<ArpTimer*>(p)->live = false; }

    void runArpTimer(Lane& l, uint64_t now) noexcept {
        l.nextDueNs = UINT64_MAX;
        for (size_t i = 0; i < l.resolving.size();) {
            const uint32_t ip = l.resolving[i];
            ArpEntry& e = l.arp.find(ip)->second;  // a resolving peer is never pruned
            if (now >= e.untilNs) {
                if (e.attempts >= options.arpAttempts) {
                    giveUp(l, e, now);
                    l.resolving[i] = l.resolving.back();
                    l.resolving.pop_back();
                    continue;
                }
                ++e.attempts;
                e.untilNs = now + ns(options.arpTimeout);
                (void)sendArpRequest(l, ip);  // a lost request is one retry fewer
            }
            l.nextDueNs = std::min(l.nextDueNs, e.untilNs);
            ++i;
        }
    }

    // No answer after the last retry: the waiting datagrams are dropped and, for the hold-down,
    // sends to the peer fail with EHOSTUNREACH instead of asking again.
    void giveUp(Lane& l, ArpEntry& e, uint64_t now) noexcept {
        l.pendingTotal -= e.pending.size();
        dropPending(l, e.pending.data(), e.pending.size());
        ownerAdd(l.counters.arpFailed);  // counted once its datagrams are
        e.pending.clear();
        e.pending.shrink_to_fit();
        e.state = ArpEntry::State::kFailed;
        e.untilNs = now + ns(options.arpHoldDown);
    }

    // ---- send: on a lane's carrier, from a fiber pinned there ------------------------------------

    bool sendArpRequest(Lane& l, uint32_t ip) noexcept {
        rte_mbuf* m = nullptr;
        if (!allocPackets(port->pool(l.queue), &m, 1)) {
            QueueStats d;
            d.noMbuf = 1;
            port->count(l.queue, d);
            return false;
        }
        char* data = rte_pktmbuf_append(m, kEthernetHeader + kArpPacket);
        (void)buildArpRequest({reinterpret_cast<uint8_t*>(data), kEthernetHeader + kArpPacket}, self, ip);
        if (port->transmit(l.queue, &m, 1) != 1) {
            freePackets(&m, 1);
            return false;
        }
        ownerAdd(l.counters.arpRequestsSent);
        return true;
    }

    // The entry of next hop `ip` for a send: reachable (send to its MAC) or resolving (queue on it);
    // a peer not asked yet, or whose entry expired, is asked now. Errors: EHOSTUNREACH in the
    // hold-down after a failed resolution; ENOBUFS when the cache has no room or no memory.
    Result<ArpEntry*> neighbour(Lane& l, uint32_t ip, uint64_t now) noexcept {
        auto it = l.arp.find(ip);
        if (it == l.arp.end()) {
            if (!arpRoom(l)) { return Error{ENOBUFS}; }  // as many peers resolving or fresh as the cache holds
            try {
                it = l.arp.emplace(ip, ArpEntry{}).first;
            } catch (...) {
                return Error{ENOBUFS};
            }
            it->second.state = ArpEntry::State::kFailed;  // untilNs 0: asked below
        }
        ArpEntry& e = it->second;
        switch (e.state) {
            case ArpEntry::State::kResolving:
                return &e;
            case ArpEntry::State::kReachable:
                if (now < e.untilNs) { return &e; }
                break;  // expired: ask again, and send nothing to a MAC that may be stale
            case ArpEntry::State::kFailed:
                if (now < e.untilNs) { return Error{EHOSTUNREACH}; }
                break;
        }
        try {
            l.resolving.push_back(ip);
        } catch (...) {
            return Error{ENOBUFS};
        }
        e.state = ArpEntry::State::kResolving;
        e.attempts = 1;
        e.untilNs = now + ns(options.arpTimeout);
        l.nextDueNs = std::min(l.nextDueNs, e.untilNs);
        (void)sendArpRequest(l, ip);
        return &e;
    }

    // Holds `m` until `e` resolves: the oldest datagram of a full queue is dropped for it (as
    // Linux's neighbour queue does). False (`m` still the caller's) when the lane's queues together
    // hold arpQueueTotal datagrams, or on no memory.
    bool hold(Lane& l, ArpEntry& e, rte_mbuf* m) noexcept {
        if (e.pending.size() >= options.arpQueue) {
            dropPending(l, e.pending.data(), 1);
            e.pending.erase(e.pending.begin());
            --l.pendingTotal;
        }
        if (l.pendingTotal >= options.arpQueueTotal) { return false; }
        try {
            e.pending.push_back(m);
        } catch (...) {
            return false;
        }
        ++l.pendingTotal;
        ownerAdd(l.counters.arpQueued);
        return true;
    }

    // Asks the device for the checksums buildUdpHeaders() left to it.
    void flagChecksums(rte_mbuf* m) const noexcept {
        if (txChecksum != UdpChecksum::kOffload) { return; }
        m->ol_flags |= RTE_MBUF_F_TX_IPV4 | RTE_MBUF_F_TX_IP_CKSUM | RTE_MBUF_F_TX_UDP_CKSUM;
        m->l2_len = kEthernetHeader;
        m->l3_len = kIpv4Header;
    }

    // sendBurst() on lane `l`'s carrier: headers for every datagram; those whose peer is known go in
    // one transmit, those whose peer is being resolved wait in its queue; what cannot go is freed.
    // Returns how many were sent or queued.
    Result<size_t> sendBurstOn(Lane& l, uint16_t srcPort, rte_mbuf** mbufs, const Endpoint* to, size_t n) noexcept {
        const uint64_t now = coarseNowNs();
        size_t ready = 0;   // mbufs[0, ready): addressed, for the transmit below
        size_t queued = 0;
        size_t i = 0;
        int error = 0;
        for (; i < n; ++i) {
            rte_mbuf* m = mbufs[i];
            const size_t frame = rte_pktmbuf_data_len(m);
            if (m->nb_segs != 1 || frame < kUdpFrameHeaders || to[i].ip == 0 || to[i].port == 0) {
                error = EINVAL;
                break;
            }
            uint32_t nextHop = to[i].ip;
            if ((nextHop & mask) != (self.ip & mask)) {
                if (options.gateway == 0) {
                    error = ENETUNREACH;
                    break;
                }
                nextHop = options.gateway;
            }
            auto peer = neighbour(l, nextHop, now);
            if (!peer) {
                error = peer.errorCode();
                break;
            }
            ArpEntry& e = **peer;
            const bool known = e.state == ArpEntry::State::kReachable;
            // A queued datagram gets its MAC when the reply comes (flush()).
            (void)buildUdpHeaders({frameOf(m), frame}, self, known ? e.mac : Mac{}, to[i].ip, srcPort, to[i].port,
                                  frame - kUdpFrameHeaders, l.ipId++, txChecksum);
            flagChecksums(m);
            if (known) {
                mbufs[ready++] = m;
            } else if (hold(l, e, m)) {
                ++queued;
            } else {
                error = ENOBUFS;
                break;
            }
        }
        if (i < n) { freePackets(mbufs + i, static_cast<unsigned>(n - i)); }
        size_t sent = 0;
        for (size_t done = 0; done < ready;) {  // each chunk is sent, or freed and counted, by transmitAll
            const auto chunk = static_cast<uint16_t>(std::min<size_t>(ready - done, 32768));
            sent += port->transmitAll(l.queue, mbufs + done, chunk, 1024);
            done += chunk;
        }
        ownerAdd(l.counters.udpSent, sent);
        if (sent + queued == 0 && error != 0) { return Error{error}; }
        if (sent + queued == 0 && ready > 0) { return Error{ENOBUFS}; }
        return sent + queued;
    }

    // ---- sockets, start and stop --------------------------------------------------------------------

    // Takes `s` out of the interface's table and the lanes' copies. Under bindLock.
    void unbindLocked(const UdpSocket::State& s) noexcept {
        const auto [first, last] = bound.equal_range(s.port);
        for (auto it = first; it != last; ++it) {
            if (it->second == &s) {
                bound.erase(it);
                break;
            }
        }
        for (auto& l : lanes) {
            std::lock_guard<SpinLock> ls(l->socketsLock);
            const auto it = l->sockets.find(s.port);
            if (it != l->sockets.end() && it->second == &s) { l->sockets.erase(it); }
        }
    }

    // On the lane's carrier: the port's poller and the ARP timer both go.
    Result<void> stopLane(Lane& l) noexcept {
        const int was = l.carrier.exchange(-1, std::memory_order_acq_rel);
        // Not polled any more: never started, stopped already, or its carrier left with the runtime.
        if (port->polled(l.queue)) {
            if (auto r = port->stopPolling(l.queue); !r) {
                l.carrier.store(was, std::memory_order_release);  // still running: undo the mark
                return r;
            }
        }
        if (l.timer.live) {
            (void)removePoller(&l.timer);
            l.timer.live = false;
        }
        return {};
    }

    // Frees every datagram still waiting for ARP, and the mail. On the lane's carrier, or anywhere
    // once it has stopped.
    void dropAllPending(Lane& l) noexcept {
        for (auto& [ip, e] : l.arp) {
            dropPending(l, e.pending.data(), e.pending.size());
            e.pending.clear();
            if (e.state == ArpEntry::State::kResolving) { e.state = ArpEntry::State::kFailed; }
        }
        l.resolving.clear();
        l.pendingTotal = 0;
        l.nextDueNs = UINT64_MAX;
        std::lock_guard<SpinLock> g(l.mailLock);
        l.mail.clear();
        l.hasMail.store(false, std::memory_order_relaxed);
    }

    ~Impl() {
        for (auto& l : lanes) {
            for (auto& [ip, e] : l->arp) { freePackets(e.pending.data(), static_cast<unsigned>(e.pending.size())); }
        }
    }
};

Interface::Interface(std::unique_ptr<Impl> impl) noexcept : impl_(std::move(impl)) {}

Interface::~Interface() = default;

Result<std::unique_ptr<Interface>> Interface::create(Port& port, unsigned queue, const InterfaceOptions& o) noexcept {
    const unsigned one[] = {queue};
    return create(port, std::span<const unsigned>(one), o);
}

Result<std::unique_ptr<Interface>> Interface::create(Port& port, std::span<const unsigned> queues,
                                                     const InterfaceOptions& o) noexcept {
    if (!port.isOpen() || queues.empty() || o.ip == 0 || o.prefixLength > 32 || o.arpAttempts == 0 ||
        o.socketQueue == 0 || o.arpQueue == 0) {
        return Error{EINVAL};
    }
    for (size_t i = 0; i < queues.size(); ++i) {
        if (queues[i] >= port.queues()) { return Error{EINVAL}; }
        for (size_t j = 0; j < i; ++j) {
            if (queues[j] == queues[i]) { return Error{EINVAL}; }
        }
    }
    std::unique_ptr<Impl> impl(new (std::nothrow) Impl);
    if (!impl) { return Error{ENOMEM}; }
    impl->port = &port;
    impl->options = o;
    impl->self = InterfaceAddress{port.mac(), o.ip};
    impl->mask = maskOf(o.prefixLength);
    impl->mtu = port.mtu();
    impl->txChecksum = !o.udpChecksum ? UdpChecksum::kNone
                       : port.txChecksumOffload() ? UdpChecksum::kOffload
                                                  : UdpChecksum::kCompute;
    impl->rxChecksum = port.rxChecksumOffload();
    try {
        for (const unsigned q : queues) {
            auto lane = std::make_unique<Impl::Lane>();
            lane->im = impl.get();
            lane->queue = q;
            lane->timer.poll = &Impl::pollArp;
            lane->timer.mayPark = &Impl::arpMayPark;
            lane->timer.detached = &Impl::arpDetached;
            lane->timer.lane = lane.get();
            impl->lanes.push_back(std::move(lane));
            impl->queues.push_back(q);
        }
    } catch (...) {
        return Error{ENOMEM};
    }
    std::unique_ptr<Interface> iface(new (std::nothrow) Interface(std::move(impl)));
    if (!iface) { return Error{ENOMEM}; }
    return iface;
}

Result<void> Interface::start() noexcept {
    if (impl_->lanes.size() != 1) { return Error{EINVAL}; }
    return start(impl_->lanes[0]->queue);
}

Result<void> Interface::start(unsigned queue) noexcept {
    Impl& im = *impl_;
    Impl::Lane* lane = nullptr;
    for (auto& l : im.lanes) {
        if (l->queue == queue) { lane = l.get(); }
    }
    if (lane == nullptr) { return Error{EINVAL}; }
    if (!this_fiber::inFiber()) { return Error{EPERM}; }
    const int here = this_fiber::carrierIndex();
    for (auto& l : im.lanes) {
        if (l.get() != lane && l->live() == here) { return Error{EBUSY}; }  // one lane per carrier
    }
    // The lane gets the sockets bound so far (a lane started after bind() must find them).
    {
        std::lock_guard<SpinLock> g(im.bindLock);
        std::lock_guard<SpinLock> s(lane->socketsLock);
        try {
            lane->sockets.clear();
            for (const auto& [port, st] : im.bound) {
                if (st->queue < 0 || static_cast<unsigned>(st->queue) == queue) { lane->sockets.emplace(port, st); }
            }
        } catch (...) {
            return Error{ENOMEM};
        }
    }
    if (auto r = im.port->startPolling(queue, &Impl::onBurst, lane); !r) { return r; }
    if (auto r = addPoller(&lane->timer); !r) {
        (void)im.port->stopPolling(queue);
        return Error{r.errorCode()};
    }
    lane->timer.live = true;
    std::lock_guard<SpinLock> g(im.bindLock);
    im.stopping = false;
    lane->carrier.store(here, std::memory_order_release);
    return {};
}

Result<void> Interface::stop() noexcept {
    Impl& im = *impl_;
    {
        // Marked stopping in the same step that finds no socket: a bind() after it gets EBADF.
        std::lock_guard<SpinLock> g(im.bindLock);
        if (!im.bound.empty()) { return Error{EBUSY}; }
        im.stopping = true;
    }
    for (auto& l : im.lanes) {
        const int c = l->live();
        if (c < 0) {
            // Not running: stopped, never started, or its carrier left with the runtime's shutdown.
            l->carrier.store(-1, std::memory_order_release);
            l->timer.live = false;
        } else if (this_fiber::inFiber() && this_fiber::pinned() && this_fiber::carrierIndex() == c) {
            if (auto r = im.stopLane(*l); !r) { return r; }
        } else {
            // The lane stops on its own carrier, reached from a fiber.
            if (!this_fiber::inFiber()) { return Error{EPERM}; }
            Impl::Lane* lane = l.get();
            auto f = spindle::spawn([&im, lane]() noexcept -> Result<void> { return im.stopLane(*lane); },
                                    SpawnOptions{.name = "dpdk-stop", .carrier = c, .pinned = true});
            if (!f) { return Error{f.errorCode()}; }
            if (auto r = f->join(); !r) { return r; }
        }
        im.dropAllPending(*l);
    }
    return {};
}

const InterfaceAddress& Interface::address() const noexcept { return impl_->self; }
std::span<const unsigned> Interface::queues() const noexcept { return impl_->queues; }

int Interface::carrier() const noexcept { return impl_->lanes[0]->live(); }

int Interface::carrier(unsigned queue) const noexcept {
    for (const auto& l : impl_->lanes) {
        if (l->queue == queue) { return l->live(); }
    }
    return -1;
}

InterfaceStats Interface::stats() const noexcept {
    InterfaceStats s;
    const auto add = [](uint64_t& to, const std::atomic<uint64_t>& c) { to += c.load(std::memory_order_relaxed); };
    for (const auto& l : impl_->lanes) {
        const Impl::Counters& c = l->counters;
        for (size_t i = 0; i < static_cast<size_t>(DropReason::kCount); ++i) { add(s.drops[i], c.drops[i]); }
        add(s.arpRequestsAnswered, c.arpRequestsAnswered);
        add(s.arpRequestsSent, c.arpRequestsSent);
        add(s.arpResolved, c.arpResolved);
        add(s.arpFailed, c.arpFailed);
        add(s.echoReplies, c.echoReplies);
        add(s.udpReceived, c.udpReceived);
        add(s.udpSent, c.udpSent);
        add(s.udpNoSocket, c.udpNoSocket);
        add(s.udpQueueFull, c.udpQueueFull);
        add(s.multiSegment, c.multiSegment);
        add(s.arpQueued, c.arpQueued);
        add(s.arpQueueDropped, c.arpQueueDropped);
    }
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

Result<UdpSocket> UdpSocket::bind(Interface& iface, uint16_t port, int queue) noexcept {
    Interface::Impl& im = *iface.impl_;
    if (queue >= 0) {
        bool ours = false;
        for (const auto& l : im.lanes) { ours = ours || l->queue == static_cast<unsigned>(queue); }
        if (!ours) { return Error{EINVAL}; }
    }
    std::unique_ptr<State> s(new (std::nothrow) State);
    if (!s) { return Error{ENOMEM}; }
    s->iface = &im;
    s->queue = queue < 0 ? -1 : queue;
    try {
        s->ring.resize(im.options.socketQueue);
    } catch (...) {
        return Error{ENOMEM};
    }
    // Whether `p` can take this socket: free, or held only by sockets of other single queues.
    const auto fits = [&](uint16_t p) {
        const auto [first, last] = im.bound.equal_range(p);
        for (auto it = first; it != last; ++it) {
            if (s->queue < 0 || it->second->queue < 0 || it->second->queue == s->queue) { return false; }
        }
        return true;
    };
    std::lock_guard<SpinLock> g(im.bindLock);
    if (im.stopping || im.anyLiveLane() == nullptr) { return Error{EBADF}; }
    if (port == 0) {
        for (unsigned tries = 0; tries < 16384; ++tries) {
            const uint16_t p = im.nextPort;
            im.nextPort = p == 65535 ? 49152 : static_cast<uint16_t>(p + 1);
            if (im.bound.count(p) == 0) {
                port = p;
                break;
            }
        }
        if (port == 0) { return Error{EADDRINUSE}; }
    } else if (!fits(port)) {
        return Error{EADDRINUSE};
    }
    s->port = port;
    // Into the interface's table and the copies of the lanes it hears, or into none.
    const auto hears = [&](const Interface::Impl::Lane& l) {
        return s->queue < 0 || l.queue == static_cast<unsigned>(s->queue);
    };
    size_t added = 0;
    try {
        im.bound.emplace(port, s.get());
        for (; added < im.lanes.size(); ++added) {
            Interface::Impl::Lane& l = *im.lanes[added];
            if (!hears(l)) { continue; }
            std::lock_guard<SpinLock> ls(l.socketsLock);
            l.sockets.emplace(port, s.get());
        }
    } catch (...) {
        s->iface->unbindLocked(*s);
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
        std::lock_guard<SpinLock> g(s.iface->bindLock);
        s.iface->unbindLocked(s);
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
        std::chrono::nanoseconds left = FiberFuture::kNoTimeout;  // cancellable, but no timer comes due
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
            if (mine) { return Error{-r}; }
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
    // From the pool of the caller's lane (its node's), else the first queue's.
    const Interface::Impl::Lane* here = im.laneHere();
    const unsigned queue = here != nullptr ? here->queue : im.lanes[0]->queue;
    if (!allocPackets(im.port->pool(queue), &m, 1)) {
        QueueStats d;
        d.noMbuf = 1;
        im.port->count(queue, d);
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

Result<size_t> UdpSocket::sendBurst(rte_mbuf** mbufs, const Endpoint* to, size_t n) noexcept {
    if (!isOpen()) {
        freePackets(mbufs, static_cast<unsigned>(n));
        return Error{EBADF};
    }
    Interface::Impl& im = *state_->iface;
    const uint16_t port = state_->port;
    if (Interface::Impl::Lane* here = im.laneHere()) { return im.sendBurstOn(*here, port, mbufs, to, n); }
    // Not on a lane's carrier: the send runs on one, on a fiber pinned there.
    Interface::Impl::Lane* lane = im.anyLiveLane();
    if (lane == nullptr || !this_fiber::inFiber()) {
        freePackets(mbufs, static_cast<unsigned>(n));
        return Error{lane == nullptr ? ENETDOWN : EPERM};
    }
    auto f = spindle::spawn([&]() noexcept -> Result<size_t> { return im.sendBurstOn(*lane, port, mbufs, to, n); },
                            SpawnOptions{.name = "dpdk-send", .carrier = lane->live(), .pinned = true});
    if (!f) {
        freePackets(mbufs, static_cast<unsigned>(n));
        return Error{f.errorCode()};
    }
    return f->join();
}

Result<size_t> UdpSocket::sendTo(const void* buf, size_t len, const Endpoint& to) noexcept {
    if (!isOpen()) { return Error{EBADF}; }
    if (to.ip == 0 || to.port == 0) { return Error{EINVAL}; }
    if (this_fiber::cancellationRequested()) { return Error{ECANCELED}; }
    // A burst of one: the payload copied into a fresh mbuf, which sendBurst() takes whatever happens.
    uint8_t* payload = nullptr;
    auto m = allocDatagram(len, &payload);
    if (!m) { return Error{m.errorCode()}; }
    std::memcpy(payload, buf, len);
    rte_mbuf* one = *m;
    auto sent = sendBurst(&one, &to, 1);
    if (!sent) { return Error{sent.errorCode()}; }
    return len;
}

}  // namespace spindle::dpdk
