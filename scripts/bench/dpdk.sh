#!/usr/bin/env bash
# What kernel bypass is worth here: a UDP echo of 64-byte datagrams measured three ways with the same
# client logic (spindle-echo's UDP client: a window of fibers, one datagram outstanding each), and
# the per-packet floor of the DPDK path.
#   dpdk    spindle-echo udp-pair --dpdk: server fibers on carrier 0, client fibers on carrier 1, over
#           two net_ring ports wired back to back in one process (spindle's own stack both ends);
#   kernel  spindle-echo udp-pair: the same layout over kernel UDP sockets on loopback, through the
#           carriers' I/O driver;
#   epoll   scripts/bench/udp_echo.c (one thread, epoll) on the server CPU, driven by spindle-echo
#           client --udp (one carrier) on the client CPU.
# Each repetition runs the three in turn (then in reverse order), for each window. The table gives
# medians [min..max] of messages/s, p50 and p99 round trip, and CPU per message: the CPU time of
# every process involved over the run (warm-up included) divided by every round trip of the run;
# its inverse is messages per CPU-second ("per core"). Ratio lines: dpdk / kernel and dpdk / epoll
# for messages/s and for messages per core (target >= 3), and p99.
# Then the floor: dpdk-testpmd io forwarding between two net_null ports on one forwarding core
# (packets per second, the median of its per-second Rx-pps sums), spindle-dpdk-forward doing the
# same on one fiber (target >= 0.8 of testpmd), and the CPU an idle carrier polling a quiet port
# uses in each poll mode.
#
# usage: scripts/bench/dpdk.sh [--repetitions N] [--duration S] [--warmup S] [--windows "1 8 64"]
#                              [--size BYTES] [--forward-seconds S] [--no-build] [--out DIR]
#   --repetitions N    rounds per window (default 3)
#   --duration S       measured seconds per run, after the warm-up (default 3)
#   --warmup S         seconds of load before measuring (default 1)
#   --windows L        datagrams outstanding (default "1 8 64")
#   --size BYTES       datagram size (default 64; 16..1472)
#   --forward-seconds S  seconds of each forwarding run (default 5)
#   --no-build         use the existing build/release and build/bench-dpdk/udp_echo
#   --out DIR          also keep the results in DIR: dpdk-udp.csv (one row per run: msg/s, p50, p99, CPU
#                      per message), dpdk-forward.csv (pps of testpmd and of spindle), dpdk-idle.csv (idle
#                      CPU per poll mode) and meta-dpdk.json (the machine and the commit)
# Needs root (EAL without hugepages still locks memory; taskset). Exit status: 0; 1 on a failed run;
# 2 on bad usage.
# SPDX-License-Identifier: Apache-2.0
set -euo pipefail

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib.sh
source "$script_dir/lib.sh"
root="$SPINDLE_REPO_ROOT"

reps=3 duration=3 warmup=1 windows="1 8 64" size=64 forward_seconds=5 build=1 out_dir=""
while (($# > 0)); do
  case "$1" in
    --repetitions) reps=$2; shift ;;
    --duration) duration=$2; shift ;;
    --warmup) warmup=$2; shift ;;
    --windows) windows=$2; shift ;;
    --size) size=$2; shift ;;
    --forward-seconds) forward_seconds=$2; shift ;;
    --no-build) build=0 ;;
    --out) out_dir=$2; shift ;;
    -h|--help) awk 'NR == 1 { next } !/^#/ { exit } !/SPDX-License-Identifier/ { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *) echo "dpdk.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
  shift
done
[[ "$reps" =~ ^[1-9][0-9]*$ ]] || { echo "dpdk.sh: --repetitions wants a positive integer" >&2; exit 2; }

echo_bin="$root/build/release/apps/spindle-echo"
forward_bin="$root/build/release/apps/spindle-dpdk-forward"
udp_bin="$root/build/bench-dpdk/udp_echo"
if ((build)); then
  bench_build spindle-echo spindle-dpdk-forward
  bench_install_tools dpdk.sh dpdk-testpmd=dpdk-dev
  mkdir -p "$root/build/bench-dpdk"
  cc -O2 -o "$udp_bin" "$root/scripts/bench/udp_echo.c"
