#!/usr/bin/env bash
# Runs Debian's redis-benchmark against spindle-kv and redis-server 7.0 with the same persistence
# setting, side by side: the server pinned to one CPU and redis-benchmark to the other, a fresh server
# per run, the servers alternating (spindle-kv first in odd rounds, last in even ones). For each
# persistence mode (none: no log; everysec; always) and pipeline depth (-P), each test (SET, then GET
# on the keys SET wrote) runs on its own, so that the server's CPU time over it is that test's alone.
# Then, with --memory, the resident memory per key of 1,000,000 keys of 16-byte values, and with
# --both-cpus, spindle-kv on 2 carriers against redis-server --io-threads 2, both CPUs each.
# --floor: also runs scripts/bench/raw_resp.c (raw-resp) in the same rotation, without a log only (in
# persistence mode none; the other modes run without it): an io_uring loop that finds each command and
# answers SET +OK and GET a fixed 3-byte value, storing nothing, so that what it costs per request is
# what the kernel charges any server here (the floor), as http.sh --floor measures under HTTP.
#
# usage: scripts/bench/kv.sh [--requests N] [--clients N] [--pipelines "1 16"] [--tests "set get"]
#                            [--persistence "none everysec always"] [--keyspace N] [--repetitions R]
#                            [--server-cpu C] [--client-cpu C] [--client-threads N] [--worker-cpus L]
#                            [--port-base P] [--memory [--memory-keys N]] [--both-cpus] [--floor]
#                            [--dir DIR] [--no-build] [--out DIR]
#   --requests N      requests per test run (redis-benchmark -n; default 1000000)
#   --clients N       connections (redis-benchmark -c; default 50)
#   --pipelines L     pipeline depths to sweep (redis-benchmark -P; default "1 16")
#   --tests L         tests, in order, from set, get (default "set get")
#   --persistence L   modes from none, everysec, always (default "none everysec always")
#   --keyspace N      random keys per test (redis-benchmark -r; default 100000)
#   --repetitions R   rounds, each running every server once per mode and depth (default 3)
#   --server-cpu C    CPU the servers are pinned to (default 0)
#   --client-cpu C    CPU redis-benchmark is pinned to (default 1; a list such as 1,3 for
#                     --client-threads)
#   --client-threads N  redis-benchmark --threads N (default: none, its single-threaded mode);
#                     where one client thread is slower than the server (a machine with slower
#                     cores and CPUs to spare), more threads on more client CPUs
#   --worker-cpus L   CPUs for the servers' helper threads, a list such as 2 or 2-3 that leaves out
#                     the server and client CPUs: spindle-kv runs with --worker-cpus L (its io-wq
#                     workers, which do the log's writes and fdatasyncs, and its offload pool), and
#                     both servers are started on the server CPU plus L (redis-server's main thread
#                     may then run on any of them; its own CPU per request counts all its threads).
#                     Default: none; the helper threads share the server CPU
#   --port-base P     spindle-kv listens on P, redis-server on P+1, raw-resp on P+2 (default 16380)
#   --memory          also measure RSS per key: --memory-keys keys of 16-byte values, loaded with
#                     redis-cli --pipe, VmRSS before and after (default 1000000 keys)
#   --both-cpus       also run spindle-kv --carriers 2 against redis-server --io-threads 2
#                     --io-threads-do-reads yes, servers and client on all CPUs (no pinning)
#   --floor           add raw_resp.c's loop (raw-resp) to the rotation in mode none, which
#                     --persistence must then name (needs cc and liburing-dev; built into
#                     build/bench-kv/raw_resp)
#   --dir DIR         where the logs go (default: a temporary directory under /var/tmp, removed after)
#   --no-build        use the existing build/release/apps/spindle-kv (and build/bench-kv/raw_resp)
#   --out DIR         also keep the results in DIR: kv.csv (one row per test run: mode, depth, test,
#                     server, round, requests/s, latency p50/p99 from redis-benchmark's CSV, the
#                     server's CPU ticks and CPU per request, and for spindle-kv under always the mean
#                     records per fdatasync), kv-memory.csv with --memory, and meta-kv.json (the
#                     machine and the commit); scripts/bench/plot DIR draws them
#
# CPU per request is the server's utime + stime from /proc/PID/stat (all its threads, 1/CLK_TCK
# resolution) over the test run divided by its requests; with one redis-benchmark thread near the
# server's own speed, requests/s alone says little here. Ratio lines, of medians: spindle-kv /
# redis-server CPU per request (< 1: spindle-kv cheaper; the targets are 0.67 at -P 16 and 0.9 at
# -P 1) and requests/s (> 1: faster), and for spindle-kv SET under always against everysec, requests/s
# (target >= 0.8, thanks to group commit). With --floor, the no-log lines add each server's CPU per
# request over raw-resp's (how far above the floor; 1 would be a server that costs nothing itself).
# SPDX-License-Identifier: Apache-2.0
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

