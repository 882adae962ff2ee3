// SPDX-License-Identifier: Apache-2.0
#pragma once
/// One I/O operation, described once and neutrally, for every driver (io_uring, epoll).
///
/// Above the driver seam a call fills an op::Op with one of the constructors below and hands it to
/// its carrier's driver inside an IoRequest; each driver translates ops in one place (the io_uring
/// driver's prepare(), the epoll driver's attempt()). Nothing above core/driver/ names an SQE.
///
/// Field use per code is given by the constructors: `fd`, `addr` (a buffer, iovec array, path,
/// msghdr or sockaddr), `addr2` (a second path, a statx buffer, a socklen_t*), `len` (bytes, iovec
/// count, poll mask, mode), `off`/`off2` (offsets and lengths), `fd2`, `opFlags` (the call's own
/// flags: MSG_*, O_*, AT_*, RENAME_*, SPLICE_F_*, an fsync's datasync bit, a statx mask in `len`).

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <cstdint>

namespace spindle::op {

enum class Code : uint8_t {
    kNop,
    kRead,
    kWrite,
    kReadv,
    kWritev,
    kFsync,      // opFlags: kDatasync for fdatasync
    kOpenat,
    kClose,
    kStatx,
    kFallocate,
    kUnlinkat,
    kRenameat,
    kMkdirat,
    kPoll,       // len: the poll(2) event mask; the result is revents
    kSplice,
    kTee,
    kAccept,     // addr/addr2: sockaddr* and socklen_t* (may be null); opFlags: SOCK_CLOEXEC...
    kConnect,
    kRecv,
    kSend,
    kRecvmsg,
    kSendmsg,
    kShutdown,   // opFlags: SHUT_RD, SHUT_WR or SHUT_RDWR
    kAcceptMultishot,  // one completion per accepted connection, with kMore while it stays armed
    kRecvMultishot,    // one completion per received buffer (needs kBufferSelect), with kMore
    kOpenat2,    // addr: the path, addr2: a struct open_how (flags, mode, resolve)
};

/// Op::flags.
inline constexpr uint8_t kFixedFile = 1;     // `fd` is a slot of the carrier's registered-file table
inline constexpr uint8_t kFixedBuffer = 2;   // read/write from registered buffer `bufIndex` (io_uring only)
inline constexpr uint8_t kBufferSelect = 4;  // the driver picks the buffer from group `bufIndex` (recv, multishot recv)

/// Op::opFlags of kFsync.
inline constexpr uint32_t kDatasync = 1;

/// Completion flags (the `flags` of IoRequest::complete), with io_uring's CQE flag values so that
/// the io_uring driver passes them through unchanged.
inline constexpr uint32_t kBufferPicked = 1u << 0;  // a buffer was picked; its id is flags >> kBufferShift
inline constexpr uint32_t kMore = 1u << 1;          // a multishot operation stays armed after this one
inline constexpr uint32_t kSockNonempty = 1u << 2;  // the socket had more data when this receive finished
inline constexpr unsigned kBufferShift = 16;

struct Op {
    Code code = Code::kNop;
    uint8_t flags = 0;
    uint16_t bufIndex = 0;
    int fd = -1;
    int fd2 = -1;
    uint32_t len = 0;
    uint32_t opFlags = 0;
    void* addr = nullptr;
    void* addr2 = nullptr;
    uint64_t off = 0;
    uint64_t off2 = 0;

