// SPDX-License-Identifier: Apache-2.0
#pragma once
/// ProvidedBufferPool: receive buffers the kernel picks when data arrives (IORING_REGISTER_PBUF_RING,
/// Linux 5.19), so a connection that waits holds no buffer of its own.
///
/// A pool is a buffer group: on each carrier where it is first used, a ring of `count` buffers of
/// `size` bytes is registered with that carrier's io_uring (on that carrier's thread, so
/// SINGLE_ISSUER holds). On the epoll backend the same buffers form a BufferGroup registered with
/// the carrier's epoll driver, which picks one when the socket has data: the same semantics, the
/// same counters. recv() posts a receive with IOSQE_BUFFER_SELECT; the CQE names the buffer
/// the kernel filled, which the caller holds as a ProvidedBuffer lease until it drops it; the buffer
/// then goes back to the ring of the carrier it came from. Share-nothing: only that carrier's thread
/// writes its ring (a receive finds it with one load; no lock anywhere on the data path); a buffer
/// released on another thread is queued without a lock and put back by that carrier in its loop.
/// Incremental consumption (ProvidedBufferOptions::incremental, IOU_PBUF_RING_INC, Linux 6.12): the
/// kernel fills each buffer one receive after another instead of taking a whole buffer per receive, so
/// the memory a server touches follows the bytes it received, not the number of receives: 10,000
/// requests of 40 bytes touch 400 KB of a ring instead of every buffer in it. A lease is then a slice of
/// a buffer; the buffer goes back to the ring once the kernel is done with it (a CQE without
/// IORING_CQE_F_BUF_MORE) and every slice of it was released. Probed at registration: a kernel that
/// answers EINVAL gets the ring registered without it (stats().carriersIncremental says which).
/// Ordering: the slices of a buffer are told apart by the order of their CQEs, which the carrier
/// accounts as it reaps them (never later, on a fiber that resumes), and which the kernel posts in the
/// order it filled them for a pollable socket.
/// Fallback: where registration fails (an older kernel: EINVAL; a memlock limit: ENOMEM), off-fiber,
/// and when a carrier's ring has run out of buffers (ENOBUFS), recv() receives into a buffer from
/// the heap instead, and counts it (stats()). The caller sees the same ProvidedBuffer either way.
/// Lifetime: the pool must outlive every lease and the runtime's carriers must outlive the pool
/// (destroy it before Runtime::shutdown(), or let it live in a fiber).
/// Errors: recv() returns the stream's errors; a lease of size 0 is end of stream.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "base/result.h"
#include "core/deadline.h"
#include "core/fiber_future.h"
#include "core/ring_ops.h"

namespace spindle::detail {
class Carrier;
}

namespace spindle::net {

class ProvidedBufferPool;
namespace detail {
struct PbufRing;  // one carrier's registered ring of a pool (provided_buffers.cpp)
}

/// A filled receive buffer, owned until destroyed or released.
class ProvidedBuffer {
public:
    ProvidedBuffer() noexcept = default;
    ProvidedBuffer(ProvidedBuffer&& o) noexcept;
    ProvidedBuffer& operator=(ProvidedBuffer&& o) noexcept;
    ProvidedBuffer(const ProvidedBuffer&) = delete;
    ProvidedBuffer& operator=(const ProvidedBuffer&) = delete;
    ~ProvidedBuffer() { release(); }

