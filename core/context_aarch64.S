// SPDX-License-Identifier: Apache-2.0
// The AArch64 (AAPCS64) context switch and the entry trampoline of a fresh context.
// The contract, and the frame layout that makeContext() builds to match, are in core/internal/context.h;
// core/context_x86_64.S is the same thing for x86-64, and the two export the same symbols.

#if !defined(__aarch64__)
#error "spindle: core/context_aarch64.S is the AArch64 context switch; this target is not AArch64"
#endif

// Branch Target Identification. When the compiler is asked for it (-mbranch-protection=bti or standard, which
// defines __ARM_FEATURE_BTI_DEFAULT), every object must say so in a GNU property note, or the linker drops
// the marking for the whole program. Under BTI an indirect branch (br/blr) may only land on a bti
// instruction, and the resume points of a context are ordinary return addresses with none. So in a BTI
// build every resume goes through ret, which BTI does not police, and the two entry points, which a call
// through the PLT reaches with br, begin with "bti c". Pointer authentication (PAC) is not applied to the
// return addresses saved in a switch frame; the object claims BTI only.
#if defined(__ARM_FEATURE_BTI_DEFAULT) && __ARM_FEATURE_BTI_DEFAULT
#define SPINDLE_BTI_C hint #34
#define SPINDLE_BTI 1
#else
#define SPINDLE_BTI_C
#define SPINDLE_BTI 0
#endif

    .text

// void spindle_context_switch(void** saveSp, void* loadSp) noexcept
//   x0 = saveSp: where the sp of the context being left is stored.
//   x1 = loadSp: the sp of the context to resume, as an earlier switch stored it or makeContext returned it.
//
// The frame stored here and loaded on the other side (offsets from the saved sp, 176 bytes):
//   168 x30 (return address) | 160 x29 | 152 x28 | 144 x27 | ... | 88 x20 | 80 x19
//    72 d15 | 64 d14 | ... | 24 d9 | 16 d8 | 8 padding | 0 FPCR (64 bits)
// x29 and x30 sit at the top as an ordinary frame record, so a frame-pointer walk from a parked context's
// registers finds the caller. sp is 16-byte aligned at every call (the hardware checks it on each
// sp-relative access), and 176 is a multiple of 16, so the saved sp is aligned too.
//
// Both switches below share the save-and-swap half and the reload of the callee-saved registers; they
// differ only in the branch that resumes.

