// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The properties every parse must have, whatever the input: shared by the libFuzzer target
/// (tests/fuzz/http_parser_fuzz.cpp), which aborts on a violation, and the corpus test
/// (tests/httpd/corpus_test.cpp), which reports it.

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "apps/httpd/file_response.h"
#include "apps/httpd/http_parser.h"
#include "apps/httpd/static_path.h"

namespace spindle::httpd::testing_support {

/// Whether `part` lies inside `whole` (an empty view must still point into it or at its end).
inline bool inside(std::string_view part, std::string_view whole) noexcept {
    const auto pb = reinterpret_cast<uintptr_t>(part.data());
    const auto wb = reinterpret_cast<uintptr_t>(whole.data());
    return pb >= wb && pb + part.size() <= wb + whole.size();
}

/// "" when parsing `input` under `limits` keeps every invariant; otherwise what broke.
inline std::string checkParserInvariants(std::string_view input, const ParserLimits& limits) {
    std::array<Header, 128> storage;
    Request req;
    const ParseResult r = parseRequest(input, limits, storage, req);
    if (r.consumed > input.size()) { return "consumed > input size"; }
    switch (r.status) {
        case ParseStatus::kIncomplete:
            if (r.consumed != 0) { return "incomplete with consumed != 0"; }
            if (input.size() > limits.maxHeaderBytes) { return "incomplete past maxHeaderBytes"; }
            return {};
        case ParseStatus::kError:
            switch (r.httpStatus) {
                case 400: case 411: case 413: case 414: case 431: case 501: case 505: break;
                default: return "error with unexpected status " + std::to_string(r.httpStatus);
            }
            return {};
        case ParseStatus::kComplete:
            break;
    }
    if (req.headLength == 0 || req.headLength > limits.maxHeaderBytes) { return "headLength out of range"; }
    if (r.consumed != req.headLength + req.body.size()) { return "consumed != headLength + body"; }
    if (req.body.size() > req.contentLength) { return "body longer than Content-Length"; }
    if (req.contentLength > limits.maxBodyBytes) { return "Content-Length over the limit accepted"; }
    if (req.headers.size() > limits.maxHeaders || req.headers.size() > storage.size()) { return "too many headers"; }
    const std::string_view head = input.substr(0, req.headLength);
    for (std::string_view v : {req.methodText, req.target, req.path, req.query, req.host}) {
        if (!v.empty() && !inside(v, head)) { return "a request field points outside the head"; }
    }
    if (!inside(req.path, req.target) || !inside(req.query, req.target)) { return "path or query outside the target"; }
    if (!req.body.empty() && req.body.data() != input.data() + req.headLength) { return "body does not follow the head"; }
    for (const Header& h : req.headers) {
        if (h.name.empty() || !inside(h.name, head) || (!h.value.empty() && !inside(h.value, head))) {
            return "a header points outside the head";
        }
    }
    if (req.versionMinor != 0 && req.versionMinor != 1) { return "version out of range"; }
    if (req.versionMinor == 1 && req.host.empty() && req.header("host").data() == nullptr) { return "1.1 without Host"; }
    // The parser is a function of the bytes: every proper prefix of a complete head is incomplete.
    Request prefixReq;
    const ParseResult prefix = parseRequest(input.substr(0, req.headLength - 1), limits, storage, prefixReq);
    if (prefix.status != ParseStatus::kIncomplete) { return "a prefix of a complete head is not incomplete"; }
    // ... and bytes after it do not change how the head parses.
    const ParseResult again = parseRequest(input.substr(0, req.headLength), limits, storage, prefixReq);
    if (again.status != ParseStatus::kComplete || prefixReq.headLength != req.headLength) {
        return "the head alone does not parse the same";
    }
    // The path helper on whatever path the parser produced.
    std::array<char, 256> path;
    size_t length = 0;
    if (resolvePath(req.path, path.data(), path.size(), &length) == PathStatus::kOk) {
        const std::string_view resolved(path.data(), length);
        if (length >= path.size() || path[length] != '\0') { return "resolved path not terminated"; }
        if (!resolved.empty() && resolved.front() == '/') { return "resolved path is absolute"; }
        if (resolved == ".." || resolved.starts_with("../") || resolved.find("/../") != std::string_view::npos ||
            resolved.ends_with("/..")) {
            return "resolved path escapes the root";
        }
    }
    // A chunked body: the head only is consumed, and the skipper reads the rest the same in any pieces.
    if (req.chunked) {
        if (req.contentLength != 0 || !req.body.empty()) { return "a chunked request with a length"; }
        const std::string_view rest = input.substr(req.headLength);
        ChunkedBodySkipper whole(limits.maxBodyBytes, limits.maxHeaderBytes);
        size_t wholeUsed = 0;
        const ChunkedBodySkipper::Status ws = whole.feed(rest, &wholeUsed);
        if (wholeUsed > rest.size()) { return "the skipper consumed more than it was given"; }
        ChunkedBodySkipper bytewise(limits.maxBodyBytes, limits.maxHeaderBytes);
        size_t used = 0;
        ChunkedBodySkipper::Status bs = ChunkedBodySkipper::Status::kNeedMore;
        for (size_t i = 0; i < rest.size() && bs == ChunkedBodySkipper::Status::kNeedMore; ++i) {
            size_t c = 0;
            bs = bytewise.feed(rest.substr(i, 1), &c);
            used += c;
        }
        if (bs != ws || used != wholeUsed || bytewise.errorStatus() != whole.errorStatus() ||
            bytewise.bodyBytes() != whole.bodyBytes()) {
            return "the skipper depends on how the body is cut";
        }
        if (whole.bodyBytes() > limits.maxBodyBytes) { return "a chunked body over the limit accepted"; }
    }
    // The file response's decision, for files of a few sizes: a status it may answer, bytes inside the file.
    const ETag tag = makeETag(1000, 1'700'000'000);
    for (const uint64_t size : {uint64_t{0}, uint64_t{1}, uint64_t{1000}, UINT64_MAX}) {
        const FileState file{.size = size, .mtime = 1'700'000'000, .etag = tag.view(), .now = 1'800'000'000};
        const FilePlan plan = planFileResponse(req, file);
        switch (plan.status) {
            case 200:
                if (plan.offset != 0 || plan.length != size) { return "200 without the whole file"; }
                break;
            case 206:
                if (plan.length == 0 || plan.offset >= size || plan.length > size - plan.offset) { return "206 outside the file"; }
                break;
            case 304: case 412: case 416: break;
            default: return "file response with unexpected status " + std::to_string(plan.status);
        }
    }
    // Dates: whatever parses formats back to an IMF-fixdate that parses to the same second.
    for (const std::string_view name : {"If-Modified-Since", "If-Unmodified-Since", "If-Range", "Date"}) {
        if (const auto t = parseHttpDate(req.header(name)); t && *t >= 0 && *t <= 253402300799) {
            std::array<char, kHttpDateLength> text{};
            formatHttpDate(*t, text.data());
            if (parseHttpDate(std::string_view(text.data(), text.size())) != t) { return "a date does not round-trip"; }
        }
    }
    return {};
}

}  // namespace spindle::httpd::testing_support
