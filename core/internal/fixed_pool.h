// SPDX-License-Identifier: Apache-2.0
#pragma once
/// A carrier's registered resources (core/fixed.h): its pool of registered buffers and its table of
/// registered files. Each Carrier holds one of each by value; both are set up on the carrier's thread
/// and registered with its ring, which only that thread may do (SINGLE_ISSUER).
///
/// Life cycle (both): setUp() on the carrier thread during Carrier::setUp; unregister() on the carrier
/// thread once its loop has ended (the ring is still open); destroy() from ~Carrier, after every
/// carrier thread is joined, which checks that users gave everything back and frees the memory. The
/// memory outlives the registration, so a buffer released late (by a plain thread, after the loop
/// ended but before the Runtime is destroyed) still lands in live memory.

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "base/result.h"
#include "core/fixed.h"
#include "core/internal/fiber.h"
#include "core/internal/sync_support.h"

namespace spindle::numa {
class Topology;
}
namespace spindle::uring {
class Ring;
}

namespace spindle::detail {

class Carrier;

/// `count` page-aligned buffers of `size` bytes in one mapping, registered with the owner's ring
/// when the kernel allows it.
///
/// Memory: on the owner's NUMA node (numa::Topology::allocOnNode) when the runtime has a topology
/// and the carrier is bound; otherwise anonymous mmap. The reason for a fallback is logged once per
/// process. The memory is zeroed on first touch, and registration pins (faults in) every page.
/// Thread-safety: acquire() runs on the owner carrier (acquireFixedBuffer takes from the caller's
/// own pool); release() may run on any thread. The free list is a LIFO stack of indexes under a
/// SpinLock: both sides are a few instructions, contention is rare (releases from elsewhere), and a
/// LIFO hands out the most recently used (cache-warm) buffer first. An MPSC return list drained by
/// the owner would save the lock on the owner's side but need a node per buffer and a drain point
/// in the loop; the lock is simpler and as fast uncontended.
class FixedBufferPool {
public:
    FixedBufferPool() noexcept = default;
    ~FixedBufferPool();
    FixedBufferPool(const FixedBufferPool&) = delete;
    FixedBufferPool& operator=(const FixedBufferPool&) = delete;

    /// Maps the buffers and tries to register them with `ring` (null, on the epoll backend: mapped,
    /// never registered, so every call takes the plain form). `count` 0: no pool (acquire gives
    /// ENOTSUP). A refused registration is logged (warn: the errno, RLIMIT_MEMLOCK, the pool's size)
    /// and leaves the pool usable, unregistered.
    /// Precondition: on the carrier thread that owns `ring`; called once.
    /// Errors: ENOMEM when the memory cannot be had (the carrier then fails to start).
    [[nodiscard]] Result<void> setUp(uring::Ring* ring, unsigned carrier, unsigned count, size_t size,
                                     const numa::Topology* topology, int boundPu) noexcept;
    /// Unregisters the buffers from the ring, if registered. Precondition: on the owner thread, the
    /// ring still open, no I/O in flight. The memory stays until destroy().
    void unregister() noexcept;
    /// Frees the memory. Precondition: no carrier thread runs; every buffer was released (checked:
    /// aborts with a message naming the carrier and the count otherwise).
    void destroy() noexcept;

    /// A free buffer. Errors: ENOTSUP without a pool; ENOBUFS when every buffer is taken.
    [[nodiscard]] Result<FixedBuffer> acquire() noexcept;
    /// Gives buffer `index` back (any thread).
    void release(unsigned index) noexcept;

    /// The pool `buffer` came from (nullptr for an empty FixedBuffer).
    [[nodiscard]] static const FixedBufferPool* of(const FixedBuffer& buffer) noexcept { return buffer.pool_; }
    [[nodiscard]] bool registered() const noexcept { return registered_.load(std::memory_order_relaxed); }
    [[nodiscard]] unsigned count() const noexcept { return count_; }
    [[nodiscard]] size_t bufferSize() const noexcept { return size_; }
    /// Buffers handed out and not yet released (a racy snapshot from other threads).
    [[nodiscard]] unsigned outstanding() const noexcept;

private:
    uring::Ring* ring_ = nullptr;
    const numa::Topology* topology_ = nullptr;  // non-null: memory_ came from allocOnNode
    char* memory_ = nullptr;                    // count_ * size_ bytes, page aligned
    size_t bytes_ = 0;
    size_t size_ = 0;
    unsigned count_ = 0;
    unsigned carrier_ = 0;
    std::atomic<bool> registered_{false};       // written by the owner; read anywhere