// Stores the frame above, stores sp in *x0, moves sp to x1 and restores the FPCR from there.
.macro SPINDLE_SAVE_AND_SWAP
    .cfi_startproc
    SPINDLE_BTI_C
    sub sp, sp, #176
    .cfi_def_cfa_offset 176
    stp x29, x30, [sp, #160]
    .cfi_offset x29, -16
    .cfi_offset x30, -8
    stp x27, x28, [sp, #144]
    .cfi_offset x27, -32
    .cfi_offset x28, -24
    stp x25, x26, [sp, #128]
    .cfi_offset x25, -48
    .cfi_offset x26, -40
    stp x23, x24, [sp, #112]
    .cfi_offset x23, -64
    .cfi_offset x24, -56
    stp x21, x22, [sp, #96]
    .cfi_offset x21, -80
    .cfi_offset x22, -72
    stp x19, x20, [sp, #80]
    .cfi_offset x19, -96
    .cfi_offset x20, -88
    // Only the low 64 bits of v8-v15 are callee-saved; the rest of the vector file is the caller's concern.
    stp d14, d15, [sp, #64]
    .cfi_offset d14, -112
    .cfi_offset d15, -104
    stp d12, d13, [sp, #48]
    .cfi_offset d12, -128
    .cfi_offset d13, -120
    stp d10, d11, [sp, #32]
    .cfi_offset d10, -144
    .cfi_offset d11, -136
    stp d8, d9, [sp, #16]
    .cfi_offset d8, -160
    .cfi_offset d9, -152
    // The FPCR's rounding mode, trap enables and flush-to-zero/default-NaN bits are callee-saved by the
    // ABI: a fiber that changes its rounding mode must not change it for whatever runs next. Reading it is
    // cheap. Writing it may serialise the pipeline on some cores, and two contexts nearly always hold the
    // same value, so it is written below only when the resumed context's value differs.
    mrs x9, fpcr
    str x9, [sp]

    // The switch itself. sp cannot be the source of a store, hence x10. From here on sp points into the
    // other context's frame, which has the same shape, so the CFI above stays true: an unwinder stopped
    // below sees the resumed context's caller.
    mov x10, sp
    str x10, [x0]
    mov sp, x1

    ldr x10, [sp]
    cmp x9, x10
    b.eq 1f
    msr fpcr, x10
1:
.endm

// Reloads the callee-saved registers, x29 and x30 from the resumed frame and pops it.
.macro SPINDLE_RESTORE_AND_POP
    ldp d8, d9, [sp, #16]
    ldp d10, d11, [sp, #32]
    ldp d12, d13, [sp, #48]
    ldp d14, d15, [sp, #64]
    ldp x19, x20, [sp, #80]
    ldp x21, x22, [sp, #96]
    ldp x23, x24, [sp, #112]
    ldp x25, x26, [sp, #128]
    ldp x27, x28, [sp, #144]
    ldp x29, x30, [sp, #160]
    add sp, sp, #176
    .cfi_def_cfa_offset 0
    .cfi_restore x19
    .cfi_restore x20
    .cfi_restore x21
    .cfi_restore x22
    .cfi_restore x23
    .cfi_restore x24
    .cfi_restore x25
    .cfi_restore x26
    .cfi_restore x27
    .cfi_restore x28
    .cfi_restore x29
    .cfi_restore x30
    .cfi_restore d8
    .cfi_restore d9
    .cfi_restore d10
    .cfi_restore d11
    .cfi_restore d12
    .cfi_restore d13
    .cfi_restore d14
    .cfi_restore d15
.endm

    .globl spindle_context_switch
    .type spindle_context_switch, %function
    .p2align 4
spindle_context_switch:
    SPINDLE_SAVE_AND_SWAP
    SPINDLE_RESTORE_AND_POP
    // Resume with an indirect branch rather than ret, for the reason the x86-64 file gives: between
    // contexts that switch from different call sites, ret makes the return-address predictor guess the
    // leaving context's caller, wrong every time, while the indirect predictor can learn the alternation.
    // Under BTI a br would fault on the resume point (no landing pad), so there we use ret and accept that.
#if SPINDLE_BTI
    ret
#else
    br x30
#endif
    .cfi_endproc
    .size spindle_context_switch, .-spindle_context_switch

// void spindle_context_switch_sibling(void** saveSp, void* loadSp) noexcept
//   The same switch, resumed with ret. Use it only between two fibers that suspended through the same call
//   chain (the scheduler's fiber-to-fiber switch): the chain the leaving fiber called down is then the one
//   the resumed fiber returns up, and the return-address predictor is right at every level.
    .globl spindle_context_switch_sibling
    .type spindle_context_switch_sibling, %function
    .p2align 4
spindle_context_switch_sibling:
    SPINDLE_SAVE_AND_SWAP
    SPINDLE_RESTORE_AND_POP
    ret
    .cfi_endproc
    .size spindle_context_switch_sibling, .-spindle_context_switch_sibling

// The first code a fresh context runs: the x30 of the frame makeContext() lays out. It is entered with sp at
// the 16-byte aligned stack top, x19 = entry, x20 = arg and x29 = 0, so entry's own frame record ends the
// frame-pointer chain. entry must never return; if it does there is no caller to return to, so we trap
// (udf: SIGILL, like the x86-64 ud2) rather than run off into whatever lies above the stack. It is reached
// by the resuming br or ret, never by a call; a br lands here only in a non-BTI build, so no landing pad.
    .globl spindle_context_trampoline
    .type spindle_context_trampoline, %function
    .p2align 4
spindle_context_trampoline:
    .cfi_startproc
    // The outermost frame of a fiber: unwinders and debuggers stop here instead of walking off the stack.
    .cfi_undefined x30
    mov x0, x20
    blr x19
    udf #0
    .cfi_endproc
    .size spindle_context_trampoline, .-spindle_context_trampoline

#if SPINDLE_BTI
// GNU property note: this object is BTI-compatible (GNU_PROPERTY_AARCH64_FEATURE_1_AND, bit 0). PAC (bit 1)
// is left out; see above.
    .section .note.gnu.property, "a"
    .p2align 3
    .long 4                 // name size ("GNU\0")
    .long 16                // descriptor size
    .long 5                 // NT_GNU_PROPERTY_TYPE_0
    .asciz "GNU"
    .long 0xc0000000        // GNU_PROPERTY_AARCH64_FEATURE_1_AND
    .long 4                 // data size
    .long 1                 // GNU_PROPERTY_AARCH64_FEATURE_1_BTI
    .p2align 3
#endif

    .section .note.GNU-stack, "", %progbits
