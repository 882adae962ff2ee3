// SPDX-License-Identifier: Apache-2.0
#include "core/internal/stack_pool.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>

#include "base/counter.h"
#include "base/inject.h"
#include "base/log.h"
#include "numa/topology.h"

namespace spindle::detail {

// Linux 6.13's guard regions (uapi asm-generic/mman-common.h); Debian 12's headers predate them.
#ifndef MADV_GUARD_INSTALL
#define MADV_GUARD_INSTALL 102
#endif

struct StackPool::Slab {
    char* base = nullptr;
    size_t bytes = 0;
    unsigned cls = 0;
    unsigned count = 0;
    uint64_t cold = 0;  // bit i: stack i is free and has no pages (never used, or trimmed)
    Slab* nextPartial = nullptr;
    Slab* prevPartial = nullptr;
    bool inPartial = false;
    Slab* nextAll = nullptr;
    Slab* prevAll = nullptr;

    [[nodiscard]] uint64_t fullMask() const noexcept { return count == 64 ? ~uint64_t{0} : (uint64_t{1} << count) - 1; }
};

namespace {
thread_local char tlsOwnerToken;
std::atomic<bool> gSaidSyntheticStacks{false};
std::atomic<bool> gSaidMapLimit{false};

uint64_t monoNs() noexcept {
    timespec ts;
    ::clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<uint64_t>(ts.tv_sec) * 1000000000u + static_cast<uint64_t>(ts.tv_nsec);
}

bool probeGuardRegions() noexcept {
    const size_t page = StackPool::pageSize();
    void* p = ::mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) { return false; }
    bool works = false;
    if (::madvise(p, page, MADV_GUARD_INSTALL) == 0) {
        // Accepting the advice is not enough (qemu-user accepts and ignores it): the kernel must refuse
        // to read the guard. The raw system call keeps the sanitizers' interceptors out of it.
        int fds[2];
        if (::pipe2(fds, O_CLOEXEC) == 0) {
            const long r = ::syscall(SYS_write, fds[1], p, 1);
            works = r < 0 && errno == EFAULT;
            ::close(fds[0]);
            ::close(fds[1]);
        }
    }
    ::munmap(p, 2 * page);
    return works;
}

// Makes [p, p + page) a guard: a guard region where the kernel has them, else a PROT_NONE page.
int installGuard(char* p, size_t page) noexcept {
    if (StackPool::guardRegions()) { return ::madvise(p, page, MADV_GUARD_INSTALL) == 0 ? 0 : errno; }
    return ::mprotect(p, page, PROT_NONE) == 0 ? 0 : errno;
}

long readLong(const char* path) noexcept {
    FILE* f = std::fopen(path, "re");
    if (f == nullptr) { return -1; }
    long v = -1;
    if (std::fscanf(f, "%ld", &v) != 1) { v = -1; }
    std::fclose(f);
    return v;
}

long countMappings() noexcept {
    FILE* f = std::fopen("/proc/self/maps", "re");
    if (f == nullptr) { return -1; }
    long n = 0;
    for (int ch = std::fgetc(f); ch != EOF; ch = std::fgetc(f)) { n += ch == '\n' ? 1 : 0; }
    std::fclose(f);
    return n;
}

// Says why the kernel refused a stack mapping (`what`: "mmap" or "guard"). A refusal at the process's
// mapping limit is named as such, once per process; any other is a warning each time.
void reportRefusal(const char* what, size_t bytes, int err) noexcept {
    if (err == ENOMEM) {
        const long limit = readLong("/proc/sys/vm/max_map_count");
        const long have = countMappings();
        if (limit > 0 && have >= limit - 64) {
            if (!gSaidMapLimit.exchange(true, std::memory_order_relaxed)) {
                log::error("fiber stacks: the kernel refused a {} of {} bytes: this process has {} mappings and "
                           "vm.max_map_count is {}{}; raise vm.max_map_count (sysctl) or run fewer fibers",
                           what, bytes, have, limit,
                           StackPool::guardRegions()
                               ? ""
                               : " (each stack costs two mappings here: this kernel has no guard regions, "
                                 "MADV_GUARD_INSTALL of Linux 6.13)");
            }
            return;
        }
    }
    log::warn("fiber stacks: the kernel refused a {} of {} bytes: {}", what, bytes, std::strerror(err));
}
// Maps `bytes` of stack memory (no guard yet): the one place stack memory comes from, and the fault point.
Result<char*> mapStackArea(size_t bytes) noexcept {
    SPINDLE_INJECT(inject::Point::kStackMap, {
        log::warn("fiber stacks: the kernel refused a mmap of {} bytes (injected): {}", bytes,
                  std::strerror(injectedErrno));
        return Error{injectedErrno};
    });
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK,
                     -1, 0);
    if (p == MAP_FAILED) {
        const int err = errno;
        reportRefusal("mmap", bytes, err);
        return Error{err};
    }
    return static_cast<char*>(p);
}
}  // namespace

