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

}  // namespace spindle