fi
bench_require "$echo_bin" "$forward_bin" "$udp_bin"
command -v dpdk-testpmd >/dev/null || { echo "dpdk.sh: dpdk-testpmd is missing (apt-get install dpdk-dev)" >&2; exit 1; }

clk_tck=$(getconf CLK_TCK)
# cpu_of PID: utime + stime of the process in seconds.
cpu_of() { awk -v t="$clk_tck" '{ printf "%.3f", ($14 + $15) / t }' "/proc/$1/stat"; }
# field NAME LINE: the value of NAME=... in a key=value line.
field() { sed -n "s/.*\\b$1=\\([^ ]*\\).*/\\1/p" <<<"$2"; }

declare -A rate p50 p99 cpu
run_one() {  # run_one KIND WINDOW REP
  local kind=$1 w=$2 rep=$3 line cpu_s total
  local common=(--window "$w" --size "$size" --duration "$duration" --warmup "$warmup")
  case "$kind" in
    dpdk) line=$(taskset -c 0,1 "$echo_bin" udp-pair --dpdk "${common[@]}" 2>/dev/null | tail -1) ;;
    kernel) line=$(taskset -c 0,1 "$echo_bin" udp-pair "${common[@]}" 2>/dev/null | tail -1) ;;
    epoll)
      taskset -c 0 "$udp_bin" --port 7410 2>/dev/null &
      local spid=$!
      sleep 0.3
      local s0; s0=$(cpu_of "$spid")
      line=$(taskset -c 1 "$echo_bin" client --udp --carriers 1 --address 127.0.0.1 --port 7410 "${common[@]}" 2>/dev/null | tail -1)
      local s1; s1=$(cpu_of "$spid")
      kill -INT "$spid"; wait "$spid" 2>/dev/null || true
      line="$line cpu_s=$(awk -v a="$s0" -v b="$s1" -v c="$(field client_cpu_s "$line")" 'BEGIN { printf "%.3f", b - a + c }')"
      ;;
  esac
  [[ -n "$line" && "$(field errors "$line")" == 0 ]] || { echo "dpdk.sh: $kind window $w failed: $line" >&2; exit 1; }
  total=$(field total_messages "$line")
  cpu_s=$(field cpu_s "$line")
  rate[$kind,$w]+="$(field msg_per_s "$line") "
  p50[$kind,$w]+="$(field p50_us "$line") "
  p99[$kind,$w]+="$(field p99_us "$line") "
  cpu[$kind,$w]+="$(awk -v c="$cpu_s" -v n="$total" 'BEGIN { printf "%.3f", (n > 0 ? c * 1e6 / n : 0) }') "
  bench_row dpdk-udp.csv kind,window,round,size,msg_per_s,total_messages,p50_us,p99_us,cpu_s,cpu_us_per_msg \
    "$kind" "$w" "$rep" "$size" "$(field msg_per_s "$line")" "$total" "$(field p50_us "$line")" "$(field p99_us "$line")" \
    "$cpu_s" "$(awk -v c="$cpu_s" -v n="$total" 'BEGIN { printf "%.3f", (n > 0 ? c * 1e6 / n : 0) }')"
}

# stats "v1 v2 ...": "median [min..max]"
stats() { tr ' ' '\n' <<<"$1" | grep -v '^$' | sort -g | awk '{ v[NR] = $1 } END { m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%.4g [%.4g..%.4g]", m, v[1], v[NR] }'; }
median() { stats "$1" | awk '{ print $1 }'; }

