#!/usr/bin/env bash
# What each poll mode costs when the runtime has nothing to do, and what it buys
# in cross-carrier latency. Builds the release preset, then:
#   1. runs build/release/apps/spindle-idle once per configuration (block,
#      hybrid, spin, block + SQPOLL, spin + SQPOLL), with no work at all and
#      with one fiber per carrier waking every --tick-ms, and prints the process
#      CPU time as % of one CPU per carrier (the SQPOLL threads' share apart);
#   2. unless --no-latency, runs spindle_poll_mode_bench (future and pipe round
#      trips between two carriers in each mode) and prints the medians.
#
# usage: scripts/bench/idle_cpu.sh [--carriers N] [--seconds D] [--tick-ms T] [--repetitions R] [--no-latency]
#   --carriers N     carriers per runtime (default 0: one per core)
#   --seconds D      idle time measured per configuration (default 3)
#   --tick-ms T      period of the per-carrier ticker in the second pass (default 1)
#   --repetitions R  repetitions of each latency benchmark; the median is reported (default 5)
#   --no-latency     skip the latency benchmark
# SPDX-License-Identifier: Apache-2.0
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

carriers=0
seconds=3
tick=1
reps=5
latency=1
while (($# > 0)); do
  case "$1" in
    --carriers) carriers="$2"; shift ;;
    --seconds) seconds="$2"; shift ;;
    --tick-ms) tick="$2"; shift ;;
    --repetitions) reps="$2"; shift ;;
    --no-latency) latency=0 ;;
    -h|--help) awk 'NR == 1 { next } !/^#/ { exit } !/SPDX-License-Identifier/ { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *) echo "idle_cpu.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

bench_build
idle="$SPINDLE_REPO_ROOT/build/release/apps/spindle-idle"
bench="$SPINDLE_REPO_ROOT/build/release/perf/spindle_poll_mode_bench"

echo "machine: $(bench_machine_line)"
# Spinning carriers get only the CPU that other processes leave them: say how loaded the machine was.
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "idle CPU, $seconds s per configuration, % of one CPU per carrier"
for t in 0 "$tick"; do
  for cfg in "block" "hybrid" "spin" "block --sqpoll" "spin --sqpoll"; do
    # shellcheck disable=SC2086  # cfg is a mode and an optional flag
    set -- $cfg
    "$idle" --carriers "$carriers" --seconds "$seconds" --tick-ms "$t" --mode "$@"
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

((latency)) || exit 0
command -v python3 >/dev/null || { echo "idle_cpu.sh: python3 is needed to read the JSON results" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$bench" --benchmark_repetitions="$reps" --benchmark_format=json --benchmark_out="$out/poll.json" \
  --benchmark_out_format=json >/dev/null
python3 - "$out/poll.json" <<'PY'
import json, sys, statistics
rows = {}
for b in json.load(open(sys.argv[1]))["benchmarks"]:
    if b.get("run_type") == "iteration":
        rows.setdefault(b["run_name"], []).append(b)
print()
print(f"{'round trip between 2 carriers':44s} {'median':>10s} {'min..max':>20s}  parks/iter  enters/iter")
for name, rs in rows.items():
    t = [r["real_time"] for r in rs]
    label = rs[0].get("label", "")
    print(f"{name.split('/')[0].replace('BM_PollMode', ''):18s} {label:25s} {statistics.median(t) / 1000:8.2f} µs"
          f" {min(t) / 1000:8.2f}..{max(t) / 1000:.2f} µs  {statistics.median(r['parks/iter'] for r in rs):9.3f}"
          f"  {statistics.median(r['enters/iter'] for r in rs):10.3f}")
PY
