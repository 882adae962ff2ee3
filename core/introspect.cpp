// SPDX-License-Identifier: Apache-2.0
// Seeing inside a running runtime: the fiber listing (Runtime::fibers, join()'s shutdown report,
// SIGUSR1), backtraces unwound from a suspended fiber's saved context, and the stall detector.
//
// The listing pauses every carrier at its next loop turn (a message that blocks the carrier's thread
// until released) and reads the carriers' home lists while nothing runs: every field of every listed
// fiber was written by a carrier before it acknowledged the pause, so the read is exact and needs no
// atomics on the fibers' hot fields. A carrier that does not pause in time (a fiber that never yields
// holds it) is named in the listing, and the fibers it lists are left out.
//
// The stall detector is one monitor thread per runtime. A carrier counts the fibers it switches into
// (Stats::fibersRun) and says whether one runs now (inFiber); a count that has not moved while a fiber
// runs means the same fiber has been running since. The monitor then signals that carrier's thread;
// the handler records the fiber and the return addresses of its stack (libunwind's unw_backtrace,
// which is safe in a signal handler), and the monitor symbolizes and logs them.

#define UNW_LOCAL_ONLY
#include <cxxabi.h>
#include <fcntl.h>
#include <libunwind.h>
#include <pthread.h>
#include <signal.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/check.h"
#include "base/counter.h"
#include "base/log.h"
#include "core/driver/op.h"
#include "core/internal/carrier.h"
#include "core/internal/context.h"
#include "core/internal/fiber.h"
#include "core/internal/runtime_impl.h"

namespace spindle::detail {
class RuntimeImpl;
}

/// Every runtime that has started and not been destroyed, newest first, linked by
/// RuntimeImpl::debugNext_: where tools/gdb/spindle.py starts (a live process or a core file).
extern "C" {
spindle::detail::RuntimeImpl* spindle_debug_runtimes = nullptr;
}

