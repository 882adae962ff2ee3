# shellcheck shell=bash
# Sourced by the bench scripts' argument tests: bench_copy REPO SCRIPT TOOL... copies
# scripts/bench/SCRIPT with lib.sh and scripts/lib/deps.sh into $tmp/repo (a copy with no build beside
# it), and puts a stand-in for each TOOL, which exits 1, in $tmp/bin for the caller to put first on
# PATH: so a run whose checks pass stops at the missing build instead of installing or measuring.
# Sets tmp (removed on exit) and defines fail MESSAGE (prints FAIL: MESSAGE, exits 1).
# SPDX-License-Identifier: Apache-2.0

fail() { echo "FAIL: $*" >&2; exit 1; }

bench_copy() {
  local repo=$1 script=$2 tool
  shift 2
  tmp=$(mktemp -d)
  trap 'rm -rf -- "$tmp"' EXIT
  mkdir -p "$tmp/repo/scripts/bench" "$tmp/repo/scripts/lib" "$tmp/bin"
  cp "$repo/scripts/bench/$script" "$repo/scripts/bench/lib.sh" "$tmp/repo/scripts/bench/"
  cp "$repo/scripts/lib/deps.sh" "$tmp/repo/scripts/lib/"
  for tool in "$@"; do printf '#!/bin/sh\nexit 1\n' >"$tmp/bin/$tool" && chmod 755 "$tmp/bin/$tool"; done
}
