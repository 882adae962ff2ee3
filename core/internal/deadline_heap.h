// SPDX-License-Identifier: Apache-2.0
#pragma once
/// DeadlineHeap: a carrier's timer queue, an intrusive min-heap of HeapNodes
/// ordered by deadline, with O(log n) push, pop and removal of any node.
///
/// It is a 4-ary heap on a std::vector<HeapNode*>: half the depth of a binary
/// heap, and the four children of a slot share a cache line of pointers. Each
/// node records its slot in `index`, which is what makes remove() (a cancelled
/// or completed timeout) O(log n) without a search. Equal deadlines pop in push
/// order: the heap stamps each pushed node with an increasing `seq` and orders
/// by (deadline, seq), which is also a strict total order, so the result never
/// depends on how the heap happens to be laid out.
///
/// Thread-safety: none; the owning carrier is the only user of a heap and of
/// the nodes in it.
/// Errors: push() may allocate when the vector grows and then throws
/// std::bad_alloc, leaving heap and node unchanged; reserve(n) up front makes
/// the next pushes up to size n allocation-free. Nothing else allocates.
/// Precondition: a node is in at most one heap, and stays alive while in it.
/// The heap does not own nodes; nodes still in it when it is destroyed keep
/// their stale index.

#include <cstddef>
#include <cstdint>
#include <new>
#include <utility>
#include <vector>

#include "base/check.h"
#include "base/inject.h"

namespace spindle::detail {

/// Intrusive timer link; embed it in the object that waits for the deadline.
struct HeapNode {
    static constexpr uint32_t kNotInHeap = UINT32_MAX;
    uint64_t deadline = 0;  // ns on CLOCK_MONOTONIC; the key
    uint64_t seq = 0;       // set by the heap on push: ties on deadline pop in push order (FIFO)
    // Invariant: kNotInHeap, or the node's slot in the heap that holds it.
    uint32_t index = kNotInHeap;
    bool inHeap() const noexcept { return index != kNotInHeap; }
};

class DeadlineHeap {
public:
    DeadlineHeap() = default;
    DeadlineHeap(const DeadlineHeap&) = delete;  // two heaps cannot share the nodes' index
    DeadlineHeap& operator=(const DeadlineHeap&) = delete;
    /// Moving keeps every node's slot, so indices stay valid; the source is left empty.
    DeadlineHeap(DeadlineHeap&& other) noexcept
        : heap_(std::move(other.heap_)), nextSeq_(other.nextSeq_) {
        other.heap_.clear();
    }
    /// Precondition: *this is empty (its nodes would otherwise be orphaned).
    DeadlineHeap& operator=(DeadlineHeap&& other) noexcept {
        SPINDLE_ASSERT(heap_.empty());
        heap_ = std::move(other.heap_);
        nextSeq_ = other.nextSeq_;
        other.heap_.clear();
        return *this;
    }

    /// Inserts node with the given deadline and stamps its seq; a node pushed
    /// again after leaving the heap queues behind nodes already there with the
    /// same deadline.
    /// Precondition: !node->inHeap().
    /// Errors: throws std::bad_alloc if the vector must grow and cannot.
    void push(HeapNode* node, uint64_t deadline);

    /// Makes room for n nodes so that pushes up to that size do not allocate.
    /// Errors: throws std::bad_alloc.
    void reserve(size_t n) { heap_.reserve(n); }

    /// The node with the earliest (deadline, seq), or nullptr when empty.
    HeapNode* top() const noexcept { return heap_.empty() ? nullptr : heap_.front(); }

    /// Removes and returns top(), with its index reset to kNotInHeap; nullptr when empty.
    HeapNode* pop() noexcept;

    /// Removes node in O(log n) and resets its index. Returns false, changing
    /// nothing, if node is not in this heap (never pushed, already popped or
    /// removed, or in a different heap).
    bool remove(HeapNode* node) noexcept;

    size_t size() const noexcept { return heap_.size(); }
    bool empty() const noexcept { return heap_.empty(); }

    /// top()'s deadline, or UINT64_MAX when empty (a wait with no timeout).
    uint64_t nextDeadline() const noexcept { return heap_.empty() ? UINT64_MAX : heap_.front()->deadline; }

