#!/usr/bin/env bash
# The NUMA work-stealing experiment (docs/PERFORMANCE.md, "NUMA stealing experiment"). Builds
# build/release/apps/spindle-topo, then runs `spindle-topo experiment` twice: on this machine (one carrier
# per core), and on the synthetic topology "pack:2 numa:2 core:4 pu:2" with 16 unbound carriers
# (simulation: they share this machine's CPUs, so only steal counts and balance describe the policy there).
#
# usage: scripts/bench/numa.sh [--fibers N] [--work-us U] [--repetitions R] [--policy LIST] [--skew S]
#   --fibers N       fibers in the workload (default 512)
#   --work-us U      CPU microseconds of work per fiber (default 500)
#   --repetitions R  runs per policy; spindle-topo shows the median makespan (default 5)
#   --policy LIST    comma-separated policies (default numa,random,none)
#   --skew S         one-carrier or hot-node (default one-carrier)
# SPDX-License-Identifier: Apache-2.0
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

fibers=512
work=500
reps=5
policy=numa,random,none
skew=one-carrier
while (($# > 0)); do
  case "$1" in
    --fibers) fibers="$2"; shift ;;
    --work-us) work="$2"; shift ;;
    --repetitions) reps="$2"; shift ;;
    --policy) policy="$2"; shift ;;
    --skew) skew="$2"; shift ;;
    -h|--help) awk 'NR == 1 { next } !/^#/ { exit } !/SPDX-License-Identifier/ { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *) echo "numa.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

(cd "$SPINDLE_REPO_ROOT" && cmake --preset release && cmake --build --preset release --target spindle-topo) >&2
topo="$SPINDLE_REPO_ROOT/build/release/apps/spindle-topo"
bench_machine_line
common=(experiment --policy "$policy" --fibers "$fibers" --work-us "$work" --repetitions "$reps" --skew "$skew")
echo "== this machine =="
"$topo" "${common[@]}"
echo
echo "== synthetic pack:2 numa:2 core:4 pu:2, 16 carriers (simulation) =="
"$topo" "${common[@]}" --topology "synthetic:pack:2 numa:2 core:4 pu:2" --carriers 16
