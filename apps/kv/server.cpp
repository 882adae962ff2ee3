// SPDX-License-Identifier: Apache-2.0
#include "apps/kv/server.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>

#include "apps/kv/key_locks.h"
#include "apps/kv/rewrite.h"
#include "apps/kv/shard.h"
#include "base/check.h"
#include "base/counter.h"
#include "base/inject.h"
#include "base/log.h"
#include "core/fiber_event.h"
#include "core/fiber_mutex.h"
#include "core/io.h"
#include "net/posted_send.h"
#include "net/provided_buffers.h"
#include "net/tcp_server.h"

namespace spindle::kv {

namespace {

using namespace std::chrono_literals;

constexpr size_t kRecvChunk = 16 * 1024;
constexpr size_t kActiveExpireBudget = 200;  // keys per shard per 100 ms tick
constexpr size_t kMaxBatch = 4096;           // requests parsed before their replies are sent
constexpr size_t kMaxShardRun = 256;         // commands sent to another shard in one message
constexpr size_t kPrefetchAhead = 16;        // commands ahead whose keys' slots are prefetched (nodes: half)

// Command flags.
constexpr uint32_t kWrite = 1;     // mutates: refused while the shard's log has failed
constexpr uint32_t kDenyOom = 2;   // may grow memory: refused past maxmemory
constexpr uint32_t kNoAuth = 4;    // allowed before AUTH
constexpr uint32_t kReadonly = 8;

std::string misconf(int err) { return std::string("MISCONF Errors writing to the AOF file: ") + std::strerror(err); }

std::string wrongArgs(std::string_view name) {
    return "ERR wrong number of arguments for '" + std::string(name) + "' command";
}
const char* kNotInteger = "ERR value is not an integer or out of range";
const char* kWrongType = "WRONGTYPE Operation against a key holding the wrong kind of value";
const char* kSyntax = "ERR syntax error";

/// The receive buffer of a connection: bytes [begin, end) are unparsed.
class InBuffer {
public:
    [[nodiscard]] std::string_view view() const noexcept { return {data_.get() + begin_, end_ - begin_}; }
    [[nodiscard]] size_t size() const noexcept { return end_ - begin_; }
    void consume(size_t n) noexcept {
        begin_ += n;
        if (begin_ == end_) { begin_ = end_ = 0; }
    }
    /// Room for at least `n` more bytes at tail().
    void reserve(size_t n) {
        if (cap_ - end_ >= n) { return; }
        if (begin_ > 0 && cap_ - (end_ - begin_) >= n) {
            std::memmove(data_.get(), data_.get() + begin_, end_ - begin_);
            end_ -= begin_;
            begin_ = 0;
            return;
        }
        size_t cap = std::max(cap_ * 2, (end_ - begin_) + n);
        auto grown = std::make_unique_for_overwrite<char[]>(cap);
        if (end_ > begin_) { std::memcpy(grown.get(), data_.get() + begin_, end_ - begin_); }  // data_ is null at first
        end_ -= begin_;
        begin_ = 0;
        data_ = std::move(grown);
        cap_ = cap;
    }
    /// Frees the memory of an empty buffer that grew past `limit` bytes (for a large request), so that
    /// an idle connection does not keep it.
    void releaseIfEmptyAbove(size_t limit) noexcept {
        if (begin_ == end_ && cap_ > limit) {
            data_.reset();
            cap_ = begin_ = end_ = 0;
        }
    }
    [[nodiscard]] char* tail() noexcept { return data_.get() + end_; }
    [[nodiscard]] size_t room() const noexcept { return cap_ - end_; }
    void commit(size_t n) noexcept { end_ += n; }

private:
    std::unique_ptr<char[]> data_;
    size_t cap_ = 0, begin_ = 0, end_ = 0;
};

struct Command;

struct Client {
    uint64_t id = 0;
    int protocol = 2;
    bool authenticated = false;
    bool closeAfterReply = false;
    std::string name;
    // For CLIENT LIST; written by the connection's fiber on its own carrier only.
    std::string addr, laddr;
    int fd = -1;
    int64_t createdMs = 0;
    int64_t lastMs = 0;
    // The last batch's last command, as CLIENT LIST's cmd shows it: its table entry, so that naming it
    // costs the batch nothing; null before the first and after an unknown one (Redis prints NULL).
    // For CLIENT, CONFIG and COMMAND, the subcommand too (Redis 7's "client|setname"), from a static
    // table; an unknown subcommand leaves lastCommand null, as Redis's lookup does.
    const Command* lastCommand = nullptr;
    std::string_view lastSubcommand;
};

// A write of this batch whose reply waits for its record to be durable.
struct Mark {
    size_t replyOffset;
    unsigned shard;
    uint64_t seq;
};

struct Ctx;
using CommandFn = void (*)(Ctx&);

struct Command {
    const char* name;
    int arity;  // Redis's: >0 exactly, <0 at least -arity
    uint32_t flags;
    int firstKey, lastKey, step;
    CommandFn fn;
};

std::string formatDouble(long double v) {
    // INCRBYFLOAT's format: %.17Lf, then no trailing zeros after the point (Redis's ld2string, humanfriendly).
    // As Redis, into MAX_LONG_DOUBLE_CHARS (5 KiB): "%.17Lf" of a huge value is long.
    std::string s(5 * 1024, '\0');
    const int len = std::snprintf(s.data(), s.size(), "%.17Lf", v);
    s.resize(len < 0 ? 0 : std::min(static_cast<size_t>(len), s.size() - 1));
    if (s.find('.') != std::string::npos) {
        while (!s.empty() && s.back() == '0') { s.pop_back(); }
        if (!s.empty() && s.back() == '.') { s.pop_back(); }
    }
    if (s == "-0") { s = "0"; }
    return s;
}

}  // namespace

// One shard's log compaction: whether a rewrite runs, and what the last one left.
struct RewriteState {
    std::atomic<bool> active{false};     // a rewrite fiber runs (claimed by compare-exchange)
    std::atomic<uint64_t> baseSize{0};   // the log's size after the last rewrite, or at start
    std::atomic<int> lastError{0};       // of the last rewrite that ended
    std::atomic<int64_t> startedMs{0};   // of the one that runs
    std::atomic<int64_t> retryAfterMs{0};  // automatic rewrites wait after a failure
    FiberEvent idle;                     // set while no rewrite runs
    FiberHandle<void> fiber;             // guarded by Server::Impl::rewriteLock

    RewriteState() { idle.set(); }
};

struct Server::Impl {
    Runtime* rt = nullptr;
    ServerOptions options;
    std::vector<std::unique_ptr<Shard>> shards;
    std::vector<std::unique_ptr<KeyLocks>> locks;  // per shard, touched on its carrier only
    std::vector<std::vector<Client*>> clientsOn;  // per carrier: its connections' clients (that carrier only)
    std::vector<std::unique_ptr<ShardLog>> logs;
    std::unique_ptr<net::ProvidedBufferPool> pool;  // receive buffers, or null; outlives tcp's connections
    std::unique_ptr<net::TcpServer> tcp;
    std::vector<FiberHandle<void>> expirers;
    std::atomic<bool> stopping{false};
    std::atomic<bool> started{false};  // tcp is set: connections may use it (INFO, SHUTDOWN)
    std::atomic<uint64_t> maxMemory{0};
    std::atomic<uint64_t> maxClients{0};
    std::atomic<uint64_t> clients{0};
    /// Commands run, counted by the carrier that runs each (the connection's own, or a shard's for a
    /// run of commands sent there), each count on its own cache line: one counter that every carrier
    /// bumps moves its line between them on each command (1.7 % of spindle-kv's CPU on 2 carriers,
    /// its locked add the hottest instruction of execute()). The last slot counts commands run off
    /// the carriers. commandCount() sums them. Receives into a connection's own buffer are counted on
    /// the same line by the connection's carrier (its fiber is pinned there); the pool counts its own.
    struct alignas(64) CommandCount {
        std::atomic<uint64_t> n{0};
        std::atomic<uint64_t> ownRecvs{0};  // receives into a connection's own buffer
    };
    std::unique_ptr<CommandCount[]> commandsOn;
    unsigned commandSlots = 0;
    /// One more in `field` of carrier `c`'s slot (c < 0 or past the carriers: the shared last slot).
    void count(std::atomic<uint64_t> CommandCount::*field, int c) noexcept {
        if (c >= 0 && static_cast<unsigned>(c) + 1 < commandSlots) {
            // One writer per slot (that carrier's thread): no read-modify-write needed.
            ownerAdd(commandsOn[c].*field);
        } else {
            (commandsOn[commandSlots - 1].*field).fetch_add(1, std::memory_order_relaxed);
        }
    }
    void countCommand() noexcept { count(&CommandCount::n, this_fiber::carrierIndex()); }
    /// A connection fiber's receive into its own buffer, on its carrier `carrier`.
    void countOwnReceive(unsigned carrier) noexcept { count(&CommandCount::ownRecvs, static_cast<int>(carrier)); }
    template <class Field>
    [[nodiscard]] uint64_t sumCounts(Field field) const noexcept {
        uint64_t total = 0;
        for (unsigned i = 0; i < commandSlots; ++i) { total += (commandsOn[i].*field).load(std::memory_order_relaxed); }
        return total;
    }
    [[nodiscard]] uint64_t commandCount() const noexcept { return sumCounts(&CommandCount::n); }
    std::atomic<uint64_t> rejected{0};
    uint64_t replayed = 0;
    uint64_t droppedTail = 0;
    uint64_t droppedRecords = 0;
    int64_t startedMs = 0;
    std::vector<std::unique_ptr<RewriteState>> rewrites;  // one per shard, with a log
    FiberMutex rewriteLock;  // serializes starting rewrite fibers and joining them
    std::atomic<uint64_t> autoRewritePct{0};
    std::atomic<uint64_t> autoRewriteMin{0};
    std::atomic<uint64_t> rewritesDone{0};
    std::atomic<uint64_t> rewritesFailed{0};
    std::atomic<int64_t> lastRewriteMs{-1};

    /// Starts a rewrite of shard i's log in a fiber on its carrier. 0, or EBUSY while one runs,
    /// ENOENT without a log, ECANCELED while stopping, spawn's errors.
    int startRewrite(unsigned i) noexcept;
    void runRewrite(unsigned i) noexcept;
    [[nodiscard]] bool rewriteInProgress() const noexcept {
        return std::any_of(rewrites.begin(), rewrites.end(), [](const auto& r) { return r->active.load(); });
    }
    /// Starts shard i's rewrite if its log has grown enough (called from the shard's expiry fiber).
    void maybeAutoRewrite(unsigned i) noexcept;

    [[nodiscard]] unsigned shardOf(std::string_view key) const noexcept {
        return shards.size() == 1 ? 0 : static_cast<unsigned>(keyHash(key) % shards.size());
    }
    [[nodiscard]] uint64_t usedMemory() const noexcept {
        uint64_t u = 0;
        for (const auto& s : shards) { u += s->usedBytes(); }
        return u;
    }
    [[nodiscard]] uint64_t keyCount() const noexcept {
        uint64_t u = 0;
        for (const auto& s : shards) { u += s->keyCount(); }
        return u;
    }
    void serve(net::TcpConnection& conn) noexcept;

    /// Ends the expiry fibers, then writes, syncs and closes the logs; 0 or a log's errno. Idempotent.
    int finish() noexcept {
        if (finished) { return finishError; }
        finished = true;
        stopping.store(true);
        for (auto& f : expirers) {
            f.cancel();
            f.join();
        }
        {
            std::lock_guard lock(rewriteLock);  // a rewrite sees `stopping` at its next slice
            for (auto& r : rewrites) {
                if (r->fiber.joinable()) { r->fiber.join(); }
            }
        }
        for (auto& l : logs) {
            const int e = l->stop();
            if (finishError == 0) { finishError = e; }
        }
        for (auto& sh : shards) { sh->attachLog(nullptr); }
        return finishError;
    }
    ~Impl() {
        tcp.reset();  // its connections end first (stop, drain, wait)
        (void)finish();
    }
    bool finished = false;
    int finishError = 0;
};

bool parseMemorySize(std::string_view text, uint64_t& out) noexcept {
    size_t digits = 0;
    while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') { ++digits; }
    if (digits == 0 || digits > 19) { return false; }
    std::string unit;
    toLower(text.substr(digits), unit);
    uint64_t mul = 1;
    if (unit == "k") { mul = 1000; }
    else if (unit == "kb") { mul = 1024; }
    else if (unit == "m") { mul = 1000 * 1000; }
    else if (unit == "mb") { mul = 1024 * 1024; }
    else if (unit == "g") { mul = 1000ull * 1000 * 1000; }
    else if (unit == "gb") { mul = 1024ull * 1024 * 1024; }
    else if (!unit.empty()) { return false; }
    int64_t v = 0;
    if (!parseInt64(text.substr(0, digits), v) || v < 0 || static_cast<uint64_t>(v) > UINT64_MAX / mul) { return false; }
    out = static_cast<uint64_t>(v) * mul;
    return true;
}

int Server::Impl::startRewrite(unsigned i) noexcept {
    if (logs.empty()) { return ENOENT; }
    RewriteState& st = *rewrites[i];
    bool expected = false;
    if (!st.active.compare_exchange_strong(expected, true)) { return EBUSY; }
    std::lock_guard lock(rewriteLock);
    if (stopping.load()) {
        st.active.store(false);
        return ECANCELED;
    }
    // The last one has ended, or is about to: after it cleared `active` it only sets `idle`. Joined
    // before the reset, so that its set cannot mark this new rewrite idle.
    if (st.fiber.joinable()) { st.fiber.join(); }
    st.idle.reset();
    st.startedMs.store(nowMs());
    auto f = rt->spawn([this, i]() noexcept { runRewrite(i); },
                       SpawnOptions{.name = "kv-rewrite", .carrier = static_cast<int>(i), .pinned = true});
    if (!f) {
        st.active.store(false);
        st.idle.set();
        return f.errorCode();
    }
    st.fiber = std::move(*f);
    return 0;
}

void Server::Impl::runRewrite(unsigned i) noexcept {
    RewriteState& st = *rewrites[i];
    RewriteStats rs;
    const int64_t began = nowMs();
    const uint64_t before = logs[i]->size();
    const int err = rewriteShardLog(*shards[i], *logs[i], options.dir, stopping, &rs);
    const int64_t took = nowMs() - began;
    if (err == 0) {
        st.baseSize.store(rs.size);
        rewritesDone.fetch_add(1);
        log::info("spindle-kv: shard {}'s log rewritten in {} ms: {} -> {} bytes ({} keys, {} bytes written meanwhile)", i,
                  took, before, rs.size, rs.keys, rs.tailBytes);
    } else if (err != ECANCELED) {
        rewritesFailed.fetch_add(1);
        st.retryAfterMs.store(nowMs() + 5000);
        log::warn("spindle-kv: rewriting shard {}'s log failed: {}; the old log stays in use", i, std::strerror(err));
    }
    if (err != ECANCELED) { lastRewriteMs.store(took); }
    st.lastError.store(err);
    // Not in progress any more before anyone waiting learns it is over: a SAVE that returns once
    // `idle` is set may be followed at once by a BGREWRITEAOF, which must not find it still active.
    st.active.store(false);
    SPINDLE_INJECT(inject::Point::kRewriteEnd, { std::this_thread::sleep_for(std::chrono::milliseconds(injectedErrno)); });
    st.idle.set();
}

void Server::Impl::maybeAutoRewrite(unsigned i) noexcept {
    const uint64_t pct = autoRewritePct.load(std::memory_order_relaxed);
    if (logs.empty() || pct == 0) { return; }
    const RewriteState& st = *rewrites[i];
    const uint64_t size = logs[i]->size();
    const uint64_t base = std::max<uint64_t>(st.baseSize.load(std::memory_order_relaxed), 1);
    if (size < autoRewriteMin.load(std::memory_order_relaxed) || logs[i]->failed() != 0 || st.active.load() ||
        nowMs() < st.retryAfterMs.load(std::memory_order_relaxed)) {
        return;
    }
    // Redis's test: growth = size * 100 / base - 100 >= pct, without the overflow.
    if (static_cast<long double>(size) * 100 >= static_cast<long double>(base) * static_cast<long double>(100 + pct)) {
        if (startRewrite(i) == 0) {
            log::info("spindle-kv: shard {}'s log is {} bytes, {}% over {}: rewriting it", i, size,
                      (size - std::min(size, base)) * 100 / base, base);
        }
    }
}

namespace {

struct Ctx {
    Server::Impl& s;
    Client& client;
    const std::vector<std::string_view>& args;
    ReplyWriter& w;
    std::vector<Mark>& marks;
    const Command& cmd;
    // The time the command runs at (unix ms): read once per batch of pipelined commands (a clock read
    // is some 26 ns through the vDSO here, about 3% of a pipelined SET), so the commands of one batch
    // see one time, as those of a transaction would. Expiry and TTLs are relative to it.
    int64_t now;
    bool broken = false;  // a shard could not be reached (the runtime is shutting down)

