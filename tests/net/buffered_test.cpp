// SPDX-License-Identifier: Apache-2.0
// BufferedReader/BufferedWriter and ProvidedBufferPool: parsing in place, messages split across
// receives, idle readers holding no memory with a pool, the heap fallback (refused registration,
// exhausted ring, plain threads), and the writer's coalescing.
#include "net/buffered.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "base/inject.h"
#include "net/provided_buffers.h"
#include "tests/core/with_runtime.h"
#include "tests/net/loopback_pair.h"

namespace spindle::net {
namespace {

using namespace std::chrono_literals;

using testing_support::connectLoopbackPair;
using testing_support::LoopbackPair;

// Reads lines ending in '\n' until `count` were seen; checks each against "line <i>".
void readLines(BufferedReader& r, int count) {
    int seen = 0;
    while (seen < count) {
        const std::string_view v = r.view();
        const size_t nl = v.find('\n');
        if (nl == std::string_view::npos) {
            auto n = r.fill(5s);
            ASSERT_TRUE(n) << n.error().message();
            ASSERT_GT(*n, 0u) << "end of stream after " << seen << " lines";
            continue;
        }
        EXPECT_EQ(v.substr(0, nl), "line " + std::to_string(seen));
        r.consume(nl + 1);
        ++seen;
    }
}

class Buffered : public testing_support::WithRuntime {};

TEST_F(Buffered, ReaderParsesInPlaceAndCarriesSplitMessagesWithAndWithoutAPool) {
    auto pool = ProvidedBufferPool::create(ProvidedBufferOptions{.count = 64, .size = 64});
    ASSERT_TRUE(pool);
    for (ProvidedBufferPool* p : {static_cast<ProvidedBufferPool*>(nullptr), pool->get()}) {
        onFiber([&] {
            LoopbackPair pair = connectLoopbackPair();
            BufferedReader reader(pair.server, 1024, p);
            EXPECT_EQ(reader.memoryHeld(), 0u);
            constexpr int kLines = 500;
            auto writer = spawn([&] {
                BufferedWriter w(pair.client, 100);  // small: forces flushes mid-line
                for (int i = 0; i < kLines; ++i) {
                    EXPECT_TRUE(w.write("line " + std::to_string(i) + "\n", 5s));
                }
                EXPECT_TRUE(w.flush(5s));
                EXPECT_EQ(w.pending(), 0u);
            }).value();
            readLines(reader, kLines);
            writer.join();
            EXPECT_EQ(reader.size(), 0u);
            if (p != nullptr) {
                EXPECT_EQ(reader.memoryHeld(), 0u) << "an idle reader with a pool holds nothing";
            }
            ASSERT_TRUE(pair.client.shutdown(SHUT_WR));
            auto end = reader.fill(5s);
            ASSERT_TRUE(end);
            EXPECT_EQ(*end, 0u);
        });
    }
    const ProvidedBufferStats st = (*pool)->stats();
    EXPECT_GT(st.providedRecvs, 0u);
    EXPECT_GE(st.carriersRegistered, 1u);
    EXPECT_EQ(st.registerError, 0);
}

TEST_F(Buffered, AFullReaderSaysEnobufsAndReadExactStopsAtEndOfStream) {
    onFiber([] {
        LoopbackPair pair = connectLoopbackPair();
        BufferedReader reader(pair.server, 8);
        ASSERT_TRUE(pair.client.writeAll("0123456789", 10));
        while (reader.size() < 8) { ASSERT_TRUE(reader.fill(5s)); }
        EXPECT_EQ(reader.fill(5s).errorCode(), ENOBUFS);
        char buf[4];
        ASSERT_TRUE(reader.readExact(buf, 4, 5s));
        EXPECT_EQ(std::string(buf, 4), "0123");
        ASSERT_TRUE(pair.client.close());
        char rest[8];
        auto r = reader.readExact(rest, 8, 5s);
        ASSERT_FALSE(r);
        EXPECT_EQ(r.errorCode(), ENODATA);
    });
}

TEST_F(Buffered, WriterSendsLargeWritesDirectlyAndKeepsOrder) {
    onFiber([] {
        LoopbackPair pair = connectLoopbackPair();
        const std::vector<char> big = testing_support::pattern(100000, 7);
        auto writer = spawn([&] {
            BufferedWriter w(pair.client, 4096);
            EXPECT_TRUE(w.write("head", 5s));
            EXPECT_TRUE(w.write(big.data(), big.size(), 5s));  // larger than the buffer
            EXPECT_EQ(w.pending(), 0u);
            EXPECT_TRUE(w.write("tail", 5s));
            EXPECT_EQ(w.pending(), 4u);
            EXPECT_TRUE(w.flush(5s));
        }).value();
        std::vector<char> got(4 + big.size() + 4);
        ASSERT_TRUE(pair.server.readExact(got.data(), got.size(), 10s));
        writer.join();
        EXPECT_EQ(std::string(got.data(), 4), "head");
        EXPECT_TRUE(std::equal(big.begin(), big.end(), got.begin() + 4));
        EXPECT_EQ(std::string(got.data() + 4 + big.size(), 4), "tail");
    });
}

// A write that fails part-way (the peer does not read; the deadline passes) says how many of the
// caller's bytes left, and a retry of only the rest delivers every byte exactly once.
TEST_F(Buffered, AWriteThatFailsPartWaySaysHowMuchLeftAndARetryOfTheRestSendsNothingTwice) {
    on(0, [&] {
        LoopbackPair pair = connectLoopbackPair();
        BufferedWriter w(pair.client, 16);
        size_t taken = 99;
        ASSERT_TRUE(w.write("HDR", 3, 5s, &taken));
        EXPECT_EQ(taken, 3u);
        const std::vector<char> big = testing_support::pattern(32u << 20, 9);  // far more than the socket holds
        auto r = w.write(big.data(), big.size(), 200ms, &taken);
        ASSERT_FALSE(r);
        EXPECT_EQ(r.errorCode(), ETIMEDOUT);
        EXPECT_EQ(w.pending(), 0u) << "the buffered bytes went first";
        EXPECT_GT(taken, 0u);
        EXPECT_LT(taken, big.size());
        std::vector<char> got;
        auto reader = on(1, [&] {
            std::vector<char> buf(1 << 16);
            for (;;) {
                auto n = pair.server.recv(buf.data(), buf.size(), 30s);
                if (!n || *n == 0) { break; }
                got.insert(got.end(), buf.data(), buf.data() + *n);
            }
        });
        ASSERT_TRUE(w.write(big.data() + taken, big.size() - taken, 30s));
        ASSERT_TRUE(pair.client.shutdown(SHUT_WR));
        reader.join();
        ASSERT_EQ(got.size(), 3u + big.size()) << "bytes the peer received";
        EXPECT_EQ(std::string(got.data(), 3), "HDR");
        EXPECT_TRUE(std::equal(big.begin(), big.end(), got.begin() + 3));
    }).join();
}

TEST_F(Buffered, PoolFallsBackToHeapBuffersWhenRegistrationIsRefused) {
    auto pool = ProvidedBufferPool::create(ProvidedBufferOptions{.count = 8, .size = 256});
    ASSERT_TRUE(pool);
    {
        inject::ArmedFault refuse(inject::Point::kRegisterBufRing, EINVAL, 100);
        onFiber([&] {
            LoopbackPair pair = connectLoopbackPair();
            ASSERT_TRUE(pair.client.writeAll("abc", 3));
            auto b = (*pool)->recv(pair.server.fd(), 5s);
            ASSERT_TRUE(b);
            EXPECT_FALSE(b->provided());
            EXPECT_EQ(std::string(b->data(), b->size()), "abc");
        });
    }
    const ProvidedBufferStats st = (*pool)->stats();
    EXPECT_EQ(st.registerError, EINVAL);
    EXPECT_EQ(st.carriersRegistered, 0u);
    EXPECT_GE(st.fallbackRecvs, 1u);
    EXPECT_EQ(st.providedRecvs, 0u);
}

TEST_F(Buffered, AnExhaustedRingFallsBackAndRecoversOnceBuffersReturn) {
    // Whole buffers: with incremental consumption "first" and "second" would share the one buffer.
    auto pool = ProvidedBufferPool::create(ProvidedBufferOptions{.count = 1, .size = 128, .incremental = false});
    ASSERT_TRUE(pool);
    onFiber([&] {
        LoopbackPair a = connectLoopbackPair();
        LoopbackPair b = connectLoopbackPair();
        ASSERT_TRUE(a.client.writeAll("first", 5));
        ASSERT_TRUE(b.client.writeAll("second", 6));
        // The pool's buffers are a kernel ring on io_uring and the epoll driver's buffer group on epoll:
        // the same leases either way.
        auto held = (*pool)->recv(a.server.fd(), 5s);  // takes the only buffer
        ASSERT_TRUE(held);
        EXPECT_TRUE(held->provided());
        auto other = (*pool)->recv(b.server.fd(), 5s);  // none left: ENOBUFS, then the heap
        ASSERT_TRUE(other);
        EXPECT_FALSE(other->provided());
        EXPECT_EQ((*pool)->stats().exhausted, 1u);
        EXPECT_EQ(std::string(held->data(), held->size()), "first");
        EXPECT_EQ(std::string(other->data(), other->size()), "second");
        held->release();
        ASSERT_TRUE(a.client.writeAll("again", 5));
        auto back = (*pool)->recv(a.server.fd(), 5s);
        ASSERT_TRUE(back);
        EXPECT_TRUE(back->provided()) << "the buffer given back is picked again";
        EXPECT_EQ(std::string(back->data(), back->size()), "again");
    }, 0);
    EXPECT_EQ(ProvidedBufferPool::create(ProvidedBufferOptions{.count = 3}).errorCode(), EINVAL);
    EXPECT_EQ(ProvidedBufferPool::create(ProvidedBufferOptions{.count = 0}).errorCode(), EINVAL);
    EXPECT_EQ(ProvidedBufferPool::create(ProvidedBufferOptions{.size = 0}).errorCode(), EINVAL);
    EXPECT_EQ(ProvidedBufferPool::create(ProvidedBufferOptions{.size = (2u << 20)}).errorCode(), EINVAL);
}

TEST(BufferedOffFiber, APooledReaderOnAPlainThreadReceivesIntoItsOwnBuffer) {
    auto pool = ProvidedBufferPool::create();
    ASSERT_TRUE(pool);
    LoopbackPair pair = connectLoopbackPair();  // on this thread: one-shot accept and connect
    ASSERT_TRUE(pair.client.writeAll("thread", 6));
    BufferedReader r(pair.server, 64, pool->get());
    ASSERT_TRUE(r.fill(5s));
    EXPECT_EQ(r.view(), "thread");
    // A plain thread has no ring: the reader receives into its own buffer, not through the pool.
    EXPECT_EQ((*pool)->stats().fallbackRecvs, 0u);
    EXPECT_GT(r.memoryHeld(), 0u);
}

}  // namespace
}  // namespace spindle::net