size_t StackPool::pageSize() noexcept {
    static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    return page;
}

bool StackPool::guardRegions() noexcept {
    static const bool works = probeGuardRegions();
    return works;
}

size_t StackPool::classSize(size_t usableSize) noexcept {
    if (usableSize > kMaxClassSize) { return 0; }
    return std::max(kMinClassSize, std::bit_ceil(usableSize));
}

namespace {
unsigned classIndex(size_t classSize) noexcept {
    return static_cast<unsigned>(std::countr_zero(classSize) - std::countr_zero(StackPool::kMinClassSize));
}
}  // namespace

StackPool::StackPool(uint64_t scavengePeriodNs) noexcept : scavengePeriodNs_(scavengePeriodNs) {
    const size_t page = pageSize();
    for (unsigned i = 0; i < kClassCount; ++i) {
        SizeClass& c = classes_[i];
        c.usable = kMinClassSize << i;
        c.stride = c.usable + page;
        c.perSlab = static_cast<unsigned>(std::clamp<size_t>((2u << 20) / c.stride, 4, 64));
        c.keepWarm = std::max(kMinKeepWarm, kKeepWarmBytes / c.usable);
    }
}

StackPool::~StackPool() {
    drainRemote();
    for (unsigned i = 0; i < kClassCount; ++i) {
        FreeNode* n = classes_[i].spares.exchange(nullptr, std::memory_order_acquire);
        while (n != nullptr) {
            FreeNode* next = n->nextFree;
            fileReleased(n->stack);
            n = next;
        }
    }
    // A stack still out belongs to a fiber that outlived its carrier: then leave every slab mapped (the
    // pool does not track which slab such a stack is in; it is a bug of the caller, and rare).
    const bool anyOut = inUse_.load(std::memory_order_relaxed) != 0;
    for (Slab* s = slabList_; s != nullptr;) {
        Slab* next = s->nextAll;
        if (!anyOut) {
            ::munmap(s->base, s->bytes);
            delete s;
        }
        s = next;
    }
}

void StackPool::claimForThisThread() noexcept { ownerToken_ = &tlsOwnerToken; }

bool StackPool::ownedByThisThread() const noexcept { return ownerToken_ == &tlsOwnerToken; }

Result<Stack> StackPool::mapSingle(size_t usableSize) noexcept {
    const size_t page = pageSize();
    const size_t usable = (usableSize + page - 1) & ~(page - 1);
    const size_t total = usable + page;
    auto mapped = mapStackArea(total);
    if (!mapped) { return Error{mapped.errorCode()}; }
    char* p = *mapped;
    if (const int err = installGuard(p, page); err != 0) {
        ::munmap(p, total);
        reportRefusal("guard page", page, err);
        return Error{err};
    }
    Stack s;
    s.base = p;
    s.mapSize = total;
    s.guardSize = page;
    return s;
}

