#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""spindle-kv against redis-server, side by side, through python3-redis (redis-py).

Starts both servers on loopback ports of its own choosing, runs one seeded mixed workload (strings,
expiry, hashes, lists, sets, multi-key commands, errors such as WRONGTYPE) on each, and compares every
reply. Replies are compared as redis-py parses them with its response callbacks removed (so that
nothing is coerced to True or a dict), errors by their text; the replies that Redis gives in no fixed
order (HGETALL, HKEYS, HVALS, SMEMBERS, KEYS) are sorted first. A few RESP3 replies (HELLO 3, then a map
and a set) are compared as raw bytes.

Usage: redis_py_compare.py SPINDLE_KV_BINARY [--seed N] [--ops N]
Exit status: 0 all equal, 1 a difference (the first ones are printed with the seed to replay them),
77 skipped (redis-server or python3-redis missing: the reason is printed).
"""
import argparse
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time

try:
    import redis
except ImportError:
    print("SKIP: python3-redis (Debian's python3-redis) is not installed for " + sys.executable)
    sys.exit(77)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ping(port, proc, what):
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            if redis.Redis(host="127.0.0.1", port=port, socket_timeout=1).ping():
                return
        except redis.exceptions.ConnectionError:
            time.sleep(0.02)
    raise RuntimeError(f"{what} did not answer PING on port {port}")


def client(port):
    c = redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)
    c.response_callbacks.clear()  # raw replies: bytes, ints, lists, None
    return c


UNORDERED = {"HGETALL", "HKEYS", "HVALS", "SMEMBERS", "KEYS"}


def call(c, args):
    try:
        reply = c.execute_command(*args)
    except redis.exceptions.ResponseError as e:
        return ("error", str(e))
    name = args[0].upper()
    if name == "HGETALL" and isinstance(reply, list):
        reply = sorted(zip(reply[0::2], reply[1::2]))
    elif name in UNORDERED and isinstance(reply, list):
        reply = sorted(reply)
    elif name in ("TTL", "PTTL") and isinstance(reply, int) and reply > 0:
        reply = "positive"  # the two servers read the clock at different moments
    return reply


def raw_resp3(port, commands):
    """Sends HELLO 3 and then `commands` on a plain socket; returns the raw bytes of the replies after HELLO's."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        def send(args):
            out = b"*%d\r\n" % len(args)
            for a in args:
                a = a if isinstance(a, bytes) else str(a).encode()
                out += b"$%d\r\n%s\r\n" % (len(a), a)
            s.sendall(out)
        send(["HELLO", "3"])
        time.sleep(0.05)
        s.recv(65536)  # HELLO's map (its id differs)
        replies = []
        for cmd in commands:
            send(cmd)
            data = b""
            time.sleep(0.02)
            s.settimeout(0.5)
            try:
                while True:
                    chunk = s.recv(65536)
                    data += chunk
                    if len(chunk) < 65536:
                        break
            except socket.timeout:
                pass
            replies.append(data)
        return replies


