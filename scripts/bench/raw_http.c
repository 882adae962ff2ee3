// SPDX-License-Identifier: Apache-2.0
/*
 * raw_http: the floor under scripts/bench/http.sh. A single-threaded loop that answers every request
 * on a connection with spindle-httpd's exact hello response (same headers, same Date, same 13-byte
 * body) and does nothing else: no request parsing beyond finding the end of each head ("\r\n\r\n",
 * so pipelined requests get one answer each), no routing, no limits, no timeouts. It is not a
 * server to use; it is what the kernel charges a server for one request and its answer on this
 * machine, so that http.sh can say how much of a server's CPU per request is the server's own.
 *
 * Two loops, each the leanest its interface allows:
 *   --mode epoll  level-triggered epoll, accept4 until EAGAIN, one recv per readable connection into
 *                 a shared buffer, one send of all the answers it owes (what nginx does per request,
 *                 less nginx);
 *   --mode uring  io_uring with SINGLE_ISSUER | DEFER_TASKRUN (as spindle's carriers), one multishot
 *                 accept, one multishot receive per connection into a provided-buffer ring
 *                 (4096 x 2 KiB, spindle-httpd's default), each send an SQE with MSG_WAITALL and
 *                 IOSQE_CQE_SKIP_SUCCESS (no CQE unless it fails), and one io_uring_enter per loop
 *                 that submits the sends and waits for the next completion.
 * Answers come from one static buffer holding kBatch copies of the response; its Date is rewritten
 * once a second (an in-flight send may carry the next second's date: harmless here).
 *
 * usage: raw_http --mode epoll|uring [--port N] [--address A]     (SIGINT/SIGTERM: exit, counts on stderr)
 * Build: cc -O2 -o raw_http raw_http.c -luring
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <liburing.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum {
    kMaxFds = 1 << 16,    /* connection state is indexed by descriptor */
    kBatch = 16,          /* answers one send carries at most */
    kBufCount = 4096,     /* provided buffers (uring) */
    kBufSize = 2048,
    kBufGroup = 1,
};

static const char kHead[] = "HTTP/1.1 200 OK\r\nServer: spindle\r\nDate: ";
static const char kTail[] = " GMT\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 13\r\n\r\nHello, World!";
enum { kDateLen = 25, kResponseLen = sizeof kHead - 1 + kDateLen + sizeof kTail - 1 };

static char responses[kBatch * kResponseLen];
static time_t response_second = -1;
static unsigned char match[kMaxFds];  /* per descriptor: how much of "\r\n\r\n" the last bytes matched */
static volatile sig_atomic_t stop;
static unsigned long long answered, accepted_total;

static void die(const char *what) {
    perror(what);
    exit(1);
}

/* Rewrites the Date of every copy when the second changed ("Wed, 25 Nov 2026 03:41:22"). */
static void refresh_date(void) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME_COARSE, &now);
    if (now.tv_sec == response_second) return;
    response_second = now.tv_sec;
    struct tm t;
    gmtime_r(&now.tv_sec, &t);
    char date[kDateLen + 1];
    strftime(date, sizeof date, "%a, %d %b %Y %H:%M:%S", &t);
    for (int i = 0; i < kBatch; i++) {
        char *p = responses + (size_t)i * kResponseLen;
        memcpy(p, kHead, sizeof kHead - 1);
        memcpy(p + sizeof kHead - 1, date, kDateLen);
        memcpy(p + sizeof kHead - 1 + kDateLen, kTail, sizeof kTail - 1);
    }
}

/* Counts the request heads that end in data[0, n), carrying the partial match of fd over calls. */
static unsigned heads_ended(int fd, const char *data, size_t n) {
    static const char kEnd[] = "\r\n\r\n";
    unsigned m = match[fd], heads = 0;
    for (size_t i = 0; i < n; i++) {
        if (data[i] == kEnd[m]) {
            if (++m == 4) { heads++; m = 0; }
        } else {
            m = data[i] == '\r' ? 1 : 0;
        }
    }
    match[fd] = (unsigned char)m;
    return heads;
}

static int listen_on(const char *address, int port, int nonblock) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | (nonblock ? SOCK_NONBLOCK : 0), 0);
    if (fd < 0) die("socket");
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, address, &sa.sin_addr) != 1) { fprintf(stderr, "raw_http: bad address %s\n", address); exit(2); }
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0) die("bind");
    if (listen(fd, 4096) != 0) die("listen");
    return fd;
}

static void on_signal(int sig) { (void)sig; stop = 1; }