    [[nodiscard]] std::string_view arg(size_t i) const { return args[i]; }
    [[nodiscard]] size_t argc() const { return args.size(); }

    /// Runs f(shard) on the shard's carrier. For a write, a failed log answers MISCONF instead, and a
    /// record appended is noted so that the reply waits for it (appendfsync always).
    template <class F>
    void onShard(unsigned index, F&& f) {
        Shard& shard = *s.shards[index];
        const bool write = (cmd.flags & kWrite) != 0;
        uint64_t seq = 0;
        const size_t replyOffset = w.buffer().size();
        auto r = s.rt->runOnCarrier(index, [&]() noexcept {
            if (write && shard.log() != nullptr && shard.log()->failed() != 0) {
                w.error(misconf(shard.log()->failed()));
                return;
            }
            const uint64_t before = shard.lastSeq();
            f(shard);
            if (shard.lastSeq() != before) { seq = shard.lastSeq(); }
        });
        if (!r) {
            broken = true;
            return;
        }
        if (seq != 0 && shard.log() != nullptr && shard.log()->mode() == Fsync::kAlways) {
            marks.push_back(Mark{replyOffset, index, seq});
        }
    }
    /// onShard for a single-key command: when a multi-key command holds the key, waits for it to
    /// finish and runs then (see apps/kv/key_locks.h).
    template <class F>
    void onKey(std::string_view key, F&& f) {
        const unsigned index = s.shardOf(key);
        const bool write = (cmd.flags & kWrite) != 0;
        for (;;) {
            bool blocked = false;
            FiberFuture unlocked;
            onShard(index, [&](Shard& shard) {
                KeyLocks& locks = *s.locks[index];
                if (!locks.idle() && locks.blocked(key, write)) {
                    locks.waitForUnlock(unlocked);
                    blocked = true;
                    return;
                }
                f(shard);
            });
            if (!blocked || broken) { return; }
            (void)unlocked.wait();
        }
    }

