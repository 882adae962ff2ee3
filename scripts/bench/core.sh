#!/usr/bin/env bash
# Runs the core benchmarks side by side with their peers (Boost.Context,
# Boost.Fiber, a raw liburing loop, std::promise, std::mutex), in the same
# binaries and the same run, and prints each figure with its ratio against the
# peer: switch, yield, spawn, NOP, futures, mutexes, condition variables, the
# sequencer.
#
# usage: scripts/bench/core.sh [--repetitions N] [--cpu C] [--min-time S] [--out DIR] [--no-build]
#   --repetitions N  runs of each benchmark; the median is reported (default 5)
#   --cpu C          CPU the benchmark process is confined to (default 1)
#   --min-time S     Google Benchmark's --benchmark_min_time (default 0.3)
#   --out DIR        also keep the results in DIR: Google Benchmark's JSON of each binary
#                    (core-<name>.json; core-wide-future.json for the two-CPU run) and meta-core.json (the
#                    machine and the commit); scripts/bench/plot DIR draws them
#   --no-build       use the existing build/release/perf binaries
# SPDX-License-Identifier: Apache-2.0
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

reps=5
cpu=1
min_time=0.3
out_dir=""
build=1
while (($# > 0)); do
  case "$1" in
    --repetitions) reps="$2"; shift ;;
    --cpu) cpu="$2"; shift ;;
    --min-time) min_time="$2"; shift ;;
    --out) out_dir="$2"; shift ;;
    --no-build) build=0 ;;
    -h|--help) awk 'NR == 1 { next } !/^#/ { exit } !/SPDX-License-Identifier/ { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *) echo "core.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
command -v python3 >/dev/null || { echo "core.sh: python3 is needed to read the JSON results" >&2; exit 1; }

bin="$SPINDLE_REPO_ROOT/build/release/perf"
benches=(switch scheduler nop future sync offload)
targets=()
for b in "${benches[@]}"; do targets+=("spindle_${b}_bench"); done
if ((build)); then bench_build "${targets[@]}"; fi
bench_require "${targets[@]/#/$bin/}"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
series=()
for b in "${benches[@]}"; do series+=("core-$b.json"); done
bench_out_init "$out_dir" "${series[@]}" core-wide-future.json

echo "machine: $(bench_machine_line)"
echo "pinned to CPU $cpu, $reps repetitions each, median reported"
# The estimate for the progress lines: each benchmark runs about --min-time per repetition.
wide_filter='AcrossCarriers|StdPromise'
declare -A count=()
total=0
for b in "${benches[@]}"; do
  count[$b]=$("$bin/spindle_${b}_bench" --benchmark_list_tests | wc -l)
  total=$((total + count[$b]))
