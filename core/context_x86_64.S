// SPDX-License-Identifier: Apache-2.0
// The x86-64 System V context switch and the entry trampoline of a fresh context.
// The contract, and the frame layout that makeContext() builds to match, are in core/internal/context.h.

#if !defined(__x86_64__)
#error "spindle: only the x86-64 context switch is implemented so far (core/context_x86_64.S)"
#endif

// Under -fcf-protection=branch the assembler gets __CET__ & 1: the entry points below start with endbr64, and the
// indirect jump that resumes a context is marked notrack, because the resume points it lands on are ordinary
// return addresses, which carry no endbr64. We mark this object IBT-compatible only; it is never shadow-stack
// compatible (SHSTK), because resuming a context returns to an address the shadow stack has never seen, so a
// program linked with it runs without shadow stacks.
#if defined(__CET__) && (__CET__ & 1)
#define SPINDLE_RESUME_JMP notrack jmp
#else
#define SPINDLE_RESUME_JMP jmp
#endif

    .text

// void spindle_context_switch(void** saveSp, void* loadSp) noexcept
//   rdi = saveSp: where the sp of the context being left is stored.
//   rsi = loadSp: the sp of the context to resume, as an earlier switch stored it or makeContext returned it.
//
// The frame pushed here and popped on the other side (offsets from the saved sp):
//   56 return address | 48 rbp | 40 rbx | 32 r12 | 24 r13 | 16 r14 | 8 r15 | 4 x87 CW (16 bits) | 0 MXCSR
// The caller's rsp was 16-byte aligned at the call, so the saved sp (64 bytes lower) is 16-byte aligned too.
//
// Both switches below share the save-and-swap half and the restore of the callee-saved registers; they
// differ only in how they resume.

// Pushes the frame above, stores rsp in *rdi, loads rsi into rsp and restores the control words from there.
.macro SPINDLE_SAVE_AND_SWAP
    .cfi_startproc
    endbr64
    pushq %rbp
    .cfi_adjust_cfa_offset 8
    .cfi_rel_offset %rbp, 0
    pushq %rbx
    .cfi_adjust_cfa_offset 8
    .cfi_rel_offset %rbx, 0
    pushq %r12
    .cfi_adjust_cfa_offset 8
    .cfi_rel_offset %r12, 0
    pushq %r13
    .cfi_adjust_cfa_offset 8
    .cfi_rel_offset %r13, 0
    pushq %r14
    .cfi_adjust_cfa_offset 8
    .cfi_rel_offset %r14, 0
    pushq %r15
    .cfi_adjust_cfa_offset 8
    .cfi_rel_offset %r15, 0
    subq $8, %rsp
    .cfi_adjust_cfa_offset 8
    // The ABI makes the control bits of both callee-saved (rounding, masks, precision); saving the whole
    // MXCSR also keeps the sticky exception flags with their context. stmxcsr is the costliest instruction
    // here (more than half of a switch on Zen 4; jump_fcontext pays it too). Skipping ldmxcsr when the value
    // is unchanged was measured and is slower: the compare has to wait for the stmxcsr store.
    stmxcsr (%rsp)
    fnstcw 4(%rsp)

    // The switch itself. From here on rsp points into the other context's frame, which has the same shape,
    // so the CFI above stays true: an unwinder stopped below sees the resumed context's caller.
    movq %rsp, (%rdi)
    movq %rsi, %rsp

    ldmxcsr (%rsp)
    fldcw 4(%rsp)
.endm

// Reloads the callee-saved registers from the resumed frame (rsp still points at its base).
.macro SPINDLE_RESTORE_CALLEE_SAVED
    movq 8(%rsp), %r15
    movq 16(%rsp), %r14
    movq 24(%rsp), %r13
    movq 32(%rsp), %r12
    movq 40(%rsp), %rbx
    movq 48(%rsp), %rbp
.endm

.macro SPINDLE_CFI_RESTORED
    .cfi_restore %rbp
    .cfi_restore %rbx
    .cfi_restore %r12
    .cfi_restore %r13
    .cfi_restore %r14
    .cfi_restore %r15
.endm

    .globl spindle_context_switch
    .type spindle_context_switch, @function
    .p2align 4
spindle_context_switch:
    SPINDLE_SAVE_AND_SWAP
    // Pop the return address into a scratch register and jump, rather than ret: between contexts that
    // switch from different call sites (a scheduler and a fiber, or a ping-pong), the return stack buffer
    // predicts a return to the leaving context's caller, which is wrong every time, whereas the
    // indirect-branch predictor learns the alternating targets (measured: ret makes such a switch twice as
    // slow). r8 is caller-saved, so it is dead on both sides.
    movq 56(%rsp), %r8
    SPINDLE_RESTORE_CALLEE_SAVED
    addq $64, %rsp
    .cfi_adjust_cfa_offset -64
    .cfi_register %rip, %r8
    SPINDLE_CFI_RESTORED
    SPINDLE_RESUME_JMP *%r8
    .cfi_endproc
    .size spindle_context_switch, .-spindle_context_switch

// void spindle_context_switch_sibling(void** saveSp, void* loadSp) noexcept
//   The same switch, but it resumes with ret. Use it only between two fibers that suspended through the
//   same call chain (the scheduler's fiber-to-fiber switch): the chain the leaving fiber just called down is
//   the one the resumed fiber returns up, so the return-stack predictor is right at every level, here and in
//   every function the resumed fiber returns from. (Measured on NOP through 64 fibers: 0.56 -> 0.72 of a raw
//   liburing loop.)
    .globl spindle_context_switch_sibling
    .type spindle_context_switch_sibling, @function
    .p2align 4
spindle_context_switch_sibling:
    SPINDLE_SAVE_AND_SWAP
    SPINDLE_RESTORE_CALLEE_SAVED
    addq $56, %rsp
    .cfi_adjust_cfa_offset -56
    SPINDLE_CFI_RESTORED
    ret
    .cfi_endproc
    .size spindle_context_switch_sibling, .-spindle_context_switch_sibling

// The first code a fresh context runs: the return address of the frame makeContext() lays out. It is entered
// with rsp 16-byte aligned, r12 = entry and r13 = arg, so the call below gives entry the alignment of an
// ordinary call (rsp + 8 16-byte aligned). entry must never return; if it does, there is no caller to return
// to, so we trap rather than run off into whatever lies above the stack.
    .globl spindle_context_trampoline
    .type spindle_context_trampoline, @function
    .p2align 4
spindle_context_trampoline:
    .cfi_startproc
    // The outermost frame of a fiber: unwinders and debuggers stop here instead of walking off the stack.
    .cfi_undefined %rip
    endbr64
    movq %r13, %rdi
    callq *%r12
    ud2
    .cfi_endproc
    .size spindle_context_trampoline, .-spindle_context_trampoline

#if defined(__CET__) && (__CET__ & 1)
// GNU property note: this object is IBT-compatible (GNU_PROPERTY_X86_FEATURE_1_AND, bit 0). See above for
// why SHSTK (bit 1) is deliberately absent.
    .section .note.gnu.property, "a"
    .p2align 3
    .long 4                 // name size ("GNU\0")
    .long 16                // descriptor size
    .long 5                 // NT_GNU_PROPERTY_TYPE_0
    .asciz "GNU"
    .long 0xc0000002        // GNU_PROPERTY_X86_FEATURE_1_AND
    .long 4                 // data size
    .long 1                 // GNU_PROPERTY_X86_FEATURE_1_IBT
    .p2align 3
#endif

    .section .note.GNU-stack, "", @progbits
