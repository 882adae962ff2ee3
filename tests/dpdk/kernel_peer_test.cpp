// SPDX-License-Identifier: Apache-2.0
// spindle's DPDK stack against the kernel's own: a net_tap port (and, second variant, a net_af_packet
// port on a veth pair) whose kernel end sits in a network namespace the test creates, with an
// address in 198.18.0.0/15 (nothing leaves the namespace). The kernel's ping is answered, a kernel
// UDP socket gets every datagram echoed byte for byte, the kernel's ARP cache learns spindle's MAC,
// and bad frames sent from the kernel side through a raw socket are counted and never answered
// while the echo keeps serving. Needs root, ip(8), ping, ethtool and python3; skips, saying which, without.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "core/fiber.h"
#include "net/dpdk/eal.h"
#include "tests/dpdk/test_eal.h"
#include "net/dpdk/port.h"
#include "net/dpdk/stack.h"
#include "tests/core/with_runtime.h"

namespace spindle::dpdk {
namespace {

using namespace std::chrono_literals;

// Runs `cmd` through the shell; returns its exit status and, in `*out`, what it printed.
int run(const std::string& cmd, std::string* out = nullptr) {
    std::FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
    if (p == nullptr) { return -1; }
    std::string text;
    std::array<char, 512> buf{};
    while (std::fgets(buf.data(), buf.size(), p) != nullptr) { text += buf.data(); }
    const int status = ::pclose(p);
    if (out != nullptr) { *out = text; }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// The ways the kernel's end is reached: a net_tap port (with one queue, or two run by two carriers,
// the kernel's tap spreading the flows over them), or net_af_packet on a veth pair.
enum class Kind { kTap, kTapTwoQueues, kAfPacket };

std::string missingPrerequisite(Kind kind) {
#if defined(SPINDLE_TSAN)
    // Under TSan, over net_tap only, spindle's UDP echo (a 43-byte frame) is added to the kernel
    // tap's RX bytes but never reaches the namespace's packet sockets or IP (InReceives does not
    // count it), while ping through the same tap works, and the same test over net_af_packet on a
    // veth passes. Not understood yet: see issue 15's note.
    if (kind != Kind::kAfPacket) { return "net_tap not under TSan (the kernel never takes the UDP echo there)"; }
#else
    (void)kind;
#endif
    if (::geteuid() != 0) { return "not root (network namespaces and taps need CAP_NET_ADMIN)"; }
    if (::access("/dev/net/tun", R_OK | W_OK) != 0) { return "no /dev/net/tun"; }
    for (const char* tool : {"ip", "ping", "python3", "ethtool"}) {
        if (run(std::string("command -v ") + tool) != 0) { return std::string(tool) + " is not installed"; }
    }
    return "";
}

// The datagram exchange and the raw bad frames, as python3 run inside the namespace.
constexpr const char* kUdpCheck = R"PY(
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(2)
ok = 0
for i in range(200):
    m = bytes((i * 7 + k) & 0xff for k in range(1 + (i * 37) % 1400))
    s.sendto(m, ('198.18.0.1', 7))
    d, a = s.recvfrom(2048)
    ok += (d == m and a == ('198.18.0.1', 7))
print('echoed', ok)
sys.exit(0 if ok == 200 else 1)
)PY";

// 16 flows (source ports) of 10 datagrams each, every one echoed byte for byte.
constexpr const char* kUdpFlows = R"PY(
import socket, sys
ok = 0
for flow in range(16):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(2)
    for i in range(10):
        m = b'flow %d datagram %d' % (flow, i)
        s.sendto(m, ('198.18.0.1', 7))
        d, a = s.recvfrom(2048)
        ok += (d == m)
print('echoed', ok)
sys.exit(0 if ok == 160 else 1)
)PY";

// Frames through a raw socket on the kernel's end (argv[1]) to spindle's MAC (argv[2]): each is
// bad in one way. Then listens briefly: nothing may come back for them.
constexpr const char* kBadFrames = R"PY(
import socket, struct, sys, time
iface, dst = sys.argv[1], bytes.fromhex(sys.argv[2].replace(':', ''))
r = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0800)); r.bind((iface, 0))
src = r.getsockname()[4][:6]
us, them = bytes([198,18,0,2]), bytes([198,18,0,1])
def csum(b):
    if len(b) % 2: b += b'\0'
    s = sum(struct.unpack('!%dH' % (len(b) // 2), b))
    while s >> 16: s = (s & 0xffff) + (s >> 16)
    return ~s & 0xffff
def ip(payload, proto=17, frag=0x4000, opts=b'', good=True, total=None):
    ihl = (20 + len(opts)) // 4
    tl = total if total is not None else 20 + len(opts) + len(payload)
    h = struct.pack('!BBHHHBBH4s4s', 0x40 | ihl, 0, tl, 1, frag, 64, proto, 0, us, them) + opts
    c = csum(h) if good else 0x1234
    return h[:10] + struct.pack('!H', c) + h[12:] + payload
def udp(data, good=True, length=None):
    L = length if length is not None else 8 + len(data)
    c = csum(us + them + struct.pack('!BBH', 0, 17, L) + struct.pack('!HHHH', 40000, 7, L, 0) + data) or 0xffff
    return struct.pack('!HHHH', 40000, 7, L, c if good else c ^ 0x0f0f) + data
eth = dst + src + b'\x08\x00'
d = b'bad frame'
frames = [
    eth + ip(udp(d))[:25],                                  # truncated IP header
    eth + ip(udp(d), good=False),                           # bad IP checksum
    eth + ip(udp(d, good=False)),                           # bad UDP checksum
    eth + ip(udp(d), frag=0x2000),                          # a fragment
    eth + ip(udp(d, length=8 + len(d) - 2)),                # UDP length != IP length
    b'\x02\x00\x00\x00\x00\x99' + src + b'\x08\x00' + ip(udp(d)),  # another MAC
    eth + ip(udp(d), total=200),                            # IP total length beyond the frame
]
for f in frames: r.send(f)
r.settimeout(0.3)
back = 0
try:
    while True:
        f = r.recv(2048)
        if f[6:12] == dst and f[12:14] == b'\x08\x00' and f[23] == 17: back += 1
except socket.timeout:
    pass
# IP options are valid: that datagram is echoed (the kernel socket below is not bound; count it raw).
r.send(eth + ip(udp(b'with options'), opts=b'\x01\x01\x01\x00'))
r.settimeout(1)
echoed = False
try:
    while not echoed:
        f = r.recv(2048)
        echoed = f[6:12] == dst and f[-12:] == b'with options'
except socket.timeout:
    pass
print('answered-bad', back, 'echoed-options', echoed)
sys.exit(0 if back == 0 and echoed else 1)
)PY";

class DpdkKernelPeer : public testing_support::WithRuntime, public ::testing::WithParamInterface<Kind> {
protected:
    void SetUp() override {
        if (const std::string why = missingPrerequisite(GetParam()); !why.empty()) { GTEST_SKIP() << why; }
        if (const std::string why = testing_support::startTestEal(); !why.empty()) {
            GTEST_SKIP() << "DPDK cannot initialise here: " << why;
        }
        WithRuntime::SetUp();
        const std::string tag = std::to_string(::getpid() % 100000);
        ns_ = "spindle-t" + tag;
        kernelIf_ = "spk" + tag;
        ASSERT_EQ(run("ip netns add " + ns_), 0);
        std::string device;
        if (GetParam() != Kind::kAfPacket) {
            device = "net_tap" + tag + ",iface=" + kernelIf_;
        } else {
            const std::string ours = "spd" + tag;
            ASSERT_EQ(run("ip link add " + ours + " type veth peer name " + kernelIf_), 0);
            ASSERT_EQ(run("ip link set " + ours + " up"), 0);
            vethOurs_ = ours;
            device = "net_af_packet" + tag + ",iface=" + ours;
        }
        std::string why;
        PortOptions po;
        po.queues = GetParam() == Kind::kTapTwoQueues ? 2 : 1;
        auto p = Port::open(device, po, &why);
        ASSERT_TRUE(p) << why;
        port_ = std::move(*p);
        ASSERT_EQ(port_.queues(), po.queues);
        // The kernel's end goes into the namespace, with 198.18.0.2; spindle is 198.18.0.1.
        ASSERT_EQ(run("ip link set " + kernelIf_ + " netns " + ns_), 0);
        ASSERT_EQ(run(inNs("ip addr add 198.18.0.2/24 dev " + kernelIf_)), 0);
        ASSERT_EQ(run(inNs("ip link set " + kernelIf_ + " up")), 0);
        if (GetParam() == Kind::kAfPacket) {
            // A veth hands the kernel's UDP checksums to the other end unfinished (CHECKSUM_PARTIAL),
            // and net_af_packet does not pass that on: make the kernel finish them.
            std::string out;
            ASSERT_EQ(run(inNs("ethtool -K " + kernelIf_ + " tx off"), &out), 0) << out;
        }
        InterfaceOptions o;
        in_addr ours{};
        ASSERT_EQ(::inet_pton(AF_INET, "198.18.0.1", &ours), 1);
        o.ip = ours.s_addr;
        std::vector<unsigned> queues;
        for (unsigned q = 0; q < port_.queues(); ++q) { queues.push_back(q); }
        auto i = Interface::create(port_, queues, o);
        ASSERT_TRUE(i);
        iface_ = std::move(*i);
        // Queue q on carrier q, each with its own socket on port 7 and an echo fiber beside it.
        for (const unsigned q : queues) {
            const int c = static_cast<int>(q);
            on(c, [&] { ASSERT_TRUE(iface_->start(q)); }).join();
            echoes_.push_back(on(c, [this, q, single = queues.size() == 1] {
                auto s = UdpSocket::bind(*iface_, 7, single ? -1 : static_cast<int>(q));
                ASSERT_TRUE(s);
                char buf[2048];
                for (;;) {
                    Endpoint from;
                    auto n = s->recvFrom(buf, sizeof(buf), &from);
                    if (!n) { break; }
                    (void)s->sendTo(buf, *n, from);
                }
                EXPECT_TRUE(s->close());
            }));
        }
    }

    void TearDown() override {
        for (auto& e : echoes_) {
            e.cancel();
            e.join();
        }
        if (iface_) { on(0, [&] { EXPECT_TRUE(iface_->stop()); }).join(); }
        iface_.reset();
        if (port_.isOpen()) { EXPECT_TRUE(port_.close()); }
        if (!ns_.empty()) { (void)run("ip netns del " + ns_); }
        if (!vethOurs_.empty()) { (void)run("ip link del " + vethOurs_); }
        if (runtime_) { WithRuntime::TearDown(); }
    }

    std::string inNs(const std::string& cmd) const { return "ip netns exec " + ns_ + " " + cmd; }
    std::string statsText() const {
        const InterfaceStats s = iface_->stats();
        std::string t = "udp received " + std::to_string(s.udpReceived) + ", sent " + std::to_string(s.udpSent) +
                        ", no socket " + std::to_string(s.udpNoSocket) + ", queue full " + std::to_string(s.udpQueueFull);
        for (size_t r = 1; r < static_cast<size_t>(DropReason::kCount); ++r) {
            t += ", " + std::string(dropReasonName(static_cast<DropReason>(r))) + " " + std::to_string(s.drops[r]);
        }
        for (unsigned i = 0; i < port_.queues(); ++i) {
            const QueueStats q = port_.stats(i);
            t += "; queue " + std::to_string(i) + " rx " + std::to_string(q.rxPackets) + " tx " +
                 std::to_string(q.txPackets) + " dropped " + std::to_string(q.dropped) + " no-mbuf " +
                 std::to_string(q.noMbuf);
        }
        return t;
    }
    std::string macText() const {
        const auto m = port_.mac();
        char s[18];
        std::snprintf(s, sizeof s, "%02x:%02x:%02x:%02x:%02x:%02x", m[0], m[1], m[2], m[3], m[4], m[5]);
        return s;
    }

    std::string ns_;
    std::string kernelIf_;
    std::string vethOurs_;
    Port port_;
    std::unique_ptr<Interface> iface_;
    std::vector<FiberHandle<void>> echoes_;
};

TEST_P(DpdkKernelPeer, PingUdpAndArpWorkWithTheKernelsStack) {
    std::string out;
    EXPECT_EQ(run(inNs("ping -c 3 -i 0.2 -W 2 198.18.0.1"), &out), 0) << out;
    EXPECT_GE(iface_->stats().echoReplies, 3u);
    const std::string script = "/tmp/spindle-udp-check-" + std::to_string(::getpid()) + ".py";
    {
        std::FILE* f = std::fopen(script.c_str(), "w");
        ASSERT_NE(f, nullptr);
        std::fputs(kUdpCheck, f);
        std::fclose(f);
    }
    EXPECT_EQ(run(inNs("python3 " + script), &out), 0) << out << statsText();
    std::remove(script.c_str());
    EXPECT_EQ(run(inNs("ip neigh show 198.18.0.1 dev " + kernelIf_), &out), 0);
    EXPECT_NE(out.find(macText()), std::string::npos) << "the kernel's ARP cache: " << out;
    EXPECT_GE(iface_->stats().arpRequestsAnswered, 1u);
    if (GetParam() == Kind::kTapTwoQueues) {
        // 16 flows: the kernel's tap spreads them over both queues (all on one: 2 in 65,536), and
        // each queue's carrier answers its own.
        const std::string flows = "/tmp/spindle-udp-flows-" + std::to_string(::getpid()) + ".py";
        std::FILE* f = std::fopen(flows.c_str(), "w");
        ASSERT_NE(f, nullptr);
        std::fputs(kUdpFlows, f);
        std::fclose(f);
        const uint64_t before[2] = {port_.stats(0).rxPackets, port_.stats(1).rxPackets};
        EXPECT_EQ(run(inNs("python3 " + flows), &out), 0) << out << statsText();
        std::remove(flows.c_str());
        EXPECT_GT(port_.stats(0).rxPackets, before[0]) << statsText();
        EXPECT_GT(port_.stats(1).rxPackets, before[1]) << statsText();
    }
}

TEST_P(DpdkKernelPeer, BadFramesFromTheKernelSideAreCountedAndNeverAnswered) {
    const std::string script = "/tmp/spindle-bad-frames-" + std::to_string(::getpid()) + ".py";
    {
        std::FILE* f = std::fopen(script.c_str(), "w");
        ASSERT_NE(f, nullptr);
        std::fputs(kBadFrames, f);
        std::fclose(f);
    }
    std::string out;
    EXPECT_EQ(run(inNs("python3 " + script + " " + kernelIf_ + " " + macText()), &out), 0) << out << statsText();
    std::remove(script.c_str());
    const InterfaceStats s = iface_->stats();
    auto drops = [&](DropReason r) { return s.drops[static_cast<size_t>(r)]; };
    EXPECT_GE(drops(DropReason::kTruncated), 2u);  // the cut header, the total length beyond the frame
    EXPECT_GE(drops(DropReason::kBadChecksum), 2u);
    if (GetParam() != Kind::kAfPacket) {
        // net_af_packet joins a fanout group with PACKET_FANOUT_FLAG_DEFRAG: the kernel reassembles
        // fragments before the port sees them, and holds a lone first fragment until it expires.
        EXPECT_GE(drops(DropReason::kFragment), 1u);
    }
    EXPECT_GE(drops(DropReason::kMalformed), 1u);
    // And the server still serves.
    EXPECT_EQ(run(inNs("ping -c 1 -W 2 198.18.0.1"), &out), 0) << out;
}

INSTANTIATE_TEST_SUITE_P(Ports, DpdkKernelPeer, ::testing::Values(Kind::kTap, Kind::kTapTwoQueues, Kind::kAfPacket),
                         [](const ::testing::TestParamInfo<Kind>& i) {
                             return i.param == Kind::kTap             ? std::string("Tap")
                                    : i.param == Kind::kTapTwoQueues ? std::string("TapTwoQueues")
                                                                     : std::string("AfPacketOnVeth");
                         });

}  // namespace
}  // namespace spindle::dpdk
