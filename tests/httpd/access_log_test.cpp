// SPDX-License-Identifier: Apache-2.0
// Unit tests of spindle-httpd's access-log line (apps/httpd/access_log.h): nginx's combined format,
// its escapes, and the cut of an overlong line.
#include <unistd.h>

#include <gtest/gtest.h>

#include <array>
#include <fstream>
#include <string>

#include "apps/httpd/access_log.h"
#include "tests/core/with_runtime.h"

namespace spindle::httpd {
namespace {

std::string line(const AccessEntry& e, size_t capacity = kMaxAccessLine) {
    std::string out(capacity, '\0');
    out.resize(formatAccessLine(e, out.data(), out.size()));
    return out;
}

TEST(AccessLine, CombinedFormat) {
    const AccessEntry e{.remote = "127.0.0.1", .unixSeconds = 1'700'000'000, .method = "GET", .target = "/a.html?x=1",
                        .versionMinor = 1, .status = 200, .bytes = 1234, .referer = "http://r/", .userAgent = "curl/7.88.1"};
    EXPECT_EQ(line(e), "127.0.0.1 - - [14/Nov/2023:22:13:20 +0000] \"GET /a.html?x=1 HTTP/1.1\" 200 1234 \"http://r/\" \"curl/7.88.1\"\n");
    AccessEntry bare = e;
    bare.remote = "";
    bare.referer = "";
    bare.userAgent = "";
    bare.versionMinor = 0;
    bare.status = 304;
    bare.bytes = 0;
    EXPECT_EQ(line(bare), "- - - [14/Nov/2023:22:13:20 +0000] \"GET /a.html?x=1 HTTP/1.0\" 304 0 \"-\" \"-\"\n");
}

TEST(AccessLine, EscapesQuotesBackslashesAndControlBytes) {
    const AccessEntry e{.remote = "::1", .unixSeconds = 0, .method = "GET", .target = "/\"q\"\\\x01\xff",
                        .status = 404, .userAgent = "a\"b"};
    EXPECT_EQ(line(e), "::1 - - [01/Jan/1970:00:00:00 +0000] \"GET /\\x22q\\x22\\x5C\\x01\\xFF HTTP/1.1\" 404 0 \"-\" \"a\\x22b\"\n");
}

TEST(AccessLine, AnOverlongFieldIsCutAndTheLineKeepsItsEnd) {
    const std::string target(10'000, 'a');
    const AccessEntry e{.remote = "127.0.0.1", .method = "GET", .target = target, .status = 414, .userAgent = "agent"};
    const std::string l = line(e, 512);
    EXPECT_LE(l.size(), 512u);
    EXPECT_TRUE(l.ends_with("\" 414 0 \"-\" \"agent\"\n")) << l;
}

// Off a fiber the runtime's calls run on the thread's own ring, so the log can be driven from here.
TEST(AccessLog, BuffersFlushesWhenFullAndCountsWhatItWrote) {
    testing_support::ScratchDir dir;
    ASSERT_TRUE(dir.ok());
    auto log = AccessLog::open(dir.path("access.log"), 2);
    ASSERT_TRUE(log) << log.error().message();
    const std::string agent(1000, 'u');
    for (int i = 0; i < 200; ++i) {  // about 220 KB: the 64 KiB buffer fills several times
        (*log)->append(static_cast<unsigned>(i % 2),
                       AccessEntry{.remote = "10.0.0.1", .method = "GET", .target = "/x", .status = 200, .bytes = 1,
                                   .userAgent = agent});
    }
    EXPECT_GT((*log)->written(), 0u) << "full buffers were written on the way";
    (*log)->flush(0);
    (*log)->flush(1);
    EXPECT_EQ((*log)->written(), 200u);
    EXPECT_EQ((*log)->dropped(), 0u);
    std::ifstream in(dir.path("access.log"));
    size_t lines = 0;
    for (std::string l; std::getline(in, l);) {
        ++lines;
        EXPECT_TRUE(l.starts_with("10.0.0.1 - - [")) << l.substr(0, 40);
    }
    EXPECT_EQ(lines, 200u);
}

TEST(AccessLog, AFailedWriteDropsItsLinesAndTheServerGoesOn) {
    if (::access("/dev/full", W_OK) != 0) { GTEST_SKIP() << "no /dev/full"; }
    auto log = AccessLog::open("/dev/full", 1);
    ASSERT_TRUE(log) << log.error().message();
    for (int i = 0; i < 3; ++i) { (*log)->append(0, AccessEntry{.method = "GET", .target = "/", .status = 200}); }
    (*log)->flush(0);
    EXPECT_EQ((*log)->dropped(), 3u);
    EXPECT_EQ((*log)->written(), 0u);
    (*log)->append(0, AccessEntry{.method = "GET", .target = "/", .status = 200});
    (*log)->flush(0);
    EXPECT_EQ((*log)->dropped(), 4u);
}

TEST(AccessLog, OpenErrors) {
    auto log = AccessLog::open("/nonexistent-dir/access.log", 1);
    ASSERT_FALSE(log);
    EXPECT_EQ(log.errorCode(), ENOENT);
}

}  // namespace
}  // namespace spindle::httpd
