// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Fiber-blocking I/O calls on the carrier's io_uring ring.
///
/// Each call takes an SQE from the current carrier's ring, points its
/// user_data at a FiberFuture on the caller's stack, and parks the fiber; the
/// SQE leaves with the carrier's next batch, and the CQE wakes the fiber. No
/// call allocates or makes a system call of its own.
///
/// Errors: results are a value or an errno (Result), never an exception:
/// the kernel's errno as is (EBADF, ENOENT, ...), and ECANCELED once the
/// runtime is shutting down (in-flight calls are cancelled; new ones fail at
/// once). A call returns only after its CQE arrived, so the buffers it was
/// given are never written after it returns.
/// Off-fiber: called from a plain thread, a call runs synchronously on a small
/// ring private to that thread (created on first use); same results.
/// Deadlines: every call but sleep and ftruncate takes a Deadline last (default: none); see
/// core/deadline.h. ETIMEDOUT when it cancelled the operation; the call still returns only after
/// the operation's completion, and an operation that finished first returns its own result.
/// Cancellation: a fiber whose FiberHandle::cancel() was called gets ECANCELED from every call
/// until it calls this_fiber::acknowledgeCancellation() (core/fiber.h); a call in flight is
/// cancelled on the ring and returns once the kernel has answered.
/// Offsets: `kCurrentPosition` reads or writes at, and advances, the file
/// position, like read(2)/write(2); any other value acts like pread/pwrite.

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <chrono>
#include <cstddef>
#include <cstdint>

#include "base/result.h"
#include "core/deadline.h"

