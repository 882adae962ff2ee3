// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The UDP echo behind `spindle-echo --udp`, over kernel sockets (through the carriers' I/O driver)
/// or, with `--dpdk`, over spindle's DPDK stack; and the client that measures either, with the same
/// logic for both.
///
/// Server: fibers that receive a datagram and send it back to its sender, unchanged. Kernel: one
/// socket per carrier with SO_REUSEPORT, one pinned fiber each. DPDK: one fiber pinned on the
/// interface's carrier.
/// Client: `window` fibers, each with a socket of its own, keeps one datagram outstanding: it sends
/// `messageSize` bytes that carry its index and a sequence number, waits for the echo, checks it
/// byte for byte, and times the round trip. A datagram not echoed within `timeout` is counted lost
/// and the fiber goes on with the next; an echo of an earlier, lost datagram is counted stale and
/// skipped. Round trips that end inside [warm-up end, warm-up end + duration] are measured.
/// Errors: the start functions return bind's and spawn's errors; runUdpClient returns EINVAL for a
/// window of 0 or a message size outside 16..1472 bytes, else a report (ok() false when a fiber
/// failed on something other than a loss).
/// Thread-safety: each object from one thread; the stop functions from a plain thread.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/histogram.h"
#include "base/result.h"
#include "core/fiber.h"
#include "core/runtime.h"
#include "net/address.h"

#if defined(SPINDLE_HAVE_DPDK)
#include "net/dpdk/stack.h"
#endif

namespace spindle::echo {

inline constexpr size_t kUdpMinMessage = 16;    // index and sequence number
inline constexpr size_t kUdpMaxMessage = 1472;  // a 1500-byte MTU's UDP payload

struct UdpClientOptions {
    unsigned window = 1;            // client fibers, one datagram outstanding each
    size_t messageSize = 64;
    std::chrono::nanoseconds warmup = std::chrono::seconds(1);
    std::chrono::nanoseconds duration = std::chrono::seconds(5);
    std::chrono::milliseconds timeout{200};  // an echo later than this counts as lost
    int carrier = -1;               // where the client fibers run (-1: spread over the carriers)
};

struct UdpReport {
    unsigned window = 0;
    size_t messageSize = 0;
    uint64_t messages = 0;       // round trips measured
    uint64_t totalMessages = 0;  // every round trip, warm-up included
    uint64_t lost = 0;           // datagrams never echoed within the timeout
    uint64_t stale = 0;          // echoes of datagrams already counted lost
    uint64_t mismatches = 0;     // echoes that differ from what was sent
    uint64_t errors = 0;         // fibers ended by another error
    double seconds = 0;
    LogLinearHistogram latency;  // ns
    std::string firstError;

    [[nodiscard]] bool ok() const noexcept { return errors == 0 && mismatches == 0; }
    [[nodiscard]] double messagesPerSecond() const noexcept {
        return seconds > 0 ? static_cast<double>(messages) / seconds : 0.0;
    }
};

/// One line of key=value pairs (as the TCP client's report), with `extra` appended.
[[nodiscard]] std::string formatUdpReport(const UdpReport& r, const std::string& extra = {});

/// A running echo; stop() ends its fibers and waits for them (from a plain thread).
class UdpEchoServer {
public:
    virtual ~UdpEchoServer() = default;
    virtual void stop() noexcept = 0;
    [[nodiscard]] virtual uint64_t echoed() const noexcept = 0;
};

/// Kernel sockets on `address` (port 0: one the kernel picks, then see boundPort), one per carrier,
/// or one on `carrier` when it is >= 0.
[[nodiscard]] Result<std::unique_ptr<UdpEchoServer>> startKernelUdpEcho(Runtime& rt, const net::SocketAddress& address,
                                                                        uint16_t* boundPort = nullptr, int carrier = -1);
/// The client over kernel sockets, to `server`.
[[nodiscard]] Result<UdpReport> runKernelUdpClient(Runtime& rt, const net::SocketAddress& server,
                                                   const UdpClientOptions& options);

#if defined(SPINDLE_HAVE_DPDK)
/// The echo on `iface` (every queue started), port `port`: one socket and fiber per queue, on the
/// carrier polling it. Errors: ENETDOWN for a queue not running; as UdpSocket::bind and spawn.
[[nodiscard]] Result<std::unique_ptr<UdpEchoServer>> startDpdkUdpEcho(Runtime& rt, dpdk::Interface& iface, uint16_t port);
/// The client on `iface` (every queue started), to `server`; its fibers spread over the carriers
/// polling the interface's queues.
[[nodiscard]] Result<UdpReport> runDpdkUdpClient(Runtime& rt, dpdk::Interface& iface, const dpdk::Endpoint& server,
                                                 const UdpClientOptions& options);
#endif

}  // namespace spindle::echo
