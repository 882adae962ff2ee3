#pragma once
/// BufferGroup: receive buffers that a readiness driver (the epoll driver) picks when a descriptor has
/// data: the user-space counterpart of an io_uring provided-buffer ring. An op::kBufferSelect receive
/// names the group (Op::bufIndex) and its completion names the buffer it filled (op::kBufferPicked,
/// the id in flags >> op::kBufferShift), exactly as on io_uring, so a connection that waits holds no
/// buffer on either backend.
/// Buffers go out most recently returned first: a busy server keeps reusing the few that are warm in
/// its caches, where a kernel ring hands every buffer out in turn.
/// Errors: take() answers -1 when every buffer is out (the driver then fails the receive with ENOBUFS,
/// as io_uring does). Giving back a buffer that is not out (twice, or never taken) is a caller bug,
/// checked (abort).
/// Thread-safety: take() on the carrier whose driver holds the registration; giveBack() from any
/// thread. A spinlock orders the two (held for a push or a pop; uncontended in the common case:
/// leases end where they began).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>

#include "core/internal/sync_support.h"

namespace spindle::detail {

class BufferGroup {
public:
    /// `count` buffers (1..65536) of `size` bytes each, laid end to end at `base`; all free. The
    /// memory is the caller's and must outlive the group. Throws std::bad_alloc.
    BufferGroup(char* base, size_t size, unsigned count);
    BufferGroup(const BufferGroup&) = delete;
    BufferGroup& operator=(const BufferGroup&) = delete;

    /// A free buffer's id, now the caller's; -1 when none is free.
    [[nodiscard]] int take() noexcept {
        std::lock_guard<SpinLock> g(lock_);
        if (freeCount_ == 0) { return -1; }
        const uint16_t bid = free_[--freeCount_];
        out_[bid] = 1;
        return bid;
    }
    /// Makes buffer `bid` free again (any thread).
    void giveBack(uint16_t bid) noexcept;

    [[nodiscard]] char* data(uint16_t bid) const noexcept { return base_ + static_cast<size_t>(bid) * size_; }
    [[nodiscard]] size_t size() const noexcept { return size_; }
    [[nodiscard]] unsigned count() const noexcept { return count_; }
    /// Buffers free now (racy off the owner thread).
    [[nodiscard]] unsigned available() noexcept {
        std::lock_guard<SpinLock> g(lock_);
        return freeCount_;
    }

private:
    char* base_;
    size_t size_;
    unsigned count_;
    SpinLock lock_;
    std::unique_ptr<uint16_t[]> free_;  // a stack of free ids
    std::unique_ptr<uint8_t[]> out_;    // per id: 1 while taken
    unsigned freeCount_;
};

}  // namespace spindle::detail
