// SPDX-License-Identifier: Apache-2.0
#pragma once
/// spindle-httpd's server: HTTP/1.1 over spindle::net, share-nothing per carrier.
///
/// Built on net::TcpServer (net/tcp_server.h): every carrier gets its own listener on the same address
/// (SO_REUSEPORT: the kernel spreads new connections over them) and a pinned acceptor fiber; each
/// accepted connection is served by a fiber pinned to the same carrier, with a small stack. A connection parses every complete request
/// in its receive buffer (pipelining), formats the responses into one buffer on its own stack and
/// sends them in one send before it waits for more bytes. With a ProvidedBufferPool (the default
/// where the kernel has it) a connection that waits holds no receive buffer.
///
/// Routes: GET/HEAD /hello answers "Hello, World!" (13 bytes, text/plain); so does "/" when no
/// document root is set. With a root, every other path names a file under it, read through the
/// ring (open, statx, read), with its Content-Type from mime.types by extension; a path ending in
/// '/' names its index.html, a directory named without the '/' gets 301 to the form with it; a ".."
/// segment is 400; a symbolic link the policy refuses (ServerOptions::symlinks) is 403. Files carry
/// Last-Modified, an ETag (nginx's) and "Accept-Ranges: bytes", and answer conditional requests
/// (304, 412) and single Range requests (206; 416 when unsatisfiable; several ranges get the whole
/// file with 200) as apps/httpd/file_response.h decides. A body of spliceMinBytes or more is spliced
/// file → pipe → socket (no copy through user space) through a pipe lent by its carrier's pool for that
/// body (a few kept per carrier; a connection, idle or parked, holds none between bodies); its head
/// leaves with MSG_MORE, in the segment of the first body bytes. Where no pipe can be had (EMFILE,
/// ENFILE) that body is copied instead, silently.
/// Other known methods get 405 with "Allow: GET, HEAD", unknown
/// ones 501; a request body (Content-Length or chunked) is read and dropped, within headerTimeout and
/// maxBodyBytes (a chunked one over it, or malformed, closes the connection after the answer);
/// parser errors get their status (400, 413, 414, 431, 501, 505)
/// and the connection is closed after the response.
/// Access log (off unless ServerOptions::accessLog names a file): a line per answered request, buffered
/// per carrier, written by the idle sweep and at the drain (apps/httpd/access_log.h).
/// Timeouts: a request head must be complete within headerTimeout of its first byte (of the
/// accept, for a connection's first request), or the connection gets 408 and is closed (slowloris);
/// a keep-alive connection with no request started is closed after idleTimeout (by net::TcpServer's
/// sweep of each carrier's connections every idleTimeout / 8, so up to that much later: cheaper than a
/// linked timeout on every receive). One idle for idleFiberRelease parks (TcpConnection::park()): it
/// gives up its fiber and its Connection, and the server keeps a small record with one poll armed
/// until the next request comes.
/// Shutdown: stop() stops accepting at once, closes idle connections, lets connections that are
/// reading or answering a request finish it (their last response says "Connection: close"), and
/// after drainTimeout closes whatever is left; wait() returns when every connection is gone.
/// Errors: start() returns the errno of a listener that could not bind (EADDRINUSE, EACCES, ...),
/// of the document root or access log that could not be opened (ENOENT, ENOTDIR, EACCES), EINVAL for options out
/// of range, and the spawn's errors. A failing connection is closed and counted; nothing throws.
/// Thread-safety: stop() and stats() from any thread or fiber; wait() and the destructor from a
/// plain thread (not a fiber of the runtime).

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "apps/httpd/file_open.h"
#include "apps/httpd/http_parser.h"
#include "base/result.h"
#include "core/runtime.h"
#include "net/address.h"

