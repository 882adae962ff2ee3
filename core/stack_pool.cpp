#include "core/internal/stack_pool.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/inject.h"
#include "base/log.h"
#include "numa/topology.h"

namespace spindle::detail {
namespace {
thread_local char tlsOwnerToken;
std::atomic<bool> gSaidSyntheticStacks{false};
}  // namespace

size_t StackPool::pageSize() noexcept {
    static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    return page;
}

StackPool::StackPool(size_t usableSize, size_t hotCount, size_t maxCached) noexcept
    : usableSize_((usableSize + pageSize() - 1) & ~(pageSize() - 1)), hotCount_(hotCount), maxCached_(maxCached) {}

StackPool::~StackPool() {
    drainRemote();
    while (freeList_ != nullptr) {
        Stack s = freeList_->stack;
        freeList_ = freeList_->nextFree;
        unmap(s);
    }
}

void StackPool::claimForThisThread() noexcept { ownerToken_ = &tlsOwnerToken; }

bool StackPool::ownedByThisThread() const noexcept { return ownerToken_ == &tlsOwnerToken; }

Result<Stack> StackPool::map(size_t usableSize) noexcept {
    const size_t page = pageSize();
    const size_t usable = (usableSize + page - 1) & ~(page - 1);
    const size_t total = usable + page;
    SPINDLE_INJECT(inject::Point::kStackMap, {
        log::warn("fiber stack mmap of {} bytes failed (injected): {}", total, std::strerror(injectedErrno));
        return Error{injectedErrno};
    });
    void* p = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK,
                     -1, 0);
    if (p == MAP_FAILED) {
        int err = errno;
        log::warn("fiber stack mmap of {} bytes failed: {}", total, std::strerror(err));
        return Error{err == ENOMEM ? ENOMEM : err};
    }
    if (::mprotect(p, page, PROT_NONE) != 0) {
        int err = errno;
        ::munmap(p, total);
        log::warn("fiber stack guard mprotect failed: {}", std::strerror(err));
        return Error{err};
    }
    Stack s;
    s.base = static_cast<char*>(p);
    s.mapSize = total;
    s.guardSize = page;
    return s;
}

void StackPool::unmap(const Stack& stack) noexcept {
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

Result<Stack> StackPool::mapBound(size_t usableSize) noexcept {
    auto s = map(usableSize);
    if (s && nodeBound_.load(std::memory_order_acquire)) { bindStack(*s); }
    return s;
}

void StackPool::bindStack(const Stack& stack) noexcept {
    // The guard page is never touched; bind what the fiber uses.
    auto r = topology_->bindArea(stack.base + stack.guardSize, stack.mapSize - stack.guardSize, node_);
    if (r) { return; }
    if (nodeBound_.exchange(false, std::memory_order_relaxed)) {
        log::warn("fiber stacks of this carrier are not bound to NUMA node {} from now on: binding refused ({})",
                  node_, r.error().message());
    }
}

Result<Stack> StackPool::acquire() noexcept {
    SPINDLE_ASSERT(ownedByThisThread());
    if (freeList_ == nullptr) { drainRemote(); }
    if (freeList_ != nullptr) {
        FreeNode* node = freeList_;
        freeList_ = node->nextFree;
        --cachedCount_;
        Stack s = node->stack;
        return s;
    }
    auto s = mapBound(usableSize_);
    if (!s) { return s; }
    s->pool = this;
    mappedCount_.store(mappedCount_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    return s;
}

void StackPool::pushLocal(Stack stack) noexcept {
    if (cachedCount_ >= maxCached_) {
        unmap(stack);
        return;
    }
    if (cachedCount_ >= hotCount_) {
        // Cold tier: give the pages back but keep the mapping (and its guard).
        // The top page holds the free-list node, so it stays.
        const size_t page = pageSize();
        char* from = stack.usableBottom();
        size_t len = stack.usableSize() - page;
        if (len > 0) { ::madvise(from, len, MADV_DONTNEED); }
    }
    FreeNode* node = nodeOf(stack);
    new (node) FreeNode();
    node->stack = stack;
    node->nextFree = freeList_;
    freeList_ = node;
    ++cachedCount_;
}

void StackPool::release(Stack stack) noexcept {
    SPINDLE_ASSERT(stack.pool == this);
    if (ownedByThisThread()) {
        pushLocal(stack);
        return;
    }
    FreeNode* node = nodeOf(stack);
    new (node) FreeNode();
    node->stack = stack;
    remote_.push(node);
}

void StackPool::drainRemote() noexcept {
    MpscNode* n = remote_.popAll();
    while (n != nullptr) {
        MpscNode* next = n->next;
        pushLocal(static_cast<FreeNode*>(n)->stack);
        n = next;
    }
}

}  // namespace spindle::detail
