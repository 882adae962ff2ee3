// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Interface and UdpSocket: spindle's small IPv4/UDP stack on the queues of a DPDK Port.
///
/// An Interface gives one or more queues of a port an IPv4 address; each queue is polled by its
/// own carrier (a lane), which runs the stack for each burst it receives (RSS, or the peer's
/// choice of queue, decides which lane sees a frame): it answers ARP requests for the address and learns from ARP replies,
/// answers ICMP echo requests (so `ping` works), hands UDP datagrams to the socket bound to their
/// port, and drops everything else with a reason, counted (stats(); the port's queue counters get
/// bad checksums, frames not for us, and drops). It keeps an ARP cache (entries expire) and routes
/// off-subnet destinations to the gateway. Each lane keeps its own copy of the cache and of the
/// socket table, so a burst touches no other carrier's lines: what a lane learns from an ARP
/// reply, or newly, it posts to the other lanes' mailboxes, which their ARP pollers read.
///
/// ARP, as a send sees it: the first datagram to a peer not in the cache sends a broadcast request
/// and waits, with the ones after it, in the peer's queue (arpQueue datagrams; a full queue drops
/// its oldest, as Linux's does; arpQueueTotal for all peers together). The sender does not wait:
/// the datagram counts as sent. The reply sends the queue. A timer on the interface's carrier (a
/// Poller with work only while peers resolve) repeats the request every arpTimeout; after
/// arpAttempts requests without an answer the queue is dropped (arpQueueDropped) and, for
/// arpHoldDown, sends to that peer fail with EHOSTUNREACH instead of asking again (as BSD's
/// arpt_down). An entry expires after arpLifetime; the next send asks again.
///
/// A UdpSocket is bound to a port of an interface. recvFrom() parks the fiber on a FiberFuture that
/// the polling carrier sets when a datagram arrives, with a deadline and cancellation as every
/// spindle call; datagrams from every lane land in the one socket. sendTo() builds the frame in an
/// mbuf and transmits it; it never waits for ARP, only, briefly, for room in a full TX ring
/// (yielding). The fast path is a fiber pinned on a lane's carrier: it transmits on that lane's
/// queue directly. From anywhere else sendTo() runs the send on a pinned fiber of a running
/// lane's carrier and joins it: correct, and some microseconds dearer.
///
/// Errors (sendTo): EMSGSIZE above the MTU's payload (MTU - 28), EHOSTUNREACH in the hold-down after
/// ARP got no answer, ENETUNREACH for an off-subnet destination without a gateway, ENOBUFS when no
/// mbuf could be had, the device's ring stayed full, the ARP queues are full or the cache has no
/// room for another peer, EINVAL for address or port 0, ENETDOWN when the interface is stopped (or
/// its carrier gone with the runtime), EBADF after close(), ECANCELED when the calling fiber's
/// cancellation was requested before the call. (recvFrom): EBADF after close() (a receiver parked
/// then gets ECANCELED), ETIMEDOUT, ECANCELED. bind(): EADDRINUSE (the port held by a socket of
/// every queue, or of the same queue), EBADF for a stopped interface. A datagram larger than the
/// receive buffer is cut to it (the rest is lost, as with recvfrom(2)); the full length is
/// returned through `truncated`.
/// Thread-safety: one fiber receiving and one sending per socket at a time, from any carrier (a
/// receive also from a plain thread; a send off the interface's carrier needs a fiber: EPERM);
/// bind() and close() from anywhere. close() wakes a receiver parked in recvFrom() (ECANCELED)
/// and waits for it to leave; it must not race with a sendTo() in progress.
/// Lifetime: stop() the interface after every socket is closed and before the port is closed.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "base/result.h"
#include "core/deadline.h"
#include "net/dpdk/packet.h"
#include "net/dpdk/port.h"

