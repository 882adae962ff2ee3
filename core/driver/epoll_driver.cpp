// SPDX-License-Identifier: Apache-2.0
#include "core/driver/epoll_driver.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include "base/check.h"
#include "base/counter.h"
#include "base/inject.h"
#include "base/log.h"
#include "core/driver/buffer_group.h"
#include "core/driver/splice_ends.h"
#include "core/internal/carrier.h"
#include "core/internal/runtime_impl.h"

namespace spindle::detail {
namespace {

constexpr uint64_t kWakeTag = ~uint64_t{0};  // epoll data of the wake-up eventfd
constexpr uint64_t kCurrentPosition = ~uint64_t{0};
constexpr uint32_t kInterest = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
constexpr uint32_t kParked = 1;      // IoRequest::driverState: in an fd's waiter list
constexpr uint32_t kConnecting = 2;  // ... and a connect that answered EINPROGRESS
constexpr uint32_t kOnOutput = 4;    // ... a splice or tee in o.fd2's list, for room there (else o.fd's, for input)
constexpr uint32_t kRetrying = 8;    // a splice or tee waiting out a lasting EAGAIN on the deadline heap, in no list
constexpr uint32_t kBackoffShift = 8;        // driverState >> this: the waits out of a lasting EAGAIN so far
constexpr uint32_t kMaxBackoff = 6;          // 1 ms << 6: the longest of them
constexpr uint64_t kRetryBaseNs = 1'000'000;

// ---- close generations -----------------------------------------------------------------------
// One counter per descriptor number below the hard RLIMIT_NOFILE (capped), shared by all carriers.
struct CloseGenerations {
    size_t size = 0;
    std::unique_ptr<std::atomic<uint32_t>[]> gen;
    CloseGenerations() {
        rlimit rl{};
        rlim_t n = ::getrlimit(RLIMIT_NOFILE, &rl) == 0 ? rl.rlim_max : 1024;
        if (n == RLIM_INFINITY || n > (1u << 20)) { n = 1u << 20; }
        size = static_cast<size_t>(n);
        gen.reset(new (std::nothrow) std::atomic<uint32_t>[size]());
        if (!gen) { size = 0; }
    }
};
CloseGenerations& closeGenerations() {
    static CloseGenerations g;
    return g;
}

bool isPathOp(op::Code c) noexcept {
    switch (c) {
        case op::Code::kFsync:
        case op::Code::kOpenat:
        case op::Code::kOpenat2:
        case op::Code::kStatx:
        case op::Code::kFallocate:
        case op::Code::kUnlinkat:
        case op::Code::kRenameat:
        case op::Code::kMkdirat:
            return true;
        default:
            return false;
    }
}

bool isSpliceOp(op::Code c) noexcept { return c == op::Code::kSplice || c == op::Code::kTee; }

// The descriptor in whose waiter list a request parked with `state` (its driverState) waits.
int parkedFd(const op::Op& o, uint32_t state) noexcept { return (state & kOnOutput) != 0 ? o.fd2 : o.fd; }

bool isRwOp(op::Code c) noexcept {
    return c == op::Code::kRead || c == op::Code::kWrite || c == op::Code::kReadv || c == op::Code::kWritev;
}

int32_t fromSys(long r) noexcept { return r < 0 ? -errno : static_cast<int32_t>(r); }

// splice(2) and tee(2) raise SIGPIPE on the calling thread when the reader of what they write has
// gone (a socket the peer reset, a pipe with no reader): they have no MSG_NOSIGNAL, and a process
// that does not ignore the signal would end. Their callers get EPIPE instead, as from a send: the
// signal is blocked around the call, and the one it raised is taken before the mask is restored.
// A call that raised it returned EPIPE or, when some bytes went first, a short count: only those
// look. (io_uring runs them on its workers, which take no signals.) A thread that blocks SIGPIPE
// itself keeps whatever is pending.
template <class Call>
int32_t withoutSigpipe(size_t len, Call call) noexcept {
    sigset_t pipeSignal;
    sigset_t old;
    ::sigemptyset(&pipeSignal);
    ::sigaddset(&pipeSignal, SIGPIPE);
    if (::pthread_sigmask(SIG_BLOCK, &pipeSignal, &old) != 0) { return fromSys(call()); }
    const int32_t r = fromSys(call());
    if (::sigismember(&old, SIGPIPE) == 0) {
        if (r == -EPIPE || (r >= 0 && static_cast<size_t>(r) < len)) {
            const timespec now{};
            (void)::sigtimedwait(&pipeSignal, nullptr, &now);  // one at most: SIGPIPE does not queue
        }
        ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
    }
    return r;
}

// The events that may let parked request `req` make progress.
uint32_t wantedEvents(const op::IoRequest& req) noexcept {
    const op::Op& o = *req.op;
    if ((req.driverState & kOnOutput) != 0) { return EPOLLOUT | EPOLLERR | EPOLLHUP; }
    if (o.code == op::Code::kPoll) {
        uint32_t e = 0;
        if ((o.len & (POLLIN | POLLRDNORM | POLLRDBAND | POLLPRI | POLLRDHUP)) != 0) { e |= EPOLLIN; }
        if ((o.len & (POLLOUT | POLLWRNORM | POLLWRBAND)) != 0) { e |= EPOLLOUT; }
        return e | EPOLLERR | EPOLLHUP;
    }
    return (o.writes() ? EPOLLOUT : EPOLLIN) | EPOLLERR | EPOLLHUP;
}

// recv(2) and send(2) as plain system calls. libc's wrappers are cancellation points, and each
// brackets the call with two atomic updates of the thread's cancellation state (the carriers are
// never cancelled): two locked instructions on the path of every message.
long rawRecv(int fd, void* buf, size_t len, int flags) noexcept {
    return ::syscall(SYS_recvfrom, fd, buf, len, flags, nullptr, nullptr);
}
long rawSend(int fd, const void* buf, size_t len, int flags) noexcept {
    return ::syscall(SYS_sendto, fd, buf, len, flags, nullptr, 0);
}

// One attempt at `o`. `nonblock`: never block (MSG_DONTWAIT, RWF_NOWAIT, a zero poll); -EAGAIN
// then says "not now". Blocking: the plain calls, for a plain thread or the offload pool (or a
// descriptor we made O_NONBLOCK, which answers EAGAIN all the same).
int32_t attempt(const op::Op& o, bool nonblock) noexcept {
    using op::Code;
    const int dontwait = nonblock ? MSG_DONTWAIT : 0;
    switch (o.code) {
        case Code::kNop:
            return 0;
        case Code::kRead:
        case Code::kWrite: {
            iovec iov{o.addr, o.len};
            const off_t off = o.off == kCurrentPosition ? -1 : static_cast<off_t>(o.off);
            const int flags = nonblock ? RWF_NOWAIT : 0;
            return fromSys(o.code == Code::kRead ? ::preadv2(o.fd, &iov, 1, off, flags)
                                                 : ::pwritev2(o.fd, &iov, 1, off, flags));
        }
        case Code::kReadv:
        case Code::kWritev: {
            const off_t off = o.off == kCurrentPosition ? -1 : static_cast<off_t>(o.off);
            const int flags = nonblock ? RWF_NOWAIT : 0;
            const auto* iov = static_cast<const iovec*>(o.addr);
            const int n = static_cast<int>(o.len);
            return fromSys(o.code == Code::kReadv ? ::preadv2(o.fd, iov, n, off, flags) : ::pwritev2(o.fd, iov, n, off, flags));
        }
        case Code::kFsync:
            return fromSys((o.opFlags & op::kDatasync) != 0 ? ::fdatasync(o.fd) : ::fsync(o.fd));
        case Code::kOpenat:
            return fromSys(::openat(o.fd, static_cast<const char*>(o.addr), static_cast<int>(o.opFlags),
                                    static_cast<mode_t>(o.len)));
        case Code::kOpenat2:
            return fromSys(::syscall(SYS_openat2, o.fd, static_cast<const char*>(o.addr), o.addr2, sizeof(open_how)));
        case Code::kClose:
            return fromSys(::close(o.fd));
        case Code::kStatx:
            return fromSys(::statx(o.fd, static_cast<const char*>(o.addr), static_cast<int>(o.opFlags), o.len,
                                   static_cast<struct statx*>(o.addr2)));
        case Code::kFallocate:
            return fromSys(::fallocate(o.fd, static_cast<int>(o.opFlags), static_cast<off_t>(o.off),
                                       static_cast<off_t>(o.off2)));
        case Code::kUnlinkat:
            return fromSys(::unlinkat(o.fd, static_cast<const char*>(o.addr), static_cast<int>(o.opFlags)));
        case Code::kRenameat:
            return fromSys(::syscall(SYS_renameat2, o.fd, static_cast<const char*>(o.addr), o.fd2,
                                     static_cast<const char*>(o.addr2), o.opFlags));
        case Code::kMkdirat:
            return fromSys(::mkdirat(o.fd, static_cast<const char*>(o.addr), static_cast<mode_t>(o.len)));
        case Code::kPoll: {
            if (o.fd < 0) { return -EBADF; }  // poll(2) would skip it and wait forever
            pollfd p{o.fd, static_cast<short>(o.len), 0};
            const int r = ::poll(&p, 1, nonblock ? 0 : -1);
            if (r < 0) { return -errno; }
            if (r == 0) { return -EAGAIN; }
            if ((p.revents & POLLNVAL) != 0) { return -EBADF; }
            return static_cast<uint16_t>(p.revents);
        }
        case Code::kSplice: {
            if (nonblock) { SPINDLE_INJECT(inject::Point::kSpliceAgain, { return -EAGAIN; }); }
            auto offIn = static_cast<loff_t>(o.off);
            auto offOut = static_cast<loff_t>(o.off2);
            const unsigned flags = o.opFlags | (nonblock ? SPLICE_F_NONBLOCK : 0u);
            return withoutSigpipe(o.len, [&] {
                return ::splice(o.fd, static_cast<int64_t>(o.off) == -1 ? nullptr : &offIn, o.fd2,
                                static_cast<int64_t>(o.off2) == -1 ? nullptr : &offOut, o.len, flags);
            });
        }
        case Code::kTee: {
            if (nonblock) { SPINDLE_INJECT(inject::Point::kSpliceAgain, { return -EAGAIN; }); }
            const unsigned flags = o.opFlags | (nonblock ? SPLICE_F_NONBLOCK : 0u);
            return withoutSigpipe(o.len, [&] { return ::tee(o.fd, o.fd2, o.len, flags); });
        }
        case Code::kAccept:
        case Code::kAcceptMultishot: {
            const int r = ::accept4(o.fd, static_cast<sockaddr*>(o.addr), static_cast<socklen_t*>(o.addr2),
                                    static_cast<int>(o.opFlags));
            if (r < 0) { return -errno; }
            bumpCloseGeneration(r);  // a new file behind this number: what carriers knew of it is stale
            return r;
        }
        case Code::kConnect: {
            if (::connect(o.fd, static_cast<const sockaddr*>(o.addr), o.len) == 0) { return 0; }
            const int e = errno;
            return e == EINPROGRESS ? -EAGAIN : -e;
        }
        case Code::kRecv:
            return fromSys(rawRecv(o.fd, o.addr, o.len, static_cast<int>(o.opFlags) | dontwait));
        case Code::kSend:
            return fromSys(rawSend(o.fd, o.addr, o.len, static_cast<int>(o.opFlags) | dontwait));
        case Code::kRecvmsg:
            return fromSys(::recvmsg(o.fd, static_cast<msghdr*>(o.addr), static_cast<int>(o.opFlags) | dontwait));
        case Code::kSendmsg:
            return fromSys(::sendmsg(o.fd, static_cast<const msghdr*>(o.addr), static_cast<int>(o.opFlags) | dontwait));
        case Code::kShutdown:
            return fromSys(::shutdown(o.fd, static_cast<int>(o.opFlags)));
        case Code::kRecvMultishot:
            return -EINVAL;
    }
    return -EINVAL;
}

// A connect that answered EINPROGRESS and then became writable (or failed): its outcome.
int32_t connectOutcome(int fd) noexcept {
    int err = 0;
    socklen_t len = sizeof(err);
    if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) { return -errno; }
    return -err;
}


}  // namespace

