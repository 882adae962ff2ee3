// SPDX-License-Identifier: Apache-2.0
#pragma once
/// metrics::Writer: builds a page in the Prometheus text exposition format, version 0.0.4 (the one every
/// Prometheus server and scraper reads, served as kContentType).
///
/// A page is a run of metric families. family() starts one and writes its "# HELP" and "# TYPE" lines;
/// sample() then adds one line per series, `name{label="value",...} value`. The writer keeps each
/// family's samples together under its header, writes families in the order they were begun, and
/// refuses what the format or Prometheus' naming rules forbid:
///   - a metric name outside [a-zA-Z_:][a-zA-Z0-9_:]*, a label name outside [a-zA-Z_][a-zA-Z0-9_]* or
///     beginning with "__" (reserved for Prometheus' own use);
///   - a counter whose name does not end in "_total", or a negative or NaN counter value;
///   - a second family of the same name, a second series of a family with the same labels, or the
///     same label twice in one sample;
///   - a sample before any family.
/// Label values may hold any bytes: backslash, double quote and newline are escaped (\\, \", \n);
/// HELP text escapes backslash and newline. Integer values are written exactly (a uint64_t counter
/// keeps all its digits); doubles in their shortest round-trip form, and NaN, +Inf, -Inf by name.
///
/// Errors: a refused call writes nothing; the writer keeps the first error (ok() turns false, error()
/// says what was refused and why) and ignores every call after it, so a page is either complete and
/// valid or not given out at all: take() returns the error's errno then (EINVAL for a bad name, label
/// or value, or a sample without a family; EEXIST for a repeated family or series).
/// Thread-safety: one thread or fiber at a time.

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <unordered_set>

#include "base/result.h"

namespace spindle::metrics {

/// The Content-Type of a page in this format.
inline constexpr std::string_view kContentType = "text/plain; version=0.0.4; charset=utf-8";

enum class Type : uint8_t {
    kCounter,  // only goes up (reset when the process restarts); name ends in _total
    kGauge,    // goes up and down
    kUntyped,  // neither said
};

/// "counter", "gauge" or "untyped".
const char* toString(Type type) noexcept;

/// One label of a sample. Both views need to live only during the sample() call.
struct Label {
    std::string_view name;
    std::string_view value;
};

/// Whether `name` may name a metric: [a-zA-Z_:][a-zA-Z0-9_:]*.
[[nodiscard]] bool isValidMetricName(std::string_view name) noexcept;
/// Whether `name` may name a label: [a-zA-Z_][a-zA-Z0-9_]*, not beginning with "__".
[[nodiscard]] bool isValidLabelName(std::string_view name) noexcept;
/// Appends `value` to `out` as a label value is written between its quotes (\\, \", \n escaped).
void appendEscapedLabelValue(std::string& out, std::string_view value);

class Writer {
public:
    /// Begins the family `name` of `type`, with one line of `help`. Errors: as the class comment says.
    void family(std::string_view name, Type type, std::string_view help);
    /// One series of the current family. Errors: as the class comment says.
    void sample(std::span<const Label> labels, uint64_t value);
    void sample(std::span<const Label> labels, double value);
    void sample(std::initializer_list<Label> labels, uint64_t value) {
        sample(std::span<const Label>(labels.begin(), labels.size()), value);
    }
    void sample(std::initializer_list<Label> labels, double value) {
        sample(std::span<const Label>(labels.begin(), labels.size()), value);
    }

    /// False once a call was refused.
    [[nodiscard]] bool ok() const noexcept { return errorCode_ == 0; }
    /// What the first refused call was, in words ("" while ok()).
    [[nodiscard]] const std::string& error() const noexcept { return error_; }
    /// The page so far (every line ends in '\n').
    [[nodiscard]] const std::string& text() const noexcept { return text_; }
    /// Hands the page out and leaves the writer empty. Errors: the first refused call's errno (the
    /// page is dropped; error() still says why).
    [[nodiscard]] Result<std::string> take();

private:
    // Writes `name{labels}` for the current family, checking the labels. False (and the error kept)
    // when refused.
    bool beginSample(std::span<const Label> labels);
    void fail(int code, std::string message);

    std::string text_;
    std::string family_;                      // the current family's name; "" before the first
    Type type_ = Type::kUntyped;
    std::unordered_set<std::string> families_;  // every family name written
    std::unordered_set<std::string> series_;    // the current family's label sets, as written
    std::string scratch_;                       // the sample line being built
    int errorCode_ = 0;                         // 0: ok
    std::string error_;
};

}  // namespace spindle::metrics