    /// Runs fn(i) on the carrier of shard shardIdx[i] for every i < n, all at once: a helper fiber
    /// per other shard sends its message (runOnCarrier) while this fiber sends its own, then all are
    /// joined. The shard of this carrier, if listed, runs inline. False when a shard could not be
    /// reached (broken is set).
    template <class F>
    bool fanOut(size_t n, const unsigned* shardIdx, F&& fn) {
        auto one = [&](size_t i) { return static_cast<bool>(s.rt->runOnCarrier(shardIdx[i], [&]() noexcept { fn(i); })); };
        if (n == 1) {
            broken = broken || !one(0);
            return !broken;
        }
        const int self = this_fiber::carrierIndex();
        size_t mine = 0;  // the one this fiber runs: the local shard, else the first
        for (size_t i = 0; i < n; ++i) {
            if (static_cast<int>(shardIdx[i]) == self) { mine = i; }
        }
        std::vector<FiberHandle<bool>> helpers;
        helpers.reserve(n - 1);
        bool ok = true;
        for (size_t i = 0; i < n; ++i) {
            if (i == mine) { continue; }
            auto h = s.rt->spawn([&one, i]() noexcept { return one(i); },
                                 SpawnOptions{.name = "kv-fanout", .carrier = self, .pinned = true});
            if (h) {
                helpers.push_back(std::move(*h));
            } else {
                ok = one(i) && ok;  // no fiber to spare: this one goes in turn
            }
        }
        this_fiber::yield();  // the helpers send their messages before this one does its own part
        ok = one(mine) && ok;
        for (auto& h : helpers) { ok = h.join() && ok; }
        broken = broken || !ok;
        return ok;
    }
};

// ---- connection and server commands ----

void cmdPing(Ctx& x) {
    if (x.argc() > 2) {
        x.w.error(wrongArgs("ping"));
    } else if (x.argc() == 2) {
        x.w.bulk(x.arg(1));
    } else {
        x.w.simple("PONG");
    }
}

void cmdEcho(Ctx& x) { x.w.bulk(x.arg(1)); }

void cmdSelect(Ctx& x) {
    int64_t db = 0;
    if (!parseInt64(x.arg(1), db)) {
        x.w.error(kNotInteger);
    } else if (db != 0) {
        x.w.error("ERR DB index is out of range");
    } else {
        x.w.ok();
    }
}

void cmdQuit(Ctx& x) {
    x.w.ok();
    x.client.closeAfterReply = true;
}

void cmdAuth(Ctx& x) {
    if (x.argc() > 3) {
        x.w.error(kSyntax);
        return;
    }
    const std::string_view pass = x.arg(x.argc() - 1);
    const bool defaultUser = x.argc() == 2 || x.arg(1) == "default";
    if (x.s.options.requirePass.empty() && x.argc() == 2) {
        x.w.error("ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?");
        return;
    }
    if (defaultUser && (x.s.options.requirePass.empty() || pass == x.s.options.requirePass)) {
        x.client.authenticated = true;
        x.w.ok();
        return;
    }
    x.w.error("WRONGPASS invalid username-password pair or user is disabled.");
}

void writeHello(Ctx& x) {
    x.w.mapHeader(7);
    x.w.bulk("server");
    x.w.bulk("redis");
    x.w.bulk("version");
    x.w.bulk("7.0.15");
    x.w.bulk("proto");
    x.w.integer(x.client.protocol);
    x.w.bulk("id");
    x.w.integer(static_cast<int64_t>(x.client.id));
    x.w.bulk("mode");
    x.w.bulk("standalone");
    x.w.bulk("role");
    x.w.bulk("master");
    x.w.bulk("modules");
    x.w.arrayHeader(0);
}

void cmdHello(Ctx& x) {
    size_t i = 1;
    int protocol = x.client.protocol;
    if (x.argc() >= 2) {
        int64_t v = 0;
        if (!parseInt64(x.arg(1), v)) {
            x.w.error("ERR Protocol version is not an integer or out of range");
            return;
        }
        if (v < 2 || v > 3) {
            x.w.error("NOPROTO unsupported protocol version");
            return;
        }
        protocol = static_cast<int>(v);
        i = 2;
    }
    std::string_view user, pass, name;
    bool auth = false, setName = false;
    for (; i < x.argc(); ++i) {
        std::string opt;
        toLower(x.arg(i), opt);
        if (opt == "auth" && i + 2 < x.argc()) {
            user = x.arg(i + 1);
            pass = x.arg(i + 2);
            auth = true;
            i += 2;
        } else if (opt == "setname" && i + 1 < x.argc()) {
            name = x.arg(i + 1);
            setName = true;
            i += 1;
        } else {
            x.w.error(fmt::format("ERR Syntax error in HELLO option '{}'", x.arg(i)));
            return;
        }
    }
    if (auth) {
        if (user != "default" || (!x.s.options.requirePass.empty() && pass != x.s.options.requirePass)) {
            x.w.error("WRONGPASS invalid username-password pair or user is disabled.");
            return;
        }
        x.client.authenticated = true;
    }
    if (!x.client.authenticated) {
        x.w.error("NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time");
        return;
    }
    if (setName) { x.client.name = std::string(name); }
    x.client.protocol = protocol;
    x.w.setProtocol(protocol);
    writeHello(x);
}

// CLIENT LIST's cmd for `c`: the command, with its subcommand where it has one; NULL for none.
std::string lastCommandName(const Client& c) {
    if (c.lastCommand == nullptr) { return "NULL"; }
    if (c.lastSubcommand.empty()) { return c.lastCommand->name; }
    return fmt::format("{}|{}", c.lastCommand->name, c.lastSubcommand);
}

// CLIENT LIST [TYPE normal] [ID id ...]: one line per client in Redis's field order (the fields it
// has no counterpart for hold Redis's idle values).
void cmdClientList(Ctx& x) {
    std::vector<uint64_t> ids;
    for (size_t i = 2; i < x.argc(); ++i) {
        std::string opt;
        toLower(x.arg(i), opt);
        if (opt == "id" && i + 1 < x.argc()) {
            for (++i; i < x.argc(); ++i) {
                int64_t id = 0;
                if (!parseInt64(x.arg(i), id) || id <= 0) {
                    x.w.error("ERR Invalid client ID");
                    return;
                }
                ids.push_back(static_cast<uint64_t>(id));
            }
        } else if (opt == "type" && i + 1 < x.argc()) {
            std::string t;
            toLower(x.arg(++i), t);
            if (t != "normal" && t != "master" && t != "replica" && t != "slave" && t != "pubsub") {
                x.w.error(fmt::format("ERR Unknown client type '{}'", x.arg(i)));
                return;
            }
            if (t != "normal") { ids.push_back(0); }  // no client is of those types: match none
        } else {
            x.w.error(kSyntax);
            return;
        }
    }
    // The connections stay on their carriers: each carrier lists its own, all at once.
    const size_t n = x.s.clientsOn.size();
    std::vector<unsigned> all(n);
    std::vector<std::vector<std::pair<uint64_t, std::string>>> lines(n);
    for (unsigned i = 0; i < n; ++i) { all[i] = i; }
    const int64_t now = x.now;
    if (!x.fanOut(n, all.data(), [&](size_t i) {
            for (const Client* c : x.s.clientsOn[i]) {
                if (!ids.empty() && std::find(ids.begin(), ids.end(), c->id) == ids.end()) { continue; }
                lines[i].emplace_back(
                    c->id, fmt::format("id={} addr={} laddr={} fd={} name={} age={} idle={} flags=N db=0 sub=0 psub=0 "
                                       "ssub=0 multi=-1 qbuf=0 qbuf-free=0 argv-mem=0 multi-mem=0 rbs=0 rbp=0 obl=0 "
                                       "oll=0 omem=0 tot-mem=0 events=r cmd={} user=default redir=-1 resp={}\n",
                                       c->id, c->addr, c->laddr, c->fd, c->name, (now - c->createdMs) / 1000,
                                       (now - c->lastMs) / 1000, c == &x.client ? std::string("client|list") : lastCommandName(*c),
                                       c->protocol));
            }
        })) {
        return;
    }
    std::vector<std::pair<uint64_t, std::string>> merged;
    for (auto& l : lines) { merged.insert(merged.end(), std::make_move_iterator(l.begin()), std::make_move_iterator(l.end())); }
    std::sort(merged.begin(), merged.end());
    std::string text;
    for (const auto& l : merged) { text += l.second; }
    if (x.w.protocol() >= 3) {
        x.w.buffer() += fmt::format("={}\r\ntxt:{}\r\n", text.size() + 4, text);
    } else {
        x.w.bulk(text);
    }
}

void cmdClient(Ctx& x) {
    std::string sub;
    toLower(x.arg(1), sub);
    if (sub == "id" && x.argc() == 2) {
        x.w.integer(static_cast<int64_t>(x.client.id));
    } else if (sub == "getname" && x.argc() == 2) {
        if (x.client.name.empty()) {
            x.w.null();
        } else {
            x.w.bulk(x.client.name);
        }
    } else if (sub == "setname" && x.argc() == 3) {
        const std::string_view n = x.arg(2);
        if (std::any_of(n.begin(), n.end(), [](char c) { return c < '!' || c > '~'; })) {
            x.w.error("ERR Client names cannot contain spaces, newlines or special characters.");
            return;
        }
        x.client.name = std::string(n);
        x.w.ok();
    } else if (sub == "list") {
        cmdClientList(x);
    } else if (sub == "id" || sub == "getname" || sub == "setname") {
        x.w.error(fmt::format("ERR wrong number of arguments for 'client|{}' command", sub));
    } else {
        x.w.error(fmt::format("ERR unknown subcommand '{}'. Try CLIENT HELP.", x.arg(1).substr(0, 128)));
    }
}

std::string infoText(Server::Impl& s, const Client& c, std::string_view section) {
    const bool all = section.empty() || section == "all" || section == "everything" || section == "default";
    std::string out;
    auto want = [&](std::string_view name) { return all || section == name; };
    if (want("server")) {
        out += fmt::format(
            "# Server\r\nredis_version:7.0.15\r\nredis_mode:standalone\r\nspindle_kv:1\r\nos:Linux\r\n"
            "process_id:{}\r\ntcp_port:{}\r\nuptime_in_seconds:{}\r\nio_threads_active:{}\r\n\r\n",
            ::getpid(), s.tcp ? s.tcp->localAddress().port() : 0, (nowMs() - s.startedMs) / 1000, s.rt->carrierCount());
    }
    if (want("clients")) {
        out += fmt::format("# Clients\r\nconnected_clients:{}\r\nmaxclients:{}\r\n\r\n", s.clients.load(),
                           s.maxClients.load());
    }
    if (want("memory")) {
        out += fmt::format("# Memory\r\nused_memory:{}\r\nmaxmemory:{}\r\nmaxmemory_policy:noeviction\r\n\r\n",
                           s.usedMemory(), s.maxMemory.load());
    }
    if (want("persistence")) {
        LogStats ls;
        int failed = 0;
        uint64_t current = 0, base = 0;
        for (const auto& l : s.logs) {
            const LogStats one = l->stats();
            ls.records += one.records;
            ls.bytes += one.bytes;
            ls.syncs += one.syncs;
            ls.syncedRecords += one.syncedRecords;
            ls.preallocated += one.preallocated;
            ls.appendedPastEnd += one.appendedPastEnd;
            current += l->size();
            if (failed == 0) { failed = l->failed(); }
        }
        int64_t runningSince = 0;
        for (const auto& r : s.rewrites) {
            base += r->baseSize.load();
            if (r->active.load()) {
                const int64_t t = r->startedMs.load();
                runningSince = runningSince == 0 ? t : std::min(runningSince, t);
            }
        }
        // err while any shard's last rewrite failed (one that shutdown cancelled does not count).
        const bool rewriteFailed = std::any_of(s.rewrites.begin(), s.rewrites.end(), [](const auto& r) {
            const int e = r->lastError.load();
            return e != 0 && e != ECANCELED;
        });
        const int64_t lastMs = s.lastRewriteMs.load();
        out += fmt::format(
            "# Persistence\r\nloading:0\r\naof_enabled:{}\r\naof_rewrite_in_progress:{}\r\naof_rewrite_scheduled:0\r\n"
            "aof_last_rewrite_time_sec:{}\r\naof_current_rewrite_time_sec:{}\r\naof_last_bgrewrite_status:{}\r\n"
            "aof_rewrites:{}\r\naof_rewrites_failed:{}\r\naof_last_write_status:{}\r\n",
            s.logs.empty() ? 0 : 1, runningSince != 0 ? 1 : 0, lastMs < 0 ? -1 : lastMs / 1000,
            runningSince != 0 ? (nowMs() - runningSince) / 1000 : -1, rewriteFailed ? "err" : "ok", s.rewritesDone.load(),
            s.rewritesFailed.load(), failed == 0 ? "ok" : "err");
        if (!s.logs.empty()) {
            out += fmt::format("aof_current_size:{}\r\naof_base_size:{}\r\naof_pending_rewrite:0\r\n", current, base);
        }
        out += fmt::format(
            "aof_records:{}\r\naof_bytes:{}\r\naof_fsyncs:{}\r\naof_fsync_mean_batch:{:.2f}\r\n"
            "aof_preallocated_bytes:{}\r\naof_appends_past_preallocation:{}\r\n"
            "aof_replayed_records:{}\r\naof_dropped_tail_bytes:{}\r\naof_dropped_records:{}\r\n\r\n",
            ls.records, ls.bytes, ls.syncs,
            ls.syncs == 0 ? 0.0 : static_cast<double>(ls.syncedRecords) / static_cast<double>(ls.syncs), ls.preallocated,
            ls.appendedPastEnd, s.replayed, s.droppedTail, s.droppedRecords);
    }
    if (want("stats")) {
        uint64_t expired = 0;
        for (const auto& sh : s.shards) { expired += sh->expiredKeys(); }
        const net::TcpServerStats t = s.tcp ? s.tcp->stats() : net::TcpServerStats{};
        out += fmt::format(
            "# Stats\r\ntotal_connections_received:{}\r\ntotal_commands_processed:{}\r\nrejected_connections:{}\r\n"
            "expired_keys:{}\r\n\r\n",
            t.accepted, s.commandCount(), s.rejected.load(), expired);
    }
    if (want("keyspace")) {
        out += "# Keyspace\r\n";
        uint64_t keys = 0, expires = 0;
        for (const auto& sh : s.shards) {
            keys += sh->keyCount();
            expires += sh->expiresCount();
        }
        if (keys > 0) { out += fmt::format("db0:keys={},expires={},avg_ttl=0\r\n", keys, expires); }
    }
    (void)c;
    if (out.size() >= 4 && out.compare(out.size() - 4, 4, "\r\n\r\n") == 0) { out.resize(out.size() - 2); }
    return out;
}

void cmdInfo(Ctx& x) {
    std::string section;
    if (x.argc() >= 2) { toLower(x.arg(1), section); }
    const std::string text = infoText(x.s, x.client, section);
    if (x.w.protocol() >= 3) {
        x.w.buffer() += fmt::format("={}\r\ntxt:{}\r\n", text.size() + 4, text);
    } else {
        x.w.bulk(text);
    }
}

// CONFIG GET/SET for the parameters the server has.
void cmdConfig(Ctx& x) {
    std::string sub;
    toLower(x.arg(1), sub);
    if (sub == "get") {
        if (x.argc() < 3) {
            x.w.error("ERR wrong number of arguments for 'config|get' command");
            return;
        }
        const std::array<std::pair<const char*, std::string>, 9> params{{
            {"appendonly", x.s.logs.empty() ? "no" : "yes"},
            {"appendfsync", x.s.options.appendFsync == Fsync::kAlways ? "always"
                            : x.s.options.appendFsync == Fsync::kEverySec ? "everysec" : "no"},
            {"maxclients", std::to_string(x.s.maxClients.load())},
            {"maxmemory", std::to_string(x.s.maxMemory.load())},
            {"requirepass", x.s.options.requirePass},
            {"proto-max-bulk-len", std::to_string(x.s.options.limits.maxBulkLength)},
            {"client-query-buffer-limit", std::to_string(x.s.options.queryBufferLimit)},
            {"auto-aof-rewrite-percentage", std::to_string(x.s.autoRewritePct.load())},
            {"auto-aof-rewrite-min-size", std::to_string(x.s.autoRewriteMin.load())},
        }};
        std::vector<std::pair<const char*, const std::string*>> found;
        for (size_t i = 2; i < x.argc(); ++i) {
            std::string pattern;
            toLower(x.arg(i), pattern);
            for (const auto& param : params) {
                const char* name = param.first;
                const std::string& value = param.second;
                const bool match = globMatch(pattern, name);  // Redis matches parameter names as globs
                if (match && std::none_of(found.begin(), found.end(), [&](const auto& f) { return f.first == name; })) {
                    found.emplace_back(name, &value);
                }
            }
        }
        x.w.mapHeader(found.size());
        for (const auto& [name, value] : found) {
            x.w.bulk(name);
            x.w.bulk(*value);
        }
    } else if (sub == "set") {
        if (x.argc() < 4 || x.argc() % 2 != 0) {
            x.w.error("ERR wrong number of arguments for 'config|set' command");
            return;
        }
        for (size_t i = 2; i < x.argc(); i += 2) {
            std::string name;
            toLower(x.arg(i), name);
            int64_t v = 0;
            uint64_t size = 0;
            if (name == "auto-aof-rewrite-min-size" || name == "auto-aof-rewrite-percentage") {
                const bool ok = name == "auto-aof-rewrite-min-size" ? parseMemorySize(x.arg(i + 1), size)
                                                                    : parseInt64(x.arg(i + 1), v) && v >= 0;
                if (!ok) {
                    x.w.error(fmt::format("ERR CONFIG SET failed (possibly related to argument '{}') - argument must be a memory or a positive number", name));
                    return;
                }
            } else if (name == "maxmemory" || name == "maxclients") {
                if (!parseInt64(x.arg(i + 1), v) || v < 0 || (name == "maxclients" && v == 0)) {
                    x.w.error(fmt::format("ERR CONFIG SET failed (possibly related to argument '{}') - argument must be a memory or a positive number", name));
                    return;
                }
            } else if (name == "appendfsync" || name == "appendonly" || name == "requirepass" ||
                       name == "proto-max-bulk-len" || name == "client-query-buffer-limit") {
                x.w.error(fmt::format("ERR CONFIG SET failed (possibly related to argument '{}') - can't set immutable config", name));
                return;
            } else {
                x.w.error(fmt::format("ERR Unknown option or number of arguments for CONFIG SET - '{}'", x.arg(i)));
                return;
            }
        }
        for (size_t i = 2; i < x.argc(); i += 2) {
            std::string name;
            toLower(x.arg(i), name);
            int64_t v = 0;
            if (name == "auto-aof-rewrite-min-size") {
                uint64_t size = 0;
                (void)parseMemorySize(x.arg(i + 1), size);
                x.s.autoRewriteMin.store(size);
                continue;
            }
            (void)parseInt64(x.arg(i + 1), v);
            if (name == "auto-aof-rewrite-percentage") {
                x.s.autoRewritePct.store(static_cast<uint64_t>(v));
                continue;
            }
            (name == "maxmemory" ? x.s.maxMemory : x.s.maxClients).store(static_cast<uint64_t>(v));
        }
        x.w.ok();
    } else {
        x.w.error(fmt::format("ERR unknown subcommand '{}'. Try CONFIG HELP.", x.arg(1).substr(0, 128)));
    }
}

void cmdCommand(Ctx& x);
void cmdShutdown(Ctx& x);

const char* kNoLog = "ERR spindle-kv keeps no log to rewrite (start it with --dir)";

void cmdBgrewriteaof(Ctx& x) {
    if (x.s.logs.empty()) {
        x.w.error(kNoLog);
        return;
    }
    if (x.s.rewriteInProgress()) {
        x.w.error("ERR Background append only file rewriting already in progress");
        return;
    }
    int err = 0;
    for (unsigned i = 0; i < x.s.shards.size(); ++i) {
        const int e = x.s.startRewrite(i);
        if (e != 0 && e != EBUSY && err == 0) { err = e; }  // EBUSY: an automatic one began meanwhile
    }
    if (err != 0) {
        x.w.error(fmt::format("ERR Can't rewrite append only file in background: {}", std::strerror(err)));
        return;
    }
    x.w.simple("Background append only file rewriting started");
}

// A rewrite of every shard's log that begins after this call did, waited for (SAVE, SHUTDOWN SAVE).
// Returns 0, or the first error: ENOENT without a log, ESHUTDOWN when the runtime is stopping while
// it waits for a rewrite that was already running, startRewrite's errors, a rewrite's errno.
int rewriteEveryLog(Server::Impl& s) {
    if (s.logs.empty()) { return ENOENT; }
    for (unsigned i = 0; i < s.shards.size(); ++i) {
        for (;;) {
            const int e = s.startRewrite(i);
            if (e == 0) { break; }
            if (e != EBUSY) { return e; }
            s.rewrites[i]->idle.wait();  // one runs that may have read the shard before SAVE came
            if (s.rewrites[i]->active.load() && !spindle::sleep(1ms)) { return ESHUTDOWN; }
        }
    }
    int err = 0;
    for (unsigned i = 0; i < s.shards.size(); ++i) {
        s.rewrites[i]->idle.wait();
        if (const int e = s.rewrites[i]->lastError.load(); e != 0 && err == 0) { err = e; }
    }
    return err;
}

// SAVE: rewriteEveryLog, answered when it is over.
void cmdSave(Ctx& x) {
    const int err = rewriteEveryLog(x.s);
    if (err == ENOENT && x.s.logs.empty()) {
        x.w.error(kNoLog);
    } else if (err == ESHUTDOWN) {
        x.w.error("ERR the server is shutting down");
    } else if (err != 0) {
        x.w.error(fmt::format("ERR {}", std::strerror(err)));
    } else {
        x.w.ok();
    }
}

// ---- strings ----

// Whether `e` (live or null) holds something else than `t`; if so WRONGTYPE is the reply.
bool wrongType(Ctx& x, const Entry* e, ValueType t) {
    if (e == nullptr || e->type() == t) { return false; }
    x.w.error(kWrongType);
    return true;
}

void cmdGet(Ctx& x) {
    x.onKey(x.arg(1), [&](Shard& s) {
        Entry* e = s.find(x.arg(1), x.now);
        if (wrongType(x, e, ValueType::kString)) { return; }
        if (e != nullptr) {
            x.w.bulk(e->value());
        } else {
            x.w.null();
        }
    });
}

void cmdStrlen(Ctx& x) {
    x.onKey(x.arg(1), [&](Shard& s) {
        Entry* e = s.find(x.arg(1), x.now);
        if (wrongType(x, e, ValueType::kString)) { return; }
        x.w.integer(e != nullptr ? static_cast<int64_t>(e->value().size()) : 0);
    });
}

// EX, PX, EXAT or PXAT (`opt`, lower case), the options SET and GETEX share.
bool isExpireOption(const std::string& opt) { return opt == "ex" || opt == "px" || opt == "exat" || opt == "pxat"; }

// The absolute expiry in ms that `opt` with its argument `text` names, in *atMs. Errors: false after
// writing Redis's reply: not an integer, or "invalid expire time in '<command>' command" for a time
// that is not positive or does not fit in milliseconds (relative ones counted from now).
bool parseExpireOption(Ctx& x, const std::string& opt, std::string_view text, const char* command, int64_t* atMs) {
    int64_t v = 0;
    if (!parseInt64(text, v)) {
        x.w.error(kNotInteger);
        return false;
    }
    const bool seconds = opt == "ex" || opt == "exat";
    const bool relative = opt == "ex" || opt == "px";
    bool valid = v > 0 && !(seconds && v > INT64_MAX / 1000);
    if (valid && seconds) { v *= 1000; }
    if (valid && relative) {
        const int64_t now = x.now;
        valid = v <= INT64_MAX - now;
        if (valid) { v += now; }
    }
    if (!valid) {
        x.w.error(fmt::format("ERR invalid expire time in '{}' command", command));
        return false;
    }
    *atMs = v;
    return true;
}

// SET key value [NX|XX] [GET] [EX s|PX ms|EXAT t|PXAT tms|KEEPTTL]
void cmdSet(Ctx& x) {
    bool nx = false, xx = false, get = false, keepTtl = false;
    int64_t expireAt = 0;
    bool haveExpire = false;
    for (size_t i = 3; i < x.argc(); ++i) {
        std::string opt;
        toLower(x.arg(i), opt);
        const bool hasNext = i + 1 < x.argc();
        if (opt == "nx" && !xx) {
            nx = true;
        } else if (opt == "xx" && !nx) {
            xx = true;
        } else if (opt == "get") {
            get = true;
        } else if (opt == "keepttl" && !haveExpire) {
            keepTtl = true;
        } else if (isExpireOption(opt) && !keepTtl && !haveExpire && hasNext) {
            if (!parseExpireOption(x, opt, x.arg(i + 1), "set", &expireAt)) { return; }
            haveExpire = true;
            ++i;
        } else {
            x.w.error(kSyntax);
            return;
        }
    }
    x.onKey(x.arg(1), [&](Shard& s) {
        Entry* e = s.find(x.arg(1), x.now);
        if (get && wrongType(x, e, ValueType::kString)) { return; }
        if (get) {
            if (e != nullptr) {
                x.w.bulk(e->value());
            } else {
                x.w.null();
            }
        }
        if ((nx && e != nullptr) || (xx && e == nullptr)) {
            if (!get) { x.w.null(); }
            return;
        }
        const int64_t at = keepTtl && e != nullptr ? e->expireAtMs : expireAt;
        s.set(x.arg(1), x.arg(2), at);
        if (!get) { x.w.ok(); }
    });
}

void cmdSetnx(Ctx& x) {
    x.onKey(x.arg(1), [&](Shard& s) {
        if (s.find(x.arg(1), x.now) != nullptr) {
            x.w.integer(0);
            return;
        }
        s.set(x.arg(1), x.arg(2), 0);
        x.w.integer(1);
    });
}

void setWithTtl(Ctx& x, bool millis, const char* name) {
    int64_t v = 0;
    if (!parseInt64(x.arg(2), v)) {
        x.w.error(kNotInteger);
        return;
    }
    const int64_t now = x.now;
    if (v <= 0 || (!millis && v > INT64_MAX / 1000) || (millis ? v : v * 1000) > INT64_MAX - now) {
        x.w.error(fmt::format("ERR invalid expire time in '{}' command", name));
        return;
    }
    const int64_t at = now + (millis ? v : v * 1000);
    x.onKey(x.arg(1), [&](Shard& s) {
        s.set(x.arg(1), x.arg(3), at);
        x.w.ok();
    });
}
void cmdSetex(Ctx& x) { setWithTtl(x, false, "setex"); }
void cmdPsetex(Ctx& x) { setWithTtl(x, true, "psetex"); }

void cmdGetset(Ctx& x) {
    x.onKey(x.arg(1), [&](Shard& s) {
        Entry* e = s.find(x.arg(1), x.now);
        if (wrongType(x, e, ValueType::kString)) { return; }
        if (e != nullptr) {
            x.w.bulk(e->value());
        } else {
            x.w.null();
        }
        s.set(x.arg(1), x.arg(2), 0);
    });
}

void cmdGetdel(Ctx& x) {
    x.onKey(x.arg(1), [&](Shard& s) {
        Entry* e = s.find(x.arg(1), x.now);
        if (wrongType(x, e, ValueType::kString)) { return; }
        if (e != nullptr) {
            x.w.bulk(e->value());
            (void)s.del(x.arg(1));
        } else {
            x.w.null();
        }
    });
}

// GETEX key [EX s|PX ms|EXAT t|PXAT tms|PERSIST]
void cmdGetex(Ctx& x) {
    int64_t at = -1;  // -1: leave the TTL; 0: persist
    if (x.argc() > 4) {
        x.w.error(kSyntax);
        return;
    }
    if (x.argc() >= 3) {
        std::string opt;
        toLower(x.arg(2), opt);
        if (opt == "persist" && x.argc() == 3) {
            at = 0;
        } else if (isExpireOption(opt) && x.argc() == 4) {
            if (!parseExpireOption(x, opt, x.arg(3), "getex", &at)) { return; }
        } else {
            x.w.error(kSyntax);
            return;
        }
    }
    x.onKey(x.arg(1), [&](Shard& s) {
        Entry* e = s.find(x.arg(1), x.now);
        if (wrongType(x, e, ValueType::kString)) { return; }
        if (e == nullptr) {
            x.w.null();
            return;
        }
        x.w.bulk(e->value());
        if (at == 0) {
            (void)s.persist(x.arg(1));
        } else if (at > 0) {
            s.expireAt(x.arg(1), at);
        }
    });
}

void incrBy(Ctx& x, std::string_view key, int64_t by) {
    x.onKey(key, [&](Shard& s) {
        Entry* e = s.find(key, x.now);
        if (wrongType(x, e, ValueType::kString)) { return; }
        int64_t v = 0;
        if (e != nullptr && !parseInt64(e->value(), v)) {
            x.w.error(kNotInteger);
            return;
        }
        if ((by > 0 && v > INT64_MAX - by) || (by < 0 && v < INT64_MIN - by)) {
            x.w.error("ERR increment or decrement would overflow");
            return;
        }
        v += by;
        s.set(key, std::to_string(v), e != nullptr ? e->expireAtMs : 0);
        x.w.integer(v);
    });
}
void cmdIncr(Ctx& x) { incrBy(x, x.arg(1), 1); }
void cmdDecr(Ctx& x) { incrBy(x, x.arg(1), -1); }
void cmdIncrby(Ctx& x) {
    int64_t by = 0;
    if (!parseInt64(x.arg(2), by)) {
        x.w.error(kNotInteger);
        return;
    }
    incrBy(x, x.arg(1), by);
}
void cmdDecrby(Ctx& x) {
    int64_t by = 0;
    if (!parseInt64(x.arg(2), by)) {
        x.w.error(kNotInteger);
        return;
    }
    if (by == INT64_MIN) {
        x.w.error("ERR decrement would overflow");
        return;
    }
    incrBy(x, x.arg(1), -by);
}

void cmdIncrbyfloat(Ctx& x) {
    long double by = 0;
    if (!parseLongDouble(x.arg(2), by)) {
        x.w.error("ERR value is not a valid float");
        return;
    }
    x.onKey(x.arg(1), [&](Shard& s) {
        Entry* e = s.find(x.arg(1), x.now);
        if (wrongType(x, e, ValueType::kString)) { return; }
        long double v = 0;
        if (e != nullptr && !parseLongDouble(e->value(), v)) {
            x.w.error("ERR value is not a valid float");
            return;
        }
        v += by;
        if (std::isnan(v) || std::isinf(v)) {
            x.w.error("ERR increment would produce NaN or Infinity");
            return;
        }
        const std::string text = formatDouble(v);
        s.set(x.arg(1), text, e != nullptr ? e->expireAtMs : 0);
        x.w.bulk(text);
    });
}

void cmdAppend(Ctx& x) {
    x.onKey(x.arg(1), [&](Shard& s) {
        Entry* e = s.find(x.arg(1), x.now);
        if (wrongType(x, e, ValueType::kString)) { return; }
        std::string v = e != nullptr ? std::string(e->value()) : std::string();
        if (v.size() + x.arg(2).size() > static_cast<uint64_t>(x.s.options.limits.maxBulkLength)) {
            x.w.error("ERR string exceeds maximum allowed size (proto-max-bulk-len)");
            return;
        }
        v += x.arg(2);
        s.set(x.arg(1), v, e != nullptr ? e->expireAtMs : 0);
        x.w.integer(static_cast<int64_t>(v.size()));
    });
}

void cmdGetrange(Ctx& x) {
    int64_t start = 0, end = 0;
    if (!parseInt64(x.arg(2), start) || !parseInt64(x.arg(3), end)) {
        x.w.error(kNotInteger);
        return;
    }
    x.onKey(x.arg(1), [&](Shard& s) {
        Entry* e = s.find(x.arg(1), x.now);
        if (wrongType(x, e, ValueType::kString)) { return; }
        const auto len = static_cast<int64_t>(e != nullptr ? e->value().size() : 0);
        int64_t a = start, b = end;
        if (a < 0 && b < 0 && a > b) {
            x.w.bulk("");
            return;
        }
        if (a < 0) { a = len + a; }
        if (b < 0) { b = len + b; }
        if (a < 0) { a = 0; }
        if (b < 0) { b = 0; }
        if (b >= len) { b = len - 1; }
        if (len == 0 || a > b) {
            x.w.bulk("");
            return;
        }
        x.w.bulk(std::string_view(e->value()).substr(static_cast<size_t>(a), static_cast<size_t>(b - a + 1)));
    });
}

void cmdSetrange(Ctx& x) {
    int64_t offset = 0;
    if (!parseInt64(x.arg(2), offset)) {
        x.w.error(kNotInteger);
        return;
    }
    if (offset < 0) {
        x.w.error("ERR offset is out of range");
        return;
    }
    const std::string_view value = x.arg(3);
    if (static_cast<uint64_t>(offset) + value.size() > static_cast<uint64_t>(x.s.options.limits.maxBulkLength)) {
        x.w.error("ERR string exceeds maximum allowed size (proto-max-bulk-len)");
        return;
    }
    x.onKey(x.arg(1), [&](Shard& s) {
        Entry* e = s.find(x.arg(1), x.now);
        if (wrongType(x, e, ValueType::kString)) { return; }
        if (value.empty()) {
            x.w.integer(e != nullptr ? static_cast<int64_t>(e->value().size()) : 0);
            return;
        }
        std::string v = e != nullptr ? std::string(e->value()) : std::string();
        const auto off = static_cast<size_t>(offset);
        if (v.size() < off + value.size()) { v.resize(off + value.size(), '\0'); }
        v.replace(off, value.size(), value);
        s.set(x.arg(1), v, e != nullptr ? e->expireAtMs : 0);
        x.w.integer(static_cast<int64_t>(v.size()));
    });
}

// ---- multi-key commands ----
//
// MGET, MSET, MSETNX, DEL, UNLINK, EXISTS and RENAME may name keys of several shards. Each is one
// transaction in the VLL manner (apps/kv/key_locks.h): its keys are grouped by shard; when more than
// one shard is involved the coordinator (this connection's fiber) first takes the keys on every shard
// (all shards at once; on a conflict, from the first shard that refused on, one shard after another
// in ascending order, waiting for each), then has every shard do its part at once, the last message
// of each releasing its keys. A client therefore sees the whole of an MSET or none of it, whatever it
// reads and in whatever order: a single-key command on a held key waits, an MGET holds its keys
// (shared) across all its shards. All keys on one shard need no locks: one message does it all,
// atomically, on that shard's thread. The keyspace commands (KEYS, SCAN, DBSIZE, RANDOMKEY,
// FLUSHALL, FLUSHDB) are transactions of the same kind over whole shards (key_locks.h, "Whole-shard
// intents"): each holds every shard it visits, shared to read it, exclusive to flush it, so it sees
// or flushes no multi-key command half done.

/// Shards [from, to): the whole of each, as a keyspace command takes them.
struct ShardRange {
    unsigned from = 0;
    unsigned to = 0;
};

/// A multi-key command's keys on one shard (or the whole shard).
struct ShardPart {
    unsigned shard = 0;
    std::vector<size_t> idx;  // argument indexes of its keys
    LockRequest req;          // its distinct keys
    bool held = false;
    uint64_t seq = 0;         // the last record its step appended (0: none)
};

class MultiKey {
public:
    /// The keys at argument indexes from, from + step, ... by shard, in ascending shard order.
    /// `exclusive`: the command writes (its keys are held exclusively).
    MultiKey(Ctx& x, size_t from, size_t step, bool exclusive) : x_(x), exclusive_(exclusive) {
        for (size_t i = from; i < x.argc(); i += step) { add(x.s.shardOf(x.arg(i)), i); }
        finishParts();
    }
    /// Explicit (shard, argument index) pairs (RENAME).
    MultiKey(Ctx& x, std::initializer_list<size_t> keyArgs, bool exclusive) : x_(x), exclusive_(exclusive) {
        for (size_t i : keyArgs) { add(x.s.shardOf(x.arg(i)), i); }
        finishParts();
    }
    /// The whole of every shard in `range` (KEYS, SCAN, DBSIZE, RANDOMKEY, FLUSHALL): a shared hold
    /// waits for the multi-key writers on the shard and holds off every write; an exclusive one waits
    /// for every hold and holds off every command on it.
    MultiKey(Ctx& x, ShardRange range, bool exclusive) : x_(x), exclusive_(exclusive) {
        for (unsigned i = range.from; i < range.to; ++i) {
            parts_.push_back(std::make_unique<ShardPart>());
            parts_.back()->shard = i;
            parts_.back()->req.exclusive = exclusive;
            parts_.back()->req.wholeShard = true;
        }
        finishParts();
    }
    MultiKey(const MultiKey&) = delete;
    MultiKey& operator=(const MultiKey&) = delete;
    ~MultiKey() { SPINDLE_CHECK_MSG(!locked_ || x_.broken, "a multi-key command left its keys held"); }

