// SPDX-License-Identifier: Apache-2.0
#include "core/fiber.h"

#include <time.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "base/log.h"
#include "base/relax.h"
#include "core/internal/carrier.h"
#include "core/internal/context.h"
#include "core/internal/fiber_local.h"
#include "core/internal/sync_support.h"
#include "core/internal/proxy_fiber.h"
#include "core/internal/runtime_impl.h"
#include "core/internal/sanitizer.h"
#include "core/runtime.h"

namespace spindle::detail {
namespace {

std::atomic<uint64_t> gNextFiberId{1};

// Fiber ids: a carrier thread takes them a block at a time, so that spawns on different carriers do not
// bounce one cache line between their CPUs; a plain thread takes one. Unique, not dense, not ordered
// across carriers.
constexpr uint64_t kIdBlock = 1024;
thread_local uint64_t tlsNextId = 0;
thread_local uint64_t tlsIdLimit = 0;

uint64_t nextFiberId(bool onCarrier) noexcept {
    if (!onCarrier) { return gNextFiberId.fetch_add(1, std::memory_order_relaxed); }
    if (tlsNextId == tlsIdLimit) {
        tlsNextId = gNextFiberId.fetch_add(kIdBlock, std::memory_order_relaxed);
        tlsIdLimit = tlsNextId + kIdBlock;
    }
    return tlsNextId++;
}

constexpr size_t kMinStackSize = 16 * 1024;  // below this, a payload plus a frame or two do not fit
constexpr size_t kMinFreeStack = 8 * 1024;   // what must remain under the payload

char* alignDown(char* p, size_t align) noexcept {
    return reinterpret_cast<char*>(reinterpret_cast<uintptr_t>(p) & ~(static_cast<uintptr_t>(align) - 1));
}

// The first code a new fiber runs, on its own stack.
void fiberEntry(void* arg) {
    auto* f = static_cast<Fiber*>(arg);
    Carrier::onFiberStart();
    f->entry_(f);
    // Its FiberLocal values die here, on the fiber itself (so their destructors may block), before
    // exitRunning() marks it dead and lets a join() return.
    if (f->locals_ != nullptr) { destroyFiberLocals(f); }
    Carrier::exitRunning();
}

}  // namespace

const char* toString(FiberState state) noexcept {
    switch (state) {
        case FiberState::kCreated: return "created";
        case FiberState::kRunnable: return "runnable";
        case FiberState::kRunning: return "running";
        case FiberState::kSuspended: return "suspended";
        case FiberState::kDead: return "dead";
    }
    return "?";
}

const char* toString(WaitKind kind) noexcept {
    switch (kind) {
        case WaitKind::kNone: return "";
        case WaitKind::kIo: return "io";
        case WaitKind::kMultishot: return "multishot";
        case WaitKind::kSleep: return "sleep";
        case WaitKind::kFuture: return "future";
        case WaitKind::kFutex: return "futex";
        case WaitKind::kMutex: return "mutex";
        case WaitKind::kCondVar: return "condvar";
        case WaitKind::kSemaphore: return "semaphore";
        case WaitKind::kMultiLock: return "multilock";
        case WaitKind::kSequencer: return "sequencer";
        case WaitKind::kJoin: return "join";
        case WaitKind::kOffload: return "offload";
    }
    return "?";
}

void Fiber::setName(const char* name) noexcept {
    if (name == nullptr) {
        name_[0] = '\0';
        return;
    }
    std::strncpy(name_, name, sizeof(name_) - 1);
    name_[sizeof(name_) - 1] = '\0';
}

// ---- proxy fibers -------------------------------------------------------------

ProxyFiber::ProxyFiber() noexcept {
    proxy_ = true;
    id_ = nextFiberId(false);
    setName("thread");
    state_.store(FiberState::kRunning, std::memory_order_relaxed);
    ::sem_init(&sem_, 0, 0);
}

ProxyFiber::~ProxyFiber() {
    // The thread's FiberLocal values, at thread exit (with its other thread_local objects).
    if (locals_ != nullptr) { destroyFiberLocals(this); }
    ::sem_destroy(&sem_);
}

void ProxyFiber::block() noexcept {
    state_.store(FiberState::kSuspended, std::memory_order_relaxed);
    while (::sem_wait(&sem_) != 0) { SPINDLE_CHECK(errno == EINTR); }
    state_.store(FiberState::kRunning, std::memory_order_relaxed);
}

bool ProxyFiber::blockUntil(const timespec& deadline) noexcept {
    state_.store(FiberState::kSuspended, std::memory_order_relaxed);
    int r;
    while ((r = ::sem_clockwait(&sem_, CLOCK_MONOTONIC, &deadline)) != 0 && errno == EINTR) {}
    state_.store(FiberState::kRunning, std::memory_order_relaxed);
    if (r != 0) {
        SPINDLE_CHECK(errno == ETIMEDOUT);
        return false;
    }
    return true;
}

void ProxyFiber::post() noexcept { ::sem_post(&sem_); }

ProxyFiber& threadProxy() noexcept {
    thread_local ProxyFiber proxy;
    return proxy;
}

// ---- the scheduler entry points --------------------------------------------------

Fiber* runningFiber() noexcept {
    Carrier* c = Carrier::current();
    return c != nullptr ? c->running() : nullptr;
}

Fiber* currentFiber() noexcept {
    if (Fiber* f = runningFiber()) { return f; }
    // Waiting from a carrier's scheduler context would block the carrier: a bug.
    SPINDLE_ASSERT(Carrier::current() == nullptr);
    return &threadProxy();
}

void makeRunnable(Fiber* fiber) noexcept {
    if (fiber->proxy_) {
        static_cast<ProxyFiber*>(fiber)->post();
        return;
    }
    Carrier* target = fiber->carrier_;
    if (Carrier::current() == target) {
        target->pushReady(fiber);
    } else {
        fiber->state_.store(FiberState::kRunnable, std::memory_order_relaxed);
        target->post(&fiber->msg_);
    }
}

void suspend(Fiber* self, SuspendAction action) noexcept {
    if (self->proxy_) {
        action.fn(self, action.arg);
        static_cast<ProxyFiber*>(self)->block();
        return;
    }
    Carrier::suspendRunning(action);
}

void requestCancel(Fiber* fiber) noexcept {
    // Only the request that sets the flag looks for a wait: a wait that begins later sees the flag.
    if (fiber->cancelRequested_.exchange(true, std::memory_order_seq_cst)) { return; }
    Carrier* on = fiber->waitOn_.load(std::memory_order_seq_cst);
    if (on == nullptr) { return; }
    if (on == Carrier::current()) {
        // The canceller runs on the carrier that holds the wait: end it now, no message. Only this
        // thread clears waitOn_, so the wait is still on.
        on->cancelWaitHere(fiber);
        return;
    }
    // A message already queued reads the fiber's state afresh when handled, and so sees this request.
    if (fiber->cancelMsgQueued_.exchange(true, std::memory_order_seq_cst)) { return; }
    fiber->refs_.fetch_add(1, std::memory_order_relaxed);  // dropped by the carrier that handles it
    fiber->cancelMsg_.run = [](Message* m) noexcept { Carrier::current()->handleCancelWait(static_cast<Fiber*>(m->target)); };
    fiber->cancelMsg_.target = fiber;
    on->post(&fiber->cancelMsg_);
}

void releaseFiber(Fiber* fiber) noexcept {
    if (fiber->refs_.fetch_sub(1, std::memory_order_acq_rel) != 1) { return; }
    if (fiber->exception_ && !fiber->joined_) {
        std::string what = "unknown exception";
        try {
            std::rethrow_exception(fiber->exception_);
        } catch (const std::exception& e) {
            what = e.what();
        } catch (...) {
        }
        log::error("fiber '{}' (id {}) ended with an exception nobody joined to receive: {}", fiber->name_,
                   fiber->id_, what);
        std::abort();
    }
    SPINDLE_ASSERT(fiber->locals_ == nullptr);  // destroyed by the fiber as it ended (fiberEntry)
    Stack stack = fiber->stack_;
    if (fiber->destroyPayload_ != nullptr) { fiber->destroyPayload_(fiber); }
#if defined(SPINDLE_TSAN)
    san::tsanDestroy(fiber->tsanFiber_);
#endif
    fiber->~Fiber();
    StackPool::release(stack);
}

RuntimeImpl* currentRuntime() noexcept {
    Carrier* c = Carrier::current();
    return c != nullptr && c->running() != nullptr ? c->runtime() : nullptr;
}

Result<Fiber*> createFiber(RuntimeImpl* rt, const SpawnOptions& options, size_t payloadSize,
                           size_t payloadAlign) noexcept {
    const auto& carriers = rt->carriers();
    if (options.carrier < SpawnOptions::kAnyCarrier || options.carrier >= static_cast<int>(carriers.size())) {
        return Error{EINVAL};
    }
    const size_t stackSize = options.stackSize != 0 ? options.stackSize : rt->options().stackSize;
    if (stackSize < kMinStackSize) { return Error{EINVAL}; }

    Carrier* self = Carrier::current();
    const bool fromOwnFiber = self != nullptr && self->runtime() == rt && self->running() != nullptr;
    if (!rt->admitFiber(fromOwnFiber)) { return Error{ECANCELED}; }

    Carrier* target = options.carrier >= 0 ? carriers[static_cast<size_t>(options.carrier)].get()
                      : fromOwnFiber       ? self
                                           : rt->pickCarrier();
    // The stack comes from the pool of the carrier it will run on, or, when that is another carrier
    // on this one's NUMA node, from this carrier's own pool (no atomics; it goes back there when the
    // fiber ends). Plain threads and carriers of other nodes take a spare the target set aside.
    Result<Stack> stack = Error{ENOMEM};
    if (target->stackPool().ownedByThisThread()) {
        stack = target->stackPool().acquire(stackSize);
    } else if (self != nullptr && self->runtime() == rt && self->node() == target->node() &&
               self->stackPool().ownedByThisThread()) {
        stack = self->stackPool().acquire(stackSize);
    } else {
        stack = target->stackPool().acquireForeign(stackSize);
    }
    if (!stack) {
        rt->retireFiber();
        return Error{stack.errorCode()};
    }

    // Layout, from the top down: the Fiber, the payload, then the stack proper.
    char* fiberAt = alignDown(stack->top() - sizeof(Fiber), alignof(Fiber));
    char* payloadAt = alignDown(fiberAt - payloadSize, payloadAlign < 16 ? 16 : payloadAlign);
    if (payloadAt < stack->usableBottom() || static_cast<size_t>(payloadAt - stack->usableBottom()) < kMinFreeStack) {
        log::warn("fiber '{}': its captures ({} bytes) leave too little of a {}-byte stack",
                  options.name != nullptr ? options.name : "", payloadSize, stack->usableSize());
        StackPool::release(*stack);
        rt->retireFiber();
        return Error{EINVAL};
    }
    san::unpoison(stack->usableBottom(), stack->usableSize());

    auto* f = new (fiberAt) Fiber();
    f->stack_ = *stack;
    f->carrier_ = target;
    f->runtime_ = rt;
    f->payload_ = payloadAt;
    f->id_ = nextFiberId(self != nullptr);
    f->setName(options.name);
    f->pinCount_ = options.pinned ? 1 : 0;
    f->msg_.run = [](Message* m) noexcept { Carrier::current()->pushReady(static_cast<Fiber*>(m->target)); };
    f->msg_.target = f;
    f->sp_ = makeContext(payloadAt, &fiberEntry, f);
#if defined(SPINDLE_TSAN)
    f->tsanFiber_ = san::tsanCreate();
    san::tsanSetName(f->tsanFiber_, f->name_);
#endif
    return f;
}

void launchFiber(Fiber* fiber) noexcept {
    Carrier* target = fiber->carrier_;
    if (Carrier::current() == target) {
        target->pushReady(fiber);
        // The spawner keeps this carrier busy, so even one queued fiber waits: let a parked carrier
        // come and steal it. (With a threshold of two, a last spawn that left one fiber queued behind
        // a spawner that then computed without yielding was never run by the idle carriers.)
        fiber->runtime_->wakeIdle(target);
    } else {
        fiber->state_.store(FiberState::kRunnable, std::memory_order_relaxed);
        target->post(&fiber->msg_);
    }
}

}  // namespace spindle::detail

