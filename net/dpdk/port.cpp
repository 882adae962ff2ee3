// SPDX-License-Identifier: Apache-2.0
#include "net/dpdk/port.h"

#include <rte_bus_vdev.h>
#include <rte_dev.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>
#include <rte_pci.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <vector>

#include "base/check.h"
#include "base/counter.h"
#include "base/log.h"
#include "core/fiber.h"
#include "core/poller.h"
#include "net/dpdk/eal.h"
#include "net/dpdk/mbuf.h"

namespace spindle::dpdk {
namespace {

std::atomic<unsigned> gPoolSerial{0};

int dpdkErrno(int r) noexcept {
    // ethdev calls return -errno; some older paths return -1 and set rte_errno.
    if (r < -1) { return -r; }
    return rte_errno > 0 ? rte_errno : EINVAL;
}

void report(std::string* why, std::string text) {
    log::error("dpdk: {}", text);
    if (why != nullptr) { *why = std::move(text); }
}

// A PCI address ("0000:00:04.0" or "00:04.0") as opposed to a vdev string ("net_ring0,...").
bool looksLikePci(std::string_view d) noexcept {
    const size_t comma = d.find(',');
    const std::string_view name = d.substr(0, comma);
    return name.find(':') != std::string_view::npos && name.find('.') != std::string_view::npos &&
           name.rfind("net_", 0) != 0;
}

}  // namespace

struct Port::Impl {
    struct Counters {
        std::atomic<uint64_t> rxPackets{0};
        std::atomic<uint64_t> txPackets{0};
        std::atomic<uint64_t> dropped{0};
        std::atomic<uint64_t> noMbuf{0};
        std::atomic<uint64_t> badChecksum{0};
        std::atomic<uint64_t> notForUs{0};
    };
    // One RX/TX pair: its poller, while a carrier polls it.
    struct Queue {
        Poller poller;  // first: the poller's callbacks find the queue from it
        Impl* port = nullptr;
        uint16_t index = 0;
        RxHandler handler = nullptr;
        void* arg = nullptr;
        std::atomic<bool> polled{false};
        int carrier = -1;
        rte_mempool* pool = nullptr;  // one of the port's pools: the one on this queue's node
        Counters counters;
    };

    uint16_t portId = 0;
    bool created = false;  // a vdev that open() created: close() removes it
    bool started = false;
    bool txChecksum = false;  // TX IPv4 + UDP checksum offloads on
    bool rxChecksum = false;  // RX IPv4 + UDP checksum offloads on
    std::string name;
    std::vector<std::pair<int, rte_mempool*>> pools;  // by DPDK socket id asked for
    std::vector<std::unique_ptr<Queue>> queues;

    static bool poll(Poller* p) noexcept {
        auto* q = reinterpret_cast<Queue*>(p);
        rte_mbuf* burst[kBurst];
        const uint16_t n = ::rte_eth_rx_burst(q->port->portId, q->index, burst, kBurst);
        if (n == 0) { return false; }
        for (uint16_t i = 0; i < n; ++i) { detail::takeOver(burst[i]); }
        ownerAdd(q->counters.rxPackets, n);
        q->handler(q->arg, q->index, burst, n);
        return true;
    }
    // No Rx interrupts on the ports spindle opens: a carrier that polls one keeps polling.
    static bool mayPark(Poller*) noexcept { return false; }
    // The carrier left its loop (runtime shutdown) with the queue still polled: on its thread, undo
    // what startPolling() did there, so that the port can close.
    static void detached(Poller* p) noexcept {
        auto* q = reinterpret_cast<Queue*>(p);
        q->polled.store(false, std::memory_order_release);
        q->carrier = -1;
        unregisterThread();
    }

