// SPDX-License-Identifier: Apache-2.0
#include "apps/httpd/server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <initializer_list>
#include <string_view>
#include <utility>
#include <vector>

#include "apps/httpd/access_log.h"
#include "apps/httpd/file_response.h"
#include "apps/httpd/mime_types.h"
#include "apps/httpd/static_path.h"
#include "base/check.h"
#include "base/counter.h"
#include "base/inject.h"
#include "base/log.h"
#include "core/deadline.h"
#include "core/fiber.h"
#include "core/io.h"
#include "core/ring_ops.h"
#include "net/buffered.h"
#include "net/posted_send.h"
#include "net/provided_buffers.h"
#include "net/tcp.h"
#include "net/tcp_server.h"

namespace spindle::httpd {
namespace {

using namespace std::chrono_literals;

constexpr size_t kOutCapacity = 8 * 1024;        // responses of one batch, and file chunks
constexpr size_t kStackHeaders = 128;            // header slots on the connection's stack
constexpr size_t kMaxPath = 1024;                // a decoded path longer than this is 414
constexpr size_t kLingerBytes = 64 * 1024;       // bytes read and dropped after an error response
constexpr std::string_view kHelloBody = "Hello, World!";
constexpr std::string_view kServerHeader = "Server: spindle\r\n";
constexpr int kPipeBytes = 1 << 20;              // a splice pipe grows to this where the limits allow
// Splice pipes a carrier keeps between bodies (PipePool); more may be lent at once, and the surplus is
// closed as it comes back. Each kept pipe holds two descriptors and kPipeBytes of pipe buffer, which
// count against the user's fs.pipe-user-pages-soft (16384 pages by default: 64 pipes of 1 MiB, past
// which the kernel makes new pipes 8 KiB and refuses to grow them) whether or not bytes are in them:
// eight carriers with full pools stay about within it, and one carrier seldom has more than eight
// bodies waiting for socket room at once that a pooled pipe would spare five system calls each.
constexpr size_t kPipePoolCap = 8;

/// The Date header's value, formatted once per second per carrier thread (connection fibers are
/// pinned, so the thread-local cache is the carrier's).
std::string_view httpDate() noexcept {
    struct Cache {
        time_t second = -1;
        std::array<char, 29> text{};
    };
    thread_local Cache cache;
    timespec now{};
    ::clock_gettime(CLOCK_REALTIME_COARSE, &now);
    if (now.tv_sec != cache.second) {
        static constexpr std::array<const char*, 7> kDays{"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
        static constexpr std::array<const char*, 12> kMonths{"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                                             "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
        tm t{};
        ::gmtime_r(&now.tv_sec, &t);
        char* p = cache.text.data();
        auto put = [&](std::string_view s) { p = std::copy(s.begin(), s.end(), p); };
        auto two = [&](int v) { *p++ = static_cast<char>('0' + v / 10); *p++ = static_cast<char>('0' + v % 10); };
        put(kDays[static_cast<size_t>(t.tm_wday)]);
        put(", ");
        two(t.tm_mday);
        *p++ = ' ';
        put(kMonths[static_cast<size_t>(t.tm_mon)]);
        *p++ = ' ';
        const int year = t.tm_year + 1900;
        two(year / 100);
        two(year % 100);
        *p++ = ' ';
        two(t.tm_hour);
        *p++ = ':';
        two(t.tm_min);
        *p++ = ':';
        two(t.tm_sec);
        put(" GMT");
        cache.second = now.tv_sec;
    }
    return {cache.text.data(), cache.text.size()};
}

/// Writes `v` in decimal at `p` (at most 20 bytes); returns the end.
char* putDecimal(char* p, uint64_t v) noexcept {
    char digits[20];
    size_t n = 0;
    do {
        digits[n++] = static_cast<char>('0' + v % 10);
        v /= 10;
    } while (v != 0);
    while (n > 0) { *p++ = digits[--n]; }
    return p;
}

/// Responses formatted into a fixed buffer on the connection's stack.
class OutBuffer {
public:
    [[nodiscard]] size_t size() const noexcept { return len_; }
    [[nodiscard]] size_t room() const noexcept { return kOutCapacity - len_; }
    [[nodiscard]] char* tail() noexcept { return buf_.data() + len_; }
    [[nodiscard]] const char* data() const noexcept { return buf_.data(); }
    void advance(size_t n) noexcept { len_ += n; }
    void clear() noexcept { len_ = 0; }
    /// Precondition: room() >= s.size().
    void put(std::string_view s) noexcept {
        if (s.empty()) { return; }  // an empty view may have no data() at all (memcpy from null is UB)
        std::memcpy(buf_.data() + len_, s.data(), s.size());
        len_ += s.size();
    }

private:
    std::array<char, kOutCapacity> buf_;
    size_t len_ = 0;
};

// A response head needs at most this much room: status line, fixed headers, a Content-Type, a length.
constexpr size_t kMaxHeadBytes = 512;
// putHead's contentLength for a response without the header (304).
constexpr uint64_t kNoContentLength = ~uint64_t{0};

/// The size of header lines given to putHead.
size_t extraBytes(std::initializer_list<std::string_view> extra) noexcept {
    size_t n = 0;
    for (std::string_view s : extra) { n += s.size(); }
    return n;
}

}  // namespace

/// One carrier's splice pipes: each is lent to one spliced body and comes back when that body has
/// gone out whole, so that a carrier needs as many pipes as it splices bodies at once (issue 19:
/// a pipe per connection held two descriptors and 1 MiB of pipe buffer per keep-alive connection).
/// A pipe is created and grown once (pipe2, F_SETPIPE_SZ), kept at the size it got.
/// Thread-safety: none needed: used only on its carrier's thread. Connection fibers are pinned to the
/// carrier that accepted them (net::TcpServer::spawnConnection spawns them with `.pinned = true`, and a
/// parked connection resumes on the same carrier), so every borrow and give-back of Worker `i`'s pool
/// runs on carrier `i`; closeAll() runs there too (the server's final carrierTick, after the carrier's
/// last connection ended), and the destructor after the carriers' acceptors were joined.
/// Invariant: a pipe in free_ is empty (every byte spliced into it was spliced out); one that may hold
/// bytes is closed (discard()), never kept, as they would lead the next body.
class PipePool {
public:
    struct Pipe {
        int read = -1;
        int write = -1;
        uint32_t size = 0;  // its capacity: the most one chunk moves
    };

    PipePool() = default;
    PipePool(const PipePool&) = delete;
    PipePool& operator=(const PipePool&) = delete;
    ~PipePool() { closeAll(); }

    /// A pipe for one body: a kept one, else a new one. false, with nothing logged, when none can be
    /// made (EMFILE, ENFILE, ENOMEM; the fault point kPipeCreate): that body is copied instead.
    bool borrow(Pipe& p) noexcept {
        if (count_ > 0) {
            p = free_[--count_];
        } else if (!make(p)) {
            return false;
        }
        ownerAdd(lent, 1);
        return true;
    }
    /// Takes back a pipe whose body went out whole (it is empty); beyond kPipePoolCap it is closed.
    void giveBack(const Pipe& p) noexcept {
        SPINDLE_ASSERT(queued(p) == 0);
        ownerSub(lent);
        if (count_ < kPipePoolCap) {
            free_[count_++] = p;
        } else {
            close(p);
        }
    }
    /// Closes a lent pipe that may hold bytes of a body that did not go out whole.
    void discard(const Pipe& p) noexcept {
        ownerSub(lent);
        close(p);
    }
    /// Closes the kept pipes (the server stops).
    void closeAll() noexcept {
        while (count_ > 0) { close(free_[--count_]); }
    }

    // Pipes open now (kept or lent) and lent now: one writer (this carrier), readers anywhere.
    std::atomic<uint64_t> open{0};
    std::atomic<uint64_t> lent{0};

private:
    static int queued(const Pipe& p) noexcept {
        int n = -1;
        return ::ioctl(p.read, FIONREAD, &n) == 0 ? n : -1;
    }
    bool make(Pipe& p) noexcept {
        int fds[2];
        SPINDLE_INJECT(inject::Point::kPipeCreate, { return false; });
        // Non-blocking: a splice on io_uring then needs one fcntl to look at it (splice_ends.h).
        if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) { return false; }
        // Fewer round trips where allowed; otherwise what the pipe has (64 KiB, or less past
        // fs.pipe-user-pages-soft).
        int size = ::fcntl(fds[1], F_SETPIPE_SZ, kPipeBytes);
        if (size <= 0) { size = ::fcntl(fds[1], F_GETPIPE_SZ); }
        p = Pipe{.read = fds[0], .write = fds[1], .size = size > 0 ? static_cast<uint32_t>(size) : 4096};
        ownerAdd(open, 1);
        return true;
    }
    void close(const Pipe& p) noexcept {
        ::close(p.read);
        ::close(p.write);
        ownerSub(open);
    }

    std::array<Pipe, kPipePoolCap> free_{};
    size_t count_ = 0;  // free_[0, count_) are kept
};

/// What a connection needs only while it has bytes to answer: the responses of one batch and the
/// header slots of the request being parsed. Leased from its carrier's free list and given back
/// before the connection waits, so that an idle connection holds neither (nor the stack pages they
/// would otherwise occupy).
struct Scratch {
    Scratch* nextFree = nullptr;  // in the worker's free list
    Scratch* nextMade = nullptr;  // every block the worker made, for its destructor
    OutBuffer out;
    std::array<Header, kStackHeaders> headers;
};

/// One carrier's share of the server: its scratch blocks, its splice pipes and its counters
/// (net::TcpServer keeps the listener, the connections and theirs). A cache line of its own: the
/// counters change per request. Used on its carrier only (PipePool says why that holds).
struct alignas(64) Worker {
    std::atomic<uint64_t> requests{0};
    std::atomic<uint64_t> errors{0};
    std::atomic<uint64_t> headerTimeouts{0};
    // Scratch blocks of this carrier: as many are made as connections ever answered at once, then reused.
    Scratch* freeScratch = nullptr;
    Scratch* madeScratch = nullptr;
    PipePool pipes;