bench_out_init "$out_dir" dpdk-udp.csv dpdk-forward.csv dpdk-idle.csv
bench_machine_line
echo "datagrams of $size bytes; $reps repetitions of $duration s (+ $warmup s warm-up); windows: $windows"
read -r -a window_list <<<"$windows"
run_s=$(awk -v d="$duration" -v w="$warmup" 'BEGIN { print d + w + 0.5 }')
steps=$((${#window_list[@]} * reps * 3 + 2 + 3))
bench_progress_start "$steps" "$(awk -v n="$((steps - 5))" -v s="$run_s" -v f="$forward_seconds" \
  'BEGIN { print n * s + 2 * f + 4 + 3 * 4 }')"
for w in $windows; do
  for ((r = 1; r <= reps; ++r)); do
    if ((r % 2)); then order="dpdk kernel epoll"; else order="epoll kernel dpdk"; fi
    for k in $order; do
      bench_step "$run_s" "dpdk $k window $w, round $r/$reps"
      run_one "$k" "$w" "$r"
    done
  done
done

printf '\n%-7s %-7s %-30s %-24s %-24s %-28s\n' window server "msg/s" "p50 us" "p99 us" "CPU us/msg"
for w in $windows; do
  for k in dpdk kernel epoll; do
    printf '%-7s %-7s %-30s %-24s %-24s %-28s\n' "$w" "$k" "$(stats "${rate[$k,$w]}")" "$(stats "${p50[$k,$w]}")" \
      "$(stats "${p99[$k,$w]}")" "$(stats "${cpu[$k,$w]}")"
  done
done
echo
for w in $windows; do
  for peer in kernel epoll; do
    echo "window $w: dpdk/$peer msg/s $(ratio "$(median "${rate[dpdk,$w]}")" "$(median "${rate[$peer,$w]}")")," \
      "msg per core $(ratio "$(median "${cpu[$peer,$w]}")" "$(median "${cpu[dpdk,$w]}")") (target >= 3)," \
      "p99 $(ratio "$(median "${p99[dpdk,$w]}")" "$(median "${p99[$peer,$w]}")") (< 1: dpdk lower)"
  done
done

# ---- the per-packet floor -------------------------------------------------------------------------
echo
# With --stats-period testpmd prints each port's rates every second until it gets SIGINT; the seconds
# before forwarding starts print 0 and the last may be cut short: both are left out.
bench_step "$((forward_seconds + 4))" "dpdk dpdk-testpmd io forwarding"
testpmd_pps=$(timeout -s INT $((forward_seconds + 4)) dpdk-testpmd --no-huge -m 1024 --no-pci \
  --vdev net_null0 --vdev net_null1 -l 0,1 --file-prefix "bench-testpmd-$$" --no-telemetry --log-level='*:error' -- \
  --forward-mode=io --no-mlockall --nb-cores=1 --burst=32 --total-num-mbufs=16384 --stats-period=1 </dev/null 2>/dev/null |
  awk '/Rx-pps:/ { s += $2; if (++n % 2 == 0) { if (s > 0) print s; s = 0 } }' | head -n -1 | sort -g |
  awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }' || true)
rm -rf "/var/run/dpdk/bench-testpmd-$$"  # testpmd's runtime directory (it ends on a signal)
[[ -n "$testpmd_pps" ]] || { echo "dpdk.sh: dpdk-testpmd printed no rates" >&2; exit 1; }
bench_step "$forward_seconds" "dpdk spindle-dpdk-forward"
spindle_pps=$(taskset -c 1 "$forward_bin" --duration "$forward_seconds" 2>/dev/null | sed -n 's/.*pps=\([0-9.]*\).*/\1/p')
echo "forwarding between two net_null ports on one core: dpdk-testpmd io ${testpmd_pps} pps, spindle fiber ${spindle_pps} pps," \
  "ratio $(ratio "$spindle_pps" "$testpmd_pps") (target >= 0.8)"
bench_row dpdk-forward.csv forwarder,pps,seconds dpdk-testpmd "$testpmd_pps" "$forward_seconds"
bench_row dpdk-forward.csv forwarder,pps,seconds spindle "$spindle_pps" "$forward_seconds"

# ---- idle CPU of a carrier polling a quiet port --------------------------------------------------
for mode in block hybrid spin; do
  bench_step 4 "dpdk idle carrier, poll mode $mode"
  taskset -c 0 "$echo_bin" server --udp --dpdk --dpdk-port "net_ring$RANDOM" --ip 198.18.0.1/24 --port 7 \
    --carriers 1 --poll-mode "$mode" 2>/dev/null &
  pid=$!
  sleep 1
  c0=$(cpu_of "$pid")
  sleep 3
  c1=$(cpu_of "$pid")
  kill -INT "$pid"; wait "$pid" 2>/dev/null || true
  pct=$(awk -v a="$c0" -v b="$c1" 'BEGIN { printf "%.0f", (b - a) / 3 * 100 }')
  echo "idle carrier polling a quiet net_ring port, poll mode $mode: $pct % of a CPU"
  bench_row dpdk-idle.csv poll_mode,cpu_pct "$mode" "$pct"
done
bench_progress_end
bench_out_finish