void bumpCloseGeneration(int fd) noexcept {
    CloseGenerations& g = closeGenerations();
    if (fd >= 0 && static_cast<size_t>(fd) < g.size) { g.gen[fd].fetch_add(1, std::memory_order_relaxed); }
}

EpollDriver::~EpollDriver() { close(); }

Result<void> EpollDriver::init(Carrier* owner) noexcept {
    owner_ = owner;
    // The table outlives every driver; reading it through these saves a guarded static per operation.
    gens_ = closeGenerations().gen.get();
    gensSize_ = closeGenerations().size;
    epfd_ = ::epoll_create1(EPOLL_CLOEXEC);
    if (epfd_ < 0) {
        const int err = errno;
        log::error("carrier {}: epoll_create1 failed: {}", owner->index(), std::strerror(err));
        return Error{err};
    }
    wakeFd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (wakeFd_ < 0) {
        const int err = errno;
        log::error("carrier {}: eventfd failed: {}", owner->index(), std::strerror(err));
        return Error{err};
    }
    epoll_event ev{};
    ev.events = EPOLLIN;  // level-triggered: reap() reads it back to zero
    ev.data.u64 = kWakeTag;
    if (::epoll_ctl(epfd_, EPOLL_CTL_ADD, wakeFd_, &ev) != 0) {
        const int err = errno;
        log::error("carrier {}: epoll_ctl(eventfd) failed: {}", owner->index(), std::strerror(err));
        return Error{err};
    }
    try {
        fds_.resize(1024);
    } catch (...) {
        return Error{ENOMEM};
    }
    return {};
}

