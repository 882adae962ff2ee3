// SPDX-License-Identifier: Apache-2.0
// metrics::Writer: the exact text of families and samples, escaping, value forms, the order of what is
// written, and every refusal (bad names, counters without _total, repeated families and series).
#include "base/metrics_text.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "tests/base/exposition_check.h"

namespace spindle::metrics {
namespace {

using testing_support::expositionProblem;

TEST(MetricsText, FamilyThenItsSamples) {
    Writer w;
    w.family("spindle_things_total", Type::kCounter, "Things done.");
    w.sample({{"carrier", "0"}}, uint64_t{3});
    w.sample({{"carrier", "1"}, {"kind", "big"}}, uint64_t{0});
    w.family("spindle_level", Type::kGauge, "A level.");
    w.sample({}, 2.5);
    ASSERT_TRUE(w.ok()) << w.error();
    auto page = w.take();
    ASSERT_TRUE(page);
    EXPECT_EQ(*page,
              "# HELP spindle_things_total Things done.\n"
              "# TYPE spindle_things_total counter\n"
              "spindle_things_total{carrier=\"0\"} 3\n"
              "spindle_things_total{carrier=\"1\",kind=\"big\"} 0\n"
              "# HELP spindle_level A level.\n"
              "# TYPE spindle_level gauge\n"
              "spindle_level 2.5\n");
    EXPECT_EQ(expositionProblem(*page), "");
}

TEST(MetricsText, EscapesLabelValuesAndHelp) {
    Writer w;
    w.family("m", Type::kUntyped, "back\\slash, \"quotes\" and a\nnewline");
    w.sample({{"path", "C:\\dir \"x\"\nnext"}}, uint64_t{1});
    auto page = w.take();
    ASSERT_TRUE(page) << w.error();
    EXPECT_EQ(*page,
              "# HELP m back\\\\slash, \"quotes\" and a\\nnewline\n"
              "# TYPE m untyped\n"
              "m{path=\"C:\\\\dir \\\"x\\\"\\nnext\"} 1\n");
    EXPECT_EQ(expositionProblem(*page), "");

    std::string out;
    appendEscapedLabelValue(out, "plain");
    EXPECT_EQ(out, "plain");
    out.clear();
    appendEscapedLabelValue(out, "\\\"\n");
    EXPECT_EQ(out, "\\\\\\\"\\n");
}

TEST(MetricsText, ValueForms) {
    Writer w;
    w.family("big_total", Type::kCounter, "");
    w.sample({}, std::numeric_limits<uint64_t>::max());
    w.family("g", Type::kGauge, "");
    w.sample({{"v", "half"}}, 0.5);
    w.sample({{"v", "tiny"}}, 1e-9);
    w.sample({{"v", "nan"}}, std::nan(""));
    w.sample({{"v", "inf"}}, std::numeric_limits<double>::infinity());
    w.sample({{"v", "-inf"}}, -std::numeric_limits<double>::infinity());
    w.sample({{"v", "neg"}}, -3.0);
    auto page = w.take();
    ASSERT_TRUE(page) << w.error();
    EXPECT_NE(page->find("big_total 18446744073709551615\n"), std::string::npos) << *page;
    EXPECT_NE(page->find("g{v=\"half\"} 0.5\n"), std::string::npos) << *page;
    EXPECT_DOUBLE_EQ(testing_support::samplesOf(*page, "g").at("{v=\"tiny\"}"), 1e-9);
    EXPECT_NE(page->find("g{v=\"nan\"} NaN\n"), std::string::npos) << *page;
    EXPECT_NE(page->find("g{v=\"inf\"} +Inf\n"), std::string::npos) << *page;
    EXPECT_NE(page->find("g{v=\"-inf\"} -Inf\n"), std::string::npos) << *page;
    EXPECT_NE(page->find("g{v=\"neg\"} -3\n"), std::string::npos) << *page;
    EXPECT_EQ(expositionProblem(*page), "");
}

TEST(MetricsText, NameRules) {
    EXPECT_TRUE(isValidMetricName("a"));
    EXPECT_TRUE(isValidMetricName("_a:b_9"));
    EXPECT_TRUE(isValidMetricName(":x"));
    EXPECT_FALSE(isValidMetricName(""));
    EXPECT_FALSE(isValidMetricName("9a"));
    EXPECT_FALSE(isValidMetricName("a-b"));
    EXPECT_FALSE(isValidMetricName("a b"));
    EXPECT_FALSE(isValidMetricName("é"));
    EXPECT_TRUE(isValidLabelName("carrier"));
    EXPECT_TRUE(isValidLabelName("_x1"));
    EXPECT_FALSE(isValidLabelName(""));
    EXPECT_FALSE(isValidLabelName("__reserved"));
    EXPECT_FALSE(isValidLabelName("a:b"));
    EXPECT_FALSE(isValidLabelName("1a"));
}

// Runs `calls` on a fresh writer that has one good family first; expects it refused with `code`, the
// page withheld, and the good family's text left as it was.
template <class Calls>
void expectRefused(Calls calls, int code, const std::string& words) {
    Writer w;
    w.family("good_total", Type::kCounter, "ok");
    w.sample({}, uint64_t{1});
    const std::string before = w.text();
    calls(w);
    EXPECT_FALSE(w.ok());
    EXPECT_NE(w.error().find(words), std::string::npos) << w.error();
    EXPECT_EQ(w.text(), before) << "a refused call wrote something";
    // Everything after the refusal is ignored, even what would be valid.
    w.family("later", Type::kGauge, "");
    w.sample({}, uint64_t{2});
    EXPECT_EQ(w.text(), before);
    auto page = w.take();
    ASSERT_FALSE(page);
    EXPECT_EQ(page.errorCode(), code);
}

TEST(MetricsText, RefusesWhatTheFormatForbids) {
    expectRefused([](Writer& w) { w.family("bad-name", Type::kGauge, ""); }, EINVAL, "bad-name");
    expectRefused([](Writer& w) { w.family("requests", Type::kCounter, ""); }, EINVAL, "_total");
    expectRefused([](Writer& w) { w.family("good_total", Type::kCounter, "again"); }, EEXIST, "twice");
    expectRefused([](Writer& w) { w.sample({}, uint64_t{5}); }, EEXIST, "twice");
    expectRefused([](Writer& w) { w.sample({{"__name__", "x"}}, uint64_t{5}); }, EINVAL, "__name__");
    expectRefused([](Writer& w) { w.sample({{"a-b", "x"}}, uint64_t{5}); }, EINVAL, "a-b");
    expectRefused([](Writer& w) { w.sample({{"a", "x"}, {"a", "y"}}, uint64_t{5}); }, EINVAL, "twice");
    expectRefused([](Writer& w) { w.sample({{"a", "x"}}, -1.0); }, EINVAL, "counter");
    expectRefused([](Writer& w) { w.sample({{"a", "x"}}, std::nan("")); }, EINVAL, "counter");
}

TEST(MetricsText, RefusesASampleBeforeAnyFamily) {
    Writer w;
    w.sample({}, uint64_t{1});
    EXPECT_FALSE(w.ok());
    EXPECT_EQ(w.text(), "");
    auto page = w.take();
    ASSERT_FALSE(page);
    EXPECT_EQ(page.errorCode(), EINVAL);
}

TEST(MetricsText, KeepsCallOrderAndEmptyFamiliesAndStartsOverAfterTake) {
    Writer w;
    const std::vector<std::string> names{"zeta", "alpha", "mid"};
    for (const std::string& n : names) { w.family(n, Type::kGauge, n); }
    w.sample({}, uint64_t{7});  // belongs to "mid", the current family
    auto page = w.take();
    ASSERT_TRUE(page) << w.error();
    size_t last = 0;
    for (const std::string& n : names) {
        const size_t at = page->find("# HELP " + n + " ");
        ASSERT_NE(at, std::string::npos) << n;
        EXPECT_GE(at, last) << n << " out of order";
        last = at;
    }
    EXPECT_TRUE(page->ends_with("# TYPE mid gauge\nmid 7\n")) << *page;
    EXPECT_EQ(expositionProblem(*page), "");
    // A taken writer is empty and may write the same names again.
    EXPECT_EQ(w.text(), "");
    w.family("zeta", Type::kGauge, "");
    w.sample({}, uint64_t{1});
    EXPECT_TRUE(w.ok()) << w.error();
}

TEST(MetricsText, TheCheckerCatchesBrokenPages) {
    // The checker the other tests rely on must itself fail on what the writer refuses to write.
    EXPECT_NE(expositionProblem("m 1\n"), "");                                          // no family
    EXPECT_NE(expositionProblem("# HELP m x\n# TYPE m gauge\nn 1\n"), "");               // other name
    EXPECT_NE(expositionProblem("# HELP m x\n# TYPE m gauge\nm{a=\"\"\"} 1\n"), "");     // bare quote
    EXPECT_NE(expositionProblem("# HELP m x\n# TYPE m gauge\nm 1\n# HELP m x\n# TYPE m gauge\n"), "");
    EXPECT_NE(expositionProblem("# HELP m x\n# TYPE m counter\nm 1\n"), "");             // no _total
    EXPECT_NE(expositionProblem("# HELP m x\n# TYPE m gauge\nm one\n"), "");             // not a number
    EXPECT_NE(expositionProblem("# HELP m x\n# TYPE m gauge\nm 1"), "");                 // no newline
    EXPECT_EQ(expositionProblem("# HELP m x\n# TYPE m gauge\nm{a=\"\\\"\"} 1\n"), "");
}

}  // namespace
}  // namespace spindle::metrics
