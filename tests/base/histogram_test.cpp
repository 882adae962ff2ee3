// SPDX-License-Identifier: Apache-2.0
// Tests for LogLinearHistogram: bucket boundaries, the edge cases (empty, one value, the largest
// value), and percentiles on random data checked against a sorted-vector reference.

#include "base/histogram.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <vector>

namespace spindle {
namespace {

constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
constexpr double kQuantiles[] = {0.0001, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999, 0.9999, 1.0};

// The nearest-rank percentile of a sorted list: the value of rank ceil(q * n).
uint64_t referencePercentile(const std::vector<uint64_t>& sorted, double q) {
    const auto n = static_cast<double>(sorted.size());
    auto rank = static_cast<size_t>(std::ceil(q * n));
    rank = std::clamp<size_t>(rank, 1, sorted.size());
    return sorted[rank - 1];
}

// The histogram is about 30 KiB: keep it off the test's stack.
std::unique_ptr<LogLinearHistogram> makeHistogram() { return std::make_unique<LogLinearHistogram>(); }

// Every answer is the highest value of the reference's bucket, clamped into [min, max]: never
// below the reference, and within one bucket width (1/64 of the value) above it.
void expectMatchesReference(const LogLinearHistogram& h, std::vector<uint64_t> values) {
    std::sort(values.begin(), values.end());
    ASSERT_EQ(h.count(), values.size());
    EXPECT_EQ(h.min(), values.front());
    EXPECT_EQ(h.max(), values.back());
    for (double q : kQuantiles) {
        const uint64_t ref = referencePercentile(values, q);
        const uint64_t got = h.percentile(q);
        const size_t bucket = LogLinearHistogram::bucketOf(ref);
        EXPECT_EQ(LogLinearHistogram::bucketOf(got), bucket) << "q=" << q << " ref=" << ref << " got=" << got;
        EXPECT_GE(got, ref) << "q=" << q;
        EXPECT_LE(static_cast<double>(got - ref), static_cast<double>(ref) / 64.0 + 1e-9) << "q=" << q << " ref=" << ref;
    }
}

TEST(LogLinearHistogram, BucketsTileTheRangeWithoutGaps) {
    // Each bucket starts one past the end of the one before, and the bucket of both of its ends is itself.
    EXPECT_EQ(LogLinearHistogram::lowestOf(0), 0u);
    for (size_t i = 0; i < LogLinearHistogram::kBuckets; ++i) {
        const uint64_t lo = LogLinearHistogram::lowestOf(i);
        const uint64_t hi = LogLinearHistogram::highestOf(i);
        ASSERT_LE(lo, hi) << i;
        ASSERT_EQ(LogLinearHistogram::bucketOf(lo), i);
        ASSERT_EQ(LogLinearHistogram::bucketOf(hi), i);
        if (i + 1 < LogLinearHistogram::kBuckets) { ASSERT_EQ(LogLinearHistogram::lowestOf(i + 1), hi + 1) << i; }
        // Relative width: at most 1/64 of the smallest value in the bucket (exact below 128).
        if (lo >= 64) { ASSERT_LE(hi - lo + 1, lo / 64) << i; }
    }
    EXPECT_EQ(LogLinearHistogram::highestOf(LogLinearHistogram::kBuckets - 1), kMax);
}

TEST(LogLinearHistogram, ValuesBelow128AreExact) {
    for (uint64_t v = 0; v < 128; ++v) {
        EXPECT_EQ(LogLinearHistogram::lowestOf(LogLinearHistogram::bucketOf(v)), v);
        EXPECT_EQ(LogLinearHistogram::highestOf(LogLinearHistogram::bucketOf(v)), v);
    }
}

TEST(LogLinearHistogram, EmptyAnswersZero) {
    auto h = makeHistogram();
    EXPECT_EQ(h->count(), 0u);
    EXPECT_EQ(h->min(), 0u);
    EXPECT_EQ(h->max(), 0u);
    EXPECT_EQ(h->mean(), 0.0);
    for (double q : kQuantiles) { EXPECT_EQ(h->percentile(q), 0u) << q; }
}

TEST(LogLinearHistogram, OneValueIsEveryPercentile) {
    for (uint64_t v : {uint64_t{0}, uint64_t{1}, uint64_t{63}, uint64_t{64}, uint64_t{1000}, uint64_t{123456789}}) {
        auto h = makeHistogram();
        h->record(v);
        EXPECT_EQ(h->count(), 1u);
        EXPECT_EQ(h->min(), v);
        EXPECT_EQ(h->max(), v);
        EXPECT_EQ(h->mean(), static_cast<double>(v));
        // Clamping into [min, max] makes the answer exact for a single value.
        for (double q : kQuantiles) { EXPECT_EQ(h->percentile(q), v) << "v=" << v << " q=" << q; }
    }
}

TEST(LogLinearHistogram, LargestValue) {
    auto h = makeHistogram();
    h->record(kMax);
    EXPECT_EQ(h->max(), kMax);
    EXPECT_EQ(h->percentile(0.5), kMax);
    h->record(0);
    EXPECT_EQ(h->min(), 0u);
    EXPECT_EQ(h->percentile(0.5), 0u);
    EXPECT_EQ(h->percentile(0.51), kMax);
    EXPECT_EQ(h->percentile(1.0), kMax);
}

TEST(LogLinearHistogram, PercentilesMatchSortedReferenceOnRandomData) {
    std::mt19937_64 rng(20261121);
    // Latency-like (log-normal around 20 us in ns), uniform over a wide range, and tiny exact values.
    std::lognormal_distribution<double> lognormal(std::log(20000.0), 0.8);
    std::uniform_int_distribution<uint64_t> wide(0, uint64_t{1} << 40);
    std::uniform_int_distribution<uint64_t> small(0, 200);
    for (int dist = 0; dist < 3; ++dist) {
        for (size_t n : {size_t{1}, size_t{2}, size_t{10}, size_t{1000}, size_t{100000}}) {
            auto h = makeHistogram();
            std::vector<uint64_t> values;
            values.reserve(n);
            for (size_t i = 0; i < n; ++i) {
                const uint64_t v = dist == 0 ? static_cast<uint64_t>(lognormal(rng)) : dist == 1 ? wide(rng) : small(rng);
                values.push_back(v);
                h->record(v);
            }
            SCOPED_TRACE(testing::Message() << "distribution " << dist << ", n " << n);
            expectMatchesReference(*h, values);
        }
    }
}

TEST(LogLinearHistogram, MergeEqualsRecordingEverythingInOne) {
    std::mt19937_64 rng(42);
    std::lognormal_distribution<double> lognormal(std::log(5000.0), 1.2);
    auto all = makeHistogram();
    auto merged = makeHistogram();
    std::vector<uint64_t> values;
    for (int part = 0; part < 4; ++part) {
        auto h = makeHistogram();
        for (int i = 0; i < 5000 * (part + 1); ++i) {
            const auto v = static_cast<uint64_t>(lognormal(rng));
            h->record(v);
            all->record(v);
            values.push_back(v);
        }
        merged->merge(*h);
    }
    merged->merge(*makeHistogram());  // an empty one changes nothing, min included
    EXPECT_EQ(merged->count(), all->count());
    EXPECT_EQ(merged->sum(), all->sum());
    EXPECT_EQ(merged->min(), all->min());
    EXPECT_EQ(merged->max(), all->max());
    for (double q : kQuantiles) { EXPECT_EQ(merged->percentile(q), all->percentile(q)) << q; }
    expectMatchesReference(*merged, values);

    merged->reset();
    EXPECT_EQ(merged->count(), 0u);
    EXPECT_EQ(merged->percentile(0.5), 0u);
}

}  // namespace
}  // namespace spindle
