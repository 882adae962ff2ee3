#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Holds idle HTTP keep-alive connections open, for scripts/bench/http.sh --rss.

usage: http_idle_clients.py PORT N READY RELEASE
Opens N connections to 127.0.0.1:PORT, sends one GET /hello on each and reads its answer, then
creates the file READY and keeps every connection open until the file RELEASE exists.
"""
import os
import socket
import sys
import time


def main() -> int:
    port, n, ready, release = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    request = b"GET /hello HTTP/1.1\r\nHost: bench\r\n\r\n"
    conns = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(request)
        got = b""
        while not got.endswith(b"Hello, World!"):
            chunk = s.recv(4096)
            if not chunk:
                print("http_idle_clients.py: a connection closed early", file=sys.stderr)
                return 1
            got += chunk
        conns.append(s)
    open(ready, "w").close()
    while not os.path.exists(release):
        time.sleep(0.05)
    return 0


if __name__ == "__main__":
    sys.exit(main())
