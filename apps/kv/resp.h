// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The Redis wire protocol, both ways: a request parser (RESP multibulk arrays and inline commands,
/// pipelined) and a reply writer for RESP2 and RESP3. No runtime: the fuzzer builds it alone.
///
/// Parsing follows Redis's processMultibulkBuffer/processInlineBuffer: a request that starts with '*'
/// is an array of bulk strings, anything else is one inline line split on blanks (with Redis's
/// quoting rules: "..." with \n \r \t \b \a \\ \" \xHH escapes, '...' with \' only). An empty array
/// or an empty line is no command. The limits and the error texts are Redis's own (see RespError);
/// after a protocol error the connection answers the error and closes, as Redis does.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace spindle::kv {

struct RespLimits {
    int64_t maxBulkLength = 512ll * 1024 * 1024;  // proto-max-bulk-len
    int64_t maxMultibulkLength = 2147483647;       // elements of one request array (Redis: INT_MAX)
    size_t maxInlineSize = 64 * 1024;              // PROTO_INLINE_MAX_SIZE: an inline line, or a count line
};

enum class ParseStatus : uint8_t {
    kIncomplete,  // more bytes are needed; nothing consumed
    kCommand,     // one command in `args` (possibly empty: skip it), `consumed` bytes used
    kError,       // protocol error: reply `error` (without the leading '-' and CRLF) and close
};

struct ParseResult {
    ParseStatus status = ParseStatus::kIncomplete;
    size_t consumed = 0;
    std::string_view error;  // static text, with kError
};

/// One parsed request. The arguments point into the input buffer (multibulk) or into `owned`
/// (inline, whose quoting may rewrite bytes); they stay valid until the next parse into this object
/// and while the consumed bytes of the input are not overwritten.
struct Request {
    std::vector<std::string_view> args;
    std::vector<std::string> owned;
};

/// Parses the first request in `in`.
/// Errors: kError with Redis's text: "Protocol error: invalid multibulk length", "Protocol error:
/// invalid bulk length", "Protocol error: expected '$', got 'X'", "Protocol error: too big mbulk count
/// string", "Protocol error: too big bulk count string", "Protocol error: too big inline request",
/// "Protocol error: unbalanced quotes in request".
/// With `authRequired` (AUTH not yet done on a server with a password) the smaller limits Redis gives
/// an unauthenticated client apply: 10 elements and 1 MiB per bulk ("Protocol error: unauthenticated
/// multibulk length", "... bulk length").
[[nodiscard]] ParseResult parseRequest(std::string_view in, const RespLimits& limits, Request& out,
                                       bool authRequired = false);

/// Replies appended to a string, in the protocol version the connection chose (2 or 3).
class ReplyWriter {
public:
    explicit ReplyWriter(std::string& out, int protocol = 2) noexcept : out_(out), protocol_(protocol) {}

    void simple(std::string_view s);               // +s
    void error(std::string_view s);                // -s (s carries its code: "ERR ...", "WRONGTYPE ...")
    void integer(int64_t v);                       // :v
    void bulk(std::string_view s);                 // $len s
    void null();                                   // $-1 (RESP2) or _ (RESP3)
    void nullArray();                              // *-1 (RESP2) or _ (RESP3)
    void arrayHeader(size_t n);                    // *n
    void mapHeader(size_t n);                      // %n (RESP3) or *2n (RESP2)
    void setHeader(size_t n);                      // ~n (RESP3) or *n (RESP2)
    void doubleValue(std::string_view formatted);  // ,v (RESP3) or a bulk string (RESP2)
    void ok() { simple("OK"); }

    [[nodiscard]] int protocol() const noexcept { return protocol_; }
    void setProtocol(int p) noexcept { protocol_ = p; }
    [[nodiscard]] std::string& buffer() noexcept { return out_; }

private:
    void header(char type, int64_t n);
    std::string& out_;
    int protocol_;
};

/// The text Redis prints for an unknown command: "ERR unknown command 'name', with args beginning
/// with: 'a' 'b' " (each argument in quotes and followed by a space, arguments cut at 128 bytes,
/// the whole text cut to 128 bytes per argument as Redis does; newlines replaced by spaces).
[[nodiscard]] std::string unknownCommandError(const std::vector<std::string_view>& args);

/// Parses a whole decimal int64 as Redis's string2ll does (no spaces, no '+', no leading zeros
/// except "0", no "-0"); false when the text is not exactly such a number.
[[nodiscard]] bool parseInt64(std::string_view s, int64_t& out) noexcept;

/// Parses a long double as Redis's string2ld does for INCRBYFLOAT: false for spaces, empty text,
/// NaN, or anything strtold does not consume whole.
[[nodiscard]] bool parseLongDouble(std::string_view s, long double& out) noexcept;

/// Lower-cases ASCII letters into `out` (command names).
void toLower(std::string_view in, std::string& out);

}  // namespace spindle::kv