void EpollDriver::close() noexcept {
    if (epfd_ >= 0) {
        ::close(epfd_);
        epfd_ = -1;
    }
    if (wakeFd_ >= 0) {
        ::close(wakeFd_);
        wakeFd_ = -1;
    }
}

EpollDriver::FdState* EpollDriver::stateFor(int fd) noexcept {
    if (fd < 0) { return nullptr; }
    const auto i = static_cast<size_t>(fd);
    if (i >= fds_.size()) {
        if (i >= gensSize_) { return nullptr; }  // above RLIMIT_NOFILE's hard limit: EBADF
        try {
            fds_.resize(std::max(i + 1, fds_.size() * 2));
        } catch (...) {
            return nullptr;
        }
    }
    FdState& st = fds_[i];
    // Past the table, a generation that never matches: the state is re-made (and re-registered:
    // EEXIST then says it already was) on each use.
    const uint32_t gen = i < gensSize_ ? gens_[i].load(std::memory_order_relaxed) : UINT32_MAX;
    if (!st.known || st.gen != gen) {
        // A new file behind this number (or one we never saw): forget what we knew, keep the waiters.
        st.known = true;
        st.gen = gen;
        st.registered = false;
        st.regular = false;
        st.stream = false;
        st.readReady = true;
        st.readEnded = false;
        st.writeReady = true;
        st.provenEpoch = 0;
    }
    return &st;
}

int32_t EpollDriver::registerFd(int fd, FdState& st, bool drained) noexcept {
    epoll_event ev{};
    ev.events = kInterest;
    ev.data.u64 = static_cast<uint64_t>(fd);
    // Re-armed on every wait: a MOD that succeeds proves the registration is this file's (a number
    // closed with close(2) and reused is not in the set any more: ENOENT), and reports the file's
    // readiness at once if it is ready, so no drained-looking descriptor waits for an edge that came.
    if (st.registered) {
        // Skipped only for the fiber whose request an event of this epoch completed, re-waiting before
        // the carrier looks for events again: nothing but that fiber ran on this number since the proof.
        // A number closed with close(2) and reused by another fiber, a plain thread, or in an earlier
        // epoch is caught by the MOD. (The one case left is that same fiber closing the number with
        // close(2) and waiting on a new file that got it, all before the next poll; spindle::close and
        // net::Socket bump the number's close generation, which forgets the state at once.)
        if (drained && st.provenEpoch == epoch_ && st.provenFor != 0 && st.provenFor == runningFiberId()) {
            return 0;
        }
        if (::epoll_ctl(epfd_, EPOLL_CTL_MOD, fd, &ev) == 0) { return 0; }
        if (errno != ENOENT) { return -errno; }
        // Not in the set: the file we knew was closed (with close(2)); forget what we knew of it.
        st.registered = false;
        st.plainRw = false;
        st.regular = false;
    }
    if (::epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
        const int err = errno;
        if (err != EEXIST) {
            if (err == EPERM) { st.regular = true; }
            return -err;
        }
        if (::epoll_ctl(epfd_, EPOLL_CTL_MOD, fd, &ev) != 0) { return -errno; }
    }
    st.registered = true;
    int type = 0;
    socklen_t len = sizeof(type);
    st.stream = ::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0 && type == SOCK_STREAM;
    return 0;
}

