// SPDX-License-Identifier: Apache-2.0
// spindle-kv's server in process over loopback: command semantics and exact replies, expiry (lazy
// and active), connection commands, protocol errors and limits, pipelining, large and binary values,
// AUTH, maxclients, maxmemory, and durability across a restart on the same data directory (with a
// torn tail, a corruption in the middle, and another shard count).
#include "apps/kv/server.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/core/with_runtime.h"
#include "tests/kv/resp_client.h"
#include "tests/kv/server_fixture.h"

namespace spindle::kv {
namespace {

using namespace std::chrono_literals;
using testing_support::infoField;
using testing_support::RespClient;
using V = std::vector<std::string>;

std::string bulk(std::string_view s) { return "$" + std::to_string(s.size()) + "\r\n" + std::string(s) + "\r\n"; }
const std::string kOk = "+OK\r\n";
const std::string kNil = "$-1\r\n";

class KvServer : public testing_support::KvServerFixture {};

TEST_F(KvServer, StringCommandsAnswerAsRedis) {
    startServer(defaults());
    RespClient c(port_);
    ASSERT_TRUE(c.connected());
    EXPECT_EQ(c.call({"GET", "k"}), kNil);
    EXPECT_EQ(c.call({"SET", "k", "v1"}), kOk);
    EXPECT_EQ(c.call({"GET", "k"}), bulk("v1"));
    EXPECT_EQ(c.call({"SET", "k", "v2", "NX"}), kNil);
    EXPECT_EQ(c.call({"SET", "k", "v2", "XX", "GET"}), bulk("v1"));
    EXPECT_EQ(c.call({"SET", "nokey", "v", "XX"}), kNil);
    EXPECT_EQ(c.call({"SET", "k", "v", "NX", "XX"}), "-ERR syntax error\r\n");
    EXPECT_EQ(c.call({"SET", "k", "v", "EX", "0"}), "-ERR invalid expire time in 'set' command\r\n");
    EXPECT_EQ(c.call({"SET", "k", "v", "EX", "x"}), "-ERR value is not an integer or out of range\r\n");
    EXPECT_EQ(c.call({"SETNX", "k", "z"}), ":0\r\n");
    EXPECT_EQ(c.call({"SETNX", "k2", "z"}), ":1\r\n");
    EXPECT_EQ(c.call({"GETSET", "k2", "y"}), bulk("z"));
    EXPECT_EQ(c.call({"GETDEL", "k2"}), bulk("y"));
    EXPECT_EQ(c.call({"GETDEL", "k2"}), kNil);
    EXPECT_EQ(c.call({"APPEND", "s", "Hello"}), ":5\r\n");
    EXPECT_EQ(c.call({"APPEND", "s", " World"}), ":11\r\n");
    EXPECT_EQ(c.call({"STRLEN", "s"}), ":11\r\n");
    EXPECT_EQ(c.call({"GETRANGE", "s", "0", "4"}), bulk("Hello"));
    EXPECT_EQ(c.call({"GETRANGE", "s", "-5", "-1"}), bulk("World"));
    EXPECT_EQ(c.call({"GETRANGE", "s", "20", "30"}), bulk(""));
    EXPECT_EQ(c.call({"SETRANGE", "s", "6", "Redis"}), ":11\r\n");
    EXPECT_EQ(c.call({"GET", "s"}), bulk("Hello Redis"));
    EXPECT_EQ(c.call({"SETRANGE", "pad", "3", "x"}), ":4\r\n");
    EXPECT_EQ(c.call({"GET", "pad"}), bulk(std::string("\0\0\0x", 4)));
    EXPECT_EQ(c.call({"SETRANGE", "pad", "-1", "x"}), "-ERR offset is out of range\r\n");
}

TEST_F(KvServer, CountersAndTheirErrors) {
    startServer(defaults());
    RespClient c(port_);
    EXPECT_EQ(c.call({"INCR", "n"}), ":1\r\n");
    EXPECT_EQ(c.call({"INCRBY", "n", "41"}), ":42\r\n");
    EXPECT_EQ(c.call({"DECR", "n"}), ":41\r\n");
    EXPECT_EQ(c.call({"DECRBY", "n", "50"}), ":-9\r\n");
    EXPECT_EQ(c.call({"INCRBY", "n", "x"}), "-ERR value is not an integer or out of range\r\n");
    EXPECT_EQ(c.call({"SET", "big", "9223372036854775807"}), kOk);
    EXPECT_EQ(c.call({"INCR", "big"}), "-ERR increment or decrement would overflow\r\n");
    EXPECT_EQ(c.call({"SET", "text", "abc"}), kOk);
    EXPECT_EQ(c.call({"INCR", "text"}), "-ERR value is not an integer or out of range\r\n");
    EXPECT_EQ(c.call({"INCRBYFLOAT", "f", "10.5"}), bulk("10.5"));
    EXPECT_EQ(c.call({"INCRBYFLOAT", "f", "0.1"}), bulk("10.6"));
    EXPECT_EQ(c.call({"INCRBYFLOAT", "f", "-10.6"}), bulk("0"));
    EXPECT_EQ(c.call({"INCRBYFLOAT", "text", "1"}), "-ERR value is not a valid float\r\n");
    EXPECT_EQ(c.call({"INCRBYFLOAT", "f", "abc"}), "-ERR value is not a valid float\r\n");
}

TEST_F(KvServer, MultiKeyCommandsSpanEveryShard) {
    startServer(defaults());
    RespClient c(port_);
    V mset{"MSET"};
    V mget{"MGET"};
    std::string expected = "*21\r\n";
    for (int i = 0; i < 20; ++i) {
        mset.push_back("key:" + std::to_string(i));
        mset.push_back("value:" + std::to_string(i));
        mget.push_back("key:" + std::to_string(i));
        expected += bulk("value:" + std::to_string(i));
    }
    mget.push_back("missing");
    expected += kNil;
    EXPECT_EQ(c.call(mset), kOk);
    EXPECT_EQ(c.call(mget), expected);
    EXPECT_EQ(c.call({"MSET", "a"}), "-ERR wrong number of arguments for 'mset' command\r\n");
    EXPECT_EQ(c.call({"EXISTS", "key:1", "key:2", "key:1", "nope"}), ":3\r\n");
    EXPECT_EQ(c.call({"DBSIZE"}), ":20\r\n");
    EXPECT_EQ(c.call({"KEYS", "key:7"}), "*1\r\n" + bulk("key:7"));
    EXPECT_EQ(c.call({"KEYS", "key:1?"}).substr(0, 5), "*10\r\n");  // key:10 .. key:19, from both shards
    EXPECT_EQ(c.call({"KEYS", "*"}).substr(0, 5), "*20\r\n");
    EXPECT_EQ(c.call({"KEYS", "nothing*"}), "*0\r\n");
    EXPECT_EQ(c.call({"DEL", "key:1", "key:2", "nope"}), ":2\r\n");
    EXPECT_EQ(c.call({"UNLINK", "key:3"}), ":1\r\n");
    EXPECT_EQ(c.call({"DBSIZE"}), ":17\r\n");
    EXPECT_EQ(c.call({"TYPE", "key:4"}), "+string\r\n");
    EXPECT_EQ(c.call({"TYPE", "key:1"}), "+none\r\n");
    EXPECT_EQ(c.call({"FLUSHALL"}), kOk);
    EXPECT_EQ(c.call({"DBSIZE"}), ":0\r\n");
}

TEST_F(KvServer, ExpiryLazyAndActive) {
    startServer(defaults());
    RespClient c(port_);
    EXPECT_EQ(c.call({"TTL", "none"}), ":-2\r\n");
    EXPECT_EQ(c.call({"SET", "p", "v"}), kOk);
    EXPECT_EQ(c.call({"TTL", "p"}), ":-1\r\n");
    EXPECT_EQ(c.call({"EXPIRE", "p", "100"}), ":1\r\n");
    EXPECT_EQ(c.call({"TTL", "p"}), ":100\r\n");
    EXPECT_EQ(c.call({"EXPIRE", "p", "50", "GT"}), ":0\r\n");
    EXPECT_EQ(c.call({"EXPIRE", "p", "50", "LT"}), ":1\r\n");
    EXPECT_EQ(c.call({"EXPIRE", "p", "50", "NX", "XX"}), "-ERR NX and XX, GT or LT options at the same time are not compatible\r\n");
    EXPECT_EQ(c.call({"PERSIST", "p"}), ":1\r\n");
    EXPECT_EQ(c.call({"PERSIST", "p"}), ":0\r\n");
    EXPECT_EQ(c.call({"PEXPIRE", "p", "-1"}), ":1\r\n");  // a time in the past deletes
    EXPECT_EQ(c.call({"EXISTS", "p"}), ":0\r\n");
    EXPECT_EQ(c.call({"SET", "q", "v", "PX", "40"}), kOk);
    const std::string pttl = c.call({"PTTL", "q"});
    EXPECT_EQ(pttl.front(), ':');
    EXPECT_LE(std::atoi(pttl.c_str() + 1), 40);
    EXPECT_EQ(c.call({"SETEX", "r", "100", "v"}), kOk);
    EXPECT_EQ(c.call({"GETEX", "r", "PERSIST"}), bulk("v"));
    // A relative time that passes INT64_MAX ms once now is added: refused, as SET refuses it (GETEX
    // once wrapped it into the past).
    EXPECT_EQ(c.call({"GETEX", "r", "PX", "9223372036854775807"}), "-ERR invalid expire time in 'getex' command\r\n");
    EXPECT_EQ(c.call({"SET", "r", "v", "PX", "9223372036854775807"}), "-ERR invalid expire time in 'set' command\r\n");
    EXPECT_EQ(c.call({"GETEX", "r", "EX", "0"}), "-ERR invalid expire time in 'getex' command\r\n");
    EXPECT_EQ(c.call({"GET", "r"}), bulk("v"));
    EXPECT_EQ(c.call({"TTL", "r"}), ":-1\r\n");
    EXPECT_EQ(c.call({"SETEX", "r", "0", "v"}), "-ERR invalid expire time in 'setex' command\r\n");
    std::this_thread::sleep_for(60ms);
    EXPECT_EQ(c.call({"GET", "q"}), kNil);  // lazy
    // Active: keys nobody touches again are gone once their time has passed.
    V mset{"MSET"};
    for (int i = 0; i < 50; ++i) {
        EXPECT_EQ(c.call({"SET", "t" + std::to_string(i), "v", "PX", "30"}), kOk);
    }
    bool gone = false;
    for (int i = 0; i < 100 && !gone; ++i) {
        std::this_thread::sleep_for(20ms);
        gone = c.call({"DBSIZE"}) == ":1\r\n";  // only "r" is left
    }
    EXPECT_TRUE(gone);
}

TEST_F(KvServer, ConnectionCommandsAndExactErrors) {
    startServer(defaults());
    RespClient c(port_);
    EXPECT_EQ(c.call({"PING"}), "+PONG\r\n");
    EXPECT_EQ(c.call({"PING", "hi"}), bulk("hi"));
    EXPECT_EQ(c.call({"ECHO", "x y"}), bulk("x y"));
    EXPECT_EQ(c.call({"SELECT", "0"}), kOk);
    EXPECT_EQ(c.call({"SELECT", "1"}), "-ERR DB index is out of range\r\n");
    EXPECT_EQ(c.call({"FOO", "a", "b"}), "-ERR unknown command 'FOO', with args beginning with: 'a' 'b' \r\n");
    EXPECT_EQ(c.call({"ZADD", "z", "1", "m"}), "-ERR unknown command 'ZADD', with args beginning with: 'z' '1' 'm' \r\n");
    EXPECT_EQ(c.call({"GET"}), "-ERR wrong number of arguments for 'get' command\r\n");
    EXPECT_EQ(c.call({"get", "a", "b"}), "-ERR wrong number of arguments for 'get' command\r\n");
    // Names in any case, and nothing that only looks like one once its case is folded: bytes that are
    // no letters (0x40 '@' and 0x60 '`', 0x5b '[' and 0x7b '{' differ in the case bit alone), a NUL,
    // a longer or a shorter name, one past the longest (16 bytes).
    EXPECT_EQ(c.call({"pInG"}), "+PONG\r\n");
    EXPECT_EQ(c.call({"IncrByFloat", "f", "1.5"}), bulk("1.5"));  // a name of more than 8 bytes
    for (const std::string& name : std::vector<std::string>{"G@T", "`et", "ge[", "ping{", std::string("PING\0", 5), "PIN", "PINGS",
                                   "incrbyfloatincrby", "PING PONG"}) {
        EXPECT_EQ(c.call({name}).rfind("-ERR unknown command '", 0), 0u) << name;
    }
    EXPECT_EQ(c.call({"CLIENT", "ID"}).front(), ':');
    EXPECT_EQ(c.call({"CLIENT", "GETNAME"}), kNil);
    EXPECT_EQ(c.call({"CLIENT", "SETNAME", "tester"}), kOk);
    EXPECT_EQ(c.call({"CLIENT", "GETNAME"}), bulk("tester"));
    EXPECT_EQ(c.call({"CLIENT", "BOGUS"}), "-ERR unknown subcommand 'BOGUS'. Try CLIENT HELP.\r\n");
    EXPECT_EQ(c.call({"CONFIG", "GET", "maxmemory"}), "*2\r\n" + bulk("maxmemory") + bulk("0"));
    EXPECT_EQ(c.call({"CONFIG", "SET", "nosuch", "1"}), "-ERR Unknown option or number of arguments for CONFIG SET - 'nosuch'\r\n");
    const std::string count = c.call({"COMMAND", "COUNT"});
    EXPECT_EQ(count.front(), ':');
    EXPECT_GT(std::atoi(count.c_str() + 1), 40);
    EXPECT_EQ(c.call({"COMMAND", "INFO", "get"}).substr(0, 4), "*1\r\n");
    // Names in any case, as redis-cli sends them; an unknown one answers a null entry.
    EXPECT_EQ(c.call({"COMMAND", "INFO", "GeT", "nosuch"}), "*2\r\n" + c.call({"COMMAND", "INFO", "get"}).substr(4) + "*-1\r\n");
    EXPECT_EQ(c.call({"COMMAND", "DOCS", "sEt", "nosuch"}), c.call({"COMMAND", "DOCS", "set"}));
    const std::string info = c.call({"INFO"});
    for (const char* section : {"# Server", "# Clients", "# Memory", "# Persistence", "# Stats", "# Keyspace"}) {
        EXPECT_NE(info.find(section), std::string::npos) << section;
    }
    // RESP3 after HELLO 3: a null is "_", a map is "%".
    const std::string hello = c.call({"HELLO", "3"});
    EXPECT_EQ(hello.substr(0, 4), "%7\r\n");
    EXPECT_EQ(c.call({"GET", "nothing"}), "_\r\n");
    EXPECT_EQ(c.call({"HELLO", "4"}), "-NOPROTO unsupported protocol version\r\n");
    EXPECT_EQ(c.call({"QUIT"}), kOk);
    EXPECT_TRUE(c.closedByPeer());
}

TEST_F(KvServer, ProtocolErrorClosesOnlyThatClient) {
    startServer(defaults());
    RespClient good(port_);
    RespClient bad(port_);
    EXPECT_EQ(good.call({"SET", "k", "v"}), kOk);
    ASSERT_TRUE(bad.sendRaw("*1\r\n$-5\r\n"));
    EXPECT_EQ(bad.reply().value_or(""), "-ERR Protocol error: invalid bulk length\r\n");
    EXPECT_TRUE(bad.closedByPeer());
    RespClient huge(port_);
    ASSERT_TRUE(huge.sendRaw("*1\r\n$999999999999\r\n"));
    EXPECT_EQ(huge.reply().value_or(""), "-ERR Protocol error: invalid bulk length\r\n");
    RespClient inlineBad(port_);
    ASSERT_TRUE(inlineBad.sendRaw("SET \"open\r\n"));
    EXPECT_EQ(inlineBad.reply().value_or(""), "-ERR Protocol error: unbalanced quotes in request\r\n");
    // A client that leaves in the middle of a command disturbs nobody.
    {
        RespClient half(port_);
        ASSERT_TRUE(half.sendRaw("*3\r\n$3\r\nSET\r\n$1\r\nx\r\n$10\r\nabc"));
    }
    EXPECT_EQ(good.call({"GET", "k"}), bulk("v"));
    EXPECT_EQ(good.call({"EXISTS", "x"}), ":0\r\n");
}

TEST_F(KvServer, TenThousandPipelinedCommandsAndInlineOnes) {
    startServer(defaults());
    RespClient c(port_);
    std::string batch;
    for (int i = 0; i < 10000; ++i) { batch += RespClient::encode({"INCR", "counter"}); }
    ASSERT_TRUE(c.sendRaw(batch));
    for (int i = 1; i <= 10000; ++i) {
        auto r = c.reply();
        ASSERT_TRUE(r) << i;
        ASSERT_EQ(*r, ":" + std::to_string(i) + "\r\n");
    }
    ASSERT_TRUE(c.sendRaw("PING\r\nSET inl \"a b\"\r\nGET inl\r\n"));
    EXPECT_EQ(c.reply().value_or(""), "+PONG\r\n");
    EXPECT_EQ(c.reply().value_or(""), kOk);
    EXPECT_EQ(c.reply().value_or(""), bulk("a b"));
}

// Replies leave whole and in order whether each batch's send is posted (the default: two reply
// buffers take turns while a send is in flight) or waited for: one short reply per batch (which a
// std::string keeps inside itself), a pipeline, QUIT's +OK before the close, and the reply to a command
// whose client half-closed right after sending it.
class KvSendModes : public KvServer, public testing::WithParamInterface<bool> {};

TEST_P(KvSendModes, RepliesLeaveWholeAndInOrderBeforeAnyClose) {
    ServerOptions o = defaults();
    o.postedSend = GetParam();
    startServer(o);
    // Eight clients at once keep the carriers busy, so that sends go to the driver and stay in flight
    // while the next batch is built.
    std::vector<std::thread> clients;
    std::atomic<int> wrong{0};
    for (int t = 0; t < 8; ++t) {
        clients.emplace_back([&, t] {
            RespClient c(port_);
            for (int i = 0; i < 300; ++i) {
                const std::string key = "k" + std::to_string(t) + ":" + std::to_string(i % 7);
                const std::string v = std::to_string(i);
                if (c.call({"SET", key, v}) != kOk || c.call({"GET", key}) != bulk(v)) { wrong.fetch_add(1); }
            }
        });
    }
    for (auto& t : clients) { t.join(); }
    EXPECT_EQ(wrong.load(), 0);
    {
        RespClient c(port_);
        std::string batch;
        for (int i = 0; i < 2000; ++i) { batch += RespClient::encode({"INCR", "n"}); }
        ASSERT_TRUE(c.sendRaw(batch));
        for (int i = 1; i <= 2000; ++i) { ASSERT_EQ(c.reply().value_or(""), ":" + std::to_string(i) + "\r\n") << i; }
        ASSERT_TRUE(c.sendRaw(RespClient::encode({"QUIT"})));
        EXPECT_EQ(c.reply().value_or(""), kOk);
        EXPECT_TRUE(c.closedByPeer());
    }
    RespClient h(port_);
    ASSERT_TRUE(h.sendRaw(RespClient::encode({"SET", "half", "closed"}) + RespClient::encode({"GET", "half"})));
    h.shutdownWrite();
    EXPECT_EQ(h.reply().value_or(""), kOk);
    EXPECT_EQ(h.reply().value_or(""), bulk("closed"));
    EXPECT_TRUE(h.closedByPeer());
}

INSTANTIATE_TEST_SUITE_P(BothSendPaths, KvSendModes, testing::Values(true, false),
                         [](const testing::TestParamInfo<bool>& i) { return i.param ? "Posted" : "Waited"; });

// INFO's total_commands_processed counts every command once, wherever it ran: on the connection's
// carrier, or on the other shard's, where a pipelined run of commands on its keys is sent (the counts
// are kept per carrier and summed). Two connections, 500 pipelined SETs each over keys of both shards.
TEST_F(KvServer, EveryCommandIsCountedOnceOnWhicheverCarrierItRan) {
    startServer(defaults());
    RespClient a(port_);
    RespClient b(port_);
    ASSERT_TRUE(a.connected() && b.connected());
    const uint64_t before = std::strtoull(infoField(port_, "stats", "total_commands_processed").c_str(), nullptr, 10);
    std::string batch;
    for (int i = 0; i < 500; ++i) {
        // Runs of the same key, so that a run of another shard's commands goes there in one message.
        batch += RespClient::encode({"SET", "key:" + std::to_string(i / 4), "v"});
    }
    for (RespClient* c : {&a, &b}) { ASSERT_TRUE(c->sendRaw(batch)); }
    for (RespClient* c : {&a, &b}) {
        for (int i = 0; i < 500; ++i) { ASSERT_EQ(c->reply().value_or(""), kOk) << i; }
    }
    // The INFO that reads it counts itself, as Redis does; so did the one that read `before`.
    const uint64_t after = std::strtoull(infoField(port_, "stats", "total_commands_processed").c_str(), nullptr, 10);
    EXPECT_EQ(after - before, 1000u + 1u);
    EXPECT_EQ(server_->stats().commands, after) << "Server::stats() sums the same counts";
}

TEST_F(KvServer, LargeAndBinaryValues) {
    startServer(defaults());
    RespClient c(port_);
    std::string big(1 << 20, '\0');
    for (size_t i = 0; i < big.size(); ++i) { big[i] = static_cast<char>(i * 131 + 7); }
    const std::string key("bin\0key\r\n", 9);
    EXPECT_EQ(c.call({"SET", key, big}), kOk);
    EXPECT_EQ(c.call({"GET", key}), bulk(big));
    EXPECT_EQ(c.call({"STRLEN", key}), ":1048576\r\n");
}

// Receives: by default each connection's multishot receive fills the pool's buffers, and the server's
// counters say so; a ring of one small buffer, which 10,000 pipelined commands and a 1 MiB value run
// dry again and again, loses and reorders nothing (the receive falls back to heap buffers and arms
// again); with provided buffers off, each connection receives into its own buffer.
TEST_F(KvServer, ReceivesThroughProvidedBuffersOrTheConnectionsOwn) {
    auto exercise = [this] {
        RespClient c(port_);
        std::string batch;
        for (int i = 0; i < 10000; ++i) { batch += RespClient::encode({"INCR", "n"}); }
        ASSERT_TRUE(c.sendRaw(batch));
        for (int i = 1; i <= 10000; ++i) { ASSERT_EQ(c.reply().value_or(""), ":" + std::to_string(i) + "\r\n") << i; }
        std::string big(1 << 20, '\0');
        for (size_t i = 0; i < big.size(); ++i) { big[i] = static_cast<char>(i * 131 + 7); }
        EXPECT_EQ(c.call({"SET", "big", big}), kOk);
        EXPECT_EQ(c.call({"GET", "big"}), bulk(big));
    };
    startServer(defaults());
    exercise();
    ServerStats st = server_->stats();
    EXPECT_GT(st.providedReceives, 0u);
    EXPECT_EQ(st.ownBufferReceives, 0u);
    EXPECT_GE(st.receiveRingCarriers, 1u);

    ServerOptions tiny = defaults();
    tiny.providedBufferCount = 1;
    tiny.providedBufferSize = 256;
    startServer(tiny);
    exercise();
    st = server_->stats();
    EXPECT_GT(st.providedReceives + st.heapReceives, 0u);
    EXPECT_GT(st.receiveRingExhausted, 0u) << "one buffer of 256 bytes for 1.4 MB of requests";
    EXPECT_EQ(st.ownBufferReceives, 0u);

    ServerOptions own = defaults();
    own.providedBuffers = false;
    startServer(own);
    exercise();
    st = server_->stats();
    EXPECT_GT(st.ownBufferReceives, 0u);
    EXPECT_EQ(st.providedReceives + st.heapReceives, 0u);
    EXPECT_EQ(st.receiveRingCarriers, 0u);
}

// A pool the options cannot make (a count that is not a power of two, buffers of no bytes) fails
// start() with EINVAL, before any log is opened or replayed.
TEST_F(KvServer, BadProvidedBufferOptionsFailStart) {
    ServerOptions o = defaults(true);
    o.providedBufferCount = 3;
    auto s = Server::start(rt(), o);
    ASSERT_FALSE(s);
    EXPECT_EQ(s.errorCode(), EINVAL);
    EXPECT_TRUE(std::filesystem::is_empty(dir_)) << "a log was opened before the options were checked";
    o.providedBufferCount = 4;
    o.providedBufferSize = 0;
    s = Server::start(rt(), o);
    ASSERT_FALSE(s);
    EXPECT_EQ(s.errorCode(), EINVAL);
    startServer(defaults());  // and a good one starts after them
    RespClient c(port_);
    EXPECT_EQ(c.call({"PING"}), "+PONG\r\n");
}

TEST_F(KvServer, AuthIsRequiredWithAPassword) {
    ServerOptions o = defaults();
    o.requirePass = "secret";
    startServer(o);
    RespClient c(port_);
    EXPECT_EQ(c.call({"GET", "k"}), "-NOAUTH Authentication required.\r\n");
    EXPECT_EQ(c.call({"NOPE"}), "-NOAUTH Authentication required.\r\n");
    EXPECT_EQ(c.call({"AUTH", "wrong"}), "-WRONGPASS invalid username-password pair or user is disabled.\r\n");
    EXPECT_EQ(c.call({"AUTH", "secret"}), kOk);
    EXPECT_EQ(c.call({"GET", "k"}), kNil);
    RespClient h(port_);
    EXPECT_EQ(h.call({"HELLO", "3", "AUTH", "default", "secret"}).substr(0, 4), "%7\r\n");
    EXPECT_EQ(h.call({"GET", "k"}), "_\r\n");
}

TEST_F(KvServer, AuthWithoutAPasswordIsAnError) {
    startServer(defaults());
    RespClient c(port_);
    EXPECT_EQ(c.call({"AUTH", "x"}),
              "-ERR AUTH <password> called without any password configured for the default user. Are you sure your "
              "configuration is correct?\r\n");
}

TEST_F(KvServer, MaxClientsAndMaxMemory) {
    ServerOptions o = defaults();
    o.maxClients = 1;
    startServer(o);
    RespClient first(port_);
    EXPECT_EQ(first.call({"PING"}), "+PONG\r\n");
    RespClient second(port_);
    EXPECT_EQ(second.reply().value_or(""), "-ERR max number of clients reached\r\n");
    EXPECT_TRUE(second.closedByPeer());
    EXPECT_EQ(first.call({"SET", "k", "v"}), kOk);
    EXPECT_EQ(first.call({"CONFIG", "SET", "maxmemory", "1"}), kOk);
    EXPECT_EQ(first.call({"SET", "k2", "v"}), "-OOM command not allowed when used memory > 'maxmemory'.\r\n");
    EXPECT_EQ(first.call({"GET", "k"}), bulk("v"));
    EXPECT_EQ(first.call({"DEL", "k"}), ":1\r\n");  // deleting is allowed
}

TEST_F(KvServer, SecondServerOnTheSamePortFailsWithEaddrinuse) {
    startServer(defaults());
    ServerOptions again = defaults();
    again.address = server_->localAddress();
    auto second = Server::start(rt(), again);
    ASSERT_FALSE(second);
    EXPECT_EQ(second.errorCode(), EADDRINUSE);
}

TEST_F(KvServer, EveryWriteSurvivesARestart) {
    for (Fsync mode : {Fsync::kAlways, Fsync::kEverySec, Fsync::kNo}) {
        ServerOptions o = defaults(/*withDir=*/true);
        o.appendFsync = mode;
        startServer(o);
        {
            RespClient c(port_);
            EXPECT_EQ(c.call({"FLUSHALL"}), kOk);
            for (int i = 0; i < 100; ++i) { EXPECT_EQ(c.call({"SET", "k" + std::to_string(i), "v" + std::to_string(i)}), kOk); }
            EXPECT_EQ(c.call({"INCRBY", "n", "5"}), ":5\r\n");
            EXPECT_EQ(c.call({"SET", "ttl", "v", "EX", "1000"}), kOk);
            EXPECT_EQ(c.call({"DEL", "k0"}), ":1\r\n");
            if (mode == Fsync::kAlways) {
                const std::string info = c.call({"INFO", "persistence"});
                EXPECT_NE(info.find("aof_fsyncs:"), std::string::npos);
            }
        }
        server_.reset();  // stop: logs written and synced
        startServer(o);
        RespClient c(port_);
        EXPECT_EQ(c.call({"DBSIZE"}), ":101\r\n") << static_cast<int>(mode);
        EXPECT_EQ(c.call({"GET", "k99"}), bulk("v99"));
        EXPECT_EQ(c.call({"GET", "k0"}), kNil);
        EXPECT_EQ(c.call({"GET", "n"}), bulk("5"));
        const std::string ttl = c.call({"TTL", "ttl"});
        EXPECT_TRUE(ttl == ":1000\r\n" || ttl == ":999\r\n") << ttl;
    }
}

TEST_F(KvServer, RecoveryTruncatesATornTailAndRefusesACorruptMiddle) {
    ServerOptions o = defaults(/*withDir=*/true);
    o.appendFsync = Fsync::kAlways;
    startServer(o);
    {
        RespClient c(port_);
        for (int i = 0; i < 40; ++i) { EXPECT_EQ(c.call({"SET", "k" + std::to_string(i), std::string(50, 'v')}), kOk); }
    }
    server_.reset();
    // The biggest shard log: cut it inside its last record, and keep a copy to damage in the middle.
    std::filesystem::path victim;
    uintmax_t size = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir_)) {
        if (e.path().extension() == ".log" && e.file_size() > size) {
            size = e.file_size();
            victim = e.path();
        }
    }
    ASSERT_GT(size, 200u);
    std::string bytes;
    {
        std::ifstream in(victim, std::ios::binary);
        bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    std::filesystem::resize_file(victim, size - 7);
    startServer(o);
    {
        RespClient c(port_);
        EXPECT_EQ(c.call({"DBSIZE"}), ":39\r\n");  // the torn record's key is gone, the rest is there
    }
    ServerStats st = server_->stats();
    EXPECT_GT(st.droppedTailBytes, 0u);
    server_.reset();
    EXPECT_EQ(std::filesystem::file_size(victim), size - 7 - st.droppedTailBytes);
    // A flipped bit in the first record, with valid records after it.
    bytes[20] = static_cast<char>(bytes[20] ^ 1);
    {
        std::ofstream out(victim, std::ios::binary | std::ios::trunc);
        out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    }
    auto refused = Server::start(rt(), o);
    ASSERT_FALSE(refused);
    EXPECT_EQ(refused.errorCode(), EILSEQ);
    o.truncateCorrupt = true;
    startServer(o);
    RespClient c(port_);
    const std::string n = c.call({"DBSIZE"});
    EXPECT_EQ(n.front(), ':');
    EXPECT_LT(std::atoi(n.c_str() + 1), 39);
}

TEST_F(KvServer, ADirectoryOfAnotherShardCountIsRefused) {
    std::ofstream(dir_ + "/kv.meta") << "spindle-kv 1 shards 7\n";
    auto s = Server::start(rt(), defaults(/*withDir=*/true));
    ASSERT_FALSE(s);
    EXPECT_EQ(s.errorCode(), EINVAL);
}

TEST_F(KvServer, ShutdownCommandStopsTheServer) {
    startServer(defaults());
    RespClient c(port_);
    ASSERT_TRUE(c.sendRaw(RespClient::encode({"SHUTDOWN", "NOSAVE"})));
    EXPECT_TRUE(c.closedByPeer());
    EXPECT_EQ(server_->wait(), 0);
    RespClient late(port_, 500ms);
    EXPECT_FALSE(late.connected());
}

}  // namespace
}  // namespace spindle::kv
