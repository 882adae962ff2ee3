// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Poller: work a carrier runs on every turn of its loop, beside its fibers and its I/O driver.
///
/// A component that has something to poll without the kernel's help (a DPDK queue, a shared-memory
/// ring) registers a Poller on a carrier; the carrier calls poll() in each maintenance pass and,
/// when it runs out of fibers, before it decides to park. mayPark() is asked just before parking:
/// a poller that answers false keeps the carrier spinning (as PollMode::kSpin does) while it is
/// registered, so packets are never left waiting for a wake-up the kernel will not send.
/// Seastar's reactor::poller plays the same part.
///
/// Thread-safety: add and remove on the carrier's own thread (from a fiber pinned there); poll()
/// and mayPark() run there too, never concurrently with each other.
/// Errors: addPoller() fails with EPERM off-fiber and EBUSY for a poller already registered.

#include "base/result.h"

namespace spindle {

struct Poller {
    /// Polls once; returns whether it found work (made a fiber runnable, handled a packet).
    bool (*poll)(Poller* self) noexcept = nullptr;
    /// Whether the carrier may park now (null: always). Asked only when poll() found nothing.
    bool (*mayPark)(Poller* self) noexcept = nullptr;
    /// Called on the carrier's thread when the carrier leaves its loop (the runtime shut down) with
    /// the poller still registered: the poller is unregistered first and never called again. Null:
    /// nothing to do. Lets a component release what it holds for that thread.
    void (*detached)(Poller* self) noexcept = nullptr;
    // Owned by the carrier while registered.
    Poller* next = nullptr;
    Poller* prev = nullptr;
    void* carrier = nullptr;
};

/// Registers `poller` on the calling fiber's carrier. Spawn the fiber pinned (SpawnOptions::pinned)
/// so that it is still on that carrier for the removal. Returns the carrier's index.
[[nodiscard]] Result<unsigned> addPoller(Poller* poller) noexcept;
/// Unregisters `poller`; once this returns it is not called again. Precondition: on the carrier
/// it was added to. Errors: EINVAL when it is not registered, EPERM from another carrier or thread.
[[nodiscard]] Result<void> removePoller(Poller* poller) noexcept;

}  // namespace spindle
