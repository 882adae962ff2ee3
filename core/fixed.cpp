// SPDX-License-Identifier: Apache-2.0
#include "core/fixed.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <utility>

#include "base/counter.h"
#include "base/log.h"
#include "core/internal/carrier.h"
#include "core/internal/fixed_pool.h"
#include "core/internal/io_submit.h"
#include "numa/topology.h"
#include "uring/ring.h"

namespace spindle {
namespace detail {
namespace {

constexpr size_t kMaxRw = 0x7ffff000;  // what read(2)/write(2) transfer at most

/// The carrier whose ring a fiber-blocking call made here would use, or nullptr (a plain thread,
/// which uses its private ring; see submitAndWait).
Carrier* fiberCarrier() noexcept {
    Carrier* c = Carrier::current();
    return c != nullptr && c->running() != nullptr ? c : nullptr;
}

std::string limitText(rlim_t v) {
    return v == RLIM_INFINITY ? std::string("unlimited") : std::to_string(static_cast<unsigned long long>(v));
}

// Why a carrier's buffers are not node-local, said once per process (every carrier shares the reason).
std::once_flag gPlainMemoryLogged;

}  // namespace

// ---- FixedBufferPool ---------------------------------------------------------------------------

FixedBufferPool::~FixedBufferPool() { destroy(); }

Result<void> FixedBufferPool::setUp(uring::Ring* ring, unsigned carrier, unsigned count, size_t size,
                                    const numa::Topology* topology, int boundPu) noexcept {
    SPINDLE_CHECK(memory_ == nullptr && free_ == nullptr);
    ring_ = ring;
    carrier_ = carrier;
    if (count == 0) { return {}; }
    size_ = size;
    bytes_ = size * count;  // RuntimeImpl::start bounds both factors and the product

    const char* why = nullptr;
    std::string detailText;
    if (topology == nullptr) {
        why = "the runtime has no topology";
    } else if (boundPu < 0) {
        why = "the carrier is not bound to a PU";
    } else {
        const unsigned node = topology->memoryNodeOf(static_cast<unsigned>(boundPu));
        if (auto m = topology->allocOnNode(bytes_, node)) {
            memory_ = static_cast<char*>(*m);
            topology_ = topology;
        } else {
            detailText = fmt::format("allocOnNode({} bytes, node {}) failed: {}", bytes_, node, m.error().message());
            why = detailText.c_str();
        }
    }
    if (memory_ == nullptr) {
        void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            const int err = errno;
            log::error("carrier {}: cannot map {} fixed buffers of {} bytes: {}", carrier, count, size,
                       std::strerror(err));
            bytes_ = 0;
            return Error{err};
        }
        memory_ = static_cast<char*>(p);
        std::call_once(gPlainMemoryLogged, [&] {
            log::info("fixed buffers come from plain anonymous memory, not node-local memory: {}", why);
        });
    }

    free_.reset(new (std::nothrow) uint32_t[count]);
    std::unique_ptr<iovec[]> iov(new (std::nothrow) iovec[count]);
    if (free_ == nullptr || iov == nullptr) {
        log::error("carrier {}: no memory for the fixed-buffer free list ({} entries)", carrier, count);
        destroy();
        return Error{ENOMEM};
    }
    count_ = count;
    // Pop order 0, 1, 2, ...: index i sits at position count - 1 - i.
    for (unsigned i = 0; i < count; ++i) {
        free_[i] = count - 1 - i;
        iov[i].iov_base = memory_ + size_t{i} * size;
        iov[i].iov_len = size;
    }
    freeCount_ = count;

