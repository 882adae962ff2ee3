// SPDX-License-Identifier: Apache-2.0
#pragma once
// Checks a page against the Prometheus text exposition format 0.0.4, independently of the writer that made
// it: every line is a HELP, a TYPE or a sample; each family's HELP comes first, then its TYPE, then its
// samples; no family name appears twice; a sample's name is its family's (a counter's samples carry it
// whole, _total included); label names and values are well formed (a value's only escapes are \\, \" and
// \n); a value is a Go float. Shared by the writer's, the runtime's and the endpoint's tests.

#include <cstdint>
#include <cstdlib>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace spindle::testing_support {

/// "" when `page` is valid, else what is wrong and on which line.
inline std::string expositionProblem(const std::string& page) {
    static const std::regex kHelp(R"(# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) ((?:[^\\\n]|\\\\|\\n)*))");
    static const std::regex kType(R"(# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|untyped|summary|histogram))");
    static const std::regex kSample(
        R"(([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\\\|\\"|\\n)*")(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\\\|\\"|\\n)*")*\})? ([-+]?(?:[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?|\.[0-9]+(?:[eE][-+]?[0-9]+)?|Inf|NaN)))");
    if (page.empty()) { return "empty page"; }
    if (page.back() != '\n') { return "the last line has no newline"; }
    std::set<std::string> families;
    std::string current;   // the family whose samples may follow
    std::string helped;    // a HELP line just seen, waiting for its TYPE
    std::string type;
    std::istringstream in(page);
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
        const std::string where = "line " + std::to_string(n) + " '" + line + "': ";
        std::smatch m;
        if (std::regex_match(line, m, kHelp)) {
            if (!helped.empty()) { return where + "HELP after a HELP without its TYPE"; }
            if (!families.insert(m[1]).second) { return where + "family written twice"; }
            helped = m[1];
            current.clear();
        } else if (std::regex_match(line, m, kType)) {
            if (m[1] != helped) { return where + "TYPE without its HELP just before"; }
            current = helped;
            type = m[2];
            helped.clear();
        } else if (std::regex_match(line, m, kSample)) {
            if (current.empty()) { return where + "sample outside a family"; }
            if (m[1] != current) { return where + "sample of another name than its family " + current; }
            if (type == "counter" && !current.ends_with("_total")) { return where + "counter without _total"; }
            if (type == "counter" && (m[3].str().starts_with("-") || m[3] == "NaN")) {
                return where + "a counter below zero or NaN";
            }
        } else {
            return where + "neither HELP, TYPE nor a sample";
        }
    }
    if (!helped.empty()) { return "HELP of " + helped + " without a TYPE"; }
    return "";
}

/// The samples of `page` whose name is `name`, as (labels text, value) pairs: `{carrier="0"}` -> 12.
inline std::map<std::string, double> samplesOf(const std::string& page, std::string_view name) {
    std::map<std::string, double> out;
    std::istringstream in(page);
    std::string line;
    while (std::getline(in, line)) {
        if (line.empty() || line[0] == '#' || !line.starts_with(name)) { continue; }
        const std::string rest = line.substr(name.size());
        if (!rest.empty() && rest[0] != '{' && rest[0] != ' ') { continue; }  // a longer name
        const size_t space = rest.rfind(' ');
        out[rest.substr(0, space)] = std::strtod(rest.c_str() + space + 1, nullptr);
    }
    return out;
}

/// The sum of samplesOf(page, name).
inline double sumOf(const std::string& page, std::string_view name) {
    double sum = 0;
    for (const auto& [labels, value] : samplesOf(page, name)) { sum += value; }
    return sum;
}

}  // namespace spindle::testing_support
