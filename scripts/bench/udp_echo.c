// SPDX-License-Identifier: Apache-2.0
// The reference UDP echo for scripts/bench/dpdk.sh: one thread, one socket, epoll, each datagram sent
// back to its sender unchanged. Draining with recvfrom until EAGAIN after each readiness event.
//
//   udp_echo --port P [--address A]     (runs until SIGINT or SIGTERM; prints the datagrams echoed)
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

static volatile sig_atomic_t stop;
static void onSignal(int sig) { (void)sig; stop = 1; }

int main(int argc, char** argv) {
    int port = 7410;
    const char* address = "127.0.0.1";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--port") == 0) {
            port = atoi(argv[i + 1]);
        } else if (strcmp(argv[i], "--address") == 0) {
            address = argv[i + 1];
        } else {
            fprintf(stderr, "usage: udp_echo [--port P] [--address A]\n");
            return 2;
        }
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = onSignal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_in sin;
    memset(&sin, 0, sizeof sin);
    sin.sin_family = AF_INET;
    sin.sin_port = htons((unsigned short)port);
    if (fd < 0 || inet_pton(AF_INET, address, &sin.sin_addr) != 1 || bind(fd, (struct sockaddr*)&sin, sizeof sin) != 0) {
        perror("udp_echo: socket/bind");
        return 1;
    }
    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
    if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0) {
        perror("udp_echo: epoll");
        return 1;
    }
    unsigned long long echoed = 0;
    char buf[65536];
    while (!stop) {
        struct epoll_event out;
        const int n = epoll_wait(ep, &out, 1, -1);
        if (n < 0) {
            if (errno == EINTR) continue;
            perror("udp_echo: epoll_wait");
            return 1;
        }
        for (;;) {
            struct sockaddr_in from;
            socklen_t len = sizeof from;
            const ssize_t r = recvfrom(fd, buf, sizeof buf, 0, (struct sockaddr*)&from, &len);
            if (r < 0) break;  // EAGAIN: drained
            if (sendto(fd, buf, (size_t)r, 0, (struct sockaddr*)&from, len) == r) ++echoed;
        }
    }
    fprintf(stderr, "udp_echo: echoed %llu datagrams\n", echoed);
    return 0;
}