    if (ring == nullptr) {
        log::info("carrier {}: {} fixed buffers of {} bytes, not registered: no io_uring ring on this backend, so "
                  "read_fixed/write_fixed take the plain path (counted in fixedFallbackIo)",
                  carrier, count, size);
    } else if (auto r = ring->registerBuffers(iov.get(), count); r) {
        registered_.store(true, std::memory_order_relaxed);
        log::debug("carrier {}: {} fixed buffers of {} bytes registered", carrier, count, size);
    } else {
        rlimit lim{};
        ::getrlimit(RLIMIT_MEMLOCK, &lim);
        log::warn("carrier {}: io_uring_register_buffers({} buffers x {} bytes = {} KiB) failed: {} (RLIMIT_MEMLOCK "
                  "soft limit {} bytes, hard {}; registered buffers are pinned memory counted against it unless "
                  "the process has CAP_IPC_LOCK). read_fixed/write_fixed on this carrier use plain read/write; "
                  "raise the limit (ulimit -l) or lower RuntimeOptions::fixedBufferCount/fixedBufferSize",
                  carrier, count, size, bytes_ / 1024, r.error().message(), limitText(lim.rlim_cur),
                  limitText(lim.rlim_max));
    }
    return {};
}

void FixedBufferPool::unregister() noexcept {
    if (!registered()) { return; }
    if (auto r = ring_->unregisterBuffers(); !r) {
        log::warn("carrier {}: io_uring_unregister_buffers failed: {}; the ring's close releases them",
                  carrier_, r.error().message());
    }
    registered_.store(false, std::memory_order_relaxed);
}

void FixedBufferPool::destroy() noexcept {
    if (memory_ == nullptr) { return; }
    if (const unsigned held = outstanding(); held != 0) {
        log::error("carrier {}: {} of its {} fixed buffers are still held as its runtime is destroyed", carrier_,
                   held, count_);
        SPINDLE_CHECK_MSG(held == 0,
                          "every FixedBuffer must be released before its Runtime is destroyed (core/fixed.h)");
    }
    SPINDLE_CHECK_MSG(!registered(), "fixed buffers freed while still registered with the ring");
    if (topology_ != nullptr) {
        topology_->freeOnNode(memory_, bytes_);
    } else {
        ::munmap(memory_, bytes_);
    }
    memory_ = nullptr;
    topology_ = nullptr;
    bytes_ = 0;
    free_.reset();
    freeCount_ = 0;
    count_ = 0;
}

Result<FixedBuffer> FixedBufferPool::acquire() noexcept {
    if (count_ == 0) { return Error{ENOTSUP}; }
    uint32_t index;
    {
        std::lock_guard<SpinLock> g(lock_);
        if (freeCount_ == 0) { return Error{ENOBUFS}; }
        index = free_[--freeCount_];
    }
    FixedBuffer b;
    b.pool_ = this;
    b.data_ = memory_ + size_t{index} * size_;
    b.size_ = size_;
    b.index_ = index;
    b.carrier_ = carrier_;
    return b;
}

void FixedBufferPool::release(unsigned index) noexcept {
    SPINDLE_ASSERT(index < count_);
    std::lock_guard<SpinLock> g(lock_);
    SPINDLE_ASSERT(freeCount_ < count_);
    free_[freeCount_++] = index;
}

unsigned FixedBufferPool::outstanding() const noexcept {
    std::lock_guard<SpinLock> g(lock_);
    return count_ - freeCount_;
}

// ---- FixedFileTable ----------------------------------------------------------------------------

Result<void> FixedFileTable::setUp(Carrier* owner, uring::Ring* ring, unsigned slots) noexcept {
    owner_ = owner;
    ring_ = ring;
    if (slots == 0) { return {}; }
    if (ring == nullptr) {
        log::info("carrier {}: no registered-file table: no io_uring ring on this backend, so FixedFile calls use "
                  "the plain fd (counted in fixedFileFallbackIo)",
                  owner->index());
        return {};
    }
    slot_.reset(new (std::nothrow) Slot[slots]);
    if (slot_ == nullptr) {
        log::error("carrier {}: no memory for a registered-file table of {} slots", owner->index(), slots);
        return Error{ENOMEM};
    }
    slots_ = slots;
    for (unsigned i = 0; i < slots; ++i) {
        slot_[i].run = [](Message* m) noexcept { static_cast<FixedFileTable*>(m->target)->onRemoveMessage(m); };
        slot_[i].target = this;
        slot_[i].nextFree = i + 1 < slots ? static_cast<int32_t>(i + 1) : -1;
    }
    freeHead_ = 0;
    if (auto r = ring->registerFilesSparse(slots); r) {
        registered_.store(true, std::memory_order_relaxed);
        log::debug("carrier {}: registered-file table of {} slots", owner->index(), slots);
    } else {
        rlimit lim{};
        ::getrlimit(RLIMIT_NOFILE, &lim);
        log::warn("carrier {}: io_uring_register_files_sparse({} slots) failed: {} (RLIMIT_NOFILE soft limit {}; "
                  "a sparse table needs kernel 5.19). FixedFile calls on this carrier use the plain fd",
                  owner->index(), slots, r.error().message(), limitText(lim.rlim_cur));
        slot_.reset();  // the fallback hands out no slots
        freeHead_ = -1;
    }
    return {};
}

void FixedFileTable::unregister() noexcept {
    if (!registered()) { return; }
    if (auto r = ring_->unregisterFiles(); !r) {
        log::warn("carrier {}: io_uring_unregister_files failed: {}; the ring's close releases them", carrier(),
                  r.error().message());
    }
    registered_.store(false, std::memory_order_relaxed);
}

void FixedFileTable::destroy() noexcept {
    if (const uint32_t open = open_.load(std::memory_order_acquire); open != 0) {
        log::error("carrier {}: {} FixedFiles of its table are still open as its runtime is destroyed", carrier(),
                   open);
        SPINDLE_CHECK_MSG(open == 0, "every FixedFile must be closed before its Runtime is destroyed (core/fixed.h)");
    }
    slot_.reset();
    slots_ = 0;
    freeHead_ = -1;
}

unsigned FixedFileTable::carrier() const noexcept { return owner_ != nullptr ? owner_->index() : 0; }

Result<int> FixedFileTable::install(int fd) noexcept {
    SPINDLE_ASSERT(Carrier::current() == owner_);
    if (slots_ == 0) { return Error{ENOTSUP}; }
    if (fd < 0) { return Error{EBADF}; }
    if (!registered()) {
        // The fallback keeps only the fd: check it here as the kernel would have.
        if (::fcntl(fd, F_GETFD) < 0) { return Error{errno}; }
        open_.fetch_add(1, std::memory_order_relaxed);
        return -1;
    }
    if (freeHead_ < 0) { return Error{ENFILE}; }
    const int32_t s = freeHead_;
    if (auto r = ring_->updateFile(static_cast<unsigned>(s), fd); !r) { return Error{r.errorCode()}; }
    freeHead_ = slot_[s].nextFree;
    open_.fetch_add(1, std::memory_order_relaxed);
    return s;
}

void FixedFileTable::requestRemove(int slot) noexcept {
    if (slot >= 0) {
        if (Carrier::current() == owner_) {
            removeOnOwner(static_cast<unsigned>(slot));
        } else {
            owner_->post(&slot_[slot]);
        }
    }
    // Last: once it reads 0, the runtime may be destroyed, and this table with it.
    open_.fetch_sub(1, std::memory_order_release);
}

void FixedFileTable::onRemoveMessage(Message* message) noexcept {
    auto* s = static_cast<Slot*>(message);
    removeOnOwner(static_cast<unsigned>(s - slot_.get()));
}

void FixedFileTable::removeOnOwner(unsigned slot) noexcept {
    SPINDLE_ASSERT(slot < slots_);
    if (!registered()) { return; }  // the table is gone with everything in it
    if (auto r = ring_->updateFile(slot, -1); !r) {
        log::error("carrier {}: emptying registered-file slot {} failed: {}; the slot stays taken", carrier(), slot,
                   r.error().message());
        return;
    }
    slot_[slot].nextFree = freeHead_;
    freeHead_ = static_cast<int32_t>(slot);
}

// ---- the calls ---------------------------------------------------------------------------------

namespace {

/// One read or write with whatever registrations apply; decided in prepare(), on the carrier whose
/// ring takes the SQE, so a fiber that moved since it got the buffer or file takes the plain form.
struct FixedRwArgs {
    int fd;                         // the plain descriptor
    const FixedFileTable* table;    // non-null: a FixedFile's call (counted as such)
    int slot;                       // its slot in `table`, -1 when not registered
    const FixedBufferPool* pool;    // non-null: a FixedBuffer's call (counted as such)
    unsigned bufIndex;
    void* addr;
    unsigned len;
    uint64_t offset;
    bool write;
};

// The op for `a` on the calling fiber's carrier (nothing switches between this and the driver's
// start() in submitAndWait, so the carrier that decides is the one that submits).
op::Op fixedOp(const FixedRwArgs* a) noexcept {
    Carrier* c = fiberCarrier();  // nullptr: a plain thread, which runs the plain form
    const bool fixedFile = c != nullptr && a->slot >= 0 && &c->fixedFiles() == a->table;
    const bool fixedBuf = c != nullptr && a->pool != nullptr && &c->fixedBuffers() == a->pool && a->pool->registered();
    op::Op o = a->write ? op::write(fixedFile ? a->slot : a->fd, a->addr, a->len, a->offset)
                        : op::read(fixedFile ? a->slot : a->fd, a->addr, a->len, a->offset);
    if (fixedFile) { o.flags |= op::kFixedFile; }
    if (fixedBuf) {
        o.flags |= op::kFixedBuffer;
        o.bufIndex = static_cast<uint16_t>(a->bufIndex);
    }
    if (c != nullptr) {
        Carrier::Stats& s = c->ownStats();
        if (a->pool != nullptr) { ownerAdd(fixedBuf ? s.fixedIo : s.fixedFallbackIo); }
        if (a->table != nullptr) { ownerAdd(fixedFile ? s.fixedFileIo : s.fixedFileFallbackIo); }
    }
    return o;
}

Result<size_t> sizeFromRes(int32_t res) noexcept {
    if (res < 0) { return Error{-res}; }
    return static_cast<size_t>(res);
}

Result<size_t> fixedRw(FixedRwArgs& a, Deadline deadline) noexcept {
    return sizeFromRes(submitAndWait(fixedOp(&a), deadline));
}

// Fills the buffer half of `a`; false when [bufOffset, bufOffset + len) is not inside `buf`.
bool setBuffer(FixedRwArgs& a, const FixedBuffer& buf, size_t bufOffset, size_t len) noexcept {
    if (!buf.valid() || bufOffset > buf.size() || len > buf.size() - bufOffset) { return false; }
    a.pool = FixedBufferPool::of(buf);
    a.bufIndex = buf.index();
    a.addr = buf.data() + bufOffset;
    a.len = static_cast<unsigned>(len);  // a buffer is at most 1 GiB
    return true;
}

// Fills the file half of `a`; false for an empty FixedFile.
bool setFile(FixedRwArgs& a, const FixedFile& file) noexcept {
    if (!file.valid()) { return false; }
    a.fd = file.fd();
    a.table = FixedFileTable::of(file);
    a.slot = file.slot();
    return true;
}

}  // namespace
}  // namespace detail

