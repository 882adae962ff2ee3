// SPDX-License-Identifier: Apache-2.0
#pragma once
/// ChaseLevDeque<T>: the work-stealing deque behind each carrier's run queue.
///
/// The owner pushes and pops at the bottom (LIFO, cache-warm); any other thread
/// steals from the top (FIFO, oldest first). The algorithm is Chase & Lev,
/// "Dynamic Circular Work-Stealing Deque" (SPAA 2005), with the C11 memory
/// orders of Lê, Pop, Cohen & Zappa Nardelli, "Correct and Efficient
/// Work-Stealing for Weak Memory Models" (PPoPP 2013), with their seq_cst
/// fences replaced by seq_cst accesses (see the note above the member
/// definitions) so that ThreadSanitizer can follow every ordering it relies on.
///
/// Thread-safety: push() and pop() only on the owning thread; steal(),
/// sizeApprox() and emptyApprox() on any thread. Construction and destruction
/// must not race with any other call.
/// Memory ordering: writes made before push(v) happen before whatever the
/// thread that takes v (by pop() or a successful steal()) does after taking it.
/// Errors: push() throws std::bad_alloc when it cannot grow; the deque is then
/// unchanged. Nothing else allocates or throws.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <new>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "base/check.h"
#include "base/inject.h"

namespace spindle::detail {

template <class T>
class ChaseLevDeque {
    static_assert(std::is_trivially_copyable_v<T>, "slots are std::atomic<T>");
    static_assert(std::atomic<T>::is_always_lock_free, "steal() must not take a lock");

public:
    /// Largest accepted logCapacity; growth beyond it is bounded only by memory.
    static constexpr unsigned kMaxLogCapacity = 30;

    /// Creates an empty deque holding 1 << logCapacity items before it first grows.
    /// Precondition: logCapacity <= kMaxLogCapacity.
    explicit ChaseLevDeque(unsigned logCapacity = 8);
    ~ChaseLevDeque() = default;  // the unique_ptrs free the current and retired buffers

    ChaseLevDeque(const ChaseLevDeque&) = delete;
    ChaseLevDeque& operator=(const ChaseLevDeque&) = delete;

    /// Adds value at the bottom; doubles the buffer first when it is full.
    /// Thread-safety: owner only.
    /// Errors: throws std::bad_alloc if growth fails (strong guarantee). Growth
    /// is the only allocation; a deque that never exceeds its capacity never throws.
    void push(T value) noexcept(false);

    /// Takes the most recently pushed value, or nullopt when the deque is empty
    /// (including when a thief took the last item first).
    /// Thread-safety: owner only.
    std::optional<T> pop() noexcept;

    /// Takes the oldest value. Returns nullopt when the deque looked empty OR
    /// when this thief lost a race for the top item (to another thief or to the
    /// owner's pop of the last item); a nullopt is therefore not proof of
    /// emptiness, and a caller that must drain the deque retries or checks
    /// emptyApprox().
    /// Thread-safety: any thread. Lock-free: a thief that loses a race returns.
    std::optional<T> steal() noexcept;

    /// Number of items at some recent instant; exact only when no call is in flight.
    /// Thread-safety: any thread.
    /// Memory ordering: both loads are seq_cst (free on x86-64, LDAR on
    /// AArch64) so that a park protocol can rely on them: a parker that does
    /// a seq_cst RMW (e.g. parkedCount++) and then calls emptyApprox(), against
    /// an owner that calls push() and then a seq_cst fence before reading
    /// parkedCount, cannot have both miss the other. push() alone is only a
    /// release store, so the owner side needs that fence (or a seq_cst RMW).
    size_t sizeApprox() const noexcept;
    bool emptyApprox() const noexcept { return sizeApprox() == 0; }

private:
    // A power-of-two ring of slots. Logical index i lives in slot i & mask_.
    // Slots are atomic because a thief may read a slot while the owner
    // overwrites it after a wrap-around; the thief's CAS on top_ then fails and
    // the stale value is discarded, but the access itself must not be a data
    // race. All slot accesses are relaxed: ordering comes from top_/bottom_.
    class Buffer {
    public:
        explicit Buffer(size_t capacity)
            : mask_(capacity - 1), slots_(std::make_unique<std::atomic<T>[]>(capacity)) {}
        size_t capacity() const noexcept { return mask_ + 1; }
        T load(int64_t i) const noexcept {
            return slots_[static_cast<size_t>(i) & mask_].load(std::memory_order_relaxed);
        }
        void store(int64_t i, T v) noexcept {
            slots_[static_cast<size_t>(i) & mask_].store(v, std::memory_order_relaxed);
        }

