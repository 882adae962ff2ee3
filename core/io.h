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
/// Offsets: `kCurrentPosition` reads or writes at, and advances, the file
/// position, like read(2)/write(2); any other value acts like pread/pwrite.

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <chrono>
#include <cstddef>
#include <cstdint>

#include "base/result.h"

namespace spindle {

inline constexpr uint64_t kCurrentPosition = ~uint64_t{0};

/// A no-op through the ring (measures the round trip).
Result<void> nop() noexcept;
/// Up to `len` bytes (capped at 0x7ffff000, as read(2) does). 0 means end of file.
Result<size_t> read(int fd, void* buf, size_t len, uint64_t offset = kCurrentPosition) noexcept;
Result<size_t> write(int fd, const void* buf, size_t len, uint64_t offset = kCurrentPosition) noexcept;
Result<size_t> readv(int fd, const iovec* iov, int iovcnt, uint64_t offset = kCurrentPosition) noexcept;
Result<size_t> writev(int fd, const iovec* iov, int iovcnt, uint64_t offset = kCurrentPosition) noexcept;
Result<void> fsync(int fd) noexcept;
Result<void> fdatasync(int fd) noexcept;
/// Returns the new descriptor. `path` must stay valid until the call returns.
Result<int> openat(int dirfd, const char* path, int flags, mode_t mode = 0) noexcept;
inline Result<int> open(const char* path, int flags, mode_t mode = 0) noexcept {
    return openat(AT_FDCWD, path, flags, mode);
}
Result<void> close(int fd) noexcept;
Result<void> statx(int dirfd, const char* path, int flags, unsigned mask, struct statx* out) noexcept;
/// Parks the fiber for `duration` (the deadline heap, not the ring). Errors: ECANCELED.
Result<void> sleep(std::chrono::nanoseconds duration) noexcept;

}  // namespace spindle
