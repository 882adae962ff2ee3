// SPDX-License-Identifier: Apache-2.0
// MultishotReceiver: one armed receive for a connection's life. Order and completeness of the bytes
// (through the inline queue, its spill and the high-water pause), end of stream, peer reset,
// deadlines and cancellation (pinned on the operation's carrier, where a cancel cancels the
// operation, and unpinned, where a timer carries it), stop() and re-arming, an exhausted ring, and
// the one-receive fallback off-fiber.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "base/inject.h"
#include "core/fiber.h"
#include "net/buffered.h"
#include "net/provided_buffers.h"
#include "net/tcp.h"
#include "tests/core/with_runtime.h"
#include "tests/net/loopback_pair.h"

namespace spindle::net {
namespace {

using namespace std::chrono_literals;

using testing_support::connectLoopbackPair;
using testing_support::LoopbackPair;

// Takes buffers until `want` bytes came; appends them to `out`.
void receiveBytes(MultishotReceiver& rx, size_t want, std::vector<char>& out) {
    while (out.size() < want) {
        auto b = rx.next(10s);
        ASSERT_TRUE(b) << b.error().message();
        ASSERT_GT(b->size(), 0u) << "end of stream after " << out.size() << " bytes";
        out.insert(out.end(), b->data(), b->data() + b->size());
    }
}

// `incremental` false: each receive takes a whole buffer on every kernel, for the tests that count
// buffers (incremental_buffers_test.cpp has the tests of incremental consumption).
std::unique_ptr<ProvidedBufferPool> makePool(unsigned count, size_t size, bool incremental = true) {
    auto p = ProvidedBufferPool::create(ProvidedBufferOptions{.count = count, .size = size, .incremental = incremental});
    SPINDLE_CHECK(static_cast<bool>(p));
    return std::move(*p);
}

class MultishotRecv : public testing_support::WithRuntime {};

TEST_F(MultishotRecv, OneOperationCarriesEveryByteInOrderThenEndOfStreamStays) {
    auto pool = makePool(256, 512);
    on(0, [&] {
        LoopbackPair pair = connectLoopbackPair();
        MultishotReceiver rx(*pool, pair.server.fd());
        const std::vector<char> data = testing_support::pattern(300000, 3);
        auto writer = on(1, [&] { EXPECT_TRUE(pair.client.writeAll(data.data(), data.size(), 10s)); });
        std::vector<char> got;
        receiveBytes(rx, data.size(), got);
        writer.join();
        EXPECT_EQ(got, data);
        ASSERT_TRUE(pair.client.shutdown(SHUT_WR));
        for (int i = 0; i < 3; ++i) {  // end of stream, and it stays so
            auto end = rx.next(5s);
            ASSERT_TRUE(end);
            EXPECT_TRUE(end->empty());
        }
        const MultishotReceiver::Stats st = rx.stats();
        EXPECT_GE(st.buffers, data.size() / 512);
        EXPECT_EQ(st.oneShot, 0u);
        // Re-armed only after a pause (64 queued) or an exhausted ring: far fewer arms than buffers.
        EXPECT_LT(st.arms * 8, st.buffers) << "arms " << st.arms << ", buffers " << st.buffers;
        // The pool counts each delivered buffer once (on the ring of the carrier that reaped it).
        EXPECT_EQ(pool->stats().providedRecvs, st.buffers);
    }).join();
}

// Each carrier's ring counts the buffers its receives delivered; the pool's stats() sums every ring's.
// One connection received on each of two carriers.
TEST_F(MultishotRecv, ThePoolCountsEveryRingsDeliveries) {
    auto pool = makePool(256, 512);
    uint64_t buffers[2] = {0, 0};
    for (int carrier = 0; carrier < 2; ++carrier) {
        on(carrier, [&] {
            LoopbackPair pair = connectLoopbackPair();
            MultishotReceiver rx(*pool, pair.server.fd());
            const std::vector<char> data = testing_support::pattern(50000, carrier + 1);
            ASSERT_TRUE(pair.client.writeAll(data.data(), data.size(), 10s));  // fits the socket's buffer
            std::vector<char> got;
            receiveBytes(rx, data.size(), got);
            EXPECT_EQ(got, data);
            buffers[carrier] = rx.stats().buffers;
        }).join();
    }
    EXPECT_GT(buffers[0], 0u);
    EXPECT_GT(buffers[1], 0u);
    const ProvidedBufferStats st = pool->stats();
    EXPECT_EQ(st.carriersRegistered, 2u);
    EXPECT_EQ(st.providedRecvs, buffers[0] + buffers[1]);
}

TEST_F(MultishotRecv, AConsumerThatLagsPausesTheOperationAndLosesNothing) {
    // 2,000 small sends land in separate buffers while nobody takes them: the queue spills past
    // its inline slots, the operation pauses at the high-water mark, and resumes as it drains.
    auto pool = makePool(1024, 64);
    on(0, [&] {
        LoopbackPair pair = connectLoopbackPair();
        MultishotReceiver rx(*pool, pair.server.fd());
        ASSERT_TRUE(pair.client.setNoDelay());
        auto first = rx.next(20ms);  // armed, nothing yet: times out
        ASSERT_FALSE(first);
        EXPECT_EQ(first.errorCode(), ETIMEDOUT);
        std::string sent;
        for (int i = 0; i < 2000; ++i) {
            const std::string msg = fmt::format("<{}>", i);  // not "<" + to_string(): a false -Wrestrict in GCC 12 -O3
            ASSERT_TRUE(pair.client.writeAll(msg.data(), msg.size(), 5s));
            sent += msg;
            if (i % 100 == 0) { this_fiber::yield(); }  // let the carrier dispatch CQEs meanwhile
        }
        std::vector<char> got;
        receiveBytes(rx, sent.size(), got);
        EXPECT_EQ(std::string(got.begin(), got.end()), sent);
        EXPECT_GE(rx.stats().arms, 1u);
    }).join();
}

TEST_F(MultishotRecv, PeerResetIsReportedOnceBuffersBeforeItAreTaken) {
    auto pool = makePool(64, 256);
    on(0, [&] {
        LoopbackPair pair = connectLoopbackPair();
        MultishotReceiver rx(*pool, pair.server.fd());
        ASSERT_TRUE(pair.client.writeAll("before", 6, 5s));
        auto b = rx.next(5s);
        ASSERT_TRUE(b);
        EXPECT_EQ(std::string(b->data(), b->size()), "before");
        ASSERT_TRUE(pair.client.setResetOnClose());
        ASSERT_TRUE(pair.client.close());
        auto r = rx.next(5s);
        ASSERT_FALSE(r);
        EXPECT_EQ(r.errorCode(), ECONNRESET);
    }).join();
}

TEST_F(MultishotRecv, PinnedWaiterIsCancelledThroughTheOperationAndReceivesAfterAcknowledging) {
    auto pool = makePool(64, 256);
    LoopbackPair pair;
    on(0, [&] { pair = connectLoopbackPair(); }).join();
    std::atomic<bool> waiting{false};
    auto h = on(0, [&] {
        MultishotReceiver rx(*pool, pair.server.fd());
        ASSERT_TRUE(pair.client.writeAll("x", 1, 5s));
        ASSERT_TRUE(rx.next(5s));  // armed now
        waiting.store(true);
        auto r = rx.next();  // no deadline, pinned on the operation's carrier: the cheap wait
        ASSERT_FALSE(r);
        EXPECT_EQ(r.errorCode(), ECANCELED);
        EXPECT_FALSE(rx.next(1s)) << "the cancellation is sticky until acknowledged";
        this_fiber::acknowledgeCancellation();
        ASSERT_TRUE(pair.client.writeAll("after", 5, 5s));
        auto b = rx.next(5s);  // armed again
        ASSERT_TRUE(b) << b.error().message();
        EXPECT_EQ(std::string(b->data(), b->size()), "after");
        EXPECT_GE(rx.stats().arms, 2u);
    });
    while (!waiting.load()) { std::this_thread::sleep_for(1ms); }
    std::this_thread::sleep_for(20ms);
    h.cancel();
    h.join();
    on(0, [&] { pair = LoopbackPair{}; }).join();
}

TEST_F(MultishotRecv, UnpinnedWaiterHonoursDeadlinesAndCancellationThroughATimer) {
    auto pool = makePool(64, 256);
    LoopbackPair pair;
    on(0, [&] { pair = connectLoopbackPair(); }).join();
    std::atomic<bool> waiting{false};
    auto h = onUnpinned(1, [&] {
        MultishotReceiver rx(*pool, pair.server.fd());
        const auto t0 = std::chrono::steady_clock::now();
        auto r = rx.next(30ms);
        ASSERT_FALSE(r);
        EXPECT_EQ(r.errorCode(), ETIMEDOUT);
        EXPECT_GE(std::chrono::steady_clock::now() - t0, 25ms);
        waiting.store(true);
        auto c = rx.next();
        ASSERT_FALSE(c);
        EXPECT_EQ(c.errorCode(), ECANCELED);
        this_fiber::acknowledgeCancellation();
        ASSERT_TRUE(pair.client.writeAll("late", 4, 5s));
        auto b = rx.next(5s);  // the operation armed before is still there
        ASSERT_TRUE(b) << b.error().message();
        EXPECT_EQ(std::string(b->data(), b->size()), "late");
    });
    while (!waiting.load()) { std::this_thread::sleep_for(1ms); }
    std::this_thread::sleep_for(20ms);
    h.cancel();
    h.join();
    on(0, [&] { pair = LoopbackPair{}; }).join();
}

// The operation's own ETIMEDOUT (TCP_USER_TIMEOUT on a zero window here; keep-alive would do the same)
// reaches a next() with no deadline that waits through a timer (a plain thread): it is returned, not
// taken for the stand-in timer running out and waited on again.
TEST_F(MultishotRecv, ASocketTimeoutReachesAWaitWithNoDeadlineOffTheOperationsCarrier) {
    auto pool = makePool(16, 256);
    LoopbackPair pair;
    std::optional<MultishotReceiver> rx;
    on(0, [&] {
        pair = connectLoopbackPair();
        rx.emplace(*pool, pair.server.fd());
        EXPECT_EQ(rx->next(5ms).errorCode(), ETIMEDOUT);  // arms on carrier 0; nothing came
        int ms = 300;
        ASSERT_EQ(::setsockopt(pair.server.fd(), IPPROTO_TCP, TCP_USER_TIMEOUT, &ms, sizeof ms), 0);
        std::vector<char> chunk(1 << 16, 'x');  // fill the client's window: it never reads
        while (::send(pair.server.fd(), chunk.data(), chunk.size(), MSG_DONTWAIT | MSG_NOSIGNAL) > 0) {}
    }).join();
    std::atomic<int> result{-1};
    std::thread t([&] {
        auto r = rx->next();
        result.store(r ? 0 : r.errorCode());
    });
    // A wait that never returns is the failure; 30 s is a hang, not a verdict on speed.
    const auto until = std::chrono::steady_clock::now() + 30s;
    while (result.load() == -1 && std::chrono::steady_clock::now() < until) { std::this_thread::sleep_for(10ms); }
    if (result.load() == -1) {
        ADD_FAILURE() << "next() with no deadline did not return the socket's ETIMEDOUT within 30 s";
        std::fflush(nullptr);
        std::_Exit(1);  // the thread cannot be stopped
    }
    t.join();
    EXPECT_EQ(result.load(), ETIMEDOUT);
    EXPECT_FALSE(rx->armed());
    on(0, [&] {
        rx.reset();
        pair = LoopbackPair{};
    }).join();
}

TEST_F(MultishotRecv, StopEndsTheOperationAndKeepsWhatItQueued) {
    auto pool = makePool(64, 256);
    on(1, [&] {
        LoopbackPair pair = connectLoopbackPair();
        MultishotReceiver rx(*pool, pair.server.fd());
        EXPECT_FALSE(rx.next(10ms));  // arms it
        ASSERT_TRUE(pair.client.writeAll("queued", 6, 5s));
        // Let the CQE land before stop(): one pass of the carrier's loop is enough.
        for (int i = 0; i < 100 && rx.stats().buffers == 0; ++i) {
            (void)this_fiber::sleep_for(1ms);
        }
        rx.stop();
        rx.stop();  // idempotent
        ASSERT_TRUE(pair.client.writeAll("more", 4, 5s));
        std::vector<char> got;
        receiveBytes(rx, 10, got);
        EXPECT_EQ(std::string(got.begin(), got.end()), "queuedmore");
        EXPECT_EQ(rx.stats().arms, 2u);
    }).join();
}

TEST_F(MultishotRecv, DestroyingAnArmedReceiverWithQueuedBuffersGivesThemBack) {
    auto pool = makePool(4, 128);  // a small ring: one buffer not given back per round would drain it
    on(0, [&] {
        LoopbackPair pair = connectLoopbackPair();
        for (int round = 0; round < 20; ++round) {
            MultishotReceiver rx(*pool, pair.server.fd());
            EXPECT_FALSE(rx.next(1ms));  // arms it
            ASSERT_TRUE(pair.client.writeAll("ab", 2, 5s));
            for (int i = 0; i < 1000 && rx.stats().buffers == 0; ++i) { (void)this_fiber::sleep_for(1ms); }
            ASSERT_EQ(rx.stats().buffers, 1u) << "round " << round;
            // Destroyed armed, with one buffer queued: the operation is cancelled, the buffer returned.
        }
        MultishotReceiver last(*pool, pair.server.fd());
        ASSERT_TRUE(pair.client.writeAll("end", 3, 5s));
        auto b = last.next(5s);
        ASSERT_TRUE(b);
        EXPECT_EQ(std::string(b->data(), b->size()), "end");
        EXPECT_TRUE(b->provided());
    }).join();
    EXPECT_EQ(pool->stats().exhausted, 0u) << "a buffer was not given back";
}

TEST_F(MultishotRecv, AnExhaustedRingFallsBackToOneReceiveAndRearms) {
    auto pool = makePool(1, 128, /*incremental=*/false);
    on(0, [&] {
        LoopbackPair a = connectLoopbackPair();
        MultishotReceiver rx(*pool, a.server.fd());
        ASSERT_TRUE(a.client.writeAll("one", 3, 5s));
        auto held = rx.next(5s);  // holds the ring's only buffer
        ASSERT_TRUE(held);
        EXPECT_EQ(std::string(held->data(), held->size()), "one");
        ASSERT_TRUE(a.client.writeAll("two", 3, 5s));
        auto second = rx.next(5s);  // ENOBUFS ended the operation: a heap buffer this once
        ASSERT_TRUE(second) << second.error().message();
        EXPECT_EQ(std::string(second->data(), second->size()), "two");
        EXPECT_FALSE(second->provided());
        EXPECT_GE(rx.stats().oneShot, 1u);
        held->release();
        second->release();
        ASSERT_TRUE(a.client.writeAll("three", 5, 5s));
        auto third = rx.next(5s);
        ASSERT_TRUE(third);
        EXPECT_EQ(std::string(third->data(), third->size()), "three");
    }).join();
    EXPECT_GE(pool->stats().exhausted, 1u);
}

// The consumer moves: the operation armed by a fiber on carrier 0 stays there, and fibers on carrier 1
// and a plain thread keep taking bytes from it in order (each look at the queue runs on carrier 0,
// which alone touches it); stop() from the plain thread ends it.
TEST_F(MultishotRecv, AConsumerOnAnotherCarrierOrThreadTakesFromTheHoldersQueue) {
    auto pool = makePool(16, 256);
    std::optional<LoopbackPair> pair;
    std::optional<MultishotReceiver> rx;
    std::vector<char> got;
    on(0, [&] {
        pair.emplace(connectLoopbackPair());
        rx.emplace(*pool, pair->server.fd());
        ASSERT_TRUE(pair->client.writeAll("first.", 6, 5s));
        receiveBytes(*rx, 6, got);
    }).join();
    const bool multishot = rx->armed();  // false where the kernel or the backend has no multishot receive
    on(1, [&] {
        ASSERT_TRUE(pair->client.writeAll("second.", 7, 5s));
        receiveBytes(*rx, 13, got);
        // A wait there: parked on carrier 1 while carrier 0 holds the operation.
        auto late = spawn([&] { receiveBytes(*rx, 19, got); }, SpawnOptions{.carrier = 1}).value();
        (void)this_fiber::sleep_for(10ms);
        ASSERT_TRUE(pair->client.writeAll("third.", 6, 5s));
        late.join();
    }).join();
    EXPECT_EQ(rx->armed(), multishot);
    ASSERT_TRUE(pair->client.writeAll("last.", 5, 5s));  // from this plain thread, then taken here
    receiveBytes(*rx, 24, got);
    EXPECT_EQ(std::string(got.begin(), got.end()), "first.second.third.last.");
    rx->stop();
    EXPECT_FALSE(rx->armed());
    if (multishot) { EXPECT_EQ(rx->stats().arms, 1u); }
    on(0, [&] {
        rx.reset();
        pair.reset();
    }).join();
}

// Buffers released on a plain thread reach their carrier's ring again (queued without a lock, put back
// by that carrier's loop, which alone writes the ring): with a ring of two, two receives hold both, a
// thread releases them, and the next two receives on the carrier are served from the ring again.
TEST_F(MultishotRecv, BuffersReleasedOnAPlainThreadGoBackToTheirCarriersRing) {
    auto pool = makePool(2, 64, /*incremental=*/false);
    std::optional<LoopbackPair> pair;
    std::vector<ProvidedBuffer> held;
    bool ring = false;
    on(0, [&] {
        ring = pool->ringAvailable();
        pair.emplace(connectLoopbackPair());
        for (const char* word : {"ab", "cd"}) {
            ASSERT_TRUE(pair->client.writeAll(word, 2, 5s));
            auto b = pool->recv(pair->server.fd(), 5s);
            ASSERT_TRUE(b) << b.error().message();
            EXPECT_EQ(std::string(b->data(), b->size()), word);
            EXPECT_EQ(b->provided(), ring);
            held.push_back(std::move(*b));
        }
    }).join();
    if (!ring) {
        on(0, [&] { pair.reset(); }).join();
        GTEST_SKIP() << "no buffer ring here";
    }
    std::thread([&] { held.clear(); }).join();
    const uint64_t exhaustedBefore = pool->stats().exhausted;
    on(0, [&] {
        for (const char* word : {"ef", "gh"}) {
            ASSERT_TRUE(pair->client.writeAll(word, 2, 5s));
            auto b = pool->recv(pair->server.fd(), 5s);
            ASSERT_TRUE(b) << b.error().message();
            EXPECT_EQ(std::string(b->data(), b->size()), word);
            EXPECT_TRUE(b->provided()) << "the buffers released elsewhere did not come back";
        }
        pair.reset();
    }).join();
    EXPECT_EQ(pool->stats().exhausted, exhaustedBefore);
}

TEST_F(MultishotRecv, RuntimeShutdownEndsAWaitWithEcanceledAndTheReceiverStillCleansUp) {
    auto pool = makePool(16, 64);
    LoopbackPair pair;
    on(0, [&] { pair = connectLoopbackPair(); }).join();
    std::atomic<bool> armed{false};
    auto waiter = on(0, [&] {
        MultishotReceiver rx(*pool, pair.server.fd());
        EXPECT_FALSE(rx.next(1ms));  // armed now
        armed.store(true);
        auto r = rx.next();  // ended by the shutdown's cancel; arming again is refused
        return r ? 0 : r.errorCode();
    });
    while (!armed.load()) { std::this_thread::sleep_for(1ms); }
    std::this_thread::sleep_for(10ms);
    rt().shutdown();
    EXPECT_EQ(waiter.join(), ECANCELED);
    pool.reset();  // after shutdown: the registrations go with the carriers' rings
}

TEST_F(MultishotRecv, NotifyWhenReadyCallsBackForEachCqeUntilCancelledAndRefusesWhenSomethingIsQueued) {
    auto pool = makePool(16, 64);
    on(0, [&] {
        LoopbackPair pair = connectLoopbackPair();
        MultishotReceiver rx(*pool, pair.server.fd());
        struct Seen {
            int calls = 0;
            int carrier = -1;
        } seen;
        auto note = [](void* arg) {
            auto* s = static_cast<Seen*>(arg);
            ++s->calls;
            s->carrier = this_fiber::carrierIndex();
        };
        ASSERT_TRUE(rx.notifyWhenReady(note, &seen));  // arms it
        EXPECT_TRUE(rx.armed());
        ASSERT_TRUE(pair.client.writeAll("one", 3, 5s));
        for (int i = 0; i < 1000 && seen.calls == 0; ++i) { (void)this_fiber::sleep_for(1ms); }
        EXPECT_EQ(seen.calls, 1);
        EXPECT_EQ(seen.carrier, 0) << "the callback runs on the carrier holding the operation";
        // Something is queued now: no registration, next() is the way.
        EXPECT_FALSE(rx.notifyWhenReady(note, &seen));
        rx.cancelNotify();
        auto b = rx.next(5s);
        ASSERT_TRUE(b);
        EXPECT_EQ(std::string(b->data(), b->size()), "one");
        // Registered again, then cancelled: the CQE queues for next() and calls nothing.
        ASSERT_TRUE(rx.notifyWhenReady(note, &seen));
        rx.cancelNotify();
        ASSERT_TRUE(pair.client.writeAll("two", 3, 5s));
        auto c = rx.next(5s);
        ASSERT_TRUE(c);
        EXPECT_EQ(std::string(c->data(), c->size()), "two");
        EXPECT_EQ(seen.calls, 1);
    }).join();
}

TEST_F(MultishotRecv, ACallbackMayDestroyTheReceiverOnceTheLastCqeCame) {
    auto pool = makePool(16, 64);
    on(0, [&] {
        LoopbackPair pair = connectLoopbackPair();
        struct Ctx {
            MultishotReceiver* rx;
            std::atomic<bool> done{false};
        } ctx{new MultishotReceiver(*pool, pair.server.fd())};
        auto onCqe = [](void* arg) {
            auto* c = static_cast<Ctx*>(arg);
            if (c->rx->armed()) { return; }  // a buffer: the end is still to come
            delete c->rx;  // after the last CQE; its queued buffer goes back to the ring
            c->done.store(true);
        };
        ASSERT_TRUE(ctx.rx->notifyWhenReady(onCqe, &ctx));
        ASSERT_TRUE(pair.client.writeAll("data", 4, 5s));
        ASSERT_TRUE(pair.client.shutdown(SHUT_WR));  // end of stream: the operation's last CQE
        for (int i = 0; i < 2000 && !ctx.done.load(); ++i) { (void)this_fiber::sleep_for(1ms); }
        EXPECT_TRUE(ctx.done.load());
    }).join();
    EXPECT_EQ(pool->stats().exhausted, 0u);
}

// Where no operation can be armed (a carrier without a buffer ring: refused registration on
// io_uring, and always on epoll), notifyWhenReady() registers nothing and says so, and next() still
// receives, through one-shot receives into heap buffers. Runs on both backends.
TEST_F(MultishotRecv, NotifyWhenReadyRefusesWithoutARingAndNextStillReceives) {
    auto pool = makePool(16, 64);
    on(0, [&] {
        inject::ArmedFault refuse(inject::Point::kRegisterBufRing, EINVAL, 100);  // never reached on epoll
        LoopbackPair pair = connectLoopbackPair();
        MultishotReceiver rx(*pool, pair.server.fd());
        int calls = 0;
        EXPECT_FALSE(rx.notifyWhenReady([](void* arg) { ++*static_cast<int*>(arg); }, &calls));
        EXPECT_FALSE(rx.armed());
        ASSERT_TRUE(pair.client.writeAll("data", 4, 5s));
        auto b = rx.next(5s);
        ASSERT_TRUE(b) << b.error().message();
        EXPECT_EQ(std::string(b->data(), b->size()), "data");
        EXPECT_FALSE(b->provided());
        EXPECT_EQ(calls, 0);
        EXPECT_EQ(rx.stats().arms, 0u);
        EXPECT_EQ(rx.stats().oneShot, 1u);
    }).join();
    EXPECT_EQ(pool->stats().providedRecvs, 0u);
    EXPECT_EQ(pool->stats().fallbackRecvs, 1u);
}

TEST_F(MultishotRecv, AKernelThatRefusesMultishotReceiveGetsOneReceivePerCallForGood) {
    auto pool = makePool(16, 64);
    on(0, [&] {
        LoopbackPair pair = connectLoopbackPair();
        MultishotReceiver rx(*pool, pair.server.fd());
        inject::ArmedFault refuse(inject::Point::kMultishotRecv, EINVAL, 100);
        for (const char* msg : {"first", "second"}) {
            ASSERT_TRUE(pair.client.writeAll(msg, std::strlen(msg), 5s));
            auto b = rx.next(5s);
            ASSERT_TRUE(b) << b.error().message();
            EXPECT_EQ(std::string(b->data(), b->size()), msg);
        }
        EXPECT_EQ(rx.stats().arms, 0u);
        EXPECT_EQ(rx.stats().oneShot, 2u);
        EXPECT_EQ(inject::remaining(inject::Point::kMultishotRecv), 99u) << "asked once, then never again";
        EXPECT_FALSE(rx.notifyWhenReady([](void*) {}, nullptr)) << "no multishot: the caller must use next()";
    }).join();
}

TEST_F(MultishotRecv, AnotherArmingErrorIsReportedOnceAndTheNextCallArms) {
    auto pool = makePool(16, 64);
    on(0, [&] {
        LoopbackPair pair = connectLoopbackPair();
        MultishotReceiver rx(*pool, pair.server.fd());
        {
            inject::ArmedFault refuse(inject::Point::kMultishotRecv, ENOMEM, 1);
            auto r = rx.next(5s);
            ASSERT_FALSE(r);
            EXPECT_EQ(r.errorCode(), ENOMEM);
        }
        ASSERT_TRUE(pair.client.writeAll("later", 5, 5s));
        auto b = rx.next(5s);
        ASSERT_TRUE(b) << b.error().message();
        EXPECT_EQ(std::string(b->data(), b->size()), "later");
        EXPECT_EQ(rx.stats().arms, 1u);
    }).join();
}

TEST(MultishotRecvOffFiber, APlainThreadReceivesThroughOneShotReceives) {
    auto pool = makePool(16, 64);
    LoopbackPair pair = connectLoopbackPair();  // on this thread: one-shot accept and connect
    MultishotReceiver rx(*pool, pair.server.fd());
    ASSERT_TRUE(pair.client.writeAll("thread", 6));
    auto b = rx.next(5s);
    ASSERT_TRUE(b);
    EXPECT_EQ(std::string(b->data(), b->size()), "thread");
    EXPECT_EQ(rx.stats().oneShot, 1u);
    EXPECT_EQ(rx.stats().arms, 0u);
    auto t = rx.next(20ms);
    ASSERT_FALSE(t);
    EXPECT_EQ(t.errorCode(), ETIMEDOUT);
}

TEST_F(MultishotRecv, BufferedReaderCarriesAHeadSplitAcrossBuffersWithMultishotAndWithout) {
    auto pool = makePool(64, 16);  // 16-byte buffers: every line spans several
    for (bool multishot : {true, false}) {
        on(0, [&] {
            LoopbackPair pair = connectLoopbackPair();
            BufferedReader reader(pair.server, 256, pool.get(), multishot);
            ASSERT_TRUE(pair.client.setNoDelay());
            std::string sent;
            for (int i = 0; i < 200; ++i) {
                const std::string line = "a rather long line number " + std::to_string(i) + "\n";
                ASSERT_TRUE(pair.client.writeAll(line.data(), line.size(), 5s));
                sent += line;
            }
            std::string got;
            while (got.size() < sent.size()) {
                const size_t nl = reader.view().find('\n');
                if (nl == std::string_view::npos) {
                    auto n = reader.fill(5s);
                    ASSERT_TRUE(n) << n.error().message();
                    ASSERT_GT(*n, 0u);
                    continue;
                }
                got.append(reader.view().substr(0, nl + 1));
                reader.consume(nl + 1);
            }
            EXPECT_EQ(got, sent);
            EXPECT_EQ(reader.memoryHeld(), 0u);
            EXPECT_EQ(reader.receiver() != nullptr, multishot);
        }).join();
    }
}

}  // namespace
}  // namespace spindle::net
