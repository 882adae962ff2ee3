// SPDX-License-Identifier: Apache-2.0
// Death test for stack-overflow reporting (core/stack_overflow.cpp): a fiber that runs off the end of its stack hits
// the guard page, and the fault handler names the fiber and its id before the process aborts.

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "core/fiber.h"
#include "core/runtime.h"

namespace spindle {
namespace {

// Never reached: the guard page comes first. Volatile, so the compiler cannot prove the recursion endless
// (nor warn about it) and must keep every frame.
volatile uint64_t gDepthLimit = UINT64_MAX;

// Each frame holds a volatile array that is written before the call and read after it, so the call is not a
// tail call and the frames cannot be folded or optimised away.
__attribute__((noinline)) uint64_t recurse(uint64_t depth) {
    volatile char frame[512];
    frame[0] = static_cast<char>(depth);
    frame[sizeof(frame) - 1] = static_cast<char>(depth >> 8);
    if (depth >= gDepthLimit) { return frame[0]; }
    return recurse(depth + 1) + static_cast<uint64_t>(frame[0]) + static_cast<uint64_t>(frame[sizeof(frame) - 1]);
}

void overflowAFiber() {
    RuntimeOptions o;
    o.carriers = 1;
    auto rt = Runtime::start(o);
    if (!rt) {
        std::fprintf(stderr, "cannot start a runtime: %s\n", rt.error().message().c_str());
        std::exit(3);  // not a match for the expected message, so the death test fails
    }
    auto h = rt->spawn([] { return recurse(0); }, SpawnOptions{.name = "deep-recursion"});
    if (!h) {
        std::fprintf(stderr, "cannot spawn: %s\n", h.error().message().c_str());
        std::exit(3);
    }
    std::printf("unreachable: %llu\n", static_cast<unsigned long long>(h->join()));
}

TEST(StackOverflowDeathTest, ReportsTheFibersNameAndId) {
    // Unless the environment chose (the aarch64 flavour under qemu-user sets "fast": threadsafe re-executes
    // the binary, which qemu-user cannot do for a foreign one).
    if (std::getenv("GTEST_DEATH_TEST_STYLE") == nullptr) { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
    EXPECT_DEATH(overflowAFiber(), "stack overflow in fiber 'deep-recursion' \\(id [0-9]+\\)");
}

}  // namespace
}  // namespace spindle
