// SPDX-License-Identifier: Apache-2.0
#include "net/tcp.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <deque>
#include <type_traits>

#include "base/log.h"
#include "core/fiber.h"
#include "core/fiber_future.h"
#include "core/runtime.h"
#include "core/internal/carrier.h"
#include "core/internal/sync_support.h"
#include "core/io.h"
#include "net/internal/ops.h"

namespace spindle::net {

// ---- TcpListener ---------------------------------------------------------------------------------

namespace {

// What an accept() caller parked on the listener receives: a connection (its descriptor, >= 0), or
// one of these.
constexpr int32_t kRetry = -EAGAIN;   // the multishot ended (or the caller was withdrawn): look again
constexpr int32_t kClosed = -EBADF;   // close() ran

// An accept() caller waiting for the next connection, on its own stack.
struct AcceptWaiter {
    FiberFuture future;
    AcceptWaiter* next = nullptr;
    AcceptWaiter* prev = nullptr;
    bool linked = false;  // in State::waiters (home's thread only)
};

}  // namespace

/// The listener's state, shared with its multishot accept's completion and with accept() callers on
/// any carrier.
/// Share-nothing: `home` is the carrier that holds the multishot accept, chosen once by the first fiber
/// that accepts, and everything below "home's thread only" is touched on that carrier's thread alone:
/// by the completion handler, by accept() callers running there, and by steps that callers elsewhere
/// have run there (Runtime::runOnCarrier). There is no lock, so no thread, preempted or not, can hold
/// the carrier up in the middle of a completion.
/// Invariant: `armed` is true from the arm until the CQE without F_MORE, and only then may the state
/// be destroyed; close() has home cancel the operation and waits for `ended`.
struct TcpListener::State : MultishotCompletion {
    int fd = -1;
    ListenOptions options;
    SocketAddress local;

    std::atomic<spindle::detail::Carrier*> home{nullptr};  // set once (CAS from null)
    std::atomic<bool> closing{false};
    std::atomic<bool> multishotWorks{true};  // false after the kernel refused it (EINVAL on the first arm)
    FiberFuture ended;           // set while no operation is armed; the last CQE sets it (close() waits)

    // --- home's thread only ---
    std::deque<int> ready;       // accepted descriptors that no caller was waiting for
    int error = 0;               // why the last multishot ended, for the next accept() to act on
    bool armed = false;
    bool everDelivered = false;  // the current multishot produced a connection (so EINVAL is not "unsupported")
    spindle::detail::IntrusiveFifo<AcceptWaiter> waiters;  // callers parked for a connection, oldest first

    std::atomic<uint64_t> accepted{0};
    std::atomic<uint64_t> arms{0};
    std::atomic<uint64_t> backoffs{0};
    std::atomic<bool> loggedBackoff{false};  // the current run of resource errors was logged

    State() noexcept {
        fn = &State::onCqe;
        ended.set(0);
    }

    // Home's thread: a connection goes to the oldest waiter, else to the queue; the end of the
    // operation sends every waiter back to look again (one of them re-arms or takes the error).
    static void onCqe(MultishotCompletion* self, int32_t res, uint32_t flags) noexcept {
        auto* s = static_cast<State*>(self);
        if (res >= 0) {
            s->everDelivered = true;
            if (s->closing.load(std::memory_order_acquire)) {
                ::close(res);
            } else if (AcceptWaiter* w = s->waiters.popFront()) {
                w->linked = false;
                w->future.set(res);
            } else {
                try {
                    s->ready.push_back(res);
                } catch (...) {
                    ::close(res);  // ENOMEM: shed the connection rather than lose track of it
                }
            }
        }
        if ((flags & op::kMore) == 0) {
            s->armed = false;
            if (res < 0) { s->error = -res; }
            s->wakeAll(kRetry);
            s->ended.set(res);
        }
    }

    void wakeAll(int32_t why) noexcept {
        while (AcceptWaiter* w = waiters.popFront()) {
            w->linked = false;
            w->future.set(why);
        }
    }

    // Runs fn() on home's thread: at once when the caller is there, else through its inbox (parking
    // the caller). Errors: ECANCELED when home's runtime is shutting down and the caller is not one of
    // its fibers.
    template <class F>
    Result<void> onHome(spindle::detail::Carrier* h, F&& step) noexcept {
        if (spindle::detail::Carrier::current() == h) {
            step();
            return {};
        }
        auto call = [](void* ctx) noexcept { (*static_cast<std::remove_reference_t<F>*>(ctx))(); };
        return spindle::detail::runOnCarrier(h->runtime(), h->index(), call, static_cast<void*>(std::addressof(step)));
    }

