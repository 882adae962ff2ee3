// SPDX-License-Identifier: Apache-2.0
// spindle-dpdk-forward: a packet forwarder on one spindle fiber, for the per-packet floor of the
// DPDK path: two ports (net_null by default), every burst received on one transmitted on the other,
// both ways, as dpdk-testpmd's io forwarding does. Prints packets forwarded per second.
//
//   spindle-dpdk-forward [--port-a net_null0] [--port-b net_null1] [--duration 5] [--burst 32]
//
// Exit status: 0 done; 1 a set-up error; 2 a bad flag value.

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <string>

#include <rte_mbuf.h>

#include "apps/common/cli.h"
#include "core/fiber.h"
#include "core/runtime.h"
#include "net/dpdk/eal.h"
#include "net/dpdk/mbuf.h"
#include "net/dpdk/port.h"

namespace {

// Moves one burst from `from` to `to`; frees what `to` refuses. Returns the packets received.
uint16_t forwardOnce(spindle::dpdk::Port& from, spindle::dpdk::Port& to, uint16_t burst) noexcept {
    rte_mbuf* pkts[spindle::dpdk::Port::kBurst];
    const uint16_t n = from.receive(0, pkts, burst);
    if (n == 0) { return 0; }
    const uint16_t sent = to.transmit(0, pkts, n);
    if (sent < n) { spindle::dpdk::freePackets(pkts + sent, static_cast<unsigned>(n - sent)); }
    return n;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"spindle-dpdk-forward: forward packets between two DPDK ports on one spindle fiber"};
    std::string portA = "net_null0";
    std::string portB = "net_null1";
    double duration = 5;
    unsigned burst = 32;
    unsigned memoryMb = 512;
    app.add_option("--port-a", portA, "first port (vdev string or PCI address)")->capture_default_str();
    app.add_option("--port-b", portB, "second port")->capture_default_str();
    app.add_option("--duration", duration, "seconds to forward")->check(spindle::apps::realRange(0.01, 3600.0));
    app.add_option("--burst", burst, "packets per receive call")->check(CLI::Range(1u, 32u));
    app.add_option("--dpdk-memory-mb", memoryMb, "EAL memory without hugepages, MB")->check(CLI::Range(64u, 65536u));
    if (auto status = spindle::apps::parseCommandLine(app, argc, argv)) { return *status; }
    spindle::dpdk::EalOptions eal;
    eal.memoryMb = memoryMb;
    std::string why;
    if (!spindle::dpdk::startEal(eal, &why)) {
        std::fprintf(stderr, "spindle-dpdk-forward: %s\n", why.c_str());
        return 1;
    }
    spindle::RuntimeOptions ro;
    ro.carriers = 1;
    ro.fixedBufferCount = 0;
    auto rt = spindle::Runtime::start(ro);
    if (!rt) {
        std::fprintf(stderr, "spindle-dpdk-forward: the runtime did not start: %s\n", rt.error().message().c_str());
        return 1;
    }
    int rc = 0;
    {
        auto a = spindle::dpdk::Port::open(portA, {}, &why);
        auto b = a ? spindle::dpdk::Port::open(portB, {}, &why) : spindle::Result<spindle::dpdk::Port>(spindle::Error{EINVAL});
        if (!a || !b) {
            std::fprintf(stderr, "spindle-dpdk-forward: %s\n", why.c_str());
            rc = 1;
        } else {
            auto f = rt->spawn(
                [&]() noexcept -> uint64_t {
                    if (!spindle::dpdk::registerThread()) { return 0; }  // per-lcore mempool caches
                    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(duration);
                    uint64_t packets = 0;
                    for (unsigned turn = 0;; ++turn) {
                        packets += forwardOnce(*a, *b, static_cast<uint16_t>(burst));
                        packets += forwardOnce(*b, *a, static_cast<uint16_t>(burst));
                        if ((turn & 1023) == 0) {
                            if (std::chrono::steady_clock::now() >= end) { break; }
                            spindle::this_fiber::yield();  // the carrier's maintenance, other fibers
                        }
                    }
                    spindle::dpdk::unregisterThread();
                    return packets;
                },
                spindle::SpawnOptions{.name = "forward", .carrier = 0, .pinned = true});
            if (!f) {
                rc = 1;
            } else {
                const auto t0 = std::chrono::steady_clock::now();
                const uint64_t packets = f->join();
                const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
                std::printf("packets=%llu seconds=%.3f pps=%.0f burst=%u\n", static_cast<unsigned long long>(packets), secs,
                            static_cast<double>(packets) / secs, burst);
            }
            (void)a->close();
            (void)b->close();
        }
    }
    rt->shutdown();
    rt->join();
    return rc;
}