    [[nodiscard]] char* data() const noexcept { return data_; }
    [[nodiscard]] size_t size() const noexcept { return size_; }
    [[nodiscard]] size_t capacity() const noexcept { return capacity_; }
    [[nodiscard]] bool empty() const noexcept { return data_ == nullptr; }
    /// Whether the kernel picked it from a registered ring (false: the heap fallback).
    [[nodiscard]] bool provided() const noexcept { return owner_ != nullptr; }
    /// Gives the buffer back now.
    void release() noexcept;

private:
    friend class ProvidedBufferPool;
    friend class MultishotReceiver;
    char* data_ = nullptr;
    size_t size_ = 0;
    size_t capacity_ = 0;
    detail::PbufRing* owner_ = nullptr;  // the carrier ring it returns to, or null for a heap buffer
    uint16_t bid_ = 0;
};

struct ProvidedBufferOptions {
    unsigned count = 1024;       // buffers per carrier: a power of two, 1..32768
    size_t size = 4096;          // bytes each: 1..1 MiB
    bool incremental = true;     // consume buffers incrementally where the kernel can (6.12; see above)
};

struct ProvidedBufferStats {
    uint64_t providedRecvs = 0;  // receives served from a registered ring
    uint64_t fallbackRecvs = 0;  // receives into a heap buffer (no ring here, off-fiber, or ENOBUFS)
    uint64_t exhausted = 0;      // ENOBUFS answers (a ring ran out of buffers)
    unsigned carriersRegistered = 0;
    unsigned carriersIncremental = 0;  // of those, registered for incremental consumption
    int registerError = 0;       // the errno of the first refused registration, or 0
};

class ProvidedBufferPool {
public:
    /// Errors: EINVAL for options out of range.
    [[nodiscard]] static Result<std::unique_ptr<ProvidedBufferPool>> create(const ProvidedBufferOptions& options = {}) noexcept;
    ~ProvidedBufferPool();
    ProvidedBufferPool(const ProvidedBufferPool&) = delete;
    ProvidedBufferPool& operator=(const ProvidedBufferPool&) = delete;

    /// One receive on socket `fd` into a buffer of the pool (see the header comment).
    [[nodiscard]] Result<ProvidedBuffer> recv(int fd, Deadline deadline = {}) noexcept;
    [[nodiscard]] ProvidedBufferStats stats() const noexcept;
    /// Whether a receive made now by the calling fiber would use a registered ring (or, on epoll, a
    /// buffer group): false off-fiber and where the registration was refused. A reader that finds it false for
    /// good receives into a buffer of its own per connection rather than a heap buffer per receive
    /// (BufferedReader, spindle-echo). Registers this carrier's ring on first use, as recv() does.
    [[nodiscard]] bool ringAvailable() noexcept { return ringHere() != nullptr; }
    [[nodiscard]] size_t bufferSize() const noexcept { return options_.size; }

    struct Impl;

private:
    friend class MultishotReceiver;
    explicit ProvidedBufferPool(const ProvidedBufferOptions& options);
    detail::PbufRing* ringHere() noexcept;
    // recv() on an incremental ring: the CQE's result and flags, and where its bytes start (`offset`).
    [[nodiscard]] OpResult recvIncremental(detail::PbufRing* ring, int fd, Deadline deadline, uint32_t& offset) noexcept;
    detail::PbufRing* registerHere(size_t carrier) noexcept;
    ProvidedBufferOptions options_;
    std::unique_ptr<Impl> impl_;
};

/// A multishot receive on one connected stream socket into a pool's buffers (IORING_RECV_MULTISHOT,
/// Linux 6.0; emulated by the epoll driver). One operation stays armed on the carrier for as long as data keeps coming, so a
/// connection costs one SQE for its whole life instead of one per receive, and the socket keeps one
/// poll registration instead of arming and tearing down one per receive (io_uring's equivalent of an
/// epoll registration). Each CQE's buffer is queued here until next() takes it.
///
/// Falls back to one ProvidedBufferPool::recv() per call off-fiber, where the pool has no ring on the
/// carrier, where the kernel refuses multishot receive (EINVAL before any data), and once after the
/// carrier's ring ran out of buffers (ENOBUFS ends the operation; the next call arms it again).
/// Every receive on the socket must go through the receiver while it lives: a plain recv could take
/// bytes out of order.
/// Errors (next()): the socket's (ECONNRESET, ...), each reported once; ETIMEDOUT when the deadline
/// passes with nothing queued; ECANCELED when the fiber is cancelled. Nothing received is lost: what
/// the kernel delivered stays queued for the next call. The one exception is ENOMEM, when a CQE's
/// buffer could not be queued (the spill could not grow): from then on next() reports ENOMEM, after
/// the bytes that came before it, and the stream is broken.
/// Thread-safety: one consumer at a time (a fiber on any carrier, or a thread). Share-nothing: while
/// an operation is armed, its carrier (the holder) alone touches the receiver's queue and state: its
/// CQE handler, a consumer running there, and a consumer elsewhere through a step it has the holder
/// run (Runtime::runOnCarrier, which parks the consumer). With nothing armed the state is the
/// consumer's. There is no lock, so no thread can hold the carrier up in the middle of a CQE. A
/// pinned fiber on the holder waits without a timer (see waitMultishot()); a consumer that moved to
/// another carrier pays a message round trip per look at the queue.
/// Lifetime: the socket must stay open until stop() or the destructor, which cancel the operation
/// and wait for its last CQE; buffers still queued then go back to their ring.
class MultishotReceiver {
public:
    MultishotReceiver(ProvidedBufferPool& pool, int fd) noexcept;
    ~MultishotReceiver();
    MultishotReceiver(const MultishotReceiver&) = delete;
    MultishotReceiver& operator=(const MultishotReceiver&) = delete;

