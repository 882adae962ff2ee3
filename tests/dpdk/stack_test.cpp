// SPDX-License-Identifier: Apache-2.0
// dpdk::Interface and dpdk::UdpSocket over two net_ring ports wired back to back, each interface run
// by its own carrier: ARP resolution on the first send, a UDP exchange between fibers on different
// carriers, ping answered, bad frames dropped and counted, and every error path of the sockets.
#include "net/dpdk/stack.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <rte_eth_ring.h>
#include <rte_ethdev.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>
#include <rte_ring.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "core/fiber.h"
#include "net/dpdk/eal.h"
#include "tests/dpdk/test_eal.h"
#include "net/dpdk/mbuf.h"
#include "tests/core/with_runtime.h"

namespace spindle::dpdk {
namespace {

using namespace std::chrono_literals;

uint32_t ip(const char* dotted) {
    in_addr a{};
    EXPECT_EQ(inet_pton(AF_INET, dotted, &a), 1);
    return a.s_addr;
}

/// Two ring ports wired back to back, an interface on each (A: 198.18.0.1, B: 198.18.0.2), torn
/// down in order. With one queue (this fixture) A runs on carrier 0 and B on carrier 1; lanes()
/// queues per port wire A's queue q to B's queue q, and both interfaces run queue q on carrier q.
class DpdkStack : public testing_support::WithRuntime {
protected:
    virtual unsigned lanes() const { return 1; }

    void SetUp() override {
        if (const std::string why = testing_support::startTestEal(); !why.empty()) {
            GTEST_SKIP() << "DPDK cannot initialise here: " << why;
        }
        WithRuntime::SetUp();
        const unsigned n = lanes();
        const std::string tag = std::to_string(::getpid()) + "-" + std::to_string(serial_++);
        for (unsigned q = 0; q < n; ++q) {
            const std::string qt = tag + "-" + std::to_string(q);
            aToB_.push_back(rte_ring_create(("ab" + qt).c_str(), 1024, SOCKET_ID_ANY, RING_F_SP_ENQ | RING_F_SC_DEQ));
            bToA_.push_back(rte_ring_create(("ba" + qt).c_str(), 1024, SOCKET_ID_ANY, RING_F_SP_ENQ | RING_F_SC_DEQ));
            ASSERT_TRUE(aToB_.back() != nullptr && bToA_.back() != nullptr);
        }
        const int idA = rte_eth_from_rings(("sA" + tag).c_str(), bToA_.data(), n, aToB_.data(), n, SOCKET_ID_ANY);
        const int idB = rte_eth_from_rings(("sB" + tag).c_str(), aToB_.data(), n, bToA_.data(), n, SOCKET_ID_ANY);
        ASSERT_TRUE(idA >= 0 && idB >= 0);
        PortOptions po;
        po.mbufs = 4095;
        po.queues = n;
        auto a = Port::attach(static_cast<uint16_t>(idA), po);
        auto b = Port::attach(static_cast<uint16_t>(idB), po);
        ASSERT_TRUE(a && b);
        portA_ = std::move(*a);
        portB_ = std::move(*b);
        ASSERT_EQ(portA_.queues(), n);
        InterfaceOptions oa;
        oa.ip = ip("198.18.0.1");
        oa.arpTimeout = 20ms;
        oa.arpHoldDown = 100ms;
        InterfaceOptions ob = oa;
        ob.ip = ip("198.18.0.2");
        std::vector<unsigned> queues;
        for (unsigned q = 0; q < n; ++q) { queues.push_back(q); }
        auto ia = Interface::create(portA_, queues, oa);
        auto ib = Interface::create(portB_, queues, ob);
        ASSERT_TRUE(ia && ib);
        a_ = std::move(*ia);
        b_ = std::move(*ib);
        if (n == 1) {
            on(0, [&] { ASSERT_TRUE(a_->start()); }).join();
            on(1, [&] { ASSERT_TRUE(b_->start()); }).join();
        } else {
            for (unsigned q = 0; q < n; ++q) {
                on(static_cast<int>(q), [&] {
                    ASSERT_TRUE(a_->start(q));
                    ASSERT_TRUE(b_->start(q));
                }).join();
            }
        }
    }

    void TearDown() override {
        // From carrier 0: lane 0 stops inline, lane 1 on a fiber spawned on carrier 1.
        const auto running = [&](const std::unique_ptr<Interface>& i) {
            for (unsigned q = 0; i && q < lanes(); ++q) {
                if (i->carrier(q) >= 0) { return true; }
            }
            return false;
        };
        if (running(a_)) { on(0, [&] { EXPECT_TRUE(a_->stop()); }).join(); }
        if (running(b_)) { on(0, [&] { EXPECT_TRUE(b_->stop()); }).join(); }
        a_.reset();
        b_.reset();
        // Frames still on the wire (a late ARP answer to a retried request, on a loaded machine) are
        // in the rings between the ports, not leaked: give them back before counting.
        for (auto* rings : {&aToB_, &bToA_}) {
            for (rte_ring* r : *rings) {
                void* m = nullptr;
                while (rte_ring_dequeue(r, &m) == 0) { rte_pktmbuf_free(static_cast<rte_mbuf*>(m)); }
            }
        }
        if (portA_.isOpen()) {
            const unsigned total = 4095;
            EXPECT_EQ(rte_mempool_avail_count(portA_.pool()), total) << "mbufs of A leaked";
            EXPECT_EQ(rte_mempool_avail_count(portB_.pool()), total) << "mbufs of B leaked";
            EXPECT_TRUE(portA_.close());
            EXPECT_TRUE(portB_.close());
        }
        for (rte_ring* r : aToB_) { rte_ring_free(r); }
        for (rte_ring* r : bToA_) { rte_ring_free(r); }
        if (runtime_) { WithRuntime::TearDown(); }
    }