    Worker() = default;
    Worker(const Worker&) = delete;
    Worker& operator=(const Worker&) = delete;
    ~Worker() {
        while (madeScratch != nullptr) { delete std::exchange(madeScratch, madeScratch->nextMade); }
    }

    /// A scratch block, or null when none can be allocated.
    Scratch* takeScratch() noexcept {
        if (freeScratch != nullptr) { return std::exchange(freeScratch, freeScratch->nextFree); }
        auto* s = new (std::nothrow) Scratch;
        if (s != nullptr) { s->nextMade = std::exchange(madeScratch, s); }
        return s;
    }
    void giveScratch(Scratch* s) noexcept {
        s->out.clear();
        s->nextFree = std::exchange(freeScratch, s);
    }
};

struct Server::Impl {
    ServerOptions options;
    int rootFd = -1;
    std::string rootPath;   // the root's real path, for the kBeneath fallback without openat2
    bool openat2 = false;   // openat2(2) is there and wanted
    MimeTypes mimeTypes;
    std::unique_ptr<AccessLog> accessLog;  // null: no access log
    std::unique_ptr<net::ProvidedBufferPool> pool;
    std::vector<std::unique_ptr<Worker>> workers;
    // Last: it goes first, and its connections with it, while the pool, the log and the workers they
    // use are still there.
    std::unique_ptr<net::TcpServer> tcp;