uint64_t EpollDriver::runningFiberId() const noexcept {
    const Fiber* f = owner_->running();
    return f != nullptr ? f->id() : 0;
}

int32_t EpollDriver::start(op::IoRequest* req) noexcept {
    ownerAdd(started_);
    const int32_t r = startOp(req);
    if (r != kPending) { ownerAdd(completed_); }
    return r;
}

int32_t EpollDriver::startOp(op::IoRequest* req) noexcept {
    const op::Op& o = *req->op;
    req->driverState = 0;
    if ((o.flags & (op::kFixedFile | op::kFixedBuffer)) != 0) {
        // Registered files and buffers belong to io_uring; the callers' fallbacks never send these here.
        return -EINVAL;
    }
    // A buffer group serves receives only, and a multishot receive needs one.
    const bool select = (o.flags & op::kBufferSelect) != 0;
    if (o.code == op::Code::kRecvMultishot ? !select : select && o.code != op::Code::kRecv) { return -EINVAL; }
    if (o.code == op::Code::kClose) {
        if (FdState* st = o.fd >= 0 && static_cast<size_t>(o.fd) < fds_.size() ? &fds_[o.fd] : nullptr;
            st != nullptr && st->registered) {
            (void)::epoll_ctl(epfd_, EPOLL_CTL_DEL, o.fd, nullptr);
            st->known = false;
        }
        bumpCloseGeneration(o.fd);
        return attempt(o, false);
    }
    if (o.code == op::Code::kNop || o.code == op::Code::kShutdown) { return attempt(o, false); }
    if (isPathOp(o.code)) { return kBlocking; }
    if (isSpliceOp(o.code)) {
        // Between pipes and sockets it waits for readiness like a receive (splice_ends.h); with a
        // regular file or a device at one end, the blocking call runs on the offload pool.
        if (const int32_t r = prepareSpliceEnds(o); r != 0) { return r == kSpliceOtherEnd ? kBlocking : r; }
        const int32_t r = attempt(o, true);
        // The caller's own SPLICE_F_NONBLOCK: EAGAIN, as io_uring and splice(2) answer.
        return r == -EAGAIN && (o.opFlags & SPLICE_F_NONBLOCK) == 0 ? parkSplice(req) : r;
    }

    FdState* st = stateFor(o.fd);
    if (st == nullptr) { return o.fd < 0 || static_cast<size_t>(o.fd) >= gensSize_ ? -EBADF : -ENOMEM; }
    const bool writes = o.writes();
    if (o.code == op::Code::kAccept || o.code == op::Code::kAcceptMultishot || o.code == op::Code::kConnect) {
        // Checked each time (one fcntl): a blocking listener reached here would block the carrier.
        if (const int32_t r = setNonblocking(o.fd); r < 0) { return r; }
    }
    if (st->regular && isRwOp(o.code)) {
        const int32_t r = attempt(o, true);  // the page cache may answer at once
        if (r != -EAGAIN && r != -EOPNOTSUPP) { return r; }
        struct stat sb {};
        if (::fstat(o.fd, &sb) == 0 && (S_ISREG(sb.st_mode) || S_ISBLK(sb.st_mode) || S_ISDIR(sb.st_mode))) {
            return kBlocking;
        }
        st->regular = false;  // the number was closed and reused for something pollable
    }
    if (o.code == op::Code::kAcceptMultishot || o.code == op::Code::kRecvMultishot) {
        if (select && group(o.bufIndex) == nullptr) { return -ENOBUFS; }  // io_uring's answer for an unknown group
        // Every result comes through the completion, from the loop: park; arming the registration
        // reports a descriptor that is ready already (connections or bytes waiting) at the next poll.
        return park(req, *st, /*drained=*/false);
    }
    // Known not ready since the last EAGAIN, with no event since: wait without asking again.
    const bool known = st->registered && (writes ? !st->writeReady : !st->readReady) &&
                       o.code != op::Code::kPoll && o.code != op::Code::kConnect;
    if (!known) {
        int32_t r = select ? recvSelected(o, *st, &req->inlineFlags) : tryOnce(o, *st);
        if (r == -EOPNOTSUPP && isRwOp(o.code)) {
            // No RWF_NOWAIT for this file (a timerfd, a tty): pollable ones get O_NONBLOCK and plain
            // reads; the others are run on the pool.
            if (registerFd(o.fd, *st) < 0 || setNonblocking(o.fd) < 0) { return kBlocking; }
            st->plainRw = true;
            r = attempt(o, false);
        }
        if (r != -EAGAIN) {
            if (!select && (o.code == op::Code::kRecv || o.code == op::Code::kRead)) { noteRead(*st, r, o.len); }
            return r;
        }
    }
    if (writes) {
        st->writeReady = false;
    } else {
        st->readReady = false;
    }
    return park(req, *st, /*drained=*/true);
}

