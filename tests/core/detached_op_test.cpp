// SPDX-License-Identifier: Apache-2.0
// startDetached (core/ring_ops.h): a one-shot operation the starting fiber does not wait for. Its result
// comes either at once (an operation that finished on the driver's first try, or one the epoll driver
// runs on the offload pool) or later through the completion's function, on the starting carrier, as a
// last completion (no op::kMore), exactly once. Both backends (ctest runs the suite on each).

#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstring>
#include <optional>

#include "core/fiber.h"
#include "core/fiber_future.h"
#include "core/ring_ops.h"
#include "core/runtime.h"
#include "tests/core/with_runtime.h"

namespace spindle {
namespace {

using testing_support::testBackend;

/// A detached operation's completion that records each call of its function.
struct Detached : MultishotCompletion {
    FiberFuture done;
    std::atomic<int> calls{0};
    std::atomic<uint32_t> flags{0};
    std::atomic<int> carrier{-2};
    Detached() { fn = &Detached::onCompletion; }
    static void onCompletion(MultishotCompletion* self, int32_t res, uint32_t flags) noexcept {
        auto* d = static_cast<Detached*>(self);
        d->calls.fetch_add(1);
        d->flags.store(flags);
        d->carrier.store(this_fiber::carrierIndex());
        d->done.set(res);
    }
    /// The function's result, or -ETIMEDOUT after 5 s (a completion that never came).
    int32_t waitDone() { return FiberFuture::waitWithTimeout(&done, std::chrono::seconds(5)); }
    /// The result of startDetached's return `r`: checks that it came at once when `atOnce`, else
    /// through the function, and returns it.
    int32_t resultOf(std::optional<int32_t> r, bool atOnce) {
        EXPECT_EQ(r.has_value(), atOnce) << (r ? *r : 0);
        return r ? *r : waitDone();
    }
};

/// A connected AF_UNIX stream pair (pollable on both backends), closed on destruction.
struct SocketPair {
    int fd[2] = {-1, -1};
    SocketPair() { EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fd), 0); }
    ~SocketPair() {
        for (const int f : fd) {
            if (f >= 0) { ::close(f); }
        }
    }
};

class DetachedOp : public testing_support::WithRuntime {};

// Nothing to receive yet: the call returns at once with nothing, and the bytes written later arrive
// through the function, on the carrier that started it, as the operation's only and last completion.
TEST_F(DetachedOp, AReceiveThatMustWaitCompletesThroughItsFunctionOnTheStartingCarrier) {
    SocketPair s;
    Detached d;
    char buf[16] = {};
    on(1, [&] {
        const std::optional<int32_t> r = startDetached(op::recv(s.fd[0], buf, sizeof(buf), 0), &d);
        EXPECT_FALSE(r.has_value()) << *r;
        EXPECT_EQ(d.calls.load(), 0);
        ASSERT_EQ(::write(s.fd[1], "hello", 5), 5);
        EXPECT_EQ(d.waitDone(), 5);
        settleMultishot(&d);
    }).join();
    EXPECT_EQ(d.calls.load(), 1);
    EXPECT_EQ(d.flags.load() & op::kMore, 0u);
    EXPECT_EQ(d.carrier.load(), 1);
    EXPECT_EQ(std::memcmp(buf, "hello", 5), 0);
}

// Bytes already there: a readiness driver's first try gets them, and the call returns the result
// without calling the function; io_uring queues the receive and the function brings the same result.
TEST_F(DetachedOp, AReceiveWithBytesWaitingFinishesAtOnceOnEpollAndThroughTheFunctionOnIoUring) {
    SocketPair s;
    ASSERT_EQ(::write(s.fd[1], "ready", 5), 5);
    Detached d;
    char buf[16] = {};
    const bool readiness = testBackend() == Backend::kEpoll;
    on(0, [&] {
        EXPECT_EQ(d.resultOf(startDetached(op::recv(s.fd[0], buf, sizeof(buf), 0), &d), readiness), 5);
        settleMultishot(&d);
    }).join();
    EXPECT_EQ(d.calls.load(), readiness ? 0 : 1);
    EXPECT_EQ(std::memcmp(buf, "ready", 5), 0);
}

// A path operation: the epoll driver has no readiness for it and runs the blocking call on the offload
// pool, which startDetached waits for and returns (the function is not called); io_uring runs it in
// the ring and calls the function. The result and the output are the same.
TEST_F(DetachedOp, APathOperationRunsOnThePoolOnEpollAndInTheRingOnIoUring) {
    Detached d;
    struct statx sx {};
    const bool pool = testBackend() == Backend::kEpoll;
    on(0, [&] {
        EXPECT_EQ(d.resultOf(startDetached(op::statx(AT_FDCWD, "/", 0, STATX_TYPE, &sx), &d), pool), 0);
        settleMultishot(&d);
    }).join();
    EXPECT_EQ(d.calls.load(), pool ? 0 : 1);
    EXPECT_TRUE(S_ISDIR(sx.stx_mode));
}

// An error on the pool comes back as the result, negative, like any other.
TEST_F(DetachedOp, APathOperationsErrorIsItsResult) {
    Detached d;
    struct statx sx {};
    const bool pool = testBackend() == Backend::kEpoll;
    on(0, [&] {
        const op::Op missing = op::statx(AT_FDCWD, "/nonexistent/spindle-detached-op", 0, STATX_TYPE, &sx);
        EXPECT_EQ(d.resultOf(startDetached(missing, &d), pool), -ENOENT);
        settleMultishot(&d);
    }).join();
    EXPECT_EQ(d.calls.load(), pool ? 0 : 1);
}

// cancelMultishot ends a detached operation as it ends a multishot one: the function's one call brings
// -ECANCELED, from the carrier itself and from a plain thread.
TEST_F(DetachedOp, ACancelEndsItWithEcanceledFromTheCarrierAndFromAThread) {
    SocketPair s;
    char buf[16];
    {
        Detached d;
        on(0, [&] {
            EXPECT_FALSE(startDetached(op::recv(s.fd[0], buf, sizeof(buf), 0), &d).has_value());
            EXPECT_TRUE(cancelMultishot(&d));
            EXPECT_EQ(d.waitDone(), -ECANCELED);
            settleMultishot(&d);
        }).join();
        EXPECT_EQ(d.calls.load(), 1);
    }
    Detached d;
    on(1, [&] { EXPECT_FALSE(startDetached(op::recv(s.fd[0], buf, sizeof(buf), 0), &d).has_value()); }).join();
    EXPECT_TRUE(cancelMultishot(&d));  // from this thread: a message to carrier 1
    EXPECT_EQ(d.waitDone(), -ECANCELED);
    settleMultishot(&d);
    EXPECT_EQ(d.calls.load(), 1);
    EXPECT_EQ(d.carrier.load(), 1);
}

// Off-carrier there is no driver to start it: -EPERM, and nothing is called.
TEST_F(DetachedOp, OffCarrierItIsEperm) {
    Detached d;
    const std::optional<int32_t> r = startDetached(op::nop(), &d);
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(*r, -EPERM);
    EXPECT_EQ(d.calls.load(), 0);
}

}  // namespace
}  // namespace spindle