    ~Impl() {
        tcp.reset();
        if (rootFd >= 0) { ::close(rootFd); }
    }
};

namespace {

/// Serves one connection until it closes or parks: one call of net::TcpServer's handler, on the
/// connection's fiber (pinned to its carrier). Lives on the heap for the call, so that a parked
/// connection holds none of it (issue 19: memory per idle connection).
class Connection {
public:
    Connection(Server::Impl& server, net::TcpConnection& conn) noexcept
        : worker_(*server.workers[conn.carrier()]), server_(server), options_(server_.options), conn_(conn),
          stream_(conn.stream()),
          reader_(stream_, std::max<size_t>(options_.limits.maxHeaderBytes, 1024), server_.pool.get(), options_.multishotRecv),
          sender_(stream_.fd()) {
        sender_.setSentHook(&Connection::onSent, this);
    }
    Connection(const Connection&) = delete;
    Connection& operator=(const Connection&) = delete;
    ~Connection() {
        // A send still in flight (handle() settles it; this is for an early return) is cancelled and
        // waited for before its block goes back.
        if (sender_.inFlight()) { (void)sender_.flush(Deadline(std::chrono::nanoseconds{0})); }
        reclaimPosted();
        if (scratch_ != nullptr) { worker_.giveScratch(scratch_); }
    }

    /// net::TcpServer's handler: serves the connection until it ends (the server closes the stream) or
    /// parks (TcpConnection::park()).
    static void handle(Server::Impl& server, net::TcpConnection& conn) noexcept {
        auto* c = new (std::nothrow) Connection(server, conn);
        if (c == nullptr) {
            log::warn("spindle-httpd: no memory for a connection");
            return;  // the server closes the stream
        }
        // With thousands of connections this object is cold each time the fiber wakes for it.
        this_fiber::setResumeHint(c, sizeof(Connection));
        if (!conn.resumed()) { (void)c->stream_.setNoDelay(); }
        if (server.accessLog) { c->notePeer(); }
        // Header slots: in the scratch block for the usual limit, on the heap for a larger one.
        if (c->options_.limits.maxHeaders > kStackHeaders) {
            c->heapHeaders_.reset(new (std::nothrow) Header[c->options_.limits.maxHeaders]);
        }
        c->serve(conn.resumed());
        (void)c->settlePosted();  // the last responses leave before the server closes the socket
        this_fiber::setResumeHint(nullptr, 0);  // the fiber may go on to serve another connection
        delete c;  // the reader lets go of the socket (its receive ends) before the server closes it
    }

private:
    /// The client's address for the access log ("-" when it cannot be had).
    void notePeer() noexcept {
        const Result<net::SocketAddress> peer = stream_.peerAddress();
        const void* ip = nullptr;
        if (peer && peer->family() == AF_INET) {
            ip = &reinterpret_cast<const sockaddr_in*>(peer->data())->sin_addr;
        } else if (peer && peer->family() == AF_INET6) {
            ip = &reinterpret_cast<const sockaddr_in6*>(peer->data())->sin6_addr;
        }
        if (ip == nullptr || ::inet_ntop(peer->family(), ip, remote_.data(), remote_.size()) == nullptr) {
            remote_[0] = '-';
            remote_[1] = '\0';
        }
    }

    /// One access-log line for a request just answered (the last putHead's status and length).
    void logRequest(const Request& req) noexcept {
        timespec now{};
        ::clock_gettime(CLOCK_REALTIME_COARSE, &now);
        const bool noBody = req.method == Method::kHead || lastLength_ == kNoContentLength;
        server_.accessLog->append(conn_.carrier(), AccessEntry{.remote = remote_.data(),
                                                             .unixSeconds = now.tv_sec,
                                                             .method = req.methodText,
                                                             .target = req.target,
                                                             .versionMinor = req.versionMinor,
                                                             .status = lastStatus_,
                                                             .bytes = noBody ? 0 : lastLength_,
                                                             .referer = req.header("Referer"),
                                                             .userAgent = req.header("User-Agent")});
    }

    /// Leases the scratch block (idempotent); false when none could be allocated.
    bool acquire() noexcept {
        if (scratch_ == nullptr) { scratch_ = worker_.takeScratch(); }
        return scratch_ != nullptr;
    }
    /// Gives the scratch block back when nothing is waiting in it to be sent (before a wait).
    void release() noexcept {
        if (scratch_ != nullptr && scratch_->out.size() == 0) { worker_.giveScratch(std::exchange(scratch_, nullptr)); }
    }
    /// Precondition: acquire() returned true since the last release().
    OutBuffer& out() noexcept { return scratch_->out; }
    std::span<Header> headerSlots() noexcept {
        if (heapHeaders_) { return {heapHeaders_.get(), options_.limits.maxHeaders}; }
        return scratch_->headers;
    }

