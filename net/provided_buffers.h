#pragma once
/// ProvidedBufferPool: receive buffers the kernel picks when data arrives (IORING_REGISTER_PBUF_RING,
/// Linux 5.19), so a connection that waits holds no buffer of its own.
///
/// A pool is a buffer group: on each carrier where it is first used, a ring of `count` buffers of
/// `size` bytes is registered with that carrier's io_uring (on that carrier's thread, so
/// SINGLE_ISSUER holds). recv() posts a receive with IOSQE_BUFFER_SELECT; the CQE names the buffer
/// the kernel filled, which the caller holds as a ProvidedBuffer lease until it drops it; the buffer
/// then goes back to the ring of the carrier it came from (from any thread: returns are serialised
/// per carrier by a spinlock, the kernel only ever reads the ring's tail).
/// Fallback: where registration fails (an older kernel: EINVAL; a memlock limit: ENOMEM), off-fiber,
/// and when a carrier's ring has run out of buffers (ENOBUFS), recv() receives into a buffer from
/// the heap instead, and counts it (stats()). The caller sees the same ProvidedBuffer either way.
/// Lifetime: the pool must outlive every lease and the runtime's carriers must outlive the pool
/// (destroy it before Runtime::shutdown(), or let it live in a fiber).
/// Errors: recv() returns the stream's errors; a lease of size 0 is end of stream.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "base/result.h"
#include "core/deadline.h"

namespace spindle::net {

class ProvidedBufferPool;
namespace detail {
struct PbufRing;  // one carrier's registered ring of a pool (provided_buffers.cpp)
}

/// A filled receive buffer, owned until destroyed or released.
class ProvidedBuffer {
public:
    ProvidedBuffer() noexcept = default;
    ProvidedBuffer(ProvidedBuffer&& o) noexcept;
    ProvidedBuffer& operator=(ProvidedBuffer&& o) noexcept;
    ProvidedBuffer(const ProvidedBuffer&) = delete;
    ProvidedBuffer& operator=(const ProvidedBuffer&) = delete;
    ~ProvidedBuffer() { release(); }

    [[nodiscard]] char* data() const noexcept { return data_; }
    [[nodiscard]] size_t size() const noexcept { return size_; }
    [[nodiscard]] size_t capacity() const noexcept { return capacity_; }
    [[nodiscard]] bool empty() const noexcept { return data_ == nullptr; }
    /// Whether the kernel picked it from a registered ring (false: the heap fallback).
    [[nodiscard]] bool provided() const noexcept { return owner_ != nullptr; }
    /// Gives the buffer back now.
    void release() noexcept;

private:
    friend class ProvidedBufferPool;
    char* data_ = nullptr;
    size_t size_ = 0;
    size_t capacity_ = 0;
    detail::PbufRing* owner_ = nullptr;  // the carrier ring it returns to, or null for a heap buffer
    uint16_t bid_ = 0;
};

struct ProvidedBufferOptions {
    unsigned count = 1024;       // buffers per carrier: a power of two, 1..32768
    size_t size = 4096;          // bytes each: 1..1 MiB
};

struct ProvidedBufferStats {
    uint64_t providedRecvs = 0;  // receives served from a registered ring
    uint64_t fallbackRecvs = 0;  // receives into a heap buffer (no ring here, off-fiber, or ENOBUFS)
    uint64_t exhausted = 0;      // ENOBUFS answers (a ring ran out of buffers)
    unsigned carriersRegistered = 0;
    int registerError = 0;       // the errno of the first refused registration, or 0
};

class ProvidedBufferPool {
public:
    /// Errors: EINVAL for options out of range.
    [[nodiscard]] static Result<std::unique_ptr<ProvidedBufferPool>> create(const ProvidedBufferOptions& options = {}) noexcept;
    ~ProvidedBufferPool();
    ProvidedBufferPool(const ProvidedBufferPool&) = delete;
    ProvidedBufferPool& operator=(const ProvidedBufferPool&) = delete;

    /// One receive on socket `fd` into a buffer of the pool (see the header comment).
    [[nodiscard]] Result<ProvidedBuffer> recv(int fd, Deadline deadline = {}) noexcept;
    [[nodiscard]] ProvidedBufferStats stats() const noexcept;
    [[nodiscard]] size_t bufferSize() const noexcept { return options_.size; }

    struct Impl;

private:
    explicit ProvidedBufferPool(const ProvidedBufferOptions& options);
    detail::PbufRing* ringHere() noexcept;
    ProvidedBufferOptions options_;
    std::unique_ptr<Impl> impl_;
};

}  // namespace spindle::net
