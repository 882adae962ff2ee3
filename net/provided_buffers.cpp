// SPDX-License-Identifier: Apache-2.0
#include "net/provided_buffers.h"

#include <liburing.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <type_traits>
#include <vector>

#include "base/check.h"
#include "base/counter.h"
#include "base/inject.h"
#include "base/log.h"
#include "core/driver/buffer_group.h"
#include "core/fiber.h"
#include "core/internal/carrier.h"
#include "core/internal/owner_returns.h"
#include "core/ring_ops.h"
#include "core/runtime.h"
#include "net/internal/ops.h"
#include "uring/ring.h"

namespace spindle::net {
namespace detail {

/// One carrier's registered buffers of a pool: `count` buffers of `size` bytes behind an
/// io_uring_buf_ring (the kernel takes buffers from the head; we add them back at the tail), or, on
/// the epoll backend, behind a BufferGroup registered with the carrier's driver (`group`).
/// With incremental consumption (`incremental`) a buffer serves several CQEs, each a slice after the
/// one before; the owner counts, per buffer, the bytes the kernel put there and the slices still leased,
/// and puts the buffer back once the kernel let go of it (a CQE without IORING_CQE_F_BUF_MORE) and no
/// slice is leased.
/// Thread-safety: only the owner carrier's thread writes the tail and `slices` (share-nothing: no lock on
/// the data path); a buffer given back on another thread goes through `returns`, which the owner drains
/// in its loop. The kernel never writes the tail.
struct PbufRing {
    std::unique_ptr<spindle::detail::BufferGroup> group;  // the epoll backend's, or null
    io_uring_buf_ring* ring = nullptr;
    size_t ringBytes = 0;
    char* buffers = nullptr;
    size_t bufferBytes = 0;
    size_t size = 0;
    unsigned count = 0;
    uint16_t bgid = 0;
    unsigned carrier = 0;
    bool incremental = false;  // registered with IOU_PBUF_RING_INC
    // Buffers that multishot receives' CQEs delivered, counted as the owner's thread reaps them: a
    // count of the ring's own, so that no receive on any carrier bumps a line the others share.
    std::atomic<uint64_t> multishotDelivered{0};
    // Per buffer id, with `incremental` (owner's thread only).
    struct Slices {
        uint32_t filled = 0;   // bytes the kernel put in the buffer: the next CQE's slice starts here
        uint32_t leases = 0;   // slices given out and not yet given back
        bool retired = false;  // the kernel is done with the buffer (a CQE without IORING_CQE_F_BUF_MORE)
    };
    std::unique_ptr<Slices[]> slices;
    // With `incremental`: per buffer id, slices given back off the owner's thread and not yet dropped.
    // `returns` holds an id at most once (a second push before the drain is a bug it aborts on), so
    // only the release that finds this 0 pushes the id; the drain takes the count with it.
    std::unique_ptr<std::atomic<uint32_t>[]> remoteDrops;
    spindle::detail::OwnerReturns returns;  // io_uring: buffers given back off the owner's thread

    [[nodiscard]] char* base(uint16_t bid) const noexcept { return buffers + static_cast<size_t>(bid) * size; }