    [[nodiscard]] size_t shardCount() const noexcept { return parts_.size(); }

    /// Takes the keys on every shard (nothing to do for one shard unless `always`). False when a
    /// shard could not be reached. A write whose shard's log has failed is refused after this by
    /// finish(), before any shard changes anything.
    bool lock(bool always = false) {
        if (parts_.size() == 1 && !always) { return true; }
        locked_ = true;
        x_.fanOut(parts_.size(), shards_.data(), [&](size_t i) {
            ShardPart& p = *parts_[i];
            p.held = x_.s.locks[p.shard]->tryLock(p.req);
        });
        if (x_.broken) { return false; }
        if (std::all_of(parts_.begin(), parts_.end(), [](const auto& p) { return p->held; })) { return true; }
        // Contention: let go, then in ascending shard order, waiting for each (no cycle of waits).
        x_.fanOut(parts_.size(), shards_.data(), [&](size_t i) {
            ShardPart& p = *parts_[i];
            if (p.held) { x_.s.locks[p.shard]->unlock(p.req); }
            p.held = false;
        });
        for (auto& part : parts_) {
            ShardPart& p = *part;
            bool now = false;
            p.req.granted.reset();
            if (!x_.s.rt->runOnCarrier(p.shard, [&]() noexcept { now = x_.s.locks[p.shard]->lockOrQueue(p.req); })) {
                x_.broken = true;
                return false;
            }
            if (!now) { (void)p.req.granted.wait(); }
            p.held = true;
        }
        return true;
    }

    /// Runs fn(part, shard) on every shard at once with the keys held (a step that decides, such as
    /// MSETNX's existence check). Precondition: lock(true) succeeded.
    template <class F>
    bool run(F&& fn) {
        return x_.fanOut(parts_.size(), shards_.data(), [&](size_t i) { fn(*parts_[i], *x_.s.shards[parts_[i]->shard]); });
    }

    /// The last step: runs fn(part, shard) on every shard at once and releases the keys there. With
    /// one shard and no locks taken, the keys may be held by another command: then it waits for that
    /// one and goes again. For a write, returns false after answering MISCONF, with nothing changed,
    /// when a shard's log has failed; otherwise each shard's records are noted so that the reply waits
    /// for them (appendfsync always).
    template <class F>
    bool finish(F&& fn) {
        const bool write = (x_.cmd.flags & kWrite) != 0;
        int failed = 0;
        if (write) {
            for (const auto& p : parts_) {
                const ShardLog* log = x_.s.shards[p->shard]->log();
                if (failed == 0 && log != nullptr) { failed = log->failed(); }
            }
        }
        const size_t replyOffset = x_.w.buffer().size();
        if (!locked_) {
            ShardPart& p = *parts_.front();
            Shard& shard = *x_.s.shards[p.shard];
            KeyLocks& locks = *x_.s.locks[p.shard];
            for (;;) {
                bool blocked = false;
                FiberFuture unlocked;
                if (!x_.s.rt->runOnCarrier(p.shard, [&]() noexcept {
                        if (!locks.idle() && locks.blocked(p.req)) {
                            locks.waitForUnlock(unlocked);
                            blocked = true;
                            return;
                        }
                        if (failed != 0 || (write && shard.log() != nullptr && (failed = shard.log()->failed()) != 0)) {
                            return;
                        }
                        const uint64_t before = shard.lastSeq();
                        fn(p, shard);
                        if (shard.lastSeq() != before) { p.seq = shard.lastSeq(); }
                    })) {
                    x_.broken = true;
                    return false;
                }
                if (!blocked) { break; }
                (void)unlocked.wait();
            }
        } else {
            x_.fanOut(parts_.size(), shards_.data(), [&](size_t i) {
                ShardPart& p = *parts_[i];
                Shard& shard = *x_.s.shards[p.shard];
                if (failed == 0) {
                    const uint64_t before = shard.lastSeq();
                    fn(p, shard);
                    if (shard.lastSeq() != before) { p.seq = shard.lastSeq(); }
                }
                x_.s.locks[p.shard]->unlock(p.req);
                p.held = false;
            });
            locked_ = false;
        }
        if (x_.broken) { return false; }
        if (failed != 0) {
            x_.w.error(misconf(failed));
            return false;
        }
        for (const auto& part : parts_) {
            const ShardPart& p = *part;
            const ShardLog* log = x_.s.shards[p.shard]->log();
            if (p.seq != 0 && log != nullptr && log->mode() == Fsync::kAlways) {
                x_.marks.push_back(Mark{replyOffset, p.shard, p.seq});
            }
        }
        return true;
    }

    /// Releases the keys without a last step (a command that found it has nothing to do).
    bool release() {
        if (!locked_) { return true; }
        return finish([](ShardPart&, Shard&) {});
    }

private:
    void add(unsigned shard, size_t argIndex) {
        auto it = std::find_if(parts_.begin(), parts_.end(), [&](const auto& p) { return p->shard == shard; });
        if (it == parts_.end()) {
            parts_.push_back(std::make_unique<ShardPart>());
            it = parts_.end() - 1;
            (*it)->shard = shard;
            (*it)->req.exclusive = exclusive_;
        }
        ShardPart& p = **it;
        p.idx.push_back(argIndex);
        const std::string_view key = x_.arg(argIndex);
        if (std::find(p.req.keys.begin(), p.req.keys.end(), key) == p.req.keys.end()) { p.req.keys.push_back(key); }
    }
    void finishParts() {
        std::sort(parts_.begin(), parts_.end(), [](const auto& a, const auto& b) { return a->shard < b->shard; });
        for (const auto& p : parts_) { shards_.push_back(p->shard); }
    }

