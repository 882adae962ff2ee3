#!/usr/bin/env bash
# scripts/bench/http.sh's large-file flags: --help names them, and each bad use of --files or
# --file-connections exits 2 with a message that says why, before anything starts. The script runs from
# a copy with no build beside it and with stand-ins for wrk and nginx first on PATH, so a check that no
# longer stops it ends at the missing spindle-httpd (status 1) instead of installing or measuring.
# usage: http_bench_args_test.sh PATH/TO/REPO     Exit status: 0 pass, 1 fail.
# SPDX-License-Identifier: Apache-2.0
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=bench_copy.sh
source "$(dirname "${BASH_SOURCE[0]}")/bench_copy.sh"
bench_copy "$1" http.sh wrk nginx

# expect_usage_error MESSAGE ARG...: http.sh ARG... --no-build exits 2 and prints MESSAGE on stderr.
expect_usage_error() {
  local want=$1 rc=0
  shift
  PATH="$tmp/bin:$PATH" timeout -k 2 20 bash "$tmp/repo/scripts/bench/http.sh" "$@" --no-build --port-base 1 \
    >"$tmp/stdout" 2>"$tmp/stderr" || rc=$?
  ((rc == 2)) || fail "http.sh $* exited $rc, not 2: $(cat "$tmp/stderr")"
  grep -qF -- "$want" "$tmp/stderr" || fail "http.sh $* did not say '$want': $(cat "$tmp/stderr")"
}

expect_usage_error "--files does not go with --rss or --floor" --files 1M --rss
expect_usage_error "--files does not go with --rss or --floor" --floor --files 1M
expect_usage_error "--files needs at least one size" --files ""
expect_usage_error "--files names 1M twice" --files "1M 100M 1M"
for bad in 1.5M 0 1T -1 10000000000 M; do
  expect_usage_error "not '$bad'" --files "$bad"
done
expect_usage_error "--file-connections takes a positive number, not '0'" --files 1M --file-connections 0
expect_usage_error "--file-connections takes a positive number, not 'x'" --files 1M --file-connections x

# The help lists the mode and its flags.
bash "$tmp/repo/scripts/bench/http.sh" --help >"$tmp/help"
for flag in '--files L' '--file-connections F' http-files.csv; do
  grep -qF -- "$flag" "$tmp/help" || fail "--help does not mention $flag"
done
echo "http_bench_args_test: pass"