    /// Debug and test helper, O(n): true if every node's index names its slot
    /// and no node orders before its parent.
    bool checkInvariants() const noexcept;

private:
    static constexpr size_t kArity = 4;

    static size_t parentOf(size_t i) noexcept { return (i - 1) / kArity; }
    static size_t firstChildOf(size_t i) noexcept { return i * kArity + 1; }
    // Strict total order: seq is unique among nodes in the heap.
    static bool before(const HeapNode* a, const HeapNode* b) noexcept {
        return a->deadline != b->deadline ? a->deadline < b->deadline : a->seq < b->seq;
    }

    void place(HeapNode* node, size_t i) noexcept {
        heap_[i] = node;
        node->index = static_cast<uint32_t>(i);
    }
    void siftUp(size_t i) noexcept;
    void siftDown(size_t i) noexcept;
    HeapNode* removeAt(size_t i) noexcept;

    // Invariant: for every slot i, heap_[i]->index == i, and for i > 0
    // !before(heap_[i], heap_[parentOf(i)]). size() < kNotInHeap, so every
    // slot number fits in HeapNode::index without colliding with kNotInHeap.
    std::vector<HeapNode*> heap_;
    uint64_t nextSeq_ = 0;  // next seq to stamp; 2^64 pushes do not happen
};

inline void DeadlineHeap::push(HeapNode* node, uint64_t deadline) {
    SPINDLE_ASSERT(node != nullptr && !node->inHeap());
    SPINDLE_CHECK_MSG(heap_.size() < HeapNode::kNotInHeap - 1, "DeadlineHeap: too many timers");
    if (heap_.size() == heap_.capacity()) { SPINDLE_INJECT(inject::Point::kGrowFail, { throw std::bad_alloc(); }); }
    heap_.push_back(node);  // may throw; nothing has been changed yet
    node->deadline = deadline;
    node->seq = nextSeq_++;
    siftUp(heap_.size() - 1);  // sets node->index
}

inline HeapNode* DeadlineHeap::pop() noexcept {
    return heap_.empty() ? nullptr : removeAt(0);
}

inline bool DeadlineHeap::remove(HeapNode* node) noexcept {
    // The slot check rejects a node that belongs to another heap (its index
    // may be in range here) without trusting its index blindly.
    if (!node->inHeap() || node->index >= heap_.size() || heap_[node->index] != node) {
        return false;
    }
    removeAt(node->index);
    return true;
}

inline HeapNode* DeadlineHeap::removeAt(size_t i) noexcept {
    HeapNode* node = heap_[i];
    HeapNode* last = heap_.back();
    heap_.pop_back();
    node->index = HeapNode::kNotInHeap;
    if (i < heap_.size()) {
        // The hole at i is refilled with the old last node, which may belong
        // above or below i; at most one of the two sifts moves it.
        place(last, i);
        if (i > 0 && before(last, heap_[parentOf(i)])) {
            siftUp(i);
        } else {
            siftDown(i);
        }
    }
    return node;
}

inline void DeadlineHeap::siftUp(size_t i) noexcept {
    HeapNode* node = heap_[i];
    while (i > 0) {
        const size_t p = parentOf(i);
        if (!before(node, heap_[p])) { break; }
        place(heap_[p], i);
        i = p;
    }
    place(node, i);
}

inline void DeadlineHeap::siftDown(size_t i) noexcept {
    HeapNode* node = heap_[i];
    const size_t n = heap_.size();
    for (;;) {
        const size_t first = firstChildOf(i);
        if (first >= n) { break; }
        const size_t end = first + kArity < n ? first + kArity : n;
        size_t best = first;
        for (size_t c = first + 1; c < end; ++c) {
            if (before(heap_[c], heap_[best])) { best = c; }
        }
        if (!before(heap_[best], node)) { break; }
        place(heap_[best], i);
        i = best;
    }
    place(node, i);
}

inline bool DeadlineHeap::checkInvariants() const noexcept {
    if (heap_.size() >= HeapNode::kNotInHeap) { return false; }
    for (size_t i = 0; i < heap_.size(); ++i) {
        const HeapNode* node = heap_[i];
        if (node == nullptr || node->index != i) { return false; }
        if (i > 0 && before(node, heap_[parentOf(i)])) { return false; }
    }
    return true;
}

}  // namespace spindle::detail