    Ctx& x_;
    bool exclusive_;
    bool locked_ = false;
    std::vector<std::unique_ptr<ShardPart>> parts_;  // ascending shard order
    std::vector<unsigned> shards_;
};

void cmdMget(Ctx& x) {
    std::vector<std::optional<std::string>> values(x.argc() - 1);
    MultiKey mk(x, 1, 1, /*exclusive=*/false);
    if (!mk.lock()) { return; }
    const bool ok = mk.finish([&](ShardPart& p, Shard& s) {
        const int64_t now = x.now;
        for (size_t i : p.idx) {
            Entry* e = s.find(x.arg(i), now);
            if (e != nullptr && e->isString()) { values[i - 1] = e->value(); }
        }
    });
    if (!ok) { return; }
    x.w.arrayHeader(values.size());
    for (const auto& v : values) {
        if (v) {
            x.w.bulk(*v);
        } else {
            x.w.null();
        }
    }
}

void cmdMset(Ctx& x) {
    if (x.argc() % 2 == 0) {
        x.w.error(wrongArgs("mset"));
        return;
    }
    MultiKey mk(x, 1, 2, /*exclusive=*/true);
    if (!mk.lock()) { return; }
    const bool ok = mk.finish([&](ShardPart& p, Shard& s) {
        for (size_t i : p.idx) { s.set(x.arg(i), x.arg(i + 1), 0); }
    });
    if (ok) { x.w.ok(); }
}

// MSETNX: sets every pair only if none of the keys exists (1), else nothing (0); atomic as MSET.
void cmdMsetnx(Ctx& x) {
    if (x.argc() % 2 == 0) {
        x.w.error(wrongArgs("msetnx"));
        return;
    }
    MultiKey mk(x, 1, 2, /*exclusive=*/true);
    if (!mk.lock(/*always=*/mk.shardCount() > 1)) { return; }
    std::atomic<bool> anyExists{false};  // written by several carriers at once
    auto check = [&](ShardPart& p, Shard& s) {
        const int64_t now = x.now;
        for (size_t i : p.idx) {
            if (s.find(x.arg(i), now) != nullptr) { anyExists.store(true, std::memory_order_relaxed); }
        }
    };
    auto apply = [&](ShardPart& p, Shard& s) {
        for (size_t i : p.idx) { s.set(x.arg(i), x.arg(i + 1), 0); }
    };
    bool ok = false;
    if (mk.shardCount() == 1) {  // one message: check and set
        ok = mk.finish([&](ShardPart& p, Shard& s) {
            check(p, s);
            if (!anyExists.load(std::memory_order_relaxed)) { apply(p, s); }
        });
    } else {
        if (!mk.run(check)) { return; }
        ok = mk.finish([&](ShardPart& p, Shard& s) {
            if (!anyExists.load(std::memory_order_relaxed)) { apply(p, s); }
        });
    }
    if (ok) { x.w.integer(anyExists.load() ? 0 : 1); }
}

// DEL, UNLINK, EXISTS: a count over every key (EXISTS counts a key named twice twice, as Redis).
void countKeys(Ctx& x, bool remove) {
    std::atomic<int64_t> count{0};
    MultiKey mk(x, 1, 1, /*exclusive=*/remove);
    if (!mk.lock()) { return; }
    const bool ok = mk.finish([&](ShardPart& p, Shard& s) {
        const int64_t now = x.now;
        int64_t n = 0;
        for (size_t i : p.idx) {
            if (remove) {
                if (s.find(x.arg(i), now) != nullptr && s.del(x.arg(i))) { ++n; }
            } else if (s.find(x.arg(i), now) != nullptr) {
                ++n;
            }
        }
        count.fetch_add(n, std::memory_order_relaxed);
    });
    if (ok) { x.w.integer(count.load()); }
}
void cmdDel(Ctx& x) { countKeys(x, true); }
void cmdExists(Ctx& x) { countKeys(x, false); }

// RENAME key newkey / RENAMENX: the value, its type and its TTL move; the two keys may live on
// different shards (then the source's shard copies the entry out, and the two shards delete and
// restore at once, with both keys held, so no client sees the key in both places or in neither).
void renameGeneric(Ctx& x, bool nx) {
    const std::string_view from = x.arg(1), to = x.arg(2);
    MultiKey mk(x, {1, 2}, /*exclusive=*/true);
    if (mk.shardCount() == 1) {
        int result = 0;  // -1: no such key; 0: NX and the target exists; 1: done
        const bool ok = mk.finish([&](ShardPart&, Shard& s) {
            const int64_t now = x.now;
            Entry* e = s.find(from, now);
            if (e == nullptr) {
                result = -1;
                return;
            }
            if (from == to) {  // Redis: OK, or 0 for RENAMENX
                result = nx ? 0 : 1;
                return;
            }
            if (nx && s.find(to, now) != nullptr) { return; }
            result = 1;
            Detached moved = e->clone();
            s.restore(to, std::move(moved));
            (void)s.del(from);
        });
        if (!ok) { return; }
        if (result < 0) {
            x.w.error("ERR no such key");
        } else if (nx) {
            x.w.integer(result);
        } else {
            x.w.ok();
        }
        return;
    }
    if (!mk.lock(true)) { return; }
    const unsigned fromShard = x.s.shardOf(from);
    std::optional<Detached> moved;
    bool targetExists = false;
    if (!mk.run([&](ShardPart& p, Shard& s) {
            const int64_t now = x.now;
            if (p.shard == fromShard) {
                if (Entry* e = s.find(from, now)) { moved = e->clone(); }
            } else {
                targetExists = s.find(to, now) != nullptr;
            }
        })) {
        return;
    }
    const bool go = moved.has_value() && !(nx && targetExists);
    const bool ok = mk.finish([&](ShardPart& p, Shard& s) {
        if (!go) { return; }
        if (p.shard == fromShard) {
            (void)s.del(from);
        } else {
            s.restore(to, std::move(*moved));
        }
    });
    if (!ok) { return; }
    if (!moved) {
        x.w.error("ERR no such key");
    } else if (nx) {
        x.w.integer(go ? 1 : 0);
    } else {
        x.w.ok();
    }
}
void cmdRename(Ctx& x) { renameGeneric(x, false); }
void cmdRenamenx(Ctx& x) { renameGeneric(x, true); }


// ---- expiry ----

// EXPIRE/PEXPIRE/EXPIREAT/PEXPIREAT key t [NX|XX|GT|LT]
void expireGeneric(Ctx& x, bool millis, bool absolute, const char* name) {
    int64_t v = 0;
    if (!parseInt64(x.arg(2), v)) {
        x.w.error(kNotInteger);
        return;
    }
    bool nx = false, xx = false, gt = false, lt = false;
    for (size_t i = 3; i < x.argc(); ++i) {
        std::string opt;
        toLower(x.arg(i), opt);
        if (opt == "nx") {
            nx = true;
        } else if (opt == "xx") {
            xx = true;
        } else if (opt == "gt") {
            gt = true;
        } else if (opt == "lt") {
            lt = true;
        } else {
            x.w.error(fmt::format("ERR Unsupported option {}", x.arg(i)));
            return;
        }
    }
    if (nx && (xx || gt || lt)) {
        x.w.error("ERR NX and XX, GT or LT options at the same time are not compatible");
        return;
    }
    if (gt && lt) {
        x.w.error("ERR GT and LT options at the same time are not compatible");
        return;
    }
    const int64_t now = x.now;
    int64_t at = v;
    if (!millis) {
        if (at > INT64_MAX / 1000 || at < INT64_MIN / 1000) {
            x.w.error(fmt::format("ERR invalid expire time in '{}' command", name));
            return;
        }
        at *= 1000;
    }
    if (!absolute) {
        if ((at > 0 && now > INT64_MAX - at)) {
            x.w.error(fmt::format("ERR invalid expire time in '{}' command", name));
            return;
        }
        at += now;
    }
    x.onKey(x.arg(1), [&](Shard& s) {
        Entry* e = s.find(x.arg(1), now);
        if (e == nullptr) {
            x.w.integer(0);
            return;
        }
        const int64_t cur = e->expireAtMs;  // 0: none, which GT treats as infinite
        if ((nx && cur != 0) || (xx && cur == 0) || (gt && (cur == 0 || at <= cur)) || (lt && cur != 0 && at >= cur)) {
            x.w.integer(0);
            return;
        }
        if (at <= now) {
            (void)s.del(x.arg(1));
        } else {
            s.expireAt(x.arg(1), at);
        }
        x.w.integer(1);
    });
}
void cmdExpire(Ctx& x) { expireGeneric(x, false, false, "expire"); }
void cmdPexpire(Ctx& x) { expireGeneric(x, true, false, "pexpire"); }
void cmdExpireat(Ctx& x) { expireGeneric(x, false, true, "expireat"); }
void cmdPexpireat(Ctx& x) { expireGeneric(x, true, true, "pexpireat"); }

void ttlGeneric(Ctx& x, bool millis) {
    x.onKey(x.arg(1), [&](Shard& s) {
        const int64_t now = x.now;
        Entry* e = s.find(x.arg(1), now);
        if (e == nullptr) {
            x.w.integer(-2);
        } else if (e->expireAtMs == 0) {
            x.w.integer(-1);
        } else {
            const int64_t left = std::max<int64_t>(e->expireAtMs - now, 0);
            x.w.integer(millis ? left : (left + 500) / 1000);
        }
    });
}
void cmdTtl(Ctx& x) { ttlGeneric(x, false); }
void cmdPttl(Ctx& x) { ttlGeneric(x, true); }

void expireTimeGeneric(Ctx& x, bool millis) {
    x.onKey(x.arg(1), [&](Shard& s) {
        Entry* e = s.find(x.arg(1), x.now);
        if (e == nullptr) {
            x.w.integer(-2);
        } else if (e->expireAtMs == 0) {
            x.w.integer(-1);
        } else {
            x.w.integer(millis ? e->expireAtMs : e->expireAtMs / 1000);
        }
    });
}
void cmdExpiretime(Ctx& x) { expireTimeGeneric(x, false); }
void cmdPexpiretime(Ctx& x) { expireTimeGeneric(x, true); }

void cmdPersist(Ctx& x) {
    x.onKey(x.arg(1), [&](Shard& s) {
        const bool had = s.find(x.arg(1), x.now) != nullptr && s.persist(x.arg(1));
        x.w.integer(had ? 1 : 0);
    });
}

void cmdType(Ctx& x) {
    x.onKey(x.arg(1), [&](Shard& s) {
        const Entry* e = s.find(x.arg(1), x.now);
        x.w.simple(e != nullptr ? typeName(e->type()) : "none");
    });
}

// ---- hashes ----

// Args [from, argc) as one span (the fields or members of a command).
std::span<const std::string_view> argsFrom(Ctx& x, size_t from) { return std::span(x.args).subspan(from); }

void cmdHset(Ctx& x) {
    if (x.argc() % 2 != 0) {
        x.w.error(wrongArgs(x.cmd.name));
        return;
    }
    const bool hmset = x.cmd.name[1] == 'm';
    x.onKey(x.arg(1), [&](Shard& s) {
        if (wrongType(x, s.find(x.arg(1), x.now), ValueType::kHash)) { return; }
        const int64_t added = s.hset(x.arg(1), argsFrom(x, 2));
        if (hmset) {
            x.w.ok();
        } else {
            x.w.integer(added);
        }
    });
}

void cmdHsetnx(Ctx& x) {
    x.onKey(x.arg(1), [&](Shard& s) {
        Entry* e = s.find(x.arg(1), x.now);
        if (wrongType(x, e, ValueType::kHash)) { return; }
        if (e != nullptr && e->hash().contains(x.arg(2))) {
            x.w.integer(0);
            return;
        }
        (void)s.hset(x.arg(1), argsFrom(x, 2));
        x.w.integer(1);
    });
}

void cmdHget(Ctx& x) {
    x.onKey(x.arg(1), [&](Shard& s) {
        Entry* e = s.find(x.arg(1), x.now);
        if (wrongType(x, e, ValueType::kHash)) { return; }
        if (e == nullptr) {
            x.w.null();
            return;
        }
        auto it = e->hash().find(x.arg(2));
        if (it != e->hash().end()) {
            x.w.bulk(it->second);
        } else {
            x.w.null();
        }
    });
}

void cmdHmget(Ctx& x) {
    x.onKey(x.arg(1), [&](Shard& s) {
        Entry* e = s.find(x.arg(1), x.now);
        if (wrongType(x, e, ValueType::kHash)) { return; }
        x.w.arrayHeader(x.argc() - 2);
        for (size_t i = 2; i < x.argc(); ++i) {
            auto it = e != nullptr ? e->hash().find(x.arg(i)) : HashValue::iterator{};
            if (e != nullptr && it != e->hash().end()) {
                x.w.bulk(it->second);
            } else {
                x.w.null();
            }
        }
    });
}

void cmdHdel(Ctx& x) {
    x.onKey(x.arg(1), [&](Shard& s) {
        Entry* e = s.find(x.arg(1), x.now);
        if (wrongType(x, e, ValueType::kHash)) { return; }
        x.w.integer(e != nullptr ? s.hdel(x.arg(1), argsFrom(x, 2)) : 0);
    });
}

// HGETALL (both), HKEYS (keys), HVALS (values): a map under RESP3 for HGETALL, as Redis 7 answers.
void hashListing(Ctx& x, bool keys, bool values) {
    x.onKey(x.arg(1), [&](Shard& s) {
        Entry* e = s.find(x.arg(1), x.now);
        if (wrongType(x, e, ValueType::kHash)) { return; }
        const size_t n = e != nullptr ? e->hash().size() : 0;
        if (keys && values) {
            x.w.mapHeader(n);
        } else {
            x.w.arrayHeader(n);
        }
        if (e == nullptr) { return; }
        for (const auto& [f, v] : e->hash()) {
            if (keys) { x.w.bulk(f); }
            if (values) { x.w.bulk(v); }
        }
    });
}
void cmdHgetall(Ctx& x) { hashListing(x, true, true); }
void cmdHkeys(Ctx& x) { hashListing(x, true, false); }
void cmdHvals(Ctx& x) { hashListing(x, false, true); }

void cmdHlen(Ctx& x) {
    x.onKey(x.arg(1), [&](Shard& s) {
        Entry* e = s.find(x.arg(1), x.now);
        if (wrongType(x, e, ValueType::kHash)) { return; }
        x.w.integer(e != nullptr ? static_cast<int64_t>(e->hash().size()) : 0);
    });
}

void cmdHexists(Ctx& x) {
    x.onKey(x.arg(1), [&](Shard& s) {
        Entry* e = s.find(x.arg(1), x.now);
        if (wrongType(x, e, ValueType::kHash)) { return; }
        x.w.integer(e != nullptr && e->hash().contains(x.arg(2)) ? 1 : 0);
    });
}

void cmdHstrlen(Ctx& x) {
    x.onKey(x.arg(1), [&](Shard& s) {
        Entry* e = s.find(x.arg(1), x.now);
        if (wrongType(x, e, ValueType::kHash)) { return; }
        auto it = e != nullptr ? e->hash().find(x.arg(2)) : HashValue::iterator{};
        x.w.integer(e != nullptr && it != e->hash().end() ? static_cast<int64_t>(it->second.size()) : 0);
    });
}

void cmdHincrby(Ctx& x) {
    int64_t by = 0;
    if (!parseInt64(x.arg(3), by)) {
        x.w.error(kNotInteger);
        return;
    }
    x.onKey(x.arg(1), [&](Shard& s) {
        Entry* e = s.find(x.arg(1), x.now);
        if (wrongType(x, e, ValueType::kHash)) { return; }
        int64_t v = 0;
        if (e != nullptr) {
            auto it = e->hash().find(x.arg(2));
            if (it != e->hash().end() && !parseInt64(it->second, v)) {
                x.w.error("ERR hash value is not an integer");
                return;
            }
        }
        if ((by > 0 && v > INT64_MAX - by) || (by < 0 && v < INT64_MIN - by)) {
            x.w.error("ERR increment or decrement would overflow");
            return;
        }
        v += by;
        const std::string text = std::to_string(v);
        const std::array<std::string_view, 2> pair{x.arg(2), text};
        (void)s.hset(x.arg(1), pair);
        x.w.integer(v);
    });
}

// ---- lists ----

void pushGeneric(Ctx& x, bool left, bool onlyExisting) {
    x.onKey(x.arg(1), [&](Shard& s) {
        Entry* e = s.find(x.arg(1), x.now);
        if (wrongType(x, e, ValueType::kList)) { return; }
        if (onlyExisting && e == nullptr) {
            x.w.integer(0);
            return;
        }
        x.w.integer(s.push(x.arg(1), left, argsFrom(x, 2)));
    });
}
void cmdLpush(Ctx& x) { pushGeneric(x, true, false); }
void cmdRpush(Ctx& x) { pushGeneric(x, false, false); }
void cmdLpushx(Ctx& x) { pushGeneric(x, true, true); }
void cmdRpushx(Ctx& x) { pushGeneric(x, false, true); }

// LPOP/RPOP key [count]: one bulk without a count, an array with one (a null array for no key).
void popGeneric(Ctx& x, bool left) {
    if (x.argc() > 3) {
        x.w.error(wrongArgs(x.cmd.name));
        return;
    }
    const bool hasCount = x.argc() == 3;
    int64_t count = 1;
    if (hasCount && (!parseInt64(x.arg(2), count) || count < 0)) {
        x.w.error("ERR value is out of range, must be positive");  // Redis's text for both
        return;
    }
    x.onKey(x.arg(1), [&](Shard& s) {
        Entry* e = s.find(x.arg(1), x.now);
        if (e == nullptr) {
            if (hasCount) {
                x.w.nullArray();
            } else {
                x.w.null();
            }
            return;
        }
        if (wrongType(x, e, ValueType::kList)) { return; }
        if (hasCount && count == 0) {
            x.w.arrayHeader(0);
            return;
        }
        const std::vector<std::string> got = s.pop(x.arg(1), left, static_cast<size_t>(count));
        if (!hasCount) {
            x.w.bulk(got.front());
            return;
        }
        x.w.arrayHeader(got.size());
        for (const std::string& v : got) { x.w.bulk(v); }
    });
}
void cmdLpop(Ctx& x) { popGeneric(x, true); }
void cmdRpop(Ctx& x) { popGeneric(x, false); }

void cmdLlen(Ctx& x) {
    x.onKey(x.arg(1), [&](Shard& s) {
        Entry* e = s.find(x.arg(1), x.now);
        if (wrongType(x, e, ValueType::kList)) { return; }
        x.w.integer(e != nullptr ? static_cast<int64_t>(e->list().size()) : 0);
    });
}

void cmdLindex(Ctx& x) {
    int64_t index = 0;
    if (!parseInt64(x.arg(2), index)) {
        x.w.error(kNotInteger);
        return;
    }
    x.onKey(x.arg(1), [&](Shard& s) {
        Entry* e = s.find(x.arg(1), x.now);
        if (wrongType(x, e, ValueType::kList)) { return; }
        const auto len = static_cast<int64_t>(e != nullptr ? e->list().size() : 0);
        const int64_t i = index < 0 ? len + index : index;
        if (e == nullptr || i < 0 || i >= len) {
            x.w.null();
        } else {
            x.w.bulk(e->list()[static_cast<size_t>(i)]);
        }
    });
}

void cmdLrange(Ctx& x) {
    int64_t start = 0, end = 0;
    if (!parseInt64(x.arg(2), start) || !parseInt64(x.arg(3), end)) {
        x.w.error(kNotInteger);
        return;
    }
    x.onKey(x.arg(1), [&](Shard& s) {
        Entry* e = s.find(x.arg(1), x.now);
        if (wrongType(x, e, ValueType::kList)) { return; }
        const auto len = static_cast<int64_t>(e != nullptr ? e->list().size() : 0);
        // Redis's listRange: negative from the end, clamped; an empty range when start passes the end.
        int64_t a = start < 0 ? len + start : start, b = end < 0 ? len + end : end;
        if (a < 0) { a = 0; }
        if (a > b || a >= len) {
            x.w.arrayHeader(0);
            return;
        }
        if (b >= len) { b = len - 1; }
        x.w.arrayHeader(static_cast<size_t>(b - a + 1));
        const ListValue& l = e->list();
        for (auto it = l.begin() + a, last = l.begin() + b + 1; it != last; ++it) { x.w.bulk(*it); }
    });
}

// ---- sets ----

void cmdSadd(Ctx& x) {
    x.onKey(x.arg(1), [&](Shard& s) {
        if (wrongType(x, s.find(x.arg(1), x.now), ValueType::kSet)) { return; }
        x.w.integer(s.sadd(x.arg(1), argsFrom(x, 2)));
    });
}

void cmdSrem(Ctx& x) {
    x.onKey(x.arg(1), [&](Shard& s) {
        Entry* e = s.find(x.arg(1), x.now);
        if (wrongType(x, e, ValueType::kSet)) { return; }
        x.w.integer(e != nullptr ? s.srem(x.arg(1), argsFrom(x, 2)) : 0);
    });
}

// SMEMBERS: a set under RESP3, as Redis 7 answers.
void cmdSmembers(Ctx& x) {
    x.onKey(x.arg(1), [&](Shard& s) {
        Entry* e = s.find(x.arg(1), x.now);
        if (wrongType(x, e, ValueType::kSet)) { return; }
        x.w.setHeader(e != nullptr ? e->set().size() : 0);
        if (e == nullptr) { return; }
        for (const std::string& m : e->set()) { x.w.bulk(m); }
    });
}

void cmdSismember(Ctx& x) {
    x.onKey(x.arg(1), [&](Shard& s) {
        Entry* e = s.find(x.arg(1), x.now);
        if (wrongType(x, e, ValueType::kSet)) { return; }
        x.w.integer(e != nullptr && e->set().contains(x.arg(2)) ? 1 : 0);
    });
}

void cmdScard(Ctx& x) {
    x.onKey(x.arg(1), [&](Shard& s) {
        Entry* e = s.find(x.arg(1), x.now);
        if (wrongType(x, e, ValueType::kSet)) { return; }
        x.w.integer(e != nullptr ? static_cast<int64_t>(e->set().size()) : 0);
    });
}

// SCAN cursor [MATCH pattern] [COUNT n] [TYPE type]. The cursor is (shard << 54) | the shard's own
// position (Shard::scan: the top bits of the hash to go on from), so a scan walks the shards one after
// another and returns every key present for the whole scan once (more than once only across a FLUSHALL).
constexpr int kScanShardShift = 54;
static_assert(Shard::kScanPositionBits + 14 == kScanShardShift, "a shard's scan position fits below the shard");

void cmdScan(Ctx& x) {
    // The cursor parses as Redis's (strtoul: an optional sign, base 10, no trailing bytes).
    const std::string text(x.arg(1));
    char* end = nullptr;
    errno = 0;
    const uint64_t cursor = std::strtoull(text.c_str(), &end, 10);
    if (text.empty() || std::isspace(static_cast<unsigned char>(text[0])) != 0 || *end != '\0' || errno == ERANGE) {
        x.w.error("ERR invalid cursor");
        return;
    }
    std::string_view pattern;
    bool havePattern = false, haveType = false;
    std::string type;
    int64_t count = 10;
    for (size_t i = 2; i < x.argc(); i += 2) {
        std::string opt;
        toLower(x.arg(i), opt);
        if (i + 1 >= x.argc()) {
            x.w.error(kSyntax);
            return;
        }
        if (opt == "count") {
            if (!parseInt64(x.arg(i + 1), count)) {
                x.w.error(kNotInteger);
                return;
            }
            if (count < 1) {
                x.w.error(kSyntax);
                return;
            }
        } else if (opt == "match") {
            pattern = x.arg(i + 1);
            havePattern = !(pattern.size() == 1 && pattern[0] == '*');
        } else if (opt == "type") {
            toLower(x.arg(i + 1), type);
            haveType = true;
        } else {
            x.w.error(kSyntax);
            return;
        }
    }
    uint64_t shard = cursor >> kScanShardShift;
    uint64_t pos = cursor & ((uint64_t{1} << kScanShardShift) - 1);
    std::vector<std::string> keys;
    uint64_t next = 0;
    if (shard < x.s.shards.size()) {  // a cursor past the last shard ends the scan, as Redis's does
        // The shard held (shared), so that a scan that follows a read of another shard sees every
        // multi-key command that read saw. Taken, not waited for at the step: a scan conflicts with
        // every multi-key writer on the shard, and in the queue they cannot starve it.
        const auto index = static_cast<unsigned>(shard);
        MultiKey mk(x, ShardRange{index, index + 1}, /*exclusive=*/false);
        if (!mk.lock(/*always=*/x.s.shards.size() > 1)) { return; }
        const bool ok = mk.finish([&](ShardPart&, Shard& s) {
            pos = s.scan(pos, static_cast<size_t>(std::min<int64_t>(count, 1 << 20)), x.now,
                         [&](std::string_view key, const Entry& e) {
                             if (havePattern && !globMatch(pattern, key)) { return; }
                             if (haveType && type != typeName(e.type())) { return; }
                             keys.emplace_back(key);
                         });
        });
        if (!ok) { return; }
        if (pos != 0) {
            next = (shard << kScanShardShift) | pos;
        } else if (shard + 1 < x.s.shards.size()) {
            next = (shard + 1) << kScanShardShift;
        }
    }
    x.w.arrayHeader(2);
    x.w.bulk(std::to_string(next));
    x.w.arrayHeader(keys.size());
    for (const std::string& k : keys) { x.w.bulk(k); }
}

// Every shard, whole (the keyspace commands).
ShardRange everyShard(const Ctx& x) { return ShardRange{0, static_cast<unsigned>(x.s.shards.size())}; }

// RANDOMKEY: a shard chosen at random in proportion to its keys, then a random key of it, with every
// shard held (shared): the counts then move only by expiry (hence the few attempts), and no
// multi-key command is half done.
void cmdRandomkey(Ctx& x) {
    static thread_local std::mt19937_64 rng{std::random_device{}()};
    const size_t n = x.s.shards.size();
    for (int attempt = 0; attempt < 4; ++attempt) {
        MultiKey mk(x, everyShard(x), /*exclusive=*/false);
        if (!mk.lock()) { return; }
        uint64_t total = 0;
        for (const auto& sh : x.s.shards) { total += sh->keyCount(); }
        unsigned shard = static_cast<unsigned>(n);  // none
        if (total > 0) {
            uint64_t pick = rng() % total;
            for (shard = 0; shard + 1 < n && pick >= x.s.shards[shard]->keyCount(); ++shard) {
                pick -= x.s.shards[shard]->keyCount();
            }
        }
        std::string key;
        bool found = false;
        const uint64_t seed = rng();
        if (!mk.finish([&](ShardPart& p, Shard& s) {
                if (p.shard == shard) { found = s.randomKey(x.now, seed, key); }
            })) {
            return;
        }
        if (found) {
            x.w.bulk(key);
            return;
        }
        if (total == 0) { break; }
    }
    x.w.null();
}

// KEYS pattern: every shard's matching keys (in no particular order, as in Redis).
void cmdKeys(Ctx& x) {
    const std::string_view pattern = x.arg(1);
    const bool all = pattern == "*";
    std::vector<std::vector<std::string>> keys(x.s.shards.size());  // by shard: the shards go at once
    MultiKey mk(x, everyShard(x), /*exclusive=*/false);
    if (!mk.lock()) { return; }
    const bool ok = mk.finish([&](ShardPart& p, Shard& s) {
        s.forEachKey(x.now, [&](std::string_view key) {
            if (all || globMatch(pattern, key)) { keys[p.shard].emplace_back(key); }
            return true;
        });
    });
    if (!ok) { return; }
    size_t count = 0;
    for (const auto& k : keys) { count += k.size(); }
    x.w.arrayHeader(count);
    for (const auto& shardKeys : keys) {
        for (const std::string& k : shardKeys) { x.w.bulk(k); }
    }
}

// DBSIZE: the shards' key counts, every shard held (shared).
void cmdDbsize(Ctx& x) {
    std::atomic<uint64_t> keys{0};  // added to by several carriers at once
    MultiKey mk(x, everyShard(x), /*exclusive=*/false);
    if (!mk.lock()) { return; }
    if (mk.finish([&](ShardPart&, Shard& s) { keys.fetch_add(s.keyCount(), std::memory_order_relaxed); })) {
        x.w.integer(static_cast<int64_t>(keys.load()));
    }
}

// FLUSHALL, FLUSHDB [SYNC|ASYNC]: every shard emptied with every shard held (exclusive), so that no
// multi-key command is half flushed. A failed log on any shard: MISCONF, and nothing is flushed.
void cmdFlush(Ctx& x) {
    if (x.argc() > 2) {
        x.w.error(kSyntax);
        return;
    }
    if (x.argc() == 2) {
        std::string mode;
        toLower(x.arg(1), mode);
        if (mode != "sync" && mode != "async") {
            x.w.error(kSyntax);
            return;
        }
    }
    MultiKey mk(x, everyShard(x), /*exclusive=*/true);
    if (!mk.lock()) { return; }
    if (mk.finish([](ShardPart&, Shard& s) { s.flush(); })) { x.w.ok(); }
}

// The command table, sorted by name (COMMAND lists it in this order; findCommand looks names up through
// kCommandIndex below). Arity and key positions as Redis declares them.
constexpr Command kCommands[] = {
    {"append", 3, kWrite | kDenyOom, 1, 1, 1, cmdAppend},
    {"auth", -2, kNoAuth, 0, 0, 0, cmdAuth},
    {"bgrewriteaof", 1, 0, 0, 0, 0, cmdBgrewriteaof},
    {"client", -2, 0, 0, 0, 0, cmdClient},
    {"command", -1, 0, 0, 0, 0, cmdCommand},
    {"config", -2, 0, 0, 0, 0, cmdConfig},
    {"dbsize", 1, kReadonly, 0, 0, 0, cmdDbsize},
    {"decr", 2, kWrite | kDenyOom, 1, 1, 1, cmdDecr},
    {"decrby", 3, kWrite | kDenyOom, 1, 1, 1, cmdDecrby},
    {"del", -2, kWrite, 1, -1, 1, cmdDel},
    {"echo", 2, 0, 0, 0, 0, cmdEcho},
    {"exists", -2, kReadonly, 1, -1, 1, cmdExists},
    {"expire", -3, kWrite, 1, 1, 1, cmdExpire},
    {"expireat", -3, kWrite, 1, 1, 1, cmdExpireat},
    {"expiretime", 2, kReadonly, 1, 1, 1, cmdExpiretime},
    {"flushall", -1, kWrite, 0, 0, 0, cmdFlush},
    {"flushdb", -1, kWrite, 0, 0, 0, cmdFlush},
    {"get", 2, kReadonly, 1, 1, 1, cmdGet},
    {"getdel", 2, kWrite, 1, 1, 1, cmdGetdel},
    {"getex", -2, kWrite, 1, 1, 1, cmdGetex},
    {"getrange", 4, kReadonly, 1, 1, 1, cmdGetrange},
    {"getset", 3, kWrite | kDenyOom, 1, 1, 1, cmdGetset},
    {"hdel", -3, kWrite, 1, 1, 1, cmdHdel},
    {"hello", -1, kNoAuth, 0, 0, 0, cmdHello},
    {"hexists", 3, kReadonly, 1, 1, 1, cmdHexists},
    {"hget", 3, kReadonly, 1, 1, 1, cmdHget},
    {"hgetall", 2, kReadonly, 1, 1, 1, cmdHgetall},
    {"hincrby", 4, kWrite | kDenyOom, 1, 1, 1, cmdHincrby},
    {"hkeys", 2, kReadonly, 1, 1, 1, cmdHkeys},
    {"hlen", 2, kReadonly, 1, 1, 1, cmdHlen},
    {"hmget", -3, kReadonly, 1, 1, 1, cmdHmget},
    {"hmset", -4, kWrite | kDenyOom, 1, 1, 1, cmdHset},
    {"hset", -4, kWrite | kDenyOom, 1, 1, 1, cmdHset},
    {"hsetnx", 4, kWrite | kDenyOom, 1, 1, 1, cmdHsetnx},
    {"hstrlen", 3, kReadonly, 1, 1, 1, cmdHstrlen},
    {"hvals", 2, kReadonly, 1, 1, 1, cmdHvals},
    {"incr", 2, kWrite | kDenyOom, 1, 1, 1, cmdIncr},
    {"incrby", 3, kWrite | kDenyOom, 1, 1, 1, cmdIncrby},
    {"incrbyfloat", 3, kWrite | kDenyOom, 1, 1, 1, cmdIncrbyfloat},
    {"info", -1, 0, 0, 0, 0, cmdInfo},
    {"keys", 2, kReadonly, 0, 0, 0, cmdKeys},
    {"lindex", 3, kReadonly, 1, 1, 1, cmdLindex},
    {"llen", 2, kReadonly, 1, 1, 1, cmdLlen},
    {"lpop", -2, kWrite, 1, 1, 1, cmdLpop},
    {"lpush", -3, kWrite | kDenyOom, 1, 1, 1, cmdLpush},
    {"lpushx", -3, kWrite | kDenyOom, 1, 1, 1, cmdLpushx},
    {"lrange", 4, kReadonly, 1, 1, 1, cmdLrange},
    {"mget", -2, kReadonly, 1, -1, 1, cmdMget},
    {"mset", -3, kWrite | kDenyOom, 1, -1, 2, cmdMset},
    {"msetnx", -3, kWrite | kDenyOom, 1, -1, 2, cmdMsetnx},
    {"persist", 2, kWrite, 1, 1, 1, cmdPersist},
    {"pexpire", -3, kWrite, 1, 1, 1, cmdPexpire},
    {"pexpireat", -3, kWrite, 1, 1, 1, cmdPexpireat},
    {"pexpiretime", 2, kReadonly, 1, 1, 1, cmdPexpiretime},
    {"ping", -1, 0, 0, 0, 0, cmdPing},
    {"psetex", 4, kWrite | kDenyOom, 1, 1, 1, cmdPsetex},
    {"pttl", 2, kReadonly, 1, 1, 1, cmdPttl},
    {"quit", -1, kNoAuth, 0, 0, 0, cmdQuit},
    {"randomkey", 1, kReadonly, 0, 0, 0, cmdRandomkey},
    {"rename", 3, kWrite, 1, 2, 1, cmdRename},
    {"renamenx", 3, kWrite, 1, 2, 1, cmdRenamenx},
    {"rpop", -2, kWrite, 1, 1, 1, cmdRpop},
    {"rpush", -3, kWrite | kDenyOom, 1, 1, 1, cmdRpush},
    {"rpushx", -3, kWrite | kDenyOom, 1, 1, 1, cmdRpushx},
    {"sadd", -3, kWrite | kDenyOom, 1, 1, 1, cmdSadd},
    {"save", 1, 0, 0, 0, 0, cmdSave},
    {"scan", -2, kReadonly, 0, 0, 0, cmdScan},
    {"scard", 2, kReadonly, 1, 1, 1, cmdScard},
    {"select", 2, 0, 0, 0, 0, cmdSelect},
    {"set", -3, kWrite | kDenyOom, 1, 1, 1, cmdSet},
    {"setex", 4, kWrite | kDenyOom, 1, 1, 1, cmdSetex},
    {"setnx", 3, kWrite | kDenyOom, 1, 1, 1, cmdSetnx},
    {"setrange", 4, kWrite | kDenyOom, 1, 1, 1, cmdSetrange},
    {"shutdown", -1, 0, 0, 0, 0, cmdShutdown},
    {"sismember", 3, kReadonly, 1, 1, 1, cmdSismember},
    {"smembers", 2, kReadonly, 1, 1, 1, cmdSmembers},
    {"srem", -3, kWrite, 1, 1, 1, cmdSrem},
    {"strlen", 2, kReadonly, 1, 1, 1, cmdStrlen},
    {"ttl", 2, kReadonly, 1, 1, 1, cmdTtl},
    {"type", 2, kReadonly, 1, 1, 1, cmdType},
    {"unlink", -2, kWrite, 1, -1, 1, cmdDel},
};

constexpr bool sortedByName() {
    for (size_t i = 1; i < std::size(kCommands); ++i) {
        if (std::string_view(kCommands[i - 1].name) >= std::string_view(kCommands[i].name)) { return false; }
    }
    return true;
}
static_assert(sortedByName(), "kCommands must stay sorted by name");

// Looking a command up by name, in any case, without lower-casing it into a string first: a name is
// at most 16 letters, so it is two words, read with each byte ORed with 0x20. That maps a letter of
// either case to the lower-case one and no other byte to a letter (nor to 0, the padding), so two
// names' words are equal exactly when the names are, case aside. The words index a table of 256
// slots, built at compile time, probed linearly. Lower-casing into a string and a binary search over
// the 81 names took 1.9 % of spindle-kv's samples at GET -P 16 on one carrier; this takes 0.45 %.
constexpr size_t kMaxCommandName = 16;
constexpr size_t kCommandSlots = 256;  // a power of two, more than three times the commands
constexpr uint8_t kNoCommand = 0xFF;

struct CommandKey {
    uint64_t lo = 0, hi = 0;
    friend constexpr bool operator==(const CommandKey&, const CommandKey&) = default;
};

constexpr CommandKey commandKey(std::string_view name) noexcept {
    CommandKey k;
    for (size_t i = 0; i < name.size(); ++i) {
        const uint64_t b = static_cast<uint8_t>(name[i]) | 0x20u;
        (i < 8 ? k.lo : k.hi) |= b << (8 * (i % 8));
    }
    return k;
}

constexpr size_t commandSlot(const CommandKey& k) noexcept {
    return static_cast<size_t>(((k.lo * 0x9E3779B97F4A7C15ull) ^ (k.hi * 0xC2B2AE3D27D4EB4Full) ^ (k.lo >> 29)) >> 56);
}

constexpr bool lettersOnly() {
    for (const Command& c : kCommands) {
        const std::string_view n = c.name;
        if (n.empty() || n.size() > kMaxCommandName) { return false; }
        for (const char ch : n) {
            if (ch < 'a' || ch > 'z') { return false; }
        }
    }
    return true;
}
static_assert(lettersOnly(), "command names must be 1-16 lower-case letters (commandKey relies on it)");
static_assert(std::size(kCommands) * 3 < kCommandSlots && std::size(kCommands) < kNoCommand);

struct CommandIndex {
    std::array<uint8_t, kCommandSlots> slot{};
    std::array<CommandKey, std::size(kCommands)> key{};
};

constexpr CommandIndex buildCommandIndex() {
    CommandIndex x;
    x.slot.fill(kNoCommand);
    for (size_t i = 0; i < std::size(kCommands); ++i) {
        x.key[i] = commandKey(kCommands[i].name);
        size_t at = commandSlot(x.key[i]);
        while (x.slot[at] != kNoCommand) { at = (at + 1) & (kCommandSlots - 1); }
        x.slot[at] = static_cast<uint8_t>(i);
    }
    return x;
}
constexpr CommandIndex kCommandIndex = buildCommandIndex();

// The command `name` names, in any case, or null when none is known.
const Command* findCommand(std::string_view name) noexcept {
    if (name.empty() || name.size() > kMaxCommandName) { return nullptr; }
    const CommandKey k = commandKey(name);
    for (size_t at = commandSlot(k);; at = (at + 1) & (kCommandSlots - 1)) {
        const uint8_t i = kCommandIndex.slot[at];
        if (i == kNoCommand) { return nullptr; }
        if (kCommandIndex.key[i] == k) { return &kCommands[i]; }
    }
}

// The subcommands a container command's handler knows (lower case), or none for another command.
std::span<const std::string_view> subcommandsOf(const Command& c) noexcept {
    static constexpr std::string_view kClient[] = {"getname", "id", "list", "setname"};
    static constexpr std::string_view kConfig[] = {"get", "set"};
    static constexpr std::string_view kCommand[] = {"count", "docs", "help", "info"};
    if (c.fn == cmdClient) { return kClient; }
    if (c.fn == cmdConfig) { return kConfig; }
    if (c.fn == cmdCommand) { return kCommand; }
    return {};
}

// Records the batch's last command on the client for CLIENT LIST: `c` (null: unknown) run with `args`.
void noteLastCommand(Client& client, const Command* c, const std::vector<std::string_view>& args) noexcept {
    client.lastCommand = c;
    client.lastSubcommand = {};
    if (c == nullptr || args.size() < 2) { return; }
    const std::span<const std::string_view> subs = subcommandsOf(*c);
    if (subs.empty()) { return; }
    for (const std::string_view sub : subs) {
        if (std::equal(sub.begin(), sub.end(), args[1].begin(), args[1].end(),
                       [](char a, char b) { return a == std::tolower(static_cast<unsigned char>(b)); })) {
            client.lastSubcommand = sub;
            return;
        }
    }
    client.lastCommand = nullptr;  // an unknown subcommand: Redis's lookup finds no command
}

void writeCommandInfo(ReplyWriter& w, const Command& c) {
    w.arrayHeader(10);
    w.bulk(c.name);
    w.integer(c.arity);
    std::vector<const char*> flags;
    if ((c.flags & kWrite) != 0) { flags.push_back("write"); }
    if ((c.flags & kReadonly) != 0) { flags.push_back("readonly"); }
    if ((c.flags & kDenyOom) != 0) { flags.push_back("denyoom"); }
    if ((c.flags & kNoAuth) != 0) { flags.push_back("no_auth"); }
    w.setHeader(flags.size());
    for (const char* f : flags) { w.simple(f); }
    w.integer(c.firstKey);
    w.integer(c.lastKey);
    w.integer(c.step);
    w.setHeader(0);  // ACL categories
    w.setHeader(0);  // tips
    w.arrayHeader(0);  // key specs
    w.arrayHeader(0);  // subcommands
}

// COMMAND DOCS's group, as Redis names them (redis-cli's help groups commands by it).
const char* commandGroup(const Command& c) {
    const std::string_view n = c.name;
    static constexpr std::string_view kGeneric[] = {"del", "exists", "expire", "expireat", "expiretime", "keys",
                                                    "persist", "pexpire", "pexpireat", "pexpiretime", "pttl",
                                                    "randomkey", "rename", "renamenx", "scan", "ttl", "type", "unlink"};
    static constexpr std::string_view kList[] = {"lindex", "llen", "lpop", "lpush", "lpushx", "lrange", "rpop", "rpush", "rpushx"};
    static constexpr std::string_view kSet[] = {"sadd", "scard", "sismember", "smembers", "srem"};
    static constexpr std::string_view kServer[] = {"bgrewriteaof", "command", "config", "dbsize", "flushall",
                                                   "flushdb", "info", "save", "shutdown"};
    auto in = [&](const auto& list) { return std::find(std::begin(list), std::end(list), n) != std::end(list); };
    if (in(kGeneric)) { return "generic"; }
    if (in(kList)) { return "list"; }
    if (in(kSet)) { return "set"; }
    if (in(kServer)) { return "server"; }
    if (n[0] == 'h' && n != "hello") { return "hash"; }
    return c.firstKey != 0 ? "string" : "connection";
}

void cmdCommand(Ctx& x) {
    if (x.argc() == 1) {
        x.w.arrayHeader(std::size(kCommands));
        for (const Command& c : kCommands) { writeCommandInfo(x.w, c); }
        return;
    }
    std::string sub;
    toLower(x.arg(1), sub);
    if (sub == "count" && x.argc() == 2) {
        x.w.integer(static_cast<int64_t>(std::size(kCommands)));
    } else if (sub == "info") {
        x.w.arrayHeader(x.argc() - 2);
        for (size_t i = 2; i < x.argc(); ++i) {
            if (const Command* c = findCommand(x.arg(i))) {  // folds case itself
                writeCommandInfo(x.w, *c);
            } else {
                x.w.nullArray();
            }
        }
    } else if (sub == "docs") {
        // Summaries only: redis-cli takes what it finds and keeps its own help for the rest.
        std::vector<const Command*> list;
        if (x.argc() == 2) {
            for (const Command& c : kCommands) { list.push_back(&c); }
        } else {
            for (size_t i = 2; i < x.argc(); ++i) {
                if (const Command* c = findCommand(x.arg(i))) { list.push_back(c); }
            }
        }
        x.w.mapHeader(list.size());
        for (const Command* c : list) {
            x.w.bulk(c->name);
            x.w.mapHeader(1);
            x.w.bulk("group");
            x.w.bulk(commandGroup(*c));
        }
    } else if (sub == "count" || sub == "help") {
        x.w.error(fmt::format("ERR wrong number of arguments for 'command|{}' command", sub));
    } else {
        x.w.error(fmt::format("ERR unknown subcommand '{}'. Try COMMAND HELP.", x.arg(1).substr(0, 128)));
    }
}

// SHUTDOWN [NOSAVE|SAVE] [NOW] [FORCE]: stops the server; wait() then writes and syncs the logs. As
// in Redis 7, SAVE first saves a snapshot, which here is a compaction of every shard's log as SAVE
// does it (rewriteEveryLog). Plain SHUTDOWN does not: Redis snapshots only where save points are
// configured, which spindle-kv has none of, and with an append-only file it syncs that. NOSAVE skips
// the snapshot; NOW has no replicas to skip waiting for. A save that fails (or cannot be made: no
// log) answers "-ERR Errors trying to SHUTDOWN. Check logs." and the server keeps running, unless
// FORCE is given (then it stops all the same, the old logs in use).
void cmdShutdown(Ctx& x) {
    bool save = false, nosave = false, force = false;
    for (size_t i = 1; i < x.argc(); ++i) {
        std::string opt;
        toLower(x.arg(i), opt);
        if (opt == "save") {
            save = true;
        } else if (opt == "nosave") {
            nosave = true;
        } else if (opt == "force") {
            force = true;
        } else if (opt != "now") {
            x.w.error(kSyntax);
            return;
        }
    }
    if (save && nosave) {
        x.w.error(kSyntax);
        return;
    }
    if (save) {
        log::info("spindle-kv: SHUTDOWN SAVE from client {}: rewriting the logs", x.client.id);
        if (const int err = rewriteEveryLog(x.s); err != 0) {
            const std::string why = err == ENOENT && x.s.logs.empty() ? "no log to rewrite (no --dir)" : std::strerror(err);
            if (!force) {
                log::warn("spindle-kv: SHUTDOWN SAVE: saving failed ({}); not stopping", why);
                x.w.error("ERR Errors trying to SHUTDOWN. Check logs.");
                return;
            }
            log::warn("spindle-kv: SHUTDOWN SAVE FORCE: saving failed ({}); stopping all the same", why);
        }
    }
    log::info("spindle-kv: SHUTDOWN from client {}", x.client.id);
    x.client.closeAfterReply = true;
    x.s.stopping.store(true);
    x.s.tcp->stop();
}

// The shard a command (`cmd`, looked up from args[0]; null if unknown) runs on when it is a single-key
// command that will run (known, arity right, authenticated), else -1.
int singleShard(Server::Impl& s, const Client& client, const std::vector<std::string_view>& args, const Command* cmd) {
    if (args.size() < 2 || (!client.authenticated && !s.options.requirePass.empty())) { return -1; }
    if (cmd == nullptr || cmd->firstKey != 1 || cmd->lastKey != 1) { return -1; }
    const auto argc = static_cast<int>(args.size());
    if ((cmd->arity > 0 && argc != cmd->arity) || (cmd->arity < 0 && argc < -cmd->arity)) { return -1; }
    return static_cast<int>(s.shardOf(args[1]));
}

// Runs one parsed command (`cmd`, looked up from args[0]; null if unknown), its reply appended through `w`.
void execute(Server::Impl& s, Client& client, const std::vector<std::string_view>& args, const Command* cmd, int64_t now,
             ReplyWriter& w, std::vector<Mark>& marks, bool& broken) {
    const bool authRequired = !s.options.requirePass.empty() && !client.authenticated;
    if (cmd == nullptr) {
        if (authRequired) {
            w.error("NOAUTH Authentication required.");
        } else {
            w.error(unknownCommandError(args));
        }
        return;
    }
    if (authRequired && (cmd->flags & kNoAuth) == 0) {
        w.error("NOAUTH Authentication required.");
        return;
    }
    const auto argc = static_cast<int>(args.size());
    if ((cmd->arity > 0 && argc != cmd->arity) || (cmd->arity < 0 && argc < -cmd->arity)) {
        w.error(wrongArgs(cmd->name));
        return;
    }
    if ((cmd->flags & kDenyOom) != 0) {
        const uint64_t limit = s.maxMemory.load(std::memory_order_relaxed);
        if (limit != 0 && s.usedMemory() > limit) {
            w.error("OOM command not allowed when used memory > 'maxmemory'.");
            return;
        }
    }
    s.countCommand();
    Ctx ctx{s, client, args, w, marks, *cmd, now};
    cmd->fn(ctx);
    broken = ctx.broken;
}

}  // namespace

namespace {

// Prefetches the key table of the connection's own shard for the commands of a batch a little ahead
// of running them: a command's second argument, its key for nearly every command, when it hashes to
// this shard (any other shard's table belongs to another thread). The slots go kPrefetchAhead
// commands ahead and the nodes half as far, once their slots are cached, so that a pipeline of
// commands on keys spread over a large table waits for memory about once, not twice per command.
// Hints only: a command whose second argument is no key costs a useless load.
class KeyPrefetch {
public:
    KeyPrefetch(const Shard* shard, unsigned shards, unsigned carrier) noexcept
        : shard_(shard), shards_(shards), carrier_(carrier) {}