namespace spindle {
namespace detail {
namespace {

using std::chrono::nanoseconds;

const char* opName(op::Code code) noexcept {
    switch (code) {
        case op::Code::kNop: return "nop";
        case op::Code::kRead: return "read";
        case op::Code::kWrite: return "write";
        case op::Code::kReadv: return "readv";
        case op::Code::kWritev: return "writev";
        case op::Code::kFsync: return "fsync";
        case op::Code::kOpenat: return "openat";
        case op::Code::kClose: return "close";
        case op::Code::kStatx: return "statx";
        case op::Code::kFallocate: return "fallocate";
        case op::Code::kUnlinkat: return "unlinkat";
        case op::Code::kRenameat: return "renameat";
        case op::Code::kMkdirat: return "mkdirat";
        case op::Code::kOpenat2: return "openat2";
        case op::Code::kPoll: return "poll";
        case op::Code::kSplice: return "splice";
        case op::Code::kTee: return "tee";
        case op::Code::kAccept: return "accept";
        case op::Code::kConnect: return "connect";
        case op::Code::kRecv: return "recv";
        case op::Code::kSend: return "send";
        case op::Code::kRecvmsg: return "recvmsg";
        case op::Code::kSendmsg: return "sendmsg";
        case op::Code::kShutdown: return "shutdown";
        case op::Code::kAcceptMultishot: return "accept-multishot";
        case op::Code::kRecvMultishot: return "recv-multishot";
    }
    return "op";
}

// What a suspended fiber waits for, in words. Read while its carrier is paused: the op of an I/O wait
// lives on the fiber's stack, which stays put while the fiber is suspended.
std::string describeWait(const Fiber& f, uint64_t now) {
    std::string out;
    switch (f.waitKind_) {
        case WaitKind::kNone: break;
        case WaitKind::kIo:
        case WaitKind::kMultishot: {
            const auto* o = static_cast<const op::Op*>(f.waitObject_);
            if (o != nullptr) {
                out = fmt::format("{} {}{}", opName(o->code), (o->flags & op::kFixedFile) != 0 ? "fixed file " : "fd ",
                                  o->fd);
            }
            break;
        }
        case WaitKind::kJoin:
            out = fmt::format("fiber {}", static_cast<const Fiber*>(f.waitObject_)->id_);
            break;
        default: out = fmt::format("{}", f.waitObject_); break;
    }
    if (f.waitDeadlineNs_ != 0 && f.waitDeadlineNs_ != UINT64_MAX) {  // UINT64_MAX: a cancellable wait without limit
        if (!out.empty()) { out += ", "; }
        if (f.waitDeadlineNs_ >= now) {
            out += fmt::format("deadline in {} ms", (f.waitDeadlineNs_ - now) / 1'000'000);
        } else {
            out += fmt::format("deadline passed {} ms ago", (now - f.waitDeadlineNs_) / 1'000'000);
        }
    }
    return out;
}

// "name+0x1c" for the frame `cursor` stands on, demangled; "?" when no symbol covers it.
std::string frameName(unw_cursor_t* cursor) {
    char buf[1024];
    unw_word_t off = 0;
    const int r = unw_get_proc_name(cursor, buf, sizeof(buf), &off);
    if (r != 0 && r != -UNW_ENOMEM) { return "?"; }
    int status = 0;
    char* demangled = abi::__cxa_demangle(buf, nullptr, nullptr, &status);
    std::string name = status == 0 && demangled != nullptr ? demangled : buf;
    std::free(demangled);
    return fmt::format("{}+{:#x}", name, off);
}

// Walks the stack from `cursor` outwards: "#0 0x... name+0x1c" per frame, at most `limit` frames.
std::vector<std::string> walk(unw_cursor_t* cursor, int limit) {
    std::vector<std::string> frames;
    for (int i = 0; i < limit; ++i) {
        unw_word_t ip = 0;
        if (unw_get_reg(cursor, UNW_REG_IP, &ip) != 0 || ip == 0) { break; }
        frames.push_back(fmt::format("#{} {:#x} {}", i, ip, frameName(cursor)));
        if (unw_step(cursor) <= 0) { break; }
    }
    return frames;
}

// The frames of a switched-out fiber, from the registers its context switch saved (SwitchFrame, in
// core/internal/context.h). Precondition: the fiber stays switched out meanwhile.
std::vector<std::string> unwindSuspended(const Fiber& f) {
    unw_context_t ctx;
    std::memset(&ctx, 0, sizeof(ctx));
    const auto* frame = static_cast<const SwitchFrame*>(f.sp_);
    const auto after = reinterpret_cast<uintptr_t>(frame + 1);  // the sp once the switch has returned
    const auto ret = reinterpret_cast<uintptr_t>(frame->returnAddress);
#if defined(__x86_64__)
    auto& g = ctx.uc_mcontext.gregs;
    g[REG_R15] = static_cast<greg_t>(frame->r15);
    g[REG_R14] = static_cast<greg_t>(frame->r14);
    g[REG_R13] = static_cast<greg_t>(frame->r13);
    g[REG_R12] = static_cast<greg_t>(frame->r12);
    g[REG_RBX] = static_cast<greg_t>(frame->rbx);
    g[REG_RBP] = static_cast<greg_t>(frame->rbp);
    g[REG_RIP] = static_cast<greg_t>(ret);
    g[REG_RSP] = static_cast<greg_t>(after);
#elif defined(__aarch64__)
    auto& m = ctx.uc_mcontext;
    m.regs[19] = frame->x19;
    m.regs[20] = frame->x20;
    for (int r = 21; r <= 28; ++r) { m.regs[r] = frame->x21ToX28[r - 21]; }
    m.regs[29] = frame->x29;
    m.regs[30] = ret;
    m.sp = after;
    m.pc = ret;
#else
#error "unwindSuspended: no saved-frame layout for this architecture"
#endif
    unw_cursor_t cursor;
    if (unw_init_local(&cursor, &ctx) != 0) { return {"(libunwind could not start from the saved context)"}; }
    return walk(&cursor, 64);
}

// "name+0x1c" for a return address taken elsewhere (the stall handler's): a cursor made from this
// thread's context with its instruction pointer replaced, which is all unw_get_proc_name reads.
std::string nameOfAddress(void* ip) {
    unw_context_t ctx;
    if (unw_getcontext(&ctx) != 0) { return "?"; }
#if defined(__x86_64__)
    ctx.uc_mcontext.gregs[REG_RIP] = static_cast<greg_t>(reinterpret_cast<uintptr_t>(ip));
#elif defined(__aarch64__)
    ctx.uc_mcontext.pc = reinterpret_cast<uintptr_t>(ip);
#endif
    unw_cursor_t cursor;
    if (unw_init_local(&cursor, &ctx) != 0) { return "?"; }
    return frameName(&cursor);
}

// ---- pausing the carriers -------------------------------------------------------------------------------

// Shared by the lister and the messages it posted; freed by whichever lets go last (a carrier may
// handle its message after the lister gave up on it).
struct PauseState {
    struct Msg : Message {
        PauseState* state = nullptr;
        unsigned index = 0;
    };

