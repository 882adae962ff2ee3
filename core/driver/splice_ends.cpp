// SPDX-License-Identifier: Apache-2.0
#include "core/driver/splice_ends.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>

namespace spindle::detail {

// Plain system calls, not libc's: the descriptors may come from the ring (an accept, an open) and be
// closed there, which ThreadSanitizer's interceptors cannot see; a number they saw used here and then
// reused by another thread would read as a race on the descriptor. ppoll: AArch64 has no poll.
namespace {

long flagsOf(int fd) noexcept { return ::syscall(SYS_fcntl, fd, F_GETFL); }

// Makes `fd` wait no more than SPLICE_F_NONBLOCK lets it: a socket is made O_NONBLOCK (the flag
// covers pipes). With `other`, also sets *other for anything but a pipe or a socket. One fcntl for a
// descriptor that is O_NONBLOCK already (a socket after its first splice here, a pipe made so) when
// `other` is null; an fstat more otherwise, and one more fcntl to set the flag. 0, or -errno (EBADF).
int32_t prepareEnd(int fd, bool* other) noexcept {
    const long fl = flagsOf(fd);
    if (fl < 0) { return -errno; }
    if ((fl & O_NONBLOCK) != 0 && other == nullptr) { return 0; }
    struct stat st {};
    if (::syscall(SYS_fstat, fd, &st) != 0) { return -errno; }
    if (other != nullptr && !S_ISFIFO(st.st_mode) && !S_ISSOCK(st.st_mode)) { *other = true; }
    if ((fl & O_NONBLOCK) == 0 && S_ISSOCK(st.st_mode) &&
        ::syscall(SYS_fcntl, fd, F_SETFL, fl | O_NONBLOCK) != 0) {
        return -errno;
    }
    return 0;
}

}  // namespace

int32_t setNonblocking(int fd) noexcept {
    const long fl = flagsOf(fd);
    if (fl < 0) { return -errno; }
    if ((fl & O_NONBLOCK) == 0 && ::syscall(SYS_fcntl, fd, F_SETFL, fl | O_NONBLOCK) != 0) { return -errno; }
    return 0;
}

int32_t prepareSpliceEnds(const op::Op& o) noexcept {
    bool other = false;
    if (const int32_t r = prepareEnd(o.fd, &other); r < 0) { return r; }
    if (const int32_t r = prepareEnd(o.fd2, &other); r < 0) { return r; }
    return other ? kSpliceOtherEnd : 0;
}

int32_t makeSpliceEndsNonblocking(const op::Op& o) noexcept {
    if (const int32_t r = prepareEnd(o.fd, nullptr); r < 0) { return r; }
    return prepareEnd(o.fd2, nullptr);
}

int32_t spliceBlockedEnd(const op::Op& o) noexcept {
    pollfd p[2] = {{o.fd, POLLIN, 0}, {o.fd2, POLLOUT, 0}};
    const timespec zero{};
    long n;
    do {
        n = ::syscall(SYS_ppoll, p, 2, &zero, nullptr, 0);
    } while (n < 0 && errno == EINTR);  // a signal handler ran: look again
    if (n < 0) { return -errno; }
    constexpr short kAnswered = POLLERR | POLLHUP | POLLNVAL;
    if ((p[0].revents & (POLLIN | kAnswered)) == 0) { return kSpliceInput; }
    if ((p[1].revents & (POLLOUT | kAnswered)) == 0) { return kSpliceOutput; }
    return -EAGAIN;
}

}  // namespace spindle::detail