int32_t EpollDriver::tryOnce(const op::Op& o, FdState& st) noexcept {
    if (!st.plainRw || !isRwOp(o.code)) {
        const int32_t r = attempt(o, true);
        // A registered (so pollable) file without RWF_NOWAIT: a pipe under qemu-user, a timerfd, a tty.
        if (r != -EOPNOTSUPP || !isRwOp(o.code) || !st.registered) { return r; }
        st.plainRw = true;
    }
    // No RWF_NOWAIT for this file: the plain call on a descriptor made O_NONBLOCK, checked each time,
    // since the number may have been closed with close(2) and reused for a blocking file.
    if (const int32_t r = setNonblocking(o.fd); r < 0) { return r; }
    return attempt(o, false);
}

BufferGroup* EpollDriver::group(uint16_t id) const noexcept {
    for (const auto& [gid, g] : groups_) {
        if (gid == id) { return g; }
    }
    return nullptr;
}

Result<void> EpollDriver::registerBufferGroup(uint16_t id, BufferGroup* g) noexcept {
    SPINDLE_INJECT(inject::Point::kRegisterBufRing, { return Error{injectedErrno}; });
    if (group(id) != nullptr) { return Error{EEXIST}; }
    try {
        groups_.emplace_back(id, g);
    } catch (...) {
        return Error{ENOMEM};
    }
    return {};
}

Result<void> EpollDriver::unregisterBufferGroup(uint16_t id) noexcept {
    for (auto it = groups_.begin(); it != groups_.end(); ++it) {
        if (it->first == id) {
            groups_.erase(it);
            return {};
        }
    }
    return Error{ENOENT};
}

int32_t EpollDriver::recvSelected(const op::Op& o, FdState& st, uint32_t* flags) noexcept {
    BufferGroup* g = group(o.bufIndex);
    const int bid = g != nullptr ? g->take() : -1;
    if (bid < 0) { return -ENOBUFS; }
    const size_t room = o.len != 0 && o.len < g->size() ? o.len : g->size();
    const int32_t r =
        fromSys(rawRecv(o.fd, g->data(static_cast<uint16_t>(bid)), room, static_cast<int>(o.opFlags) | MSG_DONTWAIT));
    if (r <= 0) {
        g->giveBack(static_cast<uint16_t>(bid));  // nothing received: end of stream holds no buffer either
        return r;
    }
    noteRead(st, r, room);
    *flags = op::kBufferPicked | (static_cast<uint32_t>(bid) << op::kBufferShift);
    return r;
}

bool EpollDriver::deliverOne(op::IoRequest* req, int32_t res, uint32_t flags) noexcept {
    delivering_ = req;
    deliveringEnded_ = false;
    finish(req, res, flags | op::kMore);
    delivering_ = nullptr;
    return !std::exchange(deliveringEnded_, false);
}

void EpollDriver::deliverRecvs(op::IoRequest* req, FdState& st) noexcept {
    const int fd = req->op->fd;
    for (FdState* s = &st;;) {
        uint32_t flags = 0;
        const int32_t r = recvSelected(*req->op, *s, &flags);
        if (r == -EAGAIN) {
            s->readReady = false;
            break;
        }
        if (r <= 0) {
            // End of stream, an error, or no free buffer (ENOBUFS): the operation ends, as on io_uring.
            unlink(req);
            finish(req, r, 0);
            break;
        }
        const bool drained = !s->readReady;
        // The handler may end the operation, or start one on another descriptor (fds_ may move).
        if (!deliverOne(req, r, flags) || drained) { break; }
        s = &fds_[static_cast<size_t>(fd)];
    }
}

int32_t EpollDriver::parkSplice(op::IoRequest* req, uint32_t backoff) noexcept {
    const op::Op& o = *req->op;
    for (int tries = 0;; ++tries) {
        int32_t end = spliceBlockedEnd(o);
        if (end == kSpliceOutput) { end = static_cast<int32_t>(kOnOutput); }
        if (end == -EAGAIN) {
            // Both ends look ready: a reader or writer raced the call. A few more tries (not after a
            // wait: an EAGAIN that outlasted one is no race); an EAGAIN that lasts is waited out on a
            // timer (parking on an end that is ready would retry it at once).
            if (tries < 3 && backoff == 0) {
                if (const int32_t r = attempt(o, true); r != -EAGAIN) { return r; }
                continue;
            }
            return parkRetry(req, backoff);
        }
        if (end < 0) { return end; }
        FdState* st = stateFor(parkedFd(o, static_cast<uint32_t>(end)));
        if (st == nullptr) { return -ENOMEM; }  // fstat accepted the number: below the table's limit
        return park(req, *st, /*drained=*/false, static_cast<uint32_t>(end));
    }
}

void EpollDriver::retrySplice(op::IoRequest* req, uint32_t backoff) noexcept {
    int32_t r = attempt(*req->op, true);
    if (r == -EAGAIN) { r = parkSplice(req, backoff); }
    if (r != kPending) { finish(req, r, 0); }
}

int32_t EpollDriver::parkRetry(op::IoRequest* req, uint32_t backoff) noexcept {
    backoff = std::min(backoff, kMaxBackoff);
    uint64_t at = nowNs() + (kRetryBaseNs << backoff);
    if (req->deadlineNs != 0) { at = std::min(at, req->deadlineNs); }
    req->epoll.next = nullptr;
    req->epoll.retryAtNs = at;
    req->epoll.parker = runningFiberId();
    req->driverState = kParked | kRetrying | (backoff << kBackoffShift);
    ++waiting_;
    req->epoll.heapIndex = 0;
    heapPush(req);
    return kPending;
}