/* ---- epoll ------------------------------------------------------------------------------------ */

static void run_epoll(int lfd) {
    int ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0) die("epoll_create1");
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = lfd};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev) != 0) die("epoll_ctl");
    static struct epoll_event events[512];
    static char buf[16384];
    while (!stop) {
        int n = epoll_wait(ep, events, 512, -1);
        if (n < 0) {
            if (errno == EINTR) continue;
            die("epoll_wait");
        }
        refresh_date();
        for (int i = 0; i < n; i++) {
            int fd = events[i].data.fd;
            if (fd == lfd) {
                for (;;) {
                    int c = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
                    if (c < 0) break;  /* EAGAIN, or EMFILE: the next wake-up tries again */
                    if (c >= kMaxFds) { close(c); continue; }
                    int one = 1;
                    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    match[c] = 0;
                    struct epoll_event cev = {.events = EPOLLIN | EPOLLRDHUP, .data.fd = c};
                    if (epoll_ctl(ep, EPOLL_CTL_ADD, c, &cev) != 0) { close(c); continue; }
                    accepted_total++;
                }
                continue;
            }
            ssize_t r = recv(fd, buf, sizeof buf, 0);
            if (r <= 0) {
                if (r < 0 && errno == EAGAIN) continue;
                close(fd);  /* also leaves the epoll set */
                continue;
            }
            unsigned heads = heads_ended(fd, buf, (size_t)r);
            answered += heads;
            while (heads > 0) {  /* a full socket drops answers: wrk never lets it fill */
                unsigned k = heads < kBatch ? heads : kBatch;
                if (send(fd, responses, (size_t)k * kResponseLen, MSG_NOSIGNAL) < 0) break;
                heads -= k;
            }
        }
    }
    close(ep);
}

/* ---- io_uring --------------------------------------------------------------------------------- */

enum { kTagAccept = 1, kTagRecv = 2, kTagSend = 3 };
static inline uint64_t tag(int kind, int fd) { return ((uint64_t)(uint32_t)fd << 8) | (uint64_t)kind; }

static struct io_uring ring;
static struct io_uring_buf_ring *buffers;
static char *buffer_memory;

static struct io_uring_sqe *sqe_or_flush(void) {
    struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
    if (sqe == NULL) {
        io_uring_submit(&ring);
        sqe = io_uring_get_sqe(&ring);
        if (sqe == NULL) die("io_uring_get_sqe");
    }
    return sqe;
}

static void arm_recv(int fd) {
    struct io_uring_sqe *sqe = sqe_or_flush();
    io_uring_prep_recv_multishot(sqe, fd, NULL, 0, 0);
    sqe->flags |= IOSQE_BUFFER_SELECT;
    sqe->buf_group = kBufGroup;
    io_uring_sqe_set_data64(sqe, tag(kTagRecv, fd));
}

static void arm_accept(int lfd) {
    struct io_uring_sqe *sqe = sqe_or_flush();
    io_uring_prep_multishot_accept(sqe, lfd, NULL, NULL, SOCK_CLOEXEC);
    io_uring_sqe_set_data64(sqe, tag(kTagAccept, lfd));
}

static void queue_answers(int fd, unsigned heads) {
    while (heads > 0) {
        unsigned k = heads < kBatch ? heads : kBatch;
        struct io_uring_sqe *sqe = sqe_or_flush();
        io_uring_prep_send(sqe, fd, responses, (size_t)k * kResponseLen, MSG_NOSIGNAL | MSG_WAITALL);
        sqe->flags |= IOSQE_CQE_SKIP_SUCCESS;
        io_uring_sqe_set_data64(sqe, tag(kTagSend, fd));
        heads -= k;
    }
}

