// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Port: one DPDK Ethernet port, its RX/TX queue pairs polled by spindle's carriers.
///
/// Open a port by vdev string ("net_tap0,iface=sp0", "net_ring0", "net_null0") or PCI address
/// ("0000:00:04.0"), or attach a port that DPDK already has (rte_eth_from_rings, EAL's --vdev). The
/// port is configured with `queues` RX/TX pairs (RSS across them when the device offers it), one
/// mbuf pool, and started. Each queue is polled by one carrier: startPolling(), called from a fiber
/// pinned on that carrier, registers the carrier's thread with DPDK and a Poller (core/poller.h)
/// that receives a burst on every turn of the carrier's loop and hands it to the queue's handler.
/// A carrier that polls a queue does not park (the carriers' poll mode decides nothing here: the
/// ports spindle opens have no Rx interrupts), so packets never wait for a wake-up.
///
/// Errors: open() and attach() return ENXIO when EAL is not running, ENODEV for a device no driver
/// takes (and writes the reason to `*why`), EEXIST for a vdev name in use, EINVAL for options the
/// device refuses (descriptor counts, MTU, queue count 0), ENOMEM when the mbuf pool cannot be had,
/// and DPDK's errno from configuration and start. Nothing is left behind by a failed open.
/// Thread-safety: a queue's receive (its poller) and transmit() run on one thread at a time, the
/// carrier polling it (or, for a queue nobody polls, the caller's thread). stats() from anywhere.
/// Lifetime: stopPolling() every polled queue, then close() (or destroy), before stopEal(). A runtime
/// that shuts down first ends the polling itself (its carriers detach their pollers on the way out),
/// and the port can then be closed from any thread.

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"

struct rte_mbuf;
struct rte_mempool;

namespace spindle::dpdk {

struct PortOptions {
    unsigned queues = 1;            // RX/TX queue pairs wanted; fewer when the device has fewer
    uint16_t rxDescriptors = 512;   // per RX queue
    uint16_t txDescriptors = 512;   // per TX queue
    unsigned mbufs = 0;             // in each of the port's pools; 0: enough for their queues' descriptors twice over
    // The NUMA node (DPDK socket id) of the carrier that will poll each queue, for the queue's mbuf
    // pool and descriptor rings (Runtime::stats()[carrier].memoryNode); missing or -1: the device's
    // node. Queues on one node share a pool. A node without memory falls back to any node.
    std::vector<int> queueNodes;
    uint16_t mtu = 0;               // 0: the device's default
    bool promiscuous = false;
    bool checksumOffload = true;    // use the device's IPv4/UDP checksum offloads where it has both
};

struct LinkStatus {
    bool up = false;
    uint32_t speedMbps = 0;  // 0 when the device does not say
    bool fullDuplex = false;
};

/// One queue's counters: written by the carrier polling it, read anywhere (relaxed).
struct QueueStats {
    uint64_t rxPackets = 0;    // received and handed to the handler
    uint64_t txPackets = 0;    // accepted by the device
    uint64_t dropped = 0;      // freed unsent: the device's TX ring stayed full, or the handler dropped them
    uint64_t noMbuf = 0;       // a packet that could not be built for want of an mbuf
    uint64_t badChecksum = 0;  // dropped by the stack for a wrong IP/UDP/ICMP checksum
    uint64_t notForUs = 0;     // dropped by the stack: another MAC or IP address, a protocol we do not serve
};

/// Called on the polling carrier with `n` (1..kBurst) received packets, which it now owns (it must
/// free or transmit each). `arg` is startPolling()'s.
using RxHandler = void (*)(void* arg, unsigned queue, rte_mbuf** packets, uint16_t n) noexcept;

class Port {
public:
    static constexpr uint16_t kBurst = 32;  // packets taken per receive call

    Port() noexcept;
    ~Port();
    Port(Port&&) noexcept;
    Port& operator=(Port&&) noexcept;
    Port(const Port&) = delete;
    Port& operator=(const Port&) = delete;

