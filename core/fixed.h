// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Registered resources: buffers and files the kernel knows in advance, so an I/O on them skips
/// the per-call page pinning (buffers) and the fd-table lookup and reference count (files).
///
/// Each carrier owns a pool of registered buffers, allocated on its NUMA node and registered with
/// its own ring, and a table of registered files (direct descriptors). A registration belongs to
/// one ring, and a fiber may move between carriers, so every call here checks where it runs: on
/// the resource's carrier it uses the registered form (IORING_OP_READ_FIXED, IOSQE_FIXED_FILE);
/// elsewhere it falls back to the plain form, which gives the same result.
///
/// Fallback: when the kernel refuses a registration (ENOMEM under RLIMIT_MEMLOCK, EPERM, ...) the
/// carrier logs why once and keeps the memory as an ordinary pool; FixedBuffer::registered() says
/// which, and the calls below go through plain read/write. Nothing fails because of it.

#include <cstddef>
#include <cstdint>

#include "base/result.h"
#include "core/deadline.h"
#include "core/io.h"

namespace spindle {

namespace detail {
class FixedBufferPool;
class FixedFileTable;
}

/// One buffer of a carrier's registered pool. Move-only; the destructor gives it back to its pool
/// (from any thread or carrier).
class FixedBuffer {
public:
    FixedBuffer() noexcept = default;
    FixedBuffer(FixedBuffer&& other) noexcept;
    FixedBuffer& operator=(FixedBuffer&& other) noexcept;
    FixedBuffer(const FixedBuffer&) = delete;
    FixedBuffer& operator=(const FixedBuffer&) = delete;
    ~FixedBuffer();

    [[nodiscard]] bool valid() const noexcept { return pool_ != nullptr; }
    [[nodiscard]] char* data() const noexcept { return data_; }
    [[nodiscard]] size_t size() const noexcept { return size_; }
    /// The buffer's index in its ring's registered-buffer table.
    [[nodiscard]] unsigned index() const noexcept { return index_; }
    /// The carrier whose pool (and ring) it belongs to.
    [[nodiscard]] unsigned carrier() const noexcept { return carrier_; }
    /// Whether the pool is registered with the kernel (false: the fallback; plain I/O).
    [[nodiscard]] bool registered() const noexcept;

    /// Gives the buffer back now (the destructor does the same).
    void release() noexcept;

private:
    friend class detail::FixedBufferPool;
    detail::FixedBufferPool* pool_ = nullptr;
    char* data_ = nullptr;
    size_t size_ = 0;
    unsigned index_ = 0;
    unsigned carrier_ = 0;
};

/// Takes a free buffer from the pool of the carrier running the calling fiber (the pool has
/// RuntimeOptions::fixedBufferCount buffers of RuntimeOptions::fixedBufferSize bytes, page aligned).
/// Errors: EPERM off-fiber; ENOTSUP when the runtime has no pool (fixedBufferCount == 0);
/// ENOBUFS when every buffer of this carrier's pool is taken.
Result<FixedBuffer> acquireFixedBuffer() noexcept;

/// Reads up to `len` bytes at file `offset` into buf.data() + bufOffset. IORING_OP_READ_FIXED on the
/// buffer's carrier when registered; a plain read otherwise. Same results and errors as read();
/// EINVAL when [bufOffset, bufOffset + len) is not inside the buffer or `buf` is empty.
Result<size_t> read_fixed(int fd, FixedBuffer& buf, size_t bufOffset, size_t len, uint64_t offset,
                          Deadline deadline = {}) noexcept;
/// Writes `len` bytes from buf.data() + bufOffset at file `offset`; as read_fixed.
Result<size_t> write_fixed(int fd, const FixedBuffer& buf, size_t bufOffset, size_t len, uint64_t offset,
                           Deadline deadline = {}) noexcept;

/// A file descriptor installed in one carrier's registered-file table (a direct descriptor), plus
/// the descriptor itself for calls made anywhere else. Move-only; owns the descriptor.
///
/// The table has RuntimeOptions::fixedFileSlots slots per carrier, created empty at start-up
/// (io_uring_register_files_sparse, kernel 5.19). On the owning carrier a call on the FixedFile
/// names the slot (IOSQE_FIXED_FILE: no fd-table lookup, no file reference count per call);
/// elsewhere, off-fiber, or when the carrier could not register its table, it uses the plain fd.
///
/// Closing (close() or the destructor) empties the slot and closes the descriptor. On the owning
/// carrier the slot is emptied at once (one io_uring_register call); from another carrier or a
/// plain thread the request travels to the owner as a message (SINGLE_ISSUER: only the owner may
/// change its ring's registrations), and the slot is reused only once the owner has emptied it.
/// Until then the kernel's slot keeps the file open (a socket sees no FIN before that).
/// Thread-safety: a FixedFile may be used from any fiber or thread, but not concurrently with its
/// own close() or move.
/// Precondition: every FixedFile is closed or destroyed before its Runtime is destroyed (checked
/// there: the process aborts with a message otherwise).
class FixedFile {
public:
    FixedFile() noexcept = default;
    FixedFile(FixedFile&& other) noexcept;
    FixedFile& operator=(FixedFile&& other) noexcept;
    FixedFile(const FixedFile&) = delete;
    FixedFile& operator=(const FixedFile&) = delete;
    /// Same as close(), ignoring its result.
    ~FixedFile();