requests=1000000
clients=50
pipelines="1 16"
tests="set get"
modes="none everysec always"
keyspace=100000
reps=3
server_cpu=0
client_cpu=1
port_base=16380
worker_cpus=""
client_threads=""
memory=0
memory_keys=1000000
both_cpus=0
floor=0
data_root=""
build=1
out_dir=""
while (($# > 0)); do
  case "$1" in
    --requests) requests="$2"; shift ;;
    --clients) clients="$2"; shift ;;
    --pipelines) pipelines="$2"; shift ;;
    --tests) tests="$2"; shift ;;
    --persistence) modes="$2"; shift ;;
    --keyspace) keyspace="$2"; shift ;;
    --repetitions) reps="$2"; shift ;;
    --server-cpu) server_cpu="$2"; shift ;;
    --client-cpu) client_cpu="$2"; shift ;;
    --port-base) port_base="$2"; shift ;;
    --worker-cpus) worker_cpus="$2"; shift ;;
    --client-threads) client_threads="$2"; shift ;;
    --memory) memory=1 ;;
    --memory-keys) memory_keys="$2"; shift ;;
    --both-cpus) both_cpus=1 ;;
    --floor) floor=1 ;;
    --dir) data_root="$2"; shift ;;
    --no-build) build=0 ;;
    --out) out_dir="$2"; shift ;;
    -h|--help) awk 'NR == 1 { next } !/^#/ { exit } !/SPDX-License-Identifier/ { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *) echo "kv.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