    // Sends `frame` raw out of port B (from B's carrier, which owns its queue).
    void injectFromB(const std::vector<uint8_t>& frame) {
        on(1, [&] {
            rte_mbuf* m = nullptr;
            ASSERT_TRUE(allocPackets(portB_.pool(), &m, 1));
            char* d = rte_pktmbuf_append(m, static_cast<uint16_t>(frame.size()));
            std::memcpy(d, frame.data(), frame.size());
            ASSERT_EQ(portB_.transmitAll(0, &m, 1), 1);
        }).join();
    }

    static uint64_t waitFor(const std::function<uint64_t()>& f, uint64_t want) {
        const auto deadline = std::chrono::steady_clock::now() + 10s;
        uint64_t v = f();
        while (v < want && std::chrono::steady_clock::now() < deadline) {
            std::this_thread::sleep_for(1ms);
            v = f();
        }
        return v;
    }

    static inline unsigned serial_ = 0;
    std::vector<rte_ring*> aToB_;  // by queue
    std::vector<rte_ring*> bToA_;
    Port portA_;
    Port portB_;
    std::unique_ptr<Interface> a_;
    std::unique_ptr<Interface> b_;
};

TEST_F(DpdkStack, TheFirstSendResolvesThePeerAndDatagramsGoBothWays) {
    constexpr int kRounds = testing_support::kSanitized ? 200 : 2000;
    auto s = UdpSocket::bind(*b_, 7);  // bound before the client sends
    ASSERT_TRUE(s);
    auto server = on(1, [&] {
        char buf[2048];
        for (int i = 0; i < kRounds; ++i) {
            Endpoint from;
            auto n = s->recvFrom(buf, sizeof(buf), &from, 10s);
            ASSERT_TRUE(n) << n.error().message();
            ASSERT_TRUE(s->sendTo(buf, *n, from));
        }
        EXPECT_TRUE(s->close());
    });
    on(0, [&] {
        auto c = UdpSocket::bind(*a_, 0);
        ASSERT_TRUE(c);
        EXPECT_GE(c->localPort(), 49152);
        const Endpoint to{ip("198.18.0.2"), 7};
        char buf[2048];
        for (int i = 0; i < kRounds; ++i) {
            const std::string msg = "datagram " + std::to_string(i) + std::string(static_cast<size_t>(i % 1400), 'x');
            ASSERT_EQ(c->sendTo(msg.data(), msg.size(), to).value(), msg.size());
            Endpoint from;
            size_t full = 0;
            auto n = c->recvFrom(buf, sizeof(buf), &from, 10s, &full);
            ASSERT_TRUE(n) << n.error().message();
            ASSERT_EQ(std::string(buf, *n), msg);
            EXPECT_EQ(full, msg.size());
            EXPECT_EQ(from, to);
        }
        EXPECT_TRUE(c->close());
    }).join();
    server.join();
    const InterfaceStats sa = a_->stats();
    const InterfaceStats sb = b_->stats();
    // One request, then the cache; the fixture's 20 ms between requests may pass on a loaded machine
    // before the answer, so a retry or two while resolving is allowed, but nothing after.
    EXPECT_GE(sa.arpRequestsSent, 1u);
    EXPECT_LE(sa.arpRequestsSent, InterfaceOptions{}.arpAttempts);
    EXPECT_EQ(sa.arpResolved, 1u);
    EXPECT_GE(sb.arpRequestsAnswered, 1u);
    EXPECT_LE(sb.arpRequestsAnswered, sa.arpRequestsSent);
    EXPECT_EQ(sb.arpRequestsSent, 0u);  // B learned A from A's request
    EXPECT_EQ(sa.udpSent, static_cast<uint64_t>(kRounds));
    EXPECT_EQ(sb.udpReceived, static_cast<uint64_t>(kRounds));
    EXPECT_EQ(sa.udpReceived, static_cast<uint64_t>(kRounds));
}

// The zero-copy path: the server echoes bursts in their own mbufs (recvBurst, prepareReply,
// sendBurst); the client fills mbufs it allocated and reads the echoes in place.
TEST_F(DpdkStack, BurstsGoBothWaysWithoutACopy) {
    constexpr int kRounds = testing_support::kSanitized ? 50 : 500;
    constexpr size_t kBatch = 8;
    auto s = UdpSocket::bind(*b_, 7);  // bound before the client sends
    ASSERT_TRUE(s);
    auto server = on(1, [&] {
        size_t echoed = 0;
        while (echoed < kRounds * kBatch) {
            DatagramView views[16];
            auto n = s->recvBurst(views, 16, 10s);
            ASSERT_TRUE(n) << n.error().message();
            rte_mbuf* out[16];
            Endpoint to[16];
            for (size_t i = 0; i < *n; ++i) {
                ASSERT_TRUE(s->prepareReply(views[i]));
                out[i] = views[i].mbuf;
                to[i] = views[i].from;
            }
            ASSERT_EQ(s->sendBurst(out, to, *n).value(), *n);
            echoed += *n;
        }
        EXPECT_TRUE(s->close());
    });
    on(0, [&] {
        auto c = UdpSocket::bind(*a_, 0);
        ASSERT_TRUE(c);
        const Endpoint peer{ip("198.18.0.2"), 7};
        for (int round = 0; round < kRounds; ++round) {
            rte_mbuf* out[kBatch];
            Endpoint to[kBatch];
            for (size_t i = 0; i < kBatch; ++i) {
                uint8_t* payload = nullptr;
                const size_t len = 1 + (round * kBatch + i) % 1000;
                auto m = c->allocDatagram(len, &payload);
                ASSERT_TRUE(m) << m.error().message();
                for (size_t k = 0; k < len; ++k) { payload[k] = static_cast<uint8_t>(round + i + k); }
                out[i] = *m;
                to[i] = peer;
            }
            ASSERT_EQ(c->sendBurst(out, to, kBatch).value(), kBatch);
            size_t got = 0;
            while (got < kBatch) {
                DatagramView views[kBatch];
                auto n = c->recvBurst(views, kBatch - got, 10s);
                ASSERT_TRUE(n) << n.error().message();
                for (size_t j = 0; j < *n; ++j, ++got) {
                    const size_t len = 1 + (round * kBatch + got) % 1000;
                    EXPECT_EQ(views[j].length, len);
                    EXPECT_EQ(views[j].from, peer);
                    for (size_t k = 0; k < views[j].length; ++k) {
                        if (views[j].data[k] != static_cast<uint8_t>(round + got + k)) {
                            ADD_FAILURE() << "byte " << k << " of datagram " << got << " in round " << round;
                            break;
                        }
                    }
                    freePackets(&views[j].mbuf, 1);
                }
            }
        }
        // Errors: too large, a view that is not a received datagram, a closed socket takes the mbufs.
        uint8_t* payload = nullptr;
        EXPECT_EQ(c->allocDatagram(1473, &payload).errorCode(), EMSGSIZE);
        EXPECT_EQ(c->prepareReply(DatagramView{}).errorCode(), EINVAL);
        auto m = c->allocDatagram(4, &payload);
        ASSERT_TRUE(m);
        EXPECT_TRUE(c->close());
        rte_mbuf* last = *m;
        EXPECT_EQ(c->sendBurst(&last, &peer, 1).errorCode(), EBADF);  // and freed: TearDown counts the pool
    }).join();
    server.join();
    EXPECT_EQ(a_->stats().udpSent, static_cast<uint64_t>(kRounds * kBatch));
    EXPECT_EQ(b_->stats().udpSent, static_cast<uint64_t>(kRounds * kBatch));
}

TEST_F(DpdkStack, ASendFromAnotherCarrierRunsOnTheInterfacesCarrier) {
    auto s = UdpSocket::bind(*b_, 9);  // bound before the client sends
    ASSERT_TRUE(s);
    auto server = on(1, [&] {
        char buf[64];
        Endpoint from;
        auto n = s->recvFrom(buf, sizeof(buf), &from, 10s);
        ASSERT_TRUE(n);
        EXPECT_EQ(std::string(buf, *n), "from afar");
        EXPECT_TRUE(s->close());
    });
    auto c = UdpSocket::bind(*a_, 0);
    ASSERT_TRUE(c);
    // Carrier 1 is not A's carrier, and the fiber is not pinned.
    onUnpinned(1, [&] { EXPECT_EQ(c->sendTo("from afar", 9, Endpoint{ip("198.18.0.2"), 9}).value(), 9u); }).join();
    EXPECT_EQ(c->sendTo("x", 1, Endpoint{ip("198.18.0.2"), 9}).errorCode(), EPERM);  // a plain thread
    server.join();
    EXPECT_TRUE(c->close());
}

// A gratuitous ARP request (a peer announcing a new MAC for its address, as after a fail-over) moves
// what A sends to that address to the new MAC, though the request asks for no address of A's.
TEST_F(DpdkStack, AGratuitousAnnouncementMovesAKnownPeer) {
    const InterfaceAddress bAddr = b_->address();
    auto s = UdpSocket::bind(*b_, 7);  // bound before the client sends
    ASSERT_TRUE(s);
    auto server = on(1, [&] {
        char buf[16];
        Endpoint from;
        ASSERT_TRUE(s->recvFrom(buf, sizeof(buf), &from, 10s));  // the first datagram: A resolved B
        EXPECT_EQ(s->recvFrom(buf, sizeof(buf), &from, 200ms).errorCode(), ETIMEDOUT);  // the second went elsewhere
        EXPECT_TRUE(s->close());
    });
    auto c = on(0, [&] { return UdpSocket::bind(*a_, 0).value(); }).join();
    on(0, [&] { ASSERT_TRUE(c.sendTo("one", 3, Endpoint{bAddr.ip, 7})); }).join();
    // Let A's resolution of B settle first: on a loaded machine the fixture's 20 ms between requests
    // can pass before B's answer, and the answer to a retried request, arriving after the
    // announcement, would rightly move B back. Settled: every request answered, nothing on the wire,
    // and A's carrier past the poll that took the last frame.
    EXPECT_EQ(waitFor(
                  [&] {
                      return b_->stats().arpRequestsAnswered == a_->stats().arpRequestsSent &&
                                     rte_ring_count(aToB_[0]) == 0 && rte_ring_count(bToA_[0]) == 0
                                 ? 1
                                 : 0;
                  },
                  1),
              1u);
    on(0, [] {}).join();
    const uint64_t before = b_->stats().drops[static_cast<size_t>(DropReason::kNotForUs)];
    // B's address announced with another MAC.
    InterfaceAddress moved = bAddr;
    moved.mac[5] ^= 0x5a;
    std::vector<uint8_t> announce(42);
    ASSERT_EQ(buildArpRequest(announce, moved, bAddr.ip), 42u);
    injectFromB(announce);
    EXPECT_EQ(waitFor([&] { return a_->stats().drops[static_cast<size_t>(DropReason::kNotForUs)]; }, 1), 1u);
    on(0, [&] { ASSERT_TRUE(c.sendTo("two", 3, Endpoint{bAddr.ip, 7})); }).join();
    // It reached B's port addressed to the new MAC, which B's stack does not answer to.
    EXPECT_EQ(waitFor([&] { return b_->stats().drops[static_cast<size_t>(DropReason::kNotForUs)]; }, before + 1),
              before + 1);
    server.join();
    EXPECT_TRUE(c.close());
}

// With the interface's pool empty, a send fails with ENOBUFS (and is counted) instead of waiting, and
// works again once mbufs are back.
TEST_F(DpdkStack, AnEmptyPoolIsENOBUFSAndCounted) {
    on(0, [&] {
        auto c = UdpSocket::bind(*a_, 0);
        ASSERT_TRUE(c);
        const Endpoint peer{ip("198.18.0.2"), 9};
        ASSERT_TRUE(c->sendTo("warm", 4, peer));  // queued until B answers
        for (int i = 0; i < 10000 && a_->stats().arpResolved == 0; ++i) { (void)this_fiber::sleep_for(1ms); }
        ASSERT_EQ(a_->stats().arpResolved, 1u);
        std::vector<rte_mbuf*> held;
        rte_mbuf* m = nullptr;
        while (allocPackets(portA_.pool(0), &m, 1)) { held.push_back(m); }  // this carrier's cache and the ring
        const uint64_t before = portA_.stats(0).noMbuf;
        EXPECT_EQ(c->sendTo("x", 1, peer).errorCode(), ENOBUFS);
        uint8_t* payload = nullptr;
        EXPECT_EQ(c->allocDatagram(8, &payload).errorCode(), ENOBUFS);
        EXPECT_EQ(portA_.stats(0).noMbuf, before + 2);
        freePackets(held.data(), static_cast<unsigned>(held.size()));
        EXPECT_TRUE(c->sendTo("x", 1, peer));
        EXPECT_TRUE(c->close());
    }).join();
}

// Sleeps the fiber until `f()` reaches `want` (10 s at most); returns its last value.
uint64_t sleepUntil(const std::function<uint64_t()>& f, uint64_t want) {
    for (int i = 0; i < 10000 && f() < want; ++i) { (void)this_fiber::sleep_for(1ms); }
    return f();
}

// Datagrams to a peer that never answers wait in its queue while the sender goes on; after the
// retries they are dropped and counted, sends fail with EHOSTUNREACH for the hold-down, and then
// the next send asks again.
TEST_F(DpdkStack, AnUnansweredPeerIsUnreachableAfterTheRetries) {
    const Endpoint nobody{ip("198.18.0.99"), 7};
    on(0, [&] {
        auto c = UdpSocket::bind(*a_, 0);
        ASSERT_TRUE(c);
        const auto start = std::chrono::steady_clock::now();
        EXPECT_EQ(c->sendTo("x", 1, nobody).value(), 1u);  // queued, not waited for
        EXPECT_EQ(c->sendTo("y", 1, nobody).value(), 1u);
        EXPECT_EQ(a_->stats().arpQueued, 2u);
        EXPECT_EQ(a_->stats().arpRequestsSent, 1u);  // one request for both
        ASSERT_EQ(sleepUntil([&] { return a_->stats().arpFailed; }, 1), 1u);
        EXPECT_GE(std::chrono::steady_clock::now() - start, 40ms);  // three requests, 20 ms apart
        EXPECT_EQ(a_->stats().arpQueueDropped, 2u);
        EXPECT_EQ(c->sendTo("z", 1, nobody).errorCode(), EHOSTUNREACH);  // the hold-down
        (void)this_fiber::sleep_for(120ms);
        EXPECT_EQ(c->sendTo("z", 1, nobody).value(), 1u);  // after it: asked again, and queued
        // Off the subnet with no gateway; too large; address 0.
        EXPECT_EQ(c->sendTo("x", 1, Endpoint{ip("203.0.113.1"), 7}).errorCode(), ENETUNREACH);
        std::vector<char> big(1473);
        EXPECT_EQ(c->sendTo(big.data(), big.size(), Endpoint{ip("198.18.0.2"), 7}).errorCode(), EMSGSIZE);
        EXPECT_EQ(c->sendTo("x", 1, Endpoint{0, 7}).errorCode(), EINVAL);
        EXPECT_TRUE(c->close());
        // Stopping the interface drops what still waits ("z"); TearDown counts the pool.
        EXPECT_TRUE(a_->stop());
    }).join();
    const InterfaceStats s = a_->stats();
    EXPECT_EQ(s.arpFailed, 1u);
    EXPECT_EQ(s.arpRequestsSent, 4u);
    EXPECT_EQ(s.arpQueued, 3u);
    EXPECT_EQ(s.arpQueueDropped, 3u);
    EXPECT_EQ(s.udpSent, 0u);
    EXPECT_EQ(portA_.stats(0).dropped, 3u);
}

// A peer's queue holds arpQueue datagrams: a longer run drops its oldest, and the reply sends the
// rest in order. All peers' queues together hold arpQueueTotal: beyond, a send gets ENOBUFS.
TEST_F(DpdkStack, TheARPQueueDropsItsOldestAndIsBoundedInAll) {
    constexpr int kSent = 70;  // arpQueue is 64
    auto s = UdpSocket::bind(*b_, 7);  // bound before anything is sent
    ASSERT_TRUE(s);
    auto server = on(1, [&] {
        for (int i = kSent - 64; i < kSent; ++i) {
            char buf[16];
            Endpoint from;
            auto n = s->recvFrom(buf, sizeof(buf), &from, 10s);
            ASSERT_TRUE(n) << n.error().message();
            EXPECT_EQ(std::string(buf, *n), std::to_string(i));
        }
        char buf[16];
        EXPECT_EQ(s->recvFrom(buf, sizeof(buf), nullptr, 50ms).errorCode(), ETIMEDOUT);
        EXPECT_TRUE(s->close());
    });
    on(0, [&] {
        auto c = UdpSocket::bind(*a_, 0);
        ASSERT_TRUE(c);
        // No yield in between: the reply cannot come before the last one is queued.
        for (int i = 0; i < kSent; ++i) {
            const std::string msg = std::to_string(i);
            ASSERT_EQ(c->sendTo(msg.data(), msg.size(), Endpoint{ip("198.18.0.2"), 7}).value(), msg.size());
        }
        EXPECT_EQ(a_->stats().arpQueueDropped, static_cast<uint64_t>(kSent - 64));
        ASSERT_EQ(sleepUntil([&] { return a_->stats().arpResolved; }, 1), 1u);  // B's queue went out
        // 16 silent peers fill the 1,024 places; the 17th gets none.
        for (unsigned peer = 0; peer < 16; ++peer) {
            const Endpoint to{ip(("198.18.0." + std::to_string(peer + 100)).c_str()), 7};
            for (int i = 0; i < 64; ++i) { ASSERT_EQ(c->sendTo("q", 1, to).value(), 1u); }
        }
        EXPECT_EQ(c->sendTo("q", 1, Endpoint{ip("198.18.0.200"), 7}).errorCode(), ENOBUFS);
        EXPECT_TRUE(c->close());
    }).join();
    server.join();
    // The silent peers (the 17th was asked too) are given up and their datagrams freed (TearDown
    // counts the pool).
    constexpr uint64_t kDropped = kSent - 64 + 16 * 64;
    EXPECT_EQ(waitFor([&] { return a_->stats().arpQueueDropped; }, kDropped), kDropped);
    EXPECT_EQ(waitFor([&] { return a_->stats().arpFailed; }, 17), 17u);
    EXPECT_EQ(a_->stats().udpSent, 64u);
}

TEST_F(DpdkStack, SocketErrorsDeadlinesCancelAndClose) {
    auto s = UdpSocket::bind(*b_, 5000);
    ASSERT_TRUE(s);
    EXPECT_EQ(UdpSocket::bind(*b_, 5000).errorCode(), EADDRINUSE);
    char buf[16];
    on(1, [&] { EXPECT_EQ(s->recvFrom(buf, sizeof(buf), nullptr, 10ms).errorCode(), ETIMEDOUT); }).join();
    std::atomic<bool> parked{false};
    auto waiter = on(0, [&] {
        parked = true;
        EXPECT_EQ(s->recvFrom(buf, sizeof(buf), nullptr).errorCode(), ECANCELED);
    });
    while (!parked) { std::this_thread::sleep_for(1ms); }
    std::this_thread::sleep_for(5ms);
    waiter.cancel();
    waiter.join();
    // close() with a receiver parked: it wakes with ECANCELED, and the socket is gone.
    auto waiter2 = on(0, [&] { EXPECT_EQ(s->recvFrom(buf, sizeof(buf), nullptr).errorCode(), ECANCELED); });
    // Parked for sure (a close() before the receive would rightly answer EBADF instead).
    const auto parkedBy = std::chrono::steady_clock::now() + 10s;
    auto suspended = [&] {
        for (const FiberInfo& f : rt().fibers().fibers) {
            if (f.state == "suspended") { return true; }
        }
        return false;
    };
    while (!suspended() && std::chrono::steady_clock::now() < parkedBy) { std::this_thread::sleep_for(1ms); }
    EXPECT_TRUE(s->close());
    waiter2.join();
    EXPECT_EQ(s->close().errorCode(), EBADF);
    EXPECT_EQ(s->recvFrom(buf, sizeof(buf), nullptr).errorCode(), EBADF);
    EXPECT_EQ(s->sendTo("x", 1, Endpoint{ip("198.18.0.1"), 1}).errorCode(), EBADF);
    EXPECT_FALSE(s->isOpen());
    uint8_t* payload = nullptr;
    EXPECT_EQ(s->allocDatagram(4, &payload).errorCode(), EBADF);
    // An interface with a socket bound cannot stop; a stopped one binds nothing.
    auto t = UdpSocket::bind(*b_, 0);
    ASSERT_TRUE(t);
    on(1, [&] { EXPECT_EQ(b_->stop().errorCode(), EBUSY); }).join();
    EXPECT_EQ(b_->carrier(), 1);  // the refused stop left it running
    EXPECT_TRUE(t->close());
    on(1, [&] { EXPECT_TRUE(b_->stop()); }).join();
    EXPECT_EQ(b_->carrier(), -1);
    EXPECT_EQ(UdpSocket::bind(*b_, 0).errorCode(), EBADF);
}

// The runtime shuts down with a receiver parked and the interfaces still running: the receiver
// gets ECANCELED, the carriers detach their pollers on the way out, and the ports then close.
TEST_F(DpdkStack, ARuntimeShutdownEndsParkedReceiversAndLetsThePortsClose) {
    auto s = UdpSocket::bind(*b_, 6000);
    ASSERT_TRUE(s);
    std::atomic<bool> parked{false};
    auto waiter = on(1, [&] {
        parked = true;
        char buf[16];
        EXPECT_EQ(s->recvFrom(buf, sizeof(buf), nullptr).errorCode(), ECANCELED);
    });
    auto c = UdpSocket::bind(*a_, 0);
    ASSERT_TRUE(c);
    on(0, [&] { EXPECT_EQ(c->sendTo("x", 1, Endpoint{ip("198.18.0.99"), 7}).value(), 1u); }).join();  // waits for ARP
    while (!parked) { std::this_thread::sleep_for(1ms); }
    std::this_thread::sleep_for(5ms);
    rt().shutdown();
    waiter.join();
    rt().join();
    EXPECT_EQ(a_->carrier(), -1);
    EXPECT_EQ(b_->carrier(), -1);
    EXPECT_FALSE(portA_.polled(0));
    EXPECT_EQ(UdpSocket::bind(*a_, 0).errorCode(), EBADF);  // its carrier is gone
    EXPECT_EQ(s->sendTo("x", 1, Endpoint{ip("198.18.0.1"), 7}).errorCode(), ENETDOWN);
    EXPECT_TRUE(s->close());
    EXPECT_TRUE(c->close());
    EXPECT_TRUE(a_->stop());  // from a plain thread: nothing is polled any more; the waiting datagram is freed
    EXPECT_EQ(a_->stats().arpQueueDropped, 1u);
    EXPECT_TRUE(b_->stop());
    // TearDown closes the ports and checks every mbuf is back.
}

TEST_F(DpdkStack, PingIsAnsweredAndBadFramesAreCountedNeverAnswered) {
    const InterfaceAddress aAddr = a_->address();
    const InterfaceAddress bAddr = b_->address();
    // An echo request from B's address, built by hand.
    std::vector<uint8_t> echo(kEthernetHeader + kIpv4Header + 16);
    std::vector<uint8_t> udp(kUdpFrameHeaders + 4, 'u');
    ASSERT_GT(buildUdpHeaders(udp, bAddr, aAddr.mac, aAddr.ip, 1, 7, 4, 0), 0u);
    std::memcpy(echo.data(), udp.data(), kEthernetHeader + kIpv4Header);
    uint8_t* h = echo.data() + kEthernetHeader;
    h[3] = static_cast<uint8_t>(kIpv4Header + 16);
    h[9] = 1;
    h[10] = h[11] = 0;
    const uint16_t hc = checksumFinish(checksumAdd(0, {h, kIpv4Header}));
    h[10] = static_cast<uint8_t>(hc >> 8);
    h[11] = static_cast<uint8_t>(hc);
    uint8_t* icmp = h + kIpv4Header;
    icmp[0] = 8;
    std::memset(icmp + 4, 0x42, 12);
    const uint16_t ic = checksumFinish(checksumAdd(0, {icmp, 16}));
    icmp[2] = static_cast<uint8_t>(ic >> 8);
    icmp[3] = static_cast<uint8_t>(ic);
    injectFromB(echo);
    EXPECT_EQ(waitFor([&] { return a_->stats().echoReplies; }, 1), 1u);
    // The reply reaches B, whose stack serves no echo replies: dropped there as unsupported.
    EXPECT_EQ(waitFor([&] { return b_->stats().drops[static_cast<size_t>(DropReason::kUnsupported)]; }, 1), 1u);

    // Bad UDP checksum, a fragment, a frame for another MAC, a runt: counted by reason at A.
    std::vector<uint8_t> bad = udp;
    bad.back() ^= 1;
    injectFromB(bad);
    std::vector<uint8_t> frag = udp;
    frag[kEthernetHeader + 6] |= 0x20;
    frag[kEthernetHeader + 10] = frag[kEthernetHeader + 11] = 0;
    const uint16_t fc = checksumFinish(checksumAdd(0, {frag.data() + kEthernetHeader, kIpv4Header}));
    frag[kEthernetHeader + 10] = static_cast<uint8_t>(fc >> 8);
    frag[kEthernetHeader + 11] = static_cast<uint8_t>(fc);
    injectFromB(frag);
    std::vector<uint8_t> other = udp;
    other[5] ^= 0x10;
    injectFromB(other);
    injectFromB(std::vector<uint8_t>(10, 0));
    auto drops = [&](DropReason r) { return a_->stats().drops[static_cast<size_t>(r)]; };
    EXPECT_EQ(waitFor([&] { return drops(DropReason::kTruncated); }, 1), 1u);
    EXPECT_EQ(drops(DropReason::kBadChecksum), 1u);
    EXPECT_EQ(drops(DropReason::kFragment), 1u);
    EXPECT_EQ(drops(DropReason::kNotForUs), 1u);
    EXPECT_EQ(portA_.stats(0).badChecksum, 1u);
    EXPECT_EQ(a_->stats().udpReceived, 0u);
    // A datagram to a port nobody bound.
    injectFromB(udp);
    EXPECT_EQ(waitFor([&] { return a_->stats().udpNoSocket; }, 1), 1u);
}

class DpdkStackLanes : public DpdkStack {
protected:
    unsigned lanes() const override { return 2; }
};

// Two queues per port, each run by its own carrier: a fiber sends on its carrier's queue, one socket
// hears datagrams from both queues, and a peer one lane learned from an ARP reply is known to the
// other lane without a request of its own.
TEST_F(DpdkStackLanes, EachCarrierSendsOnItsQueueAndOneSocketHearsBoth) {
    constexpr int kEach = testing_support::kSanitized ? 50 : 300;
    auto s = UdpSocket::bind(*b_, 7);
    ASSERT_TRUE(s);
    auto server = on(1, [&] {
        for (int i = 0; i < 2 * kEach; ++i) {
            char buf[64];
            Endpoint from;
            auto n = s->recvFrom(buf, sizeof(buf), &from, 10s);
            ASSERT_TRUE(n) << n.error().message();
            ASSERT_TRUE(s->sendTo(buf, *n, from));
        }
    });
    const auto pingPong = [&](int carrier) {
        on(carrier, [&] {
            auto c = UdpSocket::bind(*a_, 0);
            ASSERT_TRUE(c);
            for (int i = 0; i < kEach; ++i) {
                const std::string msg = std::to_string(carrier) + ":" + std::to_string(i);
                ASSERT_TRUE(c->sendTo(msg.data(), msg.size(), Endpoint{ip("198.18.0.2"), 7}));
                char buf[64];
                Endpoint from;
                auto n = c->recvFrom(buf, sizeof(buf), &from, 10s);
                ASSERT_TRUE(n) << n.error().message();
                EXPECT_EQ(std::string(buf, *n), msg);
            }
            EXPECT_TRUE(c->close());
        }).join();
    };
    pingPong(0);
    EXPECT_EQ(a_->stats().arpRequestsSent, 1u);  // lane 0 asked for B
    std::this_thread::sleep_for(20ms);           // lane 1 reads its mail on its next turn
    pingPong(1);
    server.join();
    EXPECT_TRUE(s->close());
    EXPECT_EQ(a_->stats().arpRequestsSent, 1u);  // lane 1 knew B from lane 0's reply
    EXPECT_EQ(a_->stats().udpSent, static_cast<uint64_t>(2 * kEach));
    EXPECT_EQ(b_->stats().udpReceived, static_cast<uint64_t>(2 * kEach));
    // A's datagrams left on the queue of the carrier that sent them (plus lane 0's ARP request);
    // B's echoes all left on queue 1, where its server runs, and reached A's lane 1, whichever
    // client waited for them.
    EXPECT_EQ(portA_.stats(0).txPackets, static_cast<uint64_t>(kEach + 1));
    EXPECT_GE(portA_.stats(1).txPackets, static_cast<uint64_t>(kEach));  // (and its answer, when B's lane 1
    EXPECT_LE(portA_.stats(1).txPackets, static_cast<uint64_t>(kEach + 1));  // asked before its mail came)
    EXPECT_GE(portB_.stats(1).txPackets, static_cast<uint64_t>(2 * kEach));
    EXPECT_GE(portA_.stats(1).rxPackets, static_cast<uint64_t>(2 * kEach));
}

TEST_F(DpdkStackLanes, QueuesAreCheckedAndEachStartsOnce) {
    const unsigned twice[] = {0, 0};
    EXPECT_EQ(Interface::create(portA_, std::span<const unsigned>(twice), InterfaceOptions{.ip = ip("198.18.0.9")})
                  .errorCode(),
              EINVAL);
    EXPECT_EQ(Interface::create(portA_, std::span<const unsigned>(), InterfaceOptions{.ip = ip("198.18.0.9")})
                  .errorCode(),
              EINVAL);
    const unsigned beyond[] = {0, 2};
    EXPECT_EQ(Interface::create(portA_, std::span<const unsigned>(beyond), InterfaceOptions{.ip = ip("198.18.0.9")})
                  .errorCode(),
              EINVAL);
    on(0, [&] {
        EXPECT_EQ(a_->start().errorCode(), EINVAL);   // which queue? the interface has two
        EXPECT_EQ(a_->start(7).errorCode(), EINVAL);  // not one of its queues
        EXPECT_EQ(a_->start(0).errorCode(), EBUSY);   // running already
    }).join();
    EXPECT_EQ(a_->carrier(0), 0);
    EXPECT_EQ(a_->carrier(1), 1);
    EXPECT_EQ(a_->carrier(7), -1);
    // Not from a plain thread while lanes run; from a fiber on carrier 1 (lane 0 stops on a fiber
    // spawned on carrier 0); then started again.
    EXPECT_EQ(a_->stop().errorCode(), EPERM);
    on(1, [&] { ASSERT_TRUE(a_->stop()); }).join();
    EXPECT_EQ(a_->carrier(0), -1);
    EXPECT_EQ(a_->carrier(1), -1);
    EXPECT_EQ(UdpSocket::bind(*a_, 0).errorCode(), EBADF);
    on(1, [&] {
        ASSERT_TRUE(a_->start(1));
        EXPECT_EQ(a_->start(0).errorCode(), EBUSY);  // carrier 1 runs a lane of this interface already
    }).join();
    EXPECT_EQ(a_->carrier(1), 1);
    EXPECT_EQ(a_->carrier(0), -1);
    EXPECT_FALSE(portA_.polled(0));  // the refused start left queue 0 alone
    auto c = UdpSocket::bind(*a_, 0);
    EXPECT_TRUE(c);
    EXPECT_TRUE(c->close());
}

// Sockets of single queues share a port: each hears only its queue's datagrams, and its carrier
// answers on its own queue, with no datagram crossing carriers.
TEST_F(DpdkStackLanes, SocketsOfSingleQueuesShareAPort) {
    constexpr int kEach = testing_support::kSanitized ? 50 : 300;
    auto s0 = UdpSocket::bind(*b_, 7, 0);
    auto s1 = UdpSocket::bind(*b_, 7, 1);
    ASSERT_TRUE(s0 && s1);
    EXPECT_EQ(UdpSocket::bind(*b_, 7).errorCode(), EADDRINUSE);     // every queue: 7 is taken on both
    EXPECT_EQ(UdpSocket::bind(*b_, 7, 1).errorCode(), EADDRINUSE);  // queue 1's is taken
    EXPECT_EQ(UdpSocket::bind(*b_, 7, 5).errorCode(), EINVAL);      // not a queue of the interface
    {
        auto every = UdpSocket::bind(*b_, 8);
        ASSERT_TRUE(every);
        EXPECT_EQ(UdpSocket::bind(*b_, 8, 0).errorCode(), EADDRINUSE);
        EXPECT_TRUE(every->close());
    }
    const auto serve = [&](int queue, UdpSocket& s) {
        return on(queue, [&, queue] {
            for (int i = 0; i < kEach; ++i) {
                char buf[64];
                Endpoint from;
                auto n = s.recvFrom(buf, sizeof(buf), &from, 10s);
                ASSERT_TRUE(n) << n.error().message();
                EXPECT_EQ(buf[0], static_cast<char>('0' + queue)) << "a datagram of the other queue";
                ASSERT_TRUE(s.sendTo(buf, *n, from));
            }
        });
    };
    auto server0 = serve(0, *s0);
    auto server1 = serve(1, *s1);
    const auto client = [&](int carrier) {
        return on(carrier, [&, carrier] {
            auto c = UdpSocket::bind(*a_, 0, carrier);  // the answers come back on the same queue
            ASSERT_TRUE(c);
            for (int i = 0; i < kEach; ++i) {
                const std::string msg = std::to_string(carrier) + ":" + std::to_string(i);
                ASSERT_TRUE(c->sendTo(msg.data(), msg.size(), Endpoint{ip("198.18.0.2"), 7}));
                char buf[64];
                auto n = c->recvFrom(buf, sizeof(buf), nullptr, 10s);
                ASSERT_TRUE(n) << n.error().message();
                EXPECT_EQ(std::string(buf, *n), msg);
            }
            EXPECT_TRUE(c->close());
        });
    };
    auto c0 = client(0);
    auto c1 = client(1);
    c0.join();
    c1.join();
    server0.join();
    server1.join();
    // Each queue carried its client's datagrams, and at most one ARP request of A's lane there.
    for (unsigned q = 0; q < 2; ++q) {
        EXPECT_GE(portB_.stats(q).rxPackets, static_cast<uint64_t>(kEach));
        EXPECT_LE(portB_.stats(q).rxPackets, static_cast<uint64_t>(kEach + 1));
    }
    EXPECT_TRUE(s0->close());
    EXPECT_EQ(UdpSocket::bind(*b_, 7).errorCode(), EADDRINUSE);  // queue 1's socket still holds it
    EXPECT_TRUE(s1->close());
    auto again = UdpSocket::bind(*b_, 7);
    EXPECT_TRUE(again);
    EXPECT_TRUE(again->close());
}

}  // namespace
}  // namespace spindle::dpdk
