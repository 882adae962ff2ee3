// SPDX-License-Identifier: Apache-2.0
// How a send leaves: a direct send(2) when the fiber is all its carrier has to do (on the epoll
// backend, always), the ring when other fibers are ready (batching), the driver when the socket is
// full; cancellation and past deadlines behave the same on every path.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "core/fiber.h"
#include "core/ring_ops.h"
#include "net/tcp.h"
#include "tests/core/with_runtime.h"
#include "tests/net/loopback_pair.h"

namespace spindle::net {
namespace {

using namespace std::chrono_literals;

using testing_support::connectLoopbackPair;
using testing_support::LoopbackPair;

class SendPath : public testing_support::WithRuntime {
protected:
    uint64_t sqesOn(unsigned carrier) { return rt().stats().at(carrier).sqesSubmitted; }
};

// `write(data, size, &sent)` of 8 MiB to a socket nobody reads, with a 100 ms limit: ETIMEDOUT after
// at least 90 ms (the clock's granularity), part of it sent.
template <class Write>
void expectAFullSocketTimesOut(Write write) {
    const std::vector<char> big(8 << 20, 'x');
    size_t sent = 0;
    const auto t0 = std::chrono::steady_clock::now();
    const Result<void> r = write(big.data(), big.size(), &sent);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.errorCode(), ETIMEDOUT);
    EXPECT_GT(sent, 0u);
    EXPECT_LT(sent, big.size());
    EXPECT_GE(std::chrono::steady_clock::now() - t0, 90ms);
}

TEST_F(SendPath, CarrierOtherwiseIdleSeesReadyFibersAndIsFalseOffFiber) {
    EXPECT_FALSE(carrierOtherwiseIdle());
    on(0, [&] {
        EXPECT_TRUE(carrierOtherwiseIdle());
        std::atomic<bool> ran{false};
        auto sibling = on(0, [&] { ran.store(true); });  // ready on this carrier, not run yet
        EXPECT_FALSE(carrierOtherwiseIdle());
        sibling.join();
        EXPECT_TRUE(ran.load());
        EXPECT_TRUE(carrierOtherwiseIdle());
    }).join();
}

TEST_F(SendPath, AloneTheFiberSendsDirectlyWithOthersReadyTheRingBatches) {
    constexpr int kMessages = 200;
    LoopbackPair pair;
    on(0, [&] { pair = connectLoopbackPair(); }).join();
    std::vector<char> got(2 * kMessages * 8);
    auto reader = on(1, [&] { EXPECT_TRUE(pair.server.readExact(got.data(), got.size(), 10s)); });
    on(0, [&] {
        // Alone on carrier 0: no SQE for any of these sends.
        const uint64_t before = sqesOn(0);
        for (int i = 0; i < kMessages; ++i) { ASSERT_TRUE(pair.client.writeAll("12345678", 8, 5s)); }
        EXPECT_LT(sqesOn(0) - before, 10u) << "sends went through the ring while the fiber was alone";
        // A sibling that keeps yielding is always ready: every send now goes through the ring.
        std::atomic<bool> stop{false};
        auto busy = on(0, [&] {
            while (!stop.load(std::memory_order_relaxed)) { this_fiber::yield(); }
        });
        this_fiber::yield();  // let it start
        const uint64_t mid = sqesOn(0);
        for (int i = 0; i < kMessages; ++i) { ASSERT_TRUE(pair.client.writeAll("abcdefgh", 8, 5s)); }
        if (testing_support::testBackend() == Backend::kUring) {
            EXPECT_GE(sqesOn(0) - mid, static_cast<uint64_t>(kMessages));
        } else {
            // The epoll driver would make the same send(2) at once: no operation is started for it.
            EXPECT_LT(sqesOn(0) - mid, 10u) << "sends went through the epoll driver";
        }
        stop.store(true);
        busy.join();
    }).join();
    reader.join();
    for (int i = 0; i < kMessages; ++i) { EXPECT_EQ(std::string(&got[static_cast<size_t>(i) * 8], 8), "12345678"); }
    for (int i = kMessages; i < 2 * kMessages; ++i) {
        EXPECT_EQ(std::string(&got[static_cast<size_t>(i) * 8], 8), "abcdefgh");
    }
    on(0, [&] { pair = LoopbackPair{}; }).join();
}

// A fiber that keeps sending to a fast reader succeeds on every direct send(2) and would never park;
// a sibling whose timer came due must still run before the sends end (the direct path checks for a
// due timer, a CQE and flagged task work, not only for ready fibers).
TEST_F(SendPath, AFiberThatKeepsSendingDoesNotHoldBackASiblingWhoseTimerIsDue) {
    constexpr int kSends = 20000;  // at well over a microsecond each, far longer than the sibling's sleep
    LoopbackPair pair;
    on(0, [&] { pair = connectLoopbackPair(); }).join();
    auto reader = on(1, [&] {
        std::vector<char> buf(1 << 16);
        size_t total = 0;
        while (total < size_t{kSends} * 8) {
            auto n = pair.server.recv(buf.data(), buf.size(), 30s);
            if (!n || *n == 0) { break; }
            total += *n;
        }
        return total;
    });
    std::atomic<int> sent{0};
    std::atomic<int> sentWhenWoken{-1};
    on(0, [&] {
        auto sleeper = on(0, [&] {
            EXPECT_TRUE(this_fiber::sleep_for(2ms));
            sentWhenWoken.store(sent.load());
        });
        this_fiber::yield();  // the sleeper arms its timer and parks
        for (int i = 0; i < kSends; ++i) {
            ASSERT_TRUE(pair.client.writeAll("12345678", 8, 10s));
            sent.store(i + 1, std::memory_order_relaxed);
        }
        sleeper.join();
    }).join();
    EXPECT_EQ(reader.join(), size_t{kSends} * 8);
    EXPECT_GE(sentWhenWoken.load(), 0);
    EXPECT_LT(sentWhenWoken.load(), kSends) << "the sleeper ran only after every send";
    on(0, [&] { pair = LoopbackPair{}; }).join();
}

TEST_F(SendPath, AFullSocketFallsBackToTheRingWhichWaitsForRoomOrTheDeadline) {
    on(0, [&] {
        LoopbackPair pair = connectLoopbackPair();
        // Nobody reads: the direct send fills the socket, then the ring waits until the deadline.
        expectAFullSocketTimesOut([&](const char* p, size_t n, size_t* count) {
            return pair.client.writeAll(p, n, 100ms, count);
        });
        // Past deadline: nothing is sent, on the direct path as on the ring.
        auto past = pair.client.send("y", 1, std::chrono::steady_clock::now() - 1s);
        ASSERT_FALSE(past);
        EXPECT_EQ(past.errorCode(), ETIMEDOUT);
    }).join();
}

TEST_F(SendPath, APendingCancellationFailsTheDirectSendWithNothingSent) {
    LoopbackPair pair;
    on(0, [&] { pair = connectLoopbackPair(); }).join();
    std::atomic<bool> asleep{false};
    auto h = on(0, [&] {
        asleep.store(true);
        EXPECT_FALSE(this_fiber::sleep_for(10s));  // cancelled
        ASSERT_TRUE(carrierOtherwiseIdle());
        auto r = pair.client.send("z", 1);
        ASSERT_FALSE(r);
        EXPECT_EQ(r.errorCode(), ECANCELED);
        this_fiber::acknowledgeCancellation();
        ASSERT_TRUE(pair.client.writeAll("ok", 2, 5s));
    });
    while (!asleep.load()) { std::this_thread::sleep_for(1ms); }
    std::this_thread::sleep_for(10ms);
    h.cancel();
    h.join();
    on(1, [&] {
        char buf[4] = {};
        ASSERT_TRUE(pair.server.readExact(buf, 2, 5s));
        EXPECT_EQ(std::string(buf, 2), "ok") << "the cancelled send must not have sent its byte";
        pair = LoopbackPair{};
    }).join();
}

// MSG_DONTWAIT: what fits, or EAGAIN at once, on every path (direct, ring, epoll driver).
TEST_F(SendPath, ADontWaitSendOnAFullSocketAnswersEagainAtOnce) {
    on(0, [&] {
        LoopbackPair pair = connectLoopbackPair();
        const std::vector<char> big(8 << 20, 'x');
        size_t total = 0;
        for (;;) {
            auto r = pair.client.send(big.data(), big.size(), {}, MSG_DONTWAIT);
            if (!r) {
                EXPECT_EQ(r.errorCode(), EAGAIN);
                break;
            }
            total += *r;
            ASSERT_LT(total, size_t{64} << 20) << "the socket never filled";
        }
        EXPECT_GT(total, 0u);
    }).join();
}

// writeAllWithin: all of it when it fits; when the socket stays full, ETIMEDOUT once it has had no room
// for the timeout, with what left counted; a failed send's error, with what left before it.
TEST_F(SendPath, WriteAllWithinSendsWhatFitsAndTimesTheWaitForRoomOnly) {
    on(0, [&] {
        LoopbackPair pair = connectLoopbackPair();
        size_t sent = 99;
        ASSERT_TRUE(pair.client.writeAllWithin("hello", 5, 1s, &sent));
        EXPECT_EQ(sent, 5u);
        char got[5] = {};
        ASSERT_TRUE(pair.server.readExact(got, 5, 5s));
        EXPECT_EQ(std::string(got, 5), "hello");

        // Nobody reads: the first send fills the socket, then the wait for room runs out.
        expectAFullSocketTimesOut([&](const char* p, size_t n, size_t* count) {
            return pair.client.writeAllWithin(p, n, 100ms, count);
        });

        // The peer is gone: its error, and nothing counted as sent by this call.
        pair.server = TcpStream{};
        std::this_thread::sleep_for(20ms);
        auto gone = pair.client.writeAllWithin("y", 1, 1s, &sent);
        for (int i = 0; gone && i < 100; ++i) { gone = pair.client.writeAllWithin("y", 1, 1s, &sent); }
        ASSERT_FALSE(gone);
        EXPECT_TRUE(gone.errorCode() == EPIPE || gone.errorCode() == ECONNRESET) << gone.errorCode();
        EXPECT_EQ(sent, 0u);
    }).join();
}

}  // namespace
}  // namespace spindle::net
