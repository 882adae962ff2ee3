// SPDX-License-Identifier: Apache-2.0
#include "core/fiber_multilock.h"

#include <atomic>
#include <chrono>

#include "base/check.h"
#include "core/internal/fiber.h"

namespace spindle {
namespace {

/// splitmix64's finalizer: a bijection on 64-bit values that scatters nearby inputs.
constexpr uint64_t mix(uint64_t x) noexcept {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

std::atomic<uint64_t> gSaltSequence{0};

}  // namespace

FiberMultiLock::FiberMultiLock() noexcept {
    // The salt need not be secret-grade, only unlike the keys' structure: the priorities of the keys
    // then behave as random and the treap stays balanced in expectation for any key set.
    const auto t = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    salt_ = mix(t ^ reinterpret_cast<uintptr_t>(this) ^
                gSaltSequence.fetch_add(0x9e3779b97f4a7c15ull, std::memory_order_relaxed));
}

FiberMultiLock::~FiberMultiLock() { SPINDLE_ASSERT(root_ == nullptr && "FiberMultiLock destroyed with keys held"); }

void FiberMultiLock::prepare(Entry* e, uint64_t key) noexcept {
    e->granted.reset();
    e->key = key;
    // mix is a bijection, so distinct keys never tie on priority.
    e->priority = mix(key ^ salt_);
    e->left = e->right = e->next = e->queueHead = e->queueTail = nullptr;
#ifndef NDEBUG
    e->fiber = detail::currentFiber();
#endif
}

FiberMultiLock::Entry** FiberMultiLock::findLink(uint64_t key) noexcept {
    Entry** link = &root_;
    while (*link != nullptr && (*link)->key != key) { link = key < (*link)->key ? &(*link)->left : &(*link)->right; }
    return link;
}

void FiberMultiLock::insert(Entry* e) noexcept {
    // Walk down past the nodes that outrank e; e takes the place of the subtree found there, which splits
    // into the keys below e (its left) and above it (its right).
    Entry** link = &root_;
    while (*link != nullptr && (*link)->priority > e->priority) {
        link = e->key < (*link)->key ? &(*link)->left : &(*link)->right;
    }
    Entry* t = *link;
    Entry** lo = &e->left;
    Entry** hi = &e->right;
    while (t != nullptr) {
        SPINDLE_ASSERT(t->key != e->key);
        if (t->key < e->key) {
            *lo = t;
            lo = &t->right;
            t = t->right;
        } else {
            *hi = t;
            hi = &t->left;
            t = t->left;
        }
    }
    *lo = nullptr;
    *hi = nullptr;
    *link = e;
}

void FiberMultiLock::lock(uint64_t key, ScopedLock* held) noexcept {
    SPINDLE_ASSERT(held->owner_ == nullptr && "ScopedLock already holds a key");
    Entry* e = &held->entry_;
    prepare(e, key);
    lock_.lock();
    Entry* holder = *findLink(key);
    if (holder == nullptr) {
        insert(e);
        lock_.unlock();
        held->owner_ = this;
        return;
    }
    SPINDLE_ASSERT(holder->fiber != e->fiber && "FiberMultiLock is not reentrant: the caller holds this key");
    if (holder->queueTail != nullptr) {
        holder->queueTail->next = e;
    } else {
        holder->queueHead = e;
    }
    holder->queueTail = e;
    lock_.unlock();
    // unlock() turns e into the holder (tree links, remaining queue) before it sets the future.
    (void)e->granted.wait(detail::WaitKind::kMultiLock, this);
    held->owner_ = this;
}

bool FiberMultiLock::try_lock(uint64_t key, ScopedLock* held) noexcept {
    SPINDLE_ASSERT(held->owner_ == nullptr && "ScopedLock already holds a key");
    Entry* e = &held->entry_;
    prepare(e, key);
    lock_.lock();
    const bool free = *findLink(key) == nullptr;
    if (free) { insert(e); }
    lock_.unlock();
    if (free) { held->owner_ = this; }
    return free;
}

void FiberMultiLock::unlock(ScopedLock* held) noexcept {
    SPINDLE_ASSERT(held->owner_ == this && "ScopedLock does not hold a key of this lock");
    Entry* e = &held->entry_;
    lock_.lock();
    Entry** link = findLink(e->key);
    SPINDLE_ASSERT(*link == e);
    Entry* successor = e->queueHead;
    if (successor != nullptr) {
        // Same key, so same priority: the successor fits e's place in the treap exactly.
        successor->left = e->left;
        successor->right = e->right;
        successor->queueHead = successor->next;
        successor->queueTail = successor->next != nullptr ? e->queueTail : nullptr;
        successor->next = nullptr;
        *link = successor;
    } else {
        // Merge e's subtrees (every key on the left is below every key on the right) into its place.
        Entry* a = e->left;
        Entry* b = e->right;
        while (a != nullptr && b != nullptr) {
            if (a->priority > b->priority) {
                *link = a;
                link = &a->right;
                a = a->right;
            } else {
                *link = b;
                link = &b->left;
                b = b->left;
            }
        }
        *link = a != nullptr ? a : b;
    }
    lock_.unlock();
    held->owner_ = nullptr;
    if (successor != nullptr) { successor->granted.set(0); }
}

}  // namespace spindle
