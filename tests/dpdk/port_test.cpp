// SPDX-License-Identifier: Apache-2.0
// dpdk::startEal and dpdk::Port: EAL's arguments and its one-start rule, ports opened by vdev string
// and attached by id, their errors, and frames carried between two net_ring ports wired back to back
// and polled by fibers on different carriers, with no frame lost and no mbuf leaked.
#include "net/dpdk/port.h"

#include <gtest/gtest.h>
#include <rte_eth_ring.h>
#include <rte_ethdev.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>
#include <rte_ring.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>

#include "core/fiber.h"
#include "net/dpdk/eal.h"
#include "tests/dpdk/test_eal.h"
#include "net/dpdk/mbuf.h"
#include "tests/core/with_runtime.h"

namespace spindle::dpdk {
namespace {

using namespace std::chrono_literals;

bool contains(const std::vector<std::string>& v, const std::string& s) {
    return std::find(v.begin(), v.end(), s) != v.end();
}

TEST(DpdkEal, DefaultArgumentsNeedNoHugepagesAndNoNic) {
    auto args = ealArguments(EalOptions{});
    ASSERT_TRUE(args);
    EXPECT_TRUE(contains(*args, "--no-huge"));
    EXPECT_TRUE(contains(*args, "--no-pci"));
    EXPECT_TRUE(contains(*args, "--no-shconf"));
    EXPECT_TRUE(contains(*args, "--iova-mode=va"));
    EXPECT_TRUE(contains(*args, "--file-prefix=spindle-" + std::to_string(::getpid())));
    const auto m = std::find(args->begin(), args->end(), "-m");
    ASSERT_NE(m, args->end());
    EXPECT_EQ(*(m + 1), "256");
    EXPECT_EQ(args->at(1).rfind("--lcores=0@(", 0), 0u) << args->at(1);

    EalOptions named;
    named.pciDevices = {"0000:00:04.0"};
    named.hugepages = true;
    named.filePrefix = "mine";
    args = ealArguments(named);
    ASSERT_TRUE(args);
    EXPECT_FALSE(contains(*args, "--no-pci"));
    EXPECT_FALSE(contains(*args, "--no-huge"));
    EXPECT_TRUE(contains(*args, "0000:00:04.0"));
    EXPECT_TRUE(contains(*args, "--file-prefix=mine"));

    EalOptions bad;
    bad.vdevs = {""};
    EXPECT_EQ(ealArguments(bad).errorCode(), EINVAL);
}

TEST(DpdkEal, PortsAndThreadsNeedARunningEal) {
    if (ealRunning()) { GTEST_SKIP() << "EAL was started by an earlier test of this process"; }
    std::string why;
    EXPECT_EQ(Port::open("net_null0", {}, &why).errorCode(), ENXIO);
    EXPECT_NE(why.find("EAL is not running"), std::string::npos) << why;
    EXPECT_EQ(Port::attach(0).errorCode(), ENXIO);
    EXPECT_EQ(registerThread().errorCode(), ENXIO);
    EXPECT_EQ(stopEal().errorCode(), ENXIO);
}

/// EAL started once for the process (ctest runs each test in its own); a runtime of two carriers.
class DpdkPort : public testing_support::WithRuntime {
protected:
    void SetUp() override {
        if (const std::string why = testing_support::startTestEal(); !why.empty()) {
            GTEST_SKIP() << "DPDK cannot initialise here: " << why;
        }
        WithRuntime::SetUp();
    }
};

TEST_F(DpdkPort, StartingEalTwiceIsRefusedWithAReason) {
    std::string why;
    EXPECT_EQ(startEal(EalOptions{}, &why).errorCode(), EALREADY);
    EXPECT_NE(why.find("already running"), std::string::npos) << why;
}

TEST_F(DpdkPort, BadDevicesAreClearErrorsAndLeaveNothingBehind) {
    const uint16_t before = rte_eth_dev_count_avail();
    std::string why;
    EXPECT_EQ(Port::open("net_nosuchdriver0", {}, &why).errorCode(), ENODEV);
    EXPECT_NE(why.find("net_nosuchdriver0"), std::string::npos) << why;
    EXPECT_EQ(Port::open("net_null0,nosuchkey=1", {}, &why).errorCode(), ENODEV);
    EXPECT_EQ(Port::open("", {}, &why).errorCode(), EINVAL);
    // A PCI address in its short form is read as the full one (no PCI device here: no driver).
    EXPECT_EQ(Port::open("00:04.0", {}, &why).errorCode(), ENODEV);
    EXPECT_NE(why.find("0000:00:04.0"), std::string::npos) << why;
    EXPECT_EQ(Port::open("00:zz.0", {}, &why).errorCode(), EINVAL);
    EXPECT_NE(why.find("not a PCI address"), std::string::npos) << why;
    EXPECT_EQ(Port::attach(RTE_MAX_ETHPORTS - 1, {}, &why).errorCode(), ENODEV);
    PortOptions none;
    none.queues = 0;
    EXPECT_EQ(Port::open("net_null7", none, &why).errorCode(), EINVAL);
    EXPECT_EQ(rte_eth_dev_count_avail(), before);  // the refused port's device was removed again

    auto a = Port::open("net_null8");
    ASSERT_TRUE(a);
    EXPECT_EQ(Port::open("net_null8", {}, &why).errorCode(), EEXIST);
    EXPECT_TRUE(a->close());
    EXPECT_EQ(a->close().errorCode(), EBADF);
    EXPECT_EQ(rte_eth_dev_count_avail(), before);
}

TEST_F(DpdkPort, ANullPortOpensWithItsQueuesLinkAndAddress) {
    PortOptions o;
    o.queues = 2;
    o.rxDescriptors = 256;
    o.txDescriptors = 256;
    auto p = Port::open("net_null1", o);
    ASSERT_TRUE(p);
    EXPECT_EQ(p->queues(), 2u);
    EXPECT_EQ(p->name(), "net_null1");
    EXPECT_TRUE(p->link().up);
    EXPECT_GE(p->mtu(), 1500);
    EXPECT_NE(p->pool(), nullptr);
    const auto mac = p->mac();
    EXPECT_FALSE(std::all_of(mac.begin(), mac.end(), [](uint8_t b) { return b == 0; }));
    EXPECT_TRUE(p->close());
}

// Queues polled from different NUMA nodes get a pool each, on their node where it has memory; queues
// on one node share theirs. (This machine has one node: node 1 falls back to any node, and still
// gets a pool of its own.)
TEST_F(DpdkPort, EachNodeOfThePollingCarriersGetsItsOwnPool) {
    PortOptions o;
    o.queues = 3;
    o.rxDescriptors = 128;
    o.txDescriptors = 128;
    o.queueNodes = {0, 1, 0};
    auto p = Port::open("net_null3", o);
    ASSERT_TRUE(p);
    ASSERT_EQ(p->queues(), 3u);
    EXPECT_EQ(p->pool(0), p->pool(2));
    EXPECT_NE(p->pool(0), p->pool(1));
    EXPECT_EQ(p->pool(0)->socket_id, 0);
    EXPECT_EQ(p->pool(), p->pool(0));
    // Sized for its queues: two on node 0, one on node 1.
    EXPECT_GT(p->pool(0)->size, p->pool(1)->size);
    EXPECT_TRUE(p->close());
}

TEST_F(DpdkPort, PollingIsRefusedWhereItCannotWork) {
    auto p = Port::open("net_null2");
    ASSERT_TRUE(p);
    auto drop = [](void*, unsigned, rte_mbuf** pkts, uint16_t n) noexcept { freePackets(pkts, n); };
    EXPECT_EQ(p->startPolling(0, drop, nullptr).errorCode(), EPERM);  // a plain thread
    on(0, [&] {
        EXPECT_EQ(p->startPolling(1, drop, nullptr).errorCode(), EINVAL);
        EXPECT_EQ(p->startPolling(0, nullptr, nullptr).errorCode(), EINVAL);
        ASSERT_TRUE(p->startPolling(0, drop, nullptr));
        EXPECT_EQ(p->startPolling(0, drop, nullptr).errorCode(), EBUSY);
    }).join();
    EXPECT_TRUE(p->polled(0));
    on(1, [&] { EXPECT_EQ(p->stopPolling(0).errorCode(), EPERM); }).join();  // not the polling carrier
    EXPECT_EQ(p->close().errorCode(), EBUSY);
    // net_null receives a packet on every call: the poller ran and dropped them through the handler.
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (p->stats(0).rxPackets == 0 && std::chrono::steady_clock::now() < deadline) { std::this_thread::sleep_for(1ms); }
    EXPECT_GT(p->stats(0).rxPackets, 0u);
    on(0, [&] {
        EXPECT_TRUE(p->stopPolling(0));
        EXPECT_EQ(p->stopPolling(0).errorCode(), EINVAL);
    }).join();
    EXPECT_TRUE(p->close());
}

// Frames numbered 0..N-1 sent from a fiber on carrier 0 through port A arrive at port B, polled on
// carrier 1, all of them and in order; the rings between them hold far fewer than N.
struct Receiver {
    std::atomic<uint32_t> received{0};
    std::atomic<uint32_t> outOfOrder{0};
    uint32_t next = 0;  // only the polling carrier touches it