done
count[wide]=$("$bin/spindle_future_bench" --benchmark_list_tests --benchmark_filter="$wide_filter" | wc -l)
total=$((total + count[wide]))
step_s() { awk -v n="$1" -v r="$reps" -v t="$min_time" 'BEGIN { print n * r * (t + 0.05) }'; }
bench_progress_start $((${#benches[@]} + 1)) "$(step_s "$total")"
for b in "${benches[@]}"; do
  bench_step "$(step_s "${count[$b]}")" "core spindle_${b}_bench, ${count[$b]} benchmarks x $reps"
  taskset -c "$cpu" "$bin/spindle_${b}_bench" --benchmark_repetitions="$reps" \
    --benchmark_min_time="$min_time" --benchmark_format=json --benchmark_out="$out/$b.json" \
    --benchmark_out_format=json >/dev/null
  bench_save "$out/$b.json" "core-$b.json"
done
# The cross-carrier future round trip once more with both CPUs (two carriers,
# two threads for std::promise): each hand-off then wakes a halted vCPU.
mkdir -p "$out/wide"
bench_step "$(step_s "${count[wide]}")" "core spindle_future_bench on every CPU, ${count[wide]} benchmarks x $reps"
"$bin/spindle_future_bench" --benchmark_filter="$wide_filter" --benchmark_repetitions="$reps" \
  --benchmark_min_time="$min_time" --benchmark_format=json --benchmark_out="$out/wide/future.json" \
  --benchmark_out_format=json >/dev/null
bench_save "$out/wide/future.json" core-wide-future.json
bench_progress_end
bench_out_finish

python3 - "$out" <<'PY'
import json, sys, os, statistics
out = sys.argv[1]
def load(folder, prefix=""):
    found = {}
    for f in os.listdir(folder):
        if not f.endswith(".json"):
            continue
        for b in json.load(open(os.path.join(folder, f)))["benchmarks"]:
            if b.get("run_type") == "iteration":
                found.setdefault(prefix + b["run_name"], []).append(b)
    return found
runs = load(out)
runs.update(load(os.path.join(out, "wide"), "wide:"))

def med(name, key):
    rows = runs.get(name) or runs.get(name + "/real_time")
    if not rows:
        return None
    vals = [r[key] for r in rows if key in r]
    return (statistics.median(vals), min(vals), max(vals)) if vals else None

def ns(name):  # real time per iteration, ns
    return med(name, "real_time")

def fmt(t):
    return "n/a" if t is None else f"{t[0]:9.1f} ns  [{t[1]:.1f}..{t[2]:.1f}]"

def line(label, ours, peer, peer_label, per=""):
    r = "n/a" if ours is None or peer is None else f"{peer[0] / ours[0]:.2f}x"
    print(f"{label:34s} {fmt(ours)}{per}   {peer_label}: {fmt(peer)}   speed-up vs peer: {r}")

print()
# The switch is timed on the thread's CPU clock ("ns/switch"): a preemption
# between two switches does not count against either side.
sw = med("BM_SpindleSwitch", "ns/switch"); bsw = med("BM_BoostJumpFcontext", "ns/switch")
line("one raw switch (CPU time)", sw, bsw, "Boost jump_fcontext")
line("yield round trip (2 yields)", ns("BM_SpindleYieldRoundTrip"), ns("BM_BoostFiberYieldRoundTrip"), "Boost.Fiber")
line("spawn + join, empty fiber", ns("BM_SpindleSpawnJoin"), ns("BM_BoostFiberSpawnJoin"), "Boost.Fiber")
for k in ("allocs/iter", "enters/iter", "mmaps/iter", "parks/iter"):
    v = med("BM_SpindleSpawnJoin", k)
    print(f"    spawn+join {k:12s} {v[0] if v else 'n/a'}")
print()
for n in (1, 8, 64):
    ours = med(f"BM_SpindleFiberNop/{n}", "items_per_second")
    raw = med(f"BM_RawLiburingNop/{n}", "items_per_second")
    if ours and raw:
        print(f"NOP, {n:2d} fibers vs batch of {n:2d}: spindle {ours[0]/1e6:6.2f} M/s  raw liburing {raw[0]/1e6:6.2f} M/s"
              f"  ratio {ours[0]/raw[0]:.2f}  (spindle range {ours[1]/1e6:.2f}..{ours[2]/1e6:.2f})")
print()
line("future round trip, same carrier", ns("BM_FiberFutureRoundTripSameCarrier"),
     ns("BM_StdPromiseRoundTripAcrossThreads"), "std::promise, 2 threads, 1 CPU")
line("future round trip, 2 carriers, 1 CPU", ns("BM_FiberFutureRoundTripAcrossCarriers"),
     ns("BM_StdPromiseRoundTripAcrossThreads"), "std::promise, 2 threads, 1 CPU")
line("future round trip, 2 carriers, 2 CPUs", ns("wide:BM_FiberFutureRoundTripAcrossCarriers"),
     ns("wide:BM_StdPromiseRoundTripAcrossThreads"), "std::promise, 2 threads, 2 CPUs")
for name in ("BM_FiberFutureRoundTripSameCarrier", "BM_FiberFutureRoundTripAcrossCarriers", "BM_StdPromiseRoundTripAcrossThreads"):
    v = med(name, "allocs/iter")
    print(f"    {name:40s} allocs/iter {v[0] if v else 'n/a'}")
print()
line("FiberMutex lock+unlock, uncontended", ns("BM_FiberMutexUncontended"), ns("BM_StdMutexUncontended"), "std::mutex")
line("  same, from a plain thread", ns("BM_FiberMutexUncontendedFromThread"), ns("BM_StdMutexUncontended"), "std::mutex")
line("FairFiberMutex, uncontended", ns("BM_FairFiberMutexUncontended"), ns("BM_StdMutexUncontended"), "std::mutex")
line("FiberMutex hand-off, 4 fibers", ns("BM_FiberMutexHandoff"), ns("BM_BoostFiberMutexHandoff"), "boost::fibers::mutex")
line("FairFiberMutex hand-off, 4 fibers", ns("BM_FairFiberMutexHandoff"), ns("BM_BoostFiberMutexHandoff"), "boost::fibers::mutex")
line("FiberCondVar ping-pong round trip", ns("BM_FiberCondVarPingPong"), ns("BM_BoostFiberCondVarPingPong"), "boost::fibers::condition_variable")
line("offload(empty fn) round trip", ns("BM_OffloadEmptyRoundTrip"), ns("BM_StdAsyncEmptyRoundTrip"), "std::async().get()")
seqr = med("BM_SequencerWakesThousandInOrder", "items_per_second")
ooo = med("BM_SequencerWakesThousandInOrder", "out_of_order")
if seqr:
    print(f"FiberSequencer, 1,000 waiters woken in order: {1e9/seqr[0]:.1f} ns per waiter (register + wake), "
          f"out of order: {ooo[0] if ooo else 'n/a'}")
PY
