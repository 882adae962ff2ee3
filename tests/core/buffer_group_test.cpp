// SPDX-License-Identifier: Apache-2.0
// Unit tests of the epoll driver's receive-buffer group (core/driver/buffer_group.h): every buffer
// once, most recently returned first, -1 when all are out, returns from another thread (queued without a
// lock, drained by the owner), and a buffer given back that is not out caught. Then the registration with a carrier's driver and the ops the
// epoll driver refuses, on a runtime of each backend.

#include "core/driver/buffer_group.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <set>
#include <thread>
#include <vector>

#include "core/io.h"
#include "core/ring_ops.h"
#include "tests/core/with_runtime.h"

namespace spindle::detail {
namespace {

TEST(BufferGroup, HandsOutEveryBufferOnceThenNone) {
    std::vector<char> memory(4 * 16);
    BufferGroup g(memory.data(), 16, 4);
    EXPECT_EQ(g.count(), 4u);
    EXPECT_EQ(g.size(), 16u);
    std::set<int> ids;
    for (int i = 0; i < 4; ++i) {
        const int bid = g.take();
        ASSERT_GE(bid, 0);
        ASSERT_LT(bid, 4);
        EXPECT_TRUE(ids.insert(bid).second) << "buffer " << bid << " handed out twice";
        EXPECT_EQ(g.data(static_cast<uint16_t>(bid)), memory.data() + bid * 16);
    }
    EXPECT_EQ(g.take(), -1);
    EXPECT_EQ(g.available(), 0u);
}

TEST(BufferGroup, TheMostRecentlyReturnedBufferGoesOutFirst) {
    std::vector<char> memory(8 * 64);
    BufferGroup g(memory.data(), 64, 8);
    EXPECT_EQ(g.take(), 0) << "buffer 0 first";
    const int a = g.take();
    const int b = g.take();
    g.giveBack(static_cast<uint16_t>(a));
    g.giveBack(static_cast<uint16_t>(b));
    EXPECT_EQ(g.take(), b);  // warm in cache: it was the last one used
    EXPECT_EQ(g.take(), a);
}

TEST(BufferGroup, BuffersComeBackFromOtherThreads) {
    constexpr unsigned kCount = 256;
    std::vector<char> memory(kCount * 8);
    BufferGroup g(memory.data(), 8, kCount);
    std::vector<uint16_t> taken;
    for (unsigned i = 0; i < kCount; ++i) { taken.push_back(static_cast<uint16_t>(g.take())); }
    std::thread a([&] {
        for (unsigned i = 0; i < kCount; i += 2) { g.giveBack(taken[i]); }
    });
    std::thread b([&] {
        for (unsigned i = 1; i < kCount; i += 2) { g.giveBack(taken[i]); }
    });
    a.join();
    b.join();
    EXPECT_EQ(g.available(), kCount);
    std::set<int> ids;
    for (unsigned i = 0; i < kCount; ++i) { ids.insert(g.take()); }
    EXPECT_EQ(ids.size(), kCount);
    EXPECT_EQ(ids.count(-1), 0u);
}

TEST(BufferGroupDeathTest, ABufferGivenBackThatIsNotOutIsCaught) {
    std::vector<char> memory(4 * 8);
    BufferGroup g(memory.data(), 8, 4);
    const int a = g.take();
    const int b = g.take();
    ASSERT_GE(b, 0);
    g.giveBack(static_cast<uint16_t>(a));
    (void)g.available();  // the return is drained: `a` is free
    // Twice, while another buffer is still out (so the group is not full): caught all the same, when
    // the return reaches the free stack (at once on the owner; at the next drain elsewhere).
    EXPECT_DEATH(
        {
            g.giveBack(static_cast<uint16_t>(a));
            (void)g.available();
        },
        "not out");
    EXPECT_DEATH(
        {
            g.giveBack(3);  // never taken
            (void)g.available();
        },
        "not out");
    EXPECT_DEATH(g.giveBack(4), "not out");  // not one of the group's: caught at once
    // Given back twice before any drain: caught by the drain, never a loop.
    const int c = g.take();
    ASSERT_GE(c, 0);
    EXPECT_DEATH(
        {
            g.giveBack(static_cast<uint16_t>(c));
            g.giveBack(static_cast<uint16_t>(c));
            (void)g.available();
        },
        "not out");
}

class BufferGroupRegistration : public testing_support::WithRuntime {};

// Registration errors: off-carrier EPERM; on io_uring ENOTSUP (groups are kernel rings there); on
// epoll an id taken twice EEXIST and one not registered ENOENT.
TEST_F(BufferGroupRegistration, EachErrorAsDocumented) {
    std::vector<char> memory(4 * 64);
    BufferGroup g(memory.data(), 64, 4);
    EXPECT_EQ(registerBufferGroupHere(7, &g).errorCode(), EPERM);
    EXPECT_EQ(unregisterBufferGroupHere(7).errorCode(), EPERM);
    on(0, [&] {
        if (testing_support::testBackend() == Backend::kUring) {
            EXPECT_EQ(registerBufferGroupHere(7, &g).errorCode(), ENOTSUP);
            EXPECT_EQ(unregisterBufferGroupHere(7).errorCode(), ENOTSUP);
            return;
        }
        auto r = registerBufferGroupHere(7, &g);
        ASSERT_TRUE(r) << r.error().message();
        EXPECT_EQ(*r, 0u);
        EXPECT_EQ(registerBufferGroupHere(7, &g).errorCode(), EEXIST);
        EXPECT_TRUE(unregisterBufferGroupHere(7));
        EXPECT_EQ(unregisterBufferGroupHere(7).errorCode(), ENOENT);
    }).join();
}

// What the epoll driver refuses at once: a multishot receive without a buffer group (EINVAL) or with
// one not registered (ENOBUFS, io_uring's answer), and buffer selection on anything but a receive.
TEST_F(BufferGroupRegistration, TheEpollDriverRefusesBufferSelectionItCannotServe) {
    if (testing_support::testBackend() != Backend::kEpoll) {
        GTEST_SKIP() << "the epoll driver's checks (io_uring reports these in the CQE)";
    }
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    on(0, [&] {
        MultishotCompletion c;
        c.fn = [](MultishotCompletion*, int32_t, uint32_t) {};
        EXPECT_EQ(armMultishot(op::recvMultishot(sv[0], 99), &c).errorCode(), ENOBUFS);
        op::Op noGroup = op::recvMultishot(sv[0], 99);
        noGroup.flags = 0;
        EXPECT_EQ(armMultishot(noGroup, &c).errorCode(), EINVAL);
        char byte = 'x';
        op::Op send = op::send(sv[0], &byte, 1, 0);
        send.flags = op::kBufferSelect;
        EXPECT_EQ(submitOp(send).res, -EINVAL);
    }).join();
    ::close(sv[0]);
    ::close(sv[1]);
}

}  // namespace
}  // namespace spindle::detail