    mutable SpinLock lock_;
    // Invariant (under lock_): free_[0, freeCount_) are the indexes of the free buffers, each once.
    std::unique_ptr<uint32_t[]> free_;
    unsigned freeCount_ = 0;
};

/// The owner's table of registered files: which slots are free, and the messages that carry a
/// close from another thread.
///
/// Thread-safety: install() and removeOnOwner() on the owner thread only (they call io_uring_register);
/// requestRemove() on any thread: on the owner it removes at once, elsewhere it posts the slot's own
/// Message (Kind::kRemoveFixedFile) to the owner, whose drainInbox calls onRemoveMessage(). Each slot
/// has exactly one Message and a slot is posted at most once per installation, and becomes free only
/// when the owner handles that message, so a Message is never in the inbox twice. The free list is
/// therefore owner-only and needs no lock.
class FixedFileTable {
public:
    FixedFileTable() noexcept = default;
    FixedFileTable(const FixedFileTable&) = delete;
    FixedFileTable& operator=(const FixedFileTable&) = delete;

    /// Creates the sparse table on `ring`. `slots` 0: no table (registerFile gives ENOTSUP). A refused
    /// registration is logged (warn, with the errno and RLIMIT_NOFILE) and every FixedFile of this
    /// carrier then uses its plain fd.
    /// Precondition: on the owner thread; called once.
    /// Errors: ENOMEM when the slot array cannot be allocated (the carrier then fails to start).
    [[nodiscard]] Result<void> setUp(Carrier* owner, uring::Ring* ring, unsigned slots) noexcept;
    /// Unregisters the table, if registered. Precondition: owner thread, ring open, no I/O in flight.
    void unregister() noexcept;
    /// Checks that every FixedFile was closed (aborts with a message otherwise) and frees the slots.
    /// Precondition: no carrier thread runs.
    void destroy() noexcept;

    /// Installs `fd` in a free slot: the slot, or -1 when the table is not registered (fallback).
    /// Precondition: on the owner thread. Errors: ENOTSUP without a table; EBADF for a bad fd;
    /// ENFILE when no slot is free.
    [[nodiscard]] Result<int> install(int fd) noexcept;
    /// Counts a FixedFile gone (closed or destroyed) and, for slot >= 0, empties that slot: at once on
    /// the owner thread, else by message. Any thread.
    void requestRemove(int slot) noexcept;
    /// The owner's side of a message from requestRemove().
    void onRemoveMessage(Message* message) noexcept;

    /// The table `file` belongs to (nullptr for an empty FixedFile).
    [[nodiscard]] static const FixedFileTable* of(const FixedFile& file) noexcept { return file.table_; }
    [[nodiscard]] bool registered() const noexcept { return registered_.load(std::memory_order_relaxed); }
    [[nodiscard]] unsigned slots() const noexcept { return slots_; }
    [[nodiscard]] unsigned carrier() const noexcept;

private:
    struct Slot : Message {
        int32_t nextFree = -1;  // owner-only free-list link
    };

    void removeOnOwner(unsigned slot) noexcept;

    Carrier* owner_ = nullptr;
    uring::Ring* ring_ = nullptr;
    std::unique_ptr<Slot[]> slot_;
    unsigned slots_ = 0;
    int32_t freeHead_ = -1;                // owner-only
    std::atomic<bool> registered_{false};  // written by the owner; read anywhere
    // FixedFiles handed out and not yet closed: decremented by requestRemove() on the closing thread.
    std::atomic<uint32_t> open_{0};
};

}  // namespace spindle::detail
