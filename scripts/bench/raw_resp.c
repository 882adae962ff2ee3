// SPDX-License-Identifier: Apache-2.0
/*
 * raw_resp: the floor under scripts/bench/kv.sh --floor, as raw_http.c is http.sh's. A single-threaded
 * io_uring loop (raw_loop.h's, the same as raw_http --mode uring) that finds each complete RESP command
 * in what a connection sends and answers it from a static buffer, storing nothing: SET gets +OK, GET a
 * fixed bulk string of --value-size bytes of 'x' (what redis-benchmark stores: its -d defaults to 3),
 * PING +PONG, CONFIG (redis-benchmark's CONFIG GET save and CONFIG GET appendonly at start) a two-element
 * array of empty bulk strings, which redis-benchmark reads as the parameter's name and value, and any
 * other command an error (redis-benchmark stops on it: the floor only stands for SET and GET). It is not a
 * server to use; it is what the kernel charges any server for one command and its answer on this
 * machine, so that kv.sh can say how much of a server's CPU per request is the server's own.
 *
 * Commands are arrays of bulk strings ("*3\r\n$3\r\nSET\r\n$16\r\nkey:000000012345\r\n$3\r\nxxx\r\n"),
 * or inline ("PING\r\n"); a command may span receives, and a receive may hold many (pipelining). The
 * only bytes looked at are the array and bulk headers and the first bytes of the command's name; the
 * rest of each bulk string is skipped by its length. A malformed header ends the connection (shutdown),
 * without an error reply.
 * Answers: consecutive answers of one kind go out in one send of up to kBatch copies from a static
 * buffer. Sends are not linked: the kernel issues each at submission, in order, and only a full socket
 * (a send that has to wait) could let a later one pass it, which redis-benchmark never allows (its
 * -P answers per connection are far below a socket's buffer). Linking them would not keep the order
 * either: a link's next send waits for deferred task work, which the next receive's sends, issued at
 * submission, overtake (SET and PING alternating in one stream came back out of order that way).
 *
 * usage: raw_resp [--port N] [--address A] [--value-size N]     (SIGINT/SIGTERM: exit, counts on stderr)
 * Build: cc -O2 -o raw_resp raw_resp.c -luring     (raw_loop.h beside it)
 */
#define _GNU_SOURCE
#include <getopt.h>

#include "raw_loop.h"

enum {
    kBatch = 16,           /* answers one send carries at most */
    kNameBytes = 6,        /* the bytes of a command's name kept: enough for CONFIG */
    kMaxBulk = 512 << 20,  /* the longest bulk string (Redis's proto-max-bulk-len) */
    kMaxArgs = 1 << 20,    /* the most arguments of one command (Redis's 1024 * 1024) */
};

/* What a command gets. */
enum Kind { kSet, kGet, kPing, kConfig, kOther, kKinds };

static const char kOtherReply[] = "-ERR raw_resp answers only SET, GET, PING and CONFIG\r\n";

/* Per kind: kBatch copies of its answer back to back. */
static char *replies[kKinds];
static size_t reply_len[kKinds];
static unsigned long long answered[kKinds];

/* Where a connection's parser is. */
enum State {
    kCommand,    /* before a command: '*' opens an array, anything else an inline command */
    kArrayLen,   /* in "*N\r\n", after the '*' */
    kBulk,       /* before an argument: expects '$' */
    kBulkLen,    /* in "$N\r\n", after the '$' */
    kBulkData,   /* in an argument's bytes and their "\r\n": `left` bytes to go */
    kInline,     /* in an inline command's line, up to '\n' */
    kBroken,     /* a malformed header: the rest is ignored until the peer's end */
};