namespace spindle::this_fiber {

using detail::Carrier;

void yield() noexcept {
    Carrier* c = Carrier::current();
    if (c == nullptr || c->running() == nullptr) {
        std::this_thread::yield();
        return;
    }
    c->yieldRunning();
}

Result<void> sleep_until(std::chrono::steady_clock::time_point deadline) noexcept {
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline.time_since_epoch()).count();
    const uint64_t deadlineNs = ns < 0 ? 0 : static_cast<uint64_t>(ns);
    Carrier* c = Carrier::current();
    if (c == nullptr || c->running() == nullptr) {
        timespec ts{static_cast<time_t>(deadlineNs / 1000000000u), static_cast<long>(deadlineNs % 1000000000u)};
        while (::clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) == EINTR) {}
        return {};
    }
    detail::Fiber* self = c->running();
    FiberFuture fired;
    detail::TimerEntry entry;
    entry.fired = &fired;
    entry.waiter = self;
    if (!detail::beginCancellableWait(self, c, detail::CancelPoint::Kind::kTimer, &entry)) { return Error{ECANCELED}; }
    if (const int err = c->addTimer(&entry, deadlineNs); err != 0) {
        self->waitOn_.store(nullptr, std::memory_order_relaxed);
        return Error{err};
    }
    const int32_t r = fired.wait(detail::WaitKind::kSleep, &fired, deadlineNs);
    if (r < 0) { return Error{-r}; }
    return {};
}