    // Owner's thread, for each CQE that picked buffer `bid`, in CQE order (as the carrier reaps them):
    // where in the buffer the CQE's `res` bytes start. A CQE with bytes (res > 0) leases them to the
    // caller, who gives them back with giveBack(bid); one without bytes leases nothing.
    [[nodiscard]] uint32_t take(uint16_t bid, int32_t res, uint32_t flags) noexcept {
        if (!incremental) {
            if (res <= 0) { giveBack(bid); }
            return 0;
        }
        Slices& s = slices[bid];
        const uint32_t at = s.filled;
        if (res > 0) {
            s.filled += static_cast<uint32_t>(res);
            ++s.leases;
        }
        // Also for a CQE without bytes: a kernel that consumed the buffer for it (for an error; for a
        // zero-length receive, kernels before a 2025 fix) says so by leaving the flag out.
        if ((flags & uring::Ring::kCqeBufMore) == 0) { s.retired = true; }
        if (s.retired && s.leases == 0) { recycleHere(bid); }
        return at;
    }
    // Gives back one lease on buffer `bid` (any thread).
    void giveBack(uint16_t bid) noexcept {
        if (group) {
            group->giveBack(bid);
        } else if (returns.onOwner()) {
            dropHere(bid);
        } else if (!incremental || remoteDrops[bid].fetch_add(1, std::memory_order_acq_rel) == 0) {
            returns.push(bid);
        }
    }
    void dropHere(uint16_t bid) noexcept {
        if (!incremental) {
            addHere(bid);
            return;
        }
        Slices& s = slices[bid];
        SPINDLE_CHECK_MSG(s.leases > 0, "provided buffer given back more often than leased");
        if (--s.leases == 0 && s.retired) { recycleHere(bid); }
    }
    void recycleHere(uint16_t bid) noexcept {
        slices[bid] = Slices{};
        addHere(bid);
    }
    // Owner's thread: the buffer goes back at the ring's tail, where the kernel picks it up (whole).
    void addHere(uint16_t bid) noexcept {
        io_uring_buf_ring_add(ring, base(bid), static_cast<unsigned>(size), bid, io_uring_buf_ring_mask(count), 0);
        io_uring_buf_ring_advance(ring, 1);
    }
    // Owner's thread: the drain of `returns`.
    static void onReturn(void* self, uint16_t bid) noexcept {
        auto* r = static_cast<PbufRing*>(self);
        if (!r->incremental) {
            r->addHere(bid);
            return;
        }
        for (uint32_t n = r->remoteDrops[bid].exchange(0, std::memory_order_acq_rel); n > 0; --n) { r->dropHere(bid); }
    }
    // Before the memory goes: no drain of `returns` queued or running on the owner.
    void settle() const noexcept {
        if (group) {
            group->settle();
        } else {
            returns.settle();
        }
    }
};

}  // namespace detail

namespace {
std::atomic<uint16_t> gNextGroup{1};

void unmapRing(detail::PbufRing* r) noexcept {
    if (r->ring != nullptr) { ::munmap(r->ring, r->ringBytes); }
    if (r->buffers != nullptr) { ::munmap(r->buffers, r->bufferBytes); }
}

}  // namespace

// The pool's registrations, one slot per carrier index, each written only by that carrier's thread:
// a receive finds its carrier's ring with one load and takes no lock (share-nothing per carrier).
struct ProvidedBufferPool::Impl {
    struct Slot {
        std::atomic<detail::PbufRing*> ring{nullptr};  // published once registered (release)
        bool failed = false;                           // registration refused there (owner's thread only)
    };
    uint16_t bgid = 0;
    std::unique_ptr<Slot[]> slots{new Slot[kMaxCarriers]};  // by carrier index
    std::atomic<spindle::detail::RuntimeImpl*> runtime{nullptr};  // whose carriers hold the registrations
    std::atomic<uint64_t> provided{0};  // recv()s served from a ring (multishot deliveries: per ring)
    std::atomic<uint64_t> fallback{0};
    std::atomic<uint64_t> exhausted{0};
    std::atomic<int> registerError{0};
    std::atomic<bool> incrementalRefusedLogged{false};
};

// ---- ProvidedBuffer ------------------------------------------------------------------------------

ProvidedBuffer::ProvidedBuffer(ProvidedBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      capacity_(std::exchange(o.capacity_, 0)),
      owner_(std::exchange(o.owner_, nullptr)),
      bid_(o.bid_) {}

ProvidedBuffer& ProvidedBuffer::operator=(ProvidedBuffer&& o) noexcept {
    if (this != &o) {
        release();
        data_ = std::exchange(o.data_, nullptr);
        size_ = std::exchange(o.size_, 0);
        capacity_ = std::exchange(o.capacity_, 0);
        owner_ = std::exchange(o.owner_, nullptr);
        bid_ = o.bid_;
    }
    return *this;
}

void ProvidedBuffer::release() noexcept {
    if (data_ == nullptr) { return; }
    if (owner_ != nullptr) {
        owner_->giveBack(bid_);
    } else {
        delete[] data_;
    }
    data_ = nullptr;
    size_ = 0;
    capacity_ = 0;
    owner_ = nullptr;
}

// ---- ProvidedBufferPool --------------------------------------------------------------------------

ProvidedBufferPool::ProvidedBufferPool(const ProvidedBufferOptions& options) : options_(options), impl_(std::make_unique<Impl>()) {
    impl_->bgid = gNextGroup.fetch_add(1, std::memory_order_relaxed);
}

Result<std::unique_ptr<ProvidedBufferPool>> ProvidedBufferPool::create(const ProvidedBufferOptions& options) noexcept {
    const unsigned c = options.count;
    if (c == 0 || c > 32768 || (c & (c - 1)) != 0) { return Error{EINVAL}; }
    if (options.size == 0 || options.size > (1u << 20)) { return Error{EINVAL}; }
    try {
        return std::unique_ptr<ProvidedBufferPool>(new ProvidedBufferPool(options));
    } catch (...) {
        return Error{ENOMEM};
    }
}

ProvidedBufferPool::~ProvidedBufferPool() {
    // Each registration is dropped by its own carrier's thread (SINGLE_ISSUER).
    spindle::detail::RuntimeImpl* rt = impl_->runtime.load(std::memory_order_acquire);
    for (unsigned i = 0; i < kMaxCarriers; ++i) {
        detail::PbufRing* ring = impl_->slots[i].ring.load(std::memory_order_acquire);
        if (ring == nullptr) { continue; }
        auto drop = [ring] {
            if (ring->group) {
                (void)unregisterBufferGroupHere(ring->bgid);
            } else if (uring::Ring* here = currentRing()) {
                (void)here->unregisterBufRing(ring->bgid);
            }
        };
        if (rt != nullptr) {
            // ECANCELED: the runtime is shutting down, and the ring goes with its carrier.
            (void)spindle::detail::runOnCarrier(rt, ring->carrier,
                                                [](void* ctx) noexcept { (*static_cast<decltype(drop)*>(ctx))(); },
                                                &drop);
        }
        ring->settle();  // a drain of returns from other threads is over before the memory goes
        unmapRing(ring);
        delete ring;
    }
}

detail::PbufRing* ProvidedBufferPool::ringHere() noexcept {
    // Off-fiber there is no carrier to register with, and a plain receive is what happens anyway.
    if (!this_fiber::inFiber()) { return nullptr; }
    const auto idx = static_cast<size_t>(this_fiber::carrierIndex());
    Impl& im = *impl_;
    Impl::Slot& slot = im.slots[idx];
    // Only this carrier's thread writes its slot, and nothing below parks: no lock.
    if (detail::PbufRing* r = slot.ring.load(std::memory_order_relaxed)) { return r; }
    if (slot.failed) { return nullptr; }
    return registerHere(idx);
}

detail::PbufRing* ProvidedBufferPool::registerHere(size_t idx) noexcept {
    Impl& im = *impl_;
    Impl::Slot& slot = im.slots[idx];
    uring::Ring* ring = currentRing();  // null on the epoll backend: a BufferGroup with its driver
    auto fail = [&](int e, detail::PbufRing* r) -> detail::PbufRing* {
        slot.failed = true;
        int expected = 0;
        if (im.registerError.compare_exchange_strong(expected, e)) {
            log::info("provided buffers: no buffer ring on carrier {} ({}); receives fall back to plain buffers", idx,
                      std::strerror(e));
        }
        if (r != nullptr) {
            unmapRing(r);
            delete r;
        }
        return nullptr;
    };
    auto* r = new (std::nothrow) detail::PbufRing;
    if (r == nullptr) { return fail(ENOMEM, nullptr); }
    r->count = options_.count;
    r->size = options_.size;
    r->bgid = im.bgid;
    r->carrier = static_cast<unsigned>(idx);
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    r->bufferBytes = (r->size * r->count + page - 1) / page * page;
    void* bufMem = ::mmap(nullptr, r->bufferBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (bufMem == MAP_FAILED) { return fail(errno, r); }
    r->buffers = static_cast<char*>(bufMem);
    if (ring == nullptr) {
        // The epoll backend: the driver picks buffers from a group of ours when a socket has data.
        try {
            r->group = std::make_unique<spindle::detail::BufferGroup>(r->buffers, r->size, r->count);
        } catch (...) {
            return fail(ENOMEM, r);
        }
        if (auto reg = registerBufferGroupHere(r->bgid, r->group.get()); !reg) { return fail(reg.errorCode(), r); }
    } else {
        try {
            r->returns.init(r->count, spindle::detail::Carrier::current(), &detail::PbufRing::onReturn, r);
        } catch (...) {
            return fail(ENOMEM, r);
        }
        r->ringBytes = (sizeof(io_uring_buf) * r->count + page - 1) / page * page;
        void* ringMem = ::mmap(nullptr, r->ringBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (ringMem == MAP_FAILED) { return fail(errno, r); }
        r->ring = static_cast<io_uring_buf_ring*>(ringMem);
        io_uring_buf_ring_init(r->ring);
        Result<void> reg = Error{EINVAL};
        if (options_.incremental) {
            try {
                r->slices = std::make_unique<detail::PbufRing::Slices[]>(r->count);
                r->remoteDrops = std::make_unique<std::atomic<uint32_t>[]>(r->count);
            } catch (...) {
                return fail(ENOMEM, r);
            }
            // The probe: a kernel before 6.12 refuses the flag with EINVAL; then the ring goes without it.
            reg = ring->registerBufRing(r->ring, r->count, r->bgid, uring::Ring::kPbufRingIncremental);
            if (reg) {
                r->incremental = true;
            } else if (reg.errorCode() == EINVAL && !im.incrementalRefusedLogged.exchange(true)) {
                log::info("provided buffers: this kernel cannot consume buffers incrementally (IOU_PBUF_RING_INC, "
                          "Linux 6.12); each receive takes a whole buffer");
            }
        }
        if (!r->incremental) {
            r->slices.reset();
            r->remoteDrops.reset();
            reg = ring->registerBufRing(r->ring, r->count, r->bgid);
        }
        if (!reg) { return fail(reg.errorCode(), r); }
        const int mask = io_uring_buf_ring_mask(r->count);
        for (unsigned i = 0; i < r->count; ++i) {
            io_uring_buf_ring_add(r->ring, r->buffers + static_cast<size_t>(i) * r->size,
                                  static_cast<unsigned>(r->size), static_cast<unsigned short>(i), mask,
                                  static_cast<int>(i));
        }
        io_uring_buf_ring_advance(r->ring, static_cast<int>(r->count));
    }
    spindle::detail::RuntimeImpl* expected = nullptr;
    (void)im.runtime.compare_exchange_strong(expected, spindle::detail::currentRuntime(), std::memory_order_acq_rel);
    slot.ring.store(r, std::memory_order_release);
    return r;
}

namespace {

/// One receive on an incremental ring. Its CQE is accounted (PbufRing::take) by the carrier as it reaps
/// it, through a completion of its own: where its bytes start depends on every CQE before it that named
/// the same buffer, and the fiber, resumed later, would account it after CQEs handled in between.
struct OneReceive : MultishotCompletion {
    detail::PbufRing* ring = nullptr;
    FiberFuture done;
    int32_t res = 0;
    int32_t bid = -1;     // the buffer the CQE named, or -1
    uint32_t offset = 0;  // where in it the bytes start

    static void onCqe(MultishotCompletion* c, int32_t res, uint32_t flags) noexcept {
        auto* self = static_cast<OneReceive*>(c);
        if ((flags & op::kBufferPicked) != 0) {
            const auto bid = static_cast<uint16_t>(flags >> op::kBufferShift);
            self->offset = self->ring->take(bid, res, flags);
            self->bid = bid;
        }
        self->res = res;
        if ((flags & op::kMore) == 0) { self->done.set(res); }  // a single receive: its only CQE
    }
};

}  // namespace

OpResult ProvidedBufferPool::recvIncremental(detail::PbufRing* ring, int fd, Deadline deadline, uint32_t& offset) noexcept {
    OneReceive one;
    one.fn = &OneReceive::onCqe;
    one.ring = ring;
    auto armed = armMultishot(op::recvSelect(fd, static_cast<uint32_t>(options_.size), ring->bgid), &one);
    if (!armed) { return OpResult{-armed.errorCode(), 0}; }
    const int32_t w = waitMultishot(&one.done, &one, deadline);
    if (!one.done.isSet()) {
        // A deadline or a cancel ended the wait first: cancel the receive and wait for its CQE, which
        // may have brought bytes even so (they are returned, not lost).
        (void)cancelMultishot(&one);
        (void)one.done.wait();
    }
    settleMultishot(&one);
    offset = one.offset;
    OpResult r{one.res, 0};
    if (one.bid >= 0) { r.flags = op::kBufferPicked | (static_cast<uint32_t>(one.bid) << op::kBufferShift); }
    if (r.res == -ECANCELED && (w == -ETIMEDOUT || w == -ECANCELED)) { r.res = w; }
    return r;
}

Result<ProvidedBuffer> ProvidedBufferPool::recv(int fd, Deadline deadline) noexcept {
    Impl& im = *impl_;
    // No fiber switch between choosing the ring and submitting: the SQE goes to that carrier's ring.
    if (detail::PbufRing* ring = ringHere()) {
        uint32_t offset = 0;
        OpResult r;
        if (ring->incremental) {
            r = recvIncremental(ring, fd, deadline, offset);  // accounted as it was reaped
        } else {
            r = submitOp(op::recvSelect(fd, static_cast<uint32_t>(options_.size), ring->bgid), deadline);
            if ((r.flags & op::kBufferPicked) != 0) {
                offset = ring->take(static_cast<uint16_t>(r.flags >> op::kBufferShift), r.res, r.flags);
            }
        }
        ProvidedBuffer b;
        if ((r.flags & op::kBufferPicked) != 0 && r.res > 0) {  // a CQE without bytes leased nothing
            b.bid_ = static_cast<uint16_t>(r.flags >> op::kBufferShift);
            b.owner_ = ring;
            b.data_ = ring->base(b.bid_) + offset;
            b.capacity_ = ring->incremental ? static_cast<size_t>(r.res) : ring->size;
            b.size_ = static_cast<size_t>(r.res);
        }
        if (r.res == -ENOBUFS) {
            im.exhausted.fetch_add(1, std::memory_order_relaxed);
        } else if (r.res < 0) {
            return Error{-r.res};
        } else {
            im.provided.fetch_add(1, std::memory_order_relaxed);
            return b;  // empty at end of stream
        }
    }
    im.fallback.fetch_add(1, std::memory_order_relaxed);
    ProvidedBuffer b;
    b.data_ = new (std::nothrow) char[options_.size];
    if (b.data_ == nullptr) { return Error{ENOMEM}; }
    b.capacity_ = options_.size;
    auto n = detail::recv(fd, b.data_, options_.size, 0, deadline);
    if (!n) { return Error{n.errorCode()}; }
    b.size_ = *n;
    if (*n == 0) { b.release(); }
    return b;
}

ProvidedBufferStats ProvidedBufferPool::stats() const noexcept {
    ProvidedBufferStats s;
    s.providedRecvs = impl_->provided.load(std::memory_order_relaxed);
    s.fallbackRecvs = impl_->fallback.load(std::memory_order_relaxed);
    s.exhausted = impl_->exhausted.load(std::memory_order_relaxed);
    s.registerError = impl_->registerError.load(std::memory_order_relaxed);
    for (unsigned i = 0; i < kMaxCarriers; ++i) {
        const detail::PbufRing* r = impl_->slots[i].ring.load(std::memory_order_acquire);
        if (r == nullptr) { continue; }
        ++s.carriersRegistered;
        s.carriersIncremental += r->incremental ? 1 : 0;
        s.providedRecvs += r->multishotDelivered.load(std::memory_order_relaxed);
    }
    return s;
}

}  // namespace spindle::net

// ---- MultishotReceiver ---------------------------------------------------------------------------

namespace spindle::net {
namespace {

constexpr size_t kHighWater = 64;  // queued buffers at which the operation is paused (cancelled)

}  // namespace

MultishotReceiver::MultishotReceiver(ProvidedBufferPool& pool, int fd) noexcept : pool_(pool), fd_(fd) {
    completion_.fn = &MultishotReceiver::onCqe;
    completion_.self = this;
}

MultishotReceiver::~MultishotReceiver() {
    stop();
    // Nothing is armed now: the state is ours.
    Entry e{};
    while (popEntry(e)) { e.ring->giveBack(e.bid()); }
}

template <class F>
void MultishotReceiver::onState(F&& step) noexcept {
    spindle::detail::Carrier* h = holder_.load(std::memory_order_acquire);
    if (h == nullptr || h == spindle::detail::Carrier::current()) {
        step();  // no operation armed (the consumer's alone), or this thread holds it
        return;
    }
    auto call = [](void* ctx) noexcept { (*static_cast<std::remove_reference_t<F>*>(ctx))(); };
    if (spindle::detail::runOnCarrier(h->runtime(), h->index(), call, static_cast<void*>(std::addressof(step)))) {
        return;
    }
    // The holder's runtime is shutting down and this is no fiber of it: the shutdown ends the
    // operation; once its last CQE has been handled the state is the consumer's.
    while (holder_.load(std::memory_order_acquire) != nullptr) { ::sched_yield(); }
    step();
}

bool MultishotReceiver::pushEntry(const Entry& e) noexcept {
    if (count_ < kInline && !(spill_ && spillHead_ < spill_->size())) {
        inline_[(head_ + count_) % kInline] = e;
        ++count_;
        return true;
    }
    try {
        if (!spill_) { spill_ = std::make_unique<std::vector<Entry>>(); }
        spill_->push_back(e);
    } catch (...) {
        return false;
    }
    return true;
}

bool MultishotReceiver::popEntry(Entry& out) noexcept {
    // Every entry inline is older than every spilled one: pushes go to the spill while it holds any.
    if (count_ > 0) {
        out = inline_[head_];
        head_ = (head_ + 1) % kInline;
        --count_;
        return true;
    }
    if (spill_ && spillHead_ < spill_->size()) {
        out = (*spill_)[spillHead_++];
        if (spillHead_ == spill_->size()) {
            spill_->clear();
            spillHead_ = 0;
        }
        return true;
    }
    return false;
}

ProvidedBuffer MultishotReceiver::lease(const Entry& e) noexcept {
    ProvidedBuffer b;
    b.owner_ = e.ring;
    b.bid_ = e.bid();
    b.data_ = e.ring->base(b.bid_) + e.offset();
    b.size_ = e.len();
    b.capacity_ = e.ring->incremental ? b.size_ : e.ring->size;
    return b;
}

void MultishotReceiver::onCqe(MultishotCompletion* c, int32_t res, uint32_t flags) noexcept {
    // On the holder's thread, which alone touches the state while the operation is armed.
    MultishotReceiver* self = static_cast<Completion*>(c)->self;
    void (*notify)(void*) = nullptr;
    void* notifyArg = nullptr;
    if (self->waiter_ == nullptr && self->readyFn_ != nullptr) {  // a next() in progress takes the CQE
        notify = self->readyFn_;
        notifyArg = self->readyArg_;
    }
    const bool pause = self->handleCqe(res, flags);
    if ((flags & op::kMore) == 0) {
        self->ended_.set(res);
        // The last touch: from here the consumer owns the state, and stop() may return and free it.
        self->holder_.store(nullptr, std::memory_order_release);
    } else if (pause && !cancelMultishot(&self->completion_)) {
        (void)::shutdown(self->fd_, SHUT_RD);
    }
    // Last: the callback may destroy the receiver (after the last CQE).
    if (notify != nullptr) { notify(notifyArg); }
}

bool MultishotReceiver::handleCqe(int32_t res, uint32_t flags) noexcept {
    if ((flags & op::kBufferPicked) != 0) {
        // Accounted here, as the carrier reaps the CQE: that order tells an incremental buffer's slices apart.
        const auto bid = static_cast<uint16_t>(flags >> op::kBufferShift);
        const uint32_t offset = armedRing_->take(bid, res, flags);
        // Once bytes were lost, later ones are dropped too: next() hands out what came before the
        // loss, then the error, never a stream with a hole in it.
        if (res > 0 && broken_ == 0 &&
            pushEntry(Entry::make(armedRing_, bid, offset, static_cast<uint32_t>(res)))) {
            delivered_ = true;
            ownerAdd(stats_.buffers);  // the holder's thread, the only writer while the operation is armed
            ownerAdd(armedRing_->multishotDelivered);
        } else if (res > 0) {
            armedRing_->giveBack(bid);
            broken_ = ENOMEM;  // bytes the queue could not hold: the stream is broken
        }
    }
    const size_t queued = count_ + (spill_ ? spill_->size() - spillHead_ : 0);
    bool pause = false;
    if ((flags & op::kMore) != 0 && !pausing_ && (queued >= kHighWater || broken_ != 0)) {
        // The consumer lags (or lost bytes): stop receiving until it catches up; next() arms again.
        pausing_ = true;
        pause = true;
    }
    if ((flags & op::kMore) == 0) {
        armed_ = false;
        endRes_ = res > 0 ? 1 : res;
        if (res == -ENOBUFS) { pool_.impl_->exhausted.fetch_add(1, std::memory_order_relaxed); }
    }
    if (FiberFuture* w = std::exchange(waiter_, nullptr)) { w->set(res); }
    return pause;
}

MultishotReceiver::Look MultishotReceiver::look(FiberFuture* wake, Entry& e, int& error) noexcept {
    if (popEntry(e)) { return Look::kTaken; }
    if (broken_ != 0) {
        error = broken_;
        return Look::kError;
    }
    if (eof_) { return Look::kEof; }
    if (!armed_) { return Look::kEnded; }
    if (wake == nullptr) { return Look::kArmed; }
    waiter_ = wake;
    return Look::kWaiting;
}

bool MultishotReceiver::notifyWhenReady(void (*fn)(void*), void* arg) noexcept {
    bool refused = false;
    bool registered = false;
    onState([&] {
        const bool queued = count_ > 0 || (spill_ && spillHead_ < spill_->size());
        if (queued || broken_ != 0 || eof_ || waiter_ != nullptr) {
            refused = true;
        } else if (armed_) {
            readyFn_ = fn;
            readyArg_ = arg;
            registered = true;
        }
    });
    if (refused) { return false; }
    if (registered) { return true; }
    // Ended, so the state is ours. Only a cancel (ours, or a pause) may be passed over silently;
    // anything else is next()'s to report.
    if ((endRes_ != 1 && endRes_ != -ECANCELED) || !multishot_ || !this_fiber::inFiber()) { return false; }
    detail::PbufRing* ring = pool_.ringHere();
    if (ring == nullptr) { return false; }
    endRes_ = 1;
    readyFn_ = fn;
    readyArg_ = arg;
    // Its CQEs come once this fiber has parked or ended: the registration is in place before.
    return submitArm(ring) == 0;
}

int MultishotReceiver::submitArm(detail::PbufRing* ring) noexcept {
    // The state of a new operation, consistent before its SQE (a driver may deliver a CQE at once);
    // queued on this carrier, whose ring `ring` is.
    armed_ = true;
    pausing_ = false;
    delivered_ = false;
    armedRing_ = ring;
    ended_.reset();
    stats_.arms.fetch_add(1, std::memory_order_relaxed);
    holder_.store(spindle::detail::Carrier::current(), std::memory_order_release);
    auto r = armMultishot(op::recvMultishot(fd_, ring->bgid), &completion_);
    if (r) { return 0; }
    // Refused: no CQE comes, and the state is still ours.
    armed_ = false;
    readyFn_ = nullptr;
    readyArg_ = nullptr;
    ended_.set(-r.errorCode());
    holder_.store(nullptr, std::memory_order_release);
    return r.errorCode();
}

void MultishotReceiver::cancelNotify() noexcept {
    onState([this] {
        readyFn_ = nullptr;
        readyArg_ = nullptr;
    });
}

bool MultishotReceiver::armed() const noexcept { return holder_.load(std::memory_order_acquire) != nullptr; }

bool MultishotReceiver::hasPending() const noexcept {
    SPINDLE_CHECK_MSG(!armed(), "MultishotReceiver::hasPending while an operation is armed");
    const bool queued = count_ > 0 || (spill_ && spillHead_ < spill_->size());
    // Ended by a cancel (stop(), a pause) or not at all: nothing to report. Anything else is next()'s.
    return queued || broken_ != 0 || eof_ || (endRes_ != 1 && endRes_ != -ECANCELED);
}

Result<ProvidedBuffer> MultishotReceiver::next(Deadline deadline) noexcept {
    for (;;) {
        FiberFuture wake;
        Entry e{};
        int error = 0;
        Look seen = Look::kEnded;
        onState([&] { seen = look(&wake, e, error); });
        switch (seen) {
            case Look::kTaken: return lease(e);
            case Look::kError: return Error{error};
            case Look::kEof: return ProvidedBuffer{};
            case Look::kWaiting: break;
            case Look::kArmed: continue;  // not asked for with a waiter
            case Look::kEnded: {
                // No operation armed: the state is ours until this fiber arms one.
                bool oneShot = !multishot_ || !this_fiber::inFiber();
                const int32_t end = std::exchange(endRes_, 1);
                if (end == 0) {
                    eof_ = true;
                    return ProvidedBuffer{};
                }
                if (end == -EINVAL && !delivered_) {
                    multishot_ = false;  // a kernel before 6.0, or a socket it cannot do this for
                    oneShot = true;
                } else if (end == -ENOBUFS) {
                    oneShot = true;      // the carrier's ring ran dry: this once, a heap buffer
                } else if (end == -ECANCELED) {
                    if (this_fiber::cancellationRequested()) { return Error{ECANCELED}; }
                } else if (end < 0) {
                    return Error{-end};
                }
                detail::PbufRing* ring = oneShot ? nullptr : pool_.ringHere();
                if (ring != nullptr) {
                    // As if the operation's only CQE had said the errno (a kernel without multishot receive: EINVAL).
                    bool refused = false;
                    SPINDLE_INJECT(inject::Point::kMultishotRecv, {
                        endRes_ = -injectedErrno;
                        refused = true;
                    });
                    if (refused) {
                        delivered_ = false;
                        continue;
                    }
                }
                if (ring == nullptr) {
                    stats_.oneShot.fetch_add(1, std::memory_order_relaxed);
                    auto b = pool_.recv(fd_, deadline);
                    if (b && b->empty()) { eof_ = true; }
                    return b;
                }
                // Its CQEs come after this fiber parks (or, from a driver that answers at once, are
                // queued by the time this returns).
                if (const int err = submitArm(ring); err != 0) { return Error{err}; }
                continue;
            }
        }
        const int32_t w = waitMultishot(&wake, &completion_, deadline);
        if (w == -ETIMEDOUT || w == -ECANCELED) {
            bool mine = false;
            onState([&] {
                if (waiter_ == &wake) {
                    waiter_ = nullptr;
                    mine = true;
                }
            });
            if (mine) { return Error{-w}; }
            (void)wake.wait();  // the handler claimed it: what it queued is taken on the next turn
        }
    }
}

void MultishotReceiver::stop() noexcept {
    bool wasArmed = false;
    onState([&] {
        if (armed_) {
            pausing_ = true;
            wasArmed = true;
        }
    });
    if (!wasArmed) { return; }
    if (!cancelMultishot(&completion_)) { (void)::shutdown(fd_, SHUT_RD); }
    (void)ended_.wait();
    settleMultishot(&completion_);
    // The handler of the last CQE lets go of the receiver with its last store.
    while (holder_.load(std::memory_order_acquire) != nullptr) {
        if (this_fiber::inFiber()) {
            this_fiber::yield();
        } else {
            ::sched_yield();
        }
    }
}

MultishotReceiver::Stats MultishotReceiver::stats() const noexcept {
    Stats s;
    s.arms = stats_.arms.load(std::memory_order_relaxed);
    s.buffers = stats_.buffers.load(std::memory_order_relaxed);
    s.oneShot = stats_.oneShot.load(std::memory_order_relaxed);
    return s;
}

}  // namespace spindle::net