    // One look at the listener, on home's thread: a queued connection (>= 0), a reason to stop or back
    // off (-errno, kRetry after the kernel refused multishot), or the caller parked in `waiters` (1).
    int32_t takeOrWait(AcceptWaiter* w) noexcept {
        for (;;) {
            if (closing.load(std::memory_order_acquire)) { return kClosed; }
            if (!ready.empty()) {
                const int conn = ready.front();
                ready.pop_front();
                return conn;
            }
            if (error != 0) {
                const int e = std::exchange(error, 0);
                if (e == EINVAL && !everDelivered) {
                    multishotWorks.store(false, std::memory_order_relaxed);  // a kernel before 5.19
                    return kRetry;
                }
                return -e;
            }
            if (armed) {
                w->linked = true;
                waiters.pushBack(w);
                return 1;
            }
            armed = true;
            everDelivered = false;
            ended.reset();
            // Last, with the state consistent: a driver may deliver a completion before this returns.
            auto r = armMultishot(op::acceptMultishot(fd, SOCK_CLOEXEC), this);
            if (!r) {
                armed = false;
                ended.set(-r.errorCode());
                return -r.errorCode();
            }
            arms.fetch_add(1, std::memory_order_relaxed);
        }
    }
};

namespace {

bool isResourceError(int e) noexcept { return e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM; }

// One step of the EMFILE backoff: doubles from backoffMin to backoffMax while the errors last.
uint64_t nextBackoffNs(uint64_t current, const ListenOptions& o) noexcept {
    const uint64_t lo = static_cast<uint64_t>(std::chrono::nanoseconds(o.backoffMin).count());
    const uint64_t hi = std::max(lo, static_cast<uint64_t>(std::chrono::nanoseconds(o.backoffMax).count()));
    if (current == 0) { return std::max<uint64_t>(lo, 1); }
    return std::min(hi, current * 2);
}

}  // namespace

TcpListener::TcpListener() noexcept = default;
TcpListener::TcpListener(std::unique_ptr<State> state) noexcept : state_(std::move(state)) {}
TcpListener::TcpListener(TcpListener&&) noexcept = default;
TcpListener& TcpListener::operator=(TcpListener&& o) noexcept {
    if (this != &o) {
        close();
        state_ = std::move(o.state_);
    }
    return *this;
}
TcpListener::~TcpListener() { close(); }

Result<TcpListener> TcpListener::bind(const SocketAddress& address, const ListenOptions& options) noexcept {
    const int family = address.family();
    if (family != AF_INET && family != AF_INET6 && family != AF_UNIX) { return Error{EINVAL}; }
    if (options.backlog <= 0 || options.backoffMin.count() < 0 || options.backoffMax < options.backoffMin) {
        return Error{EINVAL};
    }
    auto fd = detail::openSocket(family, SOCK_STREAM);
    if (!fd) { return Error{fd.errorCode()}; }
    auto fail = [&](int e) -> Result<TcpListener> {
        ::close(*fd);
        return Error{e};
    };
    if (family != AF_UNIX) {
        if (options.reuseAddress) {
            if (auto r = detail::setIntOption(*fd, SOL_SOCKET, SO_REUSEADDR, 1); !r) { return fail(r.errorCode()); }
        }
        if (options.reusePort) {
            if (auto r = detail::setIntOption(*fd, SOL_SOCKET, SO_REUSEPORT, 1); !r) { return fail(r.errorCode()); }
        }
        if (family == AF_INET6) {
            if (auto r = detail::setIntOption(*fd, IPPROTO_IPV6, IPV6_V6ONLY, options.v6Only ? 1 : 0); !r) {
                return fail(r.errorCode());
            }
        }
    }
    if (::bind(*fd, address.data(), address.size()) != 0) { return fail(errno); }
    if (options.reusePortAfterBind && family != AF_UNIX && !options.reusePort) {
        if (auto r = detail::setIntOption(*fd, SOL_SOCKET, SO_REUSEPORT, 1); !r) { return fail(r.errorCode()); }
    }
    if (::listen(*fd, options.backlog) != 0) { return fail(errno); }
    std::unique_ptr<State> s;
    try {
        s = std::make_unique<State>();
    } catch (...) {
        return fail(ENOMEM);
    }
    s->fd = *fd;
    s->options = options;
    SocketAddress local;
    socklen_t len = SocketAddress::capacity();
    if (auto r = detail::sockName(*fd, false, local.data(), &len); r) {
        local.setSize(len);
        s->local = local;
    } else {
        s->local = address;
    }
    return TcpListener(std::move(s));
}

Result<TcpStream> TcpListener::accept(SocketAddress* peer, Deadline deadline) noexcept {
    if (!state_) { return Error{EBADF}; }
    State& s = *state_;
    uint64_t backoff = 0;
    auto handed = [&](int fd) -> Result<TcpStream> {
        s.loggedBackoff.store(false, std::memory_order_relaxed);
        s.accepted.fetch_add(1, std::memory_order_relaxed);
        if (peer != nullptr) {
            *peer = SocketAddress{};
            socklen_t len = SocketAddress::capacity();
            if (detail::sockName(fd, true, peer->data(), &len)) { peer->setSize(len); }
        }
        return TcpStream(fd);
    };
    // A resource error: sleep (the ready socket would otherwise fail again at once), then retry.
    auto backOff = [&](int e) -> Result<void> {
        s.backoffs.fetch_add(1, std::memory_order_relaxed);
        backoff = nextBackoffNs(backoff, s.options);
        if (!s.loggedBackoff.exchange(true, std::memory_order_relaxed)) {
            log::warn("listener {}: accept failed with {} ({}); backing off", s.local.toString(), std::strerror(e), e);
        }
        return detail::backoffSleep(backoff, deadline);
    };
    const bool multishot = s.options.multishot && this_fiber::inFiber();
    while (true) {
        if (!multishot || !s.multishotWorks.load(std::memory_order_relaxed)) {
            if (s.closing.load(std::memory_order_acquire)) { return Error{EBADF}; }
            auto fd = detail::accept(s.fd, nullptr, nullptr, deadline);
            if (fd) { return handed(*fd); }
            if (!isResourceError(fd.errorCode())) { return Error{fd.errorCode()}; }
            if (auto r = backOff(fd.errorCode()); !r) { return Error{r.errorCode()}; }
            continue;
        }
        // The first fiber to accept makes its carrier home (close() reads home after raising `closing`,
        // and this reads `closing` after setting home: one of the two sees the other).
        spindle::detail::Carrier* home = s.home.load(std::memory_order_acquire);
        if (home == nullptr) {
            spindle::detail::Carrier* here = spindle::detail::Carrier::current();
            if (!s.home.compare_exchange_strong(home, here, std::memory_order_seq_cst)) { continue; }
            home = here;
        }
        if (s.closing.load(std::memory_order_seq_cst)) { return Error{EBADF}; }
        AcceptWaiter w;
        int32_t got = 0;
        if (auto r = s.onHome(home, [&] { got = s.takeOrWait(&w); }); !r) { return Error{r.errorCode()}; }
        if (got == 1) {
            // Parked until the completion hands over a connection, the multishot ends, the deadline,
            // or a cancel.
            int32_t res = 0;
            if (deadline.isSet()) {
                timespec now{};
                ::clock_gettime(CLOCK_MONOTONIC, &now);
                const uint64_t nowNs =
                    static_cast<uint64_t>(now.tv_sec) * 1000000000u + static_cast<uint64_t>(now.tv_nsec);
                const uint64_t left = deadline.ns() > nowNs ? deadline.ns() - nowNs : 0;
                res = FiberFuture::waitWithTimeout(&w.future, std::chrono::nanoseconds(left));
            } else {
                res = FiberFuture::waitWithTimeout(&w.future, FiberFuture::kNoTimeout);  // cancellable
            }
            if (res == -ETIMEDOUT || res == -ECANCELED) {
                bool withdrawn = false;
                const auto r = s.onHome(home, [&] {
                    if (w.linked) {
                        s.waiters.unlink(&w);
                        w.linked = false;
                        withdrawn = true;
                    }
                });
                if (!withdrawn) {
                    // Home handed it something first (or cannot be reached, being shut down: then the
                    // operation's last completion wakes every waiter). What it handed counts.
                    if (!r) { return Error{r.errorCode()}; }
                    const int32_t handedRes = w.future.wait();
                    if (handedRes >= 0) { return handed(handedRes); }
                    if (handedRes == kClosed) { return Error{EBADF}; }
                }
                if (res == -ECANCELED) { return Error{ECANCELED}; }
                return Error{ETIMEDOUT};  // a wait without a deadline has no limit: it cannot time out
            }
            got = res;
            if (got == kRetry) { continue; }
        }
        if (got >= 0) { return handed(got); }
        if (got == kRetry) { continue; }
        const int e = -got;
        if (!isResourceError(e)) { return Error{e}; }
        if (auto r = backOff(e); !r) { return Error{r.errorCode()}; }
    }
}

Result<TcpStream> TcpListener::accept(Deadline deadline) noexcept { return accept(nullptr, deadline); }

SocketAddress TcpListener::localAddress() const noexcept { return state_ ? state_->local : SocketAddress{}; }
int TcpListener::fd() const noexcept { return state_ ? state_->fd : -1; }
bool TcpListener::isOpen() const noexcept { return state_ && state_->fd >= 0; }

ListenerStats TcpListener::stats() const noexcept {
    ListenerStats st;
    if (state_) {
        st.accepted = state_->accepted.load(std::memory_order_relaxed);
        st.multishotArms = state_->arms.load(std::memory_order_relaxed);
        st.resourceBackoffs = state_->backoffs.load(std::memory_order_relaxed);
    }
    return st;
}

void TcpListener::close() noexcept {
    if (!state_) { return; }
    State& s = *state_;
    if (s.closing.exchange(true, std::memory_order_seq_cst)) { return; }
    if (spindle::detail::Carrier* home = s.home.load(std::memory_order_seq_cst)) {
        // Home wakes the waiters and cancels its operation; the operation's last CQE sets `ended`. Where
        // home cannot be reached (its runtime is shutting down and this is no fiber of it), shutdown(2)
        // ends a TCP listener's pending accept with EINVAL all the same, and the shutdown ends the rest.
        bool armed = false;
        auto r = s.onHome(home, [&] {
            s.wakeAll(kClosed);
            armed = s.armed;
            if (armed) { (void)cancelMultishot(&s); }
        });
        if (!r) { (void)::shutdown(s.fd, SHUT_RD); }
        (void)s.ended.wait();
        if (armed || !r) { settleMultishot(&s); }
    }
    // No completion is left to come and every step on home now sees `closing`: the queue is ours.
    for (int fd : s.ready) { ::close(fd); }
    s.ready.clear();
    ::close(s.fd);
    s.fd = -1;
}

// ---- TcpStream -----------------------------------------------------------------------------------

Result<TcpStream> TcpStream::connect(const SocketAddress& address, Deadline deadline) noexcept {
    const int family = address.family();
    if (family != AF_INET && family != AF_INET6 && family != AF_UNIX) { return Error{EINVAL}; }
    auto fd = detail::openSocket(family, SOCK_STREAM);
    if (!fd) { return Error{fd.errorCode()}; }
    TcpStream s(*fd);
    if (auto r = detail::connect(*fd, address.data(), address.size(), deadline); !r) { return Error{r.errorCode()}; }
    return s;
}

Result<size_t> TcpStream::recv(void* buf, size_t len, Deadline deadline) noexcept {
    if (fd_ < 0) { return Error{EBADF}; }
    return detail::recv(fd_, buf, len, 0, deadline);
}

Result<size_t> TcpStream::send(const void* buf, size_t len, Deadline deadline, int flags) noexcept {
    if (fd_ < 0) { return Error{EBADF}; }
    return detail::send(fd_, buf, len, flags, deadline);
}

Result<size_t> TcpStream::writev(const iovec* iov, int iovcnt, Deadline deadline) noexcept {
    if (fd_ < 0) { return Error{EBADF}; }
    if (iovcnt <= 0 || iovcnt > IOV_MAX) { return Error{EINVAL}; }
    msghdr msg{};
    msg.msg_iov = const_cast<iovec*>(iov);
    msg.msg_iovlen = static_cast<size_t>(iovcnt);
    return detail::sendmsg(fd_, &msg, 0, deadline);
}

Result<void> TcpStream::readExact(void* buf, size_t len, Deadline deadline, size_t* got) noexcept {
    size_t done = 0;
    auto* p = static_cast<char*>(buf);
    Result<void> out;
    while (done < len) {
        auto r = recv(p + done, len - done, deadline);
        if (!r) {
            out = Error{r.errorCode()};
            break;
        }
        if (*r == 0) {
            out = Error{ENODATA};
            break;
        }
        done += *r;
    }
    if (got != nullptr) { *got = done; }
    return out;
}

Result<void> TcpStream::writeAll(const void* buf, size_t len, Deadline deadline, size_t* sent, int flags) noexcept {
    size_t done = 0;
    const auto* p = static_cast<const char*>(buf);
    Result<void> out;
    while (done < len) {
        auto r = send(p + done, len - done, deadline, flags);
        if (!r) {
            out = Error{r.errorCode()};
            break;
        }
        done += *r;
    }
    if (sent != nullptr) { *sent = done; }
    return out;
}

Result<void> TcpStream::writeAllWithin(const void* buf, size_t len, std::chrono::nanoseconds timeout, size_t* sent,
                                       int flags) noexcept {
    // The first try never waits, so it needs no deadline; the clock is read only when it fell short.
    size_t done = 0;
    Result<void> out;
    if (len > 0) {
        auto r = send(buf, len, Deadline::never(), flags | MSG_DONTWAIT);
        if (r) {
            done = *r;
        } else if (r.errorCode() != EAGAIN) {
            out = Error{r.errorCode()};
        }
    }
    if (out && done < len) {
        size_t rest = 0;
        out = writeAll(static_cast<const char*>(buf) + done, len - done, Deadline(timeout), &rest, flags);
        done += rest;
    }
    if (sent != nullptr) { *sent = done; }
    return out;
}

Result<void> TcpStream::writevAll(iovec* iov, int iovcnt, Deadline deadline) noexcept {
    while (iovcnt > 0) {
        // Skip emptied buffers so that the kernel never sees a zero-length gather at the front.
        while (iovcnt > 0 && iov->iov_len == 0) {
            ++iov;
            --iovcnt;
        }
        if (iovcnt == 0) { break; }
        auto r = writev(iov, std::min(iovcnt, IOV_MAX), deadline);
        if (!r) { return Error{r.errorCode()}; }
        size_t n = *r;
        while (n > 0) {
            const size_t step = std::min(n, iov->iov_len);
            iov->iov_base = static_cast<char*>(iov->iov_base) + step;
            iov->iov_len -= step;
            n -= step;
            if (iov->iov_len == 0) {
                ++iov;
                --iovcnt;
            }
        }
    }
    return {};
}

Result<void> TcpStream::shutdown(int how, Deadline deadline) noexcept {
    if (fd_ < 0) { return Error{EBADF}; }
    if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR) { return Error{EINVAL}; }
    return detail::shutdown(fd_, how, deadline);
}

