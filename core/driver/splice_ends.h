// SPDX-License-Identifier: Apache-2.0
#pragma once
// The two ends of a splice or tee, as both drivers wait on them: neither lets a call that waits for
// bytes or room sleep where the carrier cannot see it (epoll: the blocking call on the offload pool;
// io_uring: the worker that every splice and tee runs in). Each makes the call non-blocking and
// waits for the end that held it up: SPLICE_F_NONBLOCK covers the pipe ends, and a socket end must be
// O_NONBLOCK itself (splice(2) honours only the socket's own flag there).

#include <cstdint>

#include "core/driver/op.h"

namespace spindle::detail {

/// Sets O_NONBLOCK on `fd` unless it is set. 0, or -errno (EBADF).
int32_t setNonblocking(int fd) noexcept;

/// What prepareSpliceEnds() found besides pipes and sockets.
inline constexpr int32_t kSpliceOtherEnd = 1;

/// Looks at both ends of splice or tee `o` and makes a socket end O_NONBLOCK. 0 when both are pipes
/// or sockets; kSpliceOtherEnd when one is anything else (a regular file, a device: its own part of
/// the call may wait for the disk, which SPLICE_F_NONBLOCK does not cover); -errno (EBADF). Looked
/// up on each call: a number may have been closed and reused.
int32_t prepareSpliceEnds(const op::Op& o) noexcept;

/// prepareSpliceEnds() without looking for other ends: one fcntl per end that is O_NONBLOCK already
/// (a socket after its first splice, a pipe made so), an fstat and up to one more fcntl for one that
/// is not. 0, or -errno (EBADF).
int32_t makeSpliceEndsNonblocking(const op::Op& o) noexcept;

/// Which end of splice or tee `o`, which answered EAGAIN, to wait for: the input end when it has
/// nothing to give (kSpliceInput), else the output end when it has no room (kSpliceOutput); -EAGAIN
/// when both look ready (the call raced with a reader or a writer: try it again); -errno when
/// poll(2) fails. A regular file polls ready both ways, so the pipe end is the one named.
inline constexpr int32_t kSpliceInput = 0;
inline constexpr int32_t kSpliceOutput = 1;
int32_t spliceBlockedEnd(const op::Op& o) noexcept;

}  // namespace spindle::detail
