// SPDX-License-Identifier: Apache-2.0
#pragma once
/// FiberMultiLock: one lock object that gives mutual exclusion per uint64_t key, with each key granted
/// to its contenders in arrival order.
///
/// It serializes work per logical resource (a row, a file, a shard) without a mutex per resource: two
/// callers with the same key exclude each other, callers with different keys never wait for each other.
/// A holder is a ScopedLock, usually a local variable, that embeds the whole wait entry (its FiberFuture,
/// its tree links and the head and tail of the queue behind it), so locking allocates nothing:
///
///     FiberMultiLock::ScopedLock held;
///     rows.lock(rowId, &held);   // parks while another holder has rowId
///     ...                        // the destructor (or rows.unlock(&held)) passes rowId on
///
/// The held keys sit in an intrusive treap ordered by key, one node per held key: the holder's entry.
/// Waiters queue behind the holder in a FIFO list. unlock() makes the first waiter the holder in place
/// (it takes over the tree position and the rest of the queue) and wakes it, so a key, once contended,
/// passes from caller to caller in arrival order and is never free in between.
///
/// Thread-safety: every member may be called concurrently from any fiber or thread. A ScopedLock is one
/// caller's: use it for one lock() at a time; it may be unlocked by another fiber or thread once its
/// lock() returned. The lock is not reentrant: locking a key the caller already holds deadlocks (debug
/// builds assert it when the same fiber or thread asks again). The FiberMultiLock must outlive every
/// ScopedLock that holds one of its keys, and no call on it may still be running when it is destroyed.
/// Memory ordering: an unlock() of a key happens before the return of the next lock() or try_lock() that
/// obtains it, so the key guards data as a mutex would.
/// Fairness: per key strictly FIFO; try_lock() fails while the key is held and so never jumps the queue.
/// No spurious wake-ups: lock() returns only as the holder. Keys are independent: a long queue on one key
/// costs other keys only the spin lock, which is held for a tree walk.
/// Cancellation/timeouts: none. lock() waits until the key is handed over; shutting the runtime down does
/// not interrupt it. Use try_lock() to avoid waiting.
/// Cost: lock()/try_lock() of a free key and unlock() without waiters: one spin lock round trip and a
/// treap insert or erase, O(log n) expected in the number n of keys held (treap priorities are a salted
/// hash of the key, so n held keys form a random treap whatever the keys are). A contended lock() appends
/// to the queue in O(1) after the lookup and parks; unlock() with waiters replaces the node in place and
/// makes one FiberFuture::set(), after the spin lock is released. Nothing is allocated.

#include <cstdint>

#include "core/fiber_future.h"
#include "core/internal/sync_support.h"

namespace spindle {

class FiberMultiLock {
    /// One lock() or try_lock(): a held key's treap node, or a waiter queued behind one.
    /// Invariant (all fields but `granted` guarded by lock_ while linked): a holder has left/right
    /// (treap links) and queueHead/queueTail (its waiters, oldest first); a waiter has only `next`.
    struct Entry {
        FiberFuture granted;         // set(0) when the key is handed to this waiter
        uint64_t key = 0;
        uint64_t priority = 0;       // treap heap order (max at the root); a function of key
        Entry* left = nullptr;       // keys below
        Entry* right = nullptr;      // keys above
        Entry* next = nullptr;       // the waiter queued after this one
        Entry* queueHead = nullptr;  // the oldest waiter behind this holder
        Entry* queueTail = nullptr;  // the newest waiter behind this holder
        detail::Fiber* fiber = nullptr;  // who called lock() (debug builds), for the re-entrancy check
    };

public:
    /// A held key, or nothing. Non-copyable and non-movable: while it holds a key, its entry is linked
    /// into the lock by address, and other waiters' queue hangs from it.
    class ScopedLock {
    public:
        ScopedLock() noexcept = default;
        ScopedLock(const ScopedLock&) = delete;
        ScopedLock& operator=(const ScopedLock&) = delete;
        /// Unlocks if it holds a key.
        ~ScopedLock() {
            if (owner_ != nullptr) { owner_->unlock(this); }
        }

        [[nodiscard]] bool owns_lock() const noexcept { return owner_ != nullptr; }
        /// The key held. Precondition: owns_lock().
        [[nodiscard]] uint64_t key() const noexcept { return entry_.key; }

    private:
        friend class FiberMultiLock;
        Entry entry_;
        FiberMultiLock* owner_ = nullptr;  // the lock whose key this holds; nullptr: none
    };

    FiberMultiLock() noexcept;
    FiberMultiLock(const FiberMultiLock&) = delete;
    FiberMultiLock& operator=(const FiberMultiLock&) = delete;
    /// Precondition: no key is held (checked in debug builds).
    ~FiberMultiLock();

    /// Takes `key` into `held`, parking while others hold it or queued for it first.
    /// Precondition: !held->owns_lock(); the caller does not hold `key` already.
    void lock(uint64_t key, ScopedLock* held) noexcept;
    /// Takes `key` into `held` if nobody holds it; false (and `held` left empty) otherwise.
    /// Precondition: !held->owns_lock().
    [[nodiscard]] bool try_lock(uint64_t key, ScopedLock* held) noexcept;
    /// Passes the key in `held` to its first waiter, or frees it; `held` is empty afterwards.
    /// Precondition: held->owns_lock() by this lock.
    void unlock(ScopedLock* held) noexcept;

private:
    void prepare(Entry* e, uint64_t key) noexcept;
    /// The link that points at the holder of `key`, or the empty link where it would hang.
    Entry** findLink(uint64_t key) noexcept;
    /// Inserts `e` (key absent) at its treap position.
    void insert(Entry* e) noexcept;

    detail::SpinLock lock_;
    Entry* root_ = nullptr;  // guarded by lock_
    uint64_t salt_;          // per-lock salt of the treap priorities
};

}  // namespace spindle
