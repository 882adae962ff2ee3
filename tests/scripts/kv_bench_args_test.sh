#!/usr/bin/env bash
# scripts/bench/kv.sh's placement flags (--worker-cpus, --client-cpu, --client-threads): --help names
# them, each bad value exits 2 with a message that says why before anything starts, and good values
# get past the checks. The script runs from a copy with no build beside it and with stand-ins for the
# Redis tools first on PATH, so a run whose flags pass stops at the missing spindle-kv (status 1)
# instead of installing or measuring.
# usage: kv_bench_args_test.sh PATH/TO/REPO     Exit status: 0 pass, 1 fail.
# SPDX-License-Identifier: Apache-2.0
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=bench_copy.sh
source "$(dirname "${BASH_SOURCE[0]}")/bench_copy.sh"
bench_copy "$1" kv.sh redis-benchmark redis-cli redis-server

# run_kv ARG...: kv.sh ARG... --no-build; sets rc, output in $tmp/stderr.
run_kv() {
  rc=0
  PATH="$tmp/bin:$PATH" timeout -k 2 20 bash "$tmp/repo/scripts/bench/kv.sh" "$@" --no-build \
    >"$tmp/stdout" 2>"$tmp/stderr" || rc=$?
}
# expect_usage_error MESSAGE ARG...: kv.sh ARG... exits 2 and prints MESSAGE on stderr.
expect_usage_error() {
  local want=$1
  shift
  run_kv "$@"
  ((rc == 2)) || fail "kv.sh $* exited $rc, not 2: $(cat "$tmp/stderr")"
  grep -qF -- "$want" "$tmp/stderr" || fail "kv.sh $* did not say '$want': $(cat "$tmp/stderr")"
}

for bad in 2:3 x "2 3" -1 "2," ",2" 2-; do
  expect_usage_error "--worker-cpus takes a CPU list such as 2 or 2-3, not '$bad'" --worker-cpus "$bad"
done
for bad in 0 -2 x 1.5; do
  expect_usage_error "--client-threads needs a positive integer" --client-threads "$bad"
done
for bad in "" x 1:3; do
  expect_usage_error "--client-cpu takes a CPU or a CPU list, not '$bad'" --client-cpu "$bad"
done

# Good values pass every check and stop only at the missing build.
for good in "--worker-cpus 2" "--worker-cpus 2-3,5" "--client-cpu 1,3 --client-threads 2"; do
  read -r -a args <<<"$good"
  run_kv "${args[@]}"
  ((rc == 1)) || fail "kv.sh $good exited $rc, not 1: $(cat "$tmp/stderr")"
  grep -qF "spindle-kv is missing" "$tmp/stderr" || fail "kv.sh $good did not stop at the build: $(cat "$tmp/stderr")"
done

# The help lists the flags.
bash "$tmp/repo/scripts/bench/kv.sh" --help >"$tmp/help"
for flag in '--worker-cpus L' '--client-cpu C' '--client-threads N'; do
  grep -qF -- "$flag" "$tmp/help" || fail "--help does not mention $flag"
done
echo "kv_bench_args_test: pass"
