// SPDX-License-Identifier: Apache-2.0
// Unit tests of spindle-httpd's Content-Type table (apps/httpd/mime_types.h).
#include <gtest/gtest.h>

#include <cerrno>
#include <fstream>

#include "apps/httpd/mime_types.h"
#include "tests/core/with_runtime.h"

namespace spindle::httpd {
namespace {

TEST(MimeTypes, ParsesTypesAndExtensions) {
    MimeTypes m;
    m.parse("# a comment\n"
            "text/html\t\thtml htm  # trailing comment\n"
            "application/x-thing  THING\r\n"
            "image/png png\n"
            "image/apng png\n"  // a second type for png: the first stays
            "application/no-extensions\n"
            "notatype foo\n"
            "\n");
    EXPECT_EQ(m.size(), 4u);
    EXPECT_EQ(m.lookup("a/b/index.HTML"), "text/html; charset=utf-8");
    EXPECT_EQ(m.lookup("x.htm"), "text/html; charset=utf-8");
    EXPECT_EQ(m.lookup("x.thing"), "application/x-thing");
    EXPECT_EQ(m.lookup("x.Png"), "image/png");
    EXPECT_EQ(m.lookup("x.foo"), "application/octet-stream") << "a line whose type lacks a '/'";
    EXPECT_EQ(m.lookup("x.woff2"), "font/woff2") << "the built-in table is the fallback";
    EXPECT_EQ(m.lookup("x.unknown"), "application/octet-stream");
    EXPECT_EQ(m.lookup("noextension"), "application/octet-stream");
    EXPECT_EQ(m.lookup("dir.d/file"), "application/octet-stream") << "a dot in a directory name";
    EXPECT_EQ(m.lookup("trailing."), "application/octet-stream");
}

TEST(MimeTypes, EmptyTableUsesTheBuiltIns) {
    const MimeTypes m;
    EXPECT_EQ(m.lookup("a.css"), "text/css; charset=utf-8");
    EXPECT_EQ(m.lookup("a.bin"), "application/octet-stream");
}

class MimeTypesFile : public testing_support::WithScratchDir {};

TEST_F(MimeTypesFile, LoadReadsAFileAndKeepsTheTableOnAnError) {
    {
        std::ofstream f(path("mime.types"));
        f << "application/x-test tst\n";
    }
    MimeTypes m;
    ASSERT_EQ(m.load(path("mime.types").c_str()), 0);
    EXPECT_EQ(m.lookup("a.tst"), "application/x-test");
    EXPECT_EQ(m.load(path("missing").c_str()), ENOENT);
    EXPECT_EQ(m.lookup("a.tst"), "application/x-test") << "the table stays";
    EXPECT_EQ(m.load(dir_.c_str()), EISDIR);
}

TEST(MimeTypes, TheSystemFileWhenInstalled) {
    MimeTypes m;
    const int err = m.load("/etc/mime.types");
    if (err == ENOENT) { GTEST_SKIP() << "/etc/mime.types: no such file (Debian package media-types)"; }
    ASSERT_EQ(err, 0);
    EXPECT_GT(m.size(), 500u);
    EXPECT_EQ(m.lookup("a.html"), "text/html; charset=utf-8");
    EXPECT_EQ(m.lookup("a.png"), "image/png");
}

}  // namespace
}  // namespace spindle::httpd
