// SPDX-License-Identifier: Apache-2.0
#include "apps/httpd/file_response.h"

#include <algorithm>

namespace spindle::httpd {
namespace {

constexpr std::array<std::string_view, 7> kDays{"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
constexpr std::array<std::string_view, 7> kLongDays{"Sunday", "Monday", "Tuesday", "Wednesday",
                                                    "Thursday", "Friday", "Saturday"};
constexpr std::array<std::string_view, 12> kMonths{"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                                   "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
constexpr int64_t kSecondsPerDay = 86400;
constexpr int64_t kMinDate = 0;                // 1970-01-01
constexpr int64_t kMaxDate = 253402300799;     // 9999-12-31 23:59:59

bool isDigit(char c) noexcept { return c >= '0' && c <= '9'; }
bool isSpace(char c) noexcept { return c == ' ' || c == '\t'; }

std::string_view trim(std::string_view s) noexcept {
    while (!s.empty() && isSpace(s.front())) { s.remove_prefix(1); }
    while (!s.empty() && isSpace(s.back())) { s.remove_suffix(1); }
    return s;
}

/// Days since 1970-01-01 of a proleptic Gregorian date (month 1..12). The year is shifted to start
/// in March, so that the leap day is the last day of its year.
int64_t daysFromCivil(int64_t y, unsigned m, unsigned d) noexcept {
    y -= m <= 2 ? 1 : 0;
    const int64_t era = (y >= 0 ? y : y - 399) / 400;
    const auto yoe = static_cast<unsigned>(y - era * 400);                  // [0, 399]
    const unsigned doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;   // [0, 365]
    const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;             // [0, 146096]
    return era * 146097 + static_cast<int64_t>(doe) - 719468;
}

struct Civil {
    int64_t year;
    unsigned month;  // 1..12
    unsigned day;    // 1..31
};

/// The inverse of daysFromCivil.
Civil civilFromDays(int64_t z) noexcept {
    z += 719468;
    const int64_t era = (z >= 0 ? z : z - 146096) / 146097;
    const auto doe = static_cast<unsigned>(z - era * 146097);
    const unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    const unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    const unsigned mp = (5 * doy + 2) / 153;
    const unsigned d = doy - (153 * mp + 2) / 5 + 1;
    const unsigned m = mp < 10 ? mp + 3 : mp - 9;
    return Civil{static_cast<int64_t>(yoe) + era * 400 + (m <= 2 ? 1 : 0), m, d};
}

/// A small cursor over the date text.
struct Scanner {
    std::string_view s;
    bool literal(std::string_view lit) noexcept {
        if (!s.starts_with(lit)) { return false; }
        s.remove_prefix(lit.size());
        return true;
    }
    /// Exactly `digits` digits.
    bool number(size_t digits, int64_t& out) noexcept {
        if (s.size() < digits) { return false; }
        int64_t v = 0;
        for (size_t i = 0; i < digits; ++i) {
            if (!isDigit(s[i])) { return false; }
            v = v * 10 + (s[i] - '0');
        }
        s.remove_prefix(digits);
        out = v;
        return true;
    }
    /// One of `names`, returning its index.
    template <size_t N>
    bool name(const std::array<std::string_view, N>& names, unsigned& out) noexcept {
        for (size_t i = 0; i < N; ++i) {
            if (s.starts_with(names[i])) {
                s.remove_prefix(names[i].size());
                out = static_cast<unsigned>(i);
                return true;
            }
        }
        return false;
    }
    /// "HH:MM:SS"
    bool time(int64_t& h, int64_t& m, int64_t& sec) noexcept {
        return number(2, h) && literal(":") && number(2, m) && literal(":") && number(2, sec);
    }
};

std::optional<int64_t> toSeconds(int64_t year, unsigned month, int64_t day, int64_t h, int64_t m, int64_t s) noexcept {
    if (month > 11 || day < 1 || day > 31 || h > 23 || m > 59 || s > 60) { return std::nullopt; }
    const int64_t days = daysFromCivil(year, month + 1, static_cast<unsigned>(day));
    // A day past the month's end (Feb 30) would roll into the next month: refuse it.
    if (civilFromDays(days).day != static_cast<unsigned>(day)) { return std::nullopt; }
    return days * kSecondsPerDay + h * 3600 + m * 60 + std::min<int64_t>(s, 59);
}

/// Parses decimal digits at the start of `s` into `out`, saturating at UINT64_MAX; false when none.
bool parseNumber(std::string_view& s, uint64_t& out) noexcept {
    if (s.empty() || !isDigit(s.front())) { return false; }
    uint64_t v = 0;
    while (!s.empty() && isDigit(s.front())) {
        const auto d = static_cast<uint64_t>(s.front() - '0');
        v = v > (UINT64_MAX - d) / 10 ? UINT64_MAX : v * 10 + d;
        s.remove_prefix(1);
    }
    out = v;
    return true;
}

/// The next element of a comma-separated list (trimmed), advancing `list`; empty elements are kept.
std::string_view nextElement(std::string_view& list) noexcept {
    const size_t comma = list.find(',');
    const std::string_view e = trim(list.substr(0, comma));
    list.remove_prefix(comma == std::string_view::npos ? list.size() : comma + 1);
    return e;
}

/// Whether `tag` is an entity tag: optional "W/", then a quoted string of etagc characters.
bool isEntityTag(std::string_view tag) noexcept {
    if (tag.starts_with("W/")) { tag.remove_prefix(2); }
    if (tag.size() < 2 || tag.front() != '"' || tag.back() != '"') { return false; }
    for (char c : tag.substr(1, tag.size() - 2)) {
        const auto u = static_cast<unsigned char>(c);
        if (!(u == 0x21 || (u >= 0x23 && u != 0x7f))) { return false; }
    }
    return true;
}

}  // namespace

void formatHttpDate(int64_t unixSeconds, char* out) noexcept {
    const int64_t t = std::clamp(unixSeconds, kMinDate, kMaxDate);
    const int64_t days = t / kSecondsPerDay;
    const int64_t secs = t % kSecondsPerDay;
    const Civil c = civilFromDays(days);
    const auto wday = static_cast<size_t>((days + 4) % 7);  // 1970-01-01 was a Thursday
    char* p = out;
    auto put = [&](std::string_view s) { p = std::copy(s.begin(), s.end(), p); };
    auto two = [&](int64_t v) {
        *p++ = static_cast<char>('0' + v / 10);
        *p++ = static_cast<char>('0' + v % 10);
    };
    put(kDays[wday]);
    put(", ");
    two(c.day);
    *p++ = ' ';
    put(kMonths[c.month - 1]);
    *p++ = ' ';
    two(c.year / 100);
    two(c.year % 100);
    *p++ = ' ';
    two(secs / 3600);
    *p++ = ':';
    two(secs / 60 % 60);
    *p++ = ':';
    two(secs % 60);
    put(" GMT");
}

std::optional<int64_t> parseHttpDate(std::string_view text) noexcept {
    Scanner sc{trim(text)};
    unsigned wday = 0, month = 0;
    int64_t day = 0, year = 0, h = 0, m = 0, s = 0;
    if (sc.name(kLongDays, wday)) {
        // RFC 850: "Sunday, 06-Nov-94 08:49:37 GMT"; a two-digit year within 50 years of 2000 is taken
        // as the one in the past (RFC 9110 §5.6.7), which for any year this runs in means 19xx or 20xx.
        if (!(sc.literal(", ") && sc.number(2, day) && sc.literal("-") && sc.name(kMonths, month) &&
              sc.literal("-") && sc.number(2, year) && sc.literal(" ") && sc.time(h, m, s) && sc.literal(" GMT") &&
              sc.s.empty())) {
            return std::nullopt;
        }
        year += year < 70 ? 2000 : 1900;
        return toSeconds(year, month, day, h, m, s);
    }
    if (!sc.name(kDays, wday)) { return std::nullopt; }
    if (sc.literal(", ")) {
        // IMF-fixdate: "Sun, 06 Nov 1994 08:49:37 GMT"
        if (!(sc.number(2, day) && sc.literal(" ") && sc.name(kMonths, month) && sc.literal(" ") && sc.number(4, year) &&
              sc.literal(" ") && sc.time(h, m, s) && sc.literal(" GMT") && sc.s.empty())) {
            return std::nullopt;
        }
        return toSeconds(year, month, day, h, m, s);
    }
    // asctime: "Sun Nov  6 08:49:37 1994" (the day is space-padded)
    if (!(sc.literal(" ") && sc.name(kMonths, month) && sc.literal(" "))) { return std::nullopt; }
    if (sc.literal(" ")) {
        if (!sc.number(1, day)) { return std::nullopt; }
    } else if (!sc.number(2, day)) {
        return std::nullopt;
    }
    if (!(sc.literal(" ") && sc.time(h, m, s) && sc.literal(" ") && sc.number(4, year) && sc.s.empty())) {
        return std::nullopt;
    }
    return toSeconds(year, month, day, h, m, s);
}

ETag makeETag(uint64_t size, int64_t mtimeSeconds) noexcept {
    ETag tag;
    char* p = tag.text.data();
    auto hex = [&p](uint64_t v) {
        char digits[16];
        size_t n = 0;
        do {
            digits[n++] = "0123456789abcdef"[v & 0xf];
            v >>= 4;
        } while (v != 0);
        while (n > 0) { *p++ = digits[--n]; }
    };
    *p++ = '"';
    hex(static_cast<uint64_t>(mtimeSeconds));
    *p++ = '-';
    hex(size);
    *p++ = '"';
    tag.length = static_cast<uint8_t>(p - tag.text.data());
    return tag;
}

bool etagListMatches(std::string_view list, std::string_view etag, bool weak) noexcept {
    if (trim(list) == "*") { return true; }
    auto opaque = [](std::string_view t) { return t.starts_with("W/") ? t.substr(2) : t; };
    bool matched = false;
    while (!list.empty()) {
        const std::string_view e = nextElement(list);
        if (e.empty()) { continue; }  // "a, , b": empty list elements are allowed (RFC 9110 §5.6.1)
        if (!isEntityTag(e)) { return false; }
        if (weak) {
            matched = matched || opaque(e) == opaque(etag);
        } else {
            matched = matched || (!e.starts_with("W/") && !etag.starts_with("W/") && e == etag);
        }
    }
    return matched;
}

RangeResult parseRange(std::string_view value, uint64_t size) noexcept {
    value = trim(value);
    if (value.size() < 6 || !equalsIgnoreCase(value.substr(0, 6), "bytes=")) { return {}; }
    std::string_view set = value.substr(6);
    unsigned specs = 0;
    unsigned satisfiable = 0;
    ByteRange first;
    while (!set.empty()) {
        std::string_view spec = nextElement(set);
        if (spec.empty()) { continue; }
        ++specs;
        ByteRange r;
        bool ok = false;
        if (spec.front() == '-') {
            spec.remove_prefix(1);
            uint64_t suffix = 0;
            if (!parseNumber(spec, suffix) || !spec.empty()) { return {}; }
            if (suffix > 0 && size > 0) {
                r = ByteRange{size - std::min(suffix, size), size - 1};
                ok = true;
            }
        } else {
            uint64_t a = 0, b = UINT64_MAX;
            if (!parseNumber(spec, a) || spec.empty() || spec.front() != '-') { return {}; }
            spec.remove_prefix(1);
            if (!spec.empty() && (!parseNumber(spec, b) || !spec.empty())) { return {}; }
            if (b < a) { return {}; }  // invalid: the whole header is ignored (RFC 9110 §14.1.1)
            if (a < size) {
                r = ByteRange{a, std::min(b, size - 1)};
                ok = true;
            }
        }
        if (ok && satisfiable++ == 0) { first = r; }
    }
    if (specs == 0) { return {}; }
    if (satisfiable == 0) { return {RangeStatus::kUnsatisfiable, {}}; }
    if (specs > 1) { return {}; }  // several ranges: the whole file, with 200
    return {RangeStatus::kPartial, first};
}

FilePlan planFileResponse(const Request& req, const FileState& f) noexcept {
    const FilePlan whole{200, 0, f.size};
    auto with = [&whole](int status) { return FilePlan{status, whole.offset, whole.length}; };
    // 1. If-Match, else 2. If-Unmodified-Since: a failed precondition is 412.
    if (const std::string_view im = req.header("If-Match"); !im.empty()) {
        if (!etagListMatches(im, f.etag, /*weak=*/false)) { return with(412); }
    } else if (const std::string_view ius = req.header("If-Unmodified-Since"); !ius.empty()) {
        if (const auto date = parseHttpDate(ius); date && f.mtime > *date) { return with(412); }
    }
    // 3. If-None-Match, else 4. If-Modified-Since: an unchanged file is 304 (GET and HEAD only come here).
    if (const std::string_view inm = req.header("If-None-Match"); !inm.empty()) {
        if (etagListMatches(inm, f.etag, /*weak=*/true)) { return with(304); }
    } else if (const std::string_view ims = req.header("If-Modified-Since"); !ims.empty()) {
        if (const auto date = parseHttpDate(ims); date && *date <= f.now && f.mtime <= *date) { return with(304); }
    }
    // 5. Range, unless If-Range names another version of the file. HEAD answers as GET would.
    const std::string_view range = req.header("Range");
    if (range.empty()) { return whole; }
    if (const std::string_view ir = trim(req.header("If-Range")); !ir.empty()) {
        bool same = false;
        if (ir.front() == '"' || ir.starts_with("W/")) {
            same = etagListMatches(ir, f.etag, /*weak=*/false) && ir.find(',') == std::string_view::npos;
        } else if (const auto date = parseHttpDate(ir)) {
            same = *date == f.mtime;  // an exact match only (RFC 9110 §13.1.5)
        }
        if (!same) { return whole; }
    }
    const RangeResult r = parseRange(range, f.size);
    switch (r.status) {
        case RangeStatus::kPartial: return {206, r.range.first, r.range.length()};
        case RangeStatus::kUnsatisfiable: return with(416);
        case RangeStatus::kIgnore: break;
    }
    return whole;
}

}  // namespace spindle::httpd
