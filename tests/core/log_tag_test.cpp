// SPDX-License-Identifier: Apache-2.0
// Tests for the carrier tag in log lines (base/log.h, set by core/carrier.cpp): a line logged on
// carrier N's thread, by the carrier itself or by a fiber running there, says `c<N>`; a plain thread's
// line says `t<tid>`, before and after a runtime ran.

#include "base/log.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/fiber.h"
#include "core/runtime.h"
#include "tests/base/log_line.h"
#include "tests/core/with_runtime.h"

namespace spindle {
namespace {

using namespace testing_support;

/// The thread tags of the captured lines whose text is `text` (a runtime may log other lines too).
std::vector<std::string> tagsOf(const std::string& captured, const std::string& text) {
    std::vector<std::string> tags;
    for (const std::string& l : splitLines(captured)) {
        const auto line = parseLogLine(l);
        EXPECT_TRUE(line) << "not a log line: '" << l << "'";
        if (line && line->text == text) { tags.push_back(line->thread); }
    }
    return tags;
}

class LogTagTest : public WithRuntime {
protected:
    void SetUp() override {
        saved_ = log::threshold();
        log::setThreshold(log::Level::kWarn);
        WithRuntime::SetUp();
    }
    void TearDown() override {
        WithRuntime::TearDown();
        log::setThreshold(saved_);
    }
    log::Level saved_ = log::Level::kWarn;
};

TEST_F(LogTagTest, ALineFromCarrierNSaysCN) {
    testing::internal::CaptureStderr();
    for (unsigned c = 0; c < 2; ++c) {
        ASSERT_TRUE(rt().runOnCarrier(c, [c] { log::warn("from carrier {}", c); }));  // the carrier itself
        on(static_cast<int>(c), [c] { log::warn("from a fiber on carrier {}", c); }).join();
    }
    log::warn("from the test's thread");
    const std::string out = testing::internal::GetCapturedStderr();

    // fmt::format rather than "literal" + std::to_string(): GCC 12 at -O3 reports that operator+ as an
    // overlapping copy (a false -Wrestrict).
    for (unsigned c = 0; c < 2; ++c) {
        const std::string tag = fmt::format("c{}", c);
        EXPECT_EQ(tagsOf(out, fmt::format("from carrier {}", c)), std::vector<std::string>{tag}) << out;
        EXPECT_EQ(tagsOf(out, fmt::format("from a fiber on carrier {}", c)), std::vector<std::string>{tag}) << out;
    }
    const std::string self = fmt::format("t{}", ::gettid());
    EXPECT_EQ(tagsOf(out, "from the test's thread"), std::vector<std::string>{self}) << out;
}

}  // namespace
}  // namespace spindle