int32_t EpollDriver::park(op::IoRequest* req, FdState& st, bool drained, uint32_t onOutput) noexcept {
    const op::Op& o = *req->op;
    if (const int32_t r = registerFd(parkedFd(o, onOutput), st, drained); r < 0) {
        if (r == -EPERM && isRwOp(o.code)) { return kBlocking; }  // a regular file: the pool reads it
        return r;
    }
    req->epoll.next = nullptr;
    req->epoll.prev = st.tail;
    if (st.tail != nullptr) {
        st.tail->epoll.next = req;
    } else {
        st.head = req;
    }
    st.tail = req;
    req->epoll.parker = runningFiberId();
    // Connecting: the retry reads SO_ERROR instead of calling connect again.
    req->driverState = (o.code == op::Code::kConnect ? kParked | kConnecting : kParked) | onOutput;
    ++waiting_;
    req->epoll.heapIndex = 0;
    if (req->deadlineNs != 0) { heapPush(req); }
    return kPending;
}

void EpollDriver::unlink(op::IoRequest* req) noexcept {
    if ((req->driverState & kRetrying) != 0) {  // on the heap alone
        req->driverState = 0;
        --waiting_;
        heapRemove(req);
        return;
    }
    FdState& st = fds_[static_cast<size_t>(parkedFd(*req->op, req->driverState))];
    if (req->epoll.prev != nullptr) {
        req->epoll.prev->epoll.next = req->epoll.next;
    } else {
        st.head = req->epoll.next;
    }
    if (req->epoll.next != nullptr) {
        req->epoll.next->epoll.prev = req->epoll.prev;
    } else {
        st.tail = req->epoll.prev;
    }
    req->epoll.next = req->epoll.prev = nullptr;
    req->driverState = 0;
    --waiting_;
    if (req == delivering_) { deliveringEnded_ = true; }
    if (req->epoll.heapIndex != 0) { heapRemove(req); }
}

void EpollDriver::finish(op::IoRequest* req, int32_t res, uint32_t flags) noexcept {
    ownerAdd(completed_);
    req->complete(req, res, flags);
}

void EpollDriver::cancel(op::IoRequest* req) noexcept {
    if ((req->driverState & kParked) == 0) { return; }  // completed, or never parked here
    unlink(req);
    finish(req, -ECANCELED, 0);
}

void EpollDriver::cancelAll() noexcept {
    for (FdState& st : fds_) {
        while (op::IoRequest* req = st.head) {
            unlink(req);
            finish(req, -ECANCELED, 0);
        }
    }
    while (!deadlines_.empty()) {  // what is left waits out a splice's EAGAIN (parkRetry)
        op::IoRequest* req = deadlines_.front();
        unlink(req);
        finish(req, -ECANCELED, 0);
    }
}

void EpollDriver::retryWaiters(int fd, uint32_t events) noexcept {
    if (fd < 0 || static_cast<size_t>(fd) >= fds_.size()) { return; }
    const auto slot = static_cast<size_t>(fd);
    FdState* st = &fds_[slot];
    if (!st->registered) { return; }  // forgotten since (closed through spindle): the event is stale
    st->provenEpoch = epoch_;
    st->provenFor = 0;
    if ((events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) != 0) { st->readReady = true; }
    if ((events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) != 0) { st->readEnded = true; }
    if ((events & (EPOLLOUT | EPOLLHUP | EPOLLERR)) != 0) { st->writeReady = true; }
    // Requests parked after this pass began wait for the next event; each is tried once here. A
    // completion handler may start an operation on another descriptor, which can move fds_: `st` is
    // looked up again after each completion.
    op::IoRequest* last = st->tail;
    op::IoRequest* req = st->head;
    while (req != nullptr) {
        op::IoRequest* next = req == last ? nullptr : req->epoll.next;
        if ((wantedEvents(*req) & events) == 0) {
            req = next;
            continue;
        }
        const op::Op& o = *req->op;
        if (isSpliceOp(o.code)) {
            unlink(req);
            retrySplice(req, 0);
            st = &fds_[slot];
            req = next;
            continue;
        }
        if (o.code == op::Code::kRecvMultishot) {
            deliverRecvs(req, *st);
            st = &fds_[slot];
            req = next;
            continue;
        }
        const bool select = (o.flags & op::kBufferSelect) != 0;
        uint32_t flags = 0;
        int32_t r = (req->driverState & kConnecting) != 0 ? connectOutcome(o.fd)
                    : select                              ? recvSelected(o, *st, &flags)
                                                          : tryOnce(o, *st);
        if (o.code == op::Code::kAcceptMultishot && r >= 0) {
            bool armed = true;
            while (r >= 0) {
                armed = deliverOne(req, r, 0);
                if (!armed) { break; }  // its handler cancelled it
                r = attempt(o, true);
            }
            st = &fds_[slot];
            if (!armed) {
                req = next;
                continue;
            }
        }
        if (r == -EAGAIN) {
            if (o.writes()) { st->writeReady = false; } else { st->readReady = false; }
        } else {
            unlink(req);
            if (!select && (o.code == op::Code::kRecv || o.code == op::Code::kRead)) { noteRead(*st, r, o.len); }
            st->provenFor = req->epoll.parker;
            finish(req, r, flags);
            st = &fds_[slot];
        }
        req = next;
    }
}