namespace spindle::dpdk {

struct InterfaceOptions {
    uint32_t ip = 0;                 // network byte order; required
    unsigned prefixLength = 24;      // of the subnet reached without the gateway
    uint32_t gateway = 0;            // network byte order; 0: none
    std::chrono::milliseconds arpTimeout{200};      // between ARP requests for one peer
    unsigned arpAttempts = 3;                       // requests before the peer is given up
    std::chrono::seconds arpLifetime{300};          // of a learned entry
    std::chrono::milliseconds arpHoldDown{1000};    // after giving up: sends to the peer get EHOSTUNREACH
    unsigned arpQueue = 64;          // datagrams held per peer being resolved (a full queue drops its oldest)
    unsigned arpQueueTotal = 1024;   // datagrams held for all peers being resolved (beyond: ENOBUFS)
    unsigned socketQueue = 1024;     // datagrams queued per socket before arrivals are dropped
    bool udpChecksum = true;         // compute outgoing UDP checksums (else 0, "none")
};

struct InterfaceStats {
    uint64_t drops[static_cast<size_t>(DropReason::kCount)] = {};  // by reason (kNone: unused)
    uint64_t arpRequestsAnswered = 0;
    uint64_t arpRequestsSent = 0;
    uint64_t arpResolved = 0;
    uint64_t arpFailed = 0;
    uint64_t echoReplies = 0;
    uint64_t udpReceived = 0;
    uint64_t udpSent = 0;
    uint64_t udpNoSocket = 0;     // datagrams to a port nobody bound
    uint64_t udpQueueFull = 0;    // datagrams dropped because their socket's queue was full
    uint64_t multiSegment = 0;    // frames in chained mbufs (not handled; dropped)
    uint64_t arpQueued = 0;       // datagrams that waited for their peer's ARP reply
    uint64_t arpQueueDropped = 0; // of those, dropped: no answer, a full queue, or the interface stopped
};

class UdpSocket;

class Interface {
public:
    /// An interface on `port`'s queue `queue` (the port must outlive it). Not polled until start().
    /// Errors: EINVAL for a queue out of range, an address 0 or a prefix over 32.
    [[nodiscard]] static Result<std::unique_ptr<Interface>> create(Port& port, unsigned queue,
                                                                   const InterfaceOptions& options) noexcept;
    /// An interface on several queues of `port`, each run by its own carrier (start(queue) there).
    /// Errors: as above; EINVAL for no queue or one named twice.
    [[nodiscard]] static Result<std::unique_ptr<Interface>> create(Port& port, std::span<const unsigned> queues,
                                                                   const InterfaceOptions& options) noexcept;
    ~Interface();
    Interface(const Interface&) = delete;
    Interface& operator=(const Interface&) = delete;

    /// From a fiber pinned on the carrier that is to run it: starts polling the interface's queue
    /// `queue` (start(): its only queue). Errors: EINVAL for a queue not the interface's (start():
    /// an interface of several queues), EBUSY when this carrier runs another queue of the interface
    /// (one per carrier) or the queue is polled already, as Port::startPolling().
    [[nodiscard]] Result<void> start(unsigned queue) noexcept;
    [[nodiscard]] Result<void> start() noexcept;
    /// Stops every queue, each on its own carrier (inline when the caller is a fiber pinned there,
    /// else on a fiber spawned there and joined), from any fiber; datagrams waiting for ARP are
    /// dropped. Queues whose carrier left with the runtime's shutdown need nothing more, so after
    /// it any thread may call this. Errors: EBUSY while sockets are bound; EPERM from a plain
    /// thread while a queue runs; as Port::stopPolling() and spawn().
    [[nodiscard]] Result<void> stop() noexcept;

    [[nodiscard]] const InterfaceAddress& address() const noexcept;
    /// The port's queues the interface runs on, as given to create().
    [[nodiscard]] std::span<const unsigned> queues() const noexcept;
    /// The carrier running the interface's first queue (carrier(queue): that queue), or -1 when it
    /// does not run.
    [[nodiscard]] int carrier() const noexcept;
    [[nodiscard]] int carrier(unsigned queue) const noexcept;
    [[nodiscard]] InterfaceStats stats() const noexcept;

private:
    friend class UdpSocket;
    struct Impl;
    explicit Interface(std::unique_ptr<Impl> impl) noexcept;
    std::unique_ptr<Impl> impl_;
};

/// An IPv4 address (network order) and a port (host order).
struct Endpoint {
    uint32_t ip = 0;
    uint16_t port = 0;
    bool operator==(const Endpoint&) const = default;
};

/// A received datagram in place (UdpSocket::recvBurst): `length` payload bytes at `data`, inside `mbuf`.
struct DatagramView {
    rte_mbuf* mbuf = nullptr;
    uint8_t* data = nullptr;
    uint16_t length = 0;
    Endpoint from;
};

class UdpSocket {
public:
    UdpSocket() noexcept;
    ~UdpSocket();
    UdpSocket(UdpSocket&&) noexcept;
    UdpSocket& operator=(UdpSocket&&) noexcept;
    UdpSocket(const UdpSocket&) = delete;
    UdpSocket& operator=(const UdpSocket&) = delete;