for v in requests clients keyspace reps memory_keys port_base; do
  [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || { echo "kv.sh: --${v//_/-} needs a positive integer" >&2; exit 2; }
done
[[ -z "$client_threads" || "$client_threads" =~ ^[1-9][0-9]*$ ]] ||
  { echo "kv.sh: --client-threads needs a positive integer" >&2; exit 2; }
[[ "$client_cpu" =~ ^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$ ]] ||
  { echo "kv.sh: --client-cpu takes a CPU or a CPU list, not '$client_cpu'" >&2; exit 2; }
[[ -z "$worker_cpus" || "$worker_cpus" =~ ^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$ ]] ||
  { echo "kv.sh: --worker-cpus takes a CPU list such as 2 or 2-3, not '$worker_cpus'" >&2; exit 2; }
# The pinned runs' servers: the server CPU, plus the helper threads' CPUs when given.
server_cpus="$server_cpu${worker_cpus:+,$worker_cpus}"
((port_base < 65534)) || { echo "kv.sh: --port-base must leave room for P+2 below 65536" >&2; exit 2; }
read -r -a pipeline_list <<<"$pipelines"
read -r -a test_list <<<"$tests"
read -r -a mode_list <<<"$modes"
for p in "${pipeline_list[@]}"; do
  [[ "$p" =~ ^[1-9][0-9]*$ ]] || { echo "kv.sh: --pipelines takes positive integers, not '$p'" >&2; exit 2; }
done
for t in "${test_list[@]}"; do
  [[ "$t" =~ ^(set|get)$ ]] || { echo "kv.sh: --tests takes set and get, not '$t'" >&2; exit 2; }
done
for m in "${mode_list[@]}"; do
  [[ "$m" =~ ^(none|everysec|always)$ ]] || { echo "kv.sh: --persistence takes none, everysec and always, not '$m'" >&2; exit 2; }
done
((${#pipeline_list[@]} > 0 && ${#test_list[@]} > 0 && ${#mode_list[@]} > 0)) ||
  { echo "kv.sh: --pipelines, --tests and --persistence need at least one value each" >&2; exit 2; }

# The floor runs only without a log: raw-resp keeps nothing, so beside a server that writes one it
# would measure the log's absence, not the kernel's share.
floor_modes=""
if ((floor)); then
  [[ " ${mode_list[*]} " == *" none "* ]] ||
    { echo "kv.sh: --floor runs in persistence mode none only; add none to --persistence" >&2; exit 2; }
  floor_modes=none
fi

root="$SPINDLE_REPO_ROOT"
bin="$root/build/release/apps/spindle-kv"
raw_resp="$root/build/bench-kv/raw_resp"
bench_install_tools kv.sh redis-benchmark=redis-tools redis-cli=redis-tools redis-server=redis-server python3=python3
if ((build)); then bench_build spindle-kv; fi
if ((floor && build)); then
  mkdir -p "$(dirname "$raw_resp")"
  cc -O2 -o "$raw_resp" "$root/scripts/bench/raw_resp.c" -luring ||
    { echo "kv.sh: cannot build scripts/bench/raw_resp.c" >&2; exit 1; }
fi
bench_require "$bin"
((floor == 0)) || bench_require "$raw_resp"
kv_port=$port_base
redis_port=$((port_base + 1))
floor_port=$((port_base + 2))
spindle_port_taken() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
ports=("$kv_port" "$redis_port")
((floor == 0)) || ports+=("$floor_port")
for p in "${ports[@]}"; do
  if spindle_port_taken "$p"; then echo "kv.sh: port $p is in use; pick another --port-base" >&2; exit 1; fi
done

own_data=0
if [[ -z "$data_root" ]]; then
  data_root=$(mktemp -d /var/tmp/spindle-kv-bench.XXXXXX)
  own_data=1
fi
mkdir -p "$data_root"
server_pid=""
cleanup() {
  if [[ -n "$server_pid" ]]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  if ((own_data)); then rm -rf "$data_root"; fi
}
trap cleanup EXIT

files=(kv.csv)
((memory)) && files+=(kv-memory.csv)
bench_out_init "$out_dir" "${files[@]}"

echo "machine: $(bench_machine_line)"
echo "redis-benchmark $(redis-benchmark --version | awk '{print $2}'), redis-server $(redis-server --version | awk '{print $3}' | cut -d= -f2)"
echo "runs: $reps rounds x 2 servers${floor_modes:+ (3 with raw-resp in mode $floor_modes)}; -n $requests -c $clients -r $keyspace; depths: ${pipeline_list[*]}; tests: ${test_list[*]}; persistence: ${mode_list[*]}"
echo "servers on CPU $server_cpu (spindle-kv --carriers 1)${worker_cpus:+, helper threads on CPU $worker_cpus (spindle-kv --worker-cpus $worker_cpus)}, redis-benchmark on CPU $client_cpu${client_threads:+ (--threads $client_threads)}; logs in $data_root"
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"

# cpu_ticks PID: utime + stime of every thread of PID, in clock ticks.
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
clk_tck=$(getconf CLK_TCK)

# wait_port PORT PID: until PORT accepts (at most 30 s: recovery may replay a log), or PID died.
wait_port() {
  local i
  for ((i = 0; i < 3000; ++i)); do
    spindle_port_taken "$1" && return 0
    kill -0 "$2" 2>/dev/null || { echo "kv.sh: the server on port $1 exited before listening" >&2; return 1; }
    sleep 0.01
  done
  echo "kv.sh: nothing listens on port $1" >&2
  return 1
}

# start_server SERVER MODE CPUS [EXTRA...]: a fresh server (spindle-kv, redis-server or raw-resp,
# which has no data and ignores MODE) with an empty data directory; sets server_pid and server_port.
start_server() {
  local server=$1 mode=$2 cpus=$3 dir="$data_root/$1-$2"
  shift 3
  rm -rf "$dir" && mkdir -p "$dir"
  if [[ "$server" == spindle-kv ]]; then
    server_port=$kv_port
    local -a args=(--port "$kv_port" --carriers "${kv_carriers:-1}")
    # (not in the --both-cpus runs, whose two carriers are bound to the CPUs a set would name)
    [[ -z "$worker_cpus" || -n "${kv_carriers:-}" ]] || args+=(--worker-cpus "$worker_cpus")
    [[ "$mode" == none ]] || args+=(--dir "$dir" --appendfsync "$mode")
    taskset -c "$cpus" "$bin" "${args[@]}" "$@" >"$data_root/server.log" 2>&1 &
  elif [[ "$server" == raw-resp ]]; then
    server_port=$floor_port
    taskset -c "$cpus" "$raw_resp" --address 127.0.0.1 --port "$floor_port" "$@" \
      >"$data_root/server.log" 2>&1 &
  else
    server_port=$redis_port
    local -a args=(--port "$redis_port" --save '' --dir "$dir" --protected-mode no --daemonize no)
    if [[ "$mode" == none ]]; then args+=(--appendonly no); else args+=(--appendonly yes --appendfsync "$mode"); fi
    taskset -c "$cpus" redis-server "${args[@]}" "$@" >"$data_root/server.log" 2>&1 &
  fi
  server_pid=$!
  wait_port "$server_port" "$server_pid" || { cat "$data_root/server.log" >&2; exit 1; }
}

stop_server() {
  kill -TERM "$server_pid" 2>/dev/null || true
  wait "$server_pid" 2>/dev/null || true
  server_pid=""
}

# bench_one TEST DEPTH CLIENT_CPUS: one redis-benchmark test against the running server; prints
# "rps p50_ms p99_ms ticks cpu_us_per_request".
bench_one() {
  local t=$1 depth=$2 cpus=$3 before after line rps p50 p99
  before=$(cpu_ticks "$server_pid")
  line=$(taskset -c "$cpus" redis-benchmark -p "$server_port" -t "$t" -n "$requests" -c "$clients" -P "$depth" \
    -r "$keyspace" ${client_threads:+--threads "$client_threads"} --csv 2>/dev/null | tail -n 1)
  after=$(cpu_ticks "$server_pid")
  # "SET","169491.53","3.908","0.240","1.631","9.831","16.271","16.415"
  IFS=, read -r _ rps _ _ p50 _ p99 _ <<<"${line//\"/}"
  [[ -n "$rps" && "$rps" != 0* ]] || { echo "kv.sh: redis-benchmark gave no result for $t (got '$line')" >&2; exit 1; }
  awk -v rps="$rps" -v p50="$p50" -v p99="$p99" -v t=$((after - before)) -v hz="$clk_tck" -v n="$requests" \
    'BEGIN { printf "%s %s %s %d %.3f\n", rps, p50, p99, t, t * 1e6 / hz / n }'
}

# mean_batch: spindle-kv's records per fdatasync so far (INFO persistence), or 0.
mean_batch() {
  redis-cli -p "$kv_port" info persistence 2>/dev/null | awk -F: '/^aof_fsync_mean_batch:/ { sub(/\r/, "", $2); print $2 }'
}

declare -A results=()  # key "mode depth test server" -> "rps cpu p50 p99" lines, one per round
# servers_in MODE: the servers of the rotation in MODE, in the order of odd rounds.
servers_in() {
  local servers="spindle-kv redis-server"
  [[ " $floor_modes " != *" $1 "* ]] || servers+=" raw-resp"
  echo "$servers"
}
steps=0
for mode in "${mode_list[@]}"; do
  read -r -a order <<<"$(servers_in "$mode")"
  steps=$((steps + ${#pipeline_list[@]} * reps * ${#order[@]}))
done
per_step=$(awk -v n="$requests" -v t="${#test_list[@]}" 'BEGIN { print 1 + t * n / 150000 }')
bench_progress_start "$steps" "$(awk -v s="$steps" -v p="$per_step" 'BEGIN { print s * p }')"
for mode in "${mode_list[@]}"; do
  for depth in "${pipeline_list[@]}"; do
    for ((r = 1; r <= reps; ++r)); do
      read -r -a in_mode <<<"$(servers_in "$mode")"
      bench_order "$r" "${in_mode[@]}"
      for server in "${order[@]}"; do
        bench_step "$per_step" "kv $server $mode -P $depth, round $r/$reps"
        start_server "$server" "$mode" "$server_cpus"
        for t in "${test_list[@]}"; do
          one=$(bench_one "$t" "$depth" "$client_cpu")
          read -r rps p50 p99 ticks cpu <<<"$one"
          batch=""
          if [[ "$server" == spindle-kv && "$mode" == always && "$t" == set ]]; then batch=$(mean_batch); fi
          results["$mode $depth $t $server"]+="$rps $cpu $p50 $p99"$'\n'
          bench_row kv.csv mode,pipeline,test,server,round,rps,p50_ms,p99_ms,cpu_ticks,cpu_us_per_req,fsync_mean_batch \
            "$mode" "$depth" "$t" "$server" "$r" "$rps" "$p50" "$p99" "$ticks" "$cpu" "$batch"
          [[ -z "$batch" ]] || results["batch $depth"]+="$batch"$'\n'
        done
        stop_server
      done
    done
  done
done
bench_progress_end

# median COLUMN < lines: the median of a column (1-based); "min max" with --range.
median() {
  awk -v c="$1" 'NF { print $c }' | sort -g | awk '{ v[NR] = $1 } END { n = NR; if (n == 0) { print "n/a"; exit }
    print (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2 }'
}
range() { awk -v c="$1" 'NF && (!seen++ || $c + 0 < lo + 0) { lo = $c } NF && (seen == 1 || $c + 0 > hi + 0) { hi = $c } END { print lo ".." hi }'; }

echo
printf '%-9s %3s %-4s %-13s %22s %13s %9s %9s\n' mode P test server "requests/s [min..max]" "µs CPU/req" "p50 ms" "p99 ms"
for mode in "${mode_list[@]}"; do
  for depth in "${pipeline_list[@]}"; do
    for t in "${test_list[@]}"; do
      for server in $(servers_in "$mode"); do
        rows=${results["$mode $depth $t $server"]}
        printf '%-9s %3s %-4s %-13s %12s [%s] %13s %9s %9s\n' "$mode" "$depth" "$t" "$server" \
          "$(median 1 <<<"$rows")" "$(range 1 <<<"$rows")" "$(median 2 <<<"$rows")" \
          "$(median 3 <<<"$rows")" "$(median 4 <<<"$rows")"
      done
    done
  done
done
echo
echo "ratios of medians, spindle-kv / redis-server (CPU/req: < 1 spindle-kv cheaper; target 0.67 at -P 16, 0.9 at -P 1):"
for mode in "${mode_list[@]}"; do
  for depth in "${pipeline_list[@]}"; do
    for t in "${test_list[@]}"; do
      a=${results["$mode $depth $t spindle-kv"]}
      b=${results["$mode $depth $t redis-server"]}
      line="  $mode -P $depth $t: CPU/req $(ratio "$(median 2 <<<"$a")" "$(median 2 <<<"$b")"), requests/s $(ratio "$(median 1 <<<"$a")" "$(median 1 <<<"$b")")"
      if [[ " $floor_modes " == *" $mode "* ]]; then
        f=$(median 2 <<<"${results["$mode $depth $t raw-resp"]}")
        line+="; CPU/req over the floor: spindle-kv/raw-resp $(ratio "$(median 2 <<<"$a")" "$f")"
        line+=", redis-server/raw-resp $(ratio "$(median 2 <<<"$b")" "$f")"
      fi
      echo "$line"
    done
  done
done
if [[ " ${mode_list[*]} " == *" always "* && " ${mode_list[*]} " == *" everysec "* && " ${test_list[*]} " == *" set "* ]]; then
  echo "spindle-kv SET, always / everysec requests/s (target >= 0.8), and the mean records per fdatasync:"
  for depth in "${pipeline_list[@]}"; do
    a=${results["always $depth set spindle-kv"]}
    b=${results["everysec $depth set spindle-kv"]}
    echo "  -P $depth: $(ratio "$(median 1 <<<"$a")" "$(median 1 <<<"$b")"); batch $(median 1 <<<"${results["batch $depth"]}")"
  done
fi

if ((both_cpus)); then
  echo
  echo "both CPUs: spindle-kv --carriers 2 against redis-server --io-threads 2, no log, servers and client unpinned"
  for depth in "${pipeline_list[@]}"; do
    for ((r = 1; r <= reps; ++r)); do
      for server in spindle-kv redis-server; do
        if [[ "$server" == spindle-kv ]]; then
          kv_carriers=2 start_server spindle-kv none "0-$(($(nproc) - 1))"
        else
          start_server redis-server none "0-$(($(nproc) - 1))" --io-threads 2 --io-threads-do-reads yes
        fi
        for t in "${test_list[@]}"; do
          one=$(bench_one "$t" "$depth" "0-$(($(nproc) - 1))")
          read -r rps p50 p99 ticks cpu <<<"$one"
          echo "  -P $depth round $r $server $t: $rps requests/s, $cpu µs CPU/req, p50 $p50 ms, p99 $p99 ms"
          bench_row kv.csv mode,pipeline,test,server,round,rps,p50_ms,p99_ms,cpu_ticks,cpu_us_per_req,fsync_mean_batch \
            "none-2cpu" "$depth" "$t" "$server" "$r" "$rps" "$p50" "$p99" "$ticks" "$cpu" ""
        done
        stop_server
      done
    done
  done
fi

if ((memory)); then
  echo
  echo "memory: $memory_keys keys of 16-byte values (SET key:<n> <16 bytes>), VmRSS before and after loading, no log"
  gen=$(mktemp)
  python3 - "$memory_keys" >"$gen" <<'PY'
import sys
n = int(sys.argv[1])
out = sys.stdout.buffer
val = b"v" * 16
for i in range(n):
    k = b"key:%d" % i
    out.write(b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$16\r\n%s\r\n" % (len(k), k, val))
PY
  for server in spindle-kv redis-server; do
    start_server "$server" none "$server_cpus"
    rss0=$(awk '/^VmRSS:/ { print $2 }' "/proc/$server_pid/status")
    taskset -c "$client_cpu" redis-cli -p "$server_port" --pipe <"$gen" >/dev/null
    keys=$(redis-cli -p "$server_port" dbsize)
    sleep 1
    rss1=$(awk '/^VmRSS:/ { print $2 }' "/proc/$server_pid/status")
    per=$(awk -v a="$rss0" -v b="$rss1" -v n="$keys" 'BEGIN { printf "%.1f", (b - a) * 1024 / n }')
    echo "  $server: $keys keys, VmRSS $rss0 -> $rss1 KiB, $per bytes per key"
    bench_row kv-memory.csv server,keys,rss_before_kib,rss_after_kib,bytes_per_key "$server" "$keys" "$rss0" "$rss1" "$per"
    stop_server
  done
  rm -f "$gen"
fi
bench_out_finish