    /// resumed: a fiber started for a connection that waited with none (its next request is queued).
    void serve(bool resumed) noexcept {
        Deadline headDeadline;                           // the first request's head: from the accept
        bool headStarted = !resumed;                     // headDeadline runs for the head being read
        if (headStarted) { headDeadline = Deadline(options_.headerTimeout); }
        for (;;) {
            // Answer every complete request buffered; stop at the first incomplete one.
            bool close = false;
            while (!close && reader_.size() > 0) {
                if (!acquire()) { return; }
                Request req;
                const ParseResult r = parseRequest(reader_.view(), options_.limits, headerSlots(), req);
                if (r.status == ParseStatus::kIncomplete) {
                    if (!headStarted) {  // started lazily: a head that arrives whole never reads the clock
                        headDeadline = Deadline(options_.headerTimeout);
                        headStarted = true;
                    }
                    break;
                }
                if (r.status == ParseStatus::kError) {
                    ownerAdd(worker_.errors);
                    if (!appendError(r.httpStatus)) { return; }
                    close = true;
                    break;
                }
                ownerAdd(worker_.requests);
                const bool keepAlive = req.keepAlive && !conn_.draining();
                const uint64_t bodyLeft = req.bodyRemaining();
                const bool chunkedBody = req.chunked;
                if (!respond(req, keepAlive)) { return; }
                if (server_.accessLog) { logRequest(req); }
                reader_.consume(r.consumed);
                headStarted = false;
                if (bodyLeft > 0 && !discardBody(bodyLeft)) { return; }
                if (chunkedBody && !discardChunkedBody()) { return; }
                close = !keepAlive;
            }
            if (!(close ? flush() : post())) { return; }
            if (close) {
                lingerClose();
                return;
            }
            if (reader_.size() == 0 && !headStarted) {
                if (!waitForRequest()) { return; }
                continue;
            }
            // A head is incomplete (or, on a new connection, not begun): read more before its deadline.
            conn_.setIdle(reader_.size() == 0);  // a new connection that sent nothing yet loses nothing
            release();
            const Result<size_t> n = reader_.fill(headDeadline);
            conn_.setIdle(false);
            if (n && *n > 0) { continue; }
            if (!n && n.errorCode() == ETIMEDOUT) {
                ownerAdd(worker_.headerTimeouts);
                ownerAdd(worker_.errors);
                sendErrorAndClose(408);
            } else if (!n && n.errorCode() == ENOBUFS) {  // the head fills the whole buffer
                ownerAdd(worker_.errors);
                sendErrorAndClose(reader_.view().find('\n') == std::string_view::npos ? 414 : 431);
            }
            return;  // end of stream, or an error: nothing to answer
        }
    }

    /// Waits for the first byte of the next request; false when the connection should close or has
    /// parked (TcpConnection::park(): the server keeps it without this fiber until input comes).
    bool waitForRequest() noexcept {
        release();
        if (conn_.draining()) {
            // Shutting down: a request already on its way (in the socket) is still served; a silent
            // connection is closed.
            const Result<size_t> n = reader_.fill(Deadline(1ms));
            return n && *n > 0;
        }
        // No deadline here: the server's idle sweep shuts the connection down when its time is up,
        // which costs one clock read per request instead of a linked timeout (an SQE and a CQE).
        conn_.beginIdleWait();
        for (;;) {
            const Result<size_t> n = reader_.fill();
            if (conn_.takeParkRequest() && !n && n.errorCode() == ECANCELED) {
                // The sweep cancelled this wait to take the fiber back.
                if (canPark()) {
                    conn_.park();
                    return false;
                }
                // It cannot (a receiver without multishot receive, a carrier without a buffer ring):
                // wait on with the fiber, and the sweep leaves this wait alone.
                conn_.refusePark();
                continue;
            }
            conn_.endIdleWait();
            return n && *n > 0;
        }
    }

    /// Idle, nothing buffered, nothing to send, the receive stopped with nothing queued: the connection
    /// may park (the next call of the handler finds its next request in the socket). false when it
    /// cannot: the fiber waits on, and the receive, stopped here, is armed again by the next fill().
    bool canPark() noexcept {
        release();
        net::MultishotReceiver* rx = reader_.receiver();
        // Only where the receive is a multishot one: a kernel without it keeps the connection's fiber
        // (the sweep then asks once per wait), as before parking.
        if (rx == nullptr || !rx->multishot() || reader_.size() != 0 || scratch_ != nullptr) { return false; }
        if (sender_.inFlight() && (!sender_.ended() || !settlePosted())) { return false; }
        rx->stop();  // the receive lets go of the socket; what came meanwhile stays queued
        return !rx->hasPending();
    }

    /// Reads and drops `left` body bytes after the buffered part was consumed.
    bool discardBody(uint64_t left) noexcept {
        const Deadline deadline(options_.headerTimeout);
        while (left > 0) {
            if (reader_.size() == 0) {
                if (!flush()) { return false; }  // the client may wait for our answer before it sends more
                release();
                const Result<size_t> n = reader_.fill(deadline);
                if (!n || *n == 0) { return false; }
            }
            const size_t take = static_cast<size_t>(std::min<uint64_t>(left, reader_.size()));
            reader_.consume(take);
            left -= take;
        }
        return true;
    }

    /// Reads and drops a chunked body after its head was consumed (within headerTimeout, as for a
    /// Content-Length body); false when the connection should close: the stream ended or failed, or
    /// the body was malformed or over maxBodyBytes (the answer already given is sent first; the
    /// client learns nothing else, as its request was answered).
    bool discardChunkedBody() noexcept {
        ChunkedBodySkipper skipper(options_.limits.maxBodyBytes, options_.limits.maxHeaderBytes);
        const Deadline deadline(options_.headerTimeout);
        for (;;) {
            size_t used = 0;
            const ChunkedBodySkipper::Status s = skipper.feed(reader_.view(), &used);
            reader_.consume(used);
            if (s == ChunkedBodySkipper::Status::kDone) { return true; }
            if (s == ChunkedBodySkipper::Status::kError) {
                ownerAdd(worker_.errors);
                (void)flush();
                return false;
            }
            if (!flush()) { return false; }  // the client may wait for our answer before it sends more
            release();
            const Result<size_t> n = reader_.fill(deadline);
            if (!n || *n == 0) { return false; }
        }
    }

