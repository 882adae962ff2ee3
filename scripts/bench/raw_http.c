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
 *   --mode uring  raw_loop.h's io_uring loop (SINGLE_ISSUER | DEFER_TASKRUN, multishot accept and
 *                 receive into a provided-buffer ring, sends without a CQE on success, one
 *                 io_uring_enter per loop), shared with raw_resp.c.
 * Answers come from one static buffer holding kBatch copies of the response; its Date is rewritten
 * once a second (an in-flight send may carry the next second's date: harmless here).
 *
 * usage: raw_http --mode epoll|uring [--port N] [--address A]     (SIGINT/SIGTERM: exit, counts on stderr)
 * Build: cc -O2 -o raw_http raw_http.c -luring     (raw_loop.h beside it)
 */
#define _GNU_SOURCE
#include <getopt.h>
#include <sys/epoll.h>
#include <time.h>

#include "raw_loop.h"

enum { kBatch = 16 };  /* answers one send carries at most */

static const char kHead[] = "HTTP/1.1 200 OK\r\nServer: spindle\r\nDate: ";
static const char kTail[] = " GMT\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 13\r\n\r\nHello, World!";
enum { kDateLen = 25, kResponseLen = sizeof kHead - 1 + kDateLen + sizeof kTail - 1 };

static char responses[kBatch * kResponseLen];
static time_t response_second = -1;
static unsigned char match[kRawMaxFds];  /* per descriptor: how much of "\r\n\r\n" the last bytes matched */
static unsigned long long answered;

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

/* ---- epoll ------------------------------------------------------------------------------------ */

static void run_epoll(int lfd) {
    int ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0) raw_die("epoll_create1");
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = lfd};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev) != 0) raw_die("epoll_ctl");
    static struct epoll_event events[512];
    static char buf[16384];
    while (!raw_stop) {
        int n = epoll_wait(ep, events, 512, -1);
        if (n < 0) {
            if (errno == EINTR) continue;
            raw_die("epoll_wait");
        }
        refresh_date();
        for (int i = 0; i < n; i++) {
            int fd = events[i].data.fd;
            if (fd == lfd) {
                for (;;) {
                    int c = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
                    if (c < 0) break;  /* EAGAIN, or EMFILE: the next wake-up tries again */
                    if (c >= kRawMaxFds) { close(c); continue; }
                    int one = 1;
                    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    match[c] = 0;
                    struct epoll_event cev = {.events = EPOLLIN | EPOLLRDHUP, .data.fd = c};
                    if (epoll_ctl(ep, EPOLL_CTL_ADD, c, &cev) != 0) { close(c); continue; }
                    raw_accepted++;
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

/* ---- io_uring: raw_loop.h's loop -------------------------------------------------------------- */

static void raw_on_accept(int fd) { match[fd] = 0; }

static void raw_on_wake(void) { refresh_date(); }

static void raw_on_data(int fd, const char *data, size_t n) {
    unsigned heads = heads_ended(fd, data, n);
    answered += heads;
    while (heads > 0) {
        unsigned k = heads < kBatch ? heads : kBatch;
        raw_send(fd, responses, (size_t)k * kResponseLen);
        heads -= k;
    }
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
    raw_setup_process();
    refresh_date();
    int lfd = raw_listen("raw_http", address, port, !uring);
    if (uring) raw_run_uring(lfd); else run_epoll(lfd);
    fprintf(stderr, "raw_http --mode %s: %llu connections, %llu answers\n", mode, raw_accepted, answered);
    return 0;
}
