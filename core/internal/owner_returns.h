// SPDX-License-Identifier: Apache-2.0
#pragma once
/// OwnerReturns: ids (buffer ids) handed back to the one carrier allowed to reuse them, from any
/// thread, without a lock.
///
/// A provided-buffer ring's tail and an epoll buffer group's free stack are written by one thread
/// only, the carrier that registered them: nothing on its data path takes a lock, so a thread
/// preempted in the middle of a return can never hold the carrier up. A return made on that carrier
/// goes straight back (the caller's fast path; onOwner() says which). A return made anywhere else is
/// pushed here, on a lock-free stack threaded through a per-id `next` array (no allocation per
/// return), and the first such push since the last drain posts the object's own Message to the owner,
/// whose loop then drains every id pushed so far into the owner's callback.
///
/// Memory ordering: the pusher's writes to the buffer happen before the owner reuses it (the push is a
/// release, the drain's take an acquire).
/// Thread-safety: push() from any thread; drain() on the owner's thread (or, without an owner, on the
/// one thread that consumes the ids); settle() from anywhere.
/// Errors: none. An id pushed twice without being drained in between is a caller bug, caught by the
/// drain (abort, "returned twice") rather than looping forever.
/// Lifetime: call settle() before destroying the object while its owner may still run a drain.

#include <atomic>
#include <cstdint>
#include <memory>

#include "core/internal/fiber.h"

namespace spindle::detail {

class Carrier;

class OwnerReturns {
public:
    using DrainFn = void (*)(void* ctx, uint16_t id) noexcept;

    OwnerReturns() noexcept = default;
    OwnerReturns(const OwnerReturns&) = delete;
    OwnerReturns& operator=(const OwnerReturns&) = delete;

    /// Ids 0..count-1, drained into fn(ctx, id) on `owner`'s thread; owner null: nobody is told, the
    /// consumer drains when it runs short. Throws std::bad_alloc.
    void init(unsigned count, Carrier* owner, DrainFn fn, void* ctx);
    /// Whether the calling thread is the owner carrier's (false without an owner).
    [[nodiscard]] bool onOwner() const noexcept;
    /// From any thread: queues `id` for the owner. After the owner carrier has exited, the id is
    /// dropped (its ring went with the carrier).
    void push(uint16_t id) noexcept;
    /// Whether an id is queued (one relaxed load; a hint for the owner, who then drains).
    [[nodiscard]] bool pending() const noexcept { return head_.load(std::memory_order_relaxed) != kEmpty; }
    /// Owner's thread: hands every queued id to the callback, in the order they were pushed; returns
    /// how many.
    unsigned drain() noexcept;
    /// Waits (yields) until no drain message is queued or running, or the owner has exited.
    void settle() const noexcept;

private:
    static constexpr uint32_t kEmpty = UINT32_MAX;
    // The drain message's state: idle (a push posts it), queued, or running (a push during the drain
    // is picked up by the same run, which checks again before going idle).
    enum : uint8_t { kIdle = 0, kQueued = 1, kRunning = 2 };
    static void onMessage(Message* m) noexcept;

    std::unique_ptr<std::atomic<uint32_t>[]> next_;
    unsigned count_ = 0;
    Carrier* owner_ = nullptr;
    DrainFn fn_ = nullptr;
    void* ctx_ = nullptr;
    alignas(64) std::atomic<uint32_t> head_{kEmpty};
    std::atomic<uint8_t> state_{kIdle};
    Message msg_;
};

}  // namespace spindle::detail