    void begin(size_t n) {
        slots_ = nodes_ = 0;
        n_ = shard_ != nullptr && n > 1 ? n : 0;  // one command alone has nothing to overlap with
        if (hashes_.size() < n_) { hashes_.resize(n_); }
    }
    // Before running command `i`.
    void upTo(size_t i, const std::vector<Request>& reqs) noexcept {
        const size_t issued = slots_;  // slots asked for by an earlier call: a node load now need not wait
        for (const size_t to = std::min(n_, i + kPrefetchAhead); slots_ < to; ++slots_) {
            const auto& args = reqs[slots_].args;
            uint64_t h = kNotHere;
            if (args.size() >= 2 && (shards_ == 1 || keyHash(args[1]) % shards_ == carrier_)) {
                h = tableHash(args[1]);
                shard_->prefetchSlot(h);
            }
            hashes_[slots_] = h;
        }
        for (const size_t to = std::min(issued, i + kPrefetchAhead / 2); nodes_ < to; ++nodes_) {
            if (hashes_[nodes_] != kNotHere) { shard_->prefetchNode(hashes_[nodes_]); }
        }
    }

private:
    static constexpr uint64_t kNotHere = ~uint64_t{0};  // a table hash of this value is taken as not here
    const Shard* shard_;
    unsigned shards_;
    unsigned carrier_;
    size_t n_ = 0, slots_ = 0, nodes_ = 0;
    std::vector<uint64_t> hashes_;
};

}  // namespace

void Server::Impl::serve(net::TcpConnection& conn) noexcept {
    // A client may connect between the listeners' start and start()'s return: wait for the latter.
    while (!started.load(std::memory_order_acquire)) {
        if (conn.draining() || !spindle::sleep(1ms)) { return; }
    }
    net::TcpStream& stream = conn.stream();
    (void)stream.setNoDelay();
    const uint64_t now = clients.fetch_add(1, std::memory_order_relaxed) + 1;
    struct Leave {
        std::atomic<uint64_t>& c;
        ~Leave() { c.fetch_sub(1, std::memory_order_relaxed); }
    } leave{clients};
    if (now > maxClients.load(std::memory_order_relaxed)) {
        rejected.fetch_add(1, std::memory_order_relaxed);
        static constexpr std::string_view kFull = "-ERR max number of clients reached\r\n";
        (void)stream.writeAll(kFull.data(), kFull.size(), 1s);
        return;
    }
    Client client;
    client.id = conn.id();
    client.authenticated = options.requirePass.empty();
    client.fd = stream.fd();
    if (auto a = stream.peerAddress()) { client.addr = a->toString(); }
    if (auto a = stream.localAddress()) { client.laddr = a->toString(); }
    client.createdMs = client.lastMs = nowMs();
    std::vector<Client*>& registry = clientsOn[conn.carrier()];  // this fiber is pinned there
    registry.push_back(&client);
    struct Unregister {
        std::vector<Client*>& r;
        Client* c;
        ~Unregister() { r.erase(std::find(r.begin(), r.end(), c)); }
    } unregister{registry, &client};
    InBuffer in;
    // One receive armed for the connection's life, where the pool has a ring on this carrier (this
    // fiber is pinned there); destroyed before the stream closes (it cancels and waits for its CQE).
    std::optional<net::MultishotReceiver> receiver;
    if (pool && pool->ringAvailable()) { receiver.emplace(*pool, stream.fd()); }
    // The replies of a batch. With posted sends two buffers take turns: the batch being built in one
    // while the other's send may be in flight (post() waits for that send before starting the next,
    // so a buffer is reused only after its send ended). Never swapped: a short std::string keeps its
    // bytes inside the object, and a swap would move them under the send.
    std::string outBufs[2];
    unsigned outIdx = 0;
    // Every way out of this function sends what was posted first: a client that half-closes after
    // its last command, QUIT, a drain (the destructor would cancel it).
    net::PostedSend sender(stream.fd());
    struct FlushOnExit {
        net::PostedSend& s;
        ~FlushOnExit() { (void)s.flush(); }
    } flushOnExit{sender};
    std::vector<Request> reqs;  // the complete requests of one batch (reused)
    std::vector<Mark> marks;
    std::vector<const Command*> cmds;  // reqs[i]'s command, looked up once per batch
    KeyPrefetch ahead(conn.carrier() < shards.size() ? shards[conn.carrier()].get() : nullptr,
                      static_cast<unsigned>(shards.size()), conn.carrier());
    for (;;) {
        std::string& out = outBufs[outIdx];
        out.clear();
        ReplyWriter w(out, client.protocol);
        // Parse every complete request buffered (up to kMaxBatch). Before AUTH only one: the limits of
        // an unauthenticated client must not apply to what follows a pipelined AUTH.
        size_t n = 0, consumed = 0;
        bool incomplete = false;  // what is left in the buffer needs more bytes
        std::string_view protocolError;
        const std::string_view buffered = in.view();
        while (consumed < buffered.size() && n < kMaxBatch && !client.closeAfterReply) {
            if (n == reqs.size()) { reqs.emplace_back(); }
            const ParseResult r = parseRequest(buffered.substr(consumed), options.limits, reqs[n], !client.authenticated);
            if (r.status == ParseStatus::kIncomplete) {
                incomplete = true;
                break;
            }
            if (r.status == ParseStatus::kError) {
                protocolError = r.error;
                break;
            }
            consumed += r.consumed;
            if (!reqs[n].args.empty()) { ++n; }
            if (!client.authenticated) { break; }
        }
        // Each command looked up once, for the shard it goes to and for running it.
        if (cmds.size() < n) { cmds.resize(n); }
        for (size_t k = 0; k < n; ++k) { cmds[k] = findCommand(reqs[k].args[0]); }
        // Run them in order. Consecutive commands on one key of the same other shard go there in one
        // message, so a pipeline does not pay a round trip between carriers per command.
        ahead.begin(n);
        const int64_t batchNow = n > 0 ? nowMs() : 0;
        for (size_t i = 0; i < n && !client.closeAfterReply;) {
            ahead.upTo(i, reqs);
            const int shard = singleShard(*this, client, reqs[i].args, cmds[i]);
            size_t j = i + 1;
            if (shard >= 0 && static_cast<unsigned>(shard) != conn.carrier()) {
                while (j < n && j - i < kMaxShardRun && singleShard(*this, client, reqs[j].args, cmds[j]) == shard) { ++j; }
            }
            bool broken = false;
            if (j - i > 1) {
                size_t ran = i;
                auto r = rt->runOnCarrier(static_cast<unsigned>(shard), [&]() noexcept {
                    // On the shard's thread: each command's own runOnCarrier runs inline. Not a fiber:
                    // nothing here may wait, so the run stops where a multi-key command holds keys
                    // (key_locks.h), and the rest goes one by one below.
                    for (; ran < j && !broken && locks[static_cast<unsigned>(shard)]->idle(); ++ran) {
                        execute(*this, client, reqs[ran].args, cmds[ran], batchNow, w, marks, broken);
                    }
                });
                if (!r) { return; }
                if (ran < j && !broken) { j = ran > i ? ran : i + 1; }
                if (ran == i && !broken) { execute(*this, client, reqs[i].args, cmds[i], batchNow, w, marks, broken); }
            } else {
                execute(*this, client, reqs[i].args, cmds[i], batchNow, w, marks, broken);
            }
            if (broken) { return; }
            i = j;
        }
        if (n > 0) {  // CLIENT LIST's cmd and idle, set here on the connection's own carrier
            client.lastMs = batchNow;
            noteLastCommand(client, cmds[n - 1], reqs[n - 1].args);
        }
        in.consume(consumed);  // after the commands: their arguments point into the buffer
        if (!protocolError.empty() && !client.closeAfterReply) {
            w.error(std::string("ERR ") + std::string(protocolError));
            client.closeAfterReply = true;
        }
        // appendfsync always: the batch's replies leave once its writes are synced; up to the first
        // write a failed log did not cover, then the connection closes.
        size_t sendable = out.size();
        bool cut = false;
        int cutError = 0;
        for (const Mark& m : marks) {
            if (const int err = logs[m.shard]->waitDurable(m.seq); err != 0 && m.replyOffset < sendable) {
                sendable = m.replyOffset;
                cut = true;
                cutError = err;
            }
        }
        marks.clear();
        if (cut) {  // the write that was not made durable gets the error, and nothing after it
            out.resize(sendable);
            w.error(misconf(cutError));
            sendable = out.size();
        }
        if (sendable > 0) {
            if (options.postedSend) {
                // post() waits for the previous batch's send first, so `sending` is free to reuse.
                if (!sender.post(out.data(), sendable)) { return; }
                outIdx ^= 1;
            } else if (!stream.writeAll(out.data(), sendable)) {
                return;
            }
        }
        if (cut || client.closeAfterReply || conn.draining()) { return; }
        if (in.size() > 0 && !incomplete) { continue; }  // whole requests are still buffered (a batch was full)
        if (in.size() > options.queryBufferLimit) {
            log::warn("spindle-kv: client {} closed for overcoming of input buffer limits ({} bytes)", client.id, in.size());
            return;
        }
        conn.setIdle(in.size() == 0);
        in.releaseIfEmptyAbove(kRecvChunk);
        if (receiver) {
            // The kernel picked a buffer of the pool; its bytes are copied behind what is buffered
            // (a request is seldom more than one receive), and it goes back to the ring at once.
            auto got = receiver->next();
            conn.setIdle(false);
            if (!got || got->empty()) { return; }
            in.reserve(got->size());
            std::memcpy(in.tail(), got->data(), got->size());
            in.commit(got->size());
            continue;
        }
        in.reserve(kRecvChunk);
        auto got = stream.recv(in.tail(), in.room());
        conn.setIdle(false);
        if (!got || *got == 0) { return; }
        countOwnReceive(conn.carrier());
        in.commit(*got);
    }
}

Server::Server(std::unique_ptr<Impl> impl) noexcept : impl_(std::move(impl)) {}

Server::~Server() {
    if (impl_) {
        stop();
        (void)wait();
    }
}

namespace {

// Checks (or writes, for a new directory) <dir>/kv.meta, which records the shard count.
Result<void> checkMeta(const std::string& dir, unsigned shards) {
    const std::string path = dir + "/kv.meta";
    const std::string want = fmt::format("spindle-kv 1 shards {}\n", shards);
    if (FILE* f = std::fopen(path.c_str(), "re")) {
        char buf[128] = {};
        const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
        std::fclose(f);
        if (std::string_view(buf, n) != want) {
            unsigned have = 0;
            (void)std::sscanf(buf, "spindle-kv 1 shards %u", &have);
            log::error("spindle-kv: {} holds the logs of {} shards; start with --carriers {}", dir, have, have);
            return Error{EINVAL};
        }
        return {};
    }
    if (errno != ENOENT) { return Error{errno}; }
    const std::string tmp = path + ".tmp";
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) { return Error{errno}; }
    const bool ok = ::write(fd, want.data(), want.size()) == static_cast<ssize_t>(want.size()) && ::fsync(fd) == 0;
    const int err = errno;
    ::close(fd);
    if (!ok) { return Error{err}; }
    if (::rename(tmp.c_str(), path.c_str()) != 0) { return Error{errno}; }
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        (void)::fsync(dfd);
        ::close(dfd);
    }
    return {};
}

}  // namespace

