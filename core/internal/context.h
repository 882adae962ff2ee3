// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The machine-level context switch: leaves one stack and resumes another on the same thread. Everything a
/// fiber is, at this level, is one saved stack pointer; the carrier's scheduler and every fiber each own one.
/// One assembly file per architecture implements it with the same symbols and the same contract:
/// core/context_x86_64.S (System V x86-64) and core/context_aarch64.S (AAPCS64). SwitchFrame and
/// makeContext() below are the per-architecture halves that C++ sees.
///
/// Why so little is saved: spindle_context_switch is reached by an ordinary call, so the ABI already makes
/// the caller treat every caller-saved register as clobbered; the compiler keeps nothing in them across the
/// call. What remains is exactly the ABI's callee-saved set plus the floating-point control state that the
/// ABI also makes callee-saved (rounding mode, exception masks), so that a fiber that changes its rounding
/// mode does not change it for the fiber or scheduler that runs next. The stack pointer itself is the
/// handle (*saveSp). The thread pointer (fs on x86-64, TPIDR_EL0 on AArch64) is not switched: a fiber that
/// moves to another carrier sees that carrier's thread_local variables, which is why fibers use FiberLocal.
///
/// x86-64. Saved: rbx, rbp, r12, r13, r14, r15, the MXCSR and the x87 control word, pushed on the stack that
/// is being left. Clobbered by the call anyway: rax, rcx, rdx, rsi, rdi, r8-r11, xmm0-15 (and the upper
/// halves of ymm/zmm), the x87 register stack and the status flags; the direction flag is clear at every
/// call. Frame layout, at the saved sp, growing down (the same for a switched-out context and for a fresh
/// one that makeContext() lays out; SwitchFrame below is this layout and the .S pushes it in this order):
///
///     sp + 56   return address    fresh context: spindle_context_trampoline
///     sp + 48   rbp               fresh context: 0, so frame-pointer walks end here
///     sp + 40   rbx               fresh context: 0
///     sp + 32   r12               fresh context: entry
///     sp + 24   r13               fresh context: arg
///     sp + 16   r14               fresh context: 0
///     sp +  8   r15               fresh context: 0
///     sp +  4   x87 control word  16 bits, then 2 bytes of padding; fresh context: 0x037F
///     sp +  0   MXCSR             32 bits; fresh context: 0x1F80
///
/// The saved sp is always 16-byte aligned: the caller's rsp was aligned at the call, and return address plus
/// six registers plus the 8-byte control-word slot make 64 bytes. A fresh context resumes in the trampoline
/// with rsp = the aligned stack top, so its `call *%r12` enters entry with rsp + 8 16-byte aligned.
///
/// AArch64. Saved: x19-x28, x29 (the frame pointer), x30 (the link register, which holds the return
/// address), d8-d15 (the low halves of v8-v15, all of them that AAPCS64 makes callee-saved) and the FPCR,
/// stored in a 176-byte frame below the stack being left. Clobbered by the call anyway: x0-x18 (x16 and x17
/// may be used by linker veneers, x18 is a temporary on Linux), the flags, v0-v7 and v16-v31 whole, the
/// upper halves of v8-v15, and the FPSR's sticky exception flags (the ABI leaves those to the caller, so
/// they stay with the thread). SVE and SME state is not supported: a fiber must not switch inside a
/// streaming-mode or ZA-live region. Frame layout, at the saved sp:
///
///     sp + 168  x30               return address; fresh context: spindle_context_trampoline
///     sp + 160  x29               fresh context: 0, so frame-pointer walks end here
///     sp + 88   x20 ... x28       upward in register order; fresh context: arg, then 0
///     sp + 80   x19               fresh context: entry
///     sp + 16   d8 ... d15        upward in register order; fresh context: 0
///     sp +  8   padding           keeps the frame a multiple of 16 bytes
///     sp +  0   FPCR              64 bits; fresh context: 0 (round to nearest, no traps, no flush-to-zero)
///
/// The saved sp is always 16-byte aligned (AArch64 requires it of sp at every access, and 176 is a multiple
/// of 16). A fresh context resumes in the trampoline with sp = the aligned stack top and calls entry with
/// blr, so entry starts with sp aligned, as after any call.
///
/// Control-flow protection: on x86-64 the entry points carry endbr64 and the object is marked IBT-compatible
/// under -fcf-protection, but never shadow-stack (SHSTK) compatible: resuming a context returns to an
/// address the shadow stack has not seen, so a program that links this runs without shadow stacks. On
/// AArch64 the object is marked BTI-compatible under -mbranch-protection (resumes then use ret, which BTI
/// does not check); the return addresses in a frame are not signed with PAC.
///
/// Sanitizers: the switch itself knows nothing of them. ASan and TSan builds must annotate every switch
/// (__sanitizer_start_switch_fiber / __sanitizer_finish_switch_fiber, __tsan_switch_to_fiber); the runtime
/// does, and so does tests/core/context_test.cpp.
///
/// Thread-safety: a context is resumed on one thread at a time; resuming a context that is running, or one
/// whose sp has not been stored yet, is undefined.

#include <cstddef>
#include <cstdint>
#include <new>

