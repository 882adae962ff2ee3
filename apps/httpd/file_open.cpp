// SPDX-License-Identifier: Apache-2.0
#include "apps/httpd/file_open.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/io.h"

namespace spindle::httpd {
namespace {

constexpr int kOpenFlags = O_RDONLY | O_NONBLOCK | O_NOCTTY;

/// Closes through the runtime; errors of a read-only descriptor's close change nothing here.
void closeQuietly(int fd) noexcept { (void)spindle::close(fd); }

/// The kNone fallback: one component at a time, none of them a link.
Result<int> openNoLinks(int rootFd, const char* rel) noexcept {
    std::array<char, 256> name{};
    int dir = rootFd;
    const char* p = rel;
    for (;;) {
        const char* slash = std::strchr(p, '/');
        const bool last = slash == nullptr;
        const size_t n = last ? std::strlen(p) : static_cast<size_t>(slash - p);
        if (n >= name.size()) {
            if (dir != rootFd) { closeQuietly(dir); }
            return Error{ENAMETOOLONG};
        }
        std::memcpy(name.data(), p, n);
        name[n] = '\0';
        Result<int> next = spindle::openat(dir, name.data(), (last ? kOpenFlags : O_RDONLY | O_DIRECTORY) | O_NOFOLLOW);
        if (!next && next.errorCode() == ENOTDIR) {
            // O_DIRECTORY | O_NOFOLLOW on a link says ENOTDIR: tell a link from a file.
            struct statx st{};
            if (spindle::statx(dir, name.data(), AT_SYMLINK_NOFOLLOW, STATX_TYPE, &st) && S_ISLNK(st.stx_mode)) {
                next = Error{ELOOP};
            }
        }
        if (dir != rootFd) { closeQuietly(dir); }
        if (!next || last) { return next; }
        dir = *next;
        p = slash + 1;
    }
}

/// The kBeneath fallback: open, then check where the descriptor leads.
Result<int> openThenCheck(int rootFd, const char* rel, std::string_view rootPath) noexcept {
    if (rootPath.empty() || rootPath.front() != '/') { return Error{EACCES}; }  // no root to compare with: refuse
    Result<int> fd = spindle::openat(rootFd, rel, kOpenFlags);
    if (!fd) { return fd; }
    std::array<char, 32> link{};
    std::snprintf(link.data(), link.size(), "/proc/self/fd/%d", *fd);
    std::array<char, 4096> target{};
    const ssize_t n = ::readlink(link.data(), target.data(), target.size());
    if (n <= 0 || static_cast<size_t>(n) >= target.size()) {
        closeQuietly(*fd);
        return Error{EACCES};  // cannot tell: refuse
    }
    const std::string_view where(target.data(), static_cast<size_t>(n));
    const bool inside = rootPath == "/" ||
                        (where.starts_with(rootPath) && (where.size() == rootPath.size() || where[rootPath.size()] == '/'));
    if (!inside) {
        closeQuietly(*fd);
        return Error{EXDEV};
    }
    return fd;
}

}  // namespace

bool probeOpenat2(int rootFd) noexcept {
    open_how how{.flags = O_RDONLY | O_DIRECTORY | O_CLOEXEC, .mode = 0, .resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS};
    const long fd = ::syscall(SYS_openat2, rootFd, ".", &how, sizeof how);
    if (fd < 0) { return false; }
    ::close(static_cast<int>(fd));
    return true;
}

Result<int> openUnderRoot(int rootFd, const char* rel, SymlinkPolicy policy, bool useOpenat2,
                          std::string_view rootPath) noexcept {
    switch (policy) {
        case SymlinkPolicy::kFollow:
            return spindle::openat(rootFd, rel, kOpenFlags);
        case SymlinkPolicy::kBeneath:
            if (useOpenat2) { return spindle::openat2(rootFd, rel, kOpenFlags, 0, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS); }
            return openThenCheck(rootFd, rel, rootPath);
        case SymlinkPolicy::kNone:
            if (useOpenat2) { return spindle::openat2(rootFd, rel, kOpenFlags, 0, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS); }
            return openNoLinks(rootFd, rel);
    }
    return Error{EINVAL};
}

}  // namespace spindle::httpd
