// SPDX-License-Identifier: Apache-2.0
// Incremental consumption of a provided-buffer ring (IOU_PBUF_RING_INC, Linux 6.12): receives share a
// buffer, each a slice after the one before; a buffer goes back to the ring only once the kernel let go
// of it and every slice was released; a message that spans two buffers arrives whole; single receives
// and multishot receives on one carrier tell their slices apart; and a kernel without the feature (the
// registration refused with EINVAL, forced with the kRegisterBufRing fault point) gets whole buffers.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/inject.h"
#include "net/buffered.h"
#include "net/provided_buffers.h"
#include "tests/core/with_runtime.h"
#include "tests/net/loopback_pair.h"

namespace spindle::net {
namespace {

using namespace std::chrono_literals;

using testing_support::connectLoopbackPair;
using testing_support::LoopbackPair;

std::unique_ptr<ProvidedBufferPool> makePool(unsigned count, size_t size, bool incremental = true) {
    auto p = ProvidedBufferPool::create(ProvidedBufferOptions{.count = count, .size = size, .incremental = incremental});
    SPINDLE_CHECK(static_cast<bool>(p));
    return std::move(*p);
}

std::string text(const ProvidedBuffer& b) { return std::string(b.data(), b.size()); }

class IncrementalBuffers : public testing_support::WithRuntime {
protected:
    // Registers `pool` on carrier 0; false (the caller skips) where the kernel cannot consume incrementally.
    bool incrementalOnCarrier0(ProvidedBufferPool& pool) {
        on(0, [&] { (void)pool.ringAvailable(); }).join();
        return pool.stats().carriersIncremental == 1;
    }
};

#define SKIP_WITHOUT_INCREMENTAL(pool)                                                              \
    do {                                                                                            \
        SPINDLE_REQUIRE_URING("provided-buffer rings");                                             \
        if (!incrementalOnCarrier0(pool)) { GTEST_SKIP() << "no IOU_PBUF_RING_INC (Linux 6.12) here"; } \
    } while (0)

// Two small receives, on one connection and then on another, land in the same buffer one after the
// other: the memory touched follows the bytes, not the number of receives.
TEST_F(IncrementalBuffers, SmallReceivesShareOneBufferOneSliceAfterAnother) {
    auto pool = makePool(4, 256);
    SKIP_WITHOUT_INCREMENTAL(*pool);
    on(0, [&] {
        LoopbackPair a = connectLoopbackPair();
        LoopbackPair b = connectLoopbackPair();
        MultishotReceiver rxA(*pool, a.server.fd());
        MultishotReceiver rxB(*pool, b.server.fd());
        ASSERT_TRUE(a.client.writeAll("hello", 5, 5s));
        auto first = rxA.next(5s);
        ASSERT_TRUE(first) << first.error().message();
        ASSERT_TRUE(a.client.writeAll("world", 5, 5s));
        auto second = rxA.next(5s);
        ASSERT_TRUE(second) << second.error().message();
        ASSERT_TRUE(b.client.writeAll("other", 5, 5s));
        auto third = rxB.next(5s);
        ASSERT_TRUE(third) << third.error().message();
        EXPECT_EQ(text(*first), "hello");
        EXPECT_EQ(text(*second), "world");
        EXPECT_EQ(text(*third), "other");
        EXPECT_TRUE(first->provided() && second->provided() && third->provided());
        EXPECT_EQ(second->data(), first->data() + 5) << "the second receive did not continue the buffer";
        EXPECT_EQ(third->data(), first->data() + 10) << "another connection's receive did not continue it";
        EXPECT_EQ(first->capacity(), 5u) << "a slice holds its bytes, not the whole buffer";
    }).join();
    EXPECT_EQ(pool->stats().exhausted, 0u);
}

// A buffer the kernel filled goes back to the ring only when its last slice is released: while one is
// held, the ring runs dry (ENOBUFS, a heap buffer this once); once all are back, it is picked again
// from its start.
TEST_F(IncrementalBuffers, AFullBufferIsReusedOnlyOnceEverySliceIsBack) {
    auto pool = makePool(2, 64);
    SKIP_WITHOUT_INCREMENTAL(*pool);
    on(0, [&] {
        LoopbackPair a = connectLoopbackPair();
        ASSERT_TRUE(a.client.setNoDelay());
        MultishotReceiver rx(*pool, a.server.fd());
        std::vector<ProvidedBuffer> held;
        std::string got;
        // 128 bytes fill both buffers; every slice is held.
        const std::string fill(128, 'f');
        ASSERT_TRUE(a.client.writeAll(fill.data(), fill.size(), 5s));
        while (got.size() < fill.size()) {
            auto b = rx.next(5s);
            ASSERT_TRUE(b) << b.error().message();
            ASSERT_TRUE(b->provided());
            got += text(*b);
            held.push_back(std::move(*b));
        }
        EXPECT_EQ(got, fill);
        char* const firstBuffer = held.front().data();
        ASSERT_TRUE(a.client.writeAll("dry", 3, 5s));
        auto dry = rx.next(5s);  // both buffers full and held: the ring is empty
        ASSERT_TRUE(dry) << dry.error().message();
        EXPECT_EQ(text(*dry), "dry");
        EXPECT_FALSE(dry->provided());
        EXPECT_GE(pool->stats().exhausted, 1u);
        // Releasing all slices but one of the first buffer gives nothing back yet.
        char* const lastOfFirst = [&] {
            char* p = nullptr;
            for (auto& b : held) {
                if (b.data() >= firstBuffer && b.data() < firstBuffer + 64) { p = b.data(); }
            }
            return p;
        }();
        for (auto& b : held) {
            if (b.data() != lastOfFirst) { b.release(); }
        }
        const uint64_t exhaustedBefore = pool->stats().exhausted;
        ASSERT_TRUE(a.client.writeAll("next", 4, 5s));
        auto next = rx.next(5s);
        ASSERT_TRUE(next) << next.error().message();
        EXPECT_EQ(text(*next), "next");
        // The second buffer (all its slices released) came back whole; the first is still out.
        EXPECT_TRUE(next->provided());
        EXPECT_FALSE(next->data() >= firstBuffer && next->data() < firstBuffer + 64);
        EXPECT_EQ(pool->stats().exhausted, exhaustedBefore);
        held.clear();  // the last slice of the first buffer: it goes back to the ring too
        next->release();
    }).join();
}

// Slices released on a plain thread go back through the carrier's queue of returns, which holds a
// buffer id once however many of its slices come: several slices of one buffer released there, before
// the carrier drains them, bring the buffer back once, and the next receives are served from the ring.
TEST_F(IncrementalBuffers, SlicesReleasedOnAPlainThreadBringTheirBufferBackOnce) {
    auto pool = makePool(2, 64);
    SKIP_WITHOUT_INCREMENTAL(*pool);
    std::optional<LoopbackPair> pair;
    std::optional<MultishotReceiver> rx;
    std::vector<ProvidedBuffer> held;
    on(0, [&] {
        pair.emplace(connectLoopbackPair());
        ASSERT_TRUE(pair->client.setNoDelay());
        rx.emplace(*pool, pair->server.fd());
        const std::string chunk(16, 's');
        for (int i = 0; i < 8; ++i) {  // 8 slices of 16 bytes: both buffers full, four slices each
            ASSERT_TRUE(pair->client.writeAll(chunk.data(), chunk.size(), 5s));
            size_t got = 0;
            while (got < chunk.size()) {
                auto b = rx->next(5s);
                ASSERT_TRUE(b) << b.error().message();
                ASSERT_TRUE(b->provided());
                got += b->size();
                held.push_back(std::move(*b));
            }
        }
    }).join();
    EXPECT_GE(held.size(), 8u);
    std::thread([&] { held.clear(); }).join();
    const uint64_t exhaustedBefore = pool->stats().exhausted;
    on(0, [&] {
        for (const char* word : {"again", "and again"}) {
            ASSERT_TRUE(pair->client.writeAll(word, std::strlen(word), 5s));
            auto b = rx->next(5s);
            ASSERT_TRUE(b) << b.error().message();
            EXPECT_EQ(text(*b), word);
            EXPECT_TRUE(b->provided()) << "the buffers released elsewhere did not come back";
        }
        rx.reset();
        pair.reset();
    }).join();
    EXPECT_EQ(pool->stats().exhausted, exhaustedBefore);
}

// A message longer than what is left of a buffer comes in two CQEs, the end of one buffer and the
// start of the next; BufferedReader joins them (with a multishot receive and with single receives).
TEST_F(IncrementalBuffers, AMessageThatSpansTwoBuffersArrivesWhole) {
    auto pool = makePool(8, 64);
    SKIP_WITHOUT_INCREMENTAL(*pool);
    for (const bool multishot : {true, false}) {
        on(0, [&] {
            LoopbackPair a = connectLoopbackPair();
            ASSERT_TRUE(a.client.setNoDelay());
            BufferedReader reader(a.server, 1024, pool.get(), multishot);
            auto line = [&]() -> std::string {
                for (;;) {
                    const size_t nl = reader.view().find('\n');
                    if (nl != std::string_view::npos) {
                        std::string s(reader.view().substr(0, nl));
                        reader.consume(nl + 1);
                        return s;
                    }
                    auto n = reader.fill(5s);
                    if (!n || *n == 0) { return "<" + (n ? std::string("end") : n.error().message()) + ">"; }
                }
            };
            // 50 bytes, then 60: the second starts in the current buffer and ends in the next one.
            const std::string one(49, 'a');
            const std::string two(59, 'b');
            ASSERT_TRUE(a.client.writeAll((one + "\n").data(), 50, 5s));
            EXPECT_EQ(line(), one);
            ASSERT_TRUE(a.client.writeAll((two + "\n").data(), 60, 5s));
            EXPECT_EQ(line(), two);
            EXPECT_EQ(reader.memoryHeld(), 0u) << "an idle reader holds nothing";
        }).join();
    }
    EXPECT_EQ(pool->stats().exhausted, 0u);
    EXPECT_EQ(pool->stats().fallbackRecvs, 0u);
}

// Single receives (their CQE accounted by the carrier as it reaps it) and a multishot receive on
// another socket of the same carrier fill one buffer in turn; each gets its own bytes. A single
// receive that times out leaves the accounting intact: the next one continues where the last ended.
TEST_F(IncrementalBuffers, SingleAndMultishotReceivesTellTheirSlicesApart) {
    auto pool = makePool(4, 4096);
    SKIP_WITHOUT_INCREMENTAL(*pool);
    on(0, [&] {
        LoopbackPair a = connectLoopbackPair();
        LoopbackPair b = connectLoopbackPair();
        MultishotReceiver rx(*pool, b.server.fd());
        auto none = pool->recv(a.server.fd(), 20ms);
        ASSERT_FALSE(none);
        EXPECT_EQ(none.errorCode(), ETIMEDOUT);
        std::vector<ProvidedBuffer> held;
        for (int i = 0; i < 20; ++i) {
            const std::string wa = "single" + std::to_string(i);
            const std::string wb = "multi" + std::to_string(i);
            ASSERT_TRUE(b.client.writeAll(wb.data(), wb.size(), 5s));
            ASSERT_TRUE(a.client.writeAll(wa.data(), wa.size(), 5s));
            auto fromA = pool->recv(a.server.fd(), 5s);
            ASSERT_TRUE(fromA) << fromA.error().message();
            auto fromB = rx.next(5s);
            ASSERT_TRUE(fromB) << fromB.error().message();
            EXPECT_EQ(text(*fromA), wa);
            EXPECT_EQ(text(*fromB), wb);
            EXPECT_TRUE(fromA->provided());
            if (i % 2 == 0) {  // hold half of them: slices outlive later receives into the same buffer
                held.push_back(std::move(*fromA));
                held.push_back(std::move(*fromB));
            }
        }
        for (size_t i = 0; i < held.size(); i += 2) {
            EXPECT_EQ(text(held[i]), "single" + std::to_string(i));
            EXPECT_EQ(text(held[i + 1]), "multi" + std::to_string(i));
        }
    }).join();
    EXPECT_EQ(pool->stats().exhausted, 0u);
}

// A kernel without IOU_PBUF_RING_INC refuses the flag with EINVAL: the fault point refuses the first
// registration (the one with the flag) as such a kernel would, and the ring is registered without it;
// each receive then takes a whole buffer. ProvidedBufferOptions::incremental = false asks for the same.
TEST_F(IncrementalBuffers, WithoutTheFeatureEachReceiveTakesAWholeBuffer) {
    SPINDLE_REQUIRE_URING("provided-buffer rings");
    for (const bool probe : {true, false}) {  // the probe refused, or the feature not asked for
        auto pool = makePool(4, 256, /*incremental=*/probe);
        {
            std::optional<inject::ArmedFault> refuse;
            if (probe) { refuse.emplace(inject::Point::kRegisterBufRing, EINVAL, 1); }
            on(0, [&] { EXPECT_TRUE(pool->ringAvailable()); }).join();
            if (probe) { EXPECT_EQ(inject::remaining(inject::Point::kRegisterBufRing), 0u) << "not compiled in?"; }
        }
        const ProvidedBufferStats st = pool->stats();
        EXPECT_EQ(st.carriersRegistered, 1u);
        EXPECT_EQ(st.carriersIncremental, 0u);
        EXPECT_EQ(st.registerError, 0);
        on(0, [&] {
            LoopbackPair a = connectLoopbackPair();
            MultishotReceiver rx(*pool, a.server.fd());
            ASSERT_TRUE(a.client.writeAll("ab", 2, 5s));
            auto first = rx.next(5s);
            ASSERT_TRUE(first);
            ASSERT_TRUE(a.client.writeAll("cd", 2, 5s));
            auto second = rx.next(5s);
            ASSERT_TRUE(second);
            EXPECT_EQ(text(*first), "ab");
            EXPECT_EQ(text(*second), "cd");
            EXPECT_EQ(first->capacity(), 256u);
            EXPECT_NE(second->data(), first->data() + 2) << "whole buffers were asked for";
        }).join();
    }
}

}  // namespace
}  // namespace spindle::net
