// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Sends that the calling fiber does not wait for.
///
/// A fiber that answers a request and then waits for the next one pays, through the ring, for two
/// resumes per exchange: one when its send completes, one when the next request arrives. PostedSend
/// removes the first. post() hands the bytes to the carrier's driver and returns at once; the send's
/// completion is taken by the carrier without resuming the fiber, and the fiber looks at its result
/// only when it next posts or flushes, when the completion has nearly always come already (on
/// loopback and on any socket with room, the kernel sends while the carrier submits). The io_uring
/// floor loop of scripts/bench/ does the same with IOSQE_CQE_SKIP_SUCCESS; a fiber needs the
/// completion all the same, to know when its buffer is free.
///
/// One send is in flight at a time, and its bytes stay the caller's responsibility: they must stay
/// alive and unchanged until the next post(), flush() or the destructor returns (echo from a buffer
/// the next receive does not overwrite, or build the next response elsewhere).
///
/// Paths: with the fiber all its carrier has to do (carrierSendsInline(), and always on the epoll
/// backend) post() makes one non-blocking send(2) first and hands only what the socket did not take
/// to the driver. Off-fiber (a plain thread) post() sends everything before it returns.
///
/// Errors: an error belongs to the stream, not to one call. A failed send (EPIPE, ECONNRESET, ...)
/// is reported by the next post() or flush(), and by every one after it: once a send has failed,
/// nothing more is sent, since bytes after a gap would corrupt the stream. post() of more than
/// 0x7ffff000 bytes is EINVAL, and nothing is started.
/// Cancellation: a fiber cancelled while flush() waits gets ECANCELED; the send in flight is
/// cancelled too (the stream is broken from then on) and flush() returns once it has ended.
/// Thread-safety: one fiber or thread at a time, which may move between carriers; the completion
/// runs on the carrier that started the send.
/// Lifetime: the socket must stay open until flush() or the destructor returns.

#include <cstddef>
#include <cstdint>

#include "base/result.h"
#include "core/deadline.h"
#include "core/fiber_future.h"
#include "core/ring_ops.h"

namespace spindle::net {

class PostedSend {
public:
    /// For socket `fd` (a connected stream socket).
    explicit PostedSend(int fd) noexcept;
    /// With a send in flight: cancels it (bytes not yet sent are dropped; call flush() first to
    /// keep them) and waits for it to end.
    ~PostedSend();
    PostedSend(const PostedSend&) = delete;
    PostedSend& operator=(const PostedSend&) = delete;

    /// Waits for the send posted before (as flush() without a deadline, but not cancellable: the
    /// previous send nearly always ended already; a caller that must bound that wait, for a peer
    /// that stops reading, calls flush(deadline) first), then starts sending all of `buf[0..len)`
    /// and returns. `len` 0 only does the wait. It does not look at the fiber's cancellation: it
    /// starts no wait of its own beyond that one.
    /// Errors: the stream's (see above), in which case nothing of `buf` was sent; EINVAL (nothing started).
    [[nodiscard]] Result<void> post(const void* buf, size_t len) noexcept;
    /// Waits until every byte posted has left (is in the socket's send buffer), resending what a
    /// short send left over. Errors: the stream's; ETIMEDOUT when `deadline` passes first, and
    /// ECANCELED for a cancelled fiber, after which the send in flight was cancelled and the stream
    /// is broken (every later call reports the same error).
    [[nodiscard]] Result<void> flush(Deadline deadline = {}) noexcept;
    /// Whether a send was started and no call has settled it yet (its completion may have come).
    [[nodiscard]] bool inFlight() const noexcept { return inFlight_; }
    /// Whether the send in flight has completed, so that the next call will not wait for it.
    /// Precondition: inFlight().
    [[nodiscard]] bool ended() const noexcept { return completion_.done.isSet(); }

    /// Has `fn(arg)` called when the driver's completion says that every byte of the posted buffer
    /// has left, on the carrier that started the send, before a waiter is woken: for an owner that
    /// gives the buffer back there without resuming anything (it is free from then on). Not called
    /// for a post that left at once (post() returns with inFlight() false: the buffer is free), nor
    /// after a failed or short send (the next call settles it, and only then is the buffer free).
    /// On io_uring a send completes whole (MSG_WAITALL); the epoll driver completes one with what a
    /// single send(2) took once the socket had room, so a post larger than the socket's free space
    /// ends in the next call instead.
    /// `fn` must not block. Set it while no send is in flight.
    void setSentHook(void (*fn)(void* arg) noexcept, void* arg) noexcept {
        completion_.hook = fn;
        completion_.hookArg = arg;
    }

    struct Stats {
        uint64_t posted = 0;   // post() calls that sent something
        uint64_t detached = 0; // sends handed to the driver (the rest went at once)
        uint64_t waited = 0;   // times post() or flush() found the send in flight and parked
    };
    [[nodiscard]] Stats stats() const noexcept { return stats_; }

private:
    struct Completion : MultishotCompletion {
        FiberFuture done;
        void (*hook)(void* arg) noexcept = nullptr;
        void* hookArg = nullptr;
        bool last = false;  // the operation in flight sends all that is left of the post
    };
    static void onComplete(MultishotCompletion* self, int32_t res, uint32_t flags) noexcept;
    // Starts sending `rest_[0..restLen_)`: at once where the path says so, then through the driver.
    void start() noexcept;
    // Ends the send in flight: waits for its completion (cancelling it first after a timeout or a
    // cancel) and finishes a short one. 0 or an errno, which becomes the stream's error.
    int settle(Deadline deadline, bool cancellable) noexcept;
    // Sends what is left of the current buffer with the fiber waiting. 0 or an errno.
    int finishSynchronously(Deadline deadline) noexcept;

    int fd_;
    int error_ = 0;               // the stream's error, sticky
    bool inFlight_ = false;
    const char* rest_ = nullptr;  // what the send in flight (or the next to start) still has to send
    size_t restLen_ = 0;
    Stats stats_;
    Completion completion_;
};

}  // namespace spindle::net
