// SPDX-License-Identifier: Apache-2.0
/*
 * raw_loop.h: what the floor loops of scripts/bench (raw_http.c, raw_resp.c) share: the listening
 * socket, the process setup, and the io_uring loop. It is included by exactly one file per program
 * (everything in it is static), and that file defines the loop's three calls:
 *   static void raw_on_accept(int fd);                               a new connection, fd < kRawMaxFds
 *   static void raw_on_data(int fd, const char *data, size_t n);     bytes received on fd (n > 0)
 *   static void raw_on_wake(void);                                   once per wake-up, before its CQEs
 * raw_on_data answers with raw_send, whose bytes must stay valid until the kernel has sent them (the
 * loops answer from static buffers).
 *
 * The io_uring loop is the leanest the interface allows: SINGLE_ISSUER | DEFER_TASKRUN (as spindle's
 * carriers), one multishot accept, one multishot receive per connection into a provided-buffer ring
 * (4096 x 2 KiB, spindle-httpd's default), each send an SQE with MSG_WAITALL and IOSQE_CQE_SKIP_SUCCESS
 * (no CQE unless it fails), and one io_uring_enter per loop that submits the sends and waits for the
 * next completion. Needs liburing 2.3 or later and a 6.0 kernel (DEFER_TASKRUN).
 */
#ifndef SPINDLE_SCRIPTS_BENCH_RAW_LOOP_H
#define SPINDLE_SCRIPTS_BENCH_RAW_LOOP_H

#include <arpa/inet.h>
#include <errno.h>
#include <liburing.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

enum {
    kRawMaxFds = 1 << 16,  /* connection state is indexed by descriptor */
    kRawBufCount = 4096,   /* provided buffers */
    kRawBufSize = 2048,
    kRawBufGroup = 1,
};

static void raw_on_accept(int fd);
static void raw_on_data(int fd, const char *data, size_t n);
static void raw_on_wake(void);

static volatile sig_atomic_t raw_stop;  /* set by SIGINT and SIGTERM: the loop returns */
static unsigned long long raw_accepted;

/* Prints what failed with errno's text, and exits with status 1. */
static void raw_die(const char *what) {
    perror(what);
    exit(1);
}

static void raw_on_signal(int sig) {
    (void)sig;
    raw_stop = 1;
}

/* Raises the descriptor limit to its hard limit, and makes SIGINT and SIGTERM end the loop (SIGPIPE
 * ignored: a peer that went away fails its send instead). */
static void raw_setup_process(void) {
    struct rlimit lim;
    if (getrlimit(RLIMIT_NOFILE, &lim) == 0) {
        lim.rlim_cur = lim.rlim_max;
        setrlimit(RLIMIT_NOFILE, &lim);
    }
    struct sigaction sa = {.sa_handler = raw_on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

/* A TCP socket listening on address:port (backlog 4096, SO_REUSEADDR). Errors: exits with status 2
 * on an address that is not IPv4 dotted-quad, 1 when the socket cannot be made, bound or listened on. */
static int raw_listen(const char *who, const char *address, int port, int nonblock) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | (nonblock ? SOCK_NONBLOCK : 0), 0);
    if (fd < 0) raw_die("socket");
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, address, &sa.sin_addr) != 1) {
        fprintf(stderr, "%s: bad address %s\n", who, address);
        exit(2);
    }
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0) raw_die("bind");
    if (listen(fd, 4096) != 0) raw_die("listen");
    return fd;
}

/* ---- io_uring --------------------------------------------------------------------------------- */

enum { kRawTagAccept = 1, kRawTagRecv = 2, kRawTagSend = 3 };
static inline uint64_t raw_tag(int kind, int fd) { return ((uint64_t)(uint32_t)fd << 8) | (uint64_t)kind; }

static struct io_uring raw_ring;
static struct io_uring_buf_ring *raw_buffers;
static char *raw_buffer_memory;

/* The next SQE, submitting the queue first when it is full. Errors: exits when none frees up. */
static struct io_uring_sqe *raw_sqe(void) {
    struct io_uring_sqe *sqe = io_uring_get_sqe(&raw_ring);
    if (sqe == NULL) {
        io_uring_submit(&raw_ring);
        sqe = io_uring_get_sqe(&raw_ring);
        if (sqe == NULL) raw_die("io_uring_get_sqe");
    }
    return sqe;
}

/* Queues a send of data[0, n) on fd. Sends on one connection leave in the order queued while its
 * socket has room (each is issued at submission); a failed send posts a CQE the loop ignores: the
 * connection's receive ends it. */
static void raw_send(int fd, const void *data, size_t n) {
    struct io_uring_sqe *sqe = raw_sqe();
    io_uring_prep_send(sqe, fd, data, n, MSG_NOSIGNAL | MSG_WAITALL);
    sqe->flags |= IOSQE_CQE_SKIP_SUCCESS;
    io_uring_sqe_set_data64(sqe, raw_tag(kRawTagSend, fd));
}

static void raw_arm_recv(int fd) {
    struct io_uring_sqe *sqe = raw_sqe();
    io_uring_prep_recv_multishot(sqe, fd, NULL, 0, 0);
    sqe->flags |= IOSQE_BUFFER_SELECT;
    sqe->buf_group = kRawBufGroup;
    io_uring_sqe_set_data64(sqe, raw_tag(kRawTagRecv, fd));
}