    [[nodiscard]] bool valid() const noexcept { return fd_ >= 0; }
    /// The plain descriptor (still owned by this FixedFile).
    [[nodiscard]] int fd() const noexcept { return fd_; }
    /// The slot in the owner's table, or -1 when the file is not registered (the table's fallback).
    [[nodiscard]] int slot() const noexcept { return slot_; }
    [[nodiscard]] bool registered() const noexcept { return slot_ >= 0; }
    /// The carrier whose table holds it.
    [[nodiscard]] unsigned carrier() const noexcept { return carrier_; }

    /// Empties the slot (see the class comment) and closes the descriptor; the FixedFile becomes empty.
    /// Errors: EBADF when it is empty; close(2)'s errno (EIO, ...), after which the descriptor is
    /// closed all the same (as Linux does). A failure to empty the slot is logged by the owner, not
    /// returned (it means a bug: the slot is leaked, never reused).
    Result<void> close() noexcept;

private:
    friend Result<FixedFile> registerFile(int fd) noexcept;
    friend class detail::FixedFileTable;
    detail::FixedFileTable* table_ = nullptr;
    int fd_ = -1;
    int slot_ = -1;
    unsigned carrier_ = 0;
};

/// Installs `fd` in the registered-file table of the carrier running the calling fiber and takes
/// ownership of it: the returned FixedFile closes it. When the carrier has no registered table (its
/// registration failed at start-up, logged then) it still succeeds, with registered() == false.
/// Errors (the caller keeps `fd`): EPERM off-fiber; ENOTSUP when fixedFileSlots == 0; EBADF when `fd`
/// is not an open descriptor; ENFILE when every slot of this carrier's table is taken.
Result<FixedFile> registerFile(int fd) noexcept;

/// read() on a FixedFile: the registered slot on the owning carrier, the plain fd elsewhere; same results.
/// Errors: as read(); EBADF for an empty FixedFile.
Result<size_t> read(const FixedFile& file, void* buf, size_t len, uint64_t offset = kCurrentPosition,
                    Deadline deadline = {}) noexcept;
/// write() on a FixedFile; as read(const FixedFile&, ...).
Result<size_t> write(const FixedFile& file, const void* buf, size_t len, uint64_t offset = kCurrentPosition,
                     Deadline deadline = {}) noexcept;
/// read_fixed() on a FixedFile: each of the two registrations is used where the calling fiber runs on
/// its carrier. Errors: as read_fixed(); EBADF for an empty FixedFile.
Result<size_t> read(const FixedFile& file, FixedBuffer& buf, size_t bufOffset, size_t len, uint64_t offset,
                    Deadline deadline = {}) noexcept;
/// write_fixed() on a FixedFile; as above.
Result<size_t> write(const FixedFile& file, const FixedBuffer& buf, size_t bufOffset, size_t len, uint64_t offset,
                     Deadline deadline = {}) noexcept;

}  // namespace spindle
