// SPDX-License-Identifier: Apache-2.0
// Loads the consumer built as a module (argv[1]) with dlopen and runs it (scripts/consumer-check): the
// case that needs position-independent spindle libraries and a thread-local storage model that works in
// a dlopen'ed object. Exit status: that of spindle_consumer_run(), or 1 when loading fails, 2 on usage.
#include <dlfcn.h>

#include <cstdio>

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s MODULE.so\n", argv[0]);
        return 2;
    }
    void* module = ::dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (module == nullptr) {
        std::fprintf(stderr, "host: dlopen %s: %s\n", argv[1], ::dlerror());
        return 1;
    }
    auto run = reinterpret_cast<int (*)()>(::dlsym(module, "spindle_consumer_run"));
    if (run == nullptr) {
        std::fprintf(stderr, "host: dlsym spindle_consumer_run: %s\n", ::dlerror());
        return 1;
    }
    return run();
}
