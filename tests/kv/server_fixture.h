// SPDX-License-Identifier: Apache-2.0
#pragma once
// The kv durability tests' fixture: spindle-kv's server in process on a two-carrier runtime with a
// fresh data directory, restartable on it, plus helpers that read INFO fields and dump the whole
// keyspace (every key with its value and absolute expiry) through a client, to compare a keyspace
// before and after a restart or a rewrite; dumpTypedKeyspace does it for keys of every type.

#include <gtest/gtest.h>

#include <chrono>
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "apps/kv/server.h"
#include "testing/scratch_dir.h"
#include "tests/core/with_runtime.h"
#include "tests/kv/resp_client.h"

/// Skips the calling test (or SetUp) in a build without fault injection (the package preset's), which
/// the fault tests need.
#if defined(SPINDLE_FAULT_INJECTION)
#define SPINDLE_SKIP_WITHOUT_FAULT_INJECTION() static_cast<void>(0)
#else
#define SPINDLE_SKIP_WITHOUT_FAULT_INJECTION() GTEST_SKIP() << "built without SPINDLE_FAULT_INJECTION"
#endif

namespace spindle::kv::testing_support {

// key -> (value, PEXPIRETIME: -1 for none)
using Keyspace = std::map<std::string, std::pair<std::string, int64_t>>;

// The items of a flat RESP2 array of bulk strings (KEYS' reply); nullopt-like empty on a bad reply.
inline std::vector<std::string> bulkItems(const std::string& r) {
    std::vector<std::string> out;
    if (r.empty() || r[0] != '*') { return out; }
    size_t at = r.find("\r\n") + 2;
    const long n = std::atol(r.c_str() + 1);
    for (long i = 0; i < n && at < r.size(); ++i) {
        const size_t crlf = r.find("\r\n", at);
        const auto len = static_cast<size_t>(std::atol(r.c_str() + at + 1));
        out.push_back(r.substr(crlf + 2, len));
        at = crlf + 2 + len + 2;
    }
    return out;
}

// The payload of a bulk reply ("" for a null one).
inline std::string bulkValue(const std::string& r) {
    if (r.size() < 4 || r[0] != '$' || r[1] == '-') { return ""; }
    const size_t crlf = r.find("\r\n");
    return r.substr(crlf + 2, static_cast<size_t>(std::atol(r.c_str() + 1)));
}

inline Keyspace dumpKeyspace(uint16_t port) {
    RespClient c(port);
    Keyspace ks;
    for (const std::string& key : bulkItems(c.call({"KEYS", "*"}))) {
        const std::string v = c.call({"GET", key});
        const std::string t = c.call({"PEXPIRETIME", key});
        ks[key] = {bulkValue(v), std::atoll(t.c_str() + 1)};
    }
    return ks;
}

// A key of any type as a client sees it: TYPE, its contents in a canonical order (a string's value;
// a hash's field, value pairs sorted by field; a list's elements in order; a set's members sorted),
// and PEXPIRETIME (-1 for none).
struct TypedValue {
    std::string type;
    std::vector<std::string> items;
    int64_t expireAtMs = -1;
    bool operator==(const TypedValue&) const = default;
};
using TypedKeyspace = std::map<std::string, TypedValue>;

inline TypedKeyspace dumpTypedKeyspace(uint16_t port) {
    RespClient c(port);
    TypedKeyspace ks;
    for (const std::string& key : bulkItems(c.call({"KEYS", "*"}))) {
        TypedValue v;
        const std::string t = c.call({"TYPE", key});
        v.type = t.size() > 3 ? t.substr(1, t.size() - 3) : t;  // +hash\r\n
        if (v.type == "string") {
            v.items.push_back(bulkValue(c.call({"GET", key})));
        } else if (v.type == "hash") {
            const std::vector<std::string> flat = bulkItems(c.call({"HGETALL", key}));
            std::vector<std::pair<std::string, std::string>> pairs;
            for (size_t i = 0; i + 1 < flat.size(); i += 2) { pairs.emplace_back(flat[i], flat[i + 1]); }
            std::sort(pairs.begin(), pairs.end());
            for (auto& [f, val] : pairs) {
                v.items.push_back(f);
                v.items.push_back(val);
            }
        } else if (v.type == "list") {
            v.items = bulkItems(c.call({"LRANGE", key, "0", "-1"}));
        } else if (v.type == "set") {
            v.items = bulkItems(c.call({"SMEMBERS", key}));
            std::sort(v.items.begin(), v.items.end());
        }
        v.expireAtMs = std::atoll(c.call({"PEXPIRETIME", key}).c_str() + 1);
        ks[key] = std::move(v);
    }
    return ks;
}

// The value of field `name` in INFO `section` ("" when absent).
inline std::string infoField(uint16_t port, const std::string& section, const std::string& name) {
    RespClient c(port);
    const std::string info = bulkValue(c.call({"INFO", section}));
    const size_t at = info.find("\r\n" + name + ":");
    if (at == std::string::npos) { return ""; }
    const size_t from = at + 2 + name.size() + 1;
    return info.substr(from, info.find("\r\n", from) - from);
}

// Waits until no rewrite runs and at least `rewrites` have completed (or failed); false after 10 s.
inline bool awaitRewrites(uint16_t port, uint64_t rewrites) {
    const auto giveUp = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < giveUp) {
        const uint64_t done = std::strtoull(infoField(port, "persistence", "aof_rewrites").c_str(), nullptr, 10) +
                              std::strtoull(infoField(port, "persistence", "aof_rewrites_failed").c_str(), nullptr, 10);
        if (infoField(port, "persistence", "aof_rewrite_in_progress") == "0" && done >= rewrites) { return true; }
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return false;
}

class KvServerFixture : public spindle::testing_support::WithRuntime {
protected:
    void SetUp() override {
        WithRuntime::SetUp();
        if (HasFatalFailure()) { return; }
        ASSERT_TRUE(scratch_.ok()) << "mkdtemp under " << std::filesystem::temp_directory_path();
        dir_ = scratch_.dir();
    }
    void TearDown() override {
        server_.reset();
        WithRuntime::TearDown();
    }

