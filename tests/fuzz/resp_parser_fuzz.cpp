// SPDX-License-Identifier: Apache-2.0
// libFuzzer target for spindle-kv's RESP request parser: every input is parsed under the default limits
// and under tight ones, and the invariants of resp_parser_invariants.h must hold.
// Seed corpus: tests/fuzz/corpus/resp/.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "tests/fuzz/resp_parser_invariants.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view input(reinterpret_cast<const char*>(data), size);
    const spindle::kv::RespLimits defaults;
    const spindle::kv::RespLimits tight{.maxBulkLength = 16, .maxMultibulkLength = 4, .maxInlineSize = 32};
    for (const auto& limits : {defaults, tight}) {
        const std::string broken = spindle::kv::testing_support::checkRespInvariants(input, limits);
        if (!broken.empty()) {
            std::fprintf(stderr, "resp parser invariant broken: %s\n", broken.c_str());
            std::abort();
        }
    }
    return 0;
}