void StackPool::unmapSingle(const Stack& stack) noexcept {
    if (stack.base != nullptr) { ::munmap(stack.base, stack.mapSize); }
}

StackPool::FreeNode* StackPool::nodeOf(const Stack& stack) noexcept {
    // The node sits at the very top of the usable area, where a fiber's control
    // block lives while the stack is in use.
    return reinterpret_cast<FreeNode*>(stack.top() - sizeof(FreeNode));
}

void StackPool::bindToNode(const numa::Topology* topology, unsigned node) noexcept {
    SPINDLE_ASSERT(ownedByThisThread());
    nodeBound_.store(false, std::memory_order_relaxed);
    if (topology == nullptr) { return; }
    if (topology->isSynthetic() || topology->isFallback()) {
        if (!gSaidSyntheticStacks.exchange(true, std::memory_order_relaxed)) {
            log::info("fiber stacks are not bound to a NUMA node: the topology is {}",
                      topology->isFallback() ? "the flat fallback (hwloc could not read this machine)"
                                             : "not this machine (synthetic or XML)");
        }
        return;
    }
    topology_ = topology;
    node_ = node;
    nodeBound_.store(true, std::memory_order_release);  // publishes topology_ and node_
}

void StackPool::bindMemory(char* p, size_t bytes) noexcept {
    if (!nodeBound_.load(std::memory_order_acquire)) { return; }
    auto r = topology_->bindArea(p, bytes, node_);
    if (r) { return; }
    if (nodeBound_.exchange(false, std::memory_order_relaxed)) {
        log::warn("fiber stacks of this carrier are not bound to NUMA node {} from now on: binding refused ({})",
                  node_, r.error().message());
    }
}

Result<StackPool::Slab*> StackPool::mapSlab(SizeClass& c, unsigned cls) noexcept {
    const size_t page = pageSize();
    const size_t bytes = c.stride * c.perSlab;
    auto mapped = mapStackArea(bytes);
    if (!mapped) { return Error{mapped.errorCode()}; }
    char* base = *mapped;
    for (unsigned i = 0; i < c.perSlab; ++i) {
        if (const int err = installGuard(base + i * c.stride, page); err != 0) {
            ::munmap(base, bytes);
            reportRefusal("guard page", page, err);
            return Error{err};
        }
    }
    auto* slab = new (std::nothrow) Slab();
    if (slab == nullptr) {
        ::munmap(base, bytes);
        return Error{ENOMEM};
    }
    bindMemory(base, bytes);
    slab->base = base;
    slab->bytes = bytes;
    slab->cls = cls;
    slab->count = c.perSlab;
    slab->cold = slab->fullMask();
    slab->nextAll = slabList_;
    if (slabList_ != nullptr) { slabList_->prevAll = slab; }
    slabList_ = slab;
    slab->nextPartial = c.partial;
    if (c.partial != nullptr) { c.partial->prevPartial = slab; }
    c.partial = slab;
    slab->inPartial = true;
    ownerAdd(slabs_);
    ownerAdd(mapped_, c.perSlab);
    return slab;
}

void StackPool::unmapSlab(SizeClass& c, Slab* slab) noexcept {
    if (slab->inPartial) {
        if (slab->prevPartial != nullptr) { slab->prevPartial->nextPartial = slab->nextPartial; } else { c.partial = slab->nextPartial; }
        if (slab->nextPartial != nullptr) { slab->nextPartial->prevPartial = slab->prevPartial; }
    }
    if (slab->prevAll != nullptr) { slab->prevAll->nextAll = slab->nextAll; } else { slabList_ = slab->nextAll; }
    if (slab->nextAll != nullptr) { slab->nextAll->prevAll = slab->prevAll; }
    ::munmap(slab->base, slab->bytes);
    delete slab;
    ownerSub(slabs_);
}

