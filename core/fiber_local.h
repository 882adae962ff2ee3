// SPDX-License-Identifier: Apache-2.0
#pragma once
/// FiberLocal<T>: one T per fiber, which moves with the fiber from carrier to carrier, and is destroyed
/// when the fiber ends.
///
/// A fiber may resume on another carrier's thread after any blocking call, so thread_local is the wrong
/// home for per-request state; a FiberLocal is the fiber's own. Declare one (usually at namespace scope
/// or as a static member) and every fiber that calls get() sees its own T, value-initialised on first
/// access:
///
///     spindle::FiberLocal<RequestContext> gRequest;
///     ...
///     gRequest->traceId = id;           // in the connection fiber, on whatever carrier it runs
///
/// Off-fiber: on a plain thread (or in a carrier's own scheduler code, such as a poller), the calling
/// thread has its own instance, as folly's FiberLocal does; it is destroyed when the thread exits, with
/// that thread's thread_local objects (ordered among them as their destructors run).
///
/// Lifetime: a value lives from first access (get(), emplace()) until reset() or the end of its fiber.
/// When the fiber's function has returned or thrown, the fiber itself (still running, on the carrier
/// that runs it then) destroys its values, newest first, before a join() can return; a destructor may
/// therefore use this_fiber calls and block (a cancellation still pending makes its cancellable calls
/// fail with ECANCELED). A value made by such a destructor is destroyed too. The address of a value is
/// stable for its whole life, whatever other FiberLocals the fiber touches. T's constructor must not
/// access the FiberLocal it is constructing a value for (as with thread_local, that recursion never ends).
/// A FiberLocal may be destroyed while fibers still hold values for it: those values are not leaked and
/// not touched by anyone else; each is destroyed when its fiber ends (or, earlier, when a FiberLocal made
/// later takes the same slot in that fiber). So T's destructor must not depend on the FiberLocal object.
/// Errors: get() and emplace() throw std::bad_alloc when memory for the value or for the fiber's table
/// of values cannot be had, and pass on what T's constructor throws; the fiber's values are unchanged
/// then. tryGet() returns nullptr instead. A destructor of T that throws terminates the process (as a
/// thread_local's does at thread exit).
/// Thread-safety: the object itself may be used by any number of fibers and threads at once; each
/// touches only its own value. A value belongs to its fiber: pass a pointer to it elsewhere only for as
/// long as the fiber keeps it alive.
/// Cost: a fiber that never touches a FiberLocal pays no allocation and no call: one pointer in the fiber,
/// null, tested once as it ends. The first access in a fiber allocates its table (one block, grown by doubling) and the value
/// (one allocation per value, so that its address survives the table's growth and any alignment works);
/// later accesses are an out-of-line call that finds the running fiber, then an indexed load. The keys
/// of destroyed FiberLocals are reused, so the table stays as small as the number of FiberLocals alive.

#include <new>
#include <type_traits>
#include <utility>

#include "core/internal/fiber_local.h"

namespace spindle {

template <class T>
class FiberLocal {
    static_assert(std::is_object_v<T> && !std::is_array_v<T> && !std::is_const_v<T>,
                  "FiberLocal<T> holds a non-const object type");

public:
    /// Takes a key. Errors: std::bad_alloc.
    FiberLocal() : key_(detail::acquireFiberLocalKey()) {}
    /// Gives the key back; values still held by fibers are destroyed as their fibers end.
    ~FiberLocal() { detail::releaseFiberLocalKey(key_); }
    FiberLocal(const FiberLocal&) = delete;
    FiberLocal& operator=(const FiberLocal&) = delete;

    /// The caller's value, value-initialised (T()) on first access. Errors: see above.
    T& get()
        requires std::is_default_constructible_v<T>
    {
        if (T* v = getIfExists()) { return *v; }
        return emplace();
    }
    T& operator*()
        requires std::is_default_constructible_v<T>
    {
        return get();
    }
    T* operator->()
        requires std::is_default_constructible_v<T>
    {
        return &get();
    }

    /// get() that returns nullptr instead of throwing when memory runs out.
    [[nodiscard]] T* tryGet() noexcept
        requires std::is_nothrow_default_constructible_v<T>
    {
        if (T* v = getIfExists()) { return v; }
        T* v = new (std::nothrow) T();
        if (v == nullptr) { return nullptr; }
        if (!detail::installFiberLocal(key_, v, &destroyValue)) {
            delete v;
            return nullptr;
        }
        return v;
    }

    /// The caller's value, or nullptr if it has none; never makes one.
    [[nodiscard]] T* getIfExists() const noexcept { return static_cast<T*>(detail::findFiberLocal(key_)); }

    /// Makes T(args...) the caller's value, destroying the one it had, if any (after the new one is in
    /// place: if T's constructor throws, the old value stays). The new value counts as the newest.
    template <class... Args>
    T& emplace(Args&&... args) {
        T* v = new T(std::forward<Args>(args)...);
        if (!detail::installFiberLocal(key_, v, &destroyValue)) {
            delete v;
            throw std::bad_alloc();
        }
        return *v;
    }

    /// Destroys the caller's value now, if it has one; the next get() makes a fresh one.
    void reset() noexcept { detail::resetFiberLocal(key_); }

private:
    static void destroyValue(void* v) noexcept { delete static_cast<T*>(v); }

    const detail::FiberLocalKey key_;
};

}  // namespace spindle
