// SPDX-License-Identifier: Apache-2.0
#include "base/check.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace spindle::detail {
namespace {
void put(const char* s) noexcept {
    size_t n = std::strlen(s);
    while (n > 0) {
        ssize_t w = ::write(STDERR_FILENO, s, n);
        if (w <= 0) { return; }
        s += w;
        n -= static_cast<size_t>(w);
    }
}
}  // namespace

void checkFailed(const char* expr, const char* file, int line, const char* msg) noexcept {
    char num[16];
    int i = static_cast<int>(sizeof(num)) - 1;
    num[i] = '\0';
    unsigned v = line < 0 ? 0u : static_cast<unsigned>(line);
    do {
        num[--i] = static_cast<char>('0' + v % 10);
        v /= 10;
    } while (v != 0 && i > 0);
    put("spindle: check failed: ");
    put(expr);
    put(" at ");
    put(file);
    put(":");
    put(num + i);
    if (msg != nullptr) {
        put(": ");
        put(msg);
    }
    put("\n");
    std::abort();
}
}  // namespace spindle::detail
