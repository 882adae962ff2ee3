#!/usr/bin/env bash
# scripts/bench/plot on the small sample results in tests/scripts/plot_fixture/ (the files the bench
# scripts' --out writes, a few rows each): every figure the samples allow is written as a PNG file, and
# the figures without data are named as skipped. Skipped (exit 77) when matplotlib is not installed.
# usage: plot_test.sh PATH/TO/plot PATH/TO/FIXTURE_DIR     Exit status: 0 pass, 1 fail, 77 skipped.
# SPDX-License-Identifier: Apache-2.0
set -euo pipefail

plot=$1 fixture=$2
tmp=$(mktemp -d)
trap 'rm -rf -- "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

rc=0
"$plot" "$fixture" --out "$tmp/png" >"$tmp/stdout" 2>"$tmp/stderr" || rc=$?
if ((rc == 3)) && grep -q python3-matplotlib "$tmp/stderr"; then
  echo "SKIPPED: matplotlib is not installed (Debian: python3-matplotlib): $(cat "$tmp/stderr")"
  exit 77
fi
((rc == 0)) || fail "plot exited $rc: $(cat "$tmp/stderr")"
for name in http-latency-cdf echo-latency-cdf http-throughput http-files echo-throughput fio numa-steals idle-cpu core kv; do
  png="$tmp/png/$name.png"
  [[ -s "$png" ]] || fail "no $name.png; plot said: $(cat "$tmp/stdout" "$tmp/stderr")"
  [[ "$(head -c 8 "$png" | od -An -tx1 | tr -d ' \n')" == 89504e470d0a1a0a ]] || fail "$name.png is not a PNG file"
  grep -qF "wrote $png" "$tmp/stdout" || fail "plot did not name $png"
done
grep -q "skipped UDP echo over DPDK: no dpdk-udp.csv" "$tmp/stderr" || fail "the missing DPDK results are not named"
# Nothing in the fixture directory itself.
[[ -z "$(find "$fixture" -name '*.png')" ]] || fail "plot wrote into the fixture directory"
# An empty directory: nothing to draw is an error that says so.
mkdir "$tmp/empty"
rc=0
"$plot" "$tmp/empty" >/dev/null 2>"$tmp/stderr" || rc=$?
if ((rc != 1)) || ! grep -q "nothing to draw" "$tmp/stderr"; then fail "an empty directory gave $rc: $(cat "$tmp/stderr")"; fi
echo "plot_test: pass"