    /// Creates (vdev) or probes (PCI) `device`, configures and starts it. Errors: file comment.
    [[nodiscard]] static Result<Port> open(std::string_view device, const PortOptions& options = {},
                                           std::string* why = nullptr) noexcept;
    /// Configures and starts the port DPDK already has as `portId`; close() stops and closes it but
    /// does not remove the device. Errors: file comment; ENODEV for an unknown port id.
    [[nodiscard]] static Result<Port> attach(uint16_t portId, const PortOptions& options = {},
                                             std::string* why = nullptr) noexcept;

    [[nodiscard]] bool isOpen() const noexcept { return impl_ != nullptr; }
    [[nodiscard]] uint16_t id() const noexcept;
    [[nodiscard]] const std::string& name() const noexcept;
    [[nodiscard]] unsigned queues() const noexcept;
    [[nodiscard]] std::array<uint8_t, 6> mac() const noexcept;
    [[nodiscard]] uint16_t mtu() const noexcept;
    [[nodiscard]] LinkStatus link() const noexcept;
    /// Whether the device computes IPv4 and UDP checksums on transmit (mbufs flagged
    /// RTE_MBUF_F_TX_IP_CKSUM | RTE_MBUF_F_TX_UDP_CKSUM), and verifies them on receipt (RX flags).
    [[nodiscard]] bool txChecksumOffload() const noexcept;
    [[nodiscard]] bool rxChecksumOffload() const noexcept;
    /// The pool queue `queue` receives into (on its node; see PortOptions::queueNodes); transmit()
    /// takes mbufs from any pool. Precondition: queue < queues().
    [[nodiscard]] rte_mempool* pool(unsigned queue = 0) const noexcept;

    /// From a fiber pinned on the carrier that is to poll `queue`: registers the thread with DPDK
    /// and a poller that hands each received burst to `handler(arg, ...)`. Errors: EINVAL for a
    /// queue out of range, EBUSY when the queue is polled already, EPERM off-fiber, ENOSPC when
    /// DPDK has no lcore id left, EBADF on a closed port.
    [[nodiscard]] Result<void> startPolling(unsigned queue, RxHandler handler, void* arg) noexcept;
    /// From a fiber on the carrier polling `queue`: the handler is not called again once this
    /// returns. Errors: EINVAL when the queue is not polled, EPERM from another carrier.
    [[nodiscard]] Result<void> stopPolling(unsigned queue) noexcept;
    /// Whether a carrier polls `queue`.
    [[nodiscard]] bool polled(unsigned queue) const noexcept;

    /// Takes up to `n` received packets from `queue`, now the caller's, for code that polls a queue
    /// itself (a forwarding loop on a fiber) instead of through startPolling(). Returns how many.
    /// Precondition: nobody polls `queue`; one thread at a time.
    uint16_t receive(unsigned queue, rte_mbuf** packets, uint16_t n) noexcept;
    /// Hands up to `n` packets to `queue`'s TX ring; returns how many it took (the caller still owns
    /// the rest). Precondition: on the thread allowed to use the queue (file comment).
    uint16_t transmit(unsigned queue, rte_mbuf** packets, uint16_t n) noexcept;
    /// transmit() until every packet is taken, yielding the fiber while the ring is full; packets the
    /// device still refuses after `spins` yields in a row are freed and counted as dropped. Returns
    /// how many were taken.
    uint16_t transmitAll(unsigned queue, rte_mbuf** packets, uint16_t n, unsigned spins = 1u << 20) noexcept;

    [[nodiscard]] QueueStats stats(unsigned queue) const noexcept;
    /// Adds to a queue's stack-level counters (dropped, badChecksum, notForUs, noMbuf), for the
    /// code that handles its packets, on the thread polling it.
    void count(unsigned queue, const QueueStats& delta) noexcept;

    /// Stops and closes the port (and removes the device open() created). Errors: EBUSY while a
    /// queue is polled; EBADF when not open. The port is closed even when DPDK reports an error on
    /// the way, which is then returned.
    [[nodiscard]] Result<void> close() noexcept;

private:
    struct Impl;
    explicit Port(std::unique_ptr<Impl> impl) noexcept;
    [[nodiscard]] static Result<Port> setUp(uint16_t portId, bool created, std::string name,
                                            const PortOptions& options, std::string* why) noexcept;
    std::unique_ptr<Impl> impl_;
};

}  // namespace spindle::dpdk