    /// The events a readiness-driven driver waits for before retrying this op (EPOLLIN/EPOLLOUT bits).
    [[nodiscard]] bool writes() const noexcept {
        return code == Code::kWrite || code == Code::kWritev || code == Code::kSend || code == Code::kSendmsg ||
               code == Code::kConnect;
    }
};

// ---- constructors: one per operation; the only place that says which field holds what ----------

inline Op nop() noexcept { return Op{}; }
/// `off` ~0 (kCurrentPosition): the file position, as read(2) does.
inline Op read(int fd, void* buf, uint32_t len, uint64_t off) noexcept {
    return Op{.code = Code::kRead, .fd = fd, .len = len, .addr = buf, .off = off};
}
inline Op write(int fd, const void* buf, uint32_t len, uint64_t off) noexcept {
    return Op{.code = Code::kWrite, .fd = fd, .len = len, .addr = const_cast<void*>(buf), .off = off};
}
inline Op readv(int fd, const iovec* iov, uint32_t iovcnt, uint64_t off) noexcept {
    return Op{.code = Code::kReadv, .fd = fd, .len = iovcnt, .addr = const_cast<iovec*>(iov), .off = off};
}
inline Op writev(int fd, const iovec* iov, uint32_t iovcnt, uint64_t off) noexcept {
    return Op{.code = Code::kWritev, .fd = fd, .len = iovcnt, .addr = const_cast<iovec*>(iov), .off = off};
}
inline Op fsync(int fd, bool datasync) noexcept {
    return Op{.code = Code::kFsync, .fd = fd, .opFlags = datasync ? kDatasync : 0};
}
inline Op openat(int dirfd, const char* path, int flags, mode_t mode) noexcept {
    return Op{.code = Code::kOpenat, .fd = dirfd, .len = mode, .opFlags = static_cast<uint32_t>(flags),
              .addr = const_cast<char*>(path)};
}
/// `how` (a struct open_how) must stay valid until the operation completes.
inline Op openat2(int dirfd, const char* path, void* how) noexcept {
    return Op{.code = Code::kOpenat2, .fd = dirfd, .addr = const_cast<char*>(path), .addr2 = how};
}
inline Op close(int fd) noexcept { return Op{.code = Code::kClose, .fd = fd}; }
inline Op statx(int dirfd, const char* path, int flags, unsigned mask, struct statx* out) noexcept {
    return Op{.code = Code::kStatx, .fd = dirfd, .len = mask, .opFlags = static_cast<uint32_t>(flags),
              .addr = const_cast<char*>(path), .addr2 = out};
}
inline Op fallocate(int fd, int mode, uint64_t off, uint64_t len) noexcept {
    return Op{.code = Code::kFallocate, .fd = fd, .opFlags = static_cast<uint32_t>(mode), .off = off, .off2 = len};
}
inline Op unlinkat(int dirfd, const char* path, int flags) noexcept {
    return Op{.code = Code::kUnlinkat, .fd = dirfd, .opFlags = static_cast<uint32_t>(flags),
              .addr = const_cast<char*>(path)};
}
inline Op renameat(int olddirfd, const char* oldpath, int newdirfd, const char* newpath, unsigned flags) noexcept {
    return Op{.code = Code::kRenameat, .fd = olddirfd, .fd2 = newdirfd, .opFlags = flags,
              .addr = const_cast<char*>(oldpath), .addr2 = const_cast<char*>(newpath)};
}
inline Op mkdirat(int dirfd, const char* path, mode_t mode) noexcept {
    return Op{.code = Code::kMkdirat, .fd = dirfd, .len = mode, .addr = const_cast<char*>(path)};
}
inline Op poll(int fd, unsigned mask) noexcept { return Op{.code = Code::kPoll, .fd = fd, .len = mask}; }
/// Offsets of -1: the file position (a pipe takes only -1).
inline Op splice(int fdIn, int64_t offIn, int fdOut, int64_t offOut, uint32_t len, unsigned flags) noexcept {
    return Op{.code = Code::kSplice, .fd = fdIn, .fd2 = fdOut, .len = len, .opFlags = flags,
              .off = static_cast<uint64_t>(offIn), .off2 = static_cast<uint64_t>(offOut)};
}
inline Op tee(int fdIn, int fdOut, uint32_t len, unsigned flags) noexcept {
    return Op{.code = Code::kTee, .fd = fdIn, .fd2 = fdOut, .len = len, .opFlags = flags};
}
inline Op accept(int fd, sockaddr* addr, socklen_t* addrLen, int flags) noexcept {
    return Op{.code = Code::kAccept, .fd = fd, .opFlags = static_cast<uint32_t>(flags), .addr = addr,
              .addr2 = addrLen};
}
inline Op acceptMultishot(int fd, int flags) noexcept {
    return Op{.code = Code::kAcceptMultishot, .fd = fd, .opFlags = static_cast<uint32_t>(flags)};
}
inline Op connect(int fd, const sockaddr* addr, socklen_t len) noexcept {
    return Op{.code = Code::kConnect, .fd = fd, .len = len, .addr = const_cast<sockaddr*>(addr)};
}
inline Op recv(int fd, void* buf, uint32_t len, int flags) noexcept {
    return Op{.code = Code::kRecv, .fd = fd, .len = len, .opFlags = static_cast<uint32_t>(flags), .addr = buf};
}
/// A receive into a buffer the driver picks from group `group` (kBufferSelect): an io_uring provided-buffer
/// ring, or a BufferGroup registered with the epoll driver.
inline Op recvSelect(int fd, uint32_t len, uint16_t group) noexcept {
    return Op{.code = Code::kRecv, .flags = kBufferSelect, .bufIndex = group, .fd = fd, .len = len};
}
inline Op recvMultishot(int fd, uint16_t group) noexcept {
    return Op{.code = Code::kRecvMultishot, .flags = kBufferSelect, .bufIndex = group, .fd = fd};
}
inline Op send(int fd, const void* buf, uint32_t len, int flags) noexcept {
    return Op{.code = Code::kSend, .fd = fd, .len = len, .opFlags = static_cast<uint32_t>(flags),
              .addr = const_cast<void*>(buf)};
}
inline Op recvmsg(int fd, msghdr* msg, int flags) noexcept {
    return Op{.code = Code::kRecvmsg, .fd = fd, .opFlags = static_cast<uint32_t>(flags), .addr = msg};
}
inline Op sendmsg(int fd, const msghdr* msg, int flags) noexcept {
    return Op{.code = Code::kSendmsg, .fd = fd, .opFlags = static_cast<uint32_t>(flags),
              .addr = const_cast<msghdr*>(msg)};
}
inline Op shutdown(int fd, int how) noexcept {
    return Op{.code = Code::kShutdown, .fd = fd, .opFlags = static_cast<uint32_t>(how)};
}

/// An op in flight and the one completion kind every driver calls: `complete(req, res, flags)` on the
/// carrier that holds it, once (or, for a multishot op, once per result while `flags` has kMore).
/// `res` >= 0 is the op's value, < 0 a -errno. The request, and the op it points at, live until its
/// last completion: a readiness-driven driver keeps it queued and retries the op from it. (The op is
/// pointed at, not copied: a call builds it in its own frame just before, and a copy would load what
/// was just stored in pieces, which the CPU cannot forward.)
/// Thread-safety: owner carrier only.
struct IoRequest {
    using CompleteFn = void (*)(IoRequest* req, int32_t res, uint32_t flags) noexcept;

