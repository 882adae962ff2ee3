// SPDX-License-Identifier: Apache-2.0
// The io_uring feature probe (core/driver/backend.h): each feature spindle uses, tried on this kernel.
#include "core/driver/backend.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <liburing.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "base/log.h"

namespace spindle::detail {

/// Whether the kernel sets up a 4-entry ring with `flags` (created and destroyed at once).
bool uringSetsUpWith(unsigned flags) noexcept {
    io_uring ring{};
    io_uring_params params{};
    params.flags = flags;
    params.sq_thread_idle = 1;  // read with SQPOLL only
    if (io_uring_queue_init_params(4, &ring, &params) < 0) { return false; }
    io_uring_queue_exit(&ring);
    return true;
}

namespace {

// ---- probeUring ---------------------------------------------------------------------------------------

constexpr uint64_t kArmed = 1;     // user_data of the operation under test
constexpr uint64_t kCancel = 2;    // user_data of its cancel
constexpr uint16_t kProbeGroup = 1;
constexpr unsigned kProbeBufs = 8;
constexpr unsigned kProbeBufSize = 64;

/// What came back for an operation that was armed, then cancelled.
struct Outcome {
    bool sawMore = false;   // a CQE with IORING_CQE_F_MORE: the operation stayed armed after posting
    bool ended = false;     // its final CQE (without F_MORE) arrived
    int32_t finalRes = 0;
};

/// Cancels kArmed and gathers CQEs until its final one and the cancel's have arrived, for one second at
/// most. With `resultIsFd` (accept), each descriptor the armed operation returns is closed.
Outcome cancelAndCollect(io_uring* ring, bool resultIsFd) noexcept {
    Outcome out;
    io_uring_sqe* sqe = io_uring_get_sqe(ring);
    if (sqe == nullptr) { return out; }
    io_uring_prep_cancel64(sqe, kArmed, 0);
    sqe->user_data = kCancel;
    if (io_uring_submit(ring) < 0) { return out; }
    bool cancelDone = false;
    for (int waits = 0; waits < 10 && !(out.ended && cancelDone); ++waits) {
        __kernel_timespec ts{.tv_sec = 0, .tv_nsec = 100'000'000};
        io_uring_cqe* cqe = nullptr;
        const int ret = io_uring_wait_cqe_timeout(ring, &cqe, &ts);
        if (ret == -ETIME || ret == -EINTR) { continue; }
        if (ret < 0) { break; }
        if (cqe->user_data == kCancel) {
            cancelDone = true;
        } else if (cqe->user_data == kArmed) {
            if (resultIsFd && cqe->res >= 0) { ::close(cqe->res); }
            if ((cqe->flags & IORING_CQE_F_MORE) != 0) {
                out.sawMore = true;
            } else {
                out.ended = true;
                out.finalRes = cqe->res;
            }
        }
        io_uring_cqe_seen(ring, cqe);
    }
    return out;
}

/// IORING_ACCEPT_MULTISHOT (5.19): armed on an idle loopback listener, then cancelled. A kernel without
/// it answers -EINVAL at once (the flag rides in sqe->ioprio, which older accepts reject); one with it
/// keeps the accept armed until the cancel ends it with -ECANCELED.
bool probeMultishotAccept(io_uring* ring) noexcept {
    const int lfd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (lfd < 0) { return false; }
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = 0;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bool supported = false;
    if (::bind(lfd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0 && ::listen(lfd, 4) == 0) {
        if (io_uring_sqe* sqe = io_uring_get_sqe(ring)) {
            io_uring_prep_multishot_accept(sqe, lfd, nullptr, nullptr, SOCK_CLOEXEC);
            sqe->user_data = kArmed;
            if (io_uring_submit(ring) == 1) {
                const Outcome o = cancelAndCollect(ring, /*resultIsFd=*/true);
                supported = o.ended && o.finalRes == -ECANCELED;
            }
        }
    }
    ::close(lfd);
    return supported;
}

/// IORING_RECV_MULTISHOT (6.0) from provided-buffer group kProbeGroup: one byte is waiting on the socket,
/// so a kernel with it posts that byte with F_MORE and stays armed until the cancel (-ECANCELED); one
/// without it answers -EINVAL, or (if it ignored the flag) a plain one-shot recv without F_MORE.
bool probeMultishotRecv(io_uring* ring) noexcept {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) { return false; }
    bool supported = false;
    const char byte = 'x';
    if (::write(sv[1], &byte, 1) == 1) {
        if (io_uring_sqe* sqe = io_uring_get_sqe(ring)) {
            io_uring_prep_recv_multishot(sqe, sv[0], nullptr, 0, 0);
            sqe->flags |= IOSQE_BUFFER_SELECT;
            sqe->buf_group = kProbeGroup;
            sqe->user_data = kArmed;
            if (io_uring_submit(ring) == 1) {
                const Outcome o = cancelAndCollect(ring, /*resultIsFd=*/false);
                supported = o.sawMore && o.ended && o.finalRes == -ECANCELED;
            }
        }
    }
    ::close(sv[0]);
    ::close(sv[1]);
    return supported;
}

/// Registers a provided-buffer ring (IORING_REGISTER_PBUF_RING, 5.19) as group kProbeGroup, fills it,
/// and runs the multishot recv probe on it.
void probeBufRing(io_uring* ring, UringProbe& probe) noexcept {
    // One page for the ring (kProbeBufs entries of 16 bytes), one for the buffers it hands out.
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    void* mem = ::mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) { return; }
    auto* br = static_cast<io_uring_buf_ring*>(mem);
    char* bufs = static_cast<char*>(mem) + page;
    io_uring_buf_ring_init(br);
    io_uring_buf_reg reg{};
    reg.ring_addr = reinterpret_cast<uint64_t>(br);
    reg.ring_entries = kProbeBufs;
    reg.bgid = kProbeGroup;
    if (io_uring_register_buf_ring(ring, &reg, 0) == 0) {
        probe.bufRing = true;
        const int mask = io_uring_buf_ring_mask(kProbeBufs);
        for (unsigned i = 0; i < kProbeBufs; ++i) {
            io_uring_buf_ring_add(br, bufs + i * kProbeBufSize, kProbeBufSize, static_cast<unsigned short>(i), mask,
                                  static_cast<int>(i));
        }
        io_uring_buf_ring_advance(br, kProbeBufs);
        probe.multishotRecv = probeMultishotRecv(ring);
        (void)io_uring_unregister_buf_ring(ring, kProbeGroup);
    }
    ::munmap(mem, 2 * page);
}

/// IORING_ASYNC_CANCEL_ANY (5.19) with nothing in flight: where the kernel knows the flag it answers
/// with the number of requests cancelled, 0 (not -ENOENT: ANY, like ALL, counts); before 5.19 a
/// non-zero cancel_flags is -EINVAL.
bool probeCancelAny(io_uring* ring) noexcept {
    io_uring_sqe* sqe = io_uring_get_sqe(ring);
    if (sqe == nullptr) { return false; }
    io_uring_prep_cancel64(sqe, 0, IORING_ASYNC_CANCEL_ANY);
    sqe->user_data = kCancel;
    if (io_uring_submit(ring) != 1) { return false; }
    __kernel_timespec ts{.tv_sec = 1, .tv_nsec = 0};
    io_uring_cqe* cqe = nullptr;
    if (io_uring_wait_cqe_timeout(ring, &cqe, &ts) != 0) { return false; }
    const bool supported = cqe->user_data == kCancel && cqe->res >= 0;
    io_uring_cqe_seen(ring, cqe);
    return supported;
}

/// One 4 KiB buffer registered and dropped again (io_uring_register_buffers, 5.1). Fails with ENOMEM
/// when the page would pass RLIMIT_MEMLOCK in a process without CAP_IPC_LOCK.
bool probeRegisteredBuffers(io_uring* ring) noexcept {
    void* mem = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) { return false; }
    iovec iov{mem, 4096};
    const bool ok = io_uring_register_buffers(ring, &iov, 1) == 0;
    if (ok) { (void)io_uring_unregister_buffers(ring); }
    ::munmap(mem, 4096);
    return ok;
}

