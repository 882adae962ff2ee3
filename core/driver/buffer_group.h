// SPDX-License-Identifier: Apache-2.0
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
/// Thread-safety: take() and available() on the carrier whose driver holds the registration (the
/// owner, bound by bindOwner(); before that, on the one thread that uses the group); giveBack() from any
/// thread. Nothing takes a lock: a return on the owner's thread pushes on the free stack, and one from
/// anywhere else goes through an OwnerReturns (core/internal/owner_returns.h), which the owner drains
/// in its loop, or at once when take() finds the free stack empty.

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/internal/owner_returns.h"

namespace spindle::detail {

class BufferGroup {
public:
    /// `count` buffers (1..65536) of `size` bytes each, laid end to end at `base`; all free. The
    /// memory is the caller's and must outlive the group. Throws std::bad_alloc.
    BufferGroup(char* base, size_t size, unsigned count);
    BufferGroup(const BufferGroup&) = delete;
    BufferGroup& operator=(const BufferGroup&) = delete;

    /// Makes `owner` the carrier whose thread takes buffers and drains returns (the epoll driver that
    /// registered the group). Precondition: no buffer is out. Throws std::bad_alloc.
    void bindOwner(Carrier* owner);

    /// A free buffer's id, now the caller's; -1 when none is free. Returns from other threads that
    /// are still queued are drained first, so the most recently returned buffer goes out first.
    [[nodiscard]] int take() noexcept {
        if (returns_.pending()) { (void)returns_.drain(); }  // one load when none came back from elsewhere
        if (freeCount_ == 0) { return -1; }
        const uint16_t bid = free_[--freeCount_];
        out_[bid] = 1;
        return bid;
    }
    /// Makes buffer `bid` free again (any thread).
    void giveBack(uint16_t bid) noexcept {
        if (returns_.onOwner()) {
            freeHere(bid);
        } else {
            returns_.push(bid);
        }
    }
    /// Waits until no drain of returns is queued or running on the owner (before destroying the group).
    void settle() const noexcept { returns_.settle(); }

    [[nodiscard]] char* data(uint16_t bid) const noexcept { return base_ + static_cast<size_t>(bid) * size_; }
    [[nodiscard]] size_t size() const noexcept { return size_; }
    [[nodiscard]] unsigned count() const noexcept { return count_; }
    /// Buffers free now, returns from other threads included (drains them). Owner's thread.
    [[nodiscard]] unsigned available() noexcept {
        (void)returns_.drain();
        return freeCount_;
    }

private:
    char* base_;
    size_t size_;
    unsigned count_;
    void freeHere(uint16_t bid) noexcept;
    static void onReturn(void* self, uint16_t bid) noexcept { static_cast<BufferGroup*>(self)->freeHere(bid); }

    std::unique_ptr<uint16_t[]> free_;  // a stack of free ids
    std::unique_ptr<uint8_t[]> out_;    // per id: 1 while taken
    unsigned freeCount_;
    OwnerReturns returns_;              // returns made off the owner's thread
};

}  // namespace spindle::detail