namespace spindle {

inline constexpr uint64_t kCurrentPosition = ~uint64_t{0};

/// A no-op through the ring (measures the round trip).
Result<void> nop(Deadline deadline = {}) noexcept;
/// Up to `len` bytes (capped at 0x7ffff000, as read(2) does). 0 means end of file.
Result<size_t> read(int fd, void* buf, size_t len, uint64_t offset = kCurrentPosition, Deadline deadline = {}) noexcept;
Result<size_t> write(int fd, const void* buf, size_t len, uint64_t offset = kCurrentPosition, Deadline deadline = {}) noexcept;
Result<size_t> readv(int fd, const iovec* iov, int iovcnt, uint64_t offset = kCurrentPosition, Deadline deadline = {}) noexcept;
Result<size_t> writev(int fd, const iovec* iov, int iovcnt, uint64_t offset = kCurrentPosition, Deadline deadline = {}) noexcept;
Result<void> fsync(int fd, Deadline deadline = {}) noexcept;
Result<void> fdatasync(int fd, Deadline deadline = {}) noexcept;
/// Returns the new descriptor. `path` must stay valid until the call returns.
Result<int> openat(int dirfd, const char* path, int flags, mode_t mode = 0, Deadline deadline = {}) noexcept;
inline Result<int> open(const char* path, int flags, mode_t mode = 0, Deadline deadline = {}) noexcept {
    return openat(AT_FDCWD, path, flags, mode, deadline);
}
/// openat2(2): openat() with `resolve` (RESOLVE_BENEATH, RESOLVE_NO_SYMLINKS, ... from
/// <linux/openat2.h>) restricting how `path` is looked up; O_CLOEXEC is added to `flags`. Kernel 5.6
/// (both the system call and the ring's operation).
/// Errors: the kernel's, among them EXDEV for a path (or a symbolic link in it) that leads out of
/// `dirfd` under RESOLVE_BENEATH, ELOOP for a symbolic link under RESOLVE_NO_SYMLINKS, EINVAL for an
/// unknown flag or resolve bit (and from a ring that lacks the operation), ENOSYS for a kernel without
/// openat2(2) on the epoll backend; EFAULT for a null path.
Result<int> openat2(int dirfd, const char* path, uint64_t flags, mode_t mode, uint64_t resolve, Deadline deadline = {}) noexcept;
Result<void> close(int fd, Deadline deadline = {}) noexcept;
Result<void> statx(int dirfd, const char* path, int flags, unsigned mask, struct statx* out, Deadline deadline = {}) noexcept;
/// fallocate(2): allocates, or with `mode` punches or zeroes, [offset, offset + len). Kernel 5.6.
/// Errors: EINVAL for len 0 or a range past INT64_MAX; EOPNOTSUPP where the file system lacks `mode`.
Result<void> fallocate(int fd, int mode, uint64_t offset, uint64_t len, Deadline deadline = {}) noexcept;
/// ftruncate(2): sets the file's size to `length`. io_uring's FTRUNCATE needs Linux 6.9 and a liburing
/// newer than Debian 12's 2.3, so this runs on the runtime's offload pool (off-fiber: inline).
/// Errors: EINVAL for a length past INT64_MAX; EBADF, EINVAL for a non-regular file; ECANCELED during shutdown.
Result<void> ftruncate(int fd, uint64_t length) noexcept;
/// unlinkat(2): removes a name, or an empty directory with AT_REMOVEDIR. Kernel 5.11.
/// Errors: ENOENT, EISDIR, ENOTDIR, ENOTEMPTY as the kernel gives them; EFAULT for a null path.
Result<void> unlinkat(int dirfd, const char* path, int flags, Deadline deadline = {}) noexcept;
/// renameat2(2): `flags` takes RENAME_NOREPLACE, RENAME_EXCHANGE, RENAME_WHITEOUT. Kernel 5.11.
/// Errors: EEXIST (RENAME_NOREPLACE), ENOENT, ENOTEMPTY as the kernel gives them; EFAULT for a null path.
Result<void> renameat(int olddirfd, const char* oldpath, int newdirfd, const char* newpath,
                      unsigned flags = 0, Deadline deadline = {}) noexcept;
/// mkdirat(2); the process umask applies to `mode`. Kernel 5.15.
/// Errors: EEXIST, ENOENT, ENOTDIR as the kernel gives them; EFAULT for a null path.
Result<void> mkdirat(int dirfd, const char* path, mode_t mode, Deadline deadline = {}) noexcept;
/// Parks until `fd` reports one of `events` (or POLLERR/POLLHUP) and returns the revents mask, as a
/// one-fd poll(2) without a timeout would: the way to await any pollable kernel object (pipe, eventfd,
/// timerfd, signalfd, pidfd, socket). One-shot: each call arms the poll once. Kernel 5.1.
/// Errors: EINVAL when `events` holds a bit that poll(2) does not define as an event to wait for
/// (POLLNVAL, POLLFREE, POLL_BUSY_LOOP, or a sign-extended mask); EBADF; ECANCELED at shutdown.
Result<short> poll(int fd, short events, Deadline deadline = {}) noexcept;
/// splice(2): moves up to `len` bytes (capped like read) between two descriptors, one of them a pipe.
/// An offset of -1 uses and advances the file position, as a NULL offset does for splice(2); a pipe
/// takes only -1. Returns 0 at end of input. Kernel 5.7.
/// Waiting: a call waits, like a receive, until its input has bytes and its output room, and no
/// thread sleeps meanwhile: the call is made non-blocking (SPLICE_F_NONBLOCK; a socket end is made
/// O_NONBLOCK, which spindle's calls on it do not notice from Linux 5.12 on: io_uring waits on such a
/// socket as on a blocking one, measured on 6.18; before 5.12 a read or write op, not a recv or send,
/// on it answers EAGAIN) and waits for the end that held it up
/// (epoll: parked on the carrier; io_uring: a poll on the ring, so the io-wq worker that runs every
/// splice is free at once). A regular-file or device end may still wait for the disk: in the io-wq
/// worker on io_uring, on the offload pool on epoll. A cancel ends the wait with ECANCELED, and
/// nothing has moved. With SPLICE_F_NONBLOCK in `flags` the call does not wait for a pipe end: EAGAIN,
/// splice(2)'s meaning, on both backends; a socket end answers EAGAIN when it is O_NONBLOCK (on epoll
/// it always is: the driver makes it so).
/// `deadline`: ETIMEDOUT once it passes, moving nothing. (On io_uring it is a timeout of its own that
/// cancels the call: the kernel never fires a linked timeout on a splice or tee blocked in an io_uring
/// worker, kernel 6.18, measured.)
/// Errors: EINVAL when neither fd is a pipe, or for SPLICE_F_FD_IN_FIXED (registered files belong to
/// one carrier's ring, which a fiber cannot name); ESPIPE for an offset on a pipe; EBADF; ECANCELED;
/// ETIMEDOUT (see `deadline`).
Result<size_t> splice(int fdIn, int64_t offIn, int fdOut, int64_t offOut, size_t len, unsigned flags, Deadline deadline = {}) noexcept;
/// tee(2): copies up to `len` bytes from pipe `fdIn` to pipe `fdOut` without consuming them. Kernel 5.8.
/// Waits, is cancelled and honours `deadline` as splice() does.
/// Errors: EINVAL when either fd is not a pipe, both name the same pipe, or for SPLICE_F_FD_IN_FIXED;
/// ECANCELED; ETIMEDOUT.
Result<size_t> tee(int fdIn, int fdOut, size_t len, unsigned flags, Deadline deadline = {}) noexcept;
/// Parks the fiber for `duration` (the deadline heap, not the ring). Errors: ECANCELED.
Result<void> sleep(std::chrono::nanoseconds duration) noexcept;

}  // namespace spindle