Result<void> sleep_for(std::chrono::nanoseconds duration) noexcept {
    // Clamped: now() + nanoseconds::max() would wrap round to the past and return at once.
    return sleep_until(std::chrono::steady_clock::now() + detail::clampTimeout(duration));
}

FiberId id() noexcept { return detail::currentFiber()->id(); }

std::string_view name() noexcept { return detail::currentFiber()->name(); }

bool cancellationRequested() noexcept {
    detail::Fiber* f = detail::runningFiber();
    return f != nullptr && f->cancelRequested_.load(std::memory_order_seq_cst);
}

bool acknowledgeCancellation() noexcept {
    detail::Fiber* f = detail::runningFiber();
    return f != nullptr && f->cancelRequested_.exchange(false, std::memory_order_seq_cst);
}

bool inFiber() noexcept { return detail::runningFiber() != nullptr; }

bool pinned() noexcept {
    const detail::Fiber* f = detail::runningFiber();
    return f != nullptr && f->pinCount_ > 0;
}

int carrierIndex() noexcept {
    Carrier* c = Carrier::current();
    return c != nullptr ? static_cast<int>(c->index()) : -1;
}

void setResumeHint(const void* p, size_t bytes) noexcept {
    if (detail::Fiber* f = detail::runningFiber()) {  // never a thread's proxy: those run on no carrier
        f->resumeHint_ = detail::packResumeHint(p, bytes);
    }
}

}  // namespace spindle::this_fiber
