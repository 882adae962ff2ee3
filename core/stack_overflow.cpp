// SPDX-License-Identifier: Apache-2.0
#include "core/internal/stack_overflow.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <mutex>

#include "core/internal/fiber.h"

namespace spindle::detail {
namespace {

// Written once, before any carrier thread starts (installStackOverflowReporter's precondition).
RunningFiberFn gRunning = nullptr;
struct sigaction gPreviousSegv;
struct sigaction gPreviousBus;

// The report is built without the allocator or stdio: both may be mid-call on the faulting thread.
void putStr(char*& out, char* end, const char* s) noexcept {
    while (*s != '\0' && out < end) { *out++ = *s++; }
}
void putNum(char*& out, char* end, uint64_t v, unsigned base) noexcept {
    char tmp[24];
    int n = 0;
    do {
        unsigned d = static_cast<unsigned>(v % base);
        tmp[n++] = static_cast<char>(d < 10 ? '0' + d : 'a' + d - 10);
        v /= base;
    } while (v != 0 && n < 24);
    if (base == 16) { putStr(out, end, "0x"); }
    while (n > 0 && out < end) { *out++ = tmp[--n]; }
}

void chain(const struct sigaction& prev, int sig, siginfo_t* info, void* uctx) noexcept {
    if ((prev.sa_flags & SA_SIGINFO) != 0 && prev.sa_sigaction != nullptr) {
        prev.sa_sigaction(sig, info, uctx);
        return;
    }
    if (prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN && prev.sa_handler != nullptr) {
        prev.sa_handler(sig);
        return;
    }
    // Default action: restore it and return; the faulting instruction faults again.
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    ::sigaction(sig, &dfl, nullptr);
}

void onFault(int sig, siginfo_t* info, void* uctx) noexcept {
    unsigned carrier = 0;
    Fiber* f = gRunning(&carrier);
    char* addr = static_cast<char*>(info->si_addr);
    if (f != nullptr && addr >= f->stack_.base && addr < f->stack_.usableBottom()) {
        char buf[512];
        char* out = buf;
        char* end = buf + sizeof(buf) - 1;
        putStr(out, end, "spindle: stack overflow in fiber '");
        putStr(out, end, f->name_[0] != '\0' ? f->name_ : "(unnamed)");
        putStr(out, end, "' (id ");
        putNum(out, end, f->id_, 10);
        putStr(out, end, ") on carrier ");
        putNum(out, end, carrier, 10);
        putStr(out, end, ": fault at ");
        putNum(out, end, reinterpret_cast<uintptr_t>(addr), 16);
        putStr(out, end, " in the guard page below its ");
        putNum(out, end, f->stack_.usableSize(), 10);
        putStr(out, end, "-byte stack; raise SpawnOptions::stackSize\n");
        *out = '\0';
        ssize_t ignored = ::write(STDERR_FILENO, buf, static_cast<size_t>(out - buf));
        (void)ignored;
        ::abort();
    }
    chain(sig == SIGBUS ? gPreviousBus : gPreviousSegv, sig, info, uctx);
}

}  // namespace

void installStackOverflowReporter(RunningFiberFn running) noexcept {
    static std::once_flag once;
    std::call_once(once, [running] {
        gRunning = running;
        struct sigaction sa {};
        sa.sa_sigaction = &onFault;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
        sigemptyset(&sa.sa_mask);
        ::sigaction(SIGSEGV, &sa, &gPreviousSegv);
        ::sigaction(SIGBUS, &sa, &gPreviousBus);
    });
}

bool AltSignalStack::install() noexcept {
    void* p = ::mmap(nullptr, kSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) { return false; }
    memory_ = p;
    stack_t ss{};
    ss.ss_sp = memory_;
    ss.ss_size = kSize;
    ::sigaltstack(&ss, nullptr);
    return true;
}

void AltSignalStack::remove() noexcept {
    if (memory_ == nullptr) { return; }
    stack_t ss{};
    ss.ss_flags = SS_DISABLE;
    ::sigaltstack(&ss, nullptr);
    ::munmap(memory_, kSize);
    memory_ = nullptr;
}

}  // namespace spindle::detail
