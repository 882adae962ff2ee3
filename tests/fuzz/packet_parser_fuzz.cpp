// SPDX-License-Identifier: Apache-2.0
// libFuzzer target for the DPDK stack's frame parser (net/dpdk/packet.h): every input is parsed as a
// frame for the corpus interface, and the invariants of packet_invariants.h must hold (replies built
// from what it accepts parse back at the sender). Seed corpus: tests/fuzz/corpus/packet/.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tests/fuzz/packet_invariants.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::span<const uint8_t> frame(data, size);
    const auto self = spindle::dpdk::testing_support::corpusInterface();
    const std::string broken = spindle::dpdk::testing_support::checkPacketInvariants(frame, self);
    if (!broken.empty()) {
        std::fprintf(stderr, "packet parser invariant broken: %s\n", broken.c_str());
        std::abort();
    }
    return 0;
}
