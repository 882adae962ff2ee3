// SPDX-License-Identifier: Apache-2.0
#include "core/driver/splice_ends.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>

#include <cerrno>
#include <initializer_list>

namespace spindle::detail {

int32_t setNonblocking(int fd) noexcept {
    const int fl = ::fcntl(fd, F_GETFL);
    if (fl < 0) { return -errno; }
    if ((fl & O_NONBLOCK) == 0 && ::fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0) { return -errno; }
    return 0;
}

int32_t prepareSpliceEnds(const op::Op& o) noexcept {
    struct stat in {};
    struct stat out {};
    if (::fstat(o.fd, &in) != 0 || ::fstat(o.fd2, &out) != 0) { return -errno; }
    bool other = false;
    for (const struct stat* sb : {&in, &out}) {
        if (!S_ISFIFO(sb->st_mode) && !S_ISSOCK(sb->st_mode)) { other = true; }
    }
    if (S_ISSOCK(in.st_mode)) {
        if (const int32_t r = setNonblocking(o.fd); r < 0) { return r; }
    }
    if (S_ISSOCK(out.st_mode)) {
        if (const int32_t r = setNonblocking(o.fd2); r < 0) { return r; }
    }
    return other ? kSpliceOtherEnd : 0;
}

int32_t spliceBlockedEnd(const op::Op& o) noexcept {
    pollfd p[2] = {{o.fd, POLLIN, 0}, {o.fd2, POLLOUT, 0}};
    if (::poll(p, 2, 0) < 0) { return -errno; }
    constexpr short kAnswered = POLLERR | POLLHUP | POLLNVAL;
    if ((p[0].revents & (POLLIN | kAnswered)) == 0) { return kSpliceInput; }
    if ((p[1].revents & (POLLOUT | kAnswered)) == 0) { return kSpliceOutput; }
    return -EAGAIN;
}

}  // namespace spindle::detail