    /// The next buffer of received bytes, in order; a lease of size 0 is end of stream (and stays so).
    [[nodiscard]] Result<ProvidedBuffer> next(Deadline deadline = {}) noexcept;
    /// Cancels the operation, if armed, and waits for its last CQE; buffers it queued stay queued for
    /// next(), which arms it again. Errors: none (without memory for the message to another carrier,
    /// it shuts the socket's receive side instead, which ends the operation all the same).
    void stop() noexcept;

    /// For a connection that gives up its fiber while it waits: arms the operation if it is not armed
    /// and has `fn(arg)` called, on the carrier holding it, for each CQE that comes while the
    /// registration lasts (until cancelNotify(); a next() in progress takes precedence). `fn` typically
    /// starts a fiber that cancels the registration and calls next(). Returns false, registering
    /// nothing, when something is queued or to be reported already, or when no operation can be armed
    /// here (off-fiber, a pool without a ring, a kernel without multishot receive): call next() then.
    /// `fn` must not block; it may destroy the receiver once armed() is false (after the last CQE).
    /// Errors: none beyond the false return.
    [[nodiscard]] bool notifyWhenReady(void (*fn)(void* arg), void* arg) noexcept;
    /// Ends a notifyWhenReady() registration; CQEs from now on queue for next(). On the carrier holding
    /// the operation (inside `fn`, or from a fiber there) it takes effect at once; from anywhere else it
    /// has the holder do it and waits (parking a fiber, blocking a thread), so in either case no call of
    /// `fn` is running or to come when it returns. Precondition: not called from a function running on
    /// another carrier's thread outside a fiber (it would block that carrier). Errors: none.
    void cancelNotify() noexcept;
    /// Whether an operation is armed (its CQEs, the last one included, may still come).
    [[nodiscard]] bool armed() const noexcept;
    /// Whether next() would return at once: a buffer is queued, or an end of stream or an error is to
    /// be reported. For a consumer that stop()ped the receiver and would hand the socket to another
    /// kind of wait (a poll) only if nothing came in the meantime. Precondition: !armed().
    [[nodiscard]] bool hasPending() const noexcept;
    /// false once the kernel refused multishot receive here (next() then receives one buffer per call).
    [[nodiscard]] bool multishot() const noexcept { return multishot_; }