    /// Sends what is buffered; false when the connection is broken. `flags`: MSG_MORE when a body
    /// follows at once by another route (spliceBody), so that the kernel holds a partial last
    /// segment back for it instead of sending the head on its own.
    bool flush(int flags = 0) noexcept {
        if (!settlePosted()) { return false; }  // what was posted leaves first
        if (scratch_ == nullptr || out().size() == 0) { return true; }
        // The send timeout starts only if the socket is full: a response that fits reads no clock.
        const Result<void> r = stream_.writeAllWithin(out().data(), out().size(), options_.sendTimeout, nullptr, flags);
        out().clear();
        return r.ok();
    }

    /// flush() without waiting for the send (ServerOptions::postedSend): the scratch block goes with
    /// the send, and back to the worker when it has left (onSent, or settlePosted() after a short one).
    /// false when the connection is broken (this send, or the one before, failed).
    bool post() noexcept {
        if (!options_.postedSend) { return flush(); }
        if (scratch_ == nullptr || out().size() == 0) { return true; }
        // post() below waits for the send before, whose block the hook or settlePosted() gives back.
        if (sender_.inFlight() && !settlePosted()) { return false; }
        postedScratch_ = std::exchange(scratch_, nullptr);
        const Result<void> r = sender_.post(postedScratch_->out.data(), postedScratch_->out.size());
        if (!sender_.inFlight()) { reclaimPosted(); }  // it left at once, or failed
        return r.ok();
    }

    /// Ends the posted send, waiting up to sendTimeout if it has not; false when it failed.
    bool settlePosted() noexcept {
        if (sender_.inFlight()) {
            const Result<void> r = sender_.ended() ? sender_.flush() : sender_.flush(Deadline(options_.sendTimeout));
            reclaimPosted();
            return r.ok();
        }
        reclaimPosted();
        return true;
    }

    /// The posted send has left whole: its block goes back without waking the fiber (this runs on
    /// the connection's carrier, where its fiber is pinned and not running).
    static void onSent(void* arg) noexcept { static_cast<Connection*>(arg)->reclaimPosted(); }

    void reclaimPosted() noexcept {
        if (postedScratch_ != nullptr) { worker_.giveScratch(std::exchange(postedScratch_, nullptr)); }
    }

    /// Makes room for `n` bytes, flushing first when needed.
    bool reserve(size_t n) noexcept { return acquire() && (out().room() >= n || flush()); }

    /// `extra`: more header lines, each piece as is (a line starts with "\r\n"); contentType "" and
    /// contentLength kNoContentLength leave their headers out.
    /// Precondition: room for kMaxHeadBytes plus the pieces of `extra`.
    void putHead(int status, std::string_view contentType, uint64_t contentLength, bool keepAlive, int versionMinor,
                 std::initializer_list<std::string_view> extra = {}) noexcept {
        lastStatus_ = status;
        lastLength_ = contentLength;
        // Through a local cursor: stores through out() would reload the buffer's length after each
        // copy (a memcpy may alias it).
        char* const start = out().tail();
        char* p = start;
        auto put = [&p](std::string_view s) noexcept {
            if (s.empty()) { return; }  // an empty view may have no data() at all (memcpy from null is UB)
            std::memcpy(p, s.data(), s.size());
            p += s.size();
        };
        put(versionMinor == 0 ? "HTTP/1.0 " : "HTTP/1.1 ");
        p = putDecimal(p, static_cast<uint64_t>(status));
        *p++ = ' ';
        put(reasonPhrase(status));
        put("\r\n");
        put(kServerHeader);
        put("Date: ");
        put(httpDate());
        if (!contentType.empty()) {
            put("\r\nContent-Type: ");
            put(contentType);
        }
        if (contentLength != kNoContentLength) {
            put("\r\nContent-Length: ");
            p = putDecimal(p, contentLength);
        }
        for (std::string_view s : extra) { put(s); }
        if (!keepAlive) {
            put("\r\nConnection: close");
        } else if (versionMinor == 0) {
            put("\r\nConnection: keep-alive");
        }
        if (status == 405) { put("\r\nAllow: GET, HEAD"); }
        put("\r\n\r\n");
        out().advance(static_cast<size_t>(p - start));
    }

    /// A short text response; false when the connection broke.
    bool simple(int status, std::string_view body, bool keepAlive, int versionMinor, bool head,
                std::initializer_list<std::string_view> extra = {}) noexcept {
        if (!reserve(kMaxHeadBytes + extraBytes(extra) + body.size())) { return false; }
        putHead(status, "text/plain; charset=utf-8", body.size(), keepAlive, versionMinor, extra);
        if (!head) { out().put(body); }
        return true;
    }

    /// Appends the error response for a request that could not be parsed (it always closes).
    bool appendError(int status) noexcept {
        if (!reserve(kMaxHeadBytes + 64)) { return false; }
        putHead(status, "text/plain; charset=utf-8", reasonPhrase(status).size() + 1, false, 1);
        out().put(reasonPhrase(status));
        out().put("\n");
        return true;
    }

    void sendErrorAndClose(int status) noexcept {
        if (appendError(status) && flush()) { lingerClose(); }
    }

    /// Half-closes, then reads and drops what the client still sends (briefly), so that closing
    /// with unread bytes does not reset the connection before the client has read our answer.
    void lingerClose() noexcept {
        release();
        if (!stream_.shutdown(SHUT_WR, options_.lingerTimeout)) { return; }
        const Deadline deadline(options_.lingerTimeout);
        size_t dropped = 0;
        while (dropped < kLingerBytes) {
            dropped += reader_.size();
            reader_.consume(reader_.size());
            const Result<size_t> n = reader_.fill(deadline);
            if (!n || *n == 0) { return; }
        }
    }

