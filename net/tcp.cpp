#include "net/tcp.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <deque>
#include <mutex>

#include "base/log.h"
#include "core/fiber.h"
#include "core/fiber_future.h"
#include "core/io.h"
#include "net/internal/ops.h"

namespace spindle::net {

// ---- TcpListener ---------------------------------------------------------------------------------

/// The listener's state, shared with its multishot accept's completion (which runs on the carrier
/// whose ring holds the operation) and with accept() callers on any carrier or thread.
/// Invariant: `armed` is true from armMultishot() until the CQE without F_MORE, and only then may
/// the state be destroyed; close() has the owning carrier cancel the operation and waits for `ended`.
struct TcpListener::State : MultishotCompletion {
    int fd = -1;
    ListenOptions options;
    SocketAddress local;

    std::mutex lock;             // guards everything below; held only briefly, never across a wait
    std::deque<int> ready;       // accepted descriptors not yet taken by accept()
    int error = 0;               // why the last multishot ended, for the next accept() to act on
    bool armed = false;
    bool closing = false;
    std::atomic<bool> multishotWorks{true};  // false after the kernel refused it (EINVAL on the first arm)
    bool everDelivered = false;  // the current multishot produced a connection (so EINVAL is not "unsupported")
    FiberFuture* waiter = nullptr;  // an accept() parked for the next connection
    FiberFuture ended;           // set by the CQE that ends the multishot (awaited by close())

    std::atomic<uint64_t> accepted{0};
    std::atomic<uint64_t> arms{0};
    std::atomic<uint64_t> backoffs{0};
    std::atomic<bool> loggedBackoff{false};  // the current run of resource errors was logged

    State() noexcept { fn = &State::onCqe; }

    static void onCqe(MultishotCompletion* self, int32_t res, uint32_t flags) noexcept {
        auto* s = static_cast<State*>(self);
        std::lock_guard<std::mutex> g(s->lock);
        if (res >= 0) {
            s->everDelivered = true;
            if (s->closing) {
                ::close(res);
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
            s->ended.set(res);
        }
        if (FiberFuture* w = std::exchange(s->waiter, nullptr)) { w->set(0); }
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
            {
                std::lock_guard<std::mutex> g(s.lock);
                if (s.closing) { return Error{EBADF}; }
            }
            auto fd = detail::accept(s.fd, nullptr, nullptr, deadline);
            if (fd) {
                s.loggedBackoff.store(false, std::memory_order_relaxed);
                return handed(*fd);
            }
            if (!isResourceError(fd.errorCode())) { return Error{fd.errorCode()}; }
            if (auto r = backOff(fd.errorCode()); !r) { return Error{r.errorCode()}; }
            continue;
        }
        FiberFuture wake;
        bool arm = false;
        int resourceError = 0;
        {
            std::lock_guard<std::mutex> g(s.lock);
            if (s.closing) { return Error{EBADF}; }
            if (!s.ready.empty()) {
                const int fd = s.ready.front();
                s.ready.pop_front();
                s.loggedBackoff.store(false, std::memory_order_relaxed);
                return handed(fd);
            }
            if (s.error != 0) {
                const int e = std::exchange(s.error, 0);
                if (e == EINVAL && !s.everDelivered) {
                    s.multishotWorks.store(false, std::memory_order_relaxed);  // a kernel before 5.19: one-shot accepts from now on
                    continue;
                }
                if (!isResourceError(e)) { return Error{e}; }
                resourceError = e;  // backed off below, outside the lock
            } else if (!s.armed) {
                s.armed = true;
                s.everDelivered = false;
                s.ended.reset();
                arm = true;
            } else {
                s.waiter = &wake;
            }
        }
        if (resourceError != 0) {
            if (auto r = backOff(resourceError); !r) { return Error{r.errorCode()}; }
            continue;
        }
        if (arm) {
            auto r = armMultishot(op::acceptMultishot(s.fd, SOCK_CLOEXEC), &s);
            if (!r) {
                std::lock_guard<std::mutex> g(s.lock);
                s.armed = false;
                s.ended.set(-r.errorCode());
                return Error{r.errorCode()};
            }
            s.arms.fetch_add(1, std::memory_order_relaxed);
            continue;
        }
        // Parked until the completion hands over a connection or an error, the deadline, or a cancel.
        int32_t w = 0;
        if (deadline.isSet()) {
            timespec now{};
            ::clock_gettime(CLOCK_MONOTONIC, &now);
            const uint64_t nowNs = static_cast<uint64_t>(now.tv_sec) * 1000000000u + static_cast<uint64_t>(now.tv_nsec);
            const uint64_t left = deadline.ns() > nowNs ? deadline.ns() - nowNs : 0;
            w = FiberFuture::waitWithTimeout(&wake, std::chrono::nanoseconds(left));
        } else {
            w = FiberFuture::waitWithTimeout(&wake, std::chrono::hours(24));
        }
        if (w == -ETIMEDOUT || w == -ECANCELED) {
            bool stillMine = false;
            {
                std::lock_guard<std::mutex> g(s.lock);
                if (s.waiter == &wake) {
                    s.waiter = nullptr;
                    stillMine = true;
                }
            }
            if (!stillMine) { (void)wake.wait(); }  // the completion claimed it: its set() is done
            if (w == -ECANCELED) { return Error{ECANCELED}; }
            if (deadline.isSet()) { return Error{ETIMEDOUT}; }
        }
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
    bool armed = false;
    {
        std::lock_guard<std::mutex> g(s.lock);
        if (s.closing) { return; }
        s.closing = true;
        armed = s.armed;
        if (FiberFuture* w = std::exchange(s.waiter, nullptr)) { w->set(0); }
    }
    if (armed) {
        // The carrier holding the multishot cancels it; its last CQE sets `ended`. Without the message
        // (ENOMEM), shutdown(2) ends a TCP listener's pending accept with EINVAL all the same.
        if (!cancelMultishot(&s)) { (void)::shutdown(s.fd, SHUT_RD); }
        (void)s.ended.wait();
        settleMultishot(&s);
    }
    std::deque<int> left;
    {
        std::lock_guard<std::mutex> g(s.lock);
        left.swap(s.ready);
    }
    for (int fd : left) { ::close(fd); }
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

Result<size_t> TcpStream::send(const void* buf, size_t len, Deadline deadline) noexcept {
    if (fd_ < 0) { return Error{EBADF}; }
    return detail::send(fd_, buf, len, 0, deadline);
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

Result<void> TcpStream::writeAll(const void* buf, size_t len, Deadline deadline, size_t* sent) noexcept {
    size_t done = 0;
    const auto* p = static_cast<const char*>(buf);
    Result<void> out;
    while (done < len) {
        auto r = send(p + done, len - done, deadline);
        if (!r) {
            out = Error{r.errorCode()};
            break;
        }
        done += *r;
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
