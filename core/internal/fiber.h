// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The fiber control block and the scheduler entry points every primitive uses.
///
/// A Fiber lives at the top of its own stack mapping, followed (downwards) by
/// its payload (the callable and the slot for its result), so spawning takes
/// no heap allocation: a stack from the carrier's pool is all it needs.
///
/// Lifetime: two references, one held by the FiberHandle and one by the
/// running fiber; whoever drops the last one destroys the payload and gives
/// the stack back to its pool.
/// Thread-safety: fields are owned by whoever runs the fiber, except state_
/// and refs_ (atomics) and done_ (a FiberFuture: SPSC).

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>

#include "core/fiber_future.h"
#include "core/internal/mpsc_queue.h"

namespace spindle::detail {

class Carrier;
class RuntimeImpl;
class StackPool;
struct FiberLocalTable;

enum class FiberState : uint8_t { kCreated, kRunnable, kRunning, kSuspended, kDead };
const char* toString(FiberState state) noexcept;

const char* toString(WaitKind kind) noexcept;

/// One mmap'd stack: [base, base+guardSize) is PROT_NONE, the rest is usable.
struct Stack {
    char* base = nullptr;
    size_t mapSize = 0;
    size_t guardSize = 0;
    StackPool* pool = nullptr;  // where it returns; nullptr: mapped alone, unmapped on release
    void* slab = nullptr;       // the pool's slab it was carved from
    unsigned sizeClass = 0;     // the pool's class

    [[nodiscard]] char* top() const noexcept { return base + mapSize; }
    [[nodiscard]] char* usableBottom() const noexcept { return base + guardSize; }
    [[nodiscard]] size_t usableSize() const noexcept { return mapSize - guardSize; }
};

/// Work handed to a carrier through its inbox (Carrier::post): the one way to have something run on
/// another carrier's thread. The carrier calls run(self) in its maintenance, on its own thread, in
/// posting order per poster; run() must not block, and it is the last touch of the message unless it
/// says otherwise (the poster may free or reuse it once run() has begun, as the message's owner decides).
/// Users: a fiber made runnable on its carrier, a cross-carrier cancel of a wait, a timer disarm, a
/// cancel of a multishot operation, a registered-file removal, runOnCarrier().
struct Message : MpscNode {
    void (*run)(Message* self) noexcept = nullptr;
    void* target = nullptr;  // what run() acts on (a Fiber*, a TimerEntry*, ...), as its poster chose
};

/// A callback the scheduler runs right after a fiber has switched out, on the
/// scheduler's stack: the fiber's context is saved, so the callback may hand
/// the fiber to another thread (publish it as a waiter) without a race.
struct SuspendAction {
    void (*fn)(class Fiber* fiber, void* arg) = nullptr;
    void* arg = nullptr;
};

/// What a fiber in a cancellable wait is waiting for, so that the carrier it waits on can end the
/// wait: the user_data of its in-flight SQE, tag included (kIo), or its TimerEntry (kTimer).
struct CancelPoint {
    enum class Kind : uint8_t { kIo, kTimer };
    Kind kind = Kind::kIo;
    void* what = nullptr;
};

/// Fiber::resumeHint_'s packing: [p, p + bytes) as an address and a count of cache lines (bytes capped
/// at kResumeHintMaxBytes, rounded up to whole lines from p's line). 0 for no hint.
inline constexpr unsigned kResumeHintLineShift = 56;
inline constexpr size_t kResumeHintMaxBytes = 1024;
[[nodiscard]] inline uintptr_t packResumeHint(const void* p, size_t bytes) noexcept {
    const auto addr = reinterpret_cast<uintptr_t>(p);
    if (addr == 0 || bytes == 0 || (addr >> kResumeHintLineShift) != 0) { return 0; }
    const size_t capped = bytes < kResumeHintMaxBytes ? bytes : kResumeHintMaxBytes;
    const uintptr_t lines = ((addr & 63) + capped + 63) / 64;
    return addr | (lines << kResumeHintLineShift);
}
[[nodiscard]] inline const char* resumeHintAddress(uintptr_t hint) noexcept {
    return reinterpret_cast<const char*>(hint & ((uintptr_t{1} << kResumeHintLineShift) - 1));
}
[[nodiscard]] inline unsigned resumeHintLines(uintptr_t hint) noexcept {
    return static_cast<unsigned>(hint >> kResumeHintLineShift);
}

class alignas(64) Fiber {
public:
    Fiber() noexcept = default;
    Fiber(const Fiber&) = delete;
    Fiber& operator=(const Fiber&) = delete;