    private:
        const size_t mask_;  // capacity - 1; capacity is a power of two
        std::unique_ptr<std::atomic<T>[]> slots_;
    };

    void grow(Buffer* cur, int64_t top, int64_t bottom);

    static constexpr size_t kCacheLine = 64;

    // Invariant: top_ only increases, and only by a successful CAS (thieves, or
    // the owner taking the last item). Items live at logical indices
    // [top_, bottom_); bottom_ - top_ is transiently -1 inside pop().
    // Signed, so bottom_ - 1 on an empty deque at 0 is -1 rather than a wrap.
    alignas(kCacheLine) std::atomic<int64_t> top_{0};

    // Written only by the owner. array_ shares bottom_'s line: every thief that
    // reads array_ has just read bottom_, while top_ takes the thieves' CAS traffic.
    alignas(kCacheLine) std::atomic<int64_t> bottom_{0};
    std::atomic<Buffer*> array_{nullptr};

    // Owner-only. current_ owns *array_. A thief may still be reading a buffer
    // that growth replaced, so replaced buffers stay in retired_ until the
    // destructor, which runs when no thief can be active. Total retired memory
    // is less than the current buffer (capacities halve going back).
    alignas(kCacheLine) std::unique_ptr<Buffer> current_;
    std::vector<std::unique_ptr<Buffer>> retired_;
};

// Why seq_cst loads and stores instead of the paper's seq_cst fences:
// owner and thief must not both conclude that the same item is theirs without
// one of them going through the CAS on top_. That needs pop() to publish the
// decremented bottom_ before it reads top_ (a store->load order), and steal()
// to read top_ before bottom_, both orders agreeing in one total order. The
// paper gets this with atomic_thread_fence(seq_cst). ThreadSanitizer does not model
// standalone fences, so it would miss the release/acquire edges the fences
// provide and report false races on data published through the deque. We
// instead make those accesses (and the CASes on top_) seq_cst operations on
// the variables themselves: in C++20 every seq_cst operation is in the single
// total order S, and a seq_cst store followed in program order by a seq_cst
// load is not reordered, which is exactly the ordering the fences supplied.
// We use this form in every build, not only under SPINDLE_TSAN, so the code
// that TSan checks is the code that ships. It costs nothing extra: on x86-64
// the seq_cst store is one XCHG, which replaces the fence's MFENCE, and the
// seq_cst loads are plain MOVs (steal() drops an MFENCE); on AArch64 it is
// STLR/LDAR, which order store->load without the fence's DMB.

template <class T>
ChaseLevDeque<T>::ChaseLevDeque(unsigned logCapacity) {
    SPINDLE_CHECK_MSG(logCapacity <= kMaxLogCapacity, "ChaseLevDeque: logCapacity too large");
    current_ = std::make_unique<Buffer>(size_t{1} << logCapacity);
    array_.store(current_.get(), std::memory_order_relaxed);  // no thread can see *this yet
}

template <class T>
void ChaseLevDeque<T>::push(T value) noexcept(false) {
    const int64_t b = bottom_.load(std::memory_order_relaxed);  // owner wrote it last
    // Acquire pairs with a thief's successful CAS: the slot that thief read
    // happens before we overwrite it after a wrap-around, so its relaxed load
    // cannot return the value we are about to store.
    const int64_t t = top_.load(std::memory_order_acquire);
    Buffer* a = array_.load(std::memory_order_relaxed);  // owner-only writer
    if (b - t >= static_cast<int64_t>(a->capacity())) {
        grow(a, t, b);
        a = current_.get();
    }
    a->store(b, value);
    // Release publishes the slot (and everything the caller wrote before push)
    // to whoever reads this bottom_ with acquire: thieves, via their seq_cst load.
    bottom_.store(b + 1, std::memory_order_release);
}

template <class T>
void ChaseLevDeque<T>::grow(Buffer* cur, int64_t top, int64_t bottom) {
    SPINDLE_INJECT(inject::Point::kGrowFail, { throw std::bad_alloc(); });
    // Everything that can throw happens before the new buffer is published.
    auto next = std::make_unique<Buffer>(cur->capacity() * 2);
    retired_.reserve(retired_.size() + 1);
    // top may be stale (smaller than top_ now); copying a few already-stolen
    // slots is harmless, and indices keep their meaning across buffers, so a
    // thief reading either buffer at index i >= top_ sees the same item.
    for (int64_t i = top; i < bottom; ++i) {
        next->store(i, cur->load(i));
    }
    // Release: a thief that acquires this pointer sees the slots copied above
    // and the buffer's construction. A thief that reads a bottom_ published
    // after this store also sees this pointer (release on bottom_ in push).
    array_.store(next.get(), std::memory_order_release);
    retired_.push_back(std::move(current_));  // cannot throw: reserved above
    current_ = std::move(next);
}

template <class T>
std::optional<T> ChaseLevDeque<T>::pop() noexcept {
    const int64_t b = bottom_.load(std::memory_order_relaxed) - 1;
    Buffer* a = array_.load(std::memory_order_relaxed);
    // seq_cst store then seq_cst load: the fence-free Dekker step described above.
    // Claims index b before looking at top_, so a thief that reads top_ after
    // this sees bottom_ <= b and cannot also take b without the CAS below.
    bottom_.store(b, std::memory_order_seq_cst);
    int64_t t = top_.load(std::memory_order_seq_cst);
    if (t > b) {  // was empty
        bottom_.store(b + 1, std::memory_order_relaxed);
        return std::nullopt;
    }
    T value = a->load(b);
    if (t < b) {  // at least one other item remains, so no thief can reach b
        return value;
    }
    // t == b: the last item; race the thieves for it through top_.
    const bool won =
        top_.compare_exchange_strong(t, t + 1, std::memory_order_seq_cst, std::memory_order_relaxed);
    bottom_.store(b + 1, std::memory_order_relaxed);  // now top_ == bottom_: empty
    if (!won) { return std::nullopt; }
    return value;
}

template <class T>
std::optional<T> ChaseLevDeque<T>::steal() noexcept {
    // Both seq_cst: the load of top_ is ordered before the load of bottom_
    // (the paper's fence), and the bottom_ load acquires the owner's push.
    int64_t t = top_.load(std::memory_order_seq_cst);
    const int64_t b = bottom_.load(std::memory_order_seq_cst);
    if (t >= b) { return std::nullopt; }
    // Acquire: the buffer may have been replaced by growth; see grow().
    Buffer* a = array_.load(std::memory_order_acquire);
    T value = a->load(t);
    // The CAS decides ownership of index t. On failure the value may be stale
    // or overwritten; it is discarded, and the caller sees a lost race as nullopt.
    if (!top_.compare_exchange_strong(t, t + 1, std::memory_order_seq_cst, std::memory_order_relaxed)) {
        return std::nullopt;
    }
    return value;
}

template <class T>
size_t ChaseLevDeque<T>::sizeApprox() const noexcept {
    const int64_t t = top_.load(std::memory_order_seq_cst);
    const int64_t b = bottom_.load(std::memory_order_seq_cst);
    return b > t ? static_cast<size_t>(b - t) : 0;  // b == t - 1 inside pop()
}

}  // namespace spindle::detail