static void run_uring(int lfd) {
    struct io_uring_params p = {.flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN |
                                         IORING_SETUP_CQSIZE | IORING_SETUP_SUBMIT_ALL,
                                .cq_entries = 16384};
    int r = io_uring_queue_init_params(4096, &ring, &p);
    if (r < 0) { errno = -r; die("io_uring_queue_init_params"); }
    /* liburing 2.3 (Debian 12) has no io_uring_setup_buf_ring: map the ring and register it. */
    buffers = mmap(NULL, kBufCount * sizeof(struct io_uring_buf), PROT_READ | PROT_WRITE,
                   MAP_ANONYMOUS | MAP_PRIVATE, -1, 0);
    if (buffers == MAP_FAILED) die("mmap");
    io_uring_buf_ring_init(buffers);
    struct io_uring_buf_reg reg = {.ring_addr = (uint64_t)(uintptr_t)buffers, .ring_entries = kBufCount, .bgid = kBufGroup};
    r = io_uring_register_buf_ring(&ring, &reg, 0);
    if (r < 0) { errno = -r; die("io_uring_register_buf_ring"); }
    buffer_memory = aligned_alloc(4096, (size_t)kBufCount * kBufSize);
    if (buffer_memory == NULL) die("aligned_alloc");
    for (int i = 0; i < kBufCount; i++) {
        io_uring_buf_ring_add(buffers, buffer_memory + (size_t)i * kBufSize, kBufSize, (unsigned short)i,
                              io_uring_buf_ring_mask(kBufCount), i);
    }
    io_uring_buf_ring_advance(buffers, kBufCount);
    arm_accept(lfd);
    while (!stop) {
        r = io_uring_submit_and_wait(&ring, 1);
        if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY) { errno = -r; die("io_uring_submit_and_wait"); }
        refresh_date();
        struct io_uring_cqe *cqe;
        unsigned head, seen = 0, returned = 0;
        io_uring_for_each_cqe(&ring, head, cqe) {
            seen++;
            int kind = (int)(cqe->user_data & 0xff), fd = (int)(cqe->user_data >> 8);
            if (kind == kTagAccept) {
                if (cqe->res >= 0 && cqe->res < kMaxFds) {
                    int one = 1;
                    setsockopt(cqe->res, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    match[cqe->res] = 0;
                    accepted_total++;
                    arm_recv(cqe->res);
                } else if (cqe->res >= 0) {
                    close(cqe->res);
                }
                if (!(cqe->flags & IORING_CQE_F_MORE)) arm_accept(lfd);  /* EMFILE included: retried */
            } else if (kind == kTagRecv) {
                if (cqe->flags & IORING_CQE_F_BUFFER) {
                    unsigned id = cqe->flags >> IORING_CQE_BUFFER_SHIFT;
                    char *data = buffer_memory + (size_t)id * kBufSize;
                    if (cqe->res > 0) {
                        unsigned heads = heads_ended(fd, data, (size_t)cqe->res);
                        answered += heads;
                        queue_answers(fd, heads);
                    }
                    io_uring_buf_ring_add(buffers, data, kBufSize, (unsigned short)id,
                                          io_uring_buf_ring_mask(kBufCount), (int)returned++);
                }
                if (cqe->res == 0 || (cqe->res < 0 && cqe->res != -ENOBUFS)) {
                    if (!(cqe->flags & IORING_CQE_F_MORE)) close(fd);
                } else if (!(cqe->flags & IORING_CQE_F_MORE)) {
                    arm_recv(fd);  /* the ring ran dry, or the kernel ended the multishot */
                }
            }
            /* kTagSend: only a failed send posts a CQE (the peer went away); its receive ends the connection. */
        }
        if (returned > 0) io_uring_buf_ring_advance(buffers, (int)returned);
        io_uring_cq_advance(&ring, seen);
    }
    io_uring_queue_exit(&ring);
}

int main(int argc, char **argv) {
    const char *mode = NULL, *address = "127.0.0.1";
    int port = 18082;
    static const struct option opts[] = {
        {"mode", required_argument, NULL, 'm'}, {"port", required_argument, NULL, 'p'},
        {"address", required_argument, NULL, 'a'}, {"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "m:p:a:h", opts, NULL)) != -1) {
        switch (c) {
            case 'm': mode = optarg; break;
            case 'p': port = atoi(optarg); break;
            case 'a': address = optarg; break;
            default:
                fprintf(stderr, "usage: raw_http --mode epoll|uring [--port N] [--address A]\n");
                return c == 'h' ? 0 : 2;
        }
    }
    int uring = mode != NULL && strcmp(mode, "uring") == 0;
    if (mode == NULL || (!uring && strcmp(mode, "epoll") != 0) || port <= 0 || port > 65535) {
        fprintf(stderr, "raw_http: --mode epoll|uring is required, and --port must be 1..65535\n");
        return 2;
    }
    struct rlimit lim;
    if (getrlimit(RLIMIT_NOFILE, &lim) == 0) {
        lim.rlim_cur = lim.rlim_max;
        setrlimit(RLIMIT_NOFILE, &lim);
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    refresh_date();
    int lfd = listen_on(address, port, !uring);
    if (uring) run_uring(lfd); else run_epoll(lfd);
    fprintf(stderr, "raw_http --mode %s: %llu connections, %llu answers\n", mode, accepted_total, answered);
    return 0;
}
