// SPDX-License-Identifier: Apache-2.0
// Tests for base/cpu_list.h: the lists parseCpuList accepts and what they mean, every kind of text it
// refuses (with no overflow of a long number into a small CPU), formatCpuList's ranges, and a round
// trip through a cpu_set_t.

#include "base/cpu_list.h"

#include <gtest/gtest.h>
#include <sched.h>

#include <optional>
#include <string>
#include <vector>

namespace spindle {
namespace {

using V = std::vector<unsigned>;

TEST(CpuList, ParsesAsProcWritesThem) {
    EXPECT_EQ(parseCpuList("0"), V{0});
    EXPECT_EQ(parseCpuList("0-0"), V{0});
    EXPECT_EQ(parseCpuList("3,1-2"), (V{1, 2, 3}));
    EXPECT_EQ(parseCpuList("2-3,3,2"), (V{2, 3}));
    EXPECT_EQ(parseCpuList("007"), V{7});
    EXPECT_EQ(parseCpuList(std::to_string(CPU_SETSIZE - 1)), V{CPU_SETSIZE - 1});
}

TEST(CpuList, RefusesWhatIsNotAList) {
    for (const char* bad : {"", ",", "1,", ",1", "1,,2", "-1", "3-1", "1-", " 1", "1 ", "0-10:2", "x", "1.5"}) {
        EXPECT_EQ(parseCpuList(bad), std::nullopt) << "'" << bad << "'";
    }
    EXPECT_EQ(parseCpuList(std::to_string(CPU_SETSIZE)), std::nullopt);
    EXPECT_EQ(parseCpuList("99999999999999999999999"), std::nullopt);  // no overflow into a small number
}

TEST(CpuList, FormatsRunsAsRanges) {
    EXPECT_EQ(formatCpuList({}), "");
    EXPECT_EQ(formatCpuList({5}), "5");
    EXPECT_EQ(formatCpuList({8, 1, 2, 3}), "1-3,8");
    EXPECT_EQ(formatCpuList({1, 1, 2}), "1-2");
    EXPECT_EQ(formatCpuList({0, 2, 4}), "0,2,4");
}

TEST(CpuList, RoundTripsThroughACpuSet) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (const unsigned c : {0u, 1u, 2u, 9u, CPU_SETSIZE - 1u}) { CPU_SET(c, &set); }
    const V cpus = cpusIn(set);
    EXPECT_EQ(cpus, (V{0, 1, 2, 9, CPU_SETSIZE - 1}));
    EXPECT_EQ(parseCpuList(formatCpuList(cpus)), cpus);
}

}  // namespace
}  // namespace spindle
