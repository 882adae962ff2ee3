// SPDX-License-Identifier: Apache-2.0
#pragma once
// A connected TCP pair over IPv4 loopback for the net tests: the listener (kept so its port stays
// bound), the connecting end and the accepted end. Aborts the test binary when the loopback itself
// fails, which no test here could recover from.

#include <chrono>
#include <utility>

#include "base/check.h"
#include "net/tcp.h"

namespace spindle::testing_support {

struct LoopbackPair {
    net::TcpListener listener;
    net::TcpStream client;
    net::TcpStream server;
};

inline LoopbackPair connectLoopbackPair() {
    using namespace std::chrono_literals;
    LoopbackPair p;
    auto l = net::TcpListener::bind(net::SocketAddress::ipv4Loopback(0));
    SPINDLE_CHECK(static_cast<bool>(l));
    p.listener = std::move(*l);
    auto c = net::TcpStream::connect(p.listener.localAddress(), 5s);
    SPINDLE_CHECK(static_cast<bool>(c));
    p.client = std::move(*c);
    auto s = p.listener.accept(5s);
    SPINDLE_CHECK(static_cast<bool>(s));
    p.server = std::move(*s);
    return p;
}

}  // namespace spindle::testing_support