Result<std::unique_ptr<Server>> Server::start(Runtime& rt, const ServerOptions& options) {
    if (options.maxClients == 0 || options.limits.maxBulkLength <= 0 || options.limits.maxMultibulkLength <= 0) {
        log::error("spindle-kv: maxclients, proto-max-bulk-len and the multibulk limit must be positive");
        return Error{EINVAL};
    }
    auto impl = std::make_unique<Impl>();
    impl->rt = &rt;
    impl->options = options;
    impl->maxMemory = options.maxMemory;
    impl->maxClients = options.maxClients;
    impl->startedMs = nowMs();
    impl->autoRewritePct = options.autoRewritePercentage;
    impl->autoRewriteMin = options.autoRewriteMinSize;
    const unsigned shards = rt.carrierCount();
    impl->commandSlots = shards + 1;
    impl->commandsOn = std::make_unique<Impl::CommandCount[]>(impl->commandSlots);
    for (unsigned i = 0; i < shards; ++i) {
        impl->shards.push_back(std::make_unique<Shard>(i));
        impl->locks.push_back(std::make_unique<KeyLocks>());
    }
    impl->clientsOn.resize(shards);
    // Before the logs: options it cannot use fail start() before any log is opened or replayed. (It
    // registers nothing yet: each carrier's ring is registered there on its first receive.)
    if (options.providedBuffers) {
        auto pool = net::ProvidedBufferPool::create(
            net::ProvidedBufferOptions{.count = options.providedBufferCount, .size = options.providedBufferSize});
        if (!pool) {
            log::error("spindle-kv: provided receive buffers ({} of {} bytes): {}", options.providedBufferCount,
                       options.providedBufferSize, pool.error().message());
            return Error{pool.errorCode()};
        }
        impl->pool = std::move(*pool);
    }
    if (!options.dir.empty()) {
        if (::mkdir(options.dir.c_str(), 0755) != 0 && errno != EEXIST) {
            const int err = errno;
            log::error("spindle-kv: data directory {}: {}", options.dir, std::strerror(err));
            return Error{err};
        }
        if (auto m = checkMeta(options.dir, shards); !m) { return Error{m.errorCode()}; }
        // Open every log, then replay them all at once, each shard on its own carrier (the thread that
        // owns it), then check the reports in shard order.
        std::vector<int> fds(shards, -1);
        struct CloseRest {
            std::vector<int>& fds;
            ~CloseRest() {
                for (int& fd : fds) {
                    if (fd >= 0) { ::close(std::exchange(fd, -1)); }
                }
            }
        } closeRest{fds};
        for (unsigned i = 0; i < shards; ++i) {
            const std::string path = shardLogPath(options.dir, i);
            if (removeStaleRewrite(options.dir, i)) {
                log::warn("spindle-kv: removed {}.rewrite, left by a rewrite that did not finish ({} is the log)", path, path);
            }
            fds[i] = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
            if (fds[i] < 0) {
                const int err = errno;
                log::error("spindle-kv: {}: {}", path, std::strerror(err));
                return Error{err};
            }
        }
        // A log just created must not vanish with its directory entry after a power cut.
        if (const int dfd = ::open(options.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
            const int rc = ::fsync(dfd);
            const int err = errno;
            ::close(dfd);
            if (rc != 0) {
                log::error("spindle-kv: fsync of {}: {}", options.dir, std::strerror(err));
                return Error{err};
            }
        }
        std::vector<Result<ScanReport>> scans(shards, Error{ECANCELED});
        std::vector<double> seconds(shards, 0.0);
        const auto replayBegan = std::chrono::steady_clock::now();
        {
            std::vector<FiberHandle<void>> replays;
            for (unsigned i = 0; i < shards; ++i) {
                Shard* shard = impl->shards[i].get();
                auto f = rt.spawn(
                    [&, i, shard]() noexcept {
                        const auto began = std::chrono::steady_clock::now();
                        scans[i] = scanLogFile(
                            fds[i], [shard](std::string_view p) { return shard->replay(p); }, size_t{8} << 20,
                            [shard](uint64_t records) { shard->expectKeys(records); },
                            [shard](std::string_view p, int stage) { shard->prefetch(p, stage); });
                        shard->endReplay();
                        seconds[i] = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
                    },
                    SpawnOptions{.name = "kv-replay", .carrier = static_cast<int>(i), .pinned = true});
                if (!f) {
                    for (auto& r : replays) { r.join(); }
                    return Error{f.errorCode()};
                }
                replays.push_back(std::move(*f));
            }
            for (auto& r : replays) { r.join(); }
        }
        const double replaySeconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - replayBegan).count();
        for (unsigned i = 0; i < shards; ++i) {
            const std::string path = shardLogPath(options.dir, i);
            const int fd = fds[i];
            if (!scans[i]) {
                log::error("spindle-kv: reading {}: {}", path, scans[i].error().message());
                return Error{scans[i].errorCode()};
            }
            const ScanReport rep = *scans[i];
            const double replaySec = seconds[i];
            const uint64_t fileSize = rep.validBytes + rep.droppedBytes + rep.zeroTail;
            log::info("spindle-kv: {}: replayed {} records, {} bytes in {:.3f} s ({:.0f} MB/s){}", path, rep.records,
                      rep.validBytes, replaySec, replaySec > 0 ? static_cast<double>(rep.validBytes) / 1e6 / replaySec : 0.0,
                      rep.zeroTail > 0 ? fmt::format("; then {} bytes of preallocated zeros", rep.zeroTail) : std::string());
            if (rep.corruptInMiddle && !options.truncateCorrupt) {
                log::error("spindle-kv: {} is corrupt at byte {} of {}, with {} valid records after it; refusing to start "
                           "(--truncate-corrupt-log drops everything from there: {} bytes, those {} records)",
                           path, rep.badOffset, fileSize, rep.droppedRecords, rep.droppedBytes, rep.droppedRecords);
                return Error{EILSEQ};
            }
            if (rep.droppedBytes > 0) {
                log::warn("spindle-kv: {}: {} {} bytes after byte {} ({} records kept, {} valid records after the damage dropped)",
                          path, rep.corruptInMiddle ? "dropped a corrupt part of" : "truncated a torn tail of",
                          rep.droppedBytes, rep.validBytes, rep.records, rep.droppedRecords);
                if (::ftruncate(fd, static_cast<off_t>(rep.validBytes)) != 0 || ::fsync(fd) != 0) {
                    const int err = errno;
                    log::error("spindle-kv: truncating {}: {}", path, std::strerror(err));
                    return Error{err};
                }
            }
            impl->replayed += rep.records;
            impl->droppedTail += rep.droppedBytes;
            impl->droppedRecords += rep.droppedRecords;
            // The next record goes at the log's logical end; a zero tail after it (left by a crash) is
            // room already made (a damaged tail was truncated above, and its zeros with it). Only
            // `always` preallocates: everysec and no sync once a second or never, so they would gain
            // little, and writing every byte twice (zeros, then records) cost everysec about a fifth
            // of its SET throughput at -P 16 here.
            const uint64_t preallocate = options.appendFsync == Fsync::kAlways ? options.logPreallocate : 0;
            auto wal = ShardLog::start(rt, i, fd, rep.validBytes, options.appendFsync, preallocate);
            if (!wal) { return Error{wal.errorCode()}; }
            fds[i] = -1;  // the log owns it now
            impl->shards[i]->attachLog(wal->get());
            impl->logs.push_back(std::move(*wal));
            impl->rewrites.push_back(std::make_unique<RewriteState>());
            impl->rewrites.back()->baseSize.store(rep.validBytes);
        }
        if (impl->replayed > 0) {
            uint64_t bytes = 0;
            for (const auto& l : impl->logs) { bytes += l->size(); }
            log::info("spindle-kv: replayed {} records, {} keys: {} bytes from {} logs in {:.3f} s ({:.0f} MB/s)", impl->replayed,
                      impl->keyCount(), bytes, shards, replaySeconds,
                      replaySeconds > 0 ? static_cast<double>(bytes) / 1e6 / replaySeconds : 0.0);
        }
    }
    for (unsigned i = 0; i < shards; ++i) {
        Impl* s = impl.get();
        auto f = rt.spawn(
            [s, i]() noexcept {
                Shard& shard = *s->shards[i];
                while (!s->stopping.load(std::memory_order_relaxed) && spindle::sleep(100ms)) {
                    (void)shard.activeExpire(nowMs(), kActiveExpireBudget);
                    s->maybeAutoRewrite(i);
                }
            },
            SpawnOptions{.name = "kv-expire", .carrier = static_cast<int>(i), .pinned = true});
        if (!f) { return Error{f.errorCode()}; }  // ~Impl cancels and joins the ones started
        impl->expirers.push_back(std::move(*f));
    }
    net::TcpServerOptions tcp;
    tcp.address = options.address;
    tcp.shareAddress = options.shareAddress;
    tcp.name = "spindle-kv";
    tcp.drainTimeout = 5s;
    Impl* raw = impl.get();
    auto server = std::unique_ptr<Server>(new Server(std::move(impl)));
    auto t = net::TcpServer::start(rt, tcp, [raw](net::TcpConnection& c) noexcept { raw->serve(c); });
    if (!t) {
        raw->stopping = true;
        return Error{t.errorCode()};  // ~Server: ~Impl ends the expiry fibers and closes the logs
    }
    raw->tcp = std::move(*t);
    raw->started.store(true, std::memory_order_release);
    return server;
}

