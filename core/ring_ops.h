#pragma once
/// Ring operations for the layers above core (net/): one operation with its CQE flags, multishot
/// operations, and the current carrier's ring for registrations.
///
/// These are the building blocks of core/io.h, opened up so that another layer can add an operation
/// without reaching into core/internal/. Users of the runtime want core/io.h and net/ instead.

#include <liburing.h>

#include <cstdint>

#include "base/result.h"
#include "core/deadline.h"

namespace spindle {
class FiberFuture;
namespace uring {
class Ring;
}

/// Fills one SQE from `ctx`; may set sqe->flags (IOSQE_BUFFER_SELECT, say) but not IOSQE_IO_LINK.
using PrepareSqe = void (*)(io_uring_sqe* sqe, const void* ctx);

/// What a CQE said: `res` (>= 0 a value, < 0 -errno) and its flags (IORING_CQE_F_BUFFER and the
/// buffer id above IORING_CQE_BUFFER_SHIFT, IORING_CQE_F_SOCK_NONEMPTY, ...).
struct OpResult {
    int32_t res = 0;
    uint32_t flags = 0;
};

/// Submits one operation and parks until its CQE, exactly as every call of core/io.h does (the same
/// deadline, cancellation and shutdown behaviour; off-fiber it runs on the thread's private ring),
/// and returns the CQE's result and flags. flags is 0 when the call failed before submitting
/// (ETIMEDOUT for a past deadline, ECANCELED).
[[nodiscard]] OpResult submitOp(PrepareSqe prepare, const void* ctx, Deadline deadline = {}) noexcept;

/// The target of a multishot operation's CQEs. `fn` runs on the thread of the carrier whose ring
/// holds the operation, once per CQE, in the carrier's dispatch: it must not block, and it must be
/// quick. The operation has ended with the first CQE whose flags lack IORING_CQE_F_MORE (an error,
/// an explicit cancel, runtime shutdown); only then may the completion be destroyed.
struct MultishotCompletion {
    void (*fn)(MultishotCompletion* self, int32_t res, uint32_t flags) = nullptr;
    void* owner = nullptr;  // set by armMultishot: the carrier that holds it (for cancelMultishot)
};

/// Queues a multishot operation (IORING_OP_ACCEPT with IORING_ACCEPT_MULTISHOT, a multishot recv or
/// poll, ...) on the calling fiber's carrier; its CQEs call `completion->fn` there, and runtime
/// shutdown cancels it like any operation in flight (a last CQE with -ECANCELED).
/// Returns the index of the carrier that holds it.
/// Errors: EPERM off-fiber; ECANCELED once shutdown has begun (nothing was queued).
[[nodiscard]] Result<unsigned> armMultishot(PrepareSqe prepare, const void* ctx, MultishotCompletion* completion) noexcept;

/// Asks the carrier holding `completion`'s operation to cancel it (IORING_OP_ASYNC_CANCEL on that ring,
/// sent as a message when the caller is elsewhere, a plain thread included); returns at once. The
/// operation's last CQE follows: -ECANCELED, or whatever ended it first.
/// Precondition: armMultishot(..., completion) succeeded and the runtime has not been joined.
/// Errors: ENOMEM when the message to another carrier cannot be allocated (nothing was sent).
[[nodiscard]] Result<void> cancelMultishot(MultishotCompletion* completion) noexcept;

/// Parks the calling fiber until `future` is set by `completion`'s handler, for a consumer of a
/// multishot operation's CQEs. The handler must set the future (FiberFuture::set) for the CQE the
/// consumer waits for, and always for the operation's last CQE.
/// Returns the future's result; -ETIMEDOUT when `deadline` passes first; -ECANCELED when the fiber is
/// cancelled (at once, without parking, when a cancellation is pending).
/// Cost: for a pinned fiber on the carrier that holds the operation, without a deadline, nothing
/// beyond the park: a
/// FiberHandle::cancel() there is delivered by cancelling the operation itself, so the consumer
/// then sees its last CQE (-ECANCELED) through the future, and must expect the operation to have
/// ended. Otherwise (a fiber that may migrate, another carrier, a thread, a deadline) the wait is FiberFuture::waitWithTimeout (a timer), and after
/// -ETIMEDOUT or -ECANCELED the future may still be set later: the caller withdraws it, as there.
/// Precondition: on a fiber or a plain thread; armMultishot(..., completion) succeeded; the future is
/// not set and has no other waiter.
[[nodiscard]] int32_t waitMultishot(FiberFuture* future, MultishotCompletion* completion, Deadline deadline = {}) noexcept;

/// Whether the calling fiber is all its carrier has to do right now: no other fiber ready, no message
/// in its inbox, no SQE waiting to be submitted, no CQE or task work waiting to be reaped (a fiber it
/// would make ready), no timer due. An operation queued now would cost the carrier an io_uring_enter
/// of its own, and this fiber a park and a resume, so a non-blocking system call that completes at
/// once is the cheaper way; with other work around, the ring batches, and a fiber that keeps sending
/// does not keep the others waiting. false off-fiber.
/// Cost: six loads on the carrier's own lines and the ring's, and a clock read when a timer is set.
[[nodiscard]] bool carrierOtherwiseIdle() noexcept;

/// The ring of the carrier running the calling fiber, for registrations that must come from its
/// owner's thread (SINGLE_ISSUER). Valid until the fiber next blocks (it may migrate); null off-fiber.
[[nodiscard]] uring::Ring* currentRing() noexcept;

}  // namespace spindle
