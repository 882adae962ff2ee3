// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Driver operations for the layers above core (net/): one operation with its completion flags,
/// multishot operations, and the current carrier's io_uring ring for registrations.
///
/// These are the building blocks of core/io.h, opened up so that another layer can add an operation
/// without reaching into core/internal/. An operation is described neutrally (core/driver/op.h);
/// the carrier's driver (io_uring or epoll) carries it out. Users of the runtime want core/io.h and
/// net/ instead.

#include <atomic>
#include <cstdint>
#include <optional>

#include "base/result.h"
#include "core/deadline.h"
#include "core/driver/op.h"
#include "core/internal/fiber.h"

namespace spindle {
class FiberFuture;
namespace detail {
class BufferGroup;
}
namespace uring {
class Ring;
}

/// What a completion said: `res` (>= 0 a value, < 0 -errno) and its flags (op::kBufferPicked and the
/// buffer id above op::kBufferShift, op::kSockNonempty, ...).
struct OpResult {
    int32_t res = 0;
    uint32_t flags = 0;
};

/// Starts one operation and parks until it completes, exactly as every call of core/io.h does (the
/// same deadline, cancellation and shutdown behaviour; off-fiber it runs synchronously), and returns
/// the result and flags. flags is 0 when the call failed before starting (ETIMEDOUT for a past
/// deadline, ECANCELED).
[[nodiscard]] OpResult submitOp(const op::Op& op, Deadline deadline = {}) noexcept;

/// The target of a multishot operation's completions. `fn` runs on the thread of the carrier whose
/// driver holds the operation, once per completion: it must not block, and it must be quick. The
/// operation has ended with the first completion whose flags lack op::kMore (an error, an explicit
/// cancel, runtime shutdown); only then, and after settleMultishot(), may the completion be destroyed.
struct MultishotCompletion : op::IoRequest {
    void (*fn)(MultishotCompletion* self, int32_t res, uint32_t flags) = nullptr;
    void* owner = nullptr;  // set by armMultishot: the carrier that holds it (for cancelMultishot)
    op::Op opStorage;       // armMultishot's copy of the op, which the request points at
    // cancelMultishot's message to the owner when sent from elsewhere, and whether it is on its way
    // (it is the completion's own: a cancel allocates nothing, and a second one while the first is
    // queued is folded into it).
    detail::Message cancelMsg;
    std::atomic<bool> cancelQueued{false};
};

/// Starts a multishot operation (op::acceptMultishot, op::recvMultishot) on the carrier whose thread
/// calls (from one of its fibers, or from a function it runs for Runtime::runOnCarrier); its
/// completions call `completion->fn` there, and runtime shutdown cancels it like any operation in
/// flight (a last completion with -ECANCELED). Returns the index of the carrier that holds it. A
/// driver may deliver completions before this returns: have the state `fn` reads ready first.
/// Errors: EPERM off-carrier (a plain thread); ECANCELED once shutdown has begun (nothing was queued); the errno of a
/// driver that refused it at once (EINVAL for an op it cannot run multishot; ENOBUFS on epoll for a
/// buffer group not registered there).
[[nodiscard]] Result<unsigned> armMultishot(const op::Op& op, MultishotCompletion* completion) noexcept;

/// Starts a one-shot operation that the calling fiber does not wait for: its completion calls
/// `completion->fn` on the carrier whose thread calls, as a multishot operation's last completion
/// would (flags without op::kMore), and cancelMultishot() and settleMultishot() apply to it alike.
/// Returns std::nullopt when that completion will follow, or the result of an operation that
/// finished at once (a readiness driver's first try, an operation the epoll driver runs on the
/// offload pool, which this call then waits for): `fn` is not called for it.
/// The op, copied into the completion, and the buffers it names must stay valid until the completion.
/// Errors (as a result): -EPERM off-carrier (a plain thread); -ECANCELED once shutdown has begun.
[[nodiscard]] std::optional<int32_t> startDetached(const op::Op& op, MultishotCompletion* completion) noexcept;

/// Asks the carrier holding `completion`'s operation to cancel it (through that carrier's driver,
/// sent as the completion's own message when the caller is elsewhere, a plain thread included);
/// returns at once. The operation's last completion follows: -ECANCELED, or whatever ended it first.
/// After the holding carrier has exited (shutdown ended every operation) it does nothing.
/// Precondition: armMultishot(..., completion) succeeded and the Runtime still exists.
/// Errors: none today (the message is the completion's own); the Result stays for callers' sake.
[[nodiscard]] Result<void> cancelMultishot(MultishotCompletion* completion) noexcept;

/// Waits (parks a fiber, yields a thread) until no cancelMultishot() message for `completion` is on its
/// way: call it after the operation's last completion and before destroying `completion`, which such a
/// message would otherwise touch. Returns at once in the usual case (none was sent, or it has run).
void settleMultishot(MultishotCompletion* completion) noexcept;

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
/// in its inbox, nothing its driver holds to submit or deliver (a fiber it would make ready), no
/// timer due. An operation queued now would cost the carrier an io_uring_enter of its own, and this
/// fiber a park and a resume, so a non-blocking system call that completes at once is the cheaper
/// way; with other work around, the ring batches, and a fiber that keeps sending does not keep the
/// others waiting. false off-fiber.
/// Cost: six loads on the carrier's own lines and the ring's, and a clock read when a timer is set.
[[nodiscard]] bool carrierOtherwiseIdle() noexcept;

/// Whether a send from the calling fiber should be one non-blocking system call made right here
/// rather than an operation handed to the driver. On the epoll backend always: its driver would make
/// the same call at once, after a request, a state lookup and the completion's bookkeeping (about
/// 100 ns of user CPU per send, 1.5 % of a small HTTP response's cost). On io_uring when
/// carrierOtherwiseIdle(). false off-fiber.
/// Cost: two loads on the epoll backend, carrierOtherwiseIdle()'s on io_uring.
[[nodiscard]] bool carrierSendsInline() noexcept;

/// Call after a send that carrierSendsInline() chose completed without waiting: it counts against the
/// carrier's budget of inline completions as the driver's first try would, so a fiber whose sockets
/// always have room still lets the carrier's other work have a turn every few sends.
/// Precondition: carrierSendsInline() was true, and the fiber has not blocked since.
void afterInlineSend() noexcept;

/// The ring of the carrier whose thread calls (a fiber running there, or a function run there by
/// Runtime::runOnCarrier), for registrations that must come from its owner's thread (SINGLE_ISSUER).
/// Valid until a fiber next blocks (it may migrate); null on a plain thread and on the epoll backend
/// (callers then take their fallback: heap receive buffers, plain fds).
[[nodiscard]] uring::Ring* currentRing() noexcept;

/// For a pool of receive buffers on a driver that picks them itself (the epoll backend, where
/// currentRing() is null): registers `group` as buffer group `id` with the driver of the carrier
/// whose thread calls, for op::recvSelect and op::recvMultishot there. Returns that carrier's index.
/// That carrier becomes the group's owner (BufferGroup::bindOwner): buffers given back elsewhere are
/// drained in its loop. Unregister on the same carrier (Runtime::runOnCarrier) and settle() the group
/// before it goes.
/// Errors: EPERM off-carrier; ENOTSUP on io_uring (register a provided-buffer ring with
/// currentRing() instead); EEXIST when `id` is taken there; ENOMEM.
[[nodiscard]] Result<unsigned> registerBufferGroupHere(uint16_t id, detail::BufferGroup* group) noexcept;
/// Undoes registerBufferGroupHere() on the calling carrier. Errors: EPERM off-carrier, ENOENT.
[[nodiscard]] Result<void> unregisterBufferGroupHere(uint16_t id) noexcept;

}  // namespace spindle