net::SocketAddress Server::localAddress() const noexcept {
    return impl_->tcp ? impl_->tcp->localAddress() : net::SocketAddress{};
}

void Server::stop() noexcept {
    impl_->stopping.store(true);
    if (impl_->tcp) { impl_->tcp->stop(); }
}

int Server::wait() noexcept {
    if (impl_->tcp) { impl_->tcp->wait(); }
    return impl_->finish();
}

ServerStats Server::stats() const noexcept {
    ServerStats st;
    if (impl_->tcp) { st.connections = impl_->tcp->stats().accepted; }
    st.clients = impl_->clients.load();
    st.commands = impl_->commandCount();
    st.rejectedClients = impl_->rejected.load();
    st.keys = impl_->keyCount();
    st.usedMemory = impl_->usedMemory();
    for (const auto& l : impl_->logs) {
        const LogStats one = l->stats();
        st.log.records += one.records;
        st.log.bytes += one.bytes;
        st.log.syncs += one.syncs;
        st.log.syncedRecords += one.syncedRecords;
        st.log.preallocated += one.preallocated;
        st.log.appendedPastEnd += one.appendedPastEnd;
    }
    st.replayedRecords = impl_->replayed;
    st.droppedTailBytes = impl_->droppedTail;
    st.droppedRecords = impl_->droppedRecords;
    st.rewrites = impl_->rewritesDone.load();
    st.rewritesFailed = impl_->rewritesFailed.load();
    st.ownBufferReceives = impl_->sumCounts(&Impl::CommandCount::ownRecvs);
    if (impl_->pool) {
        const net::ProvidedBufferStats p = impl_->pool->stats();
        st.providedReceives = p.providedRecvs;
        st.heapReceives = p.fallbackRecvs;
        st.receiveRingExhausted = p.exhausted;
        st.receiveRingCarriers = p.carriersRegistered;
    }
    return st;
}

}  // namespace spindle::kv