    /// Appends (or sends) the response to `req`; false when the connection broke.
    bool respond(const Request& req, bool keepAlive) noexcept {
        const bool head = req.method == Method::kHead;
        if (req.method != Method::kGet && !head) {
            const int status = req.method == Method::kOther ? 501 : 405;
            return simple(status, status == 501 ? "Not Implemented\n" : "Method Not Allowed\n", keepAlive, req.versionMinor, false);
        }
        std::string_view path = req.path;
        if (path.empty()) { path = "/"; }  // absolute-form without a path
        if (path == "/hello" || (path == "/" && options_.root.empty())) {
            return simple(200, kHelloBody, keepAlive, req.versionMinor, head);
        }
        if (path.front() != '/') { return simple(400, "Bad Request\n", keepAlive, req.versionMinor, head); }
        if (options_.root.empty()) { return simple(404, "Not Found\n", keepAlive, req.versionMinor, head); }
        return serveFile(req, path, keepAlive, head);
    }

    bool serveFile(const Request& req, std::string_view urlPath, bool keepAlive, bool head) noexcept {
        const int v = req.versionMinor;
        std::array<char, kMaxPath> rel;
        size_t relLength = 0;
        switch (resolvePath(urlPath, rel.data(), rel.size(), &relLength)) {
            case PathStatus::kOk: break;
            case PathStatus::kBadRequest: return simple(400, "Bad Request\n", keepAlive, v, head);
            case PathStatus::kTooLong: return simple(414, "URI Too Long\n", keepAlive, v, head);
        }
        // Open first, then statx the descriptor: the symlink policy applies to the one lookup.
        const Result<int> fd = openUnderRoot(server_.rootFd, rel.data(), options_.symlinks, server_.openat2, server_.rootPath);
        if (!fd) { return fileError(fd.errorCode(), keepAlive, v, head); }
        struct FdCloser {
            int fd;
            ~FdCloser() { (void)spindle::close(fd); }
        } closer{*fd};
        struct statx st{};
        if (const Result<void> s = spindle::statx(*fd, "", AT_EMPTY_PATH, STATX_TYPE | STATX_SIZE | STATX_MTIME, &st); !s) {
            return fileError(s.errorCode(), keepAlive, v, head);
        }
        if (S_ISDIR(st.stx_mode)) {
            // "/dir" names a directory: send the client to "/dir/" (nginx does the same), query kept.
            if (urlPath.size() + req.query.size() + kMaxHeadBytes + 64 > kOutCapacity) {
                return simple(414, "URI Too Long\n", keepAlive, v, head);
            }
            const std::string_view q = req.query.empty() ? std::string_view() : std::string_view("?");
            return simple(301, "Moved Permanently\n", keepAlive, v, head, {"\r\nLocation: ", urlPath, "/", q, req.query});
        }
        if (!S_ISREG(st.stx_mode)) { return simple(404, "Not Found\n", keepAlive, v, head); }
        ::fcntl(*fd, F_SETFL, O_RDONLY);  // opened non-blocking for FIFOs' sake; reads of a file may block
        const uint64_t size = st.stx_size;
        const ETag etag = makeETag(size, st.stx_mtime.tv_sec);
        timespec now{};
        ::clock_gettime(CLOCK_REALTIME_COARSE, &now);
        const FilePlan plan = planFileResponse(
            req, FileState{.size = size, .mtime = st.stx_mtime.tv_sec, .etag = etag.view(), .now = now.tv_sec});
        std::array<char, kHttpDateLength> modified;
        formatHttpDate(st.stx_mtime.tv_sec, modified.data());
        const std::string_view lastModified(modified.data(), modified.size());
        std::array<char, 80> rangeText;  // "bytes FIRST-LAST/SIZE" or "bytes */SIZE"
        char* r = rangeText.data();
        r = std::copy_n("bytes ", 6, r);
        if (plan.status == 206) {
            r = putDecimal(r, plan.offset);
            *r++ = '-';
            r = putDecimal(r, plan.offset + plan.length - 1);
        } else {
            *r++ = '*';
        }
        *r++ = '/';
        r = putDecimal(r, size);
        const std::string_view contentRange(rangeText.data(), static_cast<size_t>(r - rangeText.data()));
        switch (plan.status) {
            case 304:
                if (!reserve(kMaxHeadBytes + 128)) { return false; }
                putHead(304, "", kNoContentLength, keepAlive, v,
                        {"\r\nLast-Modified: ", lastModified, "\r\nETag: ", etag.view()});
                return true;
            case 412: return simple(412, "Precondition Failed\n", keepAlive, v, head);
            case 416: return simple(416, "Range Not Satisfiable\n", keepAlive, v, head, {"\r\nContent-Range: ", contentRange});
            default: break;
        }
        if (!reserve(kMaxHeadBytes + 256)) { return false; }
        const std::string_view type = server_.mimeTypes.lookup(std::string_view(rel.data(), relLength));
        if (plan.status == 206) {
            putHead(206, type, plan.length, keepAlive, v,
                    {"\r\nLast-Modified: ", lastModified, "\r\nETag: ", etag.view(), "\r\nAccept-Ranges: bytes",
                     "\r\nContent-Range: ", contentRange});
        } else {
            putHead(200, type, plan.length, keepAlive, v,
                    {"\r\nLast-Modified: ", lastModified, "\r\nETag: ", etag.view(), "\r\nAccept-Ranges: bytes"});
        }
        if (head) { return true; }
        if (options_.spliceMinBytes != 0 && plan.length >= options_.spliceMinBytes) {
            switch (spliceBody(*fd, plan.offset, plan.length)) {
                case Spliced::kSent: return true;
                case Spliced::kBroken: return false;
                case Spliced::kUnavailable: break;  // nothing sent yet: copy it below
            }
        }
        // The body goes out through the same buffer: small files leave with their head in one send.
        const uint64_t end = plan.offset + plan.length;
        uint64_t offset = plan.offset;
        while (offset < end) {
            if (out().room() == 0 && !flush()) { return false; }
            const size_t want = static_cast<size_t>(std::min<uint64_t>(out().room(), end - offset));
            const Result<size_t> n = spindle::read(*fd, out().tail(), want, offset);
            if (!n || *n == 0) {
                // The file shrank or failed under us: the promised length cannot be kept.
                log::warn("spindle-httpd: reading {} failed at {} of {} bytes", rel.data(), offset, size);
                (void)flush();
                return false;
            }
            out().advance(*n);
            offset += *n;
        }
        return true;
    }

