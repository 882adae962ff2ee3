// SPDX-License-Identifier: Apache-2.0
// net::PostedSend: sends the fiber does not wait for. Bytes arrive whole and in order whichever path
// each send took (at once, the driver, a short send finished later); an error belongs to the stream
// and every later call reports it; a timeout, a cancel and the destructor end a send in flight before
// its buffer is let go.
#include "net/posted_send.h"

#include <gtest/gtest.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/fiber.h"
#include "net/tcp.h"
#include "tests/core/with_runtime.h"
#include "tests/net/loopback_pair.h"

namespace spindle::net {
namespace {

using namespace std::chrono_literals;

using testing_support::connectLoopbackPair;
using testing_support::LoopbackPair;

class PostedSendTest : public testing_support::WithRuntime {};

// Message i of a run: 24 bytes that name it, so that a lost, repeated or reordered one shows.
std::string message(int i) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "message %06d of the run\n", i);
    return std::string(buf, 24);
}

// Reads `count` messages of 24 bytes from `s` and checks each; returns how many matched.
int readMessages(TcpStream& s, int count) {
    std::vector<char> got(24 * static_cast<size_t>(count));
    if (!s.readExact(got.data(), got.size(), 30s)) { return -1; }
    int ok = 0;
    for (int i = 0; i < count; ++i) {
        if (std::memcmp(&got[24 * static_cast<size_t>(i)], message(i).data(), 24) == 0) { ++ok; }
    }
    return ok;
}

// A sibling that keeps yielding keeps the carrier busy: sends then go to the driver (on io_uring;
// the epoll driver's first try sends at once all the same).
TEST_F(PostedSendTest, EveryMessageArrivesInOrderWhetherSentAtOnceOrByTheDriver) {
    constexpr int kMessages = 2000;
    LoopbackPair pair;
    on(0, [&] { pair = connectLoopbackPair(); }).join();
    auto reader = on(1, [&] { return readMessages(pair.server, 2 * kMessages); });
    PostedSend::Stats stats;
    on(0, [&] {
        std::vector<std::string> messages;
        for (int i = 0; i < 2 * kMessages; ++i) { messages.push_back(message(i)); }
        PostedSend sender(pair.client.fd());
        for (int i = 0; i < kMessages; ++i) { ASSERT_TRUE(sender.post(messages[static_cast<size_t>(i)].data(), 24)); }
        std::atomic<bool> stop{false};
        auto busy = on(0, [&] {
            while (!stop.load(std::memory_order_relaxed)) { this_fiber::yield(); }
        });
        this_fiber::yield();
        for (int i = kMessages; i < 2 * kMessages; ++i) {
            ASSERT_TRUE(sender.post(messages[static_cast<size_t>(i)].data(), 24));
        }
        ASSERT_TRUE(sender.flush(10s));
        EXPECT_FALSE(sender.inFlight());
        stop.store(true);
        busy.join();
        stats = sender.stats();
    }).join();
    EXPECT_EQ(reader.join(), 2 * kMessages);
    EXPECT_EQ(stats.posted, uint64_t{2 * kMessages});
    if (testing_support::testBackend() == Backend::kUring) {
        EXPECT_GE(stats.detached, uint64_t{kMessages}) << "with a sibling ready, sends go to the ring";
    }
    on(0, [&] { pair = LoopbackPair{}; }).join();
}

// Posting returns before a large send has left: the driver holds the rest until the reader makes room.
TEST_F(PostedSendTest, ALargePostReturnsAtOnceAndFlushWaitsUntilItLeft) {
    constexpr size_t kBig = 16 << 20;  // far beyond what a loopback socket buffers
    LoopbackPair pair;
    on(0, [&] { pair = connectLoopbackPair(); }).join();
    std::vector<char> big(kBig);
    for (size_t i = 0; i < kBig; ++i) { big[i] = static_cast<char>(i * 7 + i / 4096); }
    std::atomic<bool> posted{false};
    auto writer = on(0, [&] {
        PostedSend sender(pair.client.fd());
        EXPECT_TRUE(sender.post(big.data(), big.size()));
        EXPECT_TRUE(sender.inFlight());
        posted.store(true);
        EXPECT_TRUE(sender.flush(30s));
        EXPECT_FALSE(sender.inFlight());
        EXPECT_EQ(sender.stats().detached, 1u);
    });
    while (!posted.load()) { std::this_thread::sleep_for(1ms); }
    std::vector<char> got(kBig);
    on(1, [&] { ASSERT_TRUE(pair.server.readExact(got.data(), got.size(), 30s)); }).join();
    writer.join();
    size_t bad = 0;  // checked here: 16 Mi comparisons on a carrier would hold it past the stall threshold
    for (size_t i = 0; i < kBig; ++i) { bad += got[i] != static_cast<char>(i * 7 + i / 4096) ? 1 : 0; }
    EXPECT_EQ(bad, 0u);
    on(0, [&] { pair = LoopbackPair{}; }).join();
}

