// SPDX-License-Identifier: Apache-2.0
// spindle-kv's RESP parser and reply writer: arrays, inline commands with Redis's quoting, pipelining,
// the limits with Redis's exact error texts, the unknown-command text, and the seed corpus of the
// fuzzer (tests/fuzz/corpus/resp/) replayed with the fuzzer's invariants.
#include "apps/kv/resp.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/fuzz/resp_parser_invariants.h"

namespace spindle::kv {
namespace {

using Args = std::vector<std::string_view>;

ParseResult parse(std::string_view in, Request& req, const RespLimits& limits = {}) { return parseRequest(in, limits, req); }

TEST(Resp, ParsesAnArrayOfBulkStrings) {
    Request req;
    const std::string in = "*3\r\n$3\r\nSET\r\n$3\r\nkey\r\n$5\r\nvalue\r\n";
    const ParseResult r = parse(in, req);
    ASSERT_EQ(r.status, ParseStatus::kCommand);
    EXPECT_EQ(r.consumed, in.size());
    EXPECT_EQ(req.args, (Args{"SET", "key", "value"}));
}

TEST(Resp, BinarySafeBulkStrings) {
    Request req;
    const std::string in("*2\r\n$3\r\nGET\r\n$6\r\na\0b\r\nc\r\n", 25);
    const ParseResult r = parse(in, req);
    ASSERT_EQ(r.status, ParseStatus::kCommand);
    ASSERT_EQ(req.args.size(), 2u);
    EXPECT_EQ(req.args[1], std::string_view("a\0b\r\nc", 6));
}

TEST(Resp, PipelinedRequestsComeOneAtATime) {
    Request req;
    std::string in;
    for (int i = 0; i < 100; ++i) { in += "*2\r\n$4\r\nINCR\r\n$1\r\nx\r\nPING\r\n"; }
    size_t pos = 0;
    int commands = 0;
    while (pos < in.size()) {
        const ParseResult r = parse(std::string_view(in).substr(pos), req);
        ASSERT_EQ(r.status, ParseStatus::kCommand);
        pos += r.consumed;
        ++commands;
    }
    EXPECT_EQ(commands, 200);
}

TEST(Resp, IncompleteUntilTheLastByte) {
    const std::string in = "*2\r\n$3\r\nGET\r\n$3\r\nabc\r\n";
    Request req;
    for (size_t n = 0; n < in.size(); ++n) {
        EXPECT_EQ(parse(std::string_view(in).substr(0, n), req).status, ParseStatus::kIncomplete) << n;
    }
    EXPECT_EQ(parse(in, req).status, ParseStatus::kCommand);
}

TEST(Resp, InlineCommandsSplitLikeRedis) {
    Request req;
    ParseResult r = parse("SET  \"a key\" 'it\\'s' \"\\x41\\n\"\r\n", req);
    ASSERT_EQ(r.status, ParseStatus::kCommand);
    EXPECT_EQ(req.args, (Args{"SET", "a key", "it's", "A\n"}));
    r = parse("ECHO hi\n", req);  // a bare LF ends the line too
    ASSERT_EQ(r.status, ParseStatus::kCommand);
    EXPECT_EQ(r.consumed, 8u);
    EXPECT_EQ(req.args, (Args{"ECHO", "hi"}));
    r = parse("   \r\n", req);  // an empty line is no command
    ASSERT_EQ(r.status, ParseStatus::kCommand);
    EXPECT_TRUE(req.args.empty());
}

TEST(Resp, EmptyOrNegativeArrayIsNoCommand) {
    Request req;
    for (std::string_view in : {"*0\r\n", "*-1\r\n"}) {
        const ParseResult r = parse(in, req);
        ASSERT_EQ(r.status, ParseStatus::kCommand) << in;
        EXPECT_EQ(r.consumed, in.size());
        EXPECT_TRUE(req.args.empty());
    }
}

TEST(Resp, ProtocolErrorsHaveRedisText) {
    struct Case {
        std::string in;
        std::string_view error;
    };
    const std::vector<Case> cases{
        {"*abc\r\n", "Protocol error: invalid multibulk length"},
        {"*3000000000\r\n", "Protocol error: invalid multibulk length"},
        {"*1\r\n:5\r\n", "Protocol error: expected '$', got ':'"},
        {"*1\r\n$-1\r\n", "Protocol error: invalid bulk length"},
        {"*1\r\n$x\r\n", "Protocol error: invalid bulk length"},
        {"*1\r\n$536870913\r\n", "Protocol error: invalid bulk length"},  // one past 512 MiB
        {"SET \"abc\r\n", "Protocol error: unbalanced quotes in request"},
        {"SET \"a\"b\r\n", "Protocol error: unbalanced quotes in request"},
        {std::string(65 * 1024, 'x'), "Protocol error: too big inline request"},
        {"*" + std::string(65 * 1024, '1'), "Protocol error: too big mbulk count string"},
        {"*1\r\n$" + std::string(65 * 1024, '1'), "Protocol error: too big bulk count string"},
    };
    for (const Case& c : cases) {
        Request req;
        const ParseResult r = parse(c.in, req);
        ASSERT_EQ(r.status, ParseStatus::kError) << c.in.substr(0, 40);
        EXPECT_EQ(r.error, c.error) << c.in.substr(0, 40);
    }
}

TEST(Resp, LimitsAreConfigurableAndTighterBeforeAuth) {
    Request req;
    const RespLimits tight{.maxBulkLength = 4, .maxMultibulkLength = 2, .maxInlineSize = 64};
    EXPECT_EQ(parse("*1\r\n$5\r\nhello\r\n", req, tight).error, "Protocol error: invalid bulk length");
    EXPECT_EQ(parse("*3\r\n", req, tight).error, "Protocol error: invalid multibulk length");
    EXPECT_EQ(parseRequest("*11\r\n", RespLimits{}, req, /*authRequired=*/true).error,
              "Protocol error: unauthenticated multibulk length");
    EXPECT_EQ(parseRequest("*1\r\n$1048577\r\n", RespLimits{}, req, /*authRequired=*/true).error,
              "Protocol error: unauthenticated bulk length");
    EXPECT_EQ(parseRequest("*11\r\n", RespLimits{}, req, /*authRequired=*/false).status, ParseStatus::kIncomplete);
}

TEST(Resp, UnknownCommandTextMatchesRedis) {
    EXPECT_EQ(unknownCommandError({"foo"}), "ERR unknown command 'foo', with args beginning with: ");
    EXPECT_EQ(unknownCommandError({"foo", "a", "b c"}), "ERR unknown command 'foo', with args beginning with: 'a' 'b c' ");
    // Arguments stop being listed once the list reaches 128 bytes; each is cut to what is left of it.
    const std::string big(200, 'x');
    const std::string text = unknownCommandError({"foo", big, "next"});
    EXPECT_EQ(text, "ERR unknown command 'foo', with args beginning with: '" + std::string(128, 'x') + "' ");
}

TEST(Resp, IntegerRepliesAndLengthsSpellEveryInt64) {
    std::string out;
    ReplyWriter w(out, 2);
    w.integer(0);
    w.integer(INT64_MAX);
    w.integer(INT64_MIN);
    w.bulk("");
    w.arrayHeader(1000000);
    EXPECT_EQ(out, ":0\r\n:9223372036854775807\r\n:-9223372036854775808\r\n$0\r\n\r\n*1000000\r\n");
}

TEST(Resp, RepliesInBothProtocols) {
    std::string out;
    ReplyWriter w2(out, 2);
    w2.null();
    w2.mapHeader(1);
    w2.integer(-7);
    w2.bulk("hi");
    w2.error("ERR bad\r\nthing");
    EXPECT_EQ(out, "$-1\r\n*2\r\n:-7\r\n$2\r\nhi\r\n-ERR bad  thing\r\n");
    out.clear();
    ReplyWriter w3(out, 3);
    w3.null();
    w3.mapHeader(1);
    w3.setHeader(2);
    w3.doubleValue("1.5");
    EXPECT_EQ(out, "_\r\n%1\r\n~2\r\n,1.5\r\n");
}

TEST(Resp, IntegersParseExactlyAsRedisDoes) {
    int64_t v = 0;
    EXPECT_TRUE(parseInt64("0", v));
    EXPECT_TRUE(parseInt64("-9223372036854775808", v));
    EXPECT_EQ(v, INT64_MIN);
    EXPECT_TRUE(parseInt64("9223372036854775807", v));
    EXPECT_EQ(v, INT64_MAX);
    for (std::string_view bad : {"", "-", "-0", "01", "+1", " 1", "1 ", "9223372036854775808", "1e3", "0x10"}) {
        EXPECT_FALSE(parseInt64(bad, v)) << bad;
    }
    long double d = 0;
    EXPECT_TRUE(parseLongDouble("1.5", d));
    EXPECT_FALSE(parseLongDouble(" 1.5", d));
    EXPECT_FALSE(parseLongDouble("nan", d));
    EXPECT_FALSE(parseLongDouble("1.5x", d));
}

TEST(RespCorpus, EveryFileKeepsTheInvariants) {
    const std::filesystem::path dir(SPINDLE_RESP_CORPUS_DIR);
    ASSERT_TRUE(std::filesystem::is_directory(dir)) << dir;
    size_t files = 0, commands = 0, errors = 0;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
        if (!entry.is_regular_file()) { continue; }
        std::ifstream in(entry.path(), std::ios::binary);
        const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        ++files;
        for (const RespLimits& limits : {RespLimits{}, RespLimits{.maxBulkLength = 16, .maxMultibulkLength = 4, .maxInlineSize = 32}}) {
            EXPECT_EQ(testing_support::checkRespInvariants(bytes, limits), "") << entry.path();
        }
        Request req;
        const ParseResult r = parse(bytes, req);
        commands += r.status == ParseStatus::kCommand ? 1 : 0;
        errors += r.status == ParseStatus::kError ? 1 : 0;
    }
    EXPECT_GE(files, 20u);
    EXPECT_GT(commands, 0u);
    EXPECT_GT(errors, 0u);
}

}  // namespace
}  // namespace spindle::kv
