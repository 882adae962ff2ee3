// SPDX-License-Identifier: Apache-2.0
#include "core/fiber_local.h"

#include <cstring>
#include <mutex>
#include <utility>
#include <new>
#include <vector>

#include "base/check.h"
#include "core/internal/carrier.h"
#include "core/internal/fiber.h"
#include "core/internal/proxy_fiber.h"

namespace spindle::detail {
namespace {

// The keys handed out. Never destroyed: a FiberLocal with static storage may be destroyed after every
// other static object.
struct KeyRegistry {
    std::mutex mu;
    uint32_t nextIndex = 0;      // indexes [0, nextIndex) have been handed out at least once
    uint64_t nextSerial = 1;     // 0 marks an empty slot
    std::vector<uint32_t> free;  // Invariant: capacity() >= nextIndex, so release() never allocates
};

KeyRegistry& registry() {
    static KeyRegistry* r = new KeyRegistry;
    return *r;
}

constexpr uint32_t kMinCapacity = 8;

// The table's owner: the running fiber, else the calling thread's proxy (a carrier thread between fibers
// included). No switch can happen between this and the use of its result by the caller.
Fiber* localsOwner() noexcept {
    if (Carrier* c = Carrier::current(); c != nullptr && c->running() != nullptr) { return c->running(); }
    return &threadProxy();
}

FiberLocalTable* allocateTable(uint32_t capacity) noexcept {
    void* block = ::operator new(sizeof(FiberLocalTable) + size_t{capacity} * sizeof(FiberLocalSlot), std::nothrow);
    if (block == nullptr) { return nullptr; }
    auto* t = new (block) FiberLocalTable{.capacity = capacity, .newest = kNoFiberLocalSlot};
    FiberLocalSlot* s = t->slots();
    for (uint32_t i = 0; i < capacity; ++i) { new (&s[i]) FiberLocalSlot{}; }
    return t;
}

void freeTable(FiberLocalTable* t) noexcept { ::operator delete(t); }

// Makes room for `index` in owner's table; null (owner unchanged) when memory runs out.
FiberLocalTable* tableWithRoom(Fiber* owner, uint32_t index) noexcept {
    FiberLocalTable* t = owner->locals_;
    if (t != nullptr && index < t->capacity) { return t; }
    uint32_t capacity = t != nullptr ? t->capacity : kMinCapacity;
    while (capacity <= index) { capacity = capacity > UINT32_MAX / 2 ? UINT32_MAX : capacity * 2; }
    FiberLocalTable* grown = allocateTable(capacity);
    if (grown == nullptr) { return nullptr; }
    if (t != nullptr) {
        grown->newest = t->newest;
        std::memcpy(static_cast<void*>(grown->slots()), t->slots(), size_t{t->capacity} * sizeof(FiberLocalSlot));
        freeTable(t);
    }
    owner->locals_ = grown;
    return grown;
}

void unlink(FiberLocalTable* t, uint32_t index) noexcept {
    FiberLocalSlot* s = t->slots();
    FiberLocalSlot& slot = s[index];
    if (slot.newer != kNoFiberLocalSlot) {
        s[slot.newer].older = slot.older;
    } else {
        t->newest = slot.older;
    }
    if (slot.older != kNoFiberLocalSlot) { s[slot.older].newer = slot.newer; }
    slot = FiberLocalSlot{};
}

}  // namespace

FiberLocalKey acquireFiberLocalKey() {
    KeyRegistry& r = registry();
    std::lock_guard lock(r.mu);
    FiberLocalKey key{.index = 0, .serial = r.nextSerial};
    if (!r.free.empty()) {
        key.index = r.free.back();
        r.free.pop_back();
    } else {
        SPINDLE_CHECK_MSG(r.nextIndex != kNoFiberLocalSlot, "too many FiberLocal objects alive");
        if (r.free.capacity() <= r.nextIndex) { r.free.reserve(size_t{r.nextIndex} * 2 + 16); }  // may throw
        key.index = r.nextIndex++;
    }
    ++r.nextSerial;
    return key;
}

void releaseFiberLocalKey(FiberLocalKey key) noexcept {
    KeyRegistry& r = registry();
    std::lock_guard lock(r.mu);
    r.free.push_back(key.index);  // within capacity (see KeyRegistry::free)
}

FiberLocalTable* currentFiberLocals() noexcept { return localsOwner()->locals_; }

bool installFiberLocal(FiberLocalKey key, void* value, void (*destroy)(void*) noexcept) noexcept {
    FiberLocalTable* t = tableWithRoom(localsOwner(), key.index);
    if (t == nullptr) { return false; }
    FiberLocalSlot* s = t->slots();
    const FiberLocalSlot old = s[key.index];
    if (old.value != nullptr) { unlink(t, key.index); }
    s[key.index] = FiberLocalSlot{.value = value, .destroy = destroy, .serial = key.serial, .older = t->newest,
                                  .newer = kNoFiberLocalSlot};
    if (t->newest != kNoFiberLocalSlot) { s[t->newest].newer = key.index; }
    t->newest = key.index;
    // Last: the destructor may touch FiberLocals (this one included) and so grow or change the table.
    if (old.value != nullptr) { old.destroy(old.value); }
    return true;
}

void resetFiberLocal(FiberLocalKey key) noexcept {
    FiberLocalTable* t = currentFiberLocals();
    if (t == nullptr || key.index >= t->capacity) { return; }
    const FiberLocalSlot old = t->slots()[key.index];
    if (old.serial != key.serial) { return; }  // empty, or a destroyed key's: not this key's to end
    unlink(t, key.index);
    old.destroy(old.value);
}

void destroyFiberLocals(Fiber* fiber) noexcept {
    // Re-read the table each time: a destructor may make values, and so grow it.
    while (fiber->locals_ != nullptr && fiber->locals_->newest != kNoFiberLocalSlot) {
        FiberLocalTable* t = fiber->locals_;
        const uint32_t index = t->newest;
        const FiberLocalSlot old = t->slots()[index];
        unlink(t, index);
        old.destroy(old.value);
    }
    freeTable(std::exchange(fiber->locals_, nullptr));
}

}  // namespace spindle::detail
