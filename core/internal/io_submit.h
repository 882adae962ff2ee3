#pragma once
/// The one path every fiber-blocking call takes through the ring.

#include <liburing.h>

#include <cstdint>

namespace spindle::detail {

/// Fills one SQE; `ctx` carries the call's arguments.
using PrepareSqe = void (*)(io_uring_sqe* sqe, const void* ctx);

/// Prepares one SQE on the current carrier's ring, parks until its CQE, and
/// returns cqe->res (`>= 0` value, `< 0` -errno). Off-fiber it runs the same
/// operation synchronously on the thread's private ring.
int32_t submitAndWait(PrepareSqe prepare, const void* ctx) noexcept;

}  // namespace spindle::detail
