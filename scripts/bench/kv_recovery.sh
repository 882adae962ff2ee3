#!/usr/bin/env bash
# How fast spindle-kv recovers: replays a write-ahead log of about --size-mb MB (one shard, so one
# file) and compares the replay's MB/s with the disk's sequential read of the same file. Each
# repetition evicts the file from the page cache first (dd iflag=nocache, which needs no root and
# works where /proc/sys/vm/drop_caches is read-only, as in containers; fincore shows what stayed),
# then reads it with dd bs=1M, then evicts it again and starts spindle-kv on it, taking the replay
# time that the server logs (SPINDLE_LOG=info: "replayed N records, B bytes in S s"). A last column
# replays from the page cache (the file read once just before), which is the parsing speed alone.
# With more than one shard the logs are replayed at once, one per carrier, so the disk is also read
# with one dd per log at once (after another eviction): the fair figure for a disk that serves several
# streams faster than one; the single stream is kept beside it.
#
# usage: scripts/bench/kv_recovery.sh [--size-mb N] [--carriers N] [--repetitions N] [--dir DIR] [--no-build]
#   --size-mb N      log size to build (default 1024), over all shards; an existing one that size is reused
#   --carriers N     carriers, so shards and log files, replayed in parallel one per carrier (default 1)
#   --repetitions N  rounds (default 3); the table gives the median and [min..max]
#   --dir DIR        data directory (default build/bench-kv-recovery-<carriers>)
#   --no-build       use the existing build/release/apps/spindle-kv
#
# The log is made by redis-benchmark (SET, 100-byte values, keys drawn from 1,000,000, -P 32)
# against spindle-kv --carriers 1 --appendfsync no: about 145 bytes per record.
# SPDX-License-Identifier: Apache-2.0
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

size_mb=1024
carriers=1
reps=3
dir=""
build=1
while (($# > 0)); do
  case "$1" in
    --size-mb) size_mb="$2"; shift ;;
    --carriers) carriers="$2"; shift ;;
    --repetitions) reps="$2"; shift ;;
    --dir) dir="$2"; shift ;;
    --no-build) build=0 ;;
    -h|--help) awk 'NR == 1 { next } !/^#/ { exit } !/SPDX-License-Identifier/ { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *) echo "kv_recovery.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[[ "$size_mb" =~ ^[1-9][0-9]*$ ]] || { echo "kv_recovery.sh: --size-mb needs a positive integer" >&2; exit 2; }
[[ "$reps" =~ ^[1-9][0-9]*$ ]] || { echo "kv_recovery.sh: --repetitions needs a positive integer" >&2; exit 2; }
[[ "$carriers" =~ ^[1-9][0-9]*$ ]] || { echo "kv_recovery.sh: --carriers needs a positive integer" >&2; exit 2; }
[[ -n "$dir" ]] || dir="$SPINDLE_REPO_ROOT/build/bench-kv-recovery-$carriers"
bench_install_tools kv_recovery.sh redis-benchmark=redis-tools redis-cli=redis-tools

kv="$SPINDLE_REPO_ROOT/build/release/apps/spindle-kv"
if ((build)); then
  (cd "$SPINDLE_REPO_ROOT" && cmake --preset release && cmake --build --preset release --target spindle-kv) >&2
fi
[[ -x "$kv" ]] || { echo "kv_recovery.sh: $kv is not built" >&2; exit 1; }
port=$((20000 + RANDOM % 20000))
mkdir -p "$dir"
logs() { ls "$dir"/shard-*.log 2>/dev/null; }
log_bytes() { local f n=0; for f in $(logs); do n=$((n + $(stat -c %s "$f"))); done; echo "$n"; }

# Starts spindle-kv on $dir in the background (its stderr in $1) and waits until it answers PING.
start_kv() {
  SPINDLE_LOG=info "$kv" --port "$port" --carriers "$carriers" --dir "$dir" --appendfsync no \
    --auto-aof-rewrite-percentage 0 2>"$1" &
  kv_pid=$!
  for _ in $(seq 1 6000); do
    redis-cli -p "$port" ping >/dev/null 2>&1 && return 0
    kill -0 "$kv_pid" 2>/dev/null || { cat "$1" >&2; return 1; }
    sleep 0.05
  done
  echo "kv_recovery.sh: spindle-kv did not come up" >&2
  return 1
}
stop_kv() {
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
  wait "$kv_pid" || true
}