void EpollDriver::prefetchAhead(int i, int count) const noexcept {
    // The state of the descriptor of event k, or null (the wake-up eventfd, or past the table).
    auto stateOf = [&](int k) -> const FdState* {
        const uint64_t d = events_[k].data.u64;
        return d < fds_.size() ? &fds_[static_cast<size_t>(d)] : nullptr;
    };
    if (i + 3 < count) {
        if (const FdState* s = stateOf(i + 3)) { __builtin_prefetch(s); }
    }
    if (i + 2 < count) {
        if (const FdState* s = stateOf(i + 2); s != nullptr && s->head != nullptr) { __builtin_prefetch(s->head); }
    }
    if (i + 1 < count) {
        if (const FdState* s = stateOf(i + 1); s != nullptr && s->head != nullptr) { __builtin_prefetch(s->head->op); }
    }
}

void EpollDriver::handleEvents(int count) noexcept {
    for (int i = 0; i < count; ++i) {
        // Each event's descriptor state, its first waiting request (on the waiting fiber's stack) and
        // the op that request points at are three dependent loads, each a cache miss when many
        // connections take turns: fetched ahead, one stage per event. Only what is linked now is
        // read, so a request that an earlier event's handler completes is never followed.
        prefetchAhead(i, count);
        const epoll_event ev = events_[i];
        if (ev.data.u64 == kWakeTag) {
            uint64_t v;
            while (::read(wakeFd_, &v, sizeof(v)) > 0) {}
            continue;
        }
        retryWaiters(static_cast<int>(ev.data.u64), ev.events);
    }
}

void EpollDriver::expireDeadlines() noexcept {
    if (deadlines_.empty()) { return; }
    const uint64_t now = nowNs();
    while (!deadlines_.empty() && wakeAt(deadlines_.front()) <= now) {
        op::IoRequest* req = deadlines_.front();
        const uint32_t state = req->driverState;
        unlink(req);  // takes it out of the heap too
        if ((state & kRetrying) != 0 && (req->deadlineNs == 0 || req->deadlineNs > now)) {
            // A splice's wait out of a lasting EAGAIN is over (a wait after this one, if any, is twice
            // as long; its time is later than `now`, so this loop ends).
            retrySplice(req, (state >> kBackoffShift) + 1);
            continue;
        }
        finish(req, -ECANCELED, 0);
    }
}

void EpollDriver::poll(bool) noexcept {
    ++epoch_;  // the fibers that the last batch woke have run: its proofs end here
    if (waiting_ != 0) {
        ownerAdd(enters_);
        const int n = ::epoll_wait(epfd_, events_, kMaxEvents, 0);
        if (n > 0) { handleEvents(n); }
    }
    expireDeadlines();
}

