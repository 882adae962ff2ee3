#pragma once
/// The one path every fiber-blocking call takes through the ring.

#include <liburing.h>

#include <cstdint>

#include "core/fiber_future.h"

#include "core/deadline.h"
#include "core/ring_ops.h"

namespace spindle::detail {

/// Fills one SQE; `ctx` carries the call's arguments. It may set sqe->flags (IOSQE_FIXED_FILE, say);
/// IOSQE_IO_LINK is added by submitAndWait when there is a deadline.
using PrepareSqe = spindle::PrepareSqe;

/// A carrier-local future that also keeps the CQE's flags (Tag::kLocalFutureFlags).
struct FlaggedFuture {
    FiberFuture future;
    uint32_t flags = 0;
};

/// Prepares one SQE on the current carrier's ring, parks until its CQE, and returns cqe->res
/// (`>= 0` value, `< 0` -errno). With a deadline the SQE is linked to an IORING_OP_LINK_TIMEOUT and
/// an operation the timeout cancelled returns -ETIMEDOUT; a deadline already passed returns
/// -ETIMEDOUT without submitting. A fiber whose cancellation was requested gets -ECANCELED, at once
/// or (in flight) once the kernel answered the cancel. Off-fiber it runs the same operation
/// synchronously on the thread's private ring. `cqeFlags`, when given, receives the CQE's flags
/// (0 when nothing was submitted).
int32_t submitAndWait(PrepareSqe prepare, const void* ctx, Deadline deadline = {}, uint32_t* cqeFlags = nullptr) noexcept;

/// The absolute CLOCK_MONOTONIC timespec the kernel's timeouts take.
inline __kernel_timespec toKernelTimespec(uint64_t ns) noexcept {
    __kernel_timespec ts{};
    ts.tv_sec = static_cast<int64_t>(ns / 1000000000u);
    ts.tv_nsec = static_cast<long long>(ns % 1000000000u);
    return ts;
}

}  // namespace spindle::detail