    struct Stats {
        uint64_t arms = 0;       // operations armed
        uint64_t buffers = 0;    // buffers its CQEs delivered
        uint64_t oneShot = 0;    // receives that went through ProvidedBufferPool::recv() instead
    };
    [[nodiscard]] Stats stats() const noexcept;

private:
    // A queued CQE's bytes: `len` bytes at `offset` in buffer `bid` of `ring`, packed into one word so
    // that the inline queue stays 16 bytes an entry (len <= 1 MiB: 21 bits; offset < 1 MiB: 20 bits).
    struct Entry {
        detail::PbufRing* ring;
        uint64_t word;
        static Entry make(detail::PbufRing* r, uint16_t bid, uint32_t offset, uint32_t len) noexcept {
            return Entry{r, uint64_t{len} | (uint64_t{offset} << 21) | (uint64_t{bid} << 41)};
        }
        [[nodiscard]] uint32_t len() const noexcept { return static_cast<uint32_t>(word & ((1u << 21) - 1)); }
        [[nodiscard]] uint32_t offset() const noexcept { return static_cast<uint32_t>((word >> 21) & ((1u << 20) - 1)); }
        [[nodiscard]] uint16_t bid() const noexcept { return static_cast<uint16_t>(word >> 41); }
    };
    static constexpr unsigned kInline = 8;  // queued buffers held inline; more spill to `spill_`
    struct Completion : MultishotCompletion {
        MultishotReceiver* self = nullptr;
    };
    // What one look at the queue found (look()).
    enum class Look : uint8_t { kTaken, kError, kEof, kWaiting, kArmed, kEnded };
    static void onCqe(MultishotCompletion* c, int32_t res, uint32_t flags) noexcept;
    // The work of onCqe on the state; true when the operation is to be paused (cancelled).
    [[nodiscard]] bool handleCqe(int32_t res, uint32_t flags) noexcept;
    // Where the state may be touched: a buffer queued, an error or end to report, the consumer's
    // `wake` registered as the waiter of the armed operation (kWaiting; kArmed without one), or
    // nothing armed (kEnded: the state is the consumer's).
    [[nodiscard]] Look look(FiberFuture* wake, Entry& e, int& error) noexcept;
    // Runs `step` where the state may be touched: here when nothing is armed or this thread holds
    // the operation, else on the holder (parking the caller).
    template <class F>
    void onState(F&& step) noexcept;
    // Arms the operation on this carrier, whose ring `ring` is; a refused SQE undoes the state (and a
    // registration) and returns the errno.
    [[nodiscard]] int submitArm(detail::PbufRing* ring) noexcept;
    [[nodiscard]] bool popEntry(Entry& out) noexcept;
    [[nodiscard]] bool pushEntry(const Entry& e) noexcept;
    [[nodiscard]] ProvidedBuffer lease(const Entry& e) noexcept;

    ProvidedBufferPool& pool_;
    int fd_;
    Completion completion_;
    std::atomic<spindle::detail::Carrier*> holder_{nullptr};  // the carrier holding the operation, or null
    // --- the holder's while an operation is armed, else the consumer's ---
    Entry inline_[kInline];
    unsigned head_ = 0;           // next to take, in inline_
    unsigned count_ = 0;          // queued in inline_
    std::unique_ptr<std::vector<Entry>> spill_;  // queued behind inline_, when it was full
    size_t spillHead_ = 0;
    detail::PbufRing* armedRing_ = nullptr;  // the carrier ring the armed operation picks from
    int32_t endRes_ = 1;          // how the last operation ended: 0 EOF, < 0 -errno, 1 nothing to report
    bool armed_ = false;
    bool eof_ = false;
    bool delivered_ = false;      // the current operation delivered a buffer (so EINVAL is not "unsupported")
    bool multishot_ = true;       // false once the kernel refused it
    bool pausing_ = false;        // a cancel of the armed operation is on its way
    int broken_ = 0;              // a CQE's bytes could not be queued (ENOMEM): reported for good
    FiberFuture* waiter_ = nullptr;
    void (*readyFn_)(void*) = nullptr;  // notifyWhenReady()'s callback, while registered
    void* readyArg_ = nullptr;
    FiberFuture ended_;           // set by the last CQE of the armed operation
    struct {
        std::atomic<uint64_t> arms{0};
        std::atomic<uint64_t> buffers{0};
        std::atomic<uint64_t> oneShot{0};
    } stats_;
};

}  // namespace spindle::net