/* A connection's parser, carried from one receive to the next. */
struct Conn {
    uint8_t state;             /* enum State */
    uint8_t name_len;          /* bytes of name[] filled */
    uint8_t in_name;           /* the argument (or inline word) being read is the command's name */
    char name[kNameBytes];     /* the first bytes of the command's name, upper case */
    uint32_t name_size;        /* the whole name's length (a bulk's header, or an inline word's bytes) */
    uint32_t args;             /* arguments still to come in this array */
    uint64_t number;           /* the header number being read */
    uint64_t left;             /* kBulkData: bytes of the argument and its "\r\n" still to skip */
};
static struct Conn conns[kRawMaxFds];

/* The answers owed on the connection being parsed and not yet sent: run_count of kind run_kind. */
static enum Kind run_kind;
static unsigned run_count;

/* Fills replies[kind] with kBatch copies of its answer. Errors: exits with status 1 when out of memory. */
static void set_reply(enum Kind kind, const char *answer, size_t n) {
    replies[kind] = malloc((size_t)kBatch * n);
    if (replies[kind] == NULL) raw_die("malloc");
    for (int i = 0; i < kBatch; i++) memcpy(replies[kind] + (size_t)i * n, answer, n);
    reply_len[kind] = n;
}

/* Sends the run of answers owed on fd, if any. */
static void send_run(int fd) {
    if (run_count == 0) return;
    raw_send(fd, replies[run_kind], (size_t)run_count * reply_len[run_kind]);
    run_count = 0;
}

/* Owes fd one answer of the kind the command whose name c holds gets. */
static void answer(int fd, const struct Conn *c) {
    enum Kind kind = kOther;
    if (c->name_size == 3 && memcmp(c->name, "SET", 3) == 0) kind = kSet;
    else if (c->name_size == 3 && memcmp(c->name, "GET", 3) == 0) kind = kGet;
    else if (c->name_size == 4 && memcmp(c->name, "PING", 4) == 0) kind = kPing;
    else if (c->name_size == 6 && memcmp(c->name, "CONFIG", 6) == 0) kind = kConfig;
    answered[kind]++;
    if (run_count > 0 && (run_kind != kind || run_count == kBatch)) send_run(fd);
    run_kind = kind;
    run_count++;
}

/* Keeps byte b of the command's name (upper case) while it fits. */
static inline void keep_name_byte(struct Conn *c, char b) {
    if (c->name_len < kNameBytes) c->name[c->name_len++] = (char)(b >= 'a' && b <= 'z' ? b - 32 : b);
}

/* Reads the digits of a header into c->number; returns 1 at its '\n', 0 before it, -1 when malformed
 * (another byte than a digit or "\r", or a number above `max`). */
static inline int header_byte(struct Conn *c, char b, uint64_t max) {
    if (b >= '0' && b <= '9') {
        c->number = c->number * 10 + (uint64_t)(b - '0');
        return c->number <= max ? 0 : -1;
    }
    if (b == '\r') return 0;
    return b == '\n' ? 1 : -1;
}

static void start_command(struct Conn *c) {
    c->name_len = 0;
    c->name_size = 0;
    c->in_name = 1;
}

