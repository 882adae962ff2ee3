// SPDX-License-Identifier: Apache-2.0
#pragma once
/// LogLinearHistogram: counts of unsigned 64-bit values (latencies in ns, say) in log-linear buckets,
/// HdrHistogram-style, for percentiles at a fixed relative precision in fixed memory.
///
/// Buckets: values below 64 each have their own bucket (exact). Above, every power-of-two range
/// [2^m, 2^(m+1)) is cut into 64 equal sub-buckets of width 2^(m-6), so a bucket is at most 1/64
/// (1.56 %) of the values it holds wide. The whole uint64_t range takes 59 * 64 buckets (about
/// 30 KiB of counters), allocated with the object; record() never allocates and never fails.
/// Exact count, sum, min and max are kept beside the buckets.
///
/// Percentiles: percentile(q) finds the bucket holding the value of rank ceil(q * count) (the
/// "nearest rank" of a sorted list) and returns that bucket's highest value, clamped into
/// [min(), max()]: never below the true value, and at most one bucket width (1.56 %) above it.
/// percentile(1.0) is max() exactly; an empty histogram answers 0.
/// Thread-safety: none; give each thread (or carrier) its own and merge() them at the end.

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>

namespace spindle {

class LogLinearHistogram {
public:
    static constexpr unsigned kSubBits = 6;
    static constexpr uint64_t kSubBuckets = uint64_t{1} << kSubBits;  // 64
    // Groups: group 0 holds 0..63 exactly; group g >= 1 holds [2^(g+5), 2^(g+6)).
    static constexpr size_t kGroups = 64 - kSubBits + 1;  // 59
    static constexpr size_t kBuckets = kGroups * kSubBuckets;

    /// Counts one value. noexcept, no allocation.
    void record(uint64_t value) noexcept {
        ++counts_[bucketOf(value)];
        ++count_;
        sum_ += value;
        min_ = std::min(min_, value);
        max_ = std::max(max_, value);
    }

    /// Adds every count of `other` into this one.
    void merge(const LogLinearHistogram& other) noexcept {
        for (size_t i = 0; i < kBuckets; ++i) { counts_[i] += other.counts_[i]; }
        count_ += other.count_;
        sum_ += other.sum_;
        min_ = std::min(min_, other.min_);
        max_ = std::max(max_, other.max_);
    }

    void reset() noexcept {
        counts_.fill(0);
        count_ = sum_ = max_ = 0;
        min_ = std::numeric_limits<uint64_t>::max();
    }

    [[nodiscard]] uint64_t count() const noexcept { return count_; }
    /// Sum of the recorded values (wraps past 2^64; fine for latencies in ns).
    [[nodiscard]] uint64_t sum() const noexcept { return sum_; }
    [[nodiscard]] uint64_t min() const noexcept { return count_ == 0 ? 0 : min_; }
    [[nodiscard]] uint64_t max() const noexcept { return max_; }
    [[nodiscard]] double mean() const noexcept {
        return count_ == 0 ? 0.0 : static_cast<double>(sum_) / static_cast<double>(count_);
    }

    /// The value at quantile q (0 < q <= 1; q <= 0 gives min(), q > 1 is taken as 1); see the class comment.
    [[nodiscard]] uint64_t percentile(double q) const noexcept {
        if (count_ == 0) { return 0; }
        if (q <= 0.0) { return min(); }
        if (q >= 1.0) { return max_; }
        const double exact = q * static_cast<double>(count_);
        uint64_t rank = static_cast<uint64_t>(exact);
        if (static_cast<double>(rank) < exact) { ++rank; }  // ceil without <cmath>
        rank = std::clamp<uint64_t>(rank, 1, count_);
        uint64_t seen = 0;
        for (size_t i = 0; i < kBuckets; ++i) {
            seen += counts_[i];
            if (seen >= rank) { return std::clamp(highestOf(i), min(), max_); }
        }
        return max_;  // unreachable: the counts add up to count_
    }

    /// The bucket index of a value.
    [[nodiscard]] static constexpr size_t bucketOf(uint64_t value) noexcept {
        if (value < kSubBuckets) { return static_cast<size_t>(value); }
        const unsigned msb = 63u - static_cast<unsigned>(std::countl_zero(value));  // >= kSubBits
        const unsigned shift = msb - kSubBits;
        const size_t group = msb - kSubBits + 1;
        return group * kSubBuckets + static_cast<size_t>((value >> shift) & (kSubBuckets - 1));
    }
    /// The smallest and the largest value that land in bucket `index`.
    [[nodiscard]] static constexpr uint64_t lowestOf(size_t index) noexcept {
        const size_t group = index / kSubBuckets;
        const uint64_t sub = index % kSubBuckets;
        if (group == 0) { return sub; }
        return (kSubBuckets + sub) << (group - 1);
    }
    [[nodiscard]] static constexpr uint64_t highestOf(size_t index) noexcept {
        const size_t group = index / kSubBuckets;
        if (group == 0) { return index; }
        return lowestOf(index) + ((uint64_t{1} << (group - 1)) - 1);
    }

private:
    std::array<uint64_t, kBuckets> counts_{};
    uint64_t count_ = 0;
    uint64_t sum_ = 0;
    // Invariant: min_ is UINT64_MAX and max_ 0 while count_ is 0.
    uint64_t min_ = std::numeric_limits<uint64_t>::max();
    uint64_t max_ = 0;
};

static_assert(LogLinearHistogram::bucketOf(std::numeric_limits<uint64_t>::max()) == LogLinearHistogram::kBuckets - 1);
static_assert(LogLinearHistogram::highestOf(LogLinearHistogram::kBuckets - 1) == std::numeric_limits<uint64_t>::max());
static_assert(LogLinearHistogram::lowestOf(LogLinearHistogram::bucketOf(64)) == 64);

}  // namespace spindle
