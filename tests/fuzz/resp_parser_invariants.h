// SPDX-License-Identifier: Apache-2.0
#pragma once
// What must hold for any input to spindle-kv's RESP parser (apps/kv/resp.h), checked by the libFuzzer
// target and by the corpus test in every build. Each check returns "" or a description of what broke.

#include <string>
#include <string_view>

#include "apps/kv/resp.h"

namespace spindle::kv::testing_support {

inline bool within(std::string_view outer, std::string_view inner) {
    return inner.empty() || (inner.data() >= outer.data() && inner.data() + inner.size() <= outer.data() + outer.size());
}

inline std::string encode(const Request& req) {
    std::string out = "*" + std::to_string(req.args.size()) + "\r\n";
    for (std::string_view a : req.args) {
        out += "$" + std::to_string(a.size()) + "\r\n";
        out.append(a);
        out += "\r\n";
    }
    return out;
}

inline std::string checkRespInvariants(std::string_view input, const RespLimits& limits) {
    Request req;
    const ParseResult r = parseRequest(input, limits, req);
    switch (r.status) {
        case ParseStatus::kIncomplete:
            if (r.consumed != 0) { return "incomplete but consumed bytes"; }
            if (!req.args.empty()) { return "incomplete but produced arguments"; }
            return "";
        case ParseStatus::kError:
            if (r.error.rfind("Protocol error: ", 0) != 0) { return "an error without Redis's prefix: " + std::string(r.error); }
            return "";
        case ParseStatus::kCommand: break;
    }
    if (r.consumed == 0 || r.consumed > input.size()) { return "a command consumed " + std::to_string(r.consumed) + " bytes"; }
    for (std::string_view a : req.args) {
        bool owned = false;
        for (const std::string& o : req.owned) { owned = owned || within(o, a); }
        if (!owned && !within(input.substr(0, r.consumed), a)) { return "an argument points outside the request"; }
    }
    // The same command, whatever follows it (pipelining).
    const std::string twice = std::string(input.substr(0, r.consumed)) + std::string(input);
    Request again;
    const ParseResult r2 = parseRequest(twice, limits, again);
    if (r2.status != ParseStatus::kCommand || r2.consumed != r.consumed || again.args != req.args) {
        return "the command parsed differently with bytes after it";
    }
    // Cut short, it is not a command yet (for requests short enough that the cut cannot hit a limit).
    if (r.consumed <= limits.maxInlineSize) {
        Request cut;
        const ParseResult r3 = parseRequest(input.substr(0, r.consumed - 1), limits, cut);
        if (r3.status == ParseStatus::kCommand) { return "a prefix of a command parsed as a command"; }
    }
    // Its arguments, written as an array, parse back to themselves.
    if (!req.args.empty()) {
        const std::string encoded = encode(req);
        Request back;
        const ParseResult r4 = parseRequest(encoded, RespLimits{}, back);
        if (r4.status != ParseStatus::kCommand || r4.consumed != encoded.size() || back.args != req.args) {
            return "the arguments did not survive a round trip";
        }
    }
    return "";
}

}  // namespace spindle::kv::testing_support