Result<void> TcpStream::setNoDelay(bool on) noexcept {
    if (fd_ < 0) { return Error{EBADF}; }
    return detail::setIntOption(fd_, IPPROTO_TCP, TCP_NODELAY, on ? 1 : 0);
}

Result<void> TcpStream::setKeepAlive(bool on, const KeepAlive& timings) noexcept {
    if (fd_ < 0) { return Error{EBADF}; }
    if (on && (timings.idle.count() < 1 || timings.interval.count() < 1 || timings.count < 1 ||
               timings.idle.count() > 32767 || timings.interval.count() > 32767 || timings.count > 127)) {
        return Error{EINVAL};
    }
    if (auto r = detail::setIntOption(fd_, SOL_SOCKET, SO_KEEPALIVE, on ? 1 : 0); !r) { return r; }
    if (!on) { return {}; }
    if (auto r = detail::setIntOption(fd_, IPPROTO_TCP, TCP_KEEPIDLE, static_cast<int>(timings.idle.count())); !r) { return r; }
    if (auto r = detail::setIntOption(fd_, IPPROTO_TCP, TCP_KEEPINTVL, static_cast<int>(timings.interval.count())); !r) {
        return r;
    }
    return detail::setIntOption(fd_, IPPROTO_TCP, TCP_KEEPCNT, timings.count);
}

Result<void> TcpStream::setResetOnClose() noexcept {
    if (fd_ < 0) { return Error{EBADF}; }
    const linger l{1, 0};
    if (::setsockopt(fd_, SOL_SOCKET, SO_LINGER, &l, sizeof(l)) != 0) { return Error{errno}; }
    return {};
}

}  // namespace spindle::net