namespace spindle::httpd {

#if defined(SPINDLE_ASAN) || defined(SPINDLE_TSAN)
inline constexpr size_t kDefaultConnectionStack = 256 * 1024;  // sanitizers grow frames several-fold
#else
inline constexpr size_t kDefaultConnectionStack = 32 * 1024;
#endif

struct ServerOptions {
    net::SocketAddress address = net::SocketAddress::ipv4Any(8080);  // port 0: the kernel picks one
    std::string root;                             // document root; "" serves the hello route only
    // Links under the root are followed while they stay under it; kNone refuses any (--no-symlinks).
    SymlinkPolicy symlinks = SymlinkPolicy::kBeneath;
    bool useOpenat2 = true;                       // where the kernel has it; false: the fallback (for tests)
    std::string mimeTypes = "/etc/mime.types";    // read once at start; "" or missing: the built-in table
    std::string accessLog;                        // a file for nginx's combined format (access_log.h); "": none
    uint64_t spliceMinBytes = 64 * 1024;          // file bodies this long go out with splice(2), not copied; 0: never (--splice-min-bytes)
    ParserLimits limits;                          // head bytes, header count, body size
    std::chrono::milliseconds headerTimeout{10'000};
    std::chrono::milliseconds idleTimeout{60'000};
    std::chrono::milliseconds sendTimeout{30'000};   // one batch of responses (or a file chunk) must leave in this
    std::chrono::milliseconds drainTimeout{10'000};  // after stop(), how long requests in flight may take
    std::chrono::milliseconds lingerTimeout{1'000};  // after an error response, read and drop the client's bytes this long
    size_t connectionStackSize = kDefaultConnectionStack;
    bool providedBuffers = true;                  // receive into a ProvidedBufferPool when the kernel allows
    bool multishotRecv = true;                    // with provided buffers: one multishot receive per connection
    // The responses to a batch of requests leave through a net::PostedSend: the fiber goes back to
    // waiting for the next request without waiting for the send's completion, and the carrier gives the
    // scratch block back when it comes (one resume per request instead of two). The wait for a send
    // that has not ended (rare: a client that does not read) is bounded by sendTimeout from when the
    // connection next needs it: by its next response or its end. A client that stops both reading and
    // sending leaves the connection waiting for a request, which idleTimeout ends instead.
    // false: every send is waited for (--wait-send).
    bool postedSend = true;
    // A keep-alive connection idle this long gives its fiber (and the fiber's stack) up and waits on its
    // multishot receive alone, which starts a fiber again when the next request arrives; 0: never.
    // Needs multishotRecv. Checked by the idle sweep (every idleTimeout / 8, at most 1 s).
    std::chrono::milliseconds idleFiberRelease{1'000};
    unsigned providedBufferCount = 1024;          // per carrier, a power of two
    size_t providedBufferSize = 4096;
    int backlog = 4096;
    // SO_REUSEPORT from the first listener, so that other processes may bind the same port and split
    // the connections; false: the port is held alone and a busy one fails start() with EADDRINUSE.
    bool shareAddress = false;
};

/// Counters summed over the carriers (read racily).
struct ServerStats {
    uint64_t accepted = 0;
    uint64_t active = 0;            // connections open now
    uint64_t requests = 0;          // complete request heads answered
    uint64_t errors = 0;            // responses with a 4xx/5xx status from the parser or a timeout
    uint64_t headerTimeouts = 0;    // connections closed with 408
    uint64_t idleTimeouts = 0;      // keep-alive connections closed for idleness
    uint64_t fiberless = 0;         // idle connections waiting with no fiber now
    uint64_t fiberReleases = 0;     // times an idle connection gave its fiber up
    uint64_t providedRecvs = 0;     // receives served from the provided-buffer ring
    uint64_t fallbackRecvs = 0;     // receives into a heap buffer instead
    uint64_t splicePipes = 0;       // splice pipes open now: lent to a body or kept in a carrier's pool
    uint64_t splicePipesLent = 0;   // of those, lent to a body being spliced now
};

class Server {
public:
    /// Binds one listener per carrier of `rt` and starts accepting. `rt` must outlive the server.
    [[nodiscard]] static Result<std::unique_ptr<Server>> start(Runtime& rt, const ServerOptions& options);
    /// stop(), then wait().
    ~Server();
    Server(const Server&) = delete;
    Server& operator=(const Server&) = delete;

    /// The bound address (with the port the kernel chose for port 0).
    [[nodiscard]] net::SocketAddress localAddress() const noexcept;
    /// Begins the graceful shutdown described in the class comment; returns at once. Idempotent.
    void stop() noexcept;
    /// Blocks until stop() was called and every connection is gone.
    void wait() noexcept;
    [[nodiscard]] ServerStats stats() const noexcept;

    struct Impl;

private:
    explicit Server(std::unique_ptr<Impl> impl) noexcept;
    std::unique_ptr<Impl> impl_;
};

}  // namespace spindle::httpd
