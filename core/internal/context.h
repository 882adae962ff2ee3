#pragma once
/// The machine-level context switch: leaves one stack and resumes another on the same thread. Everything a
/// fiber is, at this level, is one saved stack pointer; the carrier's scheduler and every fiber each own one.
///
/// What is saved: rbx, rbp, r12, r13, r14, r15, the MXCSR and the x87 control word, pushed on the stack that
/// is being left. Nothing else.
///
/// Why only that: spindle_context_switch is reached by an ordinary call, so the SysV x86-64 ABI already makes
/// the caller treat rax, rcx, rdx, rsi, rdi, r8-r11, xmm0-15 (and the upper halves of ymm/zmm), the x87
/// register stack and the status flags as clobbered; the compiler keeps nothing in them across the call. What
/// the ABI makes callee-saved is exactly the six registers above, rsp, the control bits of the MXCSR and the
/// x87 control word (rounding mode, precision, exception masks), so a fiber that changes its rounding mode
/// must not change it for the fiber or scheduler that runs next. rsp itself is the handle (*saveSp). The
/// direction flag is clear at every call by the ABI. The thread pointer (fs) is not switched: a fiber that
/// moves to another carrier sees that carrier's thread_local variables, which is why fibers use FiberLocal.
///
/// Frame layout, at the saved sp, growing down (the same for a switched-out context and for a fresh one that
/// makeContext() lays out; SwitchFrame below is this layout and the .S pushes it in this order):
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
/// CET: the entry points carry endbr64 and the object is marked IBT-compatible under -fcf-protection, but
/// never shadow-stack (SHSTK) compatible: resuming a context returns to an address the shadow stack has not
/// seen, so a program that links this runs without shadow stacks.
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

/// Saves the callee-saved registers (rbx, rbp, r12-r15) and the MXCSR and x87 control words on the current
/// stack, stores the resulting rsp into *saveSp, switches rsp to loadSp, restores the same set from there and
/// returns into the switched-to context.
/// Precondition: loadSp came from makeContext() or from an earlier switch's *saveSp, and that context has not
/// been resumed since. saveSp may point anywhere, including into the stack being left.
extern "C" void spindle_context_switch(void** saveSp, void* loadSp) noexcept;

/// The same switch resumed with ret instead of an indirect jump; faster only
/// between contexts that suspended through the same call chain (see the .S file).
extern "C" void spindle_context_switch_sibling(void** saveSp, void* loadSp) noexcept;

/// The first code a fresh context runs; never call it. Implemented in core/context_x86_64.S.
extern "C" void spindle_context_trampoline() noexcept;

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

/// The alignment the ABI requires of rsp at a call, and hence of the saved sp.
inline constexpr size_t kStackAlignment = 16;

/// Lays a synthetic frame at the top of a fresh stack so that the first spindle_context_switch to the
/// returned sp calls entry(arg) on that stack with a correctly aligned rsp (rsp + 8 16-byte aligned at
/// function entry, as after a call). The new context starts with kDefaultMxcsr and kDefaultX87ControlWord.
/// entry must never return: it leaves by switching away for the last time. If it does return, the trampoline
/// traps (ud2, SIGILL).
/// Precondition: stackTop is one past the highest usable byte of a stack with room for SwitchFrame plus
/// whatever entry needs; it is rounded down to kStackAlignment. No allocation, no system call.
[[nodiscard]] inline void* makeContext(void* stackTop, void (*entry)(void*), void* arg) noexcept {
    const uintptr_t top = reinterpret_cast<uintptr_t>(stackTop) & ~uintptr_t{kStackAlignment - 1};
    void* sp = reinterpret_cast<void*>(top - sizeof(SwitchFrame));
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
    return sp;
}

}  // namespace spindle::detail
