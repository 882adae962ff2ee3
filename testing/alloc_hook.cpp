// SPDX-License-Identifier: Apache-2.0
#include "testing/alloc_hook.h"

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>

namespace spindle::alloc_hook {
namespace {

std::atomic<uint64_t> gAllocations{0};
thread_local bool tCounting = false;
thread_local uint64_t tCount = 0;
thread_local int tFailAfter = -1;  // >= 0: allocations left before each one fails

// The replaceable operator new's contract: never null, call the new-handler until it frees memory, else throw.
[[maybe_unused]] void* allocate(std::size_t size, std::size_t align) {
    gAllocations.fetch_add(1, std::memory_order_relaxed);
    if (tCounting) {
        ++tCount;
        if (tFailAfter == 0) { throw std::bad_alloc(); }
        if (tFailAfter > 0) { --tFailAfter; }
    }
    if (size == 0) { size = 1; }
    for (;;) {
        void* p = nullptr;
        if (align <= alignof(std::max_align_t)) {
            p = std::malloc(size);
        } else if (::posix_memalign(&p, align, size) != 0) {
            p = nullptr;
        }
        if (p != nullptr) { return p; }
        std::new_handler handler = std::get_new_handler();
        if (handler == nullptr) { throw std::bad_alloc(); }
        handler();
    }
}

[[maybe_unused]] void* allocateNoThrow(std::size_t size, std::size_t align) noexcept {
    try {
        return allocate(size, align);
    } catch (...) {
        return nullptr;
    }
}

[[maybe_unused]] constexpr std::size_t kDefaultAlign = alignof(std::max_align_t);

}  // namespace

bool available() noexcept {
#if defined(SPINDLE_TSAN)
    return false;
#else
    return true;
#endif
}

uint64_t processAllocations() noexcept { return gAllocations.load(std::memory_order_relaxed); }

ThisThread::ThisThread(int failAfter) noexcept {
    tCount = 0;
    tFailAfter = failAfter;
    tCounting = true;
}

ThisThread::~ThisThread() { stop(); }

uint64_t ThisThread::count() const noexcept { return tCount; }

uint64_t ThisThread::stop() noexcept {
    tCounting = false;
    tFailAfter = -1;
    return tCount;
}

}  // namespace spindle::alloc_hook

// Every replaceable form, so each allocation is counted once and each block goes back to the allocator
// that made it (malloc and posix_memalign blocks are both released with free). Not under TSan (see
// available()).
#if !defined(SPINDLE_TSAN)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
using spindle::alloc_hook::allocate;
using spindle::alloc_hook::allocateNoThrow;
using spindle::alloc_hook::kDefaultAlign;

void* operator new(std::size_t size) { return allocate(size, kDefaultAlign); }
void* operator new[](std::size_t size) { return allocate(size, kDefaultAlign); }
void* operator new(std::size_t size, std::align_val_t align) { return allocate(size, static_cast<std::size_t>(align)); }
void* operator new[](std::size_t size, std::align_val_t align) { return allocate(size, static_cast<std::size_t>(align)); }
void* operator new(std::size_t size, const std::nothrow_t&) noexcept { return allocateNoThrow(size, kDefaultAlign); }
void* operator new[](std::size_t size, const std::nothrow_t&) noexcept { return allocateNoThrow(size, kDefaultAlign); }
void* operator new(std::size_t size, std::align_val_t align, const std::nothrow_t&) noexcept {
    return allocateNoThrow(size, static_cast<std::size_t>(align));
}
void* operator new[](std::size_t size, std::align_val_t align, const std::nothrow_t&) noexcept {
    return allocateNoThrow(size, static_cast<std::size_t>(align));
}

void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
#endif  // !SPINDLE_TSAN
