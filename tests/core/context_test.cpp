// SPDX-License-Identifier: Apache-2.0
// Tests for the raw context switch (core/internal/context.h): values and registers survive, floating-point
// control state is per context, fresh contexts start aligned, and contexts can switch among themselves.

#include "core/internal/context.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cfenv>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "base/check.h"

#if defined(SPINDLE_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
#if defined(SPINDLE_TSAN)
#include <sanitizer/tsan_interface.h>
#endif

// Loads every callee-saved register with seed+1, seed+2, ... (x86-64: rbx, rbp, r12-r15; AArch64: x19-x29,
// then d8-d15), calls spindle_context_switch(saveSp, loadSp), and once this context is resumed returns a mask
// with bit i set where register i no longer holds its pattern (0 = intact; kPatternRegisters names the bits).
// It saves and restores those registers itself, so it is an ordinary function to its callers. Written in
// assembly because compiled code gives no way to make sure every callee-saved register holds a live value at
// the switch.
extern "C" uint64_t spindle_test_switch_with_pattern(void** saveSp, void* loadSp, uint64_t seed) noexcept;
#if defined(__x86_64__)
constexpr const char* kPatternRegisters = "rbx rbp r12 r13 r14 r15";
asm(R"(
    .text
    .p2align 4
    .type spindle_test_switch_with_pattern, @function
spindle_test_switch_with_pattern:
    .cfi_startproc
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
    pushq %rdx
    .cfi_adjust_cfa_offset 8
    leaq 1(%rdx), %rbx
    leaq 2(%rdx), %rbp
    leaq 3(%rdx), %r12
    leaq 4(%rdx), %r13
    leaq 5(%rdx), %r14
    leaq 6(%rdx), %r15
    call spindle_context_switch@PLT
    movq (%rsp), %rdx
    xorl %eax, %eax
    leaq 1(%rdx), %rcx
    cmpq %rcx, %rbx
    je 1f
    orl $1, %eax
1:  leaq 2(%rdx), %rcx
    cmpq %rcx, %rbp
    je 2f
    orl $2, %eax
2:  leaq 3(%rdx), %rcx
    cmpq %rcx, %r12
    je 3f
    orl $4, %eax
3:  leaq 4(%rdx), %rcx
    cmpq %rcx, %r13
    je 4f
    orl $8, %eax
4:  leaq 5(%rdx), %rcx
    cmpq %rcx, %r14
    je 5f
    orl $16, %eax
5:  leaq 6(%rdx), %rcx
    cmpq %rcx, %r15
    je 6f
    orl $32, %eax
6:  popq %rdx
    .cfi_adjust_cfa_offset -8
    popq %r15
    .cfi_adjust_cfa_offset -8
    popq %r14
    .cfi_adjust_cfa_offset -8
    popq %r13
    .cfi_adjust_cfa_offset -8
    popq %r12
    .cfi_adjust_cfa_offset -8
    popq %rbx
    .cfi_adjust_cfa_offset -8
    popq %rbp
    .cfi_adjust_cfa_offset -8
    ret
    .cfi_endproc
    .size spindle_test_switch_with_pattern, .-spindle_test_switch_with_pattern
)");
#elif defined(__aarch64__)
constexpr const char* kPatternRegisters =
    "x19 x20 x21 x22 x23 x24 x25 x26 x27 x28 x29 d8 d9 d10 d11 d12 d13 d14 d15";