    IoRequest() noexcept = default;
    IoRequest(const Op* o, CompleteFn fn) noexcept : op(o), complete(fn) {}

    const Op* op = nullptr;
    CompleteFn complete = nullptr;
    uint64_t deadlineNs = 0;       // absolute CLOCK_MONOTONIC; 0: none. The driver cancels the op then (-ECANCELED)
    // ---- driver state: left uninitialised here (a request is built on the I/O path), written by the
    // driver before it reads any of it; untouched above the seam. One driver's fields share the space
    // of the other's: a request lives on the fiber's stack, and each cache line it spans is one more
    // for every operation in flight.
    struct EpollState {
        IoRequest* next;       // the fd's waiter list
        union {
            IoRequest* prev;
            uint64_t retryAtNs;  // instead, for a splice waiting out a lasting EAGAIN in no list: its next try
        };
        uint64_t heapIndex;    // position in the driver's deadline heap (+1; 0: not in it)
        uint64_t parker;       // the id of the fiber that parked it (0: none), see FdState::provenFor
    };
    struct UringState {
        int64_t timeoutSpec[2];  // the linked timeout's timespec, read at submission
        int32_t savedRes;        // with a deadline: the op's result, kept until the timeout's CQE
        uint32_t savedFlags;     // ... and its flags
    };
    union {
        EpollState epoll;
        UringState uring;
    };
    uint32_t driverState;          // io_uring: CQEs still due (op + linked timeout); epoll: parked or
                                   // not, kConnecting while a connect is in progress, kRetrying (and
                                   // its backoff) while a splice waits out a lasting EAGAIN
    uint32_t inlineFlags = 0;      // the completion flags (kBufferPicked, ...) of a result that
                                   // Driver::start() returned at once instead of completing
};
static_assert(sizeof(IoRequest) <= 64, "an IoRequest fits one cache line");

}  // namespace spindle::op