/* Finds the commands that end in data[0, n) and queues their answers. */
static void parse(int fd, const char *data, size_t n) {
    struct Conn *c = &conns[fd];
    size_t i = 0;
    while (i < n) {
        char b = data[i];
        switch (c->state) {
            case kCommand:
                start_command(c);
                if (b == '*') {
                    c->state = kArrayLen;
                    c->number = 0;
                    i++;
                } else {
                    c->state = kInline;  /* this byte is the line's first */
                }
                break;
            case kArrayLen: {
                int r = header_byte(c, b, kMaxArgs);
                i++;
                if (r < 0) goto broken;
                if (r == 0) break;
                c->args = (uint32_t)c->number;
                c->state = c->args > 0 ? kBulk : kCommand;  /* "*0": nothing to answer (as Redis) */
                break;
            }
            case kBulk:
                if (b != '$') goto broken;
                c->state = kBulkLen;
                c->number = 0;
                i++;
                break;
            case kBulkLen: {
                int r = header_byte(c, b, kMaxBulk);
                i++;
                if (r < 0) goto broken;
                if (r == 0) break;
                if (c->in_name) c->name_size = (uint32_t)c->number;
                c->left = c->number + 2;
                c->state = kBulkData;
                break;
            }
            case kBulkData: {
                size_t take = n - i < c->left ? n - i : (size_t)c->left;
                if (c->in_name) {
                    /* The name's bytes among these: those before its "\r\n". */
                    uint64_t at = c->number + 2 - c->left;
                    for (size_t k = 0; k < take && at + k < c->number; k++) keep_name_byte(c, data[i + k]);
                }
                i += take;
                c->left -= take;
                if (c->left > 0) break;
                c->in_name = 0;
                if (--c->args > 0) {
                    c->state = kBulk;
                } else {
                    answer(fd, c);
                    c->state = kCommand;
                }
                break;
            }
            case kInline:
                i++;
                if (b == '\n') {
                    if (c->name_size > 0) answer(fd, c);  /* an empty line: nothing to answer (as Redis) */
                    c->state = kCommand;
                } else if (b == ' ' || b == '\r') {
                    if (c->name_size > 0) c->in_name = 0;  /* spaces before the name are no end of it */
                } else if (c->in_name) {
                    keep_name_byte(c, b);
                    c->name_size++;
                }
                break;
            default:  /* kBroken */
                return;
        }
    }
    return;
broken:
    c->state = kBroken;
    shutdown(fd, SHUT_RDWR);  /* its receive sees the end and closes it */
}

/* ---- raw_loop.h's calls ----------------------------------------------------------------------- */

static void raw_on_accept(int fd) { memset(&conns[fd], 0, sizeof conns[fd]); }

static void raw_on_wake(void) {}

static void raw_on_data(int fd, const char *data, size_t n) {
    parse(fd, data, n);
    send_run(fd);
}

int main(int argc, char **argv) {
    const char *address = "127.0.0.1";
    int port = 16382;
    long value_size = 3;
    static const struct option opts[] = {
        {"port", required_argument, NULL, 'p'}, {"address", required_argument, NULL, 'a'},
        {"value-size", required_argument, NULL, 'v'}, {"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
    int opt;
    while ((opt = getopt_long(argc, argv, "p:a:v:h", opts, NULL)) != -1) {
        switch (opt) {
            case 'p': port = atoi(optarg); break;
            case 'a': address = optarg; break;
            case 'v': value_size = atol(optarg); break;
            default:
                fprintf(stderr, "usage: raw_resp [--port N] [--address A] [--value-size N]\n");
                return opt == 'h' ? 0 : 2;
        }
    }
    if (optind < argc || port <= 0 || port > 65535 || value_size < 0 || value_size > (1 << 20)) {
        fprintf(stderr, "raw_resp: --port must be 1..65535 and --value-size 0..1048576\n");
        return 2;
    }
    set_reply(kSet, "+OK\r\n", 5);
    set_reply(kPing, "+PONG\r\n", 7);
    set_reply(kConfig, "*2\r\n$0\r\n\r\n$0\r\n\r\n", 16);
    set_reply(kOther, kOtherReply, sizeof kOtherReply - 1);
    char *get = malloc((size_t)value_size + 32);
    if (get == NULL) raw_die("malloc");
    int head = sprintf(get, "$%ld\r\n", value_size);
    memset(get + head, 'x', (size_t)value_size);
    memcpy(get + head + value_size, "\r\n", 2);
    set_reply(kGet, get, (size_t)head + (size_t)value_size + 2);
    free(get);

    raw_setup_process();
    int lfd = raw_listen("raw_resp", address, port, 0);
    raw_run_uring(lfd);
    fprintf(stderr, "raw_resp: %llu connections, %llu answers: %llu SET, %llu GET, %llu PING, %llu CONFIG, %llu other\n",
            raw_accepted, answered[kSet] + answered[kGet] + answered[kPing] + answered[kConfig] + answered[kOther],
            answered[kSet], answered[kGet], answered[kPing], answered[kConfig], answered[kOther]);
    return 0;
}
