// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The one path every fiber-blocking call takes through the carrier's I/O driver.

#include <cstdint>

#include "core/deadline.h"
#include "core/driver/op.h"

namespace spindle::detail {

/// Starts `op` on the current carrier's driver, parks until it completes, and returns its result
/// (`>= 0` value, `< 0` -errno). With a deadline the driver cancels the op when it passes and the
/// call returns -ETIMEDOUT; a deadline already passed returns -ETIMEDOUT without starting anything.
/// A fiber whose cancellation was requested gets -ECANCELED, at once or (in flight) once the driver
/// has ended the op. Off-fiber it runs the same operation synchronously (a private ring on the
/// io_uring backend, the system calls on epoll). `cqeFlags`, when given, receives the completion's
/// flags (op::kBufferPicked, ...; 0 when nothing was started).
int32_t submitAndWait(const op::Op& op, Deadline deadline = {}, uint32_t* cqeFlags = nullptr) noexcept;

}  // namespace spindle::detail
