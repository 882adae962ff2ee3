// SPDX-License-Identifier: Apache-2.0
// Tests for base/log.h: the shape of a line (UTC timestamp with microseconds, thread, level, text),
// the thread tag, SPINDLE_LOG and SPINDLE_LOG_TIME (including values they do not know), the level
// filter, errno kept, and lines from many threads at once each written whole. Carrier threads'
// `c<N>` tag is checked where a runtime runs, in tests/core/log_tag_test.cpp.

#include "base/log.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "testing/alloc_hook.h"
#include "tests/base/log_line.h"
#include "testing/scoped_env.h"

namespace spindle {
namespace {

using testing_support::LogLine;
using testing_support::logTimeSeconds;
using testing_support::parseLogLine;
using testing_support::splitLines;

using testing_support::ScopedEnv;

/// Each test runs with SPINDLE_LOG=debug and SPINDLE_LOG_TIME=1, whatever the caller's environment
/// says, and leaves the logger as it found it: configured from that environment, at the same level.
class Log : public testing::Test {
protected:
    void SetUp() override {
        saved_ = log::threshold();
        level_.emplace("SPINDLE_LOG", "debug");
        time_.emplace("SPINDLE_LOG_TIME", "1");
        log::configureFromEnv();
    }
    void TearDown() override {
        level_.reset();
        time_.reset();
        testing::internal::CaptureStderr();  // a bad value in the caller's environment warns again here
        log::configureFromEnv();
        (void)testing::internal::GetCapturedStderr();
        log::setThreshold(saved_);
    }

    /// What `fn` logged, split into lines.
    template <class F>
    static std::vector<std::string> captured(F&& fn) {
        testing::internal::CaptureStderr();
        std::forward<F>(fn)();
        return splitLines(testing::internal::GetCapturedStderr());
    }

    /// The one line `fn` logged, parsed; fails the test if it logged anything else.
    template <class F>
    static LogLine onlyLine(F&& fn) {
        const auto lines = captured(std::forward<F>(fn));
        EXPECT_EQ(lines.size(), 1u);
        if (lines.empty()) { return {}; }
        const auto parsed = parseLogLine(lines[0]);
        EXPECT_TRUE(parsed) << "not a log line: '" << lines[0] << "'";
        return parsed.value_or(LogLine{});
    }

