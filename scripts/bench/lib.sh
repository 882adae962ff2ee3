# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# Helpers for benchmark scripts: source this file from the script's top level, before it parses its
# arguments (bench_argv keeps them for --out's description of the run), then call bench_build,
# bench_machine_line, ratio, and for --out DIR, --no-build and progress lines: bench_out_init, bench_row,
# bench_rows, bench_kvrow, bench_save, bench_out_finish, bench_require, bench_progress_start, bench_step,
# bench_progress_end.

SPINDLE_REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
_bench_lib_dir="$SPINDLE_REPO_ROOT/scripts/bench"
# The calling script's name and arguments (source without arguments keeps the caller's), for --out.
bench_who=$(basename "$0")
# The name of the run's description in --out, meta-<name>.json: the script's (echo for echo.sh), unless
# the script sets another for a mode whose results sit beside the default mode's (http.sh --rss).
bench_run_name=${bench_who%.sh}
bench_argv=("$@")
bench_out=""
# shellcheck source-path=SCRIPTDIR source=../lib/deps.sh
source "$SPINDLE_REPO_ROOT/scripts/lib/deps.sh"

# Installs missing packages, then configures the release preset with perf/ enabled and builds the
# named targets (every target when none is named). CMAKE_BUILD_PARALLEL_LEVEL sets the build's jobs.
# Build output goes to stderr so a caller's stdout stays data only.
# Errors: returns non-zero when any step fails.
bench_build() {
  local -a targets=()
  (($# == 0)) || targets=(--target "$@")
  (
    cd "$SPINDLE_REPO_ROOT" &&
      spindle_install_deps &&
      cmake --preset release -DSPINDLE_BUILD_PERF=ON &&
      cmake --build --preset release "${targets[@]}"
  ) >&2
}

# bench_require FILE...: for --no-build, exits (status 1) naming the first of the programs that is
# missing or not executable, and how to get it.
bench_require() {
  local f
  for f in "$@"; do
    [[ -x "$f" ]] || { echo "$bench_who: $f is missing; build it, or run without --no-build" >&2; exit 1; }
  done
}

# ---- --out DIR: raw results beside a description of the run ---------------------------------------
# bench_out_init DIR FILE...: with a non-empty DIR, creates it, sets bench_out to its absolute path,
# removes the FILEs (the series this script writes) left there by an earlier run, and writes
# DIR/meta-$bench_run_name.json (script, arguments, the FILEs, commit from git describe --always
# --dirty, CPU model, CPUs, kernel, memory, virtualization, start time, load average): several scripts
# can share a DIR. With an empty DIR it only clears bench_out, and bench_row, bench_rows, bench_kvrow, bench_save
# and bench_out_finish then do nothing.
# Errors: exits with status 1 when DIR cannot be made or written, or python3 is missing.
bench_out_init() {
  bench_out=""
  [[ -n "$1" ]] || return 0
  command -v python3 >/dev/null || { echo "$bench_who: python3 is needed for --out" >&2; exit 1; }
  mkdir -p "$1" || { echo "$bench_who: cannot create --out $1" >&2; exit 1; }
  bench_out=$(cd "$1" && pwd)
  local IFS=,
  python3 "$_bench_lib_dir/benchdata.py" meta "$bench_out" "$bench_run_name" "$bench_who" "${*:2}" \
    "${bench_argv[@]}" ||
    { echo "$bench_who: cannot write the description of the run in $bench_out" >&2; exit 1; }
}

# bench_row FILE COLUMNS VALUE...: appends one row to the CSV file FILE in --out (COLUMNS: names
# separated by commas; the header is written with the first row).
bench_row() {
  [[ -n "$bench_out" ]] || return 0
  python3 "$_bench_lib_dir/benchdata.py" row "$bench_out/$1" "${@:2}"
}

# bench_rows FILE COLUMNS [PREFIX...]: appends a CSV row per line of stdin to FILE in --out: the
# PREFIX values, then the line's whitespace-separated fields.
bench_rows() {
  if [[ -z "$bench_out" ]]; then cat >/dev/null; return 0; fi
  python3 "$_bench_lib_dir/benchdata.py" rows "$bench_out/$1" "${@:2}"
}

# bench_kvrow FILE LINE [KEY=VALUE...]: appends the pairs of a "key=value key=value" line as one CSV
# row (the extra pairs first, e.g. repetition=2).
bench_kvrow() {
  [[ -n "$bench_out" ]] || return 0
  python3 "$_bench_lib_dir/benchdata.py" kvrow "$bench_out/$1" "$2" "${@:3}"
}

# bench_save SRC NAME: copies a raw result file (e.g. Google Benchmark's JSON) into --out as NAME.
bench_save() {
  [[ -z "$bench_out" ]] || cp -- "$1" "$bench_out/$2"
}

# bench_out_finish: records the end time, the load average and the files written in
# meta-<script>.json, and says where the results are (stderr).
bench_out_finish() {
  [[ -n "$bench_out" ]] || return 0
  python3 "$_bench_lib_dir/benchdata.py" finish "$bench_out" "$bench_run_name" &&
    echo "$bench_who: results in $bench_out (plot them with scripts/bench/plot $bench_out)" >&2
}

# ---- progress on stderr, one line per step ---------------------------------------------------------
# bench_progress_start STEPS SECONDS: a run of STEPS steps, expected to take about SECONDS in all.
bench_progress_start() {
  _bench_steps=$1 _bench_est_total=$2 _bench_step=0 _bench_est_done=0 _bench_est_cur=0
  _bench_t0=$EPOCHREALTIME
}

# bench_order ROUND NAME...: sets the array `order` to the NAMEs, backward on even rounds, so that over
# the rounds no server always runs right after the same one.
bench_order() {
  local round=$1 i
  shift
  order=("$@")
  if ((round % 2 == 0)); then
    order=()
    for ((i = $#; i >= 1; i--)); do order+=("${!i}"); done
  fi
}

# bench_step SECONDS LABEL: starts the next step (expected to take about SECONDS) and prints
# "[i/N] LABEL, ~T left". T is the estimate of what is left, scaled by how the finished steps compared
# with their estimates.
bench_step() {
  local left
  _bench_est_done=$(awk -v a="$_bench_est_done" -v b="$_bench_est_cur" 'BEGIN { print a + b }')
  _bench_est_cur=$1
  _bench_step=$((_bench_step + 1))
  left=$(awk -v total="$_bench_est_total" -v done="$_bench_est_done" -v t0="$_bench_t0" -v now="$EPOCHREALTIME" '
    BEGIN { el = now - t0; scale = (done > 0 && el > 0) ? el / done : 1; print (total - done) * scale }')
  printf '[%d/%d] %s, ~%s left\n' "$_bench_step" "$_bench_steps" "$2" "$(bench_duration "$left")" >&2
}

# bench_progress_end: prints how long the steps took.
bench_progress_end() {
  printf '%s: %d steps in %s\n' "$bench_who" "$_bench_step" \
    "$(bench_duration "$(awk -v t0="$_bench_t0" -v now="$EPOCHREALTIME" 'BEGIN { print now - t0 }')")" >&2
}

# bench_duration SECONDS: prints e.g. 45s, 2m10s, 1h05m.
bench_duration() {
  awk -v s="$1" 'BEGIN {
    s = int(s + 0.5)
    if (s < 60) printf "%ds", s; else if (s < 3600) printf "%dm%02ds", s / 60, s % 60
    else printf "%dh%02dm", s / 3600, (s % 3600) / 60 }'
}

# Installs the Debian packages behind the peer tools a script runs, where a command is missing,
# the way scripts/lib/deps.sh installs build dependencies. Arguments: the calling script's name, then
# command=package pairs (e.g. wrk=wrk nginx=nginx-light).
# Errors: returns non-zero (with a message) when not root and without sudo, or when apt-get fails.
bench_install_tools() {
  local who=$1 pair
  shift
  local -a missing=() priv=()
  for pair in "$@"; do
    command -v "${pair%%=*}" >/dev/null 2>&1 || missing+=("${pair#*=}")
  done
  ((${#missing[@]} == 0)) && return 0
  if [[ "$(id -u)" != 0 ]]; then
    command -v sudo >/dev/null 2>&1 || { echo "$who: not root and no sudo; install ${missing[*]}" >&2; return 1; }
    priv=(sudo)
  fi
  echo "$who: installing ${missing[*]}" >&2
  "${priv[@]}" apt-get update >&2 &&
    "${priv[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >&2
}

# Parses a --backends value for the script `who`: sets backend_list (the backends, in order) and
# seen_backend[B]=1 for each. Errors: exits with status 2, saying why, on an empty list, a name other
# than io_uring or epoll, or one named twice.
bench_parse_backends() {
  local who=$1 b
  # shellcheck disable=SC2034  # both are the caller's
  read -r -a backend_list <<<"$2"
  ((${#backend_list[@]} > 0)) || { echo "$who: --backends needs io_uring, epoll or both" >&2; exit 2; }
  declare -gA seen_backend=()
  for b in "${backend_list[@]}"; do
    [[ "$b" =~ ^(io_uring|epoll)$ ]] || { echo "$who: --backends takes io_uring and epoll, not '$b'" >&2; exit 2; }
    [[ -z "${seen_backend[$b]:-}" ]] || { echo "$who: --backends names $b twice" >&2; exit 2; }
    seen_backend[$b]=1
  done
}

# Prints one line describing this machine: CPU model, online CPUs, kernel, memory, UTC date.
bench_machine_line() {
  local cpu mem_kb
  cpu=$(awk -F': *' '/^model name/ { print $2; exit }' /proc/cpuinfo 2>/dev/null || true)
  [[ -n "$cpu" ]] || cpu=$(lscpu 2>/dev/null | awk -F': *' '/^Model name/ { print $2; exit }' || true)
  [[ -n "$cpu" ]] || cpu=unknown
  cpu=$(tr -s ' ' <<<"$cpu")
  mem_kb=$(awk '/^MemTotal:/ { print $2; exit }' /proc/meminfo 2>/dev/null || true)
  printf 'cpu="%s" nproc=%s kernel=%s mem=%s date=%s\n' \
    "$cpu" "$(nproc)" "$(uname -r)" \
    "$(awk -v kb="${mem_kb:-0}" 'BEGIN { printf "%.1fGiB", kb / 1048576 }')" \
    "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
}

# ratio A B: prints A/B with three decimals ("n/a" when B is zero).
# Errors: returns 2 when A or B is not a number.
ratio() {
  if (($# != 2)); then
    echo "ratio: usage: ratio A B" >&2
    return 2
  fi
  local num='^[-+]?([0-9]+([.][0-9]*)?|[.][0-9]+)([eE][-+]?[0-9]+)?$'
  if ! [[ "$1" =~ $num && "$2" =~ $num ]]; then
    echo "ratio: not a number: '$1' / '$2'" >&2
    return 2
  fi
  awk -v a="$1" -v b="$2" 'BEGIN { if (b + 0 == 0) print "n/a"; else printf "%.3f\n", a / b }'
}
