// SPDX-License-Identifier: Apache-2.0
// Feeds every file of the fuzzing seed corpus (tests/fuzz/corpus/http/) through the parser, in every
// build flavour, and checks the invariants the fuzzer checks.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "tests/fuzz/http_parser_invariants.h"

namespace spindle::httpd {
namespace {

TEST(HttpCorpus, EveryFileKeepsTheInvariants) {
    const std::filesystem::path dir(SPINDLE_HTTP_CORPUS_DIR);
    ASSERT_TRUE(std::filesystem::is_directory(dir)) << dir;
    size_t files = 0;
    size_t complete = 0;
    size_t errors = 0;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
        if (!entry.is_regular_file()) { continue; }
        std::ifstream in(entry.path(), std::ios::binary);
        const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        ++files;
        for (const ParserLimits& limits : {ParserLimits{}, ParserLimits{.maxHeaderBytes = 64, .maxHeaders = 3, .maxBodyBytes = 10}}) {
            EXPECT_EQ(testing_support::checkParserInvariants(bytes, limits), "") << entry.path();
        }
        std::array<Header, 100> storage;
        Request req;
        const ParseResult r = parseRequest(bytes, ParserLimits{}, storage, req);
        complete += r.status == ParseStatus::kComplete ? 1 : 0;
        errors += r.status == ParseStatus::kError ? 1 : 0;
        // Fed one byte at a time, the parser never completes before the whole head is there, and ends
        // where one whole feed ends.
        ParseResult last;
        for (size_t n = 0; n <= bytes.size(); ++n) {
            last = parseRequest(std::string_view(bytes).substr(0, n), ParserLimits{}, storage, req);
            if (last.status != ParseStatus::kIncomplete) { break; }
        }
        EXPECT_EQ(last.status, r.status) << entry.path();
        EXPECT_EQ(last.httpStatus, r.httpStatus) << entry.path();
    }
    EXPECT_GE(files, 20u) << "the seed corpus should hold tens of files";
    EXPECT_GT(complete, 0u);
    EXPECT_GT(errors, 0u);
}

}  // namespace
}  // namespace spindle::httpd
