// SPDX-License-Identifier: Apache-2.0
#include "base/cpu_list.h"

#include <algorithm>
#include <cstdint>

namespace spindle {

namespace {

// One decimal CPU number at the front of `rest`, taken off it; false when there is none or it is at or
// past CPU_SETSIZE (digits stop being read there, so no length of them overflows).
bool takeCpu(std::string_view& rest, unsigned& out) {
    size_t n = 0;
    uint64_t v = 0;
    while (n < rest.size() && rest[n] >= '0' && rest[n] <= '9' && v < CPU_SETSIZE) {
        v = v * 10 + static_cast<unsigned>(rest[n] - '0');
        ++n;
    }
    if (n == 0 || v >= CPU_SETSIZE) { return false; }
    rest.remove_prefix(n);
    out = static_cast<unsigned>(v);
    return true;
}

}  // namespace

std::optional<std::vector<unsigned>> parseCpuList(std::string_view text) {
    cpu_set_t in;
    CPU_ZERO(&in);
    std::string_view rest = text;
    for (;;) {
        unsigned first = 0;
        if (!takeCpu(rest, first)) { return std::nullopt; }
        unsigned last = first;
        if (!rest.empty() && rest.front() == '-') {
            rest.remove_prefix(1);
            if (!takeCpu(rest, last) || last < first) { return std::nullopt; }
        }
        for (unsigned c = first; c <= last; ++c) { CPU_SET(c, &in); }
        if (rest.empty()) { break; }
        if (rest.front() != ',') { return std::nullopt; }
        rest.remove_prefix(1);
    }
    return cpusIn(in);
}

std::string formatCpuList(std::vector<unsigned> cpus) {
    std::sort(cpus.begin(), cpus.end());
    cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
    std::string out;
    for (size_t i = 0; i < cpus.size();) {
        size_t j = i;
        while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) { ++j; }
        if (!out.empty()) { out += ','; }
        out += std::to_string(cpus[i]);
        if (j > i) { out += '-' + std::to_string(cpus[j]); }
        i = j + 1;
    }
    return out;
}

std::vector<unsigned> cpusIn(const cpu_set_t& set) {
    std::vector<unsigned> out;
    for (unsigned c = 0; c < CPU_SETSIZE; ++c) {
        if (CPU_ISSET(c, &set)) { out.push_back(c); }
    }
    return out;
}

}  // namespace spindle