void EpollDriver::wait(int64_t timeoutNs) noexcept {
    int ms = -1;
    if (timeoutNs > 0) {
        // Rounded up, so a deadline is never woken for early and spun on.
        const int64_t m = (timeoutNs + 999'999) / 1'000'000;
        ms = m > INT32_MAX ? INT32_MAX : static_cast<int>(m);
    }
    ++epoch_;
    ownerAdd(enters_);
    const int n = ::epoll_wait(epfd_, events_, kMaxEvents, ms);
    if (n < 0 && errno != EINTR) {
        log::warn("carrier {}: epoll_wait failed: {}", owner_->index(), std::strerror(errno));
    }
    pendingEvents_ = n > 0 ? n : 0;
}

void EpollDriver::reap() noexcept {
    const int n = std::exchange(pendingEvents_, 0);
    if (n > 0) { handleEvents(n); }
    expireDeadlines();
}

void EpollDriver::wakeFrom(Carrier*) noexcept {
    const uint64_t one = 1;
    ssize_t w;
    do {
        w = ::write(wakeFd_, &one, sizeof(one));
    } while (w < 0 && errno == EINTR);
    // EAGAIN: the counter is saturated, so a wake-up is pending anyway.
    SPINDLE_CHECK_MSG(w == sizeof(one) || errno == EAGAIN, "eventfd write to wake a carrier failed");
}

void EpollDriver::drainForExit() noexcept {
    // Shutdown cancelled every waiter; a request parked since (a multishot re-armed by a handler)
    // is cancelled here.
    if (waiting_ != 0) { cancelAll(); }
}

std::string EpollDriver::describe() const { return "epoll (edge-triggered; files on the offload pool)"; }

Driver::Counters EpollDriver::counters() const noexcept {
    Counters c;
    c.enters = enters_.load(std::memory_order_relaxed);
    c.submitted = started_.load(std::memory_order_relaxed);
    c.completed = completed_.load(std::memory_order_relaxed);
    return c;
}

// ---- the deadline heap ---------------------------------------------------------------------------

// Its key: the deadline, or for a splice waiting out a lasting EAGAIN its next try (never later).
uint64_t EpollDriver::wakeAt(const op::IoRequest* req) noexcept {
    return (req->driverState & kRetrying) != 0 ? req->epoll.retryAtNs : req->deadlineNs;
}

uint64_t EpollDriver::nextDeadline() const noexcept { return deadlines_.empty() ? UINT64_MAX : wakeAt(deadlines_.front()); }

void EpollDriver::heapPush(op::IoRequest* req) noexcept {
    try {
        deadlines_.push_back(req);
    } catch (...) {
        SPINDLE_CHECK_MSG(false, "out of memory for an I/O deadline");
    }
    req->epoll.heapIndex = deadlines_.size();
    heapSiftUp(deadlines_.size() - 1);
}

void EpollDriver::heapRemove(op::IoRequest* req) noexcept {
    const size_t i = req->epoll.heapIndex - 1;
    req->epoll.heapIndex = 0;
    op::IoRequest* last = deadlines_.back();
    deadlines_.pop_back();
    if (i == deadlines_.size()) { return; }
    deadlines_[i] = last;
    last->epoll.heapIndex = i + 1;
    heapSiftUp(i);
    heapSiftDown(last->epoll.heapIndex - 1);
}

void EpollDriver::heapSiftUp(size_t i) noexcept {
    while (i > 0) {
        const size_t parent = (i - 1) / 2;
        if (wakeAt(deadlines_[parent]) <= wakeAt(deadlines_[i])) { break; }
        std::swap(deadlines_[parent], deadlines_[i]);
        deadlines_[parent]->epoll.heapIndex = parent + 1;
        deadlines_[i]->epoll.heapIndex = i + 1;
        i = parent;
    }
}

void EpollDriver::heapSiftDown(size_t i) noexcept {
    const size_t n = deadlines_.size();
    for (;;) {
        size_t m = i;
        const size_t l = 2 * i + 1;
        const size_t r = l + 1;
        if (l < n && wakeAt(deadlines_[l]) < wakeAt(deadlines_[m])) { m = l; }
        if (r < n && wakeAt(deadlines_[r]) < wakeAt(deadlines_[m])) { m = r; }
        if (m == i) { return; }
        std::swap(deadlines_[m], deadlines_[i]);
        deadlines_[m]->epoll.heapIndex = m + 1;
        deadlines_[i]->epoll.heapIndex = i + 1;
        i = m;
    }
}

// ---- off the carrier -----------------------------------------------------------------------------

int32_t EpollDriver::runBlocking(const op::Op& o) noexcept { return attempt(o, false); }

int32_t EpollDriver::performBlocking(const op::Op& o, Deadline deadline) noexcept {
    if ((o.flags & (op::kFixedFile | op::kBufferSelect | op::kFixedBuffer)) != 0 ||
        o.code == op::Code::kRecvMultishot || o.code == op::Code::kAcceptMultishot) {
        return -EINVAL;
    }
    if (o.code == op::Code::kClose) { bumpCloseGeneration(o.fd); }
    bool pollable = !isPathOp(o.code) && o.code != op::Code::kNop && o.code != op::Code::kClose &&
                    o.code != op::Code::kShutdown;
    if (pollable && isRwOp(o.code)) {
        // Regular files and block devices are always "ready": a plain blocking call, no deadline.
        struct stat sb {};
        if (::fstat(o.fd, &sb) != 0) { return -errno; }
        pollable = !S_ISREG(sb.st_mode) && !S_ISBLK(sb.st_mode) && !S_ISDIR(sb.st_mode);
    } else if (isSpliceOp(o.code)) {
        const int32_t r = prepareSpliceEnds(o);
        if (r < 0 && r != kBlocking) { return r; }
        pollable = r == 0;
    }
    if (!pollable || (!deadline.isSet() && o.code != op::Code::kConnect && o.code != op::Code::kAccept)) {
        const int32_t r = attempt(o, false);
        if (r != -EAGAIN || !pollable) { return r; }  // a non-blocking descriptor: wait below
    }
    bool connecting = false;
    bool polled = false;  // plain: poll(2) said ready, so the blocking call returns at once
    bool plain = false;   // no RWF_NOWAIT here (EOPNOTSUPP, as qemu-user answers): poll, then the plain call
    int raced = 0;        // a splice's EAGAINs in a row with both ends ready
    for (;;) {
        int32_t r = connecting ? connectOutcome(o.fd) : attempt(o, !(plain && polled));
        if (r == -EOPNOTSUPP && isRwOp(o.code) && !plain) {
            plain = true;
            r = -EAGAIN;
        }
        if (o.code == op::Code::kConnect && r == -EAGAIN && !connecting) {
            connecting = true;
        } else if (r != -EAGAIN) {
            return r;
        }
        int ms = -1;
        if (deadline.isSet()) {
            const uint64_t now = nowNs();
            if (deadline.ns() <= now) { return -ETIMEDOUT; }
            const uint64_t left = (deadline.ns() - now + 999'999) / 1'000'000;
            ms = left > INT32_MAX ? INT32_MAX : static_cast<int>(left);
        }
        pollfd p{o.fd, static_cast<short>(o.writes() ? POLLOUT : POLLIN), 0};
        if (o.code == op::Code::kPoll) { p.events = static_cast<short>(o.len); }
        if (isSpliceOp(o.code)) {
            const int32_t end = spliceBlockedEnd(o);
            if (end == -EAGAIN) {
                // Both ends ready, yet EAGAIN: a race with a reader or writer; again, pausing after a few.
                if (++raced > 3) { (void)::poll(nullptr, 0, 1); }
                continue;
            }
            if (end < 0) { return end; }
            raced = 0;
            if (end != 0) { p = pollfd{o.fd2, POLLOUT, 0}; }
        }
        const int n = ::poll(&p, 1, ms);
        if (n < 0 && errno != EINTR) { return -errno; }
        if (n == 0 && deadline.isSet() && deadline.expired()) { return -ETIMEDOUT; }
        polled = n > 0;
    }
}

}  // namespace spindle::detail
