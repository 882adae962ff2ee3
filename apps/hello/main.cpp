// spindle-hello: the README's first program. Reads a file through the ring from
// a fiber and prints how many bytes came back.
#include <fcntl.h>

#include <cstdio>

#include "core/io.h"
#include "core/runtime.h"

int main(int argc, char** argv) {
    const char* path = argc > 1 ? argv[1] : "/etc/hostname";
    auto bytes = spindle::Runtime::run([path] {
        auto fd = spindle::open(path, O_RDONLY);
        if (!fd) { return size_t{0}; }
        char buf[256];
        auto n = spindle::read(*fd, buf, sizeof buf, 0);  // parks this fiber until the CQE arrives
        (void)spindle::close(*fd);
        return n.valueOr(0);
    });
    if (!bytes) {
        std::fprintf(stderr, "spindle-hello: %s\n", bytes.error().message().c_str());
        return 1;
    }
    std::printf("read %zu bytes of %s through io_uring\n", *bytes, path);
    return 0;
}
