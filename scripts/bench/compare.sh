#!/usr/bin/env bash
# Measures the core hot paths of two commits in the same run: builds REF in its own worktree
# (build/bench-ref/), then runs each core benchmark binary of REF and of the working tree
# alternately (REF, tree; tree, REF; ...), pinned to one CPU, and prints for every benchmark the
# median before and after, each side's range over the rounds, and the ratio after/before of the
# time per iteration (< 1: faster now). A change is outside the noise when the ranges do not overlap.
#
# usage: scripts/bench/compare.sh [--ref REV] [--rounds N] [--cpu C] [--min-time S] [--filter RE] [--no-build]
#                                 [--out DIR]
#   --ref REV       the commit to compare against (default: HEAD~1)
#   --rounds N      A/B rounds; each round runs every binary once per side (default 5)
#   --cpu C         CPU both sides are confined to (default 1)
#   --min-time S    Google Benchmark's --benchmark_min_time (default 0.2)
#   --filter RE     --benchmark_filter for every binary (default: the issue-14 set: switch, yield,
#                   spawn+join, NOP through 1/8/64 fibers and raw liburing, future round trips)
#   --no-build      reuse both builds as they are
#   --out DIR       also keep the results in DIR: compare.csv (one row per benchmark, side and round: ns per
#                   iteration), compare-ref.json (the commit compared against) and meta-compare.json (the machine
#                   and the working tree's commit)
# SPDX-License-Identifier: Apache-2.0
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

ref=HEAD~1
rounds=5
cpu=1
min_time=0.2
filter='BM_SpindleSwitch|BM_BoostJumpFcontext|BM_SpindleYieldRoundTrip|BM_SpindleSpawnJoin|BM_SpindleFiberNop|BM_RawLiburingNop|BM_FiberFutureRoundTrip'
build=1
out_dir=""
while (($# > 0)); do
  case "$1" in
    --ref) ref="$2"; shift ;;
    --rounds) rounds="$2"; shift ;;
    --cpu) cpu="$2"; shift ;;
    --min-time) min_time="$2"; shift ;;
    --filter) filter="$2"; shift ;;
    --no-build) build=0 ;;
    --out) out_dir="$2"; shift ;;
    -h|--help) awk 'NR == 1 { next } !/^#/ { exit } !/SPDX-License-Identifier/ { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *) echo "compare.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "compare.sh: --rounds needs a positive integer" >&2; exit 2; }
command -v python3 >/dev/null || { echo "compare.sh: python3 is needed to read the JSON results" >&2; exit 1; }

root="$SPINDLE_REPO_ROOT"
refdir="$root/build/bench-ref/src"
refsha=$(git -C "$root" rev-parse --verify "$ref^{commit}") || { echo "compare.sh: no commit '$ref'" >&2; exit 2; }
benches=(switch scheduler nop future)
targets=()
for b in "${benches[@]}"; do targets+=("spindle_${b}_bench"); done
if ((build)); then
  bench_build "${targets[@]}"
  if [[ -d "$refdir" ]]; then
    # A directory there that is not a worktree of its own would let git find the enclosing one, the
    # working tree being measured, and move its HEAD.
    if [[ "$(git -C "$refdir" rev-parse --show-toplevel 2>/dev/null)" != "$(cd "$refdir" && pwd -P)" ]]; then
      echo "compare.sh: $refdir is not a git worktree of its own; remove it and run again" >&2
      exit 1
    fi
    git -C "$refdir" checkout -q --detach "$refsha"
  else
    mkdir -p "$(dirname "$refdir")"
    git -C "$root" worktree add -f --detach "$refdir" "$refsha" >/dev/null
  fi
  cmake -S "$refdir" -B "$refdir/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSPINDLE_BUILD_TESTS=OFF \
    -DSPINDLE_BUILD_APPS=OFF >/dev/null
  cmake --build "$refdir/build" -j "${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" --target "${targets[@]}" >/dev/null
fi
new="$root/build/release/perf"
old="$refdir/build/perf"
for b in "${benches[@]}"; do bench_require "$new/spindle_${b}_bench" "$old/spindle_${b}_bench"; done
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
bench_out_init "$out_dir" compare.csv compare-ref.json

echo "machine: $(bench_machine_line)"
echo "before: $(git -C "$refdir" log -1 --format='%h %s' | cut -c1-100)"
echo "after:  working tree at $(git -C "$root" log -1 --format='%h %s' | cut -c1-90)"
echo "CPU $cpu, $rounds rounds alternating, median [min..max] per side"
# A guess for the progress lines: a second per binary beyond --min-time per benchmark.
step_s=$(awk -v t="$min_time" 'BEGIN { print 1 + 10 * t }')
bench_progress_start $((rounds * 2 * ${#benches[@]})) "$(awk -v n="$((rounds * 2 * ${#benches[@]}))" -v s="$step_s" \
  'BEGIN { print n * s }')"
for ((r = 0; r < rounds; r++)); do
  if ((r % 2 == 0)); then order="old new"; else order="new old"; fi
  for side in $order; do
    dir=$old; [[ $side == new ]] && dir=$new
    for b in "${benches[@]}"; do
      bench_step "$step_s" "compare round $((r + 1))/$rounds, $side spindle_${b}_bench"
      taskset -c "$cpu" "$dir/spindle_${b}_bench" --benchmark_filter="$filter" --benchmark_min_time="$min_time" \
        --benchmark_format=json --benchmark_out="$out/$side-$b-$r.json" --benchmark_out_format=json >/dev/null
    done
  done
done

bench_progress_end
python3 - "$out" "$bench_out" "$refsha" "$(git -C "$root" describe --always "$refsha")" <<'PY'
import csv, json, os, statistics, sys
out, keep = sys.argv[1], sys.argv[2]
runs = {"old": {}, "new": {}}
rows = []
for f in sorted(os.listdir(out)):
    side = f.split("-")[0]
    try:
        doc = json.load(open(os.path.join(out, f)))
    except ValueError:
        continue  # a binary none of whose benchmarks the filter selected writes no JSON
    for b in doc["benchmarks"]:
        if b.get("run_type") != "iteration":
            continue
        # The switch is timed on the thread's CPU clock (ns/switch); everything else by real time.
        v = b.get("ns/switch", b["real_time"])
        runs[side].setdefault(b["run_name"], []).append(v)
        rows.append([b["run_name"], "before" if side == "old" else "after", f.split("-")[-1].split(".")[0], v])
if keep:  # --out: every figure, and which commit "before" is
    with open(os.path.join(keep, "compare.csv"), "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["benchmark", "side", "round", "ns_per_iteration"])
        w.writerows(sorted(rows))
    with open(os.path.join(keep, "compare-ref.json"), "w") as fh:
        json.dump({"ref_sha": sys.argv[3], "ref": sys.argv[4]}, fh, indent=2)
names = sorted(set(runs["old"]) & set(runs["new"]))
print(f"\n{'benchmark':52s} {'before ns':>22s} {'after ns':>22s} {'after/before':>12s}")
for n in names:
    o, w = runs["old"][n], runs["new"][n]
    mo, mw = statistics.median(o), statistics.median(w)
    overlap = not (max(w) < min(o) or min(w) > max(o))
    note = "" if overlap else ("  faster" if mw < mo else "  SLOWER")
    print(f"{n:52s} {mo:9.1f} [{min(o):.1f}..{max(o):.1f}] {mw:9.1f} [{min(w):.1f}..{max(w):.1f}] {mw / mo:11.3f}{note}")
PY
bench_out_finish