static void raw_arm_accept(int lfd) {
    struct io_uring_sqe *sqe = raw_sqe();
    io_uring_prep_multishot_accept(sqe, lfd, NULL, NULL, SOCK_CLOEXEC);
    io_uring_sqe_set_data64(sqe, raw_tag(kRawTagAccept, lfd));
}

/* Serves the listening socket lfd until SIGINT or SIGTERM. Errors: exits with status 1 when the ring
 * or its buffers cannot be set up, or waiting fails otherwise than by a signal. */
static void raw_run_uring(int lfd) {
    struct io_uring_params p = {.flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN |
                                         IORING_SETUP_CQSIZE | IORING_SETUP_SUBMIT_ALL,
                                .cq_entries = 16384};
    int r = io_uring_queue_init_params(4096, &raw_ring, &p);
    if (r < 0) { errno = -r; raw_die("io_uring_queue_init_params"); }
    /* liburing 2.3 (Debian 12) has no io_uring_setup_buf_ring: map the ring and register it. */
    raw_buffers = mmap(NULL, kRawBufCount * sizeof(struct io_uring_buf), PROT_READ | PROT_WRITE,
                       MAP_ANONYMOUS | MAP_PRIVATE, -1, 0);
    if (raw_buffers == MAP_FAILED) raw_die("mmap");
    io_uring_buf_ring_init(raw_buffers);
    struct io_uring_buf_reg reg = {.ring_addr = (uint64_t)(uintptr_t)raw_buffers, .ring_entries = kRawBufCount,
                                   .bgid = kRawBufGroup};
    r = io_uring_register_buf_ring(&raw_ring, &reg, 0);
    if (r < 0) { errno = -r; raw_die("io_uring_register_buf_ring"); }
    raw_buffer_memory = aligned_alloc(4096, (size_t)kRawBufCount * kRawBufSize);
    if (raw_buffer_memory == NULL) raw_die("aligned_alloc");
    for (int i = 0; i < kRawBufCount; i++) {
        io_uring_buf_ring_add(raw_buffers, raw_buffer_memory + (size_t)i * kRawBufSize, kRawBufSize,
                              (unsigned short)i, io_uring_buf_ring_mask(kRawBufCount), i);
    }
    io_uring_buf_ring_advance(raw_buffers, kRawBufCount);
    raw_arm_accept(lfd);
    while (!raw_stop) {
        r = io_uring_submit_and_wait(&raw_ring, 1);
        if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY) { errno = -r; raw_die("io_uring_submit_and_wait"); }
        raw_on_wake();
        struct io_uring_cqe *cqe;
        unsigned head, seen = 0, returned = 0;
        io_uring_for_each_cqe(&raw_ring, head, cqe) {
            seen++;
            int kind = (int)(cqe->user_data & 0xff), fd = (int)(cqe->user_data >> 8);
            if (kind == kRawTagAccept) {
                if (cqe->res >= 0 && cqe->res < kRawMaxFds) {
                    int one = 1;
                    setsockopt(cqe->res, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    raw_accepted++;
                    raw_on_accept(cqe->res);
                    raw_arm_recv(cqe->res);
                } else if (cqe->res >= 0) {
                    close(cqe->res);
                }
                if (!(cqe->flags & IORING_CQE_F_MORE)) raw_arm_accept(lfd);  /* EMFILE included: retried */
            } else if (kind == kRawTagRecv) {
                if (cqe->flags & IORING_CQE_F_BUFFER) {
                    unsigned id = cqe->flags >> IORING_CQE_BUFFER_SHIFT;
                    char *data = raw_buffer_memory + (size_t)id * kRawBufSize;
                    if (cqe->res > 0) raw_on_data(fd, data, (size_t)cqe->res);
                    io_uring_buf_ring_add(raw_buffers, data, kRawBufSize, (unsigned short)id,
                                          io_uring_buf_ring_mask(kRawBufCount), (int)returned++);
                }
                if (cqe->res == 0 || (cqe->res < 0 && cqe->res != -ENOBUFS)) {
                    if (!(cqe->flags & IORING_CQE_F_MORE)) close(fd);
                } else if (!(cqe->flags & IORING_CQE_F_MORE)) {
                    raw_arm_recv(fd);  /* the ring ran dry, or the kernel ended the multishot */
                }
            }
            /* kRawTagSend: only a failed send posts a CQE (the peer went away); its receive ends the connection. */
        }
        if (returned > 0) io_uring_buf_ring_advance(raw_buffers, (int)returned);
        io_uring_cq_advance(&raw_ring, seen);
    }
    /* The multishot accept holds the listening socket until the kernel has torn the ring down, after
     * this process may have exited: shut it down now, so that the next loop can bind the port at once
     * (SO_REUSEADDR binds beside a socket that no longer listens). */
    shutdown(lfd, SHUT_RDWR);
    io_uring_queue_exit(&raw_ring);
    close(lfd);
}

#endif /* SPINDLE_SCRIPTS_BENCH_RAW_LOOP_H */
