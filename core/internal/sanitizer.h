// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Fiber-switch annotations for AddressSanitizer and ThreadSanitizer.
///
/// ASan keeps shadow state per stack and TSan keeps a vector clock per thread;
/// neither can see a stack switch done in assembly. Every switch therefore
/// tells ASan which stack it is about to run on (start/finish pairs) and tells
/// TSan which logical thread (fiber) runs next. In other builds these are
/// empty inline functions.

#include <cstddef>

#if defined(SPINDLE_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
#if defined(SPINDLE_TSAN)
#include <sanitizer/tsan_interface.h>
#endif

namespace spindle::detail::san {

/// Before switching onto the stack [bottom, bottom+size). `fakeStack` keeps the
/// leaving context's fake stack; nullptr means the leaving context never returns.
[[gnu::always_inline]] inline void startSwitch([[maybe_unused]] void** fakeStack, [[maybe_unused]] const void* bottom,
                        [[maybe_unused]] size_t size) noexcept {
#if defined(SPINDLE_ASAN)
    __sanitizer_start_switch_fiber(fakeStack, bottom, size);
#endif
}

/// First thing after arriving on a stack; reports the stack that was left.
[[gnu::always_inline]] inline void finishSwitch([[maybe_unused]] void* fakeStack, [[maybe_unused]] const void** oldBottom,
                         [[maybe_unused]] size_t* oldSize) noexcept {
#if defined(SPINDLE_ASAN)
    __sanitizer_finish_switch_fiber(fakeStack, oldBottom, oldSize);
#endif
}

/// Clears stale poisoning left on a reused stack by a fiber that ended mid-frame.
inline void unpoison([[maybe_unused]] const void* p, [[maybe_unused]] size_t size) noexcept {
#if defined(SPINDLE_ASAN)
    __asan_unpoison_memory_region(p, size);
#endif
}

inline void* tsanCurrent() noexcept {
#if defined(SPINDLE_TSAN)
    return __tsan_get_current_fiber();
#else
    return nullptr;
#endif
}
inline void* tsanCreate() noexcept {
#if defined(SPINDLE_TSAN)
    return __tsan_create_fiber(0);
#else
    return nullptr;
#endif
}
inline void tsanDestroy([[maybe_unused]] void* fiber) noexcept {
#if defined(SPINDLE_TSAN)
    if (fiber != nullptr) { __tsan_destroy_fiber(fiber); }
#endif
}
[[gnu::always_inline]] inline void tsanSwitchTo([[maybe_unused]] void* fiber) noexcept {
#if defined(SPINDLE_TSAN)
    __tsan_switch_to_fiber(fiber, 0);
#endif
}
inline void tsanSetName([[maybe_unused]] void* fiber, [[maybe_unused]] const char* name) noexcept {
#if defined(SPINDLE_TSAN)
    __tsan_set_fiber_name(fiber, name);
#endif
}

}  // namespace spindle::detail::san