/// A sparse table of one direct descriptor registered and dropped again (5.19).
bool probeRegisteredFiles(io_uring* ring) noexcept {
    const bool ok = io_uring_register_files_sparse(ring, 1) == 0;
    if (ok) { (void)io_uring_unregister_files(ring); }
    return ok;
}

UringProbe runProbe() noexcept {
    UringProbe probe;
    io_uring ring{};
    // A plain ring (no optional flags), so that any thread may submit to it and each probe below
    // answers for its own feature alone.
    const int ret = io_uring_queue_init(8, &ring, 0);
    if (ret < 0) {
        probe.setupError = -ret;
        return probe;
    }
    probe.singleIssuer = uringSetsUpWith(IORING_SETUP_SINGLE_ISSUER);
    probe.deferTaskrun = uringSetsUpWith(IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN);
    probe.coopTaskrun = uringSetsUpWith(IORING_SETUP_COOP_TASKRUN);
    probe.sqpoll = uringSetsUpWith(IORING_SETUP_SQPOLL);
    if (io_uring_probe* p = io_uring_get_probe_ring(&ring)) {
        probe.msgRing = io_uring_opcode_supported(p, IORING_OP_MSG_RING) != 0;
        io_uring_free_probe(p);
    }
    probe.multishotAccept = probeMultishotAccept(&ring);
    probeBufRing(&ring, probe);
    probe.registeredFiles = probeRegisteredFiles(&ring);
    probe.registeredBuffers = probeRegisteredBuffers(&ring);
    probe.cancelAny = probeCancelAny(&ring);
    io_uring_queue_exit(&ring);
    return probe;
}

}  // namespace

std::string UringProbe::describe() const {
    if (setupError != 0) { return fmt::format("io_uring: unavailable ({})", std::strerror(setupError)); }
    const auto yn = [](bool b) { return b ? "yes" : "no"; };
    return fmt::format("io_uring: single_issuer={} defer_taskrun={} coop_taskrun={} msg_ring={} multishot_accept={} "
                       "multishot_recv={} buf_ring={} registered_files={} registered_buffers={} sqpoll={} "
                       "cancel_any={}",
                       yn(singleIssuer), yn(deferTaskrun), yn(coopTaskrun), yn(msgRing), yn(multishotAccept),
                       yn(multishotRecv), yn(bufRing), yn(registeredFiles), yn(registeredBuffers), yn(sqpoll),
                       yn(cancelAny));
}

const UringProbe& probeUring() noexcept {
    static const UringProbe probe = runProbe();  // thread-safe once (a function-local static)
    return probe;
}

}  // namespace spindle::detail