    static void onBurst(void* arg, unsigned, rte_mbuf** pkts, uint16_t n) noexcept {
        auto* self = static_cast<Receiver*>(arg);
        for (uint16_t i = 0; i < n; ++i) {
            uint32_t seq = 0;
            std::memcpy(&seq, rte_pktmbuf_mtod(pkts[i], const char*), sizeof(seq));
            if (seq != self->next || rte_pktmbuf_data_len(pkts[i]) != 64) { self->outOfOrder.fetch_add(1); }
            self->next = seq + 1;
        }
        freePackets(pkts, n);
        self->received.fetch_add(n, std::memory_order_release);
    }
};

TEST_F(DpdkPort, RingPortsBackToBackCarryEveryFrameInOrderAcrossCarriers) {
    const std::string tag = std::to_string(::getpid());
    rte_ring* aToB = rte_ring_create(("spindle-ab-" + tag).c_str(), 256, SOCKET_ID_ANY, RING_F_SP_ENQ | RING_F_SC_DEQ);
    rte_ring* bToA = rte_ring_create(("spindle-ba-" + tag).c_str(), 256, SOCKET_ID_ANY, RING_F_SP_ENQ | RING_F_SC_DEQ);
    ASSERT_TRUE(aToB != nullptr && bToA != nullptr);
    const int idA = rte_eth_from_rings(("spA" + tag).c_str(), &bToA, 1, &aToB, 1, SOCKET_ID_ANY);
    const int idB = rte_eth_from_rings(("spB" + tag).c_str(), &aToB, 1, &bToA, 1, SOCKET_ID_ANY);
    ASSERT_GE(idA, 0);
    ASSERT_GE(idB, 0);
    PortOptions o;
    o.mbufs = 2047;
    // A refused attach leaves the port as it was: the caller's, attachable again.
    PortOptions none;
    none.queues = 0;
    EXPECT_EQ(Port::attach(static_cast<uint16_t>(idA), none).errorCode(), EINVAL);
    PortOptions badMtu = o;
    badMtu.mtu = 1;  // refused after the queues are set up: the failure path that undoes them
    EXPECT_FALSE(Port::attach(static_cast<uint16_t>(idA), badMtu));
    EXPECT_TRUE(rte_eth_dev_is_valid_port(static_cast<uint16_t>(idA)));
    auto a = Port::attach(static_cast<uint16_t>(idA), o);
    auto b = Port::attach(static_cast<uint16_t>(idB), o);
    ASSERT_TRUE(a && b);

    constexpr uint32_t kFrames = testing_support::kSanitized ? 20'000 : 200'000;
    Receiver rx;
    on(1, [&] { ASSERT_TRUE(b->startPolling(0, &Receiver::onBurst, &rx)); }).join();
    on(0, [&] {
        rte_mbuf* burst[Port::kBurst];
        uint32_t seq = 0;
        while (seq < kFrames) {
            const auto n = static_cast<uint16_t>(std::min<uint32_t>(Port::kBurst, kFrames - seq));
            while (!allocPackets(a->pool(), burst, n)) { this_fiber::yield(); }
            for (uint16_t i = 0; i < n; ++i) {
                char* data = rte_pktmbuf_append(burst[i], 64);
                std::memset(data, 0, 64);
                const uint32_t s = seq + i;
                std::memcpy(data, &s, sizeof(s));
            }
            // No drop budget: the receiving carrier may lose its CPU for longer than the default budget of
            // yields lasts when other tests load the machine (ctest -j2 beside a million-fiber test).
            ASSERT_EQ(a->transmitAll(0, burst, n, UINT32_MAX), n);
            seq += n;
        }
    }).join();
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    while (rx.received.load(std::memory_order_acquire) < kFrames && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(1ms);
    }
    on(1, [&] { EXPECT_TRUE(b->stopPolling(0)); }).join();
    EXPECT_EQ(rx.received.load(), kFrames);
    EXPECT_EQ(rx.outOfOrder.load(), 0u);
    EXPECT_EQ(a->stats(0).txPackets, kFrames);
    EXPECT_EQ(a->stats(0).dropped, 0u);
    EXPECT_EQ(b->stats(0).rxPackets, kFrames);
    // Every mbuf is back in its pool (the per-lcore caches count as in the pool).
    EXPECT_EQ(rte_mempool_avail_count(a->pool()), o.mbufs);
    EXPECT_TRUE(a->close());
    EXPECT_TRUE(b->close());
    rte_ring_free(aToB);
    rte_ring_free(bToA);
}

}  // namespace
}  // namespace spindle::dpdk
