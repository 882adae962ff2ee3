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
#                                  [--out DIR] [--no-build]
#   --carriers N     carriers per runtime (default 0: one per core)
#   --seconds D      idle time measured per configuration (default 3)
#   --tick-ms T      period of the per-carrier ticker in the second pass (default 1)
#   --repetitions R  repetitions of each latency benchmark; the median is reported (default 5)
#   --no-latency     skip the latency benchmark
#   --out DIR        also keep the results in DIR: idle-cpu.csv (spindle-idle's line for each
#                    configuration, field by field), idle-poll-latency.json (the latency benchmark's
#                    Google Benchmark JSON) and meta-idle_cpu.json (the machine and the commit);
#                    scripts/bench/plot DIR draws them
#   --no-build       use the existing build/release binaries
# SPDX-License-Identifier: Apache-2.0
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

carriers=0
seconds=3
tick=1
reps=5
latency=1
out_dir=""
build=1
while (($# > 0)); do
  case "$1" in
    --carriers) carriers="$2"; shift ;;
    --seconds) seconds="$2"; shift ;;
    --tick-ms) tick="$2"; shift ;;
    --repetitions) reps="$2"; shift ;;
    --no-latency) latency=0 ;;
    --out) out_dir="$2"; shift ;;
    --no-build) build=0 ;;
    -h|--help) awk 'NR == 1 { next } !/^#/ { exit } !/SPDX-License-Identifier/ { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *) echo "idle_cpu.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

if ((build)); then bench_build spindle-idle spindle_poll_mode_bench; fi
idle="$SPINDLE_REPO_ROOT/build/release/apps/spindle-idle"
bench="$SPINDLE_REPO_ROOT/build/release/perf/spindle_poll_mode_bench"
bench_require "$idle"
((!latency)) || bench_require "$bench"
bench_out_init "$out_dir" idle-cpu.csv idle-poll-latency.json
configs=("block" "hybrid" "spin" "block --sqpoll" "spin --sqpoll")
run_s=$(awk -v s="$seconds" 'BEGIN { print s + 0.2 }')
# The latency benchmark: 2 runs of about a second each per benchmark and repetition, a guess.
lat_s=$((latency ? 2 * reps * 4 : 0))
bench_progress_start $((2 * ${#configs[@]} + latency)) "$(awk -v n="$((2 * ${#configs[@]}))" -v s="$run_s" -v l="$lat_s" \
  'BEGIN { print n * s + l }')"

echo "machine: $(bench_machine_line)"
# Spinning carriers get only the CPU that other processes leave them: say how loaded the machine was.
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "idle CPU, $seconds s per configuration, % of one CPU per carrier"
for t in 0 "$tick"; do
  for cfg in "${configs[@]}"; do
    bench_step "$run_s" "idle_cpu $cfg, tick $t ms"
    # shellcheck disable=SC2086  # cfg is a mode and an optional flag
    set -- $cfg
    line=$("$idle" --carriers "$carriers" --seconds "$seconds" --tick-ms "$t" --mode "$@")
    printf '%s\n' "$line"
    bench_kvrow idle-cpu.csv "$line"
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

if ((!latency)); then
  bench_progress_end
  bench_out_finish
  exit 0
fi
bench_step "$lat_s" "idle_cpu spindle_poll_mode_bench x $reps"
command -v python3 >/dev/null || { echo "idle_cpu.sh: python3 is needed to read the JSON results" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$bench" --benchmark_repetitions="$reps" --benchmark_format=json --benchmark_out="$out/poll.json" \
  --benchmark_out_format=json >/dev/null
bench_progress_end
bench_save "$out/poll.json" idle-poll-latency.json
bench_out_finish
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