// ---- FixedBuffer -------------------------------------------------------------------------------

FixedBuffer::FixedBuffer(FixedBuffer&& other) noexcept
    : pool_(std::exchange(other.pool_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      index_(std::exchange(other.index_, 0)),
      carrier_(std::exchange(other.carrier_, 0)) {}

FixedBuffer& FixedBuffer::operator=(FixedBuffer&& other) noexcept {
    if (this != &other) {
        release();
        pool_ = std::exchange(other.pool_, nullptr);
        data_ = std::exchange(other.data_, nullptr);
        size_ = std::exchange(other.size_, 0);
        index_ = std::exchange(other.index_, 0);
        carrier_ = std::exchange(other.carrier_, 0);
    }
    return *this;
}

FixedBuffer::~FixedBuffer() { release(); }

bool FixedBuffer::registered() const noexcept { return pool_ != nullptr && pool_->registered(); }

void FixedBuffer::release() noexcept {
    if (pool_ == nullptr) { return; }
    std::exchange(pool_, nullptr)->release(index_);
    data_ = nullptr;
    size_ = 0;
    index_ = 0;
    carrier_ = 0;
}

Result<FixedBuffer> acquireFixedBuffer() noexcept {
    detail::Carrier* c = detail::fiberCarrier();
    if (c == nullptr) { return Error{EPERM}; }
    return c->fixedBuffers().acquire();
}

Result<size_t> read_fixed(int fd, FixedBuffer& buf, size_t bufOffset, size_t len, uint64_t offset,
                          Deadline deadline) noexcept {
    detail::FixedRwArgs a{fd, nullptr, -1, nullptr, 0, nullptr, 0, offset, false};
    if (!detail::setBuffer(a, buf, bufOffset, len)) { return Error{EINVAL}; }
    return detail::fixedRw(a, deadline);
}

Result<size_t> write_fixed(int fd, const FixedBuffer& buf, size_t bufOffset, size_t len, uint64_t offset,
                           Deadline deadline) noexcept {
    detail::FixedRwArgs a{fd, nullptr, -1, nullptr, 0, nullptr, 0, offset, true};
    if (!detail::setBuffer(a, buf, bufOffset, len)) { return Error{EINVAL}; }
    return detail::fixedRw(a, deadline);
}

// ---- FixedFile ---------------------------------------------------------------------------------

FixedFile::FixedFile(FixedFile&& other) noexcept
    : table_(std::exchange(other.table_, nullptr)),
      fd_(std::exchange(other.fd_, -1)),
      slot_(std::exchange(other.slot_, -1)),
      carrier_(std::exchange(other.carrier_, 0)) {}

FixedFile& FixedFile::operator=(FixedFile&& other) noexcept {
    if (this != &other) {
        (void)close();
        table_ = std::exchange(other.table_, nullptr);
        fd_ = std::exchange(other.fd_, -1);
        slot_ = std::exchange(other.slot_, -1);
        carrier_ = std::exchange(other.carrier_, 0);
    }
    return *this;
}

FixedFile::~FixedFile() { (void)close(); }

Result<void> FixedFile::close() noexcept {
    if (fd_ < 0) { return Error{EBADF}; }
    std::exchange(table_, nullptr)->requestRemove(std::exchange(slot_, -1));
    carrier_ = 0;
    // Linux closes the descriptor even when close(2) fails (EINTR included): never retry.
    if (::close(std::exchange(fd_, -1)) != 0 && errno != EINTR) { return Error{errno}; }
    return {};
}

Result<FixedFile> registerFile(int fd) noexcept {
    detail::Carrier* c = detail::fiberCarrier();
    if (c == nullptr) { return Error{EPERM}; }
    auto slot = c->fixedFiles().install(fd);
    if (!slot) { return Error{slot.errorCode()}; }
    FixedFile f;
    f.table_ = &c->fixedFiles();
    f.fd_ = fd;
    f.slot_ = *slot;
    f.carrier_ = c->index();
    return f;
}

Result<size_t> read(const FixedFile& file, void* buf, size_t len, uint64_t offset, Deadline deadline) noexcept {
    detail::FixedRwArgs a{-1, nullptr, -1, nullptr, 0, buf, static_cast<unsigned>(len < detail::kMaxRw ? len : detail::kMaxRw),
                          offset, false};
    if (!detail::setFile(a, file)) { return Error{EBADF}; }
    return detail::fixedRw(a, deadline);
}

Result<size_t> write(const FixedFile& file, const void* buf, size_t len, uint64_t offset, Deadline deadline) noexcept {
    detail::FixedRwArgs a{-1, nullptr, -1, nullptr, 0, const_cast<void*>(buf),
                          static_cast<unsigned>(len < detail::kMaxRw ? len : detail::kMaxRw), offset, true};
    if (!detail::setFile(a, file)) { return Error{EBADF}; }
    return detail::fixedRw(a, deadline);
}

Result<size_t> read(const FixedFile& file, FixedBuffer& buf, size_t bufOffset, size_t len, uint64_t offset,
                    Deadline deadline) noexcept {
    detail::FixedRwArgs a{-1, nullptr, -1, nullptr, 0, nullptr, 0, offset, false};
    if (!detail::setFile(a, file)) { return Error{EBADF}; }
    if (!detail::setBuffer(a, buf, bufOffset, len)) { return Error{EINVAL}; }
    return detail::fixedRw(a, deadline);
}

Result<size_t> write(const FixedFile& file, const FixedBuffer& buf, size_t bufOffset, size_t len, uint64_t offset,
                     Deadline deadline) noexcept {
    detail::FixedRwArgs a{-1, nullptr, -1, nullptr, 0, nullptr, 0, offset, true};
    if (!detail::setFile(a, file)) { return Error{EBADF}; }
    if (!detail::setBuffer(a, buf, bufOffset, len)) { return Error{EINVAL}; }
    return detail::fixedRw(a, deadline);
}

}  // namespace spindle
