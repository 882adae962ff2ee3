// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The process's replacement of the global operator new and delete, for the programs that must see
/// allocations: the test suites that prove a path allocates nothing (or survives an allocation that
/// fails), and the benchmarks that report allocations per iteration. Linking the spindle_alloc_hook
/// library into a program replaces every form of operator new and delete there (malloc, or
/// posix_memalign for over-aligned types, and free underneath); nothing else in the program changes.
///
/// Two views: a process-wide count of every operator new in any thread, and, per thread, a count and a
/// failure budget that a test turns on around the code it looks at (a fiber that might move to another
/// thread must be pinned for the per-thread view to mean anything).
/// Thread-safety: processAllocations() from any thread (relaxed: a count, ordering nothing); the
/// per-thread calls act on the calling thread only.
/// Cost: one relaxed atomic increment and two thread-local tests per allocation.

#include <cstdint>

namespace spindle::alloc_hook {

/// Whether this build replaces operator new at all: not under TSan, whose runtime defines its own
/// (a program replacing them fails to link there). Where false, the counts stay 0 and nothing fails:
/// tests that need the hook skip.
[[nodiscard]] bool available() noexcept;

/// Every operator new in the process since it started.
[[nodiscard]] uint64_t processAllocations() noexcept;

/// Counts (from zero) the calling thread's operator new calls for its lifetime and, with
/// `failAfter` >= 0, lets that many succeed and makes every later one fail (std::bad_alloc, or null
/// for the nothrow forms). Scopes do not nest.
class ThisThread {
public:
    explicit ThisThread(int failAfter = -1) noexcept;
    ~ThisThread();
    ThisThread(const ThisThread&) = delete;
    ThisThread& operator=(const ThisThread&) = delete;
    /// The allocations counted so far.
    [[nodiscard]] uint64_t count() const noexcept;
    /// Stops counting and failing; returns the count.
    uint64_t stop() noexcept;
};

}  // namespace spindle::alloc_hook