Result<Stack> StackPool::acquire(size_t usableSize) noexcept {
    SPINDLE_ASSERT(ownedByThisThread());
    const size_t size = classSize(usableSize);
    if (size == 0) {
        auto s = mapSingle(usableSize);
        if (s) { bindMemory(s->usableBottom(), s->usableSize()); }
        return s;
    }
    const unsigned cls = classIndex(size);
    return acquireOwned(classes_[cls], cls);
}

Result<Stack> StackPool::acquireOwned(SizeClass& c, unsigned cls) noexcept {
    if (c.head == nullptr) { drainRemote(); }
    if (FreeNode* n = popWarm(c)) {
        ownerAdd(inUse_);
        return n->stack;
    }
    if (c.partial == nullptr) {
        auto made = mapSlab(c, cls);
        if (!made) { return Error{made.errorCode()}; }
    }
    Slab* slab = c.partial;
    const unsigned i = static_cast<unsigned>(std::countr_zero(slab->cold));
    slab->cold &= ~(uint64_t{1} << i);
    if (slab->cold == 0) {
        c.partial = slab->nextPartial;
        if (c.partial != nullptr) { c.partial->prevPartial = nullptr; }
        slab->nextPartial = slab->prevPartial = nullptr;
        slab->inPartial = false;
    }
    ownerAdd(inUse_);
    Stack s;
    s.base = slab->base + i * c.stride;
    s.mapSize = c.stride;
    s.guardSize = pageSize();
    s.pool = this;
    s.slab = slab;
    s.sizeClass = cls;
    return s;
}

Result<Stack> StackPool::acquireForeign(size_t usableSize) noexcept {
    const size_t size = classSize(usableSize);
    if (size != 0) {
        const unsigned cls = classIndex(size);
        SizeClass& c = classes_[cls];
        if (FreeNode* n = c.spares.exchange(nullptr, std::memory_order_acquire)) {
            // Took them all (no ABA: nobody else pops one at a time); put back all but the first.
            if (FreeNode* rest = n->nextFree) {
                FreeNode* last = rest;
                while (last->nextFree != nullptr) { last = last->nextFree; }
                FreeNode* head = c.spares.load(std::memory_order_relaxed);
                do {
                    last->nextFree = head;
                } while (!c.spares.compare_exchange_weak(head, rest, std::memory_order_release,
                                                         std::memory_order_relaxed));
            }
            return n->stack;
        }
        sparesWanted_.fetch_or(1u << cls, std::memory_order_relaxed);
        usableSize = size;
    }
    auto s = mapSingle(usableSize);
    if (s) { bindMemory(s->usableBottom(), s->usableSize()); }
    return s;
}

void StackPool::refillSpares() noexcept {
    uint32_t want = sparesWanted_.exchange(0, std::memory_order_relaxed);
    while (want != 0) {
        const unsigned cls = static_cast<unsigned>(std::countr_zero(want));
        want &= want - 1;
        SizeClass& c = classes_[cls];
        FreeNode* first = nullptr;
        FreeNode* last = nullptr;
        for (unsigned k = 0; k < kSpares; ++k) {
            auto s = acquireOwned(c, cls);
            if (!s) { break; }
            FreeNode* n = nodeOf(*s);
            new (n) FreeNode();
            n->stack = *s;
            n->nextFree = first;
            first = n;
            if (last == nullptr) { last = n; }
        }
        if (first == nullptr) { continue; }
        FreeNode* head = c.spares.load(std::memory_order_relaxed);
        do {
            last->nextFree = head;
        } while (!c.spares.compare_exchange_weak(head, first, std::memory_order_release, std::memory_order_relaxed));
    }
}

StackPool::FreeNode* StackPool::popWarm(SizeClass& c) noexcept {
    FreeNode* n = c.head;
    if (n == nullptr) { return nullptr; }
    c.head = n->nextFree;
    if (c.head != nullptr) { c.head->prev = nullptr; } else { c.tail = nullptr; }
    --c.warm;
    c.lowWater = std::min(c.lowWater, c.warm);
    ownerSub(warm_);
    return n;
}