have_mb=$(($(log_bytes) / 1000000))
if ((have_mb < size_mb)); then
  rm -rf "$dir" && mkdir -p "$dir"
  echo "kv_recovery.sh: building a log of ${size_mb} MB in $dir" >&2
  start_kv "$dir/fill.err"
  requests=$((size_mb * 1000000 / 145 + 1))
  redis-benchmark -p "$port" -t set -n "$requests" -r 1000000 -d 100 -P 32 -c 8 -q >&2
  stop_kv
fi
bytes=$(log_bytes)

median() { sort -g | awk '{ v[NR] = $1 } END { m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%.0f [%.0f..%.0f]", m, v[1], v[NR] }'; }
evict() { local f; for f in $(logs); do dd if="$f" iflag=nocache count=0 status=none; done; }
read_all() { local f; for f in $(logs); do dd if="$f" of=/dev/null bs=1M status=none; done; }
read_parallel() {
  local f pids=()
  local p rc=0
  for f in $(logs); do dd if="$f" of=/dev/null bs=1M status=none & pids+=($!); done
  for p in "${pids[@]}"; do wait "$p" || rc=1; done  # every reader's status, not only the last's
  return "$rc"
}
mbps_since() { awk -v b="$bytes" -v a="$1" -v z="$(date +%s.%N)" 'BEGIN { printf "%.1f", b / 1e6 / (z - a) }'; }
replay_mbps() {  # the MB/s that the server logged for its replay
  start_kv "$dir/replay.err"
  stop_kv
  sed -n 's/.*replayed [0-9]* records, [0-9]* keys: \([0-9]*\) bytes from [0-9]* logs in \([0-9.]*\) s.*/\1 \2/p' "$dir/replay.err" |
    awk '{ printf "%.1f\n", $1 / 1e6 / $2 }'
}

dd_all=() ddp_all=() cold_all=() warm_all=()
for ((r = 1; r <= reps; r++)); do
  evict
  # shellcheck disable=SC2046
  echo "kv_recovery.sh: round $r: page cache holds $(fincore -b -n -o RES $(logs) 2>/dev/null | awk '{ s += $1 } END { print s + 0 }') bytes of the logs before dd" >&2
  t0=$(date +%s.%N)
  read_all
  dd_all+=("$(mbps_since "$t0")")
  evict
  if ((carriers > 1)); then
    t0=$(date +%s.%N)
    read_parallel
    ddp_all+=("$(mbps_since "$t0")")
    evict
  fi
  cold_all+=("$(replay_mbps)")
  read_all  # now in the page cache
  warm_all+=("$(replay_mbps)")
  echo "kv_recovery.sh: round $r: dd ${dd_all[-1]} MB/s${ddp_all:+, $carriers dd at once ${ddp_all[-1]} MB/s}, replay cold ${cold_all[-1]} MB/s, warm ${warm_all[-1]} MB/s" >&2
done
records=$(sed -n "s/.*replayed \([0-9]*\) records, [0-9]* keys: .*/\1/p" "$dir/replay.err")
bench_machine_line 2>/dev/null || true
printf 'logs: %s bytes, %s records, %s shard(s) in %s\n' "$bytes" "$records" "$carriers" "$dir"
printf '%-34s %s\n' "dd bs=1M, after eviction (MB/s)" "$(printf '%s\n' "${dd_all[@]}" | median)"
if ((carriers > 1)); then
  printf '%-34s %s\n' "$carriers dd at once, one per log (MB/s)" "$(printf '%s\n' "${ddp_all[@]}" | median)"
fi
printf '%-34s %s\n' "replay, after eviction (MB/s)" "$(printf '%s\n' "${cold_all[@]}" | median)"
printf '%-34s %s\n' "replay, from page cache (MB/s)" "$(printf '%s\n' "${warm_all[@]}" | median)"