    explicit PauseState(size_t n) : refs(static_cast<uint32_t>(n) + 1), answered(new std::atomic<bool>[n]), msgs(n) {
        for (size_t i = 0; i < n; ++i) { answered[i].store(false, std::memory_order_relaxed); }
    }
    void drop() noexcept {
        if (refs.fetch_sub(1, std::memory_order_acq_rel) == 1) { delete this; }
    }

    std::atomic<uint32_t> refs;
    std::atomic<uint32_t> paused{0};
    std::atomic<uint32_t> resume{0};
    std::unique_ptr<std::atomic<bool>[]> answered;
    std::vector<Msg> msgs;
};

// On a carrier's thread, in its maintenance: holds the thread until the lister is done.
void onPause(Message* m) noexcept {
    auto* msg = static_cast<PauseState::Msg*>(m);
    PauseState* st = msg->state;
    if (st->resume.load(std::memory_order_acquire) == 0) {
        st->answered[msg->index].store(true, std::memory_order_release);
        st->paused.fetch_add(1, std::memory_order_acq_rel);
        while (st->resume.load(std::memory_order_acquire) == 0) { st->resume.wait(0, std::memory_order_acquire); }
    }
    st->drop();
}

FiberInfo infoOf(const Fiber& f, uint64_t now, bool backtrace) {
    FiberInfo info;
    info.id = f.id_;
    info.name = f.name_;
    const FiberState state = f.state_.load(std::memory_order_relaxed);
    info.state = toString(state);
    info.carrier = f.carrier_ != nullptr ? static_cast<int>(f.carrier_->index()) : -1;
    info.home = f.home_ != nullptr ? static_cast<int>(f.home_->index()) : -1;
    if (state == FiberState::kSuspended) {
        info.waitKind = toString(f.waitKind_);
        info.waitDetail = describeWait(f, now);
        info.suspendedMs = f.suspendedAtNs_ != 0 && now > f.suspendedAtNs_ ? (now - f.suspendedAtNs_) / 1'000'000 : 0;
        if (backtrace) { info.backtrace = unwindSuspended(f); }
    }
    return info;
}

// ---- the SIGUSR1 listing ---------------------------------------------------------------------------------

struct SignalLister {
    std::mutex mutex;
    std::vector<RuntimeImpl*> runtimes;  // guarded by mutex
    int pipe[2] = {-1, -1};
    bool started = false;                // guarded by mutex
};

SignalLister& signalLister() {
    static auto* lister = new SignalLister;  // never destroyed: its thread outlives main()
    return *lister;
}

void onListSignal(int) {
    const int saved = errno;
    const char c = 'l';
    (void)!::write(signalLister().pipe[1], &c, 1);
    errno = saved;
}

void listOnSignalLoop() {
    SignalLister& l = signalLister();
    char buf[64];
    for (;;) {
        const ssize_t n = ::read(l.pipe[0], buf, sizeof(buf));
        if (n < 0 && errno == EINTR) { continue; }
        if (n <= 0) { return; }
        std::lock_guard lock(l.mutex);
        for (RuntimeImpl* rt : l.runtimes) {
            const std::string text = formatFiberListing(rt->listFibers(true, std::chrono::seconds(1)));
            for (size_t done = 0; done < text.size();) {
                const ssize_t w = ::write(STDERR_FILENO, text.data() + done, text.size() - done);
                if (w < 0 && errno == EINTR) { continue; }
                if (w <= 0) { break; }
                done += static_cast<size_t>(w);
            }
        }
    }
}

// ---- the stall detector ----------------------------------------------------------------------------------

int stallSignal() noexcept { return SIGRTMIN + 4; }

void onStallSignal(int, siginfo_t*, void*) {
    const int saved = errno;
    Carrier* c = Carrier::current();
    const uint32_t token = c != nullptr ? c->stallSample().requested.exchange(0, std::memory_order_acq_rel) : 0;
    if (token != 0) {
        Carrier::StallSample& s = c->stallSample();
        const Fiber* f = c->running();
        s.fiberId = f != nullptr ? f->id_ : 0;
        s.fibersRun = c->stats().fibersRun.load(std::memory_order_relaxed);
        if (f != nullptr) {
            std::memcpy(s.name, f->name_, sizeof(s.name));
            s.name[sizeof(s.name) - 1] = '\0';
            // Walked by hand rather than with unw_backtrace, to find the signal frame: what lies above it
            // is this handler, what lies below is the fiber. Local unwinding is safe in a handler.
            unw_context_t ctx;
            unw_cursor_t cursor;
            int depth = 0;
            int skip = 0;
            if (unw_getcontext(&ctx) == 0 && unw_init_local(&cursor, &ctx) == 0) {
                constexpr int kMax = static_cast<int>(sizeof(s.ips) / sizeof(s.ips[0]));
                while (depth < kMax && unw_step(&cursor) > 0) {
                    unw_word_t ip = 0;
                    if (unw_get_reg(&cursor, UNW_REG_IP, &ip) != 0) { break; }
                    s.ips[depth++] = reinterpret_cast<void*>(ip);
                    if (skip == 0 && unw_is_signal_frame(&cursor) > 0) { skip = depth; }
                }
            }
            s.depth = depth;
            s.skip = skip;
        } else {
            s.depth = 0;
        }
        s.done.store(token, std::memory_order_release);
    }
    errno = saved;
}

void installStallHandler() {
    static std::once_flag once;
    std::call_once(once, [] {
        struct sigaction sa {};
        sa.sa_sigaction = &onStallSignal;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
        sigemptyset(&sa.sa_mask);
        if (::sigaction(stallSignal(), &sa, nullptr) != 0) {
            log::warn("stall detector: sigaction({}) failed: {}; stalls are reported without backtraces",
                      stallSignal(), std::strerror(errno));
        }
    });
}

}  // namespace

// ---- the listing -------------------------------------------------------------------------------------------

FiberListing RuntimeImpl::listFibers(bool backtraces, nanoseconds patience) const {
    FiberListing listing;
    listing.live = liveFibers();
    if (live() == 0) { return listing; }  // nothing to list, and carriers may be leaving: post nothing
    std::lock_guard lock(listMutex_);
    const size_t n = carriers_.size();
    auto* st = new PauseState(n);
    Carrier* self = Carrier::current();
    if (self != nullptr && self->runtime() != this) { self = nullptr; }
    uint32_t expected = 0;
    for (size_t i = 0; i < n; ++i) {
        Carrier* c = carriers_[i].get();
        if (c == self) {
            // The caller runs on this carrier: none of its other fibers runs while we do.
            st->answered[i].store(true, std::memory_order_relaxed);
            st->drop();
            continue;
        }
        PauseState::Msg& m = st->msgs[i];
        m.state = st;
        m.index = static_cast<unsigned>(i);
        m.run = &onPause;
        c->post(&m);
        ++expected;
    }
    const auto deadline = std::chrono::steady_clock::now() + patience;
    while (st->paused.load(std::memory_order_acquire) < expected && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    std::vector<bool> paused(n);
    bool all = true;
    for (size_t i = 0; i < n; ++i) {
        paused[i] = st->answered[i].load(std::memory_order_acquire);
        if (!paused[i]) {
            all = false;
            listing.unanswered.push_back(static_cast<unsigned>(i));
        }
    }
    const uint64_t now = nowNs();
    try {
        // The caller's own fiber, when it has not suspended yet (and so is on no list).
        if (self != nullptr && self->running() != nullptr && self->running()->home_ == nullptr) {
            listing.fibers.push_back(infoOf(*self->running(), now, false));
        }
        for (size_t i = 0; i < n; ++i) {
            if (!paused[i]) { continue; }
            for (const Fiber* f = carriers_[i]->homeFibers(); f != nullptr; f = f->homeNext_) {
                // Backtraces only when every carrier is paused: a suspended fiber may otherwise be
                // resumed on a carrier that runs on, under the unwinder's feet.
                listing.fibers.push_back(infoOf(*f, now, backtraces && all));
            }
        }
    } catch (const std::bad_alloc&) {
        log::warn("fiber listing: out of memory after {} fibers; the rest are left out", listing.fibers.size());
    }
    st->resume.store(1, std::memory_order_release);
    st->resume.notify_all();
    st->drop();
    return listing;
}

Result<void> RuntimeImpl::joinFor(nanoseconds limit) noexcept {
    checkJoinable("Runtime::joinFor()");
    if (joined_) { return {}; }
    if (!waitCarriersExited(limit)) {
        reportAlive(limit);
        return Error{ETIMEDOUT};
    }
    join();
    return {};
}

bool RuntimeImpl::waitCarriersExited(nanoseconds limit) const noexcept {
    const auto deadline = std::chrono::steady_clock::now() + clampTimeout(limit);
    while (!carriersExited()) {
        if (std::chrono::steady_clock::now() >= deadline) { return false; }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
}

void RuntimeImpl::reportAlive(nanoseconds waited) const noexcept {
    try {
        const FiberListing l = listFibers(true, std::chrono::seconds(1));
        log::warn("shutdown: after {} ms, {} fibers are still alive and keep Runtime::join() waiting (a wait that "
                  "shutdown does not end: an untimed lock(), join(), offload(), FiberFuture::wait):\n{}",
                  std::chrono::duration_cast<std::chrono::milliseconds>(waited).count(), l.live,
                  formatFiberListing(l));
    } catch (...) {
        log::warn("shutdown: fibers are still alive after {} ms (no memory to list them)",
                  std::chrono::duration_cast<std::chrono::milliseconds>(waited).count());
    }
}

void RuntimeImpl::checkJoinable(const char* what) const noexcept {
    if (Carrier::current() != nullptr && Carrier::current()->runtime() == this) {
        log::error("{} called on one of the runtime's own carriers: it would wait for itself", what);
        SPINDLE_CHECK_MSG(false, "Runtime::join() called on one of its own carriers");
    }
    if (!stopping()) {
        log::error("{} called before Runtime::shutdown(): the carriers run until shutdown, so it would wait forever",
                   what);
        SPINDLE_CHECK_MSG(false, "Runtime::join() called before Runtime::shutdown()");
    }
}

bool RuntimeImpl::carriersExited() const noexcept {
    return std::all_of(carriers_.begin(), carriers_.end(), [](const auto& c) { return c->exited(); });
}

// ---- SIGUSR1 -------------------------------------------------------------------------------------------------

void RuntimeImpl::listOnSignal(bool on) noexcept {
    SignalLister& l = signalLister();
    std::lock_guard lock(l.mutex);
    if (!on) {
        l.runtimes.erase(std::remove(l.runtimes.begin(), l.runtimes.end(), this), l.runtimes.end());
        return;
    }
    if (!l.started) {
        if (::pipe2(l.pipe, O_CLOEXEC) != 0) {
            log::warn("fiber listing on SIGUSR1: pipe2 failed: {}; not installed", std::strerror(errno));
            return;
        }
        (void)::fcntl(l.pipe[1], F_SETFL, O_NONBLOCK);  // a signal storm drops listings, never blocks
        try {
            std::thread(&listOnSignalLoop).detach();
        } catch (const std::system_error& e) {
            log::warn("fiber listing on SIGUSR1: no thread ({}); not installed", e.what());
            return;
        }
        struct sigaction sa {};
        sa.sa_handler = &onListSignal;
        sa.sa_flags = SA_RESTART;
        sigemptyset(&sa.sa_mask);
        if (::sigaction(SIGUSR1, &sa, nullptr) != 0) {
            log::warn("fiber listing on SIGUSR1: sigaction failed: {}", std::strerror(errno));
            return;
        }
        l.started = true;
    }
    try {
        l.runtimes.push_back(this);
    } catch (...) {
        log::warn("fiber listing on SIGUSR1: out of memory; this runtime is not listed");
    }
}

// ---- debuggers ----------------------------------------------------------------------------------------------

namespace {
std::mutex gDebugMutex;  // guards spindle_debug_runtimes and the links from it
}  // namespace

void RuntimeImpl::showToDebuggers(bool on) noexcept {
    std::lock_guard lock(gDebugMutex);
    if (on) {
        for (size_t i = carriers_.size(); i-- > 0;) {
            carriers_[i]->debugNext_ = debugCarriers_;
            debugCarriers_ = carriers_[i].get();
        }
        debugNext_ = spindle_debug_runtimes;
        spindle_debug_runtimes = this;
        shownToDebuggers_ = true;
        return;
    }
    for (RuntimeImpl** p = &spindle_debug_runtimes; *p != nullptr; p = &(*p)->debugNext_) {
        if (*p == this) {
            *p = debugNext_;
            break;
        }
    }
    shownToDebuggers_ = false;
}

// ---- the stall monitor ---------------------------------------------------------------------------------------

StallMonitor::StallMonitor(RuntimeImpl* rt, uint64_t thresholdNs) noexcept : rt_(rt), thresholdNs_(thresholdNs) {}

StallMonitor::~StallMonitor() { stop(); }

Result<void> StallMonitor::start() noexcept {
    installStallHandler();
    try {
        watch_.resize(rt_->carriers().size());
        thread_ = std::thread([this] { run(); });
    } catch (const std::system_error& e) {
        return Error{e.code().value() != 0 ? e.code().value() : EAGAIN};
    } catch (...) {
        return Error{ENOMEM};
    }
    return {};
}

void StallMonitor::stop() noexcept {
    {
        std::lock_guard lock(mutex_);
        stop_ = true;
    }
    stopAsleep_.store(true, std::memory_order_seq_cst);
    rt_->wakeStallMonitor();
    cv_.notify_all();
    if (thread_.joinable()) { thread_.join(); }
    for (Watch& w : watch_) {
        if (w.stat >= 0) { ::close(std::exchange(w.stat, -1)); }
    }
}

void StallMonitor::run() noexcept {
    ::pthread_setname_np(::pthread_self(), "spindle-stall");
    const auto period = std::chrono::nanoseconds(std::max<uint64_t>(thresholdNs_ / 2, 1'000'000));
    std::unique_lock lock(mutex_);
    while (!cv_.wait_for(lock, period, [this] { return stop_; })) {
        lock.unlock();
        const uint64_t now = nowNs();
        const auto& carriers = rt_->carriers();
        for (size_t i = 0; i < carriers.size(); ++i) {
            Carrier* c = carriers[i].get();
            Watch& w = watch_[i];
            const uint64_t run = c->stats().fibersRun.load(std::memory_order_relaxed);
            const uint64_t cpu = threadCpuNs(c, w);
            if (run != w.run || !c->inFiber()) {
                w.run = run;
                w.since = now;
                w.cpuSince = cpu;
                continue;
            }
            // The same fiber since `since`. What counts is the time its thread spent on a CPU, or, when
            // the thread is blocked in the kernel now (a blocking call on the carrier), the wall time: a
            // thread that waits for a CPU behind others (preempted, a loaded machine) is not stalled by
            // its fiber, which would otherwise be reported again and again.
            const uint64_t wall = now - w.since;
            const uint64_t ran = cpu - std::min(cpu, w.cpuSince);
            const uint64_t stalled = ran >= thresholdNs_ ? ran : wall >= thresholdNs_ && blockedInKernel(c, w) ? wall : 0;
            if (stalled != 0 && w.reported != run) {
                w.reported = run;
                report(c, stalled);
            }
        }
        sleepWhileAllParked();
        lock.lock();
    }
}

uint64_t StallMonitor::threadCpuNs(Carrier* c, Watch& w) noexcept {
    if (!w.clockKnown) {
        if (c->threadId() == 0) { return 0; }  // not started yet
        w.clockKnown = true;
        if (::pthread_getcpuclockid(c->threadHandle(), &w.clock) != 0) { w.clockKnown = false; }
    }
    timespec ts{};
    if (!w.clockKnown || ::clock_gettime(w.clock, &ts) != 0) { return 0; }
    return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(ts.tv_nsec);
}

bool StallMonitor::blockedInKernel(Carrier* c, Watch& w) noexcept {
    if (!w.statTried) {
        const int tid = c->threadId();
        if (tid == 0) { return true; }
        w.statTried = true;
        char path[64];
        std::snprintf(path, sizeof(path), "/proc/self/task/%d/stat", tid);
        w.stat = ::open(path, O_RDONLY | O_CLOEXEC);
    }
    if (w.stat < 0) { return true; }  // cannot tell: wall time, as before
    // "tid (comm) S ...": the state follows the last ')' (a name may hold one).
    char buf[256];
    const ssize_t n = ::pread(w.stat, buf, sizeof(buf) - 1, 0);
    if (n <= 0) { return true; }
    buf[n] = '\0';
    const char* paren = std::strrchr(buf, ')');
    if (paren == nullptr || paren[1] != ' ') { return true; }
    return paren[2] != 'R';  // S, D: waiting in the kernel; R: running, or runnable and waiting for a CPU
}

void StallMonitor::sleepWhileAllParked() noexcept {
    // Only a carrier running a fiber can stall, and a parked carrier runs none: while every carrier is
    // parked, looking every half threshold would only cost an idle daemon a wake-up of this thread 200
    // times a second. Store, then look again (seq_cst both): a carrier leaving park() decrements the
    // count, then loads the flag, so either we see it unparked here or it sees us asleep and wakes us.
    const auto carriers = static_cast<uint32_t>(rt_->carriers().size());
    if (rt_->parkedCount_.load(std::memory_order_seq_cst) != carriers) { return; }
    rt_->stallMonitorAsleep_.store(1, std::memory_order_seq_cst);
    if (rt_->parkedCount_.load(std::memory_order_seq_cst) == carriers &&
        !stopAsleep_.load(std::memory_order_seq_cst)) {
        rt_->stallMonitorAsleep_.wait(1, std::memory_order_seq_cst);
    }
    rt_->stallMonitorAsleep_.store(0, std::memory_order_relaxed);
    // Whatever ran before the sleep is history: start every carrier's watch afresh.
    const uint64_t now = nowNs();
    const auto& all = rt_->carriers();
    for (size_t i = 0; i < all.size(); ++i) {
        watch_[i].run = all[i]->stats().fibersRun.load(std::memory_order_relaxed);
        watch_[i].since = now;
    }
}

void StallMonitor::report(Carrier* c, uint64_t ranNs) noexcept {
    auto& stalls = const_cast<Carrier::Stats&>(c->stats()).stalls;
    ownerAdd(stalls);  // the monitor alone writes it
    // Rate limit: at most kBurst reports per kWindowNs; the others are counted and said in the next.
    const uint64_t now = nowNs();
    if (now - windowStart_ >= kWindowNs) {
        windowStart_ = now;
        inWindow_ = 0;
    }
    if (++inWindow_ > kBurst) {
        ++suppressed_;
        return;
    }
    Carrier::StallSample& s = c->stallSample();
    uint32_t token = ++s.nextToken;
    if (token == 0) { token = ++s.nextToken; }
    s.requested.store(token, std::memory_order_release);
    std::string where;
    bool sampled = false;
    if (::pthread_kill(c->threadHandle(), stallSignal()) == 0) {
        for (int waited = 0; waited < 1000 && s.done.load(std::memory_order_acquire) != token; ++waited) {
            std::this_thread::sleep_for(std::chrono::microseconds(100));
        }
    }
    uint32_t pending = token;
    if (!s.requested.compare_exchange_strong(pending, 0, std::memory_order_acq_rel)) {
        // The handler took the request: it is writing the sample now, and done follows at once.
        while (s.done.load(std::memory_order_acquire) != token) { std::this_thread::yield(); }
    }
    sampled = s.done.load(std::memory_order_acquire) == token;
    std::string trace;
    if (sampled && s.fiberId != 0) {
        // The frames below the signal frame (all of them, if the unwinder could not tell which it was).
        for (int i = s.skip; i < s.depth; ++i) {
            trace += fmt::format("\n    #{} {} {}", i - s.skip, s.ips[i], nameOfAddress(s.ips[i]));
        }
        where = fmt::format("fiber '{}' (id {})", s.name, s.fiberId);
    } else {
        where = sampled ? "a fiber that has switched out since" : "a fiber (its carrier did not answer the signal)";
    }
    log::warn("stall: {} on carrier {} has run for {} ms without switching out (threshold {} ms){}{}", where,
              c->index(), ranNs / 1'000'000, thresholdNs_ / 1'000'000,
              suppressed_ != 0 ? fmt::format("; {} more stalls were not reported", std::exchange(suppressed_, 0)) : "",
              trace.empty() ? std::string() : "; backtrace:" + trace);
}

}  // namespace detail

std::string formatFiberListing(const FiberListing& listing) {
    std::string out = fmt::format("fibers: {} live, {} listed", listing.live, listing.fibers.size());
    if (!listing.unanswered.empty()) {
        out += "; carriers that did not pause (their fibers are missing):";
        for (unsigned c : listing.unanswered) { out += fmt::format(" {}", c); }
    }
    out += '\n';
    for (const FiberInfo& f : listing.fibers) {
        out += fmt::format("  fiber {} '{}' {}", f.id, f.name, f.state);
        if (f.state == "suspended") { out += fmt::format(" {} ms", f.suspendedMs); }
        out += fmt::format(" on carrier {}", f.carrier);
        if (f.home != f.carrier) { out += fmt::format(" (listed by {})", f.home); }
        if (!f.waitKind.empty()) { out += fmt::format(": {} {}", f.waitKind, f.waitDetail); }
        out += '\n';
        for (const std::string& frame : f.backtrace) { out += fmt::format("      {}\n", frame); }
    }
    return out;
}

FiberListing Runtime::fibers(bool backtraces, std::chrono::milliseconds patience) const {
    return impl_->listFibers(backtraces, patience);
}

Result<void> Runtime::joinFor(std::chrono::nanoseconds limit) noexcept { return impl_->joinFor(limit); }

}  // namespace spindle