def workload(rng, ops):
    """The commands, from a seeded generator: a small pool of keys so that types and values meet."""
    keys = [f"k{i}" for i in range(12)]
    fields = [f"f{i}" for i in range(5)]
    small = lambda: str(rng.randint(-50, 50))
    key = lambda: rng.choice(keys)
    fixed = [
        ["SET", "s", "v"], ["HSET", "s", "f", "v"], ["LPUSH", "s", "x"], ["SADD", "s", "m"], ["HSET", "h", "f"],
        ["HSET", "h", "a", "1"], ["HINCRBY", "h", "a", "x"], ["HSET", "h", "b", "abc"], ["HINCRBY", "h", "b", "1"],
        ["HINCRBY", "h", "a", "9223372036854775807"], ["GET", "h"], ["LPOP", "l", "-1"], ["LPOP", "l", "x"],
        ["LPOP", "l", "1", "2"], ["LPOP", "nolist", "3"], ["RPUSH", "l", "a", "b"], ["LPOP", "l", "0"], ["LINDEX", "l", "x"],
        ["LRANGE", "l", "x", "1"], ["TYPE", "h"], ["TYPE", "l"], ["TYPE", "s"], ["TYPE", "none"], ["MSETNX", "a"],
        ["MSETNX", "s", "1", "new", "2"], ["RENAME", "nokey", "x"], ["RENAMENX", "nokey", "x"], ["RENAME", "h", "h"],
        ["RENAMENX", "h", "h"], ["HMGET", "h"], ["SREM", "s", "m"], ["NOSUCHCOMMAND", "x"], ["GET"], ["SCAN", "x"],
        ["SCAN", "0", "COUNT", "0"], ["SCAN", "0", "MATCH"], ["SET", "n", "10"], ["INCRBYFLOAT", "n", "1.5"],
        ["LPUSHX", "nolist", "a"], ["RPUSHX", "l", "c", "d"], ["LPUSHX", "l", "z"], ["LRANGE", "l", "0", "-1"],
        ["HSETNX", "h", "a", "2"], ["HSETNX", "h", "z", "26"], ["HSTRLEN", "h", "z"], ["HSTRLEN", "h", "none"],
        ["HMSET", "h", "m", "1"], ["HMSET", "h", "m"], ["RPUSHX", "h", "x"],
        ["DEL", "s", "h", "l", "a", "n", "new"],
    ]
    for c in fixed:
        yield c
    for _ in range(ops):
        r = rng.random()
        k = key()
        choice = rng.randrange(40)
        if choice == 0: yield ["SET", k, small()]
        elif choice == 1: yield ["SET", k, small(), rng.choice(["NX", "XX", "GET", "KEEPTTL"])]
        elif choice == 2: yield ["GET", k]
        elif choice == 3: yield ["INCRBY", k, small()]
        elif choice == 4: yield ["APPEND", k, small()]
        elif choice == 5: yield ["GETRANGE", k, small(), small()]
        elif choice == 6: yield ["EXPIRE", k, str(rng.randint(100, 1000))]
        elif choice == 7: yield ["PERSIST", k]
        elif choice == 8: yield ["TTL", k]
        elif choice == 9: yield ["HSET", k] + sum(([rng.choice(fields), small()] for _ in range(rng.randint(1, 3))), [])
        elif choice == 10: yield ["HGET", k, rng.choice(fields)]
        elif choice == 11: yield ["HMGET", k] + rng.sample(fields, 3)
        elif choice == 12: yield ["HDEL", k] + rng.sample(fields, 2)
        elif choice == 13: yield ["HGETALL", k]
        elif choice == 14: yield ["HLEN", k]
        elif choice == 15: yield ["HEXISTS", k, rng.choice(fields)]
        elif choice == 16: yield ["HINCRBY", k, rng.choice(fields), small()]
        elif choice == 17: yield [rng.choice(["HKEYS", "HVALS"]), k]
        elif choice == 18: yield [rng.choice(["LPUSH", "RPUSH"]), k] + [small() for _ in range(rng.randint(1, 4))]
        elif choice == 19: yield [rng.choice(["LPOP", "RPOP"]), k]
        elif choice == 20: yield [rng.choice(["LPOP", "RPOP"]), k, str(rng.randint(0, 4))]
        elif choice == 21: yield ["LRANGE", k, small(), small()]
        elif choice == 22: yield ["LRANGE", k, "0", "-1"]
        elif choice == 23: yield ["LLEN", k]
        elif choice == 24: yield ["LINDEX", k, str(rng.randint(-5, 5))]
        elif choice == 25: yield ["SADD", k] + [small() for _ in range(rng.randint(1, 4))]
        elif choice == 26: yield ["SREM", k] + [small() for _ in range(rng.randint(1, 4))]
        elif choice == 27: yield ["SMEMBERS", k]
        elif choice == 28: yield ["SISMEMBER", k, small()]
        elif choice == 29: yield ["SCARD", k]
        elif choice == 30: yield ["TYPE", k]
        elif choice == 31: yield ["MGET"] + rng.sample(keys, 4)
        elif choice == 32: yield ["MSET"] + sum(([key(), small()] for _ in range(rng.randint(1, 3))), [])
        elif choice == 33: yield ["MSETNX"] + sum(([key(), small()] for _ in range(rng.randint(1, 3))), [])
        elif choice == 34: yield [rng.choice(["DEL", "UNLINK"])] + rng.sample(keys, 2)
        elif choice == 35: yield ["EXISTS"] + [key() for _ in range(3)]
        elif choice == 36: yield [rng.choice(["RENAME", "RENAMENX"]), k, key()]
        elif choice == 37: yield ["DBSIZE"]
        elif choice == 38: yield ["KEYS", "k1*"]
        else: yield ["GETSET", k, small()]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("kv")
    p.add_argument("--seed", type=int, default=int(os.environ.get("SPINDLE_KV_COMPARE_SEED", "20261126")))
    p.add_argument("--ops", type=int, default=3000)
    a = p.parse_args()
    redis_server = shutil.which("redis-server")
    if redis_server is None:
        print("SKIP: redis-server (Debian's redis-server) is not installed")
        return 77
    tmp = tempfile.mkdtemp(prefix="spindle-kv-compare-")
    procs = []
    try:
        rport, kport = free_port(), free_port()
        procs.append(subprocess.Popen([redis_server, "--port", str(rport), "--bind", "127.0.0.1", "--save", "",
                                       "--appendonly", "no", "--dir", tmp], stdout=subprocess.DEVNULL))
        procs.append(subprocess.Popen([a.kv, "--port", str(kport), "--carriers", "2", "--dir", os.path.join(tmp, "kv")],
                                      stdout=subprocess.DEVNULL))
        wait_ping(rport, procs[0], "redis-server")
        wait_ping(kport, procs[1], "spindle-kv")
        theirs, ours = client(rport), client(kport)
        rng = random.Random(a.seed)
        compared, diffs = 0, []
        for args in workload(rng, a.ops):
            want, got = call(theirs, args), call(ours, args)
            compared += 1
            if want != got:
                diffs.append((compared, args, want, got))
        # Expiry, deterministically: short TTLs on every type, then after they are due.
        for c in (theirs, ours):
            c.execute_command("FLUSHALL")
            c.execute_command("SET", "es", "v")
            c.execute_command("HSET", "eh", "f", "v")
            c.execute_command("RPUSH", "el", "a")
            c.execute_command("SADD", "ee", "m")
            for k in ("es", "eh", "el", "ee"):
                c.execute_command("PEXPIRE", k, "40")
        time.sleep(0.15)
        for args in (["GET", "es"], ["HGET", "eh", "f"], ["LLEN", "el"], ["SCARD", "ee"], ["EXISTS", "es", "eh", "el", "ee"],
                     ["DBSIZE"], ["SADD", "eh", "now-a-set"], ["TYPE", "eh"]):
            want, got = call(theirs, args), call(ours, args)
            compared += 1
            if want != got:
                diffs.append((compared, args, want, got))
        # RESP3 types, byte for byte: HGETALL is a map, SMEMBERS a set, a missing key null.
        for c in (theirs, ours):
            c.execute_command("HSET", "r3h", "f", "v")
            c.execute_command("SADD", "r3s", "m")
        resp3 = [["HGETALL", "r3h"], ["SMEMBERS", "r3s"], ["HGETALL", "none"], ["SMEMBERS", "none"], ["HGET", "r3h", "x"],
                 ["LPOP", "none", "2"], ["TYPE", "r3h"]]
        for args, want, got in zip(resp3, raw_resp3(rport, resp3), raw_resp3(kport, resp3)):
            compared += 1
            if want != got:
                diffs.append((compared, ["(RESP3)"] + args, want, got))
        if diffs:
            print(f"FAIL: {len(diffs)} of {compared} replies differ (seed {a.seed}; rerun with --seed {a.seed}):")
            for n, args, want, got in diffs[:15]:
                print(f"  #{n} {' '.join(args)}\n      redis-server: {want!r}\n      spindle-kv:   {got!r}")
            return 1
        print(f"OK: {compared} replies equal (seed {a.seed})")
        return 0
    finally:
        for pr in procs:
            pr.terminate()
        for pr in procs:
            try:
                pr.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pr.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
