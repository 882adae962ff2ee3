// spindle-hello: the README's first program. Reads the start of a file through
// the ring from a fiber, and says why when it cannot.
#include <fcntl.h>

#include <cstdio>

#include "core/io.h"
#include "core/runtime.h"

int main(int argc, char** argv) {
    const char* path = argc > 1 ? argv[1] : "/etc/hostname";
    auto rc = spindle::Runtime::run([path] {
        auto fd = spindle::open(path, O_RDONLY);
        if (!fd) {
            std::fprintf(stderr, "spindle-hello: open %s: %s\n", path, fd.error().message().c_str());
            return 1;
        }
        char buf[256];
        auto n = spindle::read(*fd, buf, sizeof buf, 0);  // parks this fiber until the CQE arrives
        (void)spindle::close(*fd);
        if (!n) {
            std::fprintf(stderr, "spindle-hello: read %s: %s\n", path, n.error().message().c_str());
            return 1;
        }
        std::printf("read %zu bytes of %s through io_uring\n", *n, path);
        return 0;
    });
    if (!rc) {
        std::fprintf(stderr, "spindle-hello: the runtime did not start: %s\n", rc.error().message().c_str());
        return 1;
    }
    return *rc;
}
