#include "perf/bench_support.h"

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>

namespace spindle::bench {
namespace {

// Relaxed: a count, read after the loop by the thread that ran it; it orders nothing.
std::atomic<uint64_t> gAllocs{0};

// The replaceable operator new's contract: never null, call the new-handler until it frees memory, else throw.
void* allocate(std::size_t size, std::size_t align) {
    gAllocs.fetch_add(1, std::memory_order_relaxed);
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

void* allocateNoThrow(std::size_t size, std::size_t align) noexcept {
    try {
        return allocate(size, align);
    } catch (...) {
        return nullptr;
    }
}

constexpr std::size_t kDefaultAlign = alignof(std::max_align_t);

}  // namespace

uint64_t allocCount() noexcept { return gAllocs.load(std::memory_order_relaxed); }

void setAllocCounters(benchmark::State& state, uint64_t before) {
    state.counters["allocs/iter"] =
        benchmark::Counter(static_cast<double>(allocCount() - before), benchmark::Counter::kAvgIterations);
}

}  // namespace spindle::bench

// Every replaceable form, so each allocation is counted once and each block goes back to the allocator
// that made it (malloc and posix_memalign blocks are both released with free).
using spindle::bench::allocate;
using spindle::bench::allocateNoThrow;
using spindle::bench::kDefaultAlign;

void* operator new(std::size_t size) { return allocate(size, kDefaultAlign); }
void* operator new[](std::size_t size) { return allocate(size, kDefaultAlign); }
void* operator new(std::size_t size, std::align_val_t align) { return allocate(size, static_cast<std::size_t>(align)); }
void* operator new[](std::size_t size, std::align_val_t align) {
    return allocate(size, static_cast<std::size_t>(align));
}
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

namespace spindle::bench {

std::optional<Runtime> startRuntime(benchmark::State& state, unsigned carriers) {
    RuntimeOptions o;
    o.carriers = carriers;
    auto rt = Runtime::start(o);
    if (!rt) {
        state.SkipWithError(("runtime did not start: " + rt.error().message()).c_str());
        return std::nullopt;
    }
    return std::move(*rt);
}

}  // namespace spindle::bench
