// SPDX-License-Identifier: Apache-2.0
// Unit tests of the spindle-httpd request parser (apps/httpd/http_parser.h) and path helpers
// (apps/httpd/static_path.h): the happy paths, every error status, limits, and incremental feeding.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "apps/httpd/http_parser.h"
#include "apps/httpd/static_path.h"

namespace spindle::httpd {
namespace {

struct Parsed {
    ParseResult result;
    Request request;
    std::array<Header, 128> storage;
};

// Parses `input` (which must outlive the result's views).
std::unique_ptr<Parsed> parse(std::string_view input, const ParserLimits& limits = {}) {
    auto p = std::make_unique<Parsed>();
    p->result = parseRequest(input, limits, p->storage, p->request);
    return p;
}

int errorOf(std::string_view input, const ParserLimits& limits = {}) {
    auto p = parse(input, limits);
    EXPECT_EQ(p->result.status, ParseStatus::kError) << input;
    return p->result.httpStatus;
}

TEST(HttpParser, SimpleGet) {
    const std::string in = "GET /hello?x=1 HTTP/1.1\r\nHost: example\r\nUser-Agent:  t \r\n\r\n";
    auto p = parse(in);
    ASSERT_EQ(p->result.status, ParseStatus::kComplete);
    EXPECT_EQ(p->result.consumed, in.size());
    const Request& r = p->request;
    EXPECT_EQ(r.method, Method::kGet);
    EXPECT_EQ(r.methodText, "GET");
    EXPECT_EQ(r.target, "/hello?x=1");
    EXPECT_EQ(r.path, "/hello");
    EXPECT_EQ(r.query, "x=1");
    EXPECT_EQ(r.versionMinor, 1);
    EXPECT_EQ(r.host, "example");
    ASSERT_EQ(r.headers.size(), 2u);
    EXPECT_EQ(r.headers[1].name, "User-Agent");
    EXPECT_EQ(r.headers[1].value, "t");
    EXPECT_EQ(r.header("user-agent"), "t");
    EXPECT_EQ(r.header("missing"), "");
    EXPECT_TRUE(r.keepAlive);
    EXPECT_EQ(r.contentLength, 0u);
    EXPECT_EQ(r.headLength, in.size());
}

TEST(HttpParser, KeepAliveSemantics) {
    EXPECT_TRUE(parse("GET / HTTP/1.1\r\nHost: a\r\n\r\n")->request.keepAlive);
    EXPECT_FALSE(parse("GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")->request.keepAlive);
    EXPECT_FALSE(parse("GET / HTTP/1.1\r\nHost: a\r\nConnection: foo, Close\r\n\r\n")->request.keepAlive);
    EXPECT_FALSE(parse("GET / HTTP/1.0\r\n\r\n")->request.keepAlive);
    auto ka10 = parse("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n");
    EXPECT_TRUE(ka10->request.keepAlive);
    EXPECT_EQ(ka10->request.versionMinor, 0);
    EXPECT_FALSE(parse("GET / HTTP/1.0\r\nConnection: keep-alive, close\r\n\r\n")->request.keepAlive);
}

TEST(HttpParser, IncompleteUntilTheBlankLine) {
    const std::string in = "GET / HTTP/1.1\r\nHost: a\r\nX: y\r\n\r\n";
    for (size_t n = 0; n < in.size(); ++n) {
        auto p = parse(std::string_view(in).substr(0, n));
        EXPECT_EQ(p->result.status, ParseStatus::kIncomplete) << n;
        EXPECT_EQ(p->result.consumed, 0u);
    }
    EXPECT_EQ(parse(in)->result.status, ParseStatus::kComplete);
}

TEST(HttpParser, PipelinedRequestsParseOneAtATime) {
    const std::string in = "GET /a HTTP/1.1\r\nHost: a\r\n\r\nGET /b HTTP/1.1\r\nHost: a\r\n\r\nGET /c HTTP/1.1\r\nHost: a\r\n\r\n";
    std::string_view rest = in;
    std::string paths;
    while (!rest.empty()) {
        auto p = parse(rest);
        ASSERT_EQ(p->result.status, ParseStatus::kComplete);
        paths += p->request.path;
        rest.remove_prefix(p->result.consumed);
    }
    EXPECT_EQ(paths, "/a/b/c");
}

TEST(HttpParser, ContentLengthBodyIsFramed) {
    const std::string in = "POST /f HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhelloGET";
    auto p = parse(in);
    ASSERT_EQ(p->result.status, ParseStatus::kComplete);
    EXPECT_EQ(p->request.method, Method::kPost);
    EXPECT_EQ(p->request.contentLength, 5u);
    EXPECT_EQ(p->request.body, "hello");
    EXPECT_EQ(p->request.bodyRemaining(), 0u);
    EXPECT_EQ(p->result.consumed, in.size() - 3);

    const std::string partial = "POST /f HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nabc";
    auto q = parse(partial);
    ASSERT_EQ(q->result.status, ParseStatus::kComplete);
    EXPECT_EQ(q->request.body, "abc");
    EXPECT_EQ(q->request.bodyRemaining(), 7u);
    EXPECT_EQ(q->result.consumed, partial.size());

    auto same = parse("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok");
    EXPECT_EQ(same->result.status, ParseStatus::kComplete);
}

TEST(HttpParser, ChunkedIsFramedByTheCallerAndOtherTransferCodingsAreRejected) {
    for (const char* te : {"chunked", "gzip, Chunked"}) {
        const std::string in = std::string("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: ") + te + "\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
        auto p = parse(in);
        ASSERT_EQ(p->result.status, ParseStatus::kComplete) << te;
        EXPECT_TRUE(p->request.chunked) << te;
        EXPECT_EQ(p->request.contentLength, 0u) << te;
        EXPECT_TRUE(p->request.body.empty()) << te;
        EXPECT_EQ(p->result.consumed, p->request.headLength) << "the body is left to the caller";
    }
    EXPECT_EQ(errorOf("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n"), 501);
    EXPECT_EQ(errorOf("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, gzip\r\n\r\n"), 400);
    EXPECT_EQ(errorOf("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n"), 400);
    EXPECT_EQ(errorOf("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 1\r\n\r\nx"), 400);
}

/// Feeds `body` to a skipper in pieces of `step` bytes; the status at the end and the bytes used.
std::pair<ChunkedBodySkipper::Status, size_t> skip(std::string_view body, size_t step, uint64_t maxBody = 1000,
                                                   int* error = nullptr) {
    ChunkedBodySkipper s(maxBody, 64);
    size_t used = 0;
    for (size_t at = 0; at < body.size();) {
        const size_t n = std::min(step, body.size() - at);
        size_t c = 0;
        const auto st = s.feed(body.substr(at, n), &c);
        used += c;
        if (st != ChunkedBodySkipper::Status::kNeedMore) {
            if (error != nullptr) { *error = s.errorStatus(); }
            return {st, used};
        }
        EXPECT_EQ(c, n) << "kNeedMore consumes everything";
        at += n;
    }
    return {ChunkedBodySkipper::Status::kNeedMore, used};
}

TEST(ChunkedBodySkipper, ReadsBodiesInAnyPieces) {
    const std::string body = "5\r\nhello\r\n1A;name=\"v\" ;x\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nTrailer: x\r\n\r\n";
    for (size_t step : {size_t{1}, size_t{2}, size_t{7}, body.size()}) {
        const auto [st, used] = skip(body + "GET / HTTP/1.1", step);
        EXPECT_EQ(st, ChunkedBodySkipper::Status::kDone) << step;
        EXPECT_EQ(used, body.size()) << "stops where the body ends, step " << step;
    }
    ChunkedBodySkipper s(1000, 64);
    size_t used = 0;
    EXPECT_EQ(s.feed("0\r\n\r\n", &used), ChunkedBodySkipper::Status::kDone);
    EXPECT_EQ(s.bodyBytes(), 0u);
    EXPECT_EQ(skip("5\r\nhel", 100).first, ChunkedBodySkipper::Status::kNeedMore);
}

TEST(ChunkedBodySkipper, MalformedAndOversizedBodies) {
    for (const char* bad : {"x\r\n", "\r\n", "5\nhello\r\n", "5\r\nhelloX\r\n", "5\r\nhello\r\r", ";ext\r\n",
                            "11111111111111111\r\n", "0\r\nTrailer: x\n\r\n", "0\r\n\rx", "5;a\x01\r\n"}) {
        int error = 0;
        EXPECT_EQ(skip(bad, 1, 1000, &error).first, ChunkedBodySkipper::Status::kError) << bad;
        EXPECT_EQ(error, 400) << bad;
    }
    int error = 0;
    EXPECT_EQ(skip("400\r\n", 3, 1000, &error).first, ChunkedBodySkipper::Status::kError);
    EXPECT_EQ(error, 413) << "1024 bytes over a limit of 1000";
    EXPECT_EQ(skip("3E8\r\n", 3, 1000).first, ChunkedBodySkipper::Status::kNeedMore) << "1000 bytes: at the limit";
    EXPECT_EQ(skip("5;" + std::string(100, 'e') + "\r\n", 5, 1000, &error).first, ChunkedBodySkipper::Status::kError);
    EXPECT_EQ(error, 400) << "an extension longer than the line limit";
}

TEST(HttpParser, ContentLengthErrors) {
    EXPECT_EQ(errorOf("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n"), 400);
    EXPECT_EQ(errorOf("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1x\r\n\r\n"), 400);
    EXPECT_EQ(errorOf("POST / HTTP/1.1\r\nHost: a\r\nContent-Length:\r\n\r\n"), 400);
    EXPECT_EQ(errorOf("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1, 1\r\n\r\n"), 400);
    EXPECT_EQ(errorOf("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"), 400);
    EXPECT_EQ(errorOf("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1048577\r\n\r\n"), 413);
    EXPECT_EQ(errorOf("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 123456789012345678901234567890\r\n\r\n"), 413);
    EXPECT_EQ(parse("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1048576\r\n\r\n")->result.status, ParseStatus::kComplete);
    EXPECT_EQ(errorOf("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 11\r\n\r\n", ParserLimits{.maxBodyBytes = 10}), 413);
}

TEST(HttpParser, MalformedRequestLines) {
    EXPECT_EQ(errorOf("GET\r\n\r\n"), 400);
    EXPECT_EQ(errorOf("GET /\r\n\r\n"), 400);
    EXPECT_EQ(errorOf("GET  / HTTP/1.1\r\nHost: a\r\n\r\n"), 400);
    EXPECT_EQ(errorOf("GET / HTTP/1.1 \r\nHost: a\r\n\r\n"), 400);
    EXPECT_EQ(errorOf("GET / HTTX/1.1\r\nHost: a\r\n\r\n"), 400);
    EXPECT_EQ(errorOf("GET / HTTP/1.a\r\nHost: a\r\n\r\n"), 400);
    EXPECT_EQ(errorOf("G(T / HTTP/1.1\r\nHost: a\r\n\r\n"), 400);
    EXPECT_EQ(errorOf("GET /a\x7f HTTP/1.1\r\nHost: a\r\n\r\n"), 400);
    EXPECT_EQ(errorOf("GET / HTTP/1.1\nHost: a\n\n"), 400);
    EXPECT_EQ(errorOf("GET / HTTP/1.1\rHost: a\r\n\r\n"), 400);
    EXPECT_EQ(errorOf("\n"), 400);
    // Rejected before the line is complete: binary (a TLS hello) cannot start a method.
    EXPECT_EQ(errorOf(std::string_view("\x16\x03\x01\x00", 4)), 400);
}

TEST(HttpParser, Versions) {
    EXPECT_EQ(errorOf("GET / HTTP/2.0\r\nHost: a\r\n\r\n"), 505);
    EXPECT_EQ(errorOf("GET / HTTP/0.9\r\nHost: a\r\n\r\n"), 505);
    auto p = parse("GET / HTTP/1.7\r\nHost: a\r\n\r\n");
    ASSERT_EQ(p->result.status, ParseStatus::kComplete);
    EXPECT_EQ(p->request.versionMinor, 1);
}

TEST(HttpParser, MalformedHeaders) {
    EXPECT_EQ(errorOf("GET / HTTP/1.1\r\nHost : a\r\n\r\n"), 400);         // space before the colon
    EXPECT_EQ(errorOf("GET / HTTP/1.1\r\nHost: a\r\nNoColon\r\n\r\n"), 400);
    EXPECT_EQ(errorOf("GET / HTTP/1.1\r\nHost: a\r\n: v\r\n\r\n"), 400);   // empty name
    EXPECT_EQ(errorOf("GET / HTTP/1.1\r\nHost: a\r\nX: a\r\n b\r\n\r\n"), 400);  // obs-fold
    EXPECT_EQ(errorOf("GET / HTTP/1.1\r\nHost: a\r\nX: a\x01z\r\n\r\n"), 400);
    EXPECT_EQ(errorOf("GET / HTTP/1.1\r\nHost: a\r\nX: a\rz\r\n\r\n"), 400);
    EXPECT_EQ(errorOf("GET / HTTP/1.1\r\n\r\n"), 400);                         // 1.1 needs Host
    EXPECT_EQ(errorOf("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"), 400);
    EXPECT_EQ(parse("GET / HTTP/1.0\r\n\r\n")->result.status, ParseStatus::kComplete);  // 1.0 does not
    auto p = parse("GET / HTTP/1.1\r\nHost: a\r\nX-Utf8: caf\xc3\xa9\r\nX-Empty:\r\n\r\n");
    ASSERT_EQ(p->result.status, ParseStatus::kComplete);
    EXPECT_EQ(p->request.header("x-utf8"), "caf\xc3\xa9");
    EXPECT_EQ(p->request.header("X-EMPTY"), "");
}

TEST(HttpParser, CaseFoldingTouchesLettersOnly) {
    EXPECT_TRUE(equalsIgnoreCase("Content-Length", "content-LENGTH"));
    EXPECT_TRUE(equalsIgnoreCase("", ""));
    EXPECT_FALSE(equalsIgnoreCase("host", "hosts"));
    // Pairs one bit 5 apart that are not letters: '@' and '`', '[' and '{', '^' and '~', and bytes past ASCII.
    EXPECT_FALSE(equalsIgnoreCase("@", "`"));
    EXPECT_FALSE(equalsIgnoreCase("x[", "x{"));
    EXPECT_FALSE(equalsIgnoreCase("^", "~"));
    EXPECT_FALSE(equalsIgnoreCase("\xc1", "\xe1"));
    EXPECT_FALSE(equalsIgnoreCase("hosu", "host"));
    // The parser's own dispatch: a name one fold away from "host" that is not it counts as no Host.
    EXPECT_EQ(errorOf("GET / HTTP/1.1\r\nHo^t: a\r\n\r\n"), 400);
    auto p = parse("GET / HTTP/1.1\r\nhOsT: a\r\nCONTENT-length: 0\r\n\r\n");
    ASSERT_EQ(p->result.status, ParseStatus::kComplete);
    EXPECT_EQ(p->request.host, "a");
}

TEST(HttpParser, HeaderLimits) {
    std::string big = "GET / HTTP/1.1\r\nHost: a\r\nX: " + std::string(8200, 'x') + "\r\n\r\n";
    EXPECT_EQ(errorOf(big), 431);
    // Exactly at the limit is fine; one byte over is not.
    const std::string base = "GET / HTTP/1.1\r\nHost: a\r\nX: \r\n\r\n";
    std::string fits = base;
    fits.insert(base.size() - 4, std::string(100 - base.size(), 'v'));
    ASSERT_EQ(fits.size(), 100u);
    EXPECT_EQ(parse(fits, ParserLimits{.maxHeaderBytes = 100})->result.status, ParseStatus::kComplete);
    EXPECT_EQ(errorOf(fits, ParserLimits{.maxHeaderBytes = 99}), 431);
    // An unfinished head that already fills the limit is an error, not "need more".
    EXPECT_EQ(errorOf(std::string_view(big).substr(0, 8192)), 431);
    EXPECT_EQ(errorOf("GET /" + std::string(9000, 'a')), 414);

    std::string many = "GET / HTTP/1.1\r\nHost: a\r\n";
    for (int i = 0; i < 100; ++i) { many += "X-" + std::to_string(i) + ": v\r\n"; }
    many += "\r\n";
    EXPECT_EQ(errorOf(many), 431);  // 101 headers
    EXPECT_EQ(parse(many, ParserLimits{.maxHeaders = 101})->result.status, ParseStatus::kComplete);
    // The storage given caps the count too.
    std::array<Header, 4> small;
    Request r;
    EXPECT_EQ(parseRequest(many, ParserLimits{}, small, r).httpStatus, 431);
}

TEST(HttpParser, LeadingEmptyLinesAreSkipped) {
    const std::string in = "\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n";
    auto p = parse(in);
    ASSERT_EQ(p->result.status, ParseStatus::kComplete);
    EXPECT_EQ(p->result.consumed, in.size());
    EXPECT_EQ(parse("\r")->result.status, ParseStatus::kIncomplete);
}

TEST(HttpParser, TargetForms) {
    auto abs = parse("GET http://example.com/p/q?x HTTP/1.1\r\nHost: example.com\r\n\r\n");
    ASSERT_EQ(abs->result.status, ParseStatus::kComplete);
    EXPECT_EQ(abs->request.path, "/p/q");
    EXPECT_EQ(abs->request.query, "x");
    auto bare = parse("GET HTTP://example.com HTTP/1.1\r\nHost: example.com\r\n\r\n");
    ASSERT_EQ(bare->result.status, ParseStatus::kComplete);
    EXPECT_EQ(bare->request.path, "");
    auto star = parse("OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n");
    ASSERT_EQ(star->result.status, ParseStatus::kComplete);
    EXPECT_EQ(star->request.method, Method::kOptions);
    EXPECT_EQ(star->request.path, "*");
    auto other = parse("BREW /pot HTTP/1.1\r\nHost: a\r\n\r\n");
    ASSERT_EQ(other->result.status, ParseStatus::kComplete);
    EXPECT_EQ(other->request.method, Method::kOther);
    EXPECT_EQ(other->request.methodText, "BREW");
}

TEST(HttpParser, ExpectContinue) {
    auto p = parse("PUT / HTTP/1.1\r\nHost: a\r\nExpect: 100-Continue\r\nContent-Length: 1\r\n\r\n");
    ASSERT_EQ(p->result.status, ParseStatus::kComplete);
    EXPECT_TRUE(p->request.expectContinue);
}

std::string resolved(std::string_view url) {
    std::array<char, 64> buf;
    size_t n = 0;
    switch (resolvePath(url, buf.data(), buf.size(), &n)) {
        case PathStatus::kOk: return std::string(buf.data(), n);
        case PathStatus::kBadRequest: return "<bad>";
        case PathStatus::kTooLong: return "<long>";
    }
    return "<?>";
}

TEST(StaticPath, Resolve) {
    EXPECT_EQ(resolved("/"), "index.html");
    EXPECT_EQ(resolved("/a.txt"), "a.txt");
    EXPECT_EQ(resolved("/docs/"), "docs/index.html");
    EXPECT_EQ(resolved("/docs/."), "docs/index.html");
    EXPECT_EQ(resolved("/a//b/./c"), "a/b/c");
    EXPECT_EQ(resolved("/a%20b%2Ec"), "a b.c");
    EXPECT_EQ(resolved("/.hidden"), ".hidden");
    EXPECT_EQ(resolved("/..."), "...");
    EXPECT_EQ(resolved("/.."), "<bad>");
    EXPECT_EQ(resolved("/a/../b"), "<bad>");
    EXPECT_EQ(resolved("/a/%2e%2e/b"), "<bad>");
    EXPECT_EQ(resolved("/a/%2E."), "<bad>");
    EXPECT_EQ(resolved("/a%2fb"), "<bad>");
    EXPECT_EQ(resolved("/a%00"), "<bad>");
    EXPECT_EQ(resolved("/a%4"), "<bad>");
    EXPECT_EQ(resolved("/a%zz"), "<bad>");
    EXPECT_EQ(resolved("a"), "<bad>");
    EXPECT_EQ(resolved(""), "<bad>");
    EXPECT_EQ(resolved("*"), "<bad>");
    EXPECT_EQ(resolved("/" + std::string(80, 'x')), "<long>");
    EXPECT_EQ(resolved("/" + std::string(60, 'x') + "/"), "<long>");  // no room for index.html
}

TEST(StaticPath, ContentTypes) {
    EXPECT_EQ(contentTypeFor("index.html"), "text/html; charset=utf-8");
    EXPECT_EQ(contentTypeFor("a/b/STYLE.CSS"), "text/css; charset=utf-8");
    EXPECT_EQ(contentTypeFor("x.png"), "image/png");
    EXPECT_EQ(contentTypeFor("x.tar.gz"), "application/gzip");
    EXPECT_EQ(contentTypeFor("noext"), "application/octet-stream");
    EXPECT_EQ(contentTypeFor("dir.d/noext"), "application/octet-stream");
    EXPECT_EQ(contentTypeFor("trailing."), "application/octet-stream");
}

TEST(HttpParser, ReasonPhrases) {
    EXPECT_EQ(reasonPhrase(200), "OK");
    EXPECT_EQ(reasonPhrase(431), "Request Header Fields Too Large");
    EXPECT_EQ(reasonPhrase(299), "Unknown");
}

}  // namespace
}  // namespace spindle::httpd
