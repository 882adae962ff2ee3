// SPDX-License-Identifier: Apache-2.0
// Feeds every frame of the fuzzing seed corpus (tests/fuzz/corpus/packet/) through the DPDK stack's
// parser, in every build flavour, and checks the invariants the fuzzer checks; the corpus holds
// each verdict the parser can give.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <vector>

#include "tests/fuzz/packet_invariants.h"

namespace spindle::dpdk {
namespace {

TEST(DpdkPacketCorpus, EveryFrameKeepsTheInvariants) {
    const std::filesystem::path dir(SPINDLE_PACKET_CORPUS_DIR);
    ASSERT_TRUE(std::filesystem::is_directory(dir)) << dir;
    const InterfaceAddress self = testing_support::corpusInterface();
    size_t files = 0;
    std::set<FrameKind> kinds;
    std::set<DropReason> reasons;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
        if (!entry.is_regular_file()) { continue; }
        std::ifstream in(entry.path(), std::ios::binary);
        const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        ++files;
        EXPECT_EQ(testing_support::checkPacketInvariants(bytes, self), "") << entry.path();
        const ParsedFrame p = parseFrame(bytes, self);
        kinds.insert(p.kind);
        reasons.insert(p.reason);
    }
    EXPECT_GE(files, 25u) << "the seed corpus should hold tens of frames";
    EXPECT_EQ(kinds.size(), 5u) << "every kind of frame, drops included";
    EXPECT_EQ(reasons.size(), static_cast<size_t>(DropReason::kCount)) << "every drop reason, and none";
}

}  // namespace
}  // namespace spindle::dpdk