    // Stops, closes and (when created) removes the device, frees the pools. Returns the first error.
    // `keepPort`: a failed attach() only stops the port it was given, which stays the caller's.
    int tearDown(bool keepPort = false) noexcept {
        int err = 0;
        if (started) {
            if (const int r = ::rte_eth_dev_stop(portId); r != 0 && err == 0) { err = dpdkErrno(r); }
            started = false;
        }
        if (keepPort) {
            for (auto& [socket, pool] : pools) { ::rte_mempool_free(pool); }
            pools.clear();
            return err;
        }
        if (const int r = ::rte_eth_dev_close(portId); r != 0 && err == 0) { err = dpdkErrno(r); }
        if (created) {
            if (const int r = ::rte_vdev_uninit(name.c_str()); r != 0 && err == 0) { err = dpdkErrno(r); }
            created = false;
        }
        for (auto& [socket, pool] : pools) { ::rte_mempool_free(pool); }
        pools.clear();
        return err;
    }
};

Port::Port() noexcept = default;
Port::Port(std::unique_ptr<Impl> impl) noexcept : impl_(std::move(impl)) {}
Port::Port(Port&&) noexcept = default;
Port& Port::operator=(Port&& o) noexcept {
    if (this != &o) {
        Port old(std::move(*this));  // closed (and checked) by its destructor
        impl_ = std::move(o.impl_);
    }
    return *this;
}
Port::~Port() {
    if (!impl_) { return; }
    for (const auto& q : impl_->queues) {
        SPINDLE_CHECK_MSG(!q->polled.load(std::memory_order_acquire),
                          "a dpdk::Port destroyed while a carrier polls one of its queues (stopPolling first)");
    }
    (void)close();
}

Result<Port> Port::open(std::string_view device, const PortOptions& options, std::string* why) noexcept {
    if (!ealRunning()) {
        report(why, "open a port: EAL is not running (call dpdk::startEal first)");
        return Error{ENXIO};
    }
    std::string dev;
    std::string name;
    try {
        dev = std::string(device);
        name = dev.substr(0, dev.find(','));
    } catch (const std::bad_alloc&) {
        return Error{ENOMEM};
    }
    if (name.empty()) {
        report(why, "open a port: an empty device name");
        return Error{EINVAL};
    }
    bool created = false;
    if (looksLikePci(dev)) {
        // DPDK names a probed PCI port by its full address ("0000:00:04.0"): the short form a user
        // may type ("00:04.0") is probed fine but not found by that name afterwards.
        rte_pci_addr addr{};
        if (::rte_pci_addr_parse(name.c_str(), &addr) != 0) {
            report(why, fmt::format("open {}: {} is not a PCI address (DDDD:BB:DD.F or BB:DD.F)", dev, name));
            return Error{EINVAL};
        }
        char full[PCI_PRI_STR_SIZE] = {};
        ::rte_pci_device_name(&addr, full, sizeof(full));
        try {
            dev = std::string(full) + dev.substr(name.size());
            name = full;
        } catch (const std::bad_alloc&) {
            return Error{ENOMEM};
        }
        if (const int r = ::rte_dev_probe(dev.c_str()); r != 0) {
            const int e = dpdkErrno(r);
            report(why, fmt::format("open {}: no driver took the PCI device ({}); is it bound to vfio-pci?",
                                    dev, ::rte_strerror(e)));
            return Error{e == EINVAL ? ENODEV : e};
        }
    } else {
        const size_t comma = dev.find(',');
        const std::string args = comma == std::string::npos ? std::string() : dev.substr(comma + 1);
        uint16_t existing = 0;
        if (::rte_eth_dev_get_port_by_name(name.c_str(), &existing) == 0) {
            report(why, fmt::format("open {}: a port named {} exists already (port {})", dev, name, existing));
            return Error{EEXIST};
        }
        if (const int r = ::rte_vdev_init(name.c_str(), args.empty() ? nullptr : args.c_str()); r != 0) {
            const int e = r < 0 ? -r : EINVAL;
            report(why, fmt::format("open {}: no virtual-device driver created it ({}); the name must start "
                                    "with a driver's prefix (net_ring, net_null, net_tap, net_af_packet, ...) "
                                    "and its arguments must be the driver's",
                                    dev, ::rte_strerror(e)));
            return Error{e == EEXIST ? EEXIST : ENODEV};
        }
        created = true;
    }
    uint16_t portId = 0;
    if (::rte_eth_dev_get_port_by_name(name.c_str(), &portId) != 0) {
        if (created) { (void)::rte_vdev_uninit(name.c_str()); }
        report(why, fmt::format("open {}: the device is not an Ethernet port", dev));
        return Error{ENODEV};
    }
    return setUp(portId, created, std::move(name), options, why);
}

Result<Port> Port::attach(uint16_t portId, const PortOptions& options, std::string* why) noexcept {
    if (!ealRunning()) {
        report(why, "attach a port: EAL is not running (call dpdk::startEal first)");
        return Error{ENXIO};
    }
    if (!::rte_eth_dev_is_valid_port(portId)) {
        report(why, fmt::format("attach port {}: no such port", portId));
        return Error{ENODEV};
    }
    char name[RTE_ETH_NAME_MAX_LEN] = {};
    (void)::rte_eth_dev_get_name_by_port(portId, name);
    try {
        return setUp(portId, false, std::string(name), options, why);
    } catch (const std::bad_alloc&) {
        return Error{ENOMEM};
    }
}

Result<Port> Port::setUp(uint16_t portId, bool created, std::string name, const PortOptions& o,
                         std::string* why) noexcept {
    std::unique_ptr<Impl> impl(new (std::nothrow) Impl);
    if (!impl) {
        if (created) { (void)::rte_vdev_uninit(name.c_str()); }
        return Error{ENOMEM};
    }
    impl->portId = portId;
    impl->created = created;
    impl->name = std::move(name);
    // From here, a failure tears down what was done (the device too, when we created it).
    auto fail = [&](int e, std::string text) -> Result<Port> {
        report(why, fmt::format("port {} ({}): {}", impl->name, portId, text));
        (void)impl->tearDown(/*keepPort=*/!created);
        return Error{e};
    };
    if (o.queues == 0) { return fail(EINVAL, "0 queues asked for"); }

    rte_eth_dev_info info{};
    if (const int r = ::rte_eth_dev_info_get(portId, &info); r != 0) {
        return fail(dpdkErrno(r), fmt::format("rte_eth_dev_info_get: {}", ::rte_strerror(dpdkErrno(r))));
    }
    const unsigned queues = std::min<unsigned>({o.queues, info.max_rx_queues, info.max_tx_queues});
    if (queues == 0) { return fail(ENODEV, "the device has no RX/TX queue"); }
    if (queues < o.queues) {
        log::info("dpdk: port {}: {} queue pairs asked for, the device has {}", impl->name, o.queues, queues);
    }

    rte_eth_conf conf{};
    const uint64_t rss = info.flow_type_rss_offloads & (RTE_ETH_RSS_IP | RTE_ETH_RSS_UDP | RTE_ETH_RSS_TCP);
    if (queues > 1 && rss != 0) {
        conf.rxmode.mq_mode = RTE_ETH_MQ_RX_RSS;
        conf.rx_adv_conf.rss_conf.rss_hf = rss;
    }
    constexpr uint64_t kTxCsum = RTE_ETH_TX_OFFLOAD_IPV4_CKSUM | RTE_ETH_TX_OFFLOAD_UDP_CKSUM;
    constexpr uint64_t kRxCsum = RTE_ETH_RX_OFFLOAD_IPV4_CKSUM | RTE_ETH_RX_OFFLOAD_UDP_CKSUM;
    if (o.checksumOffload && (info.tx_offload_capa & kTxCsum) == kTxCsum) {
        conf.txmode.offloads |= kTxCsum;
        impl->txChecksum = true;
    }
    if (o.checksumOffload && (info.rx_offload_capa & kRxCsum) == kRxCsum) {
        conf.rxmode.offloads |= kRxCsum;
        impl->rxChecksum = true;
    }
    if (const int r = ::rte_eth_dev_configure(portId, static_cast<uint16_t>(queues), static_cast<uint16_t>(queues), &conf);
        r != 0) {
        return fail(dpdkErrno(r), fmt::format("rte_eth_dev_configure with {} queue pairs: {}", queues,
                                              ::rte_strerror(dpdkErrno(r))));
    }
    uint16_t rxd = o.rxDescriptors;
    uint16_t txd = o.txDescriptors;
    if (const int r = ::rte_eth_dev_adjust_nb_rx_tx_desc(portId, &rxd, &txd); r != 0) {
        return fail(EINVAL, fmt::format("{} RX / {} TX descriptors: {}", o.rxDescriptors, o.txDescriptors,
                                        ::rte_strerror(dpdkErrno(r))));
    }
    int deviceSocket = ::rte_eth_dev_socket_id(portId);
    if (deviceSocket < 0) { deviceSocket = SOCKET_ID_ANY; }
    auto socketOf = [&](unsigned q) {
        return q < o.queueNodes.size() && o.queueNodes[q] >= 0 ? o.queueNodes[q] : deviceSocket;
    };
    // The pool of a node: made on its first queue, sized for every queue on that node.
    // Returns the pool and sets `*landed` to the node it is on (SOCKET_ID_ANY after a fallback),
    // which the queue's descriptor rings then use too.
    auto poolFor = [&](int socket, int* landed) -> rte_mempool* {
        for (auto& [s, p] : impl->pools) {
            if (s == socket) {
                *landed = p->socket_id;
                return p;
            }
        }
        unsigned onNode = 0;
        for (unsigned q = 0; q < queues; ++q) { onNode += socketOf(q) == socket ? 1 : 0; }
        const unsigned mbufs = o.mbufs != 0 ? o.mbufs : 2 * onNode * (rxd + txd) + 2 * kBurst * onNode + 1024;
        char poolName[RTE_MEMPOOL_NAMESIZE];
        std::snprintf(poolName, sizeof(poolName), "spindle-p%u-%u", portId,
                      gPoolSerial.fetch_add(1, std::memory_order_relaxed));
        rte_mempool* p = ::rte_pktmbuf_pool_create(poolName, mbufs, 256, 0, RTE_MBUF_DEFAULT_BUF_SIZE, socket);
        *landed = socket;
        if (p == nullptr && socket != SOCKET_ID_ANY) {
            // No memory on that node (no hugepages there, or no such node): any node will do.
            log::info("dpdk: port {}: no mbuf pool on node {} ({}); using any node", impl->name, socket,
                      ::rte_strerror(rte_errno));
            p = ::rte_pktmbuf_pool_create(poolName, mbufs, 256, 0, RTE_MBUF_DEFAULT_BUF_SIZE, SOCKET_ID_ANY);
            *landed = SOCKET_ID_ANY;
        }
        if (p == nullptr) { return nullptr; }
        try {
            impl->pools.emplace_back(socket, p);
        } catch (const std::bad_alloc&) {
            ::rte_mempool_free(p);
            return nullptr;
        }
        return p;
    };
    for (unsigned q = 0; q < queues; ++q) {
        int socket = socketOf(q);
        rte_mempool* pool = poolFor(socket, &socket);
        if (pool == nullptr) {
            return fail(ENOMEM, fmt::format("an mbuf pool for queue {} (node {}): {} (raise EalOptions::memoryMb)", q,
                                            socket, ::rte_strerror(rte_errno)));
        }
        if (const int r = ::rte_eth_rx_queue_setup(portId, static_cast<uint16_t>(q), rxd, static_cast<unsigned>(socket),
                                                   nullptr, pool);
            r != 0) {
            return fail(dpdkErrno(r), fmt::format("RX queue {}: {}", q, ::rte_strerror(dpdkErrno(r))));
        }
        if (const int r = ::rte_eth_tx_queue_setup(portId, static_cast<uint16_t>(q), txd, static_cast<unsigned>(socket), nullptr);
            r != 0) {
            return fail(dpdkErrno(r), fmt::format("TX queue {}: {}", q, ::rte_strerror(dpdkErrno(r))));
        }
        auto queue = std::unique_ptr<Impl::Queue>(new (std::nothrow) Impl::Queue);
        if (!queue) { return fail(ENOMEM, "out of memory"); }
        queue->port = impl.get();
        queue->index = static_cast<uint16_t>(q);
        queue->pool = pool;
        queue->poller.poll = &Impl::poll;
        queue->poller.mayPark = &Impl::mayPark;
        queue->poller.detached = &Impl::detached;
        try {
            impl->queues.push_back(std::move(queue));
        } catch (const std::bad_alloc&) {
            return fail(ENOMEM, "out of memory");
        }
    }
    if (o.mtu != 0) {
        if (const int r = ::rte_eth_dev_set_mtu(portId, o.mtu); r != 0) {
            return fail(EINVAL, fmt::format("MTU {}: {}", o.mtu, ::rte_strerror(dpdkErrno(r))));
        }
    }
    if (const int r = ::rte_eth_dev_start(portId); r != 0) {
        return fail(dpdkErrno(r), fmt::format("rte_eth_dev_start: {}", ::rte_strerror(dpdkErrno(r))));
    }
    impl->started = true;
    if (o.promiscuous) {
        if (const int r = ::rte_eth_promiscuous_enable(portId); r != 0 && r != -ENOTSUP) {
            return fail(dpdkErrno(r), fmt::format("promiscuous mode: {}", ::rte_strerror(dpdkErrno(r))));
        }
    }
    log::info("dpdk: port {} ({}) up: driver {}, {} queue pairs, {} RX / {} TX descriptors, {} mbuf pool(s), "
              "checksum offload TX {} RX {}",
              impl->name, portId, info.driver_name, queues, rxd, txd, impl->pools.size(), impl->txChecksum ? "on" : "off",
              impl->rxChecksum ? "on" : "off");
    return Port(std::move(impl));
}

uint16_t Port::id() const noexcept { return impl_->portId; }
const std::string& Port::name() const noexcept { return impl_->name; }
unsigned Port::queues() const noexcept { return static_cast<unsigned>(impl_->queues.size()); }
rte_mempool* Port::pool(unsigned queue) const noexcept { return impl_->queues[queue]->pool; }

std::array<uint8_t, 6> Port::mac() const noexcept {
    rte_ether_addr a{};
    (void)::rte_eth_macaddr_get(impl_->portId, &a);
    std::array<uint8_t, 6> out{};
    for (size_t i = 0; i < out.size(); ++i) { out[i] = a.addr_bytes[i]; }
    return out;
}

bool Port::txChecksumOffload() const noexcept { return impl_->txChecksum; }
bool Port::rxChecksumOffload() const noexcept { return impl_->rxChecksum; }

uint16_t Port::mtu() const noexcept {
    uint16_t m = 0;
    if (::rte_eth_dev_get_mtu(impl_->portId, &m) != 0) { return RTE_ETHER_MTU; }
    return m;
}

LinkStatus Port::link() const noexcept {
    rte_eth_link l{};
    if (::rte_eth_link_get_nowait(impl_->portId, &l) != 0) { return {}; }
    return LinkStatus{l.link_status == RTE_ETH_LINK_UP,
                      l.link_speed == RTE_ETH_SPEED_NUM_UNKNOWN ? 0u : l.link_speed,
                      l.link_duplex == RTE_ETH_LINK_FULL_DUPLEX};
}

Result<void> Port::startPolling(unsigned queue, RxHandler handler, void* arg) noexcept {
    if (!impl_) { return Error{EBADF}; }
    if (queue >= impl_->queues.size() || handler == nullptr) { return Error{EINVAL}; }
    if (!this_fiber::inFiber()) { return Error{EPERM}; }
    Impl::Queue& q = *impl_->queues[queue];
    // Claimed first, atomically: two carriers starting the same queue at once get one EBUSY.
    bool expected = false;
    if (!q.polled.compare_exchange_strong(expected, true, std::memory_order_acq_rel)) { return Error{EBUSY}; }
    if (auto r = registerThread(); !r) {
        q.polled.store(false, std::memory_order_release);
        return r;
    }
    q.handler = handler;
    q.arg = arg;
    auto carrier = addPoller(&q.poller);
    if (!carrier) {
        unregisterThread();
        q.polled.store(false, std::memory_order_release);
        return Error{carrier.errorCode()};
    }
    q.carrier = static_cast<int>(*carrier);
    return {};
}

Result<void> Port::stopPolling(unsigned queue) noexcept {
    if (!impl_ || queue >= impl_->queues.size()) { return Error{EINVAL}; }
    Impl::Queue& q = *impl_->queues[queue];
    if (!q.polled.load(std::memory_order_acquire)) { return Error{EINVAL}; }
    if (auto r = removePoller(&q.poller); !r) { return r; }
    q.polled.store(false, std::memory_order_release);
    q.carrier = -1;
    unregisterThread();
    return {};
}

bool Port::polled(unsigned queue) const noexcept {
    return impl_ && queue < impl_->queues.size() && impl_->queues[queue]->polled.load(std::memory_order_acquire);
}

uint16_t Port::receive(unsigned queue, rte_mbuf** packets, uint16_t n) noexcept {
    Impl::Queue& q = *impl_->queues[queue];
    const uint16_t got = ::rte_eth_rx_burst(impl_->portId, q.index, packets, n);
    for (uint16_t i = 0; i < got; ++i) { detail::takeOver(packets[i]); }
    if (got != 0) { ownerAdd(q.counters.rxPackets, got); }
    return got;
}

uint16_t Port::transmit(unsigned queue, rte_mbuf** packets, uint16_t n) noexcept {
    Impl::Queue& q = *impl_->queues[queue];
    // Handed over before the device sees them; those it refuses stay the caller's all the same.
    for (uint16_t i = 0; i < n; ++i) { detail::handOver(packets[i]); }
    const uint16_t sent = ::rte_eth_tx_burst(impl_->portId, q.index, packets, n);
    if (sent != 0) { ownerAdd(q.counters.txPackets, sent); }
    return sent;
}

uint16_t Port::transmitAll(unsigned queue, rte_mbuf** packets, uint16_t n, unsigned spins) noexcept {
    uint16_t done = 0;
    unsigned idle = 0;
    while (done < n) {
        const uint16_t sent = transmit(queue, packets + done, static_cast<uint16_t>(n - done));
        done = static_cast<uint16_t>(done + sent);
        if (sent != 0) {
            idle = 0;
            continue;
        }
        if (++idle > spins) { break; }
        this_fiber::yield();  // the ring is full: let this carrier's other work (and pollers) run
    }
    if (done < n) {
        freePackets(packets + done, static_cast<unsigned>(n - done));
        ownerAdd(impl_->queues[queue]->counters.dropped, static_cast<uint64_t>(n - done));
    }
    return done;
}

QueueStats Port::stats(unsigned queue) const noexcept {
    QueueStats s;
    if (!impl_ || queue >= impl_->queues.size()) { return s; }
    const Impl::Counters& c = impl_->queues[queue]->counters;
    s.rxPackets = c.rxPackets.load(std::memory_order_relaxed);
    s.txPackets = c.txPackets.load(std::memory_order_relaxed);
    s.dropped = c.dropped.load(std::memory_order_relaxed);
    s.noMbuf = c.noMbuf.load(std::memory_order_relaxed);
    s.badChecksum = c.badChecksum.load(std::memory_order_relaxed);
    s.notForUs = c.notForUs.load(std::memory_order_relaxed);
    return s;
}

void Port::count(unsigned queue, const QueueStats& d) noexcept {
    Impl::Counters& c = impl_->queues[queue]->counters;
    if (d.dropped != 0) { ownerAdd(c.dropped, d.dropped); }
    if (d.noMbuf != 0) { ownerAdd(c.noMbuf, d.noMbuf); }
    if (d.badChecksum != 0) { ownerAdd(c.badChecksum, d.badChecksum); }
    if (d.notForUs != 0) { ownerAdd(c.notForUs, d.notForUs); }
}

Result<void> Port::close() noexcept {
    if (!impl_) { return Error{EBADF}; }
    for (const auto& q : impl_->queues) {
        if (q->polled.load(std::memory_order_acquire)) { return Error{EBUSY}; }
    }
    const int err = impl_->tearDown();
    impl_.reset();
    if (err != 0) { return Error{err}; }
    return {};
}

}  // namespace spindle::dpdk