// The sent hook runs once the driver's completion says the whole post left, on the carrier that
// started it, before anything waits for it; never for a post that left at once.
TEST_F(PostedSendTest, TheSentHookRunsOnceAPostLeftWholeOnTheCarrierThatStartedIt) {
    constexpr size_t kBig = 16 << 20;
    LoopbackPair pair;
    on(0, [&] { pair = connectLoopbackPair(); }).join();
    struct Seen {
        int calls = 0;
        int carrier = -1;
    } seen;
    std::vector<char> big(kBig, 'h');
    std::atomic<bool> posted{false};
    auto writer = on(0, [&] {
        PostedSend sender(pair.client.fd());
        sender.setSentHook([](void* arg) noexcept {
            auto* s = static_cast<Seen*>(arg);
            ++s->calls;
            s->carrier = this_fiber::carrierIndex();
        }, &seen);
        ASSERT_TRUE(sender.post("small", 5));  // alone on its carrier: sent at once, no completion
        EXPECT_FALSE(sender.inFlight());
        ASSERT_TRUE(sender.post(big.data(), big.size()));
        ASSERT_TRUE(sender.inFlight());
        EXPECT_FALSE(sender.ended());
        posted.store(true);
        ASSERT_TRUE(sender.flush(30s));
    });
    while (!posted.load()) { std::this_thread::sleep_for(1ms); }
    std::vector<char> got(kBig + 5);
    on(1, [&] { ASSERT_TRUE(pair.server.readExact(got.data(), got.size(), 30s)); }).join();
    writer.join();
    EXPECT_EQ(std::string(got.data(), 5), "small");
    if (testing_support::testBackend() == Backend::kUring) {
        // MSG_WAITALL: the ring goes on after each short send, and completes the post whole.
        EXPECT_EQ(seen.calls, 1);
        EXPECT_EQ(seen.carrier, 0);
    } else {
        // The epoll driver completes a send with what one send(2) took once the socket had room;
        // flush() sent the rest itself, so the hook had no whole post to report.
        EXPECT_EQ(seen.calls, 0);
    }
    on(0, [&] { pair = LoopbackPair{}; }).join();
}

// A flush that times out cancels the send; the stream is broken from then on, and says so.
TEST_F(PostedSendTest, AFlushThatTimesOutCancelsTheSendAndEveryLaterCallReportsIt) {
    on(0, [&] {
        LoopbackPair pair = connectLoopbackPair();
        std::vector<char> big(16 << 20, 'x');
        PostedSend sender(pair.client.fd());
        int hooked = 0;
        sender.setSentHook([](void* n) noexcept { ++*static_cast<int*>(n); }, &hooked);
        ASSERT_TRUE(sender.post(big.data(), big.size()));
        const auto t0 = std::chrono::steady_clock::now();
        auto r = sender.flush(100ms);
        EXPECT_EQ(hooked, 0) << "the hook ran for a send that did not leave whole";
        ASSERT_FALSE(r);
        EXPECT_EQ(r.errorCode(), ETIMEDOUT);
        EXPECT_GE(std::chrono::steady_clock::now() - t0, 90ms);
        EXPECT_FALSE(sender.inFlight());
        auto again = sender.post("y", 1);
        ASSERT_FALSE(again);
        EXPECT_EQ(again.errorCode(), ETIMEDOUT);
        auto flushed = sender.flush();
        ASSERT_FALSE(flushed);
        EXPECT_EQ(flushed.errorCode(), ETIMEDOUT);
    }).join();
}

