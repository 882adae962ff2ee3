// SPDX-License-Identifier: Apache-2.0
#pragma once
/// FiberSequencer: a 64-bit counter that only grows, with waiters that are released in token order once
/// the counter reaches their token, and that may withdraw (cancel) before it does.
///
/// It is the base of FiberEvent and FairFiberMutex. A waiter registers a Future with wait(token, &future);
/// the future is set with 0 once value() >= token. Future is a FiberFuture, so it also works with
/// FiberFuture::waitForMultiple() and waitWithTimeout(), and a plain thread can wait on it (proxy fiber).
///
/// How it works: a registration or a cancellation is pushed onto one of two lock-free intrusive stacks and
/// the caller then offers to "combine". At most one thread combines at a time (a FREE/BUSY/PENDING word); a
/// caller that finds another combining marks the word PENDING and leaves, and the combiner runs another pass
/// before it lets go. The combiner alone owns a pairing heap of registered futures ordered by token: it
/// moves cancellations out of the heap, new registrations into it, and pops every future whose token the
/// counter has reached. It sets the futures it took out only after it has let go of the combiner, so that
/// whatever set() triggers may call into the sequencer again. Every Future carries its own links and state,
/// so nothing is ever allocated.
///
/// Thread-safety: every member may be called from any fiber or plain thread, concurrently. A Future belongs
/// to one consumer (as any FiberFuture); its cancel() may be called from any thread while it is alive.
///
/// Memory ordering: what a thread wrote before the increment() or advance() that moved the counter to or
/// past a token is visible to the waiter whose future for that token is set with 0 (and to anyone who then
/// reads value() >= token with acquire ordering, which value() does).
///
/// Fairness: a combining pass sets the futures it takes off its heap lowest token first (equal tokens in no
/// particular order), after those it cancelled or found satisfied at registration. Passes run one at a
/// time, but the set() calls of one pass may overlap those of the next, so waiters released by different
/// passes may resume in either order. Combining is not fair to the combiner: while others keep adding
/// work it keeps running passes.
///
/// Cancellation: Future::cancel() withdraws a registration. The future is then set exactly once: with
/// -ECANCELED if the counter had not reached its token when the cancellation was processed, with 0
/// otherwise (including when it was already set). cancel() does not wait; call wait() afterwards, which
/// returns at once or as soon as the combining thread gets to it.
///
/// Cost: increment() with nobody registered is one locked read-modify-write, advance() one load and one
/// compare-and-swap. With registered waiters, add two compare-and-swaps on the combiner word, one or two
/// read-modify-writes of the counter word per pass, and O(log n) amortized heap work per future woken or
/// cancelled. A registration whose token is already reached is one load and a set(). The counter holds
/// 63 bits (kMaxValue); its word also carries a "someone is registered" flag.
///
/// Lifetime: a registered Future must stay alive until it is set, and the sequencer until every call on
/// it has returned. One pattern is safe without more: when the only call still running is the increment()
/// or advance() that released a waiter (through its future, or through a value() that it saw), that waiter
/// may destroy the sequencer. A raise that finds nobody registered touches nothing after the raise, and a
/// combining call touches nothing of the sequencer once it starts setting futures.

#include <atomic>
#include <cstdint>

#include "core/fiber_future.h"

namespace spindle {

class FiberSequencer {
public:
    /// A registration with a FiberSequencer: a FiberFuture that also carries its token, its links in the
    /// sequencer's structures, and its cancellation state.
    class Future : public FiberFuture {
    public:
        Future() noexcept = default;

        /// Withdraws the registration: the future gets set with -ECANCELED unless the counter reached
        /// its token first (then with 0). Idempotent, and a no-op on a future that is already set or
        /// was set at registration. Returns without waiting for the set; wait() for it.
        /// Precondition: registered with FiberSequencer::wait(token, this) and still alive.
        void cancel() noexcept;

        /// The token it was last registered for.
        [[nodiscard]] uint64_t token() const noexcept { return token_; }

    private:
        friend class FiberSequencer;

