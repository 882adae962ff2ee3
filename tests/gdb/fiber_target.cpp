// SPDX-License-Identifier: Apache-2.0
// The program tests/gdb/spindle_gdb_test.py looks into with gdb: two fibers suspended in known waits, a
// line "ready <reader id> <sleeper id>" on stdout once the runtime lists both as suspended, then, when
// stdin closes, both waits ended and a clean exit (status 0 only if the fibers saw what they should:
// a process that gdb left in a bad state fails here).

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "core/fiber.h"
#include "core/io.h"
#include "core/runtime.h"

namespace {

// Named and not inlined: the test finds this frame in the fiber's backtrace.
[[gnu::noinline]] int waitForByte(int fd) {
    char c = 0;
    auto r = spindle::read(fd, &c, 1);
    return r && *r == 1 && c == 'g' ? 0 : 1;
}

bool suspended(const spindle::FiberListing& l, uint64_t id) {
    for (const auto& f : l.fibers) {
        if (f.id == id) { return f.state == "suspended"; }
    }
    return false;
}

}  // namespace

int main() {
    int p[2];
    if (::pipe(p) != 0) { return 2; }
    spindle::RuntimeOptions o;
    o.carriers = 2;
    auto rt = spindle::Runtime::start(o);
    if (!rt) { return 2; }
    auto reader = rt->spawn([&] { return waitForByte(p[0]); }, spindle::SpawnOptions{.name = "gdb-reader", .carrier = 0});
    auto sleeper = rt->spawn([] { return spindle::this_fiber::sleep_for(std::chrono::hours(1)).errorCode(); },
                             spindle::SpawnOptions{.name = "gdb-sleeper", .carrier = 1});
    if (!reader || !sleeper) { return 2; }
    const uint64_t rid = reader->id();
    const uint64_t sid = sleeper->id();
    for (;;) {
        const auto l = rt->fibers();
        if (suspended(l, rid) && suspended(l, sid)) { break; }
        ::usleep(1000);
    }
    std::printf("ready %llu %llu\n", static_cast<unsigned long long>(rid), static_cast<unsigned long long>(sid));
    std::fflush(stdout);
    char buf[64];
    while (::read(STDIN_FILENO, buf, sizeof(buf)) > 0) {}
    if (::write(p[1], "g", 1) != 1) { return 3; }
    sleeper->cancel();
    const int r = reader->join();
    const int s = sleeper->join();
    return r == 0 && s == ECANCELED ? 0 : 4;
}
