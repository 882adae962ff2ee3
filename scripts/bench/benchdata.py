#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Writes the result files of scripts/bench/*.sh --out DIR: the run's description and CSV rows.

usage: benchdata.py meta DIR NAME SCRIPT FILES [ARG...]  DIR/meta-NAME.json (e.g. meta-echo.json for
                                                  echo.sh): the script, its arguments, the commit (git
                                                  describe --always --dirty), this machine, the start;
                                                  FILES (comma-separated) are the files the run writes:
                                                  any left from an earlier run in DIR are removed first
       benchdata.py finish DIR NAME              adds the end time, the load average then, and which of
                                                  the files were written
       benchdata.py row FILE COLUMNS VALUE...    appends one CSV row (COLUMNS: comma-separated names; the
                                                  header is written when FILE is new, and must match if not)
       benchdata.py rows FILE COLUMNS [PREFIX...]  appends a row per line of stdin: the PREFIX values, then
                                                  the line's whitespace-separated fields
       benchdata.py kvrow FILE LINE [KEY=VALUE...]  appends a row made of a "key=value key=value" line (as
                                                  spindle-idle and spindle-echo print), extra pairs first
Every file is written through the json and csv modules, so any string is quoted as it must be.
Exit status: 0; 1 when a file cannot be written or a row does not fit its header; 2 on bad usage.
"""
import csv
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _loadavg():
    return _read("/proc/loadavg").split()[:3]


def _git(*args):
    try:
        return subprocess.run(["git", "-C", REPO, *args], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def _virtualization():
    """What runs this machine: systemd-detect-virt's hypervisor and container (e.g. "kvm, in docker"), else
    the CPU's hypervisor flag and the DMI names."""
    if shutil.which("systemd-detect-virt"):
        found = {}
        for kind in ("vm", "container"):
            r = subprocess.run(["systemd-detect-virt", "--" + kind], capture_output=True, text=True)
            found[kind] = r.stdout.strip() or "none"
        if found["container"] == "none":
            return found["vm"]  # "none" on bare metal
        return f"{found['vm']}, in {found['container']}"
    flags = next((l for l in _read("/proc/cpuinfo").splitlines() if l.startswith("flags")), "")
    dmi = " ".join(filter(None, (_read(f"/sys/class/dmi/id/{k}").strip() for k in ("sys_vendor", "product_name"))))
    if " hypervisor" in flags:
        return "virtual machine (hypervisor flag)" + (f": {dmi}" if dmi else "")
    return f"not detected{': ' + dmi if dmi else ''}"


def machine():
    cpuinfo = _read("/proc/cpuinfo")
    model = next((l.split(":", 1)[1].strip() for l in cpuinfo.splitlines() if l.startswith("model name")), None)
    if model is None:  # e.g. arm64, which names no model there
        r = subprocess.run(["lscpu"], capture_output=True, text=True) if shutil.which("lscpu") else None
        out = r.stdout if r else ""
        model = next((l.split(":", 1)[1].strip() for l in out.splitlines() if l.startswith("Model name")), "unknown")
    mem_kb = next((int(l.split()[1]) for l in _read("/proc/meminfo").splitlines() if l.startswith("MemTotal:")), 0)
    return {
        "cpu_model": " ".join(model.split()),
        "cpus_online": os.cpu_count(),
        "cpus_allowed": len(os.sched_getaffinity(0)),
        "kernel": platform.release(),
        "arch": platform.machine(),
        "memory_kib": mem_kb,
        "memory_gib": round(mem_kb / 1048576, 1),
        "virtualization": _virtualization(),
        "os": next((l.split("=", 1)[1].strip('"') for l in _read("/etc/os-release").splitlines()
                    if l.startswith("PRETTY_NAME=")), None),
    }


def meta_path(out, name):
    """DIR/meta-NAME.json: one per kind of run (a script, or one of its modes), so that runs can share a DIR."""
    return os.path.join(out, f"meta-{name}.json")


def cmd_meta(args):
    if len(args) < 4:
        raise SystemExit(2)
    out, name, script, files, argv = args[0], args[1], args[2], [f for f in args[3].split(",") if f], args[4:]
    os.makedirs(out, exist_ok=True)
    for f in files:  # a series appended row by row must not carry an earlier run's rows
        if os.path.exists(os.path.join(out, f)):
            os.remove(os.path.join(out, f))
    meta = {
        "script": script,
        "arguments": argv,
        "files": files,
        "commit": _git("describe", "--always", "--dirty"),
        "commit_sha": _git("rev-parse", "HEAD"),
        "started_utc": _now(),
        "load_average_start": _loadavg(),
        "machine": machine(),
    }
    _write_json(meta_path(out, name), meta)


def cmd_finish(args):
    if len(args) != 2:
        raise SystemExit(2)
    path = meta_path(args[0], args[1])
    with open(path, encoding="utf-8") as f:
        meta = json.load(f)
    meta["finished_utc"] = _now()
    meta["load_average_end"] = _loadavg()
    meta["files"] = [f for f in meta.get("files", []) if os.path.exists(os.path.join(args[0], f))]
    _write_json(path, meta)


def _write_json(path, doc):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def append_row(path, columns, values):
    if len(columns) != len(values):
        sys.exit(f"benchdata.py: {os.path.basename(path)}: {len(values)} values for {len(columns)} columns {columns}")
    new = not os.path.exists(path) or os.path.getsize(path) == 0
    if not new:
        with open(path, newline="", encoding="utf-8") as f:
            have = next(csv.reader(f), [])
        if have != columns:
            sys.exit(f"benchdata.py: {path} has columns {have}, not {columns}")
    with open(path, "a", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        if new:
            w.writerow(columns)
        w.writerow(values)


def cmd_row(args):
    if len(args) < 2:
        raise SystemExit(2)
    append_row(args[0], args[1].split(","), args[2:])


def cmd_rows(args):
    if len(args) < 2:
        raise SystemExit(2)
    columns = args[1].split(",")
    for line in sys.stdin:
        if line.strip():
            append_row(args[0], columns, args[2:] + line.split())


def cmd_kvrow(args):
    if len(args) < 2:
        raise SystemExit(2)
    pairs = [kv.split("=", 1) for kv in args[2:] + args[1].split() if "=" in kv]
    append_row(args[0], [k for k, _ in pairs], [v for _, v in pairs])


def main(argv):
    commands = {"meta": cmd_meta, "finish": cmd_finish, "row": cmd_row, "rows": cmd_rows, "kvrow": cmd_kvrow}
    if len(argv) < 2 or argv[1] not in commands:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    try:
        commands[argv[1]](argv[2:])
    except SystemExit as e:
        if e.code == 2:
            print(__doc__.strip(), file=sys.stderr)
        raise
    except OSError as e:
        print(f"benchdata.py: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