    enum class Spliced : uint8_t { kSent, kBroken, kUnavailable };

    /// Sends `length` bytes of `fd` from `offset` after the head without copying them through user
    /// space: splice(2) file → pipe → socket through a pipe borrowed from the carrier's PipePool for
    /// this body, a pipe's worth at a time (up to kPipeBytes where the pipe may grow), each within
    /// sendTimeout. The head (and whatever else is buffered) leaves after the first chunk is in the
    /// pipe, with MSG_MORE, so it shares a segment with the first body bytes. kUnavailable, with
    /// nothing sent and the head still buffered, when no pipe can be had or the file cannot be spliced
    /// (the caller copies instead); kBroken when the connection broke or the file shrank (the promised
    /// length cannot be kept). The pipe goes back to the pool only when it is empty (kSent, or
    /// kUnavailable: a failed splice moves nothing); after kBroken it may hold bytes of this body that
    /// must not lead the next one, and is closed.
    Spliced spliceBody(int fd, uint64_t offset, uint64_t length) noexcept {
        PipePool::Pipe pipe;
        if (!worker_.pipes.borrow(pipe)) { return Spliced::kUnavailable; }
        const Spliced r = spliceThrough(pipe, fd, offset, length);
        if (r == Spliced::kBroken) {
            worker_.pipes.discard(pipe);
        } else {
            worker_.pipes.giveBack(pipe);
        }
        return r;
    }

    /// spliceBody's loop, through `pipe`. Returns kSent or kUnavailable only with the pipe empty:
    /// every chunk spliced in is spliced out whole before the next one goes in.
    Spliced spliceThrough(const PipePool::Pipe& pipe, int fd, uint64_t offset, uint64_t length) noexcept {
        bool headSent = false;
        while (length > 0) {
            const Deadline deadline(options_.sendTimeout);
            const auto want = static_cast<size_t>(std::min<uint64_t>(length, pipe.size));
            const Result<size_t> in = spindle::splice(fd, static_cast<int64_t>(offset), pipe.write, -1, want, SPLICE_F_MOVE, deadline);
            if (!in || *in == 0) {
                // Nothing of this body was sent yet (the pipe is empty: a failed splice moves nothing):
                // copy it instead, through the buffer that still holds its head.
                if (!headSent && !in && (in.errorCode() == EINVAL || in.errorCode() == ENOSYS)) { return Spliced::kUnavailable; }
                log::warn("spindle-httpd: splicing a file failed at offset {}: {}", offset,
                          in ? std::string("end of file") : in.error().message());
                if (!headSent) { (void)flush(); }  // the responses before this one are whole
                return Spliced::kBroken;
            }
            if (!headSent) {
                if (!flush(MSG_MORE)) { return Spliced::kBroken; }
                headSent = true;
            }
            // More chunks follow at once: the last partial segment of this one waits for them.
            const unsigned flags = SPLICE_F_MOVE | (length > *in ? SPLICE_F_MORE : 0u);
            for (size_t left = *in; left > 0;) {
                // A full socket waits for room on the carrier, on either backend (spindle::splice).
                const Result<size_t> out = spindle::splice(pipe.read, -1, stream_.fd(), -1, left, flags, deadline);
                if (!out || *out == 0) { return Spliced::kBroken; }
                left -= *out;
            }
            offset += *in;
            length -= *in;
        }
        return Spliced::kSent;
    }

    /// The response to a file that could not be opened or examined: 403 for what the symlink policy
    /// or the permissions refuse, 404 for what is not there, 500 for the rest (EMFILE, EIO, ...).
    bool fileError(int err, bool keepAlive, int v, bool head) noexcept {
        switch (err) {
            case ENOENT:
            case ENOTDIR:
            case ENAMETOOLONG:
                return simple(404, "Not Found\n", keepAlive, v, head);
            case EACCES:
            case EPERM:
            case ELOOP:
            case EXDEV:
                return simple(403, "Forbidden\n", keepAlive, v, head);
            default:
                log::warn("spindle-httpd: opening a file: {}", std::strerror(err));
                return simple(500, "Internal Server Error\n", keepAlive, v, head);
        }
    }