    log::Level saved_ = log::Level::kWarn;
    std::optional<ScopedEnv> level_;
    std::optional<ScopedEnv> time_;
};

std::string selfTag() { return "t" + std::to_string(::gettid()); }

TEST_F(Log, LineHasUtcMicrosecondTimestampThreadLevelAndText) {
    const auto before = std::chrono::system_clock::now();
    testing::internal::CaptureStderr();
    log::warn("carrier {}: epoll_wait failed: {}", 1, "Interrupted system call");
    const std::string out = testing::internal::GetCapturedStderr();
    const auto after = std::chrono::system_clock::now();

    ASSERT_FALSE(out.empty());
    EXPECT_EQ(out.back(), '\n');
    EXPECT_EQ(out.find('\n'), out.size() - 1) << out;  // one line
    const auto line = parseLogLine(out.substr(0, out.size() - 1));
    ASSERT_TRUE(line) << "not a log line: '" << out << "'";
    EXPECT_EQ(line->thread, selfTag());
    EXPECT_EQ(line->level, "warn");
    EXPECT_EQ(line->text, "carrier 1: epoll_wait failed: Interrupted system call");

    const long long at = logTimeSeconds(line->time);
    const auto seconds = [](auto tp) {
        return std::chrono::duration_cast<std::chrono::seconds>(tp.time_since_epoch()).count();
    };
    EXPECT_GE(at, seconds(before)) << line->time;
    EXPECT_LE(at, seconds(after)) << line->time;
}

TEST_F(Log, EachLevelIsNamed) {
    const auto lines = captured([] {
        log::error("e");
        log::warn("w");
        log::info("i");
        log::debug("d");
    });
    ASSERT_EQ(lines.size(), 4u);
    const char* names[] = {"error", "warn", "info", "debug"};
    for (size_t i = 0; i < lines.size(); ++i) {
        const auto line = parseLogLine(lines[i]);
        ASSERT_TRUE(line) << lines[i];
        EXPECT_EQ(line->level, names[i]);
        EXPECT_EQ(line->text, std::string(1, names[i][0]));
    }
}

TEST_F(Log, ThresholdDropsLowerLevels) {
    const auto logAll = [] {
        log::error("e");
        log::warn("w");
        log::info("i");
        log::debug("d");
    };
    const auto levelsAt = [&](log::Level threshold) {
        log::setThreshold(threshold);
        std::string levels;
        for (const std::string& l : captured(logAll)) {
            const auto line = parseLogLine(l);
            levels += line ? line->text : "?";
        }
        return levels;
    };
    EXPECT_EQ(levelsAt(log::Level::kError), "e");
    EXPECT_EQ(levelsAt(log::Level::kWarn), "ew");
    EXPECT_EQ(levelsAt(log::Level::kInfo), "ewi");
    EXPECT_EQ(levelsAt(log::Level::kDebug), "ewid");
}

TEST_F(Log, SpindleLogSetsTheLevel) {
    const std::pair<const char*, log::Level> cases[] = {
        {"error", log::Level::kError}, {"warn", log::Level::kWarn}, {"info", log::Level::kInfo},
        {"debug", log::Level::kDebug}, {"", log::Level::kWarn},  // empty: as if unset
    };
    for (const auto& [value, level] : cases) {
        ScopedEnv env("SPINDLE_LOG", value);
        EXPECT_TRUE(captured([] { log::configureFromEnv(); }).empty()) << "SPINDLE_LOG=" << value;
        EXPECT_EQ(log::threshold(), level) << "SPINDLE_LOG=" << value;
    }
    ScopedEnv env("SPINDLE_LOG", "error");
    log::configureFromEnv();
    EXPECT_TRUE(captured([] { log::warn("dropped"); }).empty());
    EXPECT_EQ(captured([] { log::error("kept"); }).size(), 1u);
}

TEST_F(Log, UnknownSpindleLogWarnsOnceNamingTheLevels) {
    for (const char* value : {"verbose", "WARN", "3"}) {
        ScopedEnv env("SPINDLE_LOG", value);
        const LogLine line = onlyLine([] { log::configureFromEnv(); });
        EXPECT_EQ(line.level, "warn");
        EXPECT_EQ(line.text, std::string("SPINDLE_LOG='") + value +
                                 "' is not a level (error, warn, info or debug); using warn");
        EXPECT_EQ(log::threshold(), log::Level::kWarn);
    }
}

TEST_F(Log, SpindleLogTimeZeroLeavesTheTimestampOut) {
    ScopedEnv env("SPINDLE_LOG_TIME", "0");
    log::configureFromEnv();
    const auto lines = captured([] { log::error("no time"); });
    ASSERT_EQ(lines.size(), 1u);
    EXPECT_EQ(lines[0], selfTag() + " spindle[error]: no time");
    const auto line = parseLogLine(lines[0]);
    ASSERT_TRUE(line);
    EXPECT_TRUE(line->time.empty());
}

TEST_F(Log, UnknownSpindleLogTimeWarnsAndKeepsTheTimestamp) {
    ScopedEnv env("SPINDLE_LOG_TIME", "no");
    const LogLine warning = onlyLine([] { log::configureFromEnv(); });
    EXPECT_EQ(warning.text, "SPINDLE_LOG_TIME='no' is not 0 or 1; timestamps stay on");
    EXPECT_FALSE(warning.time.empty());
    EXPECT_FALSE(onlyLine([] { log::warn("timed"); }).time.empty());
}

TEST_F(Log, ThreadTagNamesTheCarrierOnItsOwnThreadOnly) {
    std::vector<std::string> lines;
    std::string workerTag;
    std::thread worker([&] {
        workerTag = selfTag();
        lines = captured([] {
            log::info("before");
            log::setThreadTag(3);
            log::info("tagged");
            log::clearThreadTag();
            log::info("after");
        });
    });
    worker.join();
    ASSERT_EQ(lines.size(), 3u);
    const auto before = parseLogLine(lines[0]), tagged = parseLogLine(lines[1]), after = parseLogLine(lines[2]);
    ASSERT_TRUE(before && tagged && after) << lines[0] << "\n" << lines[1] << "\n" << lines[2];
    EXPECT_EQ(before->thread, workerTag);
    EXPECT_EQ(tagged->thread, "c3");
    EXPECT_EQ(after->thread, workerTag);
    EXPECT_NE(workerTag, selfTag());
    EXPECT_EQ(onlyLine([] { log::info("main"); }).thread, selfTag());  // the worker's tag stayed there
}

TEST_F(Log, AShortLineDoesNotAllocate) {
    if (!alloc_hook::available()) { GTEST_SKIP() << "no operator new replacement in this build (TSan)"; }
    testing::internal::CaptureStderr();
    const std::string text(300, 'x');
    alloc_hook::ThisThread hook;  // this thread's operator new calls (testing/alloc_hook.h)
    log::warn("carrier {}: {} ({})", 3, text, std::string_view("a string_view"));
    log::write(log::Level::kError, text);
    const uint64_t news = hook.stop();
    const auto lines = splitLines(testing::internal::GetCapturedStderr());
    EXPECT_EQ(news, 0u);
    ASSERT_EQ(lines.size(), 2u);
    EXPECT_TRUE(parseLogLine(lines[0]));

    // The count works: a line longer than the buffers' inline storage does allocate.
    const std::string longText(700, 'y');
    testing::internal::CaptureStderr();
    alloc_hook::ThisThread longHook;
    log::warn("{}", longText);
    const uint64_t longNews = longHook.stop();
    (void)testing::internal::GetCapturedStderr();
    EXPECT_GT(longNews, 0u);
}

TEST_F(Log, KeepsErrno) {
    testing::internal::CaptureStderr();
    errno = EAGAIN;
    log::warn("errno stays");
    const int after = errno;
    (void)testing::internal::GetCapturedStderr();
    EXPECT_EQ(after, EAGAIN);
}

TEST_F(Log, LinesFromManyThreadsAtOnceStayWhole) {
    constexpr int kThreads = 8;
    constexpr int kLines = 300;
    // Short lines, and lines longer than the formatting buffer's inline storage and than PIPE_BUF.
    const auto body = [](int t, int i) { return std::string(static_cast<size_t>((i * 37 + t * 11) % 5000), static_cast<char>('a' + t)); };

    testing::internal::CaptureStderr();
    {
        std::vector<std::jthread> threads;
        for (int t = 0; t < kThreads; ++t) {
            threads.emplace_back([t, &body] {
                if (t % 2 == 1) { log::setThreadTag(static_cast<unsigned>(t)); }
                for (int i = 0; i < kLines; ++i) { log::info("{} {} {}|", t, i, body(t, i)); }
            });
        }
    }
    const auto lines = splitLines(testing::internal::GetCapturedStderr());

    ASSERT_EQ(lines.size(), size_t{kThreads * kLines});
    std::map<std::pair<int, int>, int> seen;
    std::map<int, std::string> tagOf;
    for (const std::string& l : lines) {
        const auto line = parseLogLine(l);
        ASSERT_TRUE(line) << "not a whole log line: '" << l.substr(0, 200) << "'";
        int t = -1, i = -1, used = 0;
        ASSERT_EQ(std::sscanf(line->text.c_str(), "%d %d %n", &t, &i, &used), 2) << line->text.substr(0, 200);
        ASSERT_TRUE(t >= 0 && t < kThreads && i >= 0 && i < kLines) << line->text.substr(0, 200);
        EXPECT_EQ(line->text.substr(static_cast<size_t>(used)), body(t, i) + "|");
        ++seen[{t, i}];
        // Each thread has one tag throughout: c<t> on the tagged ones, its own t<tid> on the others.
        auto [it, first] = tagOf.emplace(t, line->thread);
        EXPECT_EQ(it->second, line->thread);
        if (first) { EXPECT_EQ(line->thread[0], t % 2 == 1 ? 'c' : 't') << line->thread; }
        if (first && t % 2 == 1) { EXPECT_EQ(line->thread, "c" + std::to_string(t)); }
    }
    EXPECT_EQ(seen.size(), size_t{kThreads * kLines});
    for (const auto& [key, n] : seen) { EXPECT_EQ(n, 1) << "thread " << key.first << " line " << key.second; }
}

}  // namespace
}  // namespace spindle
