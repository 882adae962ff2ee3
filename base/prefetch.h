// SPDX-License-Identifier: Apache-2.0
#pragma once
/// spindle::prefetchRead(p): starts loading the cache line that holds `p` into the nearest cache, for a
/// read soon. A hint: it never faults (any address will do, null included), changes nothing a program
/// can see, and costs an instruction.
///
/// Why not __builtin_prefetch: GCC counts it as having no effect, so a loop whose only work is to walk
/// to an address and prefetch it is dead code to the optimiser, which may delete the loop whole. It
/// did so to spindle-kv's pipelined key prefetch (KeyTable::prefetchNode inlined into a loop over the
/// batch): the node loads it was written to start were never asked for, and every test passed. An asm statement the compiler must keep cannot vanish that way. x86-64: prefetcht0;
/// AArch64: prfm pldl1keep; elsewhere __builtin_prefetch, with its risk.

namespace spindle {

[[gnu::always_inline]] inline void prefetchRead(const void* p) noexcept {
#if defined(__x86_64__)
    asm volatile("prefetcht0 (%0)" : : "r"(p));
#elif defined(__aarch64__)
    asm volatile("prfm pldl1keep, [%0]" : : "r"(p));
#else
    __builtin_prefetch(p);
#endif
}

}  // namespace spindle