    [[nodiscard]] uint64_t id() const noexcept { return id_; }
    [[nodiscard]] const char* name() const noexcept { return name_; }
    [[nodiscard]] FiberState state() const noexcept { return state_.load(std::memory_order_relaxed); }
    void setName(const char* name) noexcept;

    // --- scheduling (hot) ---
    void* sp_ = nullptr;                 // saved stack pointer while switched out
    Carrier* carrier_ = nullptr;         // the carrier it last ran on; wakes go there
    std::atomic<FiberState> state_{FiberState::kCreated};
    bool proxy_ = false;                 // a plain thread's stand-in (ProxyFiber)
    bool joined_ = false;                // join() took the result (set before the last release)
    uint16_t pinCount_ = 0;              // > 0: never stolen, never moved
    bool hasRun_ = false;                // it has run at least once (on carrier_): counts migrations
    // What it waits for (Runtime::fibers; see noteWait): cleared each time it is switched in, so it lives
    // on this line, which every switch writes anyway. waitObject_ and the rest are further down.
    WaitKind waitKind_ = WaitKind::kNone;
    Fiber* nextLocal_ = nullptr;         // hook for the carrier's owner-only FIFO
    Message msg_;                        // hook for the carrier's inbox (kind kRunFiber)
    // this_fiber::setResumeHint's memory, read by the pop before this fiber's (it shares the line
    // that pop prefetched): the address in the low 56 bits, the cache lines to prefetch in the top 8.
    // 0: none.
    uintptr_t resumeHint_ = 0;

    // --- life cycle ---
    RuntimeImpl* runtime_ = nullptr;
    void (*entry_)(Fiber*) = nullptr;           // runs the payload; catches into exception_
    void (*destroyPayload_)(Fiber*) = nullptr;  // destroys the payload (result slot)
    void* payload_ = nullptr;
    // Its FiberLocal values (core/internal/fiber_local.h): null until its first FiberLocal access, so a
    // fiber that uses none pays nothing. Touched only by the fiber itself; destroyed as it ends.
    FiberLocalTable* locals_ = nullptr;
    std::atomic<uint32_t> refs_{2};
    FiberFuture done_;                   // set when the fiber is dead; the joiner waits on it
    std::exception_ptr exception_;
    Stack stack_;
    uint64_t id_ = 0;

    // --- introspection (Runtime::fibers): written on the thread that runs the fiber, read while the
    // carriers are paused (RuntimeImpl::listFibers) ---
    Carrier* home_ = nullptr;            // whose list holds it: where it first suspended (null: not yet)
    Fiber* homeNext_ = nullptr;          // that list (owner-only: linked and unlinked on home_'s thread)
    Fiber* homePrev_ = nullptr;
    const void* waitObject_ = nullptr;   // with waitKind_ above
    uint64_t waitDeadlineNs_ = 0;        // a timed wait's deadline (CLOCK_MONOTONIC); 0: none
    uint64_t suspendedAtNs_ = 0;         // its carrier's coarse clock when it last switched out