// The peer is gone: the failure surfaces at the next call, nothing is sent after it, and it sticks.
TEST_F(PostedSendTest, AResetByThePeerIsReportedByTheNextCallAndSticks) {
    on(0, [&] {
        LoopbackPair pair = connectLoopbackPair();
        ASSERT_TRUE(pair.server.setResetOnClose());
        pair.server = TcpStream{};  // RST
        PostedSend sender(pair.client.fd());
        Result<void> r;
        int posts = 0;
        for (; posts < 100 && r; ++posts) {
            r = sender.post("after the reset\n", 16);
            if (r) { r = sender.flush(5s); }
        }
        ASSERT_FALSE(r) << "100 sends to a reset connection all succeeded";
        EXPECT_TRUE(r.errorCode() == ECONNRESET || r.errorCode() == EPIPE) << std::strerror(r.errorCode());
        const int first = r.errorCode();
        auto again = sender.post("x", 1);
        ASSERT_FALSE(again);
        EXPECT_EQ(again.errorCode(), first);
    }).join();
}

// A cancel while flush() waits ends the wait and the send, and reports ECANCELED.
TEST_F(PostedSendTest, CancellingAFiberInFlushEndsTheSendInFlight) {
    LoopbackPair pair;
    on(0, [&] { pair = connectLoopbackPair(); }).join();
    std::atomic<bool> waiting{false};
    auto h = on(0, [&] {
        std::vector<char> big(16 << 20, 'c');
        PostedSend sender(pair.client.fd());
        ASSERT_TRUE(sender.post(big.data(), big.size()));
        waiting.store(true);
        auto r = sender.flush();
        ASSERT_FALSE(r);
        EXPECT_EQ(r.errorCode(), ECANCELED);
        EXPECT_FALSE(sender.inFlight());
        EXPECT_GE(sender.stats().waited, 1u);
        this_fiber::acknowledgeCancellation();
    });
    while (!waiting.load()) { std::this_thread::sleep_for(1ms); }
    std::this_thread::sleep_for(20ms);
    h.cancel();
    h.join();
    on(0, [&] { pair = LoopbackPair{}; }).join();
}

// The destructor does not wait for a reader that never comes: it cancels the send and returns, and
// the buffer may go (under ASan, a kernel copy from it afterwards would not show; the bound on the
// time is what fails if the destructor waited for room).
TEST_F(PostedSendTest, TheDestructorCancelsASendInFlightInsteadOfWaitingForTheReader) {
    on(0, [&] {
        LoopbackPair pair = connectLoopbackPair();
        const auto t0 = std::chrono::steady_clock::now();
        {
            std::vector<char> big(16 << 20, 'd');
            PostedSend sender(pair.client.fd());
            ASSERT_TRUE(sender.post(big.data(), big.size()));
            EXPECT_TRUE(sender.inFlight());
        }
        EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
    }).join();
}

// Off-fiber there is no carrier to take a completion: post() sends everything before it returns.
TEST_F(PostedSendTest, OffFiberAPostSendsEverythingBeforeItReturns) {
    LoopbackPair pair;
    on(0, [&] { pair = connectLoopbackPair(); }).join();
    auto reader = on(1, [&] { return readMessages(pair.server, 100); });
    {
        PostedSend sender(pair.client.fd());
        for (int i = 0; i < 100; ++i) {
            const std::string m = message(i);  // gone after the call: post() must be done with it
            ASSERT_TRUE(sender.post(m.data(), m.size()));
            EXPECT_FALSE(sender.inFlight());
        }
        EXPECT_EQ(sender.stats().detached, 0u);
        EXPECT_TRUE(sender.flush());
    }
    EXPECT_EQ(reader.join(), 100);
    on(0, [&] { pair = LoopbackPair{}; }).join();
}

// A fiber that is not pinned waits through a future with a timer-less, cancellable wait, and may be
// resumed on either carrier; the completion still runs where the send started.
TEST_F(PostedSendTest, AnUnpinnedFiberFlushesWhereverItRuns) {
    constexpr int kRounds = testing_support::kSlowRounds ? 50 : 400;
    LoopbackPair pair;
    on(0, [&] { pair = connectLoopbackPair(); }).join();
    auto reader = on(1, [&] { return readMessages(pair.server, kRounds); });
    auto writer = rt().spawn([&] {
        PostedSend sender(pair.client.fd());
        std::string m;
        for (int i = 0; i < kRounds; ++i) {
            EXPECT_TRUE(sender.flush(10s));
            m = message(i);
            EXPECT_TRUE(sender.post(m.data(), m.size()));
            this_fiber::yield();
        }
        EXPECT_TRUE(sender.flush(10s));
    }, SpawnOptions{.name = "unpinned-writer", .pinned = false}).value();
    writer.join();
    EXPECT_EQ(reader.join(), kRounds);
    on(0, [&] { pair = LoopbackPair{}; }).join();
}

}  // namespace
}  // namespace spindle::net
