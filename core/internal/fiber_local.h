// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The machinery under FiberLocal<T> (core/fiber_local.h): process-wide keys, and the per-fiber table
/// of values that detail::Fiber::locals_ points to.
///
/// A key is a dense index (reused once its FiberLocal is destroyed) plus a serial that is never reused.
/// A fiber's table is one heap block, made on the fiber's first FiberLocal access, holding one slot per
/// index: the value's address, its deleter and the serial of the key that made it. A slot whose serial
/// is not the asking key's belongs to a key that was destroyed; it is empty for the new key, and its
/// value is destroyed when the new key installs its own there, or when the fiber ends.
/// Values are threaded through the slots in creation order (newest first), so that they are destroyed
/// newest first.
///
/// Thread-safety: a table is touched only by the fiber (or thread) it belongs to; a fiber that moves to
/// another carrier takes it along, handed over with the fiber itself. Keys are taken and given back
/// under a process-wide mutex.

#include <cstdint>

namespace spindle::detail {

class Fiber;

inline constexpr uint32_t kNoFiberLocalSlot = UINT32_MAX;

/// One FiberLocal's identity. Invariant: serial != 0, and no two live keys share an index.
struct FiberLocalKey {
    uint32_t index = 0;
    uint64_t serial = 0;
};

/// One value of one fiber. Trivially copyable: a growing table moves its slots with memcpy (the values
/// themselves stay put).
struct FiberLocalSlot {
    void* value = nullptr;                       // null: empty (serial is then 0)
    void (*destroy)(void* value) noexcept = nullptr;  // deletes value; outlives the key that made it
    uint64_t serial = 0;                         // the key that made value
    uint32_t older = kNoFiberLocalSlot;          // creation order, among the slots that hold a value
    uint32_t newer = kNoFiberLocalSlot;
};

/// A fiber's (or a plain thread's) values; FiberLocalSlot[capacity] follows it in the same block.
struct FiberLocalTable {
    uint32_t capacity = 0;
    uint32_t newest = kNoFiberLocalSlot;  // head of the creation-order list

    [[nodiscard]] FiberLocalSlot* slots() noexcept { return reinterpret_cast<FiberLocalSlot*>(this + 1); }
};
static_assert(sizeof(FiberLocalTable) % alignof(FiberLocalSlot) == 0, "slots follow the header, aligned");

/// Takes a key: a freed index if there is one, else the next. Errors: std::bad_alloc (the registry grows
/// by one entry per index ever handed out).
[[nodiscard]] FiberLocalKey acquireFiberLocalKey();
/// Gives the key's index back for reuse. Values made with it stay where they are (see above).
void releaseFiberLocalKey(FiberLocalKey key) noexcept;

/// The table of the running fiber, or, off-fiber, of the calling thread's proxy; null until first use.
[[nodiscard]] FiberLocalTable* currentFiberLocals() noexcept;

/// The calling fiber's (or thread's) value for `key`, or null.
[[nodiscard]] inline void* findFiberLocal(FiberLocalKey key) noexcept {
    FiberLocalTable* t = currentFiberLocals();
    if (t == nullptr || key.index >= t->capacity) { return nullptr; }
    const FiberLocalSlot& s = t->slots()[key.index];
    return s.serial == key.serial ? s.value : nullptr;
}

/// Makes `value` the caller's value for `key`, the newest of its values. What the slot held before (this
/// key's previous value, or a destroyed key's) is destroyed afterwards. Returns false, having changed
/// nothing, when the table could not be made or grown (the caller still owns `value`).
[[nodiscard]] bool installFiberLocal(FiberLocalKey key, void* value, void (*destroy)(void*) noexcept) noexcept;

/// Destroys the caller's value for `key`, if it has one.
void resetFiberLocal(FiberLocalKey key) noexcept;

/// Destroys every value of `fiber`, newest first, including values that those destructors make, then
/// frees its table. Called by the fiber itself as it ends (or by a thread's proxy at thread exit).
/// A destructor that throws terminates the process (the deleters are noexcept).
void destroyFiberLocals(Fiber* fiber) noexcept;

}  // namespace spindle::detail