        // Invariant: kInTable is set only by the combiner when it puts the future into its heap (never
        // for a future satisfied at registration), and cleared by the combiner when it wakes the future;
        // kCancelled is set by cancel(). A cancel() that sees kInTable (and no earlier kCancelled) pushes
        // the future onto the cancel stack, and the combiner completes it from there; otherwise whoever
        // else holds the future (the request stack or the wake path) completes it. Exactly once.
        static constexpr uint32_t kInTable = 1;
        static constexpr uint32_t kCancelled = 2;

        FiberSequencer* sequencer_ = nullptr;
        uint64_t token_ = 0;
        std::atomic<uint32_t> flags_{0};
        int32_t outcome_ = 0;       // combiner: the result to set() once the combiner is released
        bool inHeap_ = false;       // combiner-owned: linked into the heap right now
        Future* next_ = nullptr;    // request stack, then cancel stack, then the combiner's done list
        Future* child_ = nullptr;   // pairing heap (combiner-owned): leftmost child
        Future* sibling_ = nullptr; // next sibling to the right
        Future* prev_ = nullptr;    // left sibling, or the parent for a leftmost child; null for the root
    };

    /// The largest value the counter can hold (it shares its word with a flag).
    static constexpr uint64_t kMaxValue = (uint64_t{1} << 63) - 1;

    FiberSequencer() noexcept = default;
    FiberSequencer(const FiberSequencer&) = delete;
    FiberSequencer& operator=(const FiberSequencer&) = delete;
    /// Precondition: no future is registered (each was set) and no call is running.
    ~FiberSequencer();

    /// The counter (acquire load).
    [[nodiscard]] uint64_t value() const noexcept { return word_.load(std::memory_order_acquire) >> kValueShift; }

    /// Registers `future` to be set with 0 once value() >= token; sets it before returning when that
    /// holds already. The future is (re)armed here: its previous state is discarded.
    /// Precondition: `future` is not registered now (new, or set since its last registration).
    void wait(uint64_t token, Future* future) noexcept;

    /// Parks the calling fiber (or blocks the calling thread) until value() >= token; returns 0.
    int32_t wait(uint64_t token) noexcept;

    /// Adds one to the counter and wakes every future it satisfies. Precondition: value() < kMaxValue.
    void increment() noexcept;

    /// Raises the counter to `target` if it is below it (a no-op otherwise) and wakes every future
    /// satisfied. Precondition: target <= kMaxValue.
    void advance(uint64_t target) noexcept;

private:
    enum : uint32_t { kFree = 0, kBusy = 1, kPending = 2 };
    static constexpr uint64_t kHasWaiters = 1;
    static constexpr unsigned kValueShift = 1;
    static constexpr uint64_t kOne = uint64_t{1} << kValueShift;

    static void push(std::atomic<Future*>& stack, Future* future) noexcept;
    void drain() noexcept;
    void combinePass(Future**& doneTail) noexcept;

    // Pairing heap ordered by token (combiner-owned). meld() takes two roots; mergePairs() takes a
    // list of siblings and returns one root.
    static Future* meld(Future* a, Future* b) noexcept;
    static Future* mergePairs(Future* first) noexcept;
    void heapInsert(Future* f) noexcept;
    Future* heapPopMin() noexcept;
    void heapRemove(Future* f) noexcept;

    // The counter, shifted left by one, and kHasWaiters. Invariant: the counter only grows; kHasWaiters
    // is set (by a combining pass, with one read-modify-write that also reads the counter) whenever the
    // heap holds a future, and cleared only by a pass that leaves the heap empty. So a raise that finds
    // the flag clear has nobody to wake, and the raise itself is its last touch of the object.
    std::atomic<uint64_t> word_{0};
    // Treiber stacks, pushed by wait() and Future::cancel(), emptied whole by the combiner.
    std::atomic<Future*> requests_{nullptr};
    std::atomic<Future*> cancels_{nullptr};
    // kFree: nobody combines. kBusy: one thread combines. kPending: it combines and must run one more pass.
    std::atomic<uint32_t> combiner_{kFree};
    Future* heap_ = nullptr;  // combiner-owned; the root has the lowest token
};

}  // namespace spindle
