// SPDX-License-Identifier: Apache-2.0
/*
 * epoll_echo: the reference TCP echo server that spindle-echo is measured against (scripts/bench/echo.sh).
 * One thread, one epoll set, nonblocking sockets; the usual tuning of a hand-written C event loop:
 *   - accept4(SOCK_NONBLOCK | SOCK_CLOEXEC) in a loop until EAGAIN, TCP_NODELAY on each connection;
 *     EMFILE/ENFILE handled with a spare descriptor (close it, accept and drop, reopen) so that a full
 *     table cannot turn the level-triggered listener into a busy loop;
 *   - on a readable connection: read into one shared 64 KiB buffer and write it straight back; a read
 *     that returns less than the buffer drained the socket (TCP hands over all it holds), so the next
 *     read, which would only say EAGAIN, is skipped in both modes;
 *   - a partial write keeps the rest in a per-connection pending buffer, stops reading that
 *     connection (back-pressure: nothing more is read than can be sent) and waits for EPOLLOUT;
 *   - EPOLLRDHUP: a peer that sent its last bytes together with FIN is served and closed in the
 *     same wake-up, without another read to learn of the end;
 *   - level-triggered (--mode lt, the default) or edge-triggered (--mode et, EPOLLOUT registered once
 *     so that no epoll_ctl is ever needed) interest; scripts/bench/echo.sh measures both;
 *   - SIGINT/SIGTERM through a signalfd in the same epoll set: a clean exit with counts on stderr;
 *   - --busy-poll-us N (default 0: off): after the last event, poll with epoll_wait(timeout 0) for up to
 *     N microseconds before blocking, the counterpart of spindle's --poll-mode hybrid --spin-us N, so
 *     that a spinning spindle is measured against a spinning epoll loop and not against a sleeping one.
 *
 * usage: epoll_echo [--port N] [--address A] [--mode lt|et] [--max-events N] [--busy-poll-us N]
 * Build: cc -O2 -o epoll_echo epoll_echo.c
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { kBufferSize = 64 * 1024, kDefaultMaxEvents = 1024 };

struct conn {
    int fd;
    char *pending;   /* bytes read but not yet written back: pending[off, len) */
    size_t len, off, cap;
    int want_out;    /* LT: EPOLLOUT is in the interest set (only while pending) */
};

static int edge_triggered;
static int epfd;
static char buffer[kBufferSize];
static unsigned long long accepted, closed_conns, bytes_echoed;

/* Two tags that no connection pointer can equal: the listener and the signalfd. */
static char listener_tag, signal_tag;

static void die(const char *what) {
    perror(what);
    exit(1);
}

static void conn_close(struct conn *c) {
    close(c->fd); /* also removes it from the epoll set */
    free(c->pending);
    free(c);
    ++closed_conns;
}

static int set_interest(struct conn *c, uint32_t events) {
    struct epoll_event ev = {.events = events, .data.ptr = c};
    return epoll_ctl(epfd, EPOLL_CTL_MOD, c->fd, &ev);
}

/* Keeps buf[0, n) to send later. Returns 0, or -1 when out of memory. */
static int keep_pending(struct conn *c, const char *buf, size_t n) {
    if (c->cap < n) {
        char *p = realloc(c->pending, n);
        if (p == NULL) return -1;
        c->pending = p;
        c->cap = n;
    }
    memcpy(c->pending, buf, n);
    c->len = n;
    c->off = 0;
    return 0;
}

/* Writes what is pending. Returns 1 when drained, 0 when the socket is full again, -1 on error. */
static int flush_pending(struct conn *c) {
    while (c->off < c->len) {
        ssize_t w = write(c->fd, c->pending + c->off, c->len - c->off);
        if (w > 0) {
            c->off += (size_t)w;
            bytes_echoed += (unsigned long long)w;
        } else if (w < 0 && errno == EINTR) {
            continue;
        } else if (w < 0 && errno == EAGAIN) {
            return 0;
        } else {
            return -1;
        }
    }
    c->len = c->off = 0;
    return 1;
}

/* Reads and echoes until the socket is drained or full. Returns -1 when the connection is done. */
static int echo_some(struct conn *c) {
    for (;;) {
        ssize_t n = read(c->fd, buffer, sizeof buffer);
        if (n == 0) return -1;
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN) return 0;
            return -1;
        }
        size_t done = 0;
        while (done < (size_t)n) {
            ssize_t w = write(c->fd, buffer + done, (size_t)n - done);
            if (w > 0) {
                done += (size_t)w;
            } else if (w < 0 && errno == EINTR) {
                continue;
            } else if (w < 0 && errno == EAGAIN) {
                break;
            } else {
                return -1;
            }
        }
        bytes_echoed += done;
        if (done < (size_t)n) {
            /* The socket is full: keep the rest and stop reading until EPOLLOUT says it drained. */
            if (keep_pending(c, buffer + done, (size_t)n - done) < 0) return -1;
            if (!edge_triggered) {
                if (set_interest(c, EPOLLOUT | EPOLLRDHUP) < 0) return -1;
                c->want_out = 1;
            }
            return 0;
        }
        if ((size_t)n < sizeof buffer) return 0; /* drained: the next read would say EAGAIN */
    }
}

