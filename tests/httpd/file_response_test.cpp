// SPDX-License-Identifier: Apache-2.0
// Unit tests of the static file response's decisions (apps/httpd/file_response.h): HTTP-dates in
// their three forms, nginx's ETag, Range (RFC 9110 §14) and the preconditions in §13.2.2's order.
#include <gtest/gtest.h>

#include <array>
#include <ctime>
#include <string>
#include <vector>

#include "apps/httpd/file_response.h"

namespace spindle::httpd {
namespace {

std::string formatted(int64_t t) {
    std::array<char, kHttpDateLength> text{};
    formatHttpDate(t, text.data());
    return {text.data(), text.size()};
}

TEST(HttpDate, FormatsImfFixdate) {
    EXPECT_EQ(formatted(784111777), "Sun, 06 Nov 1994 08:49:37 GMT");  // RFC 9110's example
    EXPECT_EQ(formatted(0), "Thu, 01 Jan 1970 00:00:00 GMT");
    EXPECT_EQ(formatted(951782400), "Tue, 29 Feb 2000 00:00:00 GMT");
    EXPECT_EQ(formatted(-5), "Thu, 01 Jan 1970 00:00:00 GMT") << "clamped";
}

TEST(HttpDate, FormatAgreesWithGmtime) {
    for (int64_t t = 0; t < 4'000'000'000; t += 9'876'543) {
        const time_t tt = static_cast<time_t>(t);
        tm parts{};
        ::gmtime_r(&tt, &parts);
        char expected[64];
        ::strftime(expected, sizeof expected, "%a, %d %b %Y %H:%M:%S GMT", &parts);
        ASSERT_EQ(formatted(t), expected) << t;
        ASSERT_EQ(parseHttpDate(expected), t) << expected;
    }
}

TEST(HttpDate, ParsesTheThreeForms) {
    EXPECT_EQ(parseHttpDate("Sun, 06 Nov 1994 08:49:37 GMT"), 784111777);
    EXPECT_EQ(parseHttpDate("Sunday, 06-Nov-94 08:49:37 GMT"), 784111777);
    EXPECT_EQ(parseHttpDate("Sun Nov  6 08:49:37 1994"), 784111777);
    EXPECT_EQ(parseHttpDate("Thu Nov 16 08:49:37 2023"), 1700124577);
    EXPECT_EQ(parseHttpDate("  Sun, 06 Nov 1994 08:49:37 GMT "), 784111777) << "surrounding blanks";
}

TEST(HttpDate, RefusesAnythingElse) {
    for (const char* bad : {"", "yesterday", "Sun, 06 Nov 1994 08:49:37 UTC", "Sun, 6 Nov 1994 08:49:37 GMT",
                            "Sun, 06 Nov 1994 24:00:00 GMT", "Sun, 31 Feb 1994 08:49:37 GMT",
                            "Sun, 06 Foo 1994 08:49:37 GMT", "Sun, 06 Nov 1994 08:49:37 GMTx",
                            "Sunday, 06-Nov-1994 08:49:37 GMT", "Sun Nov 6 08:49:37 1994", "1700000000"}) {
        EXPECT_FALSE(parseHttpDate(bad)) << bad;
    }
}

TEST(ETag, IsNginxsFormat) {
    EXPECT_EQ(makeETag(1000, 0x6553f100).view(), "\"6553f100-3e8\"");
    EXPECT_EQ(makeETag(0, 0).view(), "\"0-0\"");
    EXPECT_EQ(makeETag(UINT64_MAX, INT64_MAX).view(), "\"7fffffffffffffff-ffffffffffffffff\"");
}

TEST(ETag, ListMatching) {
    const std::string_view tag = "\"1-2\"";
    EXPECT_TRUE(etagListMatches("*", tag, false));
    EXPECT_TRUE(etagListMatches("\"1-2\"", tag, false));
    EXPECT_TRUE(etagListMatches("\"x\", \"1-2\"", tag, false));
    EXPECT_TRUE(etagListMatches("\"x\",, \"1-2\"", tag, true)) << "empty elements";
    EXPECT_FALSE(etagListMatches("W/\"1-2\"", tag, false)) << "weak never matches strongly";
    EXPECT_TRUE(etagListMatches("W/\"1-2\"", tag, true));
    EXPECT_FALSE(etagListMatches("\"1-3\"", tag, true));
    EXPECT_FALSE(etagListMatches("1-2", tag, true)) << "not quoted";
    EXPECT_FALSE(etagListMatches("\"1-2\", junk", tag, true)) << "a bad element spoils the list";
    EXPECT_FALSE(etagListMatches("", tag, true));
}

TEST(Range, SingleRanges) {
    struct Case {
        const char* value;
        uint64_t first, last;
    };
    for (const Case& c : std::vector<Case>{{"bytes=0-0", 0, 0},
                                           {"bytes=0-99", 0, 99},
                                           {"bytes=100-", 100, 999},
                                           {"bytes=990-5000", 990, 999},
                                           {"bytes=-10", 990, 999},
                                           {"bytes=-5000", 0, 999},
                                           {"BYTES=1-2", 1, 2},
                                           {"bytes= 1-2 ,", 1, 2},
                                           {"bytes=999-99999999999999999999999", 999, 999}}) {
        const RangeResult r = parseRange(c.value, 1000);
        ASSERT_EQ(r.status, RangeStatus::kPartial) << c.value;
        EXPECT_EQ(r.range.first, c.first) << c.value;
        EXPECT_EQ(r.range.last, c.last) << c.value;
    }
}

TEST(Range, UnsatisfiableAndIgnored) {
    for (const char* v : {"bytes=1000-", "bytes=1000-2000", "bytes=-0", "bytes=99999999999999999999999-",
                          "bytes=2000-, 3000-"}) {
        EXPECT_EQ(parseRange(v, 1000).status, RangeStatus::kUnsatisfiable) << v;
    }
    EXPECT_EQ(parseRange("bytes=0-", 0).status, RangeStatus::kUnsatisfiable) << "an empty file";
    EXPECT_EQ(parseRange("bytes=-1", 0).status, RangeStatus::kUnsatisfiable) << "an empty file";
    for (const char* v : {"", "bytes=", "bytes=,", "items=0-1", "bytes=5-1", "bytes=a-b", "bytes=1-2-3", "bytes=--1",
                          "bytes 0-1", "bytes=0-1,x", "bytes=-"}) {
        EXPECT_EQ(parseRange(v, 1000).status, RangeStatus::kIgnore) << v;
    }
    EXPECT_EQ(parseRange("bytes=0-1, 5-9", 1000).status, RangeStatus::kIgnore) << "several ranges: 200";
    EXPECT_EQ(parseRange("bytes=0-1, 5000-", 1000).status, RangeStatus::kIgnore)
        << "several ranges, one satisfiable: 200 as well";
}

/// A request with the given headers (names and values point into `hs`).
struct FakeRequest {
    std::vector<Header> hs;
    Request req;
    explicit FakeRequest(std::vector<Header> headers) : hs(std::move(headers)) { req.headers = hs; }
};

constexpr int64_t kMtime = 1'700'000'000;  // Tue, 14 Nov 2023 22:13:20 GMT
const ETag kTag = makeETag(1000, kMtime);
const FileState kFile{.size = 1000, .mtime = kMtime, .etag = kTag.view(), .now = kMtime + 1000};

FilePlan plan(std::vector<Header> headers, const FileState& f = kFile) {
    FakeRequest r(std::move(headers));
    return planFileResponse(r.req, f);
}

TEST(FilePlan, PlainAndRange) {
    FilePlan p = plan({});
    EXPECT_EQ(p.status, 200);
    EXPECT_EQ(p.length, 1000u);
    p = plan({{"range", "bytes=10-19"}});
    EXPECT_EQ(p.status, 206);
    EXPECT_EQ(p.offset, 10u);
    EXPECT_EQ(p.length, 10u);
    EXPECT_EQ(plan({{"Range", "bytes=1000-"}}).status, 416);
    EXPECT_EQ(plan({{"Range", "bytes=0-"}}, FileState{.size = 0, .etag = kTag.view()}).status, 416);
    p = plan({}, FileState{.size = 0, .etag = kTag.view()});
    EXPECT_EQ(p.status, 200);
    EXPECT_EQ(p.length, 0u);
}

TEST(FilePlan, NotModified) {
    EXPECT_EQ(plan({{"If-None-Match", kTag.view()}}).status, 304);
    EXPECT_EQ(plan({{"If-None-Match", "W/\"6553f100-3e8\""}}).status, 304) << "weak comparison";
    EXPECT_EQ(plan({{"If-None-Match", "*"}}).status, 304);
    EXPECT_EQ(plan({{"If-None-Match", "\"other\""}}).status, 200);
    EXPECT_EQ(plan({{"If-Modified-Since", "Tue, 14 Nov 2023 22:13:20 GMT"}}).status, 304);
    EXPECT_EQ(plan({{"If-Modified-Since", "Tue, 14 Nov 2023 22:13:30 GMT"}}).status, 304) << "later than the mtime";
    EXPECT_EQ(plan({{"If-Modified-Since", "Tue, 14 Nov 2023 22:13:19 GMT"}}).status, 200);
    EXPECT_EQ(plan({{"If-Modified-Since", "Wed, 14 Nov 2035 22:13:30 GMT"}}).status, 200) << "a future date is invalid";
    EXPECT_EQ(plan({{"If-Modified-Since", "not a date"}}).status, 200);
    // If-None-Match wins over If-Modified-Since.
    EXPECT_EQ(plan({{"If-None-Match", "\"other\""}, {"If-Modified-Since", "Tue, 14 Nov 2023 22:13:20 GMT"}}).status, 200);
}

TEST(FilePlan, PreconditionFailed) {
    EXPECT_EQ(plan({{"If-Match", "\"other\""}}).status, 412);
    EXPECT_EQ(plan({{"If-Match", "W/\"6553f100-3e8\""}}).status, 412) << "strong comparison";
    EXPECT_EQ(plan({{"If-Match", kTag.view()}}).status, 200);
    EXPECT_EQ(plan({{"If-Match", "*"}}).status, 200);
    EXPECT_EQ(plan({{"If-Unmodified-Since", "Tue, 14 Nov 2023 22:13:19 GMT"}}).status, 412);
    EXPECT_EQ(plan({{"If-Unmodified-Since", "Tue, 14 Nov 2023 22:13:20 GMT"}}).status, 200);
    EXPECT_EQ(plan({{"If-Unmodified-Since", "garbage"}}).status, 200);
    // If-Match first: a matching If-Match makes If-Unmodified-Since irrelevant.
    EXPECT_EQ(plan({{"If-Match", kTag.view()}, {"If-Unmodified-Since", "Tue, 14 Nov 2023 22:13:19 GMT"}}).status, 200);
}

TEST(FilePlan, IfRange) {
    const Header range{"Range", "bytes=5-"};
    EXPECT_EQ(plan({range, {"If-Range", kTag.view()}}).status, 206);
    EXPECT_EQ(plan({range, {"If-Range", "\"other\""}}).status, 200);
    EXPECT_EQ(plan({range, {"If-Range", "W/\"6553f100-3e8\""}}).status, 200) << "a weak tag never matches";
    EXPECT_EQ(plan({range, {"If-Range", "Tue, 14 Nov 2023 22:13:20 GMT"}}).status, 206);
    EXPECT_EQ(plan({range, {"If-Range", "Tue, 14 Nov 2023 22:13:21 GMT"}}).status, 200) << "exact dates only";
    EXPECT_EQ(plan({range, {"If-Range", "garbage"}}).status, 200);
    EXPECT_EQ(plan({{"Range", "bytes=5000-"}, {"If-Range", "\"other\""}}).status, 200) << "no 416 for another version";
}

}  // namespace
}  // namespace spindle::httpd
