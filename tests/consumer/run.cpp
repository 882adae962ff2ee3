// SPDX-License-Identifier: Apache-2.0
// What the out-of-tree consumers of an installed spindle run (scripts/consumer-check): the headers as a
// user includes them, a runtime, a fiber-blocking read and write on a pipe, the per-fiber storage, and a
// TCP round trip on loopback. main.cpp calls it in a program; host.cpp calls it in a dlopen'ed module,
// where the runtime's thread-local storage must work from a shared object.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

#include <spindle/core/fiber_local.h>
#include <spindle/core/io.h>
#include <spindle/core/runtime.h>
#include <spindle/net/tcp.h>

namespace {

spindle::FiberLocal<std::string> tName;

int fail(const char* what, const std::error_code& ec) {
    std::fprintf(stderr, "consumer: %s: %s\n", what, ec.message().c_str());
    return 1;
}

int roundTrips() {
    int fds[2];
    if (::pipe(fds) != 0) { return fail("pipe", std::error_code(errno, std::generic_category())); }
    auto writer = spindle::spawn([fd = fds[1]] {
        tName.get() = "writer";
        return spindle::write(fd, "spindle", 7);
    });
    if (!writer) { return fail("spawn", writer.error()); }
    char buf[8] = {};
    auto n = spindle::read(fds[0], buf, sizeof buf);
    auto wrote = writer->join();
    ::close(fds[0]);
    ::close(fds[1]);
    if (!n || !wrote) { return fail("pipe read/write", !n ? n.error() : wrote.error()); }
    if (*n != 7 || std::memcmp(buf, "spindle", 7) != 0) {
        std::fprintf(stderr, "consumer: read %zu bytes, not the 7 written\n", *n);
        return 1;
    }
    if (!tName.get().empty()) {
        std::fprintf(stderr, "consumer: a fiber saw another fiber's FiberLocal value\n");
        return 1;
    }

    auto address = spindle::net::SocketAddress::parse("127.0.0.1:0");
    if (!address) { return fail("address", address.error()); }
    auto listener = spindle::net::TcpListener::bind(*address);
    if (!listener) { return fail("bind", listener.error()); }
    auto client = spindle::net::TcpStream::connect(listener->localAddress());
    if (!client) { return fail("connect", client.error()); }
    auto server = listener->accept();
    if (!server) { return fail("accept", server.error()); }
    if (auto sent = client->send("ping", 4); !sent) { return fail("send", sent.error()); }
    char got[4];
    auto r = server->recv(got, sizeof got);
    if (!r) { return fail("recv", r.error()); }
    if (*r == 0 || std::memcmp(got, "ping", *r) != 0) {
        std::fprintf(stderr, "consumer: the server received something other than the client sent\n");
        return 1;
    }
    return 0;
}

}  // namespace

// Returns 0 and prints "consumer: ok", or names what failed on stderr and returns 1.
extern "C" __attribute__((visibility("default"))) int spindle_consumer_run() {
    spindle::RuntimeOptions options;
    options.carriers = 2;
    auto status = spindle::Runtime::run(roundTrips, options);
    if (!status) { return fail("runtime", status.error()); }
    if (*status != 0) { return *status; }
    std::printf("consumer: ok\n");
    return 0;
}