    Worker& worker_;
    Server::Impl& server_;
    const ServerOptions& options_;
    net::TcpConnection& conn_;
    net::TcpStream& stream_;      // conn_'s, which outlives the reader
    net::BufferedReader reader_;
    Scratch* scratch_ = nullptr;             // leased while there is something to answer
    net::PostedSend sender_;                 // the responses, with options_.postedSend
    Scratch* postedScratch_ = nullptr;       // the block sender_'s send in flight reads
    std::unique_ptr<Header[]> heapHeaders_;  // only for maxHeaders > kStackHeaders
    int lastStatus_ = 0;                     // of the last response head, for the access log
    uint64_t lastLength_ = 0;
    std::array<char, INET6_ADDRSTRLEN> remote_{};  // the client, with an access log
};


}  // namespace

Server::Server(std::unique_ptr<Impl> impl) noexcept : impl_(std::move(impl)) {}

Server::~Server() {
    if (impl_) {
        stop();
        wait();
    }
    // Every connection has ended, so the pool's buffers are all back; it goes with impl_, while
    // the carriers still run (net/provided_buffers.h).
}

Result<std::unique_ptr<Server>> Server::start(Runtime& rt, const ServerOptions& options) {
    if (options.limits.maxHeaderBytes < 64 || options.limits.maxHeaders == 0 || options.connectionStackSize < 16 * 1024 ||
        options.headerTimeout <= 0ms || options.idleTimeout <= 0ms || options.sendTimeout <= 0ms) {
        log::error("spindle-httpd: an option is out of range (max header bytes >= 64, max headers >= 1, "
                   "stack >= 16 KiB, timeouts > 0)");
        return Error{EINVAL};
    }
    auto impl = std::make_unique<Impl>();
    impl->options = options;
    if (!options.root.empty()) {
        impl->rootFd = ::open(options.root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (impl->rootFd < 0) {
            const int err = errno;
            log::error("spindle-httpd: document root {}: {}", options.root, std::strerror(err));
            return Error{err};
        }
        impl->openat2 = options.useOpenat2 && probeOpenat2(impl->rootFd);
        if (char* real = ::realpath(options.root.c_str(), nullptr)) {
            impl->rootPath = real;
            ::free(real);
        }
        if (!options.mimeTypes.empty()) {
            const int err = impl->mimeTypes.load(options.mimeTypes.c_str());
            if (err != 0 && err != ENOENT) {
                log::warn("spindle-httpd: {}: {}; Content-Type from the built-in table", options.mimeTypes, std::strerror(err));
            }
        }
    }
    if (!options.accessLog.empty()) {
        auto opened = AccessLog::open(options.accessLog, rt.carrierCount());
        if (!opened) {
            log::error("spindle-httpd: access log {}: {}", options.accessLog, opened.error().message());
            return Error{opened.errorCode()};
        }
        impl->accessLog = std::move(*opened);
    }
    if (options.providedBuffers) {
        auto pool = net::ProvidedBufferPool::create(
            net::ProvidedBufferOptions{.count = options.providedBufferCount, .size = options.providedBufferSize});
        if (pool) {
            impl->pool = std::move(*pool);
        } else {
            log::warn("spindle-httpd: no provided-buffer pool ({}); connections keep their own buffers",
                      pool.error().message());
        }
    }
    for (unsigned i = 0; i < rt.carrierCount(); ++i) { impl->workers.push_back(std::make_unique<Worker>()); }
    net::TcpServerOptions tcp;
    tcp.address = options.address;
    tcp.shareAddress = options.shareAddress;  // otherwise a busy port fails with EADDRINUSE
    tcp.backlog = options.backlog;
    tcp.name = "http";
    tcp.connectionStackSize = options.connectionStackSize;
    tcp.drainTimeout = options.drainTimeout;
    tcp.idleTimeout = options.idleTimeout;
    // Parking needs a multishot receive to stop and a pool for it (canPark()); without them the sweep
    // would ask every connection in vain.
    if (options.multishotRecv && impl->pool != nullptr) { tcp.idleRelease = options.idleFiberRelease; }
    Server::Impl* raw = impl.get();
    // On each carrier's idle sweep (which runs anyway: idleTimeout > 0) and after its last connection.
    tcp.carrierTick = [raw](unsigned carrier, bool final) noexcept {
        // Buffered per carrier: written by each sweep pass and after the carrier's last connection.
        if (raw->accessLog) { raw->accessLog->flush(carrier); }
        // The carrier's kept splice pipes close with its last connection, on its thread; ~Worker closes
        // those of a carrier whose drain never ran (start() failed part way).
        if (final) { raw->workers[carrier]->pipes.closeAll(); }
    };
    auto server = net::TcpServer::start(rt, tcp, [raw](net::TcpConnection& c) noexcept { Connection::handle(*raw, c); });
    if (!server) { return Error{server.errorCode()}; }  // net::TcpServer said why in the log
    impl->tcp = std::move(*server);
    return std::unique_ptr<Server>(new Server(std::move(impl)));
}

net::SocketAddress Server::localAddress() const noexcept { return impl_->tcp->localAddress(); }

void Server::stop() noexcept { impl_->tcp->stop(); }

void Server::wait() noexcept { impl_->tcp->wait(); }

ServerStats Server::stats() const noexcept {
    ServerStats s;
    const net::TcpServerStats t = impl_->tcp->stats();
    s.accepted = t.accepted;
    s.active = t.active;
    s.idleTimeouts = t.idleTimeouts;
    s.fiberless = t.parked;
    s.fiberReleases = t.parks;
    for (const auto& w : impl_->workers) {
        s.requests += w->requests.load(std::memory_order_relaxed);
        s.errors += w->errors.load(std::memory_order_relaxed);
        s.headerTimeouts += w->headerTimeouts.load(std::memory_order_relaxed);
        s.splicePipes += w->pipes.open.load(std::memory_order_relaxed);
        s.splicePipesLent += w->pipes.lent.load(std::memory_order_relaxed);
    }
    if (impl_->pool) {
        const net::ProvidedBufferStats p = impl_->pool->stats();
        s.providedRecvs = p.providedRecvs;
        s.fallbackRecvs = p.fallbackRecvs;
    }
    return s;
}

}  // namespace spindle::httpd