asm(R"(
    .text
    .p2align 4
    .type spindle_test_switch_with_pattern, %function
spindle_test_switch_with_pattern:
    .cfi_startproc
    stp x29, x30, [sp, #-176]!
    .cfi_def_cfa_offset 176
    .cfi_offset x29, -176
    .cfi_offset x30, -168
    stp x19, x20, [sp, #16]
    .cfi_offset x19, -160
    .cfi_offset x20, -152
    stp x21, x22, [sp, #32]
    .cfi_offset x21, -144
    .cfi_offset x22, -136
    stp x23, x24, [sp, #48]
    .cfi_offset x23, -128
    .cfi_offset x24, -120
    stp x25, x26, [sp, #64]
    .cfi_offset x25, -112
    .cfi_offset x26, -104
    stp x27, x28, [sp, #80]
    .cfi_offset x27, -96
    .cfi_offset x28, -88
    stp d8, d9, [sp, #96]
    .cfi_offset d8, -80
    .cfi_offset d9, -72
    stp d10, d11, [sp, #112]
    .cfi_offset d10, -64
    .cfi_offset d11, -56
    stp d12, d13, [sp, #128]
    .cfi_offset d12, -48
    .cfi_offset d13, -40
    stp d14, d15, [sp, #144]
    .cfi_offset d14, -32
    .cfi_offset d15, -24
    str x2, [sp, #160]

    .macro spindle_test_load_x reg, n
    add \reg, x2, #\n
    .endm
    .macro spindle_test_load_d reg, n
    add x9, x2, #\n
    fmov \reg, x9
    .endm
    spindle_test_load_x x19, 1
    spindle_test_load_x x20, 2
    spindle_test_load_x x21, 3
    spindle_test_load_x x22, 4
    spindle_test_load_x x23, 5
    spindle_test_load_x x24, 6
    spindle_test_load_x x25, 7
    spindle_test_load_x x26, 8
    spindle_test_load_x x27, 9
    spindle_test_load_x x28, 10
    spindle_test_load_x x29, 11
    spindle_test_load_d d8, 12
    spindle_test_load_d d9, 13
    spindle_test_load_d d10, 14
    spindle_test_load_d d11, 15
    spindle_test_load_d d12, 16
    spindle_test_load_d d13, 17
    spindle_test_load_d d14, 18
    spindle_test_load_d d15, 19
    .purgem spindle_test_load_x
    .purgem spindle_test_load_d

    bl spindle_context_switch

    ldr x2, [sp, #160]
    mov x0, #0
    // Sets bit n-1 of x0 unless the register holds seed + n.
    .macro spindle_test_check_x reg, n
    add x9, x2, #\n
    cmp \reg, x9
    cset x10, ne
    orr x0, x0, x10, lsl #(\n - 1)
    .endm
    .macro spindle_test_check_d reg, n
    add x9, x2, #\n
    fmov x11, \reg
    cmp x11, x9
    cset x10, ne
    orr x0, x0, x10, lsl #(\n - 1)
    .endm
    spindle_test_check_x x19, 1
    spindle_test_check_x x20, 2
    spindle_test_check_x x21, 3
    spindle_test_check_x x22, 4
    spindle_test_check_x x23, 5
    spindle_test_check_x x24, 6
    spindle_test_check_x x25, 7
    spindle_test_check_x x26, 8
    spindle_test_check_x x27, 9
    spindle_test_check_x x28, 10
    spindle_test_check_x x29, 11
    spindle_test_check_d d8, 12
    spindle_test_check_d d9, 13
    spindle_test_check_d d10, 14
    spindle_test_check_d d11, 15
    spindle_test_check_d d12, 16
    spindle_test_check_d d13, 17
    spindle_test_check_d d14, 18
    spindle_test_check_d d15, 19
    .purgem spindle_test_check_x
    .purgem spindle_test_check_d

    ldp d14, d15, [sp, #144]
    ldp d12, d13, [sp, #128]
    ldp d10, d11, [sp, #112]
    ldp d8, d9, [sp, #96]
    ldp x27, x28, [sp, #80]
    ldp x25, x26, [sp, #64]
    ldp x23, x24, [sp, #48]
    ldp x21, x22, [sp, #32]
    ldp x19, x20, [sp, #16]
    ldp x29, x30, [sp], #176
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
    ret
    .cfi_endproc
    .size spindle_test_switch_with_pattern, .-spindle_test_switch_with_pattern
)");
#else
#error "context_test: no register-pattern helper for this architecture"
#endif

namespace spindle::detail {
namespace {

constexpr size_t kStackSize = 64 * 1024;

/// A 64 KiB mmap'd stack with a PROT_NONE guard page below it, as the stack pool will hand out.
class TestStack {
public:
    TestStack() {
        guard_ = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
        void* p = ::mmap(nullptr, guard_ + kStackSize, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        SPINDLE_CHECK(p != MAP_FAILED);
        SPINDLE_CHECK(::mprotect(p, guard_, PROT_NONE) == 0);
        map_ = static_cast<char*>(p);
    }
    ~TestStack() {
#if defined(SPINDLE_ASAN)
        // A context that never returned leaves poisoned redzones in the shadow of its frames.
        ASAN_UNPOISON_MEMORY_REGION(bottom(), kStackSize);
#endif
        ::munmap(map_, guard_ + kStackSize);
    }
    TestStack(const TestStack&) = delete;
    TestStack& operator=(const TestStack&) = delete;

    [[nodiscard]] char* bottom() const noexcept { return map_ + guard_; }
    [[nodiscard]] char* top() const noexcept { return bottom() + kStackSize; }

private:
    char* map_ = nullptr;
    size_t guard_ = 0;
};

/// One execution context as these tests see it: its saved sp, plus what the sanitizers need to follow a
/// switch into it (its stack bounds, ASan's fake-stack handle, TSan's fiber).
struct Context {
    void* sp = nullptr;
    const void* stackBottom = nullptr;  // learnt from ASan for the thread's own stack
    size_t stackSize = 0;
    void* asanFakeStack = nullptr;
    void* tsanFiber = nullptr;
};

// The context that made the latest switch on this thread; the resumed side reports its stack bounds to ASan.
thread_local Context* tSwitchedFrom = nullptr;

// Always inlined: TSan keeps one shadow call stack per fiber, so __tsan_switch_to_fiber must run in the same
// frame as the switch itself. Were this a call of its own, its return would pop the new fiber's shadow stack.
[[gnu::always_inline]] inline void beforeSwitch(Context& from, Context& to, bool fromIsFinished) noexcept {
    tSwitchedFrom = &from;
#if defined(SPINDLE_ASAN)
    // A null fake-stack slot tells ASan the context being left will never run again.
    __sanitizer_start_switch_fiber(fromIsFinished ? nullptr : &from.asanFakeStack, to.stackBottom, to.stackSize);
#else
    (void)fromIsFinished;
#endif
#if defined(SPINDLE_TSAN)
    __tsan_switch_to_fiber(to.tsanFiber, 0);
#else
    (void)to;
#endif
}

// Runs first in a context that was just resumed, including on a fresh context's first entry.
void afterSwitch(Context& self) noexcept {
#if defined(SPINDLE_ASAN)
    Context* from = tSwitchedFrom;
    __sanitizer_finish_switch_fiber(self.asanFakeStack, &from->stackBottom, &from->stackSize);
#else
    (void)self;
#endif
}

void switchTo(Context& from, Context& to) noexcept {
    beforeSwitch(from, to, false);
    spindle_context_switch(&from.sp, to.sp);
    afterSwitch(from);
}

// The last switch out of a fiber; it is never resumed.
[[noreturn]] void finishTo(Context& from, Context& to) noexcept {
    beforeSwitch(from, to, true);
    spindle_context_switch(&from.sp, to.sp);
    SPINDLE_CHECK_MSG(false, "a finished context was resumed");
    __builtin_unreachable();
}

uint64_t switchWithPattern(Context& from, Context& to, uint64_t seed) noexcept {
    beforeSwitch(from, to, false);
    const uint64_t mask = spindle_test_switch_with_pattern(&from.sp, to.sp, seed);
    afterSwitch(from);
    return mask;
}

/// The calling thread's own context (main, or a gtest thread).
Context threadContext() noexcept {
    Context c;
#if defined(SPINDLE_TSAN)
    c.tsanFiber = __tsan_get_current_fiber();
#endif
    return c;
}

/// A fresh context on its own stack, ready to run entry(arg) on its first resume.
class Fiber {
public:
    // topSkew moves the stack top down by that many bytes, to check that makeContext aligns it.
    Fiber(void (*entry)(void*), void* arg, size_t topSkew = 0) noexcept {
        context.sp = makeContext(stack_.top() - topSkew, entry, arg);
        context.stackBottom = stack_.bottom();
        context.stackSize = kStackSize;
#if defined(SPINDLE_TSAN)
        context.tsanFiber = __tsan_create_fiber(0);
#endif
    }
    ~Fiber() {
#if defined(SPINDLE_TSAN)
        __tsan_destroy_fiber(context.tsanFiber);
#endif
    }
    Fiber(const Fiber&) = delete;
    Fiber& operator=(const Fiber&) = delete;

    [[nodiscard]] char* stackTop() const noexcept { return stack_.top(); }

    Context context;

private:
    TestStack stack_;
};

// --- values through a shared struct -------------------------------------------------------------------------

struct Exchange {
    Context main = threadContext();
    Context* fiber = nullptr;
    uint64_t request = 0;
    uint64_t reply = 0;
    bool stop = false;
    bool finished = false;
};

void echoEntry(void* arg) {
    auto* ex = static_cast<Exchange*>(arg);
    afterSwitch(*ex->fiber);
    while (!ex->stop) {
        ex->reply = ex->request * 3 + 1;
        switchTo(*ex->fiber, ex->main);
    }
    ex->finished = true;
    finishTo(*ex->fiber, ex->main);
}

TEST(ContextSwitch, RoundTripsPassValuesThroughSharedState) {
    Exchange ex;
    Fiber fiber(echoEntry, &ex);
    ex.fiber = &fiber.context;
    for (uint64_t i = 0; i < 100000; ++i) {
        ex.request = i;
        switchTo(ex.main, fiber.context);
        ASSERT_EQ(ex.reply, i * 3 + 1);
    }
    ex.stop = true;
    switchTo(ex.main, fiber.context);
    EXPECT_TRUE(ex.finished);
}

// --- callee-saved registers ---------------------------------------------------------------------------------

struct RegisterRun {
    Context main = threadContext();
    Context* fiber = nullptr;
    int rounds = 0;
    uint64_t fiberMasks = 0;  // OR of every mask the fiber saw
};

constexpr uint64_t kMainSeed = 0x1111'0000'0000'0000;
constexpr uint64_t kFiberSeed = 0x2222'0000'0000'0000;
constexpr uint64_t kSeedStride = 32;  // more than the registers patterned, so no two rounds share a value

void registerEntry(void* arg) {
    auto* run = static_cast<RegisterRun*>(arg);
    afterSwitch(*run->fiber);
    for (int i = 0; i < run->rounds; ++i) {
        const uint64_t seed = kFiberSeed + static_cast<uint64_t>(i) * kSeedStride;
        run->fiberMasks |= switchWithPattern(*run->fiber, run->main, seed);
    }
    finishTo(*run->fiber, run->main);
}

TEST(ContextSwitch, CalleeSavedRegistersSurviveWhileTheOtherSideClobbersThem) {
    RegisterRun run;
    run.rounds = 1000;
    Fiber fiber(registerEntry, &run);
    run.fiber = &fiber.context;
    uint64_t mainMasks = 0;
    for (int i = 0; i <= run.rounds; ++i) {  // one more: the fiber's first entry, then one per fiber round
        const uint64_t seed = kMainSeed + static_cast<uint64_t>(i) * kSeedStride;
        mainMasks |= switchWithPattern(run.main, fiber.context, seed);
    }
    EXPECT_EQ(mainMasks, 0u) << "bits: " << kPatternRegisters;
    EXPECT_EQ(run.fiberMasks, 0u) << "bits: " << kPatternRegisters;
}

// Many locals kept live across switches at -O2, so the compiler spreads them over the callee-saved registers.
struct Mix {
    uint64_t a, b, c, d, e, f, g, h, i, j, k, l;

    void step(uint64_t n) noexcept {
        a += n; b ^= a * 0x9E3779B97F4A7C15ull; c += b >> 7; d ^= c + 3; e += d * 5; f ^= e >> 3;
        g += f; h ^= g << 1; i += h * 7; j ^= i >> 11; k += j; l ^= k * 13 + a;
    }
    [[nodiscard]] uint64_t digest() const noexcept { return a ^ b ^ c ^ d ^ e ^ f ^ g ^ h ^ i ^ j ^ k ^ l; }
};

[[nodiscard]] Mix mixFrom(uint64_t seed) noexcept {
    return Mix{seed, seed + 1, seed * 3, seed ^ 0xFF, seed + 17, seed * 5, seed + 99, seed ^ 0xF0F0,
               seed * 7, seed + 1234, seed ^ 0xABCDEF, seed * 11};
}

[[nodiscard]] uint64_t referenceDigest(uint64_t seed, int rounds) noexcept {
    Mix m = mixFrom(seed);
    for (int n = 0; n < rounds; ++n) { m.step(static_cast<uint64_t>(n)); }
    return m.digest();
}

struct LocalsRun {
    Context main = threadContext();
    Context* fiber = nullptr;
    volatile uint64_t seed = 0;  // volatile: the compiler cannot fold the loops into constants
    int rounds = 0;
    uint64_t fiberDigest = 0;
};

void localsEntry(void* arg) {
    auto* run = static_cast<LocalsRun*>(arg);
    afterSwitch(*run->fiber);
    Mix m = mixFrom(run->seed + 1);
    for (int n = 0; n < run->rounds; ++n) {
        m.step(static_cast<uint64_t>(n));
        switchTo(*run->fiber, run->main);
    }
    run->fiberDigest = m.digest();
    finishTo(*run->fiber, run->main);
}

TEST(ContextSwitch, LocalsLiveAcrossSwitchesSurvive) {
    LocalsRun run;
    run.seed = 0x5EED;
    run.rounds = 1000;
    Fiber fiber(localsEntry, &run);
    run.fiber = &fiber.context;
    Mix m = mixFrom(run.seed);
    for (int n = 0; n <= run.rounds; ++n) {
        switchTo(run.main, fiber.context);
        if (n < run.rounds) { m.step(static_cast<uint64_t>(n)); }
    }
    EXPECT_EQ(m.digest(), referenceDigest(0x5EED, run.rounds));
    EXPECT_EQ(run.fiberDigest, referenceDigest(0x5EED + 1, run.rounds));
}

// --- floating-point control state ---------------------------------------------------------------------------

// The floating-point control state a context carries, without the sticky exception flags (caller-saved by
// the ABI). x86-64: the x87 control word in bits 32-47, the MXCSR less its flags in bits 0-31. AArch64: the
// FPCR (whose flags live in the FPSR instead).
#if defined(__x86_64__)
constexpr uint32_t kMxcsrStatusBits = 0x3F;
constexpr uint64_t kDefaultFpControl = uint64_t{kDefaultX87ControlWord} << 32 | kDefaultMxcsr;

[[nodiscard]] uint64_t readFpControl() noexcept {
    uint32_t mxcsr = 0;
    uint16_t x87 = 0;
    asm volatile("stmxcsr %0" : "=m"(mxcsr));
    asm volatile("fnstcw %0" : "=m"(x87));
    return uint64_t{x87} << 32 | (mxcsr & ~kMxcsrStatusBits);
}

// True when the control state's SSE rounding field (MXCSR bits 13-14) says round down.
[[nodiscard]] bool controlRoundsDown(uint64_t control) noexcept { return (control & 0x6000u) == 0x2000u; }
#elif defined(__aarch64__)
constexpr uint64_t kDefaultFpControl = kDefaultFpcr;

[[nodiscard]] uint64_t readFpControl() noexcept {
    uint64_t fpcr = 0;
    asm volatile("mrs %0, fpcr" : "=r"(fpcr));
    return fpcr;
}

// True when the FPCR's RMode field (bits 22-23) says round towards minus infinity.
[[nodiscard]] bool controlRoundsDown(uint64_t control) noexcept { return ((control >> 22) & 3u) == 2u; }
#endif

// 1/3 rounded with the current mode; the volatile keeps the division at run time, under the mode in force.
[[nodiscard]] double oneThird() noexcept {
    volatile double one = 1.0;
    volatile double three = 3.0;
    return one / three;
}

struct FpRun {
    Context main = threadContext();
    Context* fiber = nullptr;
    uint64_t entryControl = 0;
    int roundAfterResume = -1;
    double thirdAfterResume = 0;
};

void fpEntry(void* arg) {
    auto* run = static_cast<FpRun*>(arg);
    afterSwitch(*run->fiber);
    run->entryControl = readFpControl();
    std::fesetround(FE_UPWARD);
    switchTo(*run->fiber, run->main);
    run->roundAfterResume = std::fegetround();
    run->thirdAfterResume = oneThird();
    finishTo(*run->fiber, run->main);
}

TEST(ContextSwitch, RoundingModeIsPerContext) {
    const int saved = std::fegetround();
    std::fesetround(FE_DOWNWARD);  // the fresh context must not inherit this
    const double downThird = oneThird();
    {
        FpRun run;
        Fiber fiber(fpEntry, &run);
        run.fiber = &fiber.context;
        switchTo(run.main, fiber.context);  // the fiber switches to FE_UPWARD, then back here
        EXPECT_EQ(std::fegetround(), FE_DOWNWARD);
        EXPECT_EQ(oneThird(), downThird);
        EXPECT_TRUE(controlRoundsDown(readFpControl())) << "the hardware rounding control should be round-down";
        std::fesetround(FE_TOWARDZERO);  // must not reach the fiber either
        switchTo(run.main, fiber.context);
        EXPECT_EQ(std::fegetround(), FE_TOWARDZERO);

        EXPECT_EQ(run.entryControl, kDefaultFpControl);
        EXPECT_EQ(run.roundAfterResume, FE_UPWARD);
        EXPECT_GT(run.thirdAfterResume, downThird);
    }
    std::fesetround(saved);
}

// --- stack alignment at entry -------------------------------------------------------------------------------

struct AlignRun {
    Context main = threadContext();
    Context* fiber = nullptr;
    void* argSeen = nullptr;
    uintptr_t entryFrame = 1;
    uintptr_t calleeFrame = 1;
    char printed[64] = {};
};

// The frame address is rbp after the prologue's push: the entry rsp minus 8, hence 16-byte aligned exactly
// when the caller's rsp was aligned at its call. On AArch64 it is x29, the frame record at the bottom of a
// frame whose size is a multiple of 16, hence aligned exactly when sp was at entry. The empty asm keeps the
// compiler from folding the check on the assumption that it holds.
[[nodiscard]] inline uintptr_t frameAddress(void* fa) noexcept {
    auto v = reinterpret_cast<uintptr_t>(fa);
    asm("" : "+r"(v));
    return v;
}

#if defined(__x86_64__)
// movaps faults on an address that is not 16-byte aligned, and the compiler places slot on the assumption
// that rsp + 8 was aligned at entry, so a misaligned context crashes here.
[[gnu::noinline]] uintptr_t alignedVectorAccess(double x) noexcept {
    alignas(16) double slot[2];
    asm volatile("movaps %1, %0" : "=m"(slot) : "x"(x));
    asm volatile("" ::"m"(slot));
    return frameAddress(__builtin_frame_address(0));
}
#elif defined(__aarch64__)
// An exclusive load of a 16-byte pair faults unless its address is 16-byte aligned, and the compiler places
// slot on the assumption that sp was aligned at entry, so a misaligned context crashes here (as it would at
// any sp-relative access on hardware that checks sp alignment, which Linux turns on).
[[gnu::noinline]] uintptr_t alignedVectorAccess(double x) noexcept {
    alignas(16) double slot[2] = {x, x};
    uint64_t lo = 0;
    uint64_t hi = 0;
    asm volatile("ldxp %0, %1, [%2]\n\tclrex" : "=&r"(lo), "=&r"(hi) : "r"(slot) : "memory");
    asm volatile("" ::"r"(lo), "r"(hi));
    return frameAddress(__builtin_frame_address(0));
}
#endif

void alignEntry(void* arg) {
    auto* run = static_cast<AlignRun*>(arg);
    afterSwitch(*run->fiber);
    run->argSeen = arg;
    run->entryFrame = frameAddress(__builtin_frame_address(0));
    run->calleeFrame = alignedVectorAccess(2.5);
    // printf of a long double moves x87 and SSE values (AArch64: 128-bit q registers) through stack slots
    // in glibc.
    std::snprintf(run->printed, sizeof(run->printed), "%.2f %.1Lf", 0.25, static_cast<long double>(1.5));
    finishTo(*run->fiber, run->main);
}

// Checks the entry alignment for a stack top that is aligned, or misaligned by skew bytes.
void expectAlignedEntry(size_t skew) {
    AlignRun run;
    Fiber fiber(alignEntry, &run, skew);
    run.fiber = &fiber.context;
    switchTo(run.main, fiber.context);
    EXPECT_EQ(run.argSeen, &run);
    EXPECT_EQ(run.entryFrame & 15, 0u) << "skew " << skew;
    EXPECT_EQ(run.calleeFrame & 15, 0u) << "skew " << skew;
    EXPECT_STREQ(run.printed, "0.25 1.5");
    const auto top = reinterpret_cast<uintptr_t>(fiber.stackTop());
    EXPECT_LT(run.entryFrame, top - skew);
    EXPECT_GT(run.entryFrame, top - 4096);
}

TEST(ContextSwitch, EntryRunsWithAnAlignedStack) {
    for (size_t skew : {0, 1, 8, 15}) { expectAlignedEntry(skew); }
}

TEST(ContextSwitch, FreshFrameMatchesTheDocumentedLayout) {
    TestStack stack;
    int token = 0;
    void* sp = makeContext(stack.top() - 5, echoEntry, &token);
    const uintptr_t top = reinterpret_cast<uintptr_t>(stack.top()) - 16;  // top - 5, rounded down
    ASSERT_EQ(reinterpret_cast<uintptr_t>(sp), top - sizeof(SwitchFrame));
    SwitchFrame frame;
    std::memcpy(&frame, sp, sizeof(frame));
#if defined(__x86_64__)
    EXPECT_EQ(frame.mxcsr, kDefaultMxcsr);
    EXPECT_EQ(frame.x87ControlWord, kDefaultX87ControlWord);
    EXPECT_EQ(frame.r12, reinterpret_cast<uintptr_t>(&echoEntry));
    EXPECT_EQ(frame.r13, reinterpret_cast<uintptr_t>(&token));
    EXPECT_EQ(frame.rbp, 0u);
#elif defined(__aarch64__)
    EXPECT_EQ(frame.fpcr, kDefaultFpcr);
    EXPECT_EQ(frame.x19, reinterpret_cast<uintptr_t>(&echoEntry));
    EXPECT_EQ(frame.x20, reinterpret_cast<uintptr_t>(&token));
    EXPECT_EQ(frame.x29, 0u);  // ends frame-pointer walks
    for (uint64_t d : frame.d8ToD15) { EXPECT_EQ(d, 0u); }
    for (uint64_t x : frame.x21ToX28) { EXPECT_EQ(x, 0u); }
#endif
    EXPECT_EQ(frame.returnAddress, &spindle_context_trampoline);
}

// --- two contexts switching directly with each other --------------------------------------------------------

struct PingPong {
    Context main = threadContext();
    Context* a = nullptr;
    Context* b = nullptr;
    int rounds = 0;
    uint64_t counter = 0;
    int outOfTurnA = 0;
    int outOfTurnB = 0;
    bool finishedA = false;
    bool finishedB = false;
};

void pingEntry(void* arg) {
    auto* pp = static_cast<PingPong*>(arg);
    afterSwitch(*pp->a);
    for (int i = 0; i < pp->rounds; ++i) {
        pp->outOfTurnA += pp->counter != 2 * static_cast<uint64_t>(i);
        ++pp->counter;
        switchTo(*pp->a, *pp->b);
    }
    pp->finishedA = true;
    finishTo(*pp->a, pp->main);  // b is parked in its last switch; main resumes it
}

void pongEntry(void* arg) {
    auto* pp = static_cast<PingPong*>(arg);
    afterSwitch(*pp->b);
    for (int i = 0; i < pp->rounds; ++i) {
        pp->outOfTurnB += pp->counter != 2 * static_cast<uint64_t>(i) + 1;
        ++pp->counter;
        switchTo(*pp->b, *pp->a);
    }
    pp->finishedB = true;
    finishTo(*pp->b, pp->main);
}

TEST(ContextSwitch, TwoContextsPingPongDirectly) {
    PingPong pp;
    pp.rounds = 100000;
    Fiber a(pingEntry, &pp);
    Fiber b(pongEntry, &pp);
    pp.a = &a.context;
    pp.b = &b.context;
    switchTo(pp.main, a.context);  // returns when a finishes
    EXPECT_TRUE(pp.finishedA);
    EXPECT_FALSE(pp.finishedB);
    switchTo(pp.main, b.context);  // returns when b finishes
    EXPECT_TRUE(pp.finishedB);
    EXPECT_EQ(pp.counter, 2 * static_cast<uint64_t>(pp.rounds));
    EXPECT_EQ(pp.outOfTurnA, 0);
    EXPECT_EQ(pp.outOfTurnB, 0);
}

// --- an entry that returns ----------------------------------------------------------------------------------

struct ReturnRun {
    Context main = threadContext();
    Context* fiber = nullptr;
};

void returningEntry(void* arg) {
    auto* run = static_cast<ReturnRun*>(arg);
    afterSwitch(*run->fiber);
}

void runReturningEntry() {
    ReturnRun run;
    Fiber fiber(returningEntry, &run);
    run.fiber = &fiber.context;
    switchTo(run.main, fiber.context);
}

TEST(ContextSwitchDeathTest, ReturningEntryTraps) {
    // threadsafe re-executes the test binary, which qemu-user cannot do for a foreign one (execve fails with
    // ENOEXEC), so a style chosen through the environment wins: the aarch64 test preset sets
    // GTEST_DEATH_TEST_STYLE=fast.
    if (std::getenv("GTEST_DEATH_TEST_STYLE") == nullptr) { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
    EXPECT_EXIT(runReturningEntry(), testing::KilledBySignal(SIGILL), "");
}

}  // namespace
}  // namespace spindle::detail
