// SPDX-License-Identifier: Apache-2.0
#pragma once
/// spindle::cpuRelax(): the body of a spin-wait loop. It tells the CPU that the thread is polling a value
/// another core will change, and it costs a short, bounded delay; it never blocks and has no effect on
/// memory ordering (the loop's own atomic loads carry that).
///
/// x86-64: pause, which holds the loop back for tens of cycles, avoids the memory-order machine clear when
/// the awaited store lands, and lends the pipeline to an SMT sibling.
/// AArch64: isb. The architectural hint, yield, retires as a no-op on cores without SMT (that is, most of
/// them), so a loop around it polls the cache line as fast as it can; isb drains the pipeline, which gives a
/// pause of roughly the same order as x86's and is what a spin loop there needs.
/// Elsewhere: nothing, which is still correct, only hotter.

namespace spindle {

[[gnu::always_inline]] inline void cpuRelax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("isb" ::: "memory");
#endif
}

}  // namespace spindle
