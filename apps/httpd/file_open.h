// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Opening a file under spindle-httpd's document root with a policy for symbolic links, through
/// the runtime's I/O calls (so on the carrier's ring, or its epoll driver).
///
/// With openat2(2) (kernel 5.6) the kernel enforces the policy during the lookup (RESOLVE_BENEATH,
/// RESOLVE_NO_SYMLINKS). Without it: kNone walks the path one component at a time with O_NOFOLLOW;
/// kBeneath opens the path and then compares the file's path, read back from /proc/self/fd, with the
/// root's (refusing the file when /proc cannot say).
/// Thread-safety: the functions keep no state; call them from fibers of the runtime.

#include <cstdint>
#include <string_view>

#include "base/result.h"

namespace spindle::httpd {

/// Which symbolic links a request may pass through (nginx's disable_symlinks, roughly).
enum class SymlinkPolicy : uint8_t {
    kFollow,   // any link, wherever it leads (most servers' default)
    kBeneath,  // links whose target stays under the root; ".." and absolute links are refused
    kNone,     // no link anywhere in the path below the root (nginx's `disable_symlinks on`)
};

/// Whether openat2(2) with RESOLVE_BENEATH works here (a plain system call: call it at start).
[[nodiscard]] bool probeOpenat2(int rootFd) noexcept;

/// Opens `rel` (relative, as resolvePath() makes it) under `rootFd` read-only, close-on-exec and
/// non-blocking (a FIFO must not hang the open), following the links `policy` allows. `rootPath` is
/// the root's real path (realpath(3)), used by the kBeneath fallback only.
/// Errors: ELOOP or EXDEV for a path the policy refuses (ELOOP: a link under kNone; EXDEV: a way out
/// of the root under kBeneath); EACCES where the kBeneath fallback cannot tell where the file is
/// (/proc unreadable, `rootPath` empty); otherwise openat's errors (ENOENT, ENOTDIR, EACCES, EMFILE, ...).
[[nodiscard]] Result<int> openUnderRoot(int rootFd, const char* rel, SymlinkPolicy policy, bool useOpenat2,
                                        std::string_view rootPath) noexcept;

}  // namespace spindle::httpd
