# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# Helpers for benchmark scripts: source this file, then call bench_build, bench_machine_line, ratio.

SPINDLE_REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source-path=SCRIPTDIR source=../lib/deps.sh
source "$SPINDLE_REPO_ROOT/scripts/lib/deps.sh"

# Installs missing packages, then configures and builds the release preset with perf/ enabled.
# Build output goes to stderr so a caller's stdout stays data only.
# Errors: returns non-zero when any step fails.
bench_build() {
  (
    cd "$SPINDLE_REPO_ROOT" &&
      spindle_install_deps &&
      cmake --preset release -DSPINDLE_BUILD_PERF=ON &&
      cmake --build --preset release
  ) >&2
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
