#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The gdb extension (tools/gdb/spindle.py) against a live spindle program and a core file of it.

Usage: spindle_gdb_test.py TARGET SCRIPT [--no-core]. Runs TARGET (tests/gdb/fiber_target.cpp), which prints
"ready <reader id> <sleeper id>" once two fibers wait, attaches gdb in batch mode and checks that
`spindle fibers` lists both with their waits and that `spindle bt` shows the reader's own frame; then
lets TARGET finish, which it does with status 0 only if gdb left its fibers intact. With a core file
written while attached, `spindle fibers` must list the same; --no-core leaves that part out (a sanitizer's
process maps terabytes of shadow memory, and gdb's core file of it is neither quick nor readable). Exits
77 (skipped) when gdb is missing or may not attach here.
"""

import os
import shutil
import subprocess
import sys
import tempfile

SKIP = 77


def fail(msg, out=""):
    print("FAIL: " + msg)
    if out:
        print("---- gdb said ----\n" + out)
    sys.exit(1)


def gdb(args, timeout=120):
    r = subprocess.run(["gdb", "-batch", "-nx"] + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=timeout)
    return r.stdout


def main():
    target, script = sys.argv[1], sys.argv[2]
    with_core = "--no-core" not in sys.argv[3:]
    if shutil.which("gdb") is None:
        print("SKIP: no gdb")
        sys.exit(SKIP)
    proc = subprocess.Popen([target], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().split()
        if len(line) != 3 or line[0] != "ready":
            fail("the target did not get ready: %r" % line)
        rid, sid = line[1], line[2]
        with tempfile.TemporaryDirectory() as tmp:
            core = os.path.join(tmp, "core")
            out = gdb(["-p", str(proc.pid), "-ex", "source " + script, "-ex", "spindle fibers",
                       "-ex", "spindle bt " + rid, "-ex", "spindle switch " + rid, "-ex", "up 3",
                       "-ex", "spindle restore", "-ex", "spindle bt 999999999"]
                      + (["-ex", "generate-core-file " + core] if with_core else []))
            if "ptrace: Operation not permitted" in out or "Could not attach" in out:
                print("SKIP: gdb may not attach here\n" + out)
                sys.exit(SKIP)
            want = ["fiber %s 'gdb-reader' suspended: io read fd " % rid,
                    "fiber %s 'gdb-sleeper' suspended: sleep" % sid,
                    "waitForByte",                       # the reader's own frame, from `spindle bt`
                    "spindle::read",
                    "fiber %s: its frames are the current ones" % rid,
                    "restored",
                    "no listed fiber with id 999999999"]
            for w in want:
                if w not in out:
                    fail("gdb's output lacks %r" % w, out)
            if with_core:
                if not os.path.exists(core):
                    fail("gdb wrote no core file", out)
                out = gdb([target, core, "-ex", "source " + script, "-ex", "spindle fibers"])
                for w in want[:2]:
                    if w not in out:
                        fail("on the core file, gdb's output lacks %r" % w, out)
        proc.stdin.close()
        status = proc.wait(timeout=60)
        if status != 0:
            fail("the target exited %d after gdb detached (its fibers were disturbed)" % status)
    finally:
        if proc.poll() is None:
            proc.kill()
    print("PASS")


if __name__ == "__main__":
    main()
