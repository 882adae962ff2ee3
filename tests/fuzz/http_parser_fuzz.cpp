// SPDX-License-Identifier: Apache-2.0
// libFuzzer target for the spindle-httpd request parser and path resolver: every input is parsed
// under the default limits and under tight ones, and the invariants of http_parser_invariants.h
// must hold. Seed corpus: tests/fuzz/corpus/http/.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "tests/fuzz/http_parser_invariants.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view input(reinterpret_cast<const char*>(data), size);
    const spindle::httpd::ParserLimits defaults;
    const spindle::httpd::ParserLimits tight{.maxHeaderBytes = 64, .maxHeaders = 3, .maxBodyBytes = 10};
    for (const auto& limits : {defaults, tight}) {
        const std::string broken = spindle::httpd::testing_support::checkParserInvariants(input, limits);
        if (!broken.empty()) {
            std::fprintf(stderr, "http parser invariant broken: %s\n", broken.c_str());
            std::abort();
        }
    }
    return 0;
}
