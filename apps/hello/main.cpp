// SPDX-License-Identifier: Apache-2.0
// spindle-hello: the README's first program. Reads the start of a file from a fiber, through
// io_uring or (where io_uring cannot be used, or SPINDLE_BACKEND says so) epoll, names the backend
// that did it, and says why when it cannot.
#include <fcntl.h>

#include <cstdio>
#include <cstring>

#include "core/io.h"
#include "core/runtime.h"
#include "spindle_version.h"  // generated: SPINDLE_VERSION_STRING

int main(int argc, char** argv) {
    // Usage: spindle-hello [FILE] (default /etc/hostname) | --version | --help. Exit status as every app's:
    // 0 done, 1 a run-time failure (said on stderr), 2 a bad command line.
    if (argc > 1 && std::strcmp(argv[1], "--version") == 0) {
        std::printf("spindle-hello %s\n", SPINDLE_VERSION_STRING);
        return 0;
    }
    if (argc > 1 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0)) {
        // help2man reads this for the man page (cmake/manpages.cmake): a usage line, then options.
        std::printf("Usage: spindle-hello [FILE]\n"
                    "Reads the start of FILE (default /etc/hostname) from a fiber and names the I/O backend.\n"
                    "\n"
                    "Options:\n"
                    "  -h, --help     print this help and exit\n"
                    "  --version      print the version and exit\n"
                    "\n"
                    "The exit status is 0 when done, 1 when the runtime did not start or FILE could not be read,\n"
                    "and 2 for bad usage.\n");
        return 0;
    }
    if (argc > 2 || (argc == 2 && argv[1][0] == '-')) {
        std::fprintf(stderr, "usage: spindle-hello [FILE] | --version | --help\n");
        return 2;
    }
    const char* path = argc > 1 ? argv[1] : "/etc/hostname";
    auto rt = spindle::Runtime::start();  // io_uring, else epoll with the reason logged
    if (!rt) {
        std::fprintf(stderr, "spindle-hello: the runtime did not start: %s\n", rt.error().message().c_str());
        return 1;
    }
    const char* backend = spindle::toString(rt->backend());
    auto fiber = rt->spawn([path, backend] {
        auto fd = spindle::open(path, O_RDONLY);
        if (!fd) {
            std::fprintf(stderr, "spindle-hello: open %s: %s\n", path, fd.error().message().c_str());
            return 1;
        }
        char buf[256];
        auto n = spindle::read(*fd, buf, sizeof buf, 0);  // parks this fiber until the read completes
        (void)spindle::close(*fd);
        if (!n) {
            std::fprintf(stderr, "spindle-hello: read %s: %s\n", path, n.error().message().c_str());
            return 1;
        }
        std::printf("read %zu bytes of %s through %s\n", *n, path, backend);
        return 0;
    });
    if (!fiber) {
        std::fprintf(stderr, "spindle-hello: spawn: %s\n", fiber.error().message().c_str());
        return 1;
    }
    return fiber->join();  // ~Runtime then shuts the carriers down and joins them
}
