// SPDX-License-Identifier: Apache-2.0
// Resource limits: accept under EMFILE (RLIMIT_NOFILE lowered) backs off and recovers, and one
// carrier holds 5,000 concurrent connections with both ends in this process.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <vector>

#include "core/runtime.h"
#include "net/tcp.h"
#include "tests/core/with_runtime.h"

namespace spindle::net {
namespace {

using namespace std::chrono_literals;

size_t openFds() {
    size_t n = 0;
    if (DIR* d = ::opendir("/proc/self/fd")) {
        while (::readdir(d) != nullptr) { ++n; }
        ::closedir(d);
    }
    return n - 3;  // ".", ".." and the directory's own descriptor
}

// Sets the soft RLIMIT_NOFILE for its life and restores it after.
class SoftFdLimit {
public:
    explicit SoftFdLimit(rlim_t soft) {
        ::getrlimit(RLIMIT_NOFILE, &saved_);
        rlimit r = saved_;
        r.rlim_cur = std::min(soft, saved_.rlim_max);
        ok_ = ::setrlimit(RLIMIT_NOFILE, &r) == 0;
    }
    ~SoftFdLimit() { ::setrlimit(RLIMIT_NOFILE, &saved_); }
    [[nodiscard]] bool ok() const { return ok_; }
    [[nodiscard]] rlim_t granted() const {
        rlimit r{};
        ::getrlimit(RLIMIT_NOFILE, &r);
        return r.rlim_cur;
    }

private:
    rlimit saved_{};
    bool ok_ = false;
};

// Opens /dev/null until the process is out of descriptors (RLIMIT_NOFILE bounds descriptor numbers,
// so free slots below the limit must be filled too) and returns them, to be closed one at a time.
std::vector<int> fillDescriptorTable() {
    std::vector<int> held;
    while (true) {
        const int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (fd < 0) { break; }
        held.push_back(fd);
    }
    return held;
}

class Limits : public testing_support::WithRuntime {};

TEST_F(Limits, AcceptUnderEmfileBacksOffAndRecoversWhenDescriptorsFree) {
    for (bool multishot : {true, false}) {
        onFiber([&] {
            auto l = TcpListener::bind(SocketAddress::ipv4Loopback(0),
                                       ListenOptions{.multishot = multishot, .backoffMin = 1ms, .backoffMax = 8ms});
            ASSERT_TRUE(l);
            constexpr int kClients = 3;
            std::vector<TcpStream> clients;
            for (int i = 0; i < kClients; ++i) {
                auto c = TcpStream::connect(l->localAddress(), 5s);
                ASSERT_TRUE(c);
                clients.push_back(std::move(*c));
            }
            std::vector<TcpStream> accepted;
            {
                // No descriptor left: every accept now fails with EMFILE inside the kernel. The
                // /dev/null descriptors are closed one at a time, each making room for one accepted connection.
                SoftFdLimit limit(openFds() + kClients);
                ASSERT_TRUE(limit.ok());
                std::vector<int> spare = fillDescriptorTable();
                ASSERT_GE(spare.size(), static_cast<size_t>(kClients));
                auto acceptor = spawn([&] {
                    for (int i = 0; i < kClients; ++i) {
                        auto s = l->accept(10s);
                        EXPECT_TRUE(s) << s.error().message();
                        if (!s) { return; }
                        accepted.push_back(std::move(*s));
                    }
                }).value();
                for (int fd : spare) {
                    if (accepted.size() < static_cast<size_t>(kClients)) {
                        (void)this_fiber::sleep_for(30ms);  // long enough for several failed tries
                    }
                    ::close(fd);
                }
                acceptor.join();
            }
            EXPECT_EQ(accepted.size(), static_cast<size_t>(kClients));
            EXPECT_GT(l->stats().resourceBackoffs, 0u) << "accept never met EMFILE";
            EXPECT_EQ(l->stats().accepted, static_cast<uint64_t>(kClients));
            // Every accepted connection is a working one.
            for (int i = 0; i < kClients; ++i) {
                ASSERT_TRUE(clients[static_cast<size_t>(i)].writeAll("k", 1));
                char b = 0;
                ASSERT_TRUE(accepted[static_cast<size_t>(i)].readExact(&b, 1, 5s));
            }
        });
    }
}

TEST_F(Limits, AcceptUnderEmfileHonoursItsDeadline) {
    onFiber([] {
        auto l = TcpListener::bind(SocketAddress::ipv4Loopback(0), ListenOptions{.backoffMin = 1ms, .backoffMax = 4ms});
        ASSERT_TRUE(l);
        auto c = TcpStream::connect(l->localAddress(), 5s);
        ASSERT_TRUE(c);
        SoftFdLimit limit(openFds());
        ASSERT_TRUE(limit.ok());
        std::vector<int> held = fillDescriptorTable();
        auto s = l->accept(60ms);
        for (int fd : held) { ::close(fd); }
        ASSERT_FALSE(s);
        EXPECT_EQ(s.errorCode(), ETIMEDOUT);
        EXPECT_GT(l->stats().resourceBackoffs, 0u);
    });
}

TEST(LimitsOneCarrier, FiveThousandConcurrentConnections) {
    constexpr int kConns = 5000;
    SoftFdLimit limit(2 * kConns + 200);
    if (limit.granted() < 2 * kConns + 100) { GTEST_SKIP() << "RLIMIT_NOFILE hard limit below " << 2 * kConns + 100; }
    RuntimeOptions o = testing_support::withCarriers(1);
    auto rt = Runtime::start(o);
    ASSERT_TRUE(rt);
    std::atomic<int> served{0};
    std::atomic<int> clientsOk{0};
    std::atomic<int> errors{0};
    auto main = rt->spawn([&] {
        auto l = TcpListener::bind(SocketAddress::ipv4Loopback(0));
        SPINDLE_CHECK(static_cast<bool>(l));
        const SocketAddress addr = l->localAddress();
        // Server: one fiber per connection echoes 8 bytes, then waits for the client to close.
        auto acceptor = spawn([&] {
            for (int i = 0; i < kConns; ++i) {
                auto s = l->accept(60s);
                if (!s) {
                    errors.fetch_add(1);
                    return;
                }
                (void)spawn([conn = std::move(*s), &served, &errors]() mutable {
                    char buf[8];
                    if (!conn.readExact(buf, 8, 60s) || !conn.writeAll(buf, 8, 60s)) {
                        errors.fetch_add(1);
                        return;
                    }
                    served.fetch_add(1);
                    char end;
                    auto r = conn.recv(&end, 1, 60s);  // held open until the client closes
                    if (!r || *r != 0) { errors.fetch_add(1); }
                }, SpawnOptions{.stackSize = 16 * 1024});
            }
        }).value();
        // Clients: all connect and exchange, and none closes before every one is through.
        std::vector<FiberHandle<void>> clients;
        std::atomic<bool> release{false};
        clients.reserve(kConns);
        for (int i = 0; i < kConns; ++i) {
            clients.push_back(spawn([&, i] {
                auto c = TcpStream::connect(addr, 60s);
                if (!c) {
                    errors.fetch_add(1);
                    return;
                }
                char msg[8];
                std::memcpy(msg, &i, sizeof(i));
                std::memcpy(msg + 4, &i, sizeof(i));
                char back[8];
                if (!c->writeAll(msg, 8, 60s) || !c->readExact(back, 8, 60s) || std::memcmp(msg, back, 8) != 0) {
                    errors.fetch_add(1);
                    return;
                }
                clientsOk.fetch_add(1);
                while (!release.load()) { (void)this_fiber::sleep_for(5ms); }
            }, SpawnOptions{.stackSize = 16 * 1024}).value());
        }
        while (clientsOk.load() + errors.load() < kConns) { (void)this_fiber::sleep_for(5ms); }
        EXPECT_EQ(served.load(), clientsOk.load());
        release.store(true);
        for (auto& c : clients) { c.join(); }
        acceptor.join();
    });
    ASSERT_TRUE(main);
    main->join();
    rt->waitIdle();
    EXPECT_EQ(errors.load(), 0);
    EXPECT_EQ(clientsOk.load(), kConns);
    EXPECT_EQ(served.load(), kConns);
}

}  // namespace
}  // namespace spindle::net
