// SPDX-License-Identifier: Apache-2.0
// Tests for IntrusiveMpscQueue: FIFO batches, the was-empty signal, exactly-once
// delivery with per-producer order under four producers, and the Dekker park
// protocol the carrier builds on push()/empty().

#include "core/internal/mpsc_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <semaphore>
#include <thread>
#include <vector>

#include "tests/core/with_runtime.h"

namespace spindle::detail {
namespace {

using namespace testing_support;

// Sanitizer builds run 5-20x slower and CI gives them two cores; keep each
// stress test well under ten seconds there.
constexpr int kPerProducer = kSanitized ? (1 << 14) : (1 << 16);
constexpr int kProducers = 4;

struct Msg : MpscNode {
    int producer = 0;
    int seq = 0;
    int payload = 0;  // plain field: TSan checks that push publishes it
};

Msg* asMsg(MpscNode* node) { return static_cast<Msg*>(node); }

// Collects the seq fields of a popAll() list and checks that it is terminated.
std::vector<int> seqsOf(MpscNode* list) {
    std::vector<int> seqs;
    for (MpscNode* n = list; n != nullptr; n = n->next) { seqs.push_back(asMsg(n)->seq); }
    return seqs;
}

TEST(MpscQueue, EmptyQueueYieldsNothing) {
    IntrusiveMpscQueue queue;
    EXPECT_TRUE(queue.empty());
    EXPECT_EQ(queue.popAll(), nullptr);
    EXPECT_TRUE(queue.empty());
}

TEST(MpscQueue, SingleProducerIsFifo) {
    IntrusiveMpscQueue queue;
    std::vector<Msg> msgs(100);
    for (int i = 0; i < 100; ++i) {
        msgs[static_cast<size_t>(i)].seq = i;
        queue.push(&msgs[static_cast<size_t>(i)]);
    }
    EXPECT_FALSE(queue.empty());
    MpscNode* list = queue.popAll();
    ASSERT_NE(list, nullptr);
    EXPECT_EQ(list, &msgs.front());
    EXPECT_EQ(msgs.back().next, nullptr);
    std::vector<int> seqs = seqsOf(list);
    ASSERT_EQ(seqs.size(), 100u);
    for (int i = 0; i < 100; ++i) { EXPECT_EQ(seqs[static_cast<size_t>(i)], i); }
    EXPECT_TRUE(queue.empty());
    EXPECT_EQ(queue.popAll(), nullptr);
}

TEST(MpscQueue, SingleNodeIsTerminated) {
    IntrusiveMpscQueue queue;
    Msg msg;
    msg.next = &msg;  // garbage left from an earlier use must not leak out
    queue.push(&msg);
    EXPECT_EQ(queue.popAll(), &msg);
    EXPECT_EQ(msg.next, nullptr);
}

TEST(MpscQueue, PushReportsWhetherQueueWasEmpty) {
    IntrusiveMpscQueue queue;
    Msg a, b, c;
    EXPECT_TRUE(queue.push(&a));
    EXPECT_FALSE(queue.push(&b));
    EXPECT_FALSE(queue.push(&c));
    ASSERT_NE(queue.popAll(), nullptr);
    EXPECT_TRUE(queue.push(&a));  // empty again after popAll
    EXPECT_FALSE(queue.push(&b));
    ASSERT_NE(queue.popAll(), nullptr);
    EXPECT_TRUE(queue.push(&c));
}

TEST(MpscQueue, BatchesComeOutInPushOrder) {
    IntrusiveMpscQueue queue;
    std::vector<Msg> msgs(6);
    for (int i = 0; i < 6; ++i) { msgs[static_cast<size_t>(i)].seq = i; }
    for (int i = 0; i < 3; ++i) { queue.push(&msgs[static_cast<size_t>(i)]); }
    EXPECT_EQ(seqsOf(queue.popAll()), (std::vector<int>{0, 1, 2}));
    for (int i = 3; i < 6; ++i) { queue.push(&msgs[static_cast<size_t>(i)]); }
    EXPECT_EQ(seqsOf(queue.popAll()), (std::vector<int>{3, 4, 5}));
    // Nodes may be reused once popAll() has handed them back.
    queue.push(&msgs[5]);
    queue.push(&msgs[0]);
    EXPECT_EQ(seqsOf(queue.popAll()), (std::vector<int>{5, 0}));
}

// Checks one popAll() list against per-producer expectations; returns its length.
int consumeBatch(MpscNode* list, std::vector<int>& nextSeq) {
    int count = 0;
    for (MpscNode* n = list; n != nullptr;) {
        MpscNode* next = n->next;  // read before the node is considered handed back
        Msg* m = asMsg(n);
        EXPECT_GE(m->producer, 0);
        EXPECT_LT(m->producer, kProducers);
        int& expected = nextSeq[static_cast<size_t>(m->producer)];
        EXPECT_EQ(m->seq, expected) << "producer " << m->producer;
        EXPECT_EQ(m->payload, m->seq * 7 + m->producer);
        expected = m->seq + 1;
        ++count;
        n = next;
    }
    return count;
}

TEST(MpscQueueStress, EachNodeOnceInProducerOrder) {
    std::vector<std::vector<Msg>> msgs(kProducers, std::vector<Msg>(kPerProducer));
    IntrusiveMpscQueue queue;
    std::vector<int> nextSeq(kProducers, 0);
    int received = 0;
    {
        std::vector<std::jthread> producers;
        for (int p = 0; p < kProducers; ++p) {
            producers.emplace_back([&, p] {
                for (int i = 0; i < kPerProducer; ++i) {
                    Msg& m = msgs[static_cast<size_t>(p)][static_cast<size_t>(i)];
                    m.producer = p;
                    m.seq = i;
                    m.payload = i * 7 + p;
                    queue.push(&m);
                }
            });
        }
        while (received < kProducers * kPerProducer) {
            MpscNode* list = queue.popAll();
            if (list == nullptr) {
                std::this_thread::yield();
                continue;
            }
            received += consumeBatch(list, nextSeq);
        }
    }
    EXPECT_EQ(received, kProducers * kPerProducer);
    EXPECT_TRUE(queue.empty());
    for (int p = 0; p < kProducers; ++p) { EXPECT_EQ(nextSeq[static_cast<size_t>(p)], kPerProducer); }
}

// The carrier's park protocol: the consumer publishes parked = true and then
// re-checks empty(); a producer pushes and then reads parked. If either side
// missed the other, the consumer would sleep with a node queued and this test
// would hang (ctest's timeout reports it), so finishing is the verdict.
TEST(MpscQueueStress, DekkerParkLosesNoWakeup) {
    std::vector<std::vector<Msg>> msgs(kProducers, std::vector<Msg>(kPerProducer));
    IntrusiveMpscQueue queue;
    std::atomic<bool> parked{false};
    std::counting_semaphore<> wake(0);
    std::vector<int> nextSeq(kProducers, 0);
    int received = 0;
    int sleeps = 0;
    {
        std::vector<std::jthread> producers;
        for (int p = 0; p < kProducers; ++p) {
            producers.emplace_back([&, p] {
                for (int i = 0; i < kPerProducer; ++i) {
                    Msg& m = msgs[static_cast<size_t>(p)][static_cast<size_t>(i)];
                    m.producer = p;
                    m.seq = i;
                    m.payload = i * 7 + p;
                    queue.push(&m);
                    // Exactly one waker per park: whoever flips parked back to false.
                    if (parked.load(std::memory_order_seq_cst) &&
                        parked.exchange(false, std::memory_order_seq_cst)) {
                        wake.release();
                    }
                }
            });
        }
        while (received < kProducers * kPerProducer) {
            if (MpscNode* list = queue.popAll()) {
                received += consumeBatch(list, nextSeq);
                continue;
            }
            parked.store(true, std::memory_order_seq_cst);
            if (!queue.empty() && parked.exchange(false, std::memory_order_seq_cst)) {
                continue;  // cancelled our own park; no producer owes us a release
            }
            // Either the queue looked empty, or a producer already claimed the
            // wake-up and has released or will release the semaphore.
            wake.acquire();
            ++sleeps;
        }
    }
    EXPECT_EQ(received, kProducers * kPerProducer);
    EXPECT_FALSE(parked.load());
    EXPECT_TRUE(queue.empty());
    RecordProperty("sleeps", sleeps);  // informational only
}

}  // namespace
}  // namespace spindle::detail
