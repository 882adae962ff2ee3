// SPDX-License-Identifier: Apache-2.0
/*
 * raw_echo: the io_uring floor under scripts/bench/echo.sh. raw_loop.h's loop (SINGLE_ISSUER |
 * DEFER_TASKRUN, multishot accept and receive into a provided-buffer ring, sends without a CQE on
 * success, one io_uring_enter per loop) sending every byte it receives back on its connection, and
 * doing nothing else. It is not a server to use; it is what the kernel charges any io_uring server for
 * one echoed message on this machine, beside epoll_echo.c, the epoll loop's.
 *
 * Each connection has one buffer of the provided buffers' size (2 KiB): a receive is copied there and
 * sent from there, so that the provided buffer goes back to the ring at once. This is safe only under
 * ping-pong, the load echo.sh's client makes (a client sends its next message after its echo came
 * back, so the buffer's last send has left it before the next receive lands); under a streaming client
 * a receive could overwrite a send still in flight.
 *
 * usage: raw_echo [--port N] [--address A]     (SIGINT/SIGTERM: exit, counts on stderr)
 * Build: cc -O2 -o raw_echo raw_echo.c -luring     (raw_loop.h beside it)
 */
#define _GNU_SOURCE
#include <getopt.h>

#include "raw_loop.h"

static char *buffers[kRawMaxFds];  /* per descriptor, made at its first accept and reused */
static unsigned long long echoed_messages, echoed_bytes;

static void raw_on_accept(int fd) {
    if (buffers[fd] == NULL && (buffers[fd] = malloc(kRawBufSize)) == NULL) raw_die("malloc");
}

static void raw_on_wake(void) {}

static void raw_on_data(int fd, const char *data, size_t n) {
    memcpy(buffers[fd], data, n);  /* n <= kRawBufSize: one provided buffer at most */
    raw_send(fd, buffers[fd], n);
    echoed_messages++;
    echoed_bytes += n;
}

int main(int argc, char **argv) {
    const char *address = "127.0.0.1";
    int port = 7400;
    static const struct option opts[] = {
        {"port", required_argument, NULL, 'p'}, {"address", required_argument, NULL, 'a'},
        {"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
    int opt;
    while ((opt = getopt_long(argc, argv, "p:a:h", opts, NULL)) != -1) {
        switch (opt) {
            case 'p': port = atoi(optarg); break;
            case 'a': address = optarg; break;
            default:
                fprintf(stderr, "usage: raw_echo [--port N] [--address A]\n");
                return opt == 'h' ? 0 : 2;
        }
    }
    if (optind < argc || port <= 0 || port > 65535) {
        fprintf(stderr, "raw_echo: --port must be 1..65535\n");
        return 2;
    }
    raw_setup_process();
    int lfd = raw_listen("raw_echo", address, port, 0);
    raw_run_uring(lfd);
    fprintf(stderr, "raw_echo: %llu connections, %llu receives echoed, %llu bytes\n", raw_accepted, echoed_messages,
            echoed_bytes);
    return 0;
}