    /// A socket on `port` of `iface` (0: a free port from 49152 up) that hears the datagrams of
    /// every queue of the interface, or with `queue` >= 0 only those that arrive on that queue:
    /// sockets of distinct queues may share a port, one per carrier, the device's RSS (or the
    /// peer's choice of queue) spreading the flows among them, as SO_REUSEPORT does for the kernel.
    /// Errors: file comment; EINVAL for a queue not the interface's.
    [[nodiscard]] static Result<UdpSocket> bind(Interface& iface, uint16_t port, int queue = -1) noexcept;

    /// The next datagram's payload into `buf` (cut to `len`); its sender into `*from`, its full
    /// length into `*truncated` when given. Errors: file comment.
    [[nodiscard]] Result<size_t> recvFrom(void* buf, size_t len, Endpoint* from, Deadline deadline = {},
                                          size_t* fullLength = nullptr) noexcept;
    /// One datagram of `len` bytes to `to`: sent, or queued for its peer's ARP reply. Errors: file comment.
    [[nodiscard]] Result<size_t> sendTo(const void* buf, size_t len, const Endpoint& to) noexcept;

    // ---- zero copy: datagrams that stay in their mbufs ----

    /// Up to `n` queued datagrams, without copying: each view's payload lies in its mbuf, which the
    /// caller now owns and gives back with freePackets() (or hands to sendBurst() after
    /// prepareReply()). Waits for the first datagram as recvFrom() does; returns how many it took.
    /// Errors: as recvFrom().
    [[nodiscard]] Result<size_t> recvBurst(DatagramView* out, size_t n, Deadline deadline = {}) noexcept;
    /// An mbuf for a `length`-byte datagram from this socket's interface pool; its payload area
    /// (`*payload`) is the caller's to fill before sendBurst(). Errors: EMSGSIZE above the MTU's
    /// payload, ENOBUFS when the pool is empty, EBADF after close().
    [[nodiscard]] Result<rte_mbuf*> allocDatagram(size_t length, uint8_t** payload) noexcept;
    /// Turns a received datagram's mbuf into one ready for sendBurst() with the same payload (an
    /// echo without a copy): the payload moves to where sendBurst() expects it when the request had
    /// IP options. Errors: EINVAL for a view not from recvBurst().
    [[nodiscard]] Result<void> prepareReply(const DatagramView& view) noexcept;
    /// Sends `n` datagrams from mbufs made by allocDatagram() or prepareReply(), `mbufs[i]` to
    /// `to[i]`, in one transmit for those whose peers are known (the others wait in their peers' ARP
    /// queues); takes every mbuf whatever happens (an unsent one is freed and counted). Returns how
    /// many were sent or queued. Errors: as sendTo(), for the first datagram that could not go (those
    /// after it are freed unsent), when none went.
    [[nodiscard]] Result<size_t> sendBurst(rte_mbuf** mbufs, const Endpoint* to, size_t n) noexcept;

    /// Unbinds; a receiver parked in recvFrom() gets ECANCELED, queued datagrams are freed.
    /// Errors: EBADF when not bound.
    [[nodiscard]] Result<void> close() noexcept;
    [[nodiscard]] uint16_t localPort() const noexcept;
    [[nodiscard]] bool isOpen() const noexcept;

    struct State;

private:
    explicit UdpSocket(std::unique_ptr<State> s) noexcept;
    std::unique_ptr<State> state_;
};

}  // namespace spindle::dpdk
