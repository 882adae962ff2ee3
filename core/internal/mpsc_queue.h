// SPDX-License-Identifier: Apache-2.0
#pragma once
/// IntrusiveMpscQueue: lock-free multi-producer, single-consumer queue of
/// caller-owned nodes; a carrier's inbox for wake-ups and cross-carrier messages.
///
/// Producers push onto a Treiber stack with a CAS loop. The consumer takes the
/// whole stack with one exchange(nullptr) and reverses it into push order.
/// Because the consumer never pops a single node while producers run, a node
/// cannot be removed and re-pushed between a producer's read of head_ and its
/// CAS, so there is no ABA problem and no tagged pointer.
///
/// Thread-safety: push() and empty() on any thread; popAll() on one consumer
/// thread at a time.
/// Memory ordering: push() is a seq_cst read-modify-write and empty() is a
/// seq_cst load, so both take part in the single total order of seq_cst
/// operations. That makes the carrier's Dekker park protocol sound: the carrier
/// stores parked = true (seq_cst) and then checks empty(); a producer push()es
/// and then loads parked (seq_cst); at least one of them sees the other's
/// write, so a push is never stranded behind a sleeping carrier. Writes a
/// producer makes before push(node), including to *node, happen before
/// everything the consumer does after the popAll() that returns node.
/// Precondition: a node is in at most one queue at a time and stays alive, and
/// untouched by its owner, from push() until popAll() hands it back.

#include <atomic>

namespace spindle::detail {

/// Link embedded in a queued object; recover the object with offsetof or a
/// static_cast from a base. Only the queue writes next while the node is queued.
struct MpscNode {
    MpscNode* next = nullptr;
};

class IntrusiveMpscQueue {
public:
    IntrusiveMpscQueue() noexcept = default;
    IntrusiveMpscQueue(const IntrusiveMpscQueue&) = delete;
    IntrusiveMpscQueue& operator=(const IntrusiveMpscQueue&) = delete;

    /// Enqueues node. Returns true if the queue was empty just before this push,
    /// which tells the producer it may be the one that has to wake the consumer.
    /// Thread-safety: any thread. Lock-free (the CAS retries only when another
    /// producer or the consumer changed head_ in between).
    bool push(MpscNode* node) noexcept {
        MpscNode* head = head_.load(std::memory_order_relaxed);
        do {
            node->next = head;
            // Success is seq_cst: the Dekker step, and release for *node and
            // the producer's earlier writes. Failure reloads head; it publishes
            // nothing and needs no ordering.
        } while (!head_.compare_exchange_weak(head, node, std::memory_order_seq_cst,
                                              std::memory_order_relaxed));
        return head == nullptr;
    }

    /// Takes every queued node and returns them in push (FIFO) order, linked by
    /// next with the last node's next == nullptr; nullptr if the queue was empty.
    /// Order is per producer: nodes from one producer come out in that
    /// producer's push order; pushes from different producers are ordered by
    /// when their CASes landed.
    /// Thread-safety: consumer only.
    /// Memory ordering: an empty result comes from a relaxed load (so that
    /// polling an idle inbox costs no locked instruction) and is not a seq_cst
    /// observation; the park protocol must check empty() after storing parked.
    MpscNode* popAll() noexcept {
        if (head_.load(std::memory_order_relaxed) == nullptr) { return nullptr; }  // skip the RMW
        // Acquire (part of seq_cst) reads the last push's release, and every
        // earlier push is in that CAS chain's release sequence, so all of the
        // producers' writes to these nodes are visible.
        MpscNode* stack = head_.exchange(nullptr, std::memory_order_seq_cst);
        MpscNode* fifo = nullptr;
        while (stack != nullptr) {  // newest first -> oldest first
            MpscNode* next = stack->next;
            stack->next = fifo;
            fifo = stack;
            stack = next;
        }
        return fifo;
    }

    /// True when no node is queued at this instant (seq_cst; see Memory ordering).
    /// Thread-safety: any thread; from a producer it is only a hint.
    bool empty() const noexcept { return head_.load(std::memory_order_seq_cst) == nullptr; }

private:
    // Invariant: head_ is the most recently pushed node not yet taken by
    // popAll(), or nullptr; following next visits older nodes down to nullptr.
    std::atomic<MpscNode*> head_{nullptr};
};

}  // namespace spindle::detail