void StackPool::pushWarm(SizeClass& c, Stack stack) noexcept {
    FreeNode* n = nodeOf(stack);
    new (n) FreeNode{{}, stack, nullptr, c.head};
    if (c.head != nullptr) { c.head->prev = n; } else { c.tail = n; }
    c.head = n;
    ++c.warm;
    ownerAdd(warm_);
    if (c.warm > c.keepWarm) { scavengeWanted_ = true; }
}

void StackPool::makeCold(SizeClass& c, const Stack& stack) noexcept {
    ::madvise(stack.usableBottom(), stack.usableSize(), MADV_DONTNEED);
    ownerAdd(trims_);
    auto* slab = static_cast<Slab*>(stack.slab);
    const auto i = static_cast<unsigned>(static_cast<size_t>(stack.base - slab->base) / c.stride);
    slab->cold |= uint64_t{1} << i;
    if (slab->cold == slab->fullMask()) {
        unmapSlab(c, slab);
        return;
    }
    if (!slab->inPartial) {
        slab->prevPartial = nullptr;
        slab->nextPartial = c.partial;
        if (c.partial != nullptr) { c.partial->prevPartial = slab; }
        c.partial = slab;
        slab->inPartial = true;
    }
}

void StackPool::fileReleased(Stack stack) noexcept {
    ownerSub(inUse_);
    pushWarm(classes_[stack.sizeClass], stack);
}

void StackPool::release(const Stack& stack) noexcept {
    StackPool* pool = stack.pool;
    if (pool == nullptr) {
        unmapSingle(stack);
        return;
    }
    if (pool->ownedByThisThread()) {
        pool->fileReleased(stack);
        return;
    }
    FreeNode* n = nodeOf(stack);
    new (n) FreeNode();
    n->stack = stack;
    pool->remote_.push(n);
}

void StackPool::drainRemote() noexcept {
    MpscNode* n = remote_.popAll();
    while (n != nullptr) {
        MpscNode* next = n->next;
        fileReleased(static_cast<FreeNode*>(n)->stack);
        n = next;
    }
}

void StackPool::maintain() noexcept {
    drainRemote();
    if (sparesWanted_.load(std::memory_order_relaxed) != 0) { refillSpares(); }
    if (nextScavengeNs_ == UINT64_MAX) {
        if (scavengeWanted_) { armScavenge(); }
    } else if ((++maintainTurns_ & 63) == 0) {
        scavenge(monoNs());
    }
}

void StackPool::armScavenge() noexcept {
    scavengeWanted_ = false;
    bool any = false;
    for (SizeClass& c : classes_) {
        c.lowWater = c.warm;
        any = any || c.warm > c.keepWarm;
    }
    nextScavengeNs_ = any ? monoNs() + scavengePeriodNs_ : UINT64_MAX;
}

void StackPool::trim(bool all) noexcept {
    for (SizeClass& c : classes_) {
        const size_t above = c.warm > c.keepWarm ? c.warm - c.keepWarm : 0;
        size_t n = all ? above : std::min(above, c.lowWater);
        for (; n > 0; --n) {
            FreeNode* victim = c.tail;  // least recently released
            c.tail = victim->prev;
            if (c.tail != nullptr) { c.tail->nextFree = nullptr; } else { c.head = nullptr; }
            --c.warm;
            ownerSub(warm_);
            const Stack s = victim->stack;
            makeCold(c, s);
        }
    }
}

void StackPool::scavenge(uint64_t nowNs) noexcept {
    SPINDLE_ASSERT(ownedByThisThread());
    if (nowNs < nextScavengeNs_) { return; }
    trim(false);
    armScavenge();
}

void StackPool::trimNow() noexcept {
    SPINDLE_ASSERT(ownedByThisThread());
    drainRemote();
    trim(true);
    armScavenge();
}

}  // namespace spindle::detail