    /// Loopback, any port; with `withDir`, the logs in the scratch directory.
    ServerOptions defaults(bool withDir = false) const {
        ServerOptions o;
        o.address = net::SocketAddress::ipv4Loopback(0);
        if (withDir) { o.dir = dir_; }
        return o;
    }
    ServerOptions withDir(Fsync mode) const {
        ServerOptions o;
        o.address = net::SocketAddress::ipv4Loopback(0);
        o.dir = dir_;
        o.appendFsync = mode;
        return o;
    }
    void startServer(const ServerOptions& o) {
        server_.reset();
        auto s = Server::start(rt(), o);
        ASSERT_TRUE(s) << s.error().message();
        server_ = std::move(*s);
        port_ = server_->localAddress().port();
    }
    // Sum of the shard logs' sizes on disk, without their preallocated zero tails (what a replay would
    // read: the logs' logical sizes, plus any damage).
    uint64_t logBytesOnDisk() const {
        uint64_t n = 0;
        for (const auto& e : std::filesystem::directory_iterator(dir_)) {
            if (e.path().extension() != ".log") { continue; }
            std::ifstream in(e.path(), std::ios::binary);
            const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
            const ScanReport r = scanLog(bytes, [](std::string_view) { return true; });
            n += r.validBytes + r.droppedBytes;
        }
        return n;
    }

    std::unique_ptr<Server> server_;
    uint16_t port_ = 0;
    spindle::testing_support::ScratchDir scratch_;  // removed with the fixture, after TearDown
    std::string dir_;
};

}  // namespace spindle::kv::testing_support
