// SPDX-License-Identifier: Apache-2.0
#include "core/driver/splice_ends.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <initializer_list>

namespace spindle::detail {

// Plain system calls, not libc's: the descriptors may come from the ring (an accept, an open) and be
// closed there, which ThreadSanitizer's interceptors cannot see; a number they saw used here and then
// reused by another thread would read as a race on the descriptor. statx and ppoll: AArch64 has no
// fstat or poll system call.
namespace {

int32_t typeOf(int fd, uint16_t* mode) noexcept {
    struct statx sx {};
    if (::syscall(SYS_statx, fd, "", AT_EMPTY_PATH, STATX_TYPE, &sx) != 0) { return -errno; }
    *mode = sx.stx_mode;
    return 0;
}

}  // namespace

int32_t setNonblocking(int fd) noexcept {
    const long fl = ::syscall(SYS_fcntl, fd, F_GETFL);
    if (fl < 0) { return -errno; }
    if ((fl & O_NONBLOCK) == 0 && ::syscall(SYS_fcntl, fd, F_SETFL, fl | O_NONBLOCK) != 0) { return -errno; }
    return 0;
}

int32_t prepareSpliceEnds(const op::Op& o) noexcept {
    uint16_t in = 0;
    uint16_t out = 0;
    if (const int32_t r = typeOf(o.fd, &in); r < 0) { return r; }
    if (const int32_t r = typeOf(o.fd2, &out); r < 0) { return r; }
    bool other = false;
    for (const uint16_t mode : {in, out}) {
        if (!S_ISFIFO(mode) && !S_ISSOCK(mode)) { other = true; }
    }
    if (S_ISSOCK(in)) {
        if (const int32_t r = setNonblocking(o.fd); r < 0) { return r; }
    }
    if (S_ISSOCK(out)) {
        if (const int32_t r = setNonblocking(o.fd2); r < 0) { return r; }
    }
    return other ? kSpliceOtherEnd : 0;
}

int32_t spliceBlockedEnd(const op::Op& o) noexcept {
    pollfd p[2] = {{o.fd, POLLIN, 0}, {o.fd2, POLLOUT, 0}};
    const timespec zero{};
    if (::syscall(SYS_ppoll, p, 2, &zero, nullptr, 0) < 0) { return -errno; }
    constexpr short kAnswered = POLLERR | POLLHUP | POLLNVAL;
    if ((p[0].revents & (POLLIN | kAnswered)) == 0) { return kSpliceInput; }
    if ((p[1].revents & (POLLOUT | kAnswered)) == 0) { return kSpliceOutput; }
    return -EAGAIN;
}

}  // namespace spindle::detail
