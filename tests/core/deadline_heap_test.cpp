// SPDX-License-Identifier: Apache-2.0
// Tests for DeadlineHeap: ordering, FIFO ties, removal from every position,
// index bookkeeping, and a long random run checked against a std::multiset model.

#include "core/internal/deadline_heap.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <random>
#include <set>
#include <utility>
#include <vector>

namespace spindle::detail {
namespace {

TEST(DeadlineHeap, EmptyHeap) {
    DeadlineHeap heap;
    EXPECT_TRUE(heap.empty());
    EXPECT_EQ(heap.size(), 0u);
    EXPECT_EQ(heap.top(), nullptr);
    EXPECT_EQ(heap.pop(), nullptr);
    EXPECT_EQ(heap.nextDeadline(), UINT64_MAX);
    EXPECT_TRUE(heap.checkInvariants());
}

TEST(DeadlineHeap, PopsInDeadlineOrder) {
    std::vector<HeapNode> nodes(200);
    std::vector<uint64_t> deadlines(nodes.size());
    for (size_t i = 0; i < deadlines.size(); ++i) { deadlines[i] = 1000 + i * 10; }
    std::mt19937_64 rng(7);
    std::shuffle(deadlines.begin(), deadlines.end(), rng);

    DeadlineHeap heap;
    heap.reserve(nodes.size());
    for (size_t i = 0; i < nodes.size(); ++i) {
        heap.push(&nodes[i], deadlines[i]);
        EXPECT_TRUE(nodes[i].inHeap());
    }
    ASSERT_TRUE(heap.checkInvariants());
    EXPECT_EQ(heap.size(), nodes.size());
    EXPECT_EQ(heap.nextDeadline(), 1000u);

    std::sort(deadlines.begin(), deadlines.end());
    for (uint64_t expected : deadlines) {
        ASSERT_EQ(heap.nextDeadline(), expected);
        HeapNode* top = heap.top();
        HeapNode* popped = heap.pop();
        ASSERT_EQ(popped, top);
        EXPECT_EQ(popped->deadline, expected);
        EXPECT_FALSE(popped->inHeap());
        EXPECT_EQ(popped->index, HeapNode::kNotInHeap);
    }
    EXPECT_TRUE(heap.empty());
    EXPECT_EQ(heap.pop(), nullptr);
}

TEST(DeadlineHeap, EqualDeadlinesPopInPushOrder) {
    std::vector<HeapNode> nodes(300);
    DeadlineHeap heap;
    // Interleave three deadlines so ties are spread over the whole heap.
    for (size_t i = 0; i < nodes.size(); ++i) { heap.push(&nodes[i], 50 - (i % 3) * 10); }
    ASSERT_TRUE(heap.checkInvariants());
    for (uint64_t deadline : {30u, 40u, 50u}) {
        const HeapNode* prev = nullptr;
        for (size_t k = 0; k < nodes.size() / 3; ++k) {
            HeapNode* n = heap.pop();
            ASSERT_NE(n, nullptr);
            ASSERT_EQ(n->deadline, deadline);
            if (prev != nullptr) { ASSERT_GT(n, prev) << "pushed earlier must pop earlier"; }
            prev = n;  // nodes were pushed in address order
        }
    }
    EXPECT_TRUE(heap.empty());
}

TEST(DeadlineHeap, RepushedNodeQueuesBehindEqualDeadlines) {
    HeapNode a, b, c;
    DeadlineHeap heap;
    heap.push(&a, 5);
    heap.push(&b, 5);
    heap.push(&c, 5);
    ASSERT_TRUE(heap.remove(&a));
    heap.push(&a, 5);
    EXPECT_EQ(heap.pop(), &b);
    EXPECT_EQ(heap.pop(), &c);
    EXPECT_EQ(heap.pop(), &a);
}

TEST(DeadlineHeap, RemoveOfNonMemberReturnsFalse) {
    DeadlineHeap heap;
    DeadlineHeap other;
    HeapNode never, popped, removed, elsewhere, kept;
    heap.push(&popped, 1);
    heap.push(&removed, 2);
    heap.push(&kept, 3);
    other.push(&elsewhere, 0);  // index 0 is in range for `heap` too

    EXPECT_FALSE(heap.remove(&never));
    EXPECT_EQ(heap.pop(), &popped);
    EXPECT_FALSE(heap.remove(&popped));
    EXPECT_TRUE(heap.remove(&removed));
    EXPECT_FALSE(heap.remove(&removed));
    EXPECT_FALSE(heap.remove(&elsewhere));
    EXPECT_TRUE(elsewhere.inHeap());  // untouched: still in `other`
    EXPECT_EQ(heap.size(), 1u);
    EXPECT_EQ(heap.top(), &kept);
    EXPECT_TRUE(heap.checkInvariants());
    EXPECT_EQ(other.pop(), &elsewhere);
}

// Builds a heap of n nodes with distinct deadlines, removes the node in
// `slot`, and checks that the rest still pop in order.
void removeAtSlotAndDrain(size_t n, size_t slot) {
    std::vector<HeapNode> nodes(n);
    std::vector<uint64_t> deadlines(n);
    for (size_t i = 0; i < n; ++i) { deadlines[i] = (i * 7919) % 1009; }  // distinct, scrambled
    DeadlineHeap heap;
    for (size_t i = 0; i < n; ++i) { heap.push(&nodes[i], deadlines[i]); }
    ASSERT_TRUE(heap.checkInvariants());

    HeapNode* victim = nullptr;
    for (HeapNode& node : nodes) {
        if (node.index == slot) { victim = &node; }
    }
    ASSERT_NE(victim, nullptr);
    const uint64_t victimDeadline = victim->deadline;
    ASSERT_TRUE(heap.remove(victim));
    EXPECT_FALSE(victim->inHeap());
    EXPECT_EQ(heap.size(), n - 1);
    ASSERT_TRUE(heap.checkInvariants());

    deadlines.erase(std::find(deadlines.begin(), deadlines.end(), victimDeadline));
    std::sort(deadlines.begin(), deadlines.end());
    for (uint64_t expected : deadlines) {
        HeapNode* node = heap.pop();
        ASSERT_NE(node, nullptr);
        ASSERT_EQ(node->deadline, expected);
    }
    EXPECT_TRUE(heap.empty());
}

TEST(DeadlineHeap, RemoveTop) { removeAtSlotAndDrain(50, 0); }
TEST(DeadlineHeap, RemoveLast) { removeAtSlotAndDrain(50, 49); }
TEST(DeadlineHeap, RemoveMiddle) { removeAtSlotAndDrain(50, 25); }
TEST(DeadlineHeap, RemoveOnlyNode) { removeAtSlotAndDrain(1, 0); }

TEST(DeadlineHeap, RemoveEverySlot) {
    for (size_t slot = 0; slot < 40; ++slot) { removeAtSlotAndDrain(40, slot); }
}

// remove() refills the hole with the old last node; when that node comes from
// a subtree with smaller keys it must move up, not down.
TEST(DeadlineHeap, RemoveWhereReplacementSiftsUp) {
    // Pushed in level order with every child >= its parent, so nothing sifts
    // and slot i holds nodes[i]. In the 4-ary layout slot 1's children are
    // slots 5..8 and slot 2's are 9..12.
    const uint64_t deadlines[] = {0, 50, 5, 100, 100, 60, 61, 62, 63, 6, 7, 8, 9};
    constexpr size_t kCount = sizeof(deadlines) / sizeof(deadlines[0]);
    std::vector<HeapNode> nodes(kCount);
    DeadlineHeap heap;
    for (size_t i = 0; i < kCount; ++i) { heap.push(&nodes[i], deadlines[i]); }
    for (size_t i = 0; i < kCount; ++i) { ASSERT_EQ(nodes[i].index, i); }

    // Slot 5's parent has deadline 50; the last node (deadline 9) goes into
    // slot 5, then must rise above the 50 into slot 1.
    ASSERT_TRUE(heap.remove(&nodes[5]));
    EXPECT_EQ(nodes[12].index, 1u);
    EXPECT_EQ(nodes[1].index, 5u);
    ASSERT_TRUE(heap.checkInvariants());
    std::vector<uint64_t> popped;
    while (HeapNode* n = heap.pop()) { popped.push_back(n->deadline); }
    EXPECT_TRUE(std::is_sorted(popped.begin(), popped.end()));
    EXPECT_EQ(popped.size(), kCount - 1);
}

TEST(DeadlineHeap, MoveKeepsNodesValid) {
    std::vector<HeapNode> nodes(20);
    DeadlineHeap heap;
    for (size_t i = 0; i < nodes.size(); ++i) { heap.push(&nodes[i], 100 - i); }
    DeadlineHeap moved(std::move(heap));
    EXPECT_TRUE(heap.empty());  // NOLINT(bugprone-use-after-move): documented state
    EXPECT_EQ(moved.size(), nodes.size());
    EXPECT_TRUE(moved.checkInvariants());
    EXPECT_TRUE(moved.remove(&nodes[3]));
    EXPECT_FALSE(heap.remove(&nodes[4]));
    DeadlineHeap assigned;
    assigned = std::move(moved);
    EXPECT_TRUE(moved.empty());  // NOLINT(bugprone-use-after-move)
    EXPECT_EQ(assigned.pop(), &nodes[19]);
    EXPECT_TRUE(assigned.checkInvariants());
}

TEST(DeadlineHeap, RandomOperationsMatchMultisetModel) {
    constexpr size_t kNodes = 512;
    constexpr int kOps = 100000;
    std::vector<HeapNode> nodes(kNodes);
    std::vector<bool> member(kNodes, false);  // the model's view of inHeap()
    std::multiset<std::pair<uint64_t, uint64_t>> model;
    DeadlineHeap heap;
    std::mt19937_64 rng(20240601);

    auto keyOf = [](const HeapNode& n) { return std::make_pair(n.deadline, n.seq); };
    for (int op = 0; op < kOps; ++op) {
        const size_t pick = static_cast<size_t>(rng() % kNodes);
        HeapNode& node = nodes[pick];
        switch (rng() % 8) {
            case 0: case 1: case 2: case 3: {  // push, biased so the heap fills up
                if (member[pick]) { break; }
                // Small range for many ties; now and then a huge deadline.
                const uint64_t deadline = rng() % 16 == 0 ? UINT64_MAX - rng() % 4 : rng() % 64;
                heap.push(&node, deadline);
                member[pick] = true;
                model.insert(keyOf(node));
                break;
            }
            case 4: case 5: {  // pop
                HeapNode* top = heap.pop();
                if (model.empty()) {
                    ASSERT_EQ(top, nullptr);
                    break;
                }
                ASSERT_NE(top, nullptr);
                ASSERT_EQ(keyOf(*top), *model.begin());
                ASSERT_FALSE(top->inHeap());
                model.erase(model.begin());
                member[static_cast<size_t>(top - nodes.data())] = false;
                break;
            }
            default: {  // remove a random node, member or not
                const bool wasMember = member[pick];
                ASSERT_EQ(heap.remove(&node), wasMember);
                ASSERT_FALSE(node.inHeap());
                if (wasMember) {
                    auto it = model.find(keyOf(node));
                    ASSERT_NE(it, model.end());
                    model.erase(it);
                    member[pick] = false;
                }
                break;
            }
        }
        ASSERT_EQ(heap.size(), model.size());
        if (model.empty()) {
            ASSERT_EQ(heap.top(), nullptr);
            ASSERT_EQ(heap.nextDeadline(), UINT64_MAX);
        } else {
            ASSERT_EQ(keyOf(*heap.top()), *model.begin());
            ASSERT_EQ(heap.nextDeadline(), model.begin()->first);
        }
        if (op % 64 == 0) { ASSERT_TRUE(heap.checkInvariants()) << "after op " << op; }
    }
    ASSERT_TRUE(heap.checkInvariants());
    for (size_t i = 0; i < kNodes; ++i) { ASSERT_EQ(nodes[i].inHeap(), member[i]) << "node " << i; }
}

}  // namespace
}  // namespace spindle::detail