static void on_connection(struct conn *c, uint32_t events) {
    if (events & EPOLLERR) {
        conn_close(c);
        return;
    }
    if (c->len > 0) {
        if (!(events & (EPOLLOUT | EPOLLHUP))) return; /* ET: a read edge while we wait for the socket */
        int r = flush_pending(c);
        if (r < 0) {
            conn_close(c);
            return;
        }
        if (r == 0) return;
        if (!edge_triggered && c->want_out) {
            if (set_interest(c, EPOLLIN | EPOLLRDHUP) < 0) {
                conn_close(c);
                return;
            }
            c->want_out = 0;
        }
        /* Drained. LT reports the unread input again by itself; ET must read now, as its edge is spent. */
        if (!edge_triggered) return;
    } else if (!(events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP))) {
        return; /* ET: a write edge with nothing pending */
    }
    if (echo_some(c) < 0) {
        conn_close(c);
        return;
    }
    /* The peer has shut down its side and everything it sent has been read: done, unless a reply is still pending. */
    if ((events & (EPOLLRDHUP | EPOLLHUP)) && c->len == 0) conn_close(c);
}

static int spare_fd = -1;

static void on_listener(int lfd) {
    for (;;) {
        int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if (errno == EAGAIN) return;
            if ((errno == EMFILE || errno == ENFILE) && spare_fd >= 0) {
                /* Shed the connection: the spare descriptor makes room to accept it and close it at once. */
                close(spare_fd);
                fd = accept(lfd, NULL, NULL);
                if (fd >= 0) close(fd);
                spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
                continue;
            }
            perror("epoll_echo: accept4");
            return;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        struct conn *c = calloc(1, sizeof *c);
        if (c == NULL) {
            close(fd);
            continue;
        }
        c->fd = fd;
        struct epoll_event ev = {.data.ptr = c};
        ev.events = edge_triggered ? (EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET) : (EPOLLIN | EPOLLRDHUP);
        if (epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
            close(fd);
            free(c);
            continue;
        }
        ++accepted;
    }
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int main(int argc, char **argv) {
    const char *address = "0.0.0.0";
    int port = 7000;
    int max_events = kDefaultMaxEvents;
    long busy_poll_us = 0;
    static const struct option options[] = {
        {"port", required_argument, NULL, 'p'},
        {"address", required_argument, NULL, 'a'},
        {"mode", required_argument, NULL, 'm'},
        {"max-events", required_argument, NULL, 'e'},
        {"busy-poll-us", required_argument, NULL, 'b'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    for (int opt; (opt = getopt_long(argc, argv, "p:a:m:e:b:h", options, NULL)) != -1;) {
        switch (opt) {
            case 'p': port = atoi(optarg); break;
            case 'a': address = optarg; break;
            case 'm':
                if (strcmp(optarg, "et") == 0) {
                    edge_triggered = 1;
                } else if (strcmp(optarg, "lt") == 0) {
                    edge_triggered = 0;
                } else {
                    fprintf(stderr, "epoll_echo: --mode takes lt or et\n");
                    return 2;
                }
                break;
            case 'e': max_events = atoi(optarg); break;
            case 'b': busy_poll_us = atol(optarg); break;
            default:
                fprintf(stderr,
                        "usage: epoll_echo [--port N] [--address A] [--mode lt|et] [--max-events N] [--busy-poll-us N]\n");
                return opt == 'h' ? 0 : 2;
        }
    }
    if (port < 0 || port > 65535 || max_events < 1 || busy_poll_us < 0 || busy_poll_us > 1000000) {
        fprintf(stderr, "epoll_echo: bad --port, --max-events or --busy-poll-us (0 to 1000000)\n");
        return 2;
    }

    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGTERM);
    sigprocmask(SIG_BLOCK, &signals, NULL);
    signal(SIGPIPE, SIG_IGN);
    int sfd = signalfd(-1, &signals, SFD_NONBLOCK | SFD_CLOEXEC);
    if (sfd < 0) die("epoll_echo: signalfd");
    spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);

    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, address, &sa.sin_addr) != 1) {
        fprintf(stderr, "epoll_echo: not an IPv4 address: %s\n", address);
        return 2;
    }
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (lfd < 0) die("epoll_echo: socket");
    int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(lfd, (struct sockaddr *)&sa, sizeof sa) < 0) die("epoll_echo: bind");
    if (listen(lfd, 4096) < 0) die("epoll_echo: listen");

    epfd = epoll_create1(EPOLL_CLOEXEC);
    if (epfd < 0) die("epoll_echo: epoll_create1");
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &listener_tag};
    if (epoll_ctl(epfd, EPOLL_CTL_ADD, lfd, &ev) < 0) die("epoll_echo: epoll_ctl listener");
    ev.data.ptr = &signal_tag;
    if (epoll_ctl(epfd, EPOLL_CTL_ADD, sfd, &ev) < 0) die("epoll_echo: epoll_ctl signalfd");
    fprintf(stderr, "epoll_echo: listening on %s:%d (%s-triggered, busy poll %ld us)\n", address, port,
            edge_triggered ? "edge" : "level", busy_poll_us);

    struct epoll_event *events = calloc((size_t)max_events, sizeof *events);
    if (events == NULL) die("epoll_echo: calloc");
    uint64_t last_event_ns = 0;
    for (int running = 1; running;) {
        // Busy poll: while the last event is recent, ask without sleeping.
        int timeout = -1;
        if (busy_poll_us > 0 && now_ns() - last_event_ns < (uint64_t)busy_poll_us * 1000u) timeout = 0;
        int n = epoll_wait(epfd, events, max_events, timeout);
        if (n > 0 && busy_poll_us > 0) last_event_ns = now_ns();
        if (n < 0) {
            if (errno == EINTR) continue;
            die("epoll_echo: epoll_wait");
        }
        for (int i = 0; i < n; ++i) {
            void *tag = events[i].data.ptr;
            if (tag == &listener_tag) {
                on_listener(lfd);
            } else if (tag == &signal_tag) {
                running = 0;
            } else {
                on_connection(tag, events[i].events);
            }
        }
    }
    fprintf(stderr, "epoll_echo: stopped; accepted %llu connections, closed %llu, echoed %llu bytes\n", accepted,
            closed_conns, bytes_echoed);
    return 0;
}
