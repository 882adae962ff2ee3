#!/usr/bin/env bash
# The NUMA work-stealing experiment (docs/PERFORMANCE.md, "NUMA stealing experiment"). Builds
# build/release/apps/spindle-topo, then runs `spindle-topo experiment` twice: on this machine (one carrier
# per core), and on the synthetic topology "pack:2 numa:2 core:4 pu:2" with 16 unbound carriers
# (simulation: they share this machine's CPUs, so only steal counts and balance describe the policy there).
#
# usage: scripts/bench/numa.sh [--fibers N] [--work-us U] [--repetitions R] [--policy LIST] [--skew S]
#                              [--out DIR] [--no-build]
#   --fibers N       fibers in the workload (default 512)
#   --work-us U      CPU microseconds of work per fiber (default 500)
#   --repetitions R  runs per policy; spindle-topo shows the median makespan (default 5)
#   --policy LIST    comma-separated policies (default numa,random,none)
#   --skew S         one-carrier or hot-node (default one-carrier)
#   --out DIR        also keep the results in DIR: numa.csv (each table cell: topology, policy, metric,
#                    value; the steals per distance class among them) and meta-numa.json (the machine and the
#                    commit); scripts/bench/plot DIR draws them
#   --no-build       use the existing build/release/apps/spindle-topo
# SPDX-License-Identifier: Apache-2.0
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

fibers=512
work=500
reps=5
policy=numa,random,none
skew=one-carrier
out_dir=""
build=1
while (($# > 0)); do
  case "$1" in
    --fibers) fibers="$2"; shift ;;
    --work-us) work="$2"; shift ;;
    --repetitions) reps="$2"; shift ;;
    --policy) policy="$2"; shift ;;
    --skew) skew="$2"; shift ;;
    --out) out_dir="$2"; shift ;;
    --no-build) build=0 ;;
    -h|--help) awk 'NR == 1 { next } !/^#/ { exit } !/SPDX-License-Identifier/ { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *) echo "numa.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

if ((build)); then
  (cd "$SPINDLE_REPO_ROOT" && cmake --preset release && cmake --build --preset release --target spindle-topo) >&2
fi
topo="$SPINDLE_REPO_ROOT/build/release/apps/spindle-topo"
bench_require "$topo"
bench_out_init "$out_dir" numa.csv
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bench_machine_line
common=(experiment --policy "$policy" --fibers "$fibers" --work-us "$work" --repetitions "$reps" --skew "$skew")
# The estimate: every run of every policy does the whole workload's CPU time, at worst on one CPU.
IFS=, read -r -a policies <<<"$policy"
step_s=$(awk -v f="$fibers" -v w="$work" -v r="$reps" -v p="${#policies[@]}" 'BEGIN { print f * w / 1e6 * r * p + 0.5 }')
bench_progress_start 2 "$(awk -v s="$step_s" 'BEGIN { print 2 * s }')"
echo "== this machine =="
bench_step "$step_s" "numa experiment on this machine"
"$topo" "${common[@]}" | tee "$tmp/machine.txt"
echo
echo "== synthetic pack:2 numa:2 core:4 pu:2, 16 carriers (simulation) =="
bench_step "$step_s" "numa experiment on the synthetic topology"
"$topo" "${common[@]}" --topology "synthetic:pack:2 numa:2 core:4 pu:2" --carriers 16 | tee "$tmp/synthetic.txt"
bench_progress_end

# --out: the two tables, cell by cell (the first column is the row's name, one column per policy).
if [[ -n "$bench_out" ]]; then
  python3 - "$tmp" "$bench_out/numa.csv" <<'PY'
import csv, os, sys
tmp, path = sys.argv[1], sys.argv[2]
with open(path, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["topology", "policy", "metric", "value"])
    for topology in ("machine", "synthetic"):
        policies = None
        for line in open(os.path.join(tmp, topology + ".txt")):
            if line.startswith("policy "):
                policies = line.split()[1:]
            elif policies and line.strip():
                cells = line.split()[-len(policies):]
                for p, v in zip(policies, cells):
                    w.writerow([topology, p, line[:26].strip(), v])
PY
  bench_out_finish
fi
