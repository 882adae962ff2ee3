// SPDX-License-Identifier: Apache-2.0
#include "base/metrics_text.h"

#include <cmath>
#include <iterator>
#include <utility>

#include <fmt/format.h>

namespace spindle::metrics {

namespace {

bool isAlpha(char c) noexcept { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool isDigit(char c) noexcept { return c >= '0' && c <= '9'; }

// HELP text: backslash and newline escaped, nothing else (the format leaves quotes alone there).
void appendEscapedHelp(std::string& out, std::string_view help) {
    for (const char c : help) {
        if (c == '\\') {
            out += "\\\\";
        } else if (c == '\n') {
            out += "\\n";
        } else {
            out += c;
        }
    }
}

}  // namespace

const char* toString(Type type) noexcept {
    switch (type) {
        case Type::kCounter: return "counter";
        case Type::kGauge: return "gauge";
        case Type::kUntyped: return "untyped";
    }
    return "untyped";
}

bool isValidMetricName(std::string_view name) noexcept {
    if (name.empty()) { return false; }
    for (size_t i = 0; i < name.size(); ++i) {
        const char c = name[i];
        if (!(isAlpha(c) || c == '_' || c == ':' || (i > 0 && isDigit(c)))) { return false; }
    }
    return true;
}

bool isValidLabelName(std::string_view name) noexcept {
    if (name.empty() || name.starts_with("__")) { return false; }
    for (size_t i = 0; i < name.size(); ++i) {
        const char c = name[i];
        if (!(isAlpha(c) || c == '_' || (i > 0 && isDigit(c)))) { return false; }
    }
    return true;
}

void appendEscapedLabelValue(std::string& out, std::string_view value) {
    for (const char c : value) {
        if (c == '\\') {
            out += "\\\\";
        } else if (c == '"') {
            out += "\\\"";
        } else if (c == '\n') {
            out += "\\n";
        } else {
            out += c;
        }
    }
}

void Writer::fail(int code, std::string message) {
    if (errorCode_ != 0) { return; }
    errorCode_ = code;
    error_ = std::move(message);
}

void Writer::family(std::string_view name, Type type, std::string_view help) {
    if (!ok()) { return; }
    if (!isValidMetricName(name)) {
        fail(EINVAL, fmt::format("metric name '{}' is not [a-zA-Z_:][a-zA-Z0-9_:]*", name));
        return;
    }
    if (type == Type::kCounter && !name.ends_with("_total")) {
        fail(EINVAL, fmt::format("counter '{}' does not end in _total", name));
        return;
    }
    if (!families_.emplace(name).second) {
        fail(EEXIST, fmt::format("metric family '{}' written twice", name));
        return;
    }
    family_.assign(name);
    type_ = type;
    series_.clear();
    text_ += "# HELP ";
    text_ += name;
    text_ += ' ';
    appendEscapedHelp(text_, help);
    text_ += "\n# TYPE ";
    text_ += name;
    text_ += ' ';
    text_ += toString(type);
    text_ += '\n';
}

bool Writer::beginSample(std::span<const Label> labels) {
    if (!ok()) { return false; }
    if (family_.empty()) {
        fail(EINVAL, "a sample before any metric family");
        return false;
    }
    scratch_ = family_;
    if (!labels.empty()) {
        scratch_ += '{';
        for (size_t i = 0; i < labels.size(); ++i) {
            const Label& l = labels[i];
            if (!isValidLabelName(l.name)) {
                fail(EINVAL, fmt::format("{}: label name '{}' is not [a-zA-Z_][a-zA-Z0-9_]* (or begins with __)",
                                         family_, l.name));
                return false;
            }
            for (size_t j = 0; j < i; ++j) {
                if (labels[j].name == l.name) {
                    fail(EINVAL, fmt::format("{}: label '{}' given twice in one sample", family_, l.name));
                    return false;
                }
            }
            if (i > 0) { scratch_ += ','; }
            scratch_ += l.name;
            scratch_ += "=\"";
            appendEscapedLabelValue(scratch_, l.value);
            scratch_ += '"';
        }
        scratch_ += '}';
    }
    // The series is the line up to here; the same labels in another order are the same series to
    // Prometheus, but every caller in spindle writes a family's labels in one order, so the text is the key.
    if (!series_.insert(scratch_).second) {
        fail(EEXIST, fmt::format("series {} written twice", scratch_));
        return false;
    }
    return true;
}

void Writer::sample(std::span<const Label> labels, uint64_t value) {
    if (!beginSample(labels)) { return; }
    text_ += scratch_;
    text_ += ' ';
    fmt::format_to(std::back_inserter(text_), "{}", value);
    text_ += '\n';
}

void Writer::sample(std::span<const Label> labels, double value) {
    if (ok() && type_ == Type::kCounter && !family_.empty() && (std::isnan(value) || value < 0)) {
        fail(EINVAL, fmt::format("counter {} given {}", family_, value));
        return;
    }
    if (!beginSample(labels)) { return; }
    text_ += scratch_;
    text_ += ' ';
    if (std::isnan(value)) {
        text_ += "NaN";
    } else if (std::isinf(value)) {
        text_ += value > 0 ? "+Inf" : "-Inf";
    } else {
        fmt::format_to(std::back_inserter(text_), "{}", value);
    }
    text_ += '\n';
}

Result<std::string> Writer::take() {
    if (!ok()) { return Error{errorCode_}; }
    std::string out = std::move(text_);
    text_.clear();
    family_.clear();
    families_.clear();
    series_.clear();
    return out;
}

}  // namespace spindle::metrics