namespace spindle::detail {

/// Saves the callee-saved registers and the floating-point control state (see above) on the current stack,
/// stores the resulting sp into *saveSp, switches sp to loadSp, restores the same set from there and returns
/// into the switched-to context.
/// Precondition: loadSp came from makeContext() or from an earlier switch's *saveSp, and that context has not
/// been resumed since. saveSp may point anywhere, including into the stack being left.
extern "C" void spindle_context_switch(void** saveSp, void* loadSp) noexcept;

/// The same switch resumed with ret instead of an indirect jump; faster only
/// between contexts that suspended through the same call chain (see the .S file).
extern "C" void spindle_context_switch_sibling(void** saveSp, void* loadSp) noexcept;

/// The first code a fresh context runs; never call it. Implemented in core/context_<arch>.S.
extern "C" void spindle_context_trampoline() noexcept;

#if defined(__x86_64__)

/// The frame spindle_context_switch pushes and pops, in memory order from the saved sp upwards.
struct SwitchFrame {
    uint32_t mxcsr;
    uint16_t x87ControlWord;
    uint16_t padding;
    uint64_t r15;
    uint64_t r14;
    uint64_t r13;  // fresh context: arg
    uint64_t r12;  // fresh context: entry
    uint64_t rbx;
    uint64_t rbp;
    void (*returnAddress)() noexcept;
};
// The .S file hard-codes these offsets.
static_assert(offsetof(SwitchFrame, mxcsr) == 0);
static_assert(offsetof(SwitchFrame, x87ControlWord) == 4);
static_assert(offsetof(SwitchFrame, r15) == 8);
static_assert(offsetof(SwitchFrame, r13) == 24);
static_assert(offsetof(SwitchFrame, r12) == 32);
static_assert(offsetof(SwitchFrame, rbp) == 48);
static_assert(offsetof(SwitchFrame, returnAddress) == 56);
static_assert(sizeof(SwitchFrame) == 64);

/// The control words every fresh context starts with: the ABI's defaults (all exceptions masked, round to
/// nearest; x87 extended precision).
inline constexpr uint32_t kDefaultMxcsr = 0x1F80;
inline constexpr uint16_t kDefaultX87ControlWord = 0x037F;

#elif defined(__aarch64__)

/// The frame spindle_context_switch stores and loads, in memory order from the saved sp upwards.
struct SwitchFrame {
    uint64_t fpcr;
    uint64_t padding;
    uint64_t d8ToD15[8];
    uint64_t x19;  // fresh context: entry
    uint64_t x20;  // fresh context: arg
    uint64_t x21ToX28[8];
    uint64_t x29;
    void (*returnAddress)() noexcept;  // x30
};
// The .S file hard-codes these offsets.
static_assert(offsetof(SwitchFrame, fpcr) == 0);
static_assert(offsetof(SwitchFrame, d8ToD15) == 16);
static_assert(offsetof(SwitchFrame, x19) == 80);
static_assert(offsetof(SwitchFrame, x20) == 88);
static_assert(offsetof(SwitchFrame, x21ToX28) == 96);
static_assert(offsetof(SwitchFrame, x29) == 160);
static_assert(offsetof(SwitchFrame, returnAddress) == 168);
static_assert(sizeof(SwitchFrame) == 176);

/// The FPCR every fresh context starts with: the Linux default (round to nearest, no exception traps, no
/// flush-to-zero, no default-NaN).
inline constexpr uint64_t kDefaultFpcr = 0;

#else
#error "spindle: no context switch for this architecture (see core/internal/context.h)"
#endif

/// The alignment the ABI requires of sp at a call, and hence of the saved sp (x86-64 and AArch64 alike).
inline constexpr size_t kStackAlignment = 16;
static_assert(sizeof(SwitchFrame) % kStackAlignment == 0);

/// Lays a synthetic frame at the top of a fresh stack so that the first spindle_context_switch to the
/// returned sp calls entry(arg) on that stack with the stack aligned as the ABI has it at function entry (on
/// x86-64 rsp + 8 16-byte aligned, as after a call; on AArch64 sp 16-byte aligned). The new context starts
/// with the ABI's default floating-point control state (kDefaultMxcsr and kDefaultX87ControlWord, or
/// kDefaultFpcr). entry must never return: it leaves by switching away for the last time. If it does
/// return, the trampoline traps (ud2 or udf, SIGILL).
/// Precondition: stackTop is one past the highest usable byte of a stack with room for SwitchFrame plus
/// whatever entry needs; it is rounded down to kStackAlignment. No allocation, no system call.
[[nodiscard]] inline void* makeContext(void* stackTop, void (*entry)(void*), void* arg) noexcept {
    const uintptr_t top = reinterpret_cast<uintptr_t>(stackTop) & ~uintptr_t{kStackAlignment - 1};
    void* sp = reinterpret_cast<void*>(top - sizeof(SwitchFrame));
#if defined(__x86_64__)
    ::new (sp) SwitchFrame{
        .mxcsr = kDefaultMxcsr,
        .x87ControlWord = kDefaultX87ControlWord,
        .padding = 0,
        .r15 = 0,
        .r14 = 0,
        .r13 = reinterpret_cast<uintptr_t>(arg),
        .r12 = reinterpret_cast<uintptr_t>(entry),
        .rbx = 0,
        .rbp = 0,
        .returnAddress = &spindle_context_trampoline,
    };
#elif defined(__aarch64__)
    ::new (sp) SwitchFrame{
        .fpcr = kDefaultFpcr,
        .padding = 0,
        .d8ToD15 = {},
        .x19 = reinterpret_cast<uintptr_t>(entry),
        .x20 = reinterpret_cast<uintptr_t>(arg),
        .x21ToX28 = {},
        .x29 = 0,
        .returnAddress = &spindle_context_trampoline,
    };
#endif
    return sp;
}

}  // namespace spindle::detail