    // --- cancellation (FiberHandle::cancel; see beginCancellableWait) ---
    std::atomic<bool> cancelRequested_{false};  // set by cancel(), cleared by acknowledgeCancellation()
    std::atomic<bool> cancelMsgQueued_{false};  // cancelMsg_ is in some carrier's inbox
    // The carrier whose ring or timer heap holds the fiber's cancellable wait, or null. Set by the
    // fiber on that carrier's thread; cleared only by that carrier's thread, in the same step that
    // ends the wait (CQE dispatch, timer expiry or removal). So a carrier that reads itself here
    // knows the wait, and waitPoint_, stay put while it acts on them.
    std::atomic<Carrier*> waitOn_{nullptr};
    CancelPoint waitPoint_;                     // written before waitOn_, on the same thread
    Message cancelMsg_;                         // kCancelWait; holds a reference while queued
    char name_[32] = {};

#if defined(SPINDLE_ASAN)
    void* asanFakeStack_ = nullptr;
#endif
#if defined(SPINDLE_TSAN)
    void* tsanFiber_ = nullptr;
#endif
};

inline void noteWait(Fiber* self, WaitKind kind, const void* object, uint64_t deadlineNs) noexcept {
    self->waitKind_ = kind;
    self->waitObject_ = object;
    self->waitDeadlineNs_ = deadlineNs;
}

/// The running fiber, or this thread's proxy fiber when called off-fiber.
Fiber* currentFiber() noexcept;
/// The fiber running on this thread's carrier, or nullptr (plain thread, scheduler).
Fiber* runningFiber() noexcept;
/// Makes a suspended fiber runnable on the carrier it last ran on (a proxy: wakes its thread).
/// Thread-safety: any thread; exactly once per suspension.
void makeRunnable(Fiber* fiber) noexcept;
/// Switches the calling fiber out and runs `action` on the scheduler; returns once someone made it runnable.
/// On a plain thread: runs `action` at once, then sleeps until made runnable.
void suspend(Fiber* self, SuspendAction action) noexcept;

/// Records what `self` is about to wait for (Runtime::fibers), just before it suspends: a wait that
/// always suspends (an I/O operation, whose completion cannot come first) notes itself this way; the
/// others pass the note to FiberFuture::wait(kind, ...), which records it only if it suspends.
inline void noteWait(Fiber* self, WaitKind kind, const void* object, uint64_t deadlineNs = 0) noexcept;

/// Lambda form of suspend(): fn(Fiber*) runs after the switch, on the scheduler.
template <class Fn>
void suspendWith(Fiber* self, Fn& fn) noexcept {
    suspend(self, SuspendAction{[](Fiber* f, void* arg) { (*static_cast<Fn*>(arg))(f); }, &fn});
}

/// Whether the fiber at `f` is running now on a carrier of the calling carrier's runtime: a spinner's
/// question (FiberMutex: is spinning on the owner worth it?). Compares `f` with what each carrier
/// publishes as its running fiber (Carrier::runningNow) and never reads *f, so `f` may have ended and
/// its memory gone. A hint, not a fact: a fiber that ended and whose stack a new, running fiber took
/// answers yes; the caller re-checks what it waits for anyway. False off-carrier (a plain thread cannot
/// tell) and for a plain thread's proxy (a thread is on no carrier).
/// Cost: one relaxed load per carrier of the runtime, each a line that carrier writes at every switch.
bool fiberRunsOnACarrier(const Fiber* f) noexcept;

/// Enters a cancellable wait on `carrier` (the caller's): records what to cancel, then checks for a
/// pending cancellation. Returns false, with nothing registered, when one is pending: the caller
/// must then fail with ECANCELED instead of waiting. The seq_cst store and load pair with
/// requestCancel()'s: either the fiber sees the request, or the canceller sees the wait.
/// Cost: one locked instruction (the seq_cst store).
inline bool beginCancellableWait(Fiber* fiber, Carrier* carrier, CancelPoint::Kind kind, void* what) noexcept {
    fiber->waitPoint_ = CancelPoint{kind, what};
    fiber->waitOn_.store(carrier, std::memory_order_seq_cst);
    if (fiber->cancelRequested_.load(std::memory_order_seq_cst)) {
        fiber->waitOn_.store(nullptr, std::memory_order_relaxed);
        return false;
    }
    return true;
}

/// FiberHandle::cancel(): marks `fiber` cancelled and, if it is in a cancellable wait, sends the
/// carrier holding that wait a kCancelWait message (which keeps the fiber alive until handled).
/// Thread-safety: any thread; idempotent until the fiber acknowledges.
void requestCancel(Fiber* fiber) noexcept;

/// Drops one reference; the last one destroys the payload and frees the stack.
/// An exception that escaped a fiber nobody joined is logged, then the process aborts.
void releaseFiber(Fiber* fiber) noexcept;

}  // namespace spindle::detail
