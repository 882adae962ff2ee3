#!/usr/bin/env bash
# Runs spindle-echo's server (one carrier) on each of its I/O backends (io_uring, epoll) and the
# reference C epoll loop (scripts/bench/epoll_echo.c, one thread) under the same load: spindle-echo's
# ping-pong client with 64-byte messages at 1, 10, 100 and 1000 connections. The servers are pinned to
# one CPU and the client (one carrier, default backend) to another; each run starts a fresh server,
# warms up, then measures. Each repetition runs every server once, in turn (spindle io_uring, spindle
# epoll, epoll_echo; then the reverse order), and the table gives medians [min..max] and the ratios.
#
# usage: scripts/bench/echo.sh [--repetitions N] [--duration S] [--warmup S] [--connections "1 10 100 1000"]
#                              [--size BYTES] [--port N] [--poll-mode block|spin|hybrid] [--epoll-mode lt|et]
#                              [--epoll-busy-poll-us N] [--backends "io_uring epoll"]
#                              [--server-flags "..."] [--server-cpu N] [--client-cpu N] [--nice N] [--floor]
#                              [--no-build] [--out DIR]
#   --repetitions N   rounds per connection count, each running every server once; medians are reported
#                     (default 3)
#   --duration S      measured seconds per run, after the warm-up (default 5)
#   --warmup S        seconds of load before measuring (default 1)
#   --connections L   connection counts (default "1 10 100 1000")
#   --size BYTES      message size (default 64)
#   --port N          TCP port the servers listen on, one at a time (default 7400)
#   --poll-mode M     spindle-echo server's poll mode (default block; the client always blocks)
#   --epoll-mode M    epoll_echo's triggering: lt (level, default) or et (edge)
#   --epoll-busy-poll-us N  epoll_echo polls (epoll_wait timeout 0) for N µs after its last event before it
#                     blocks (default 0: never); the match for --poll-mode hybrid, whose window is
#                     spindle-echo's --spin-us (50 unless --server-flags sets it)
#   --backends L      spindle-echo server's backends to measure, each its own row run with --backend B
#                     (default "io_uring epoll"; "io_uring" alone leaves the epoll backend out)
#   --server-flags F  more flags for spindle-echo server, e.g. "--inline-send" (word-split)
#   --server-cpu N    CPU the servers are pinned to (default 0)
#   --client-cpu N    CPU the client is pinned to (default 1)
#   --nice N          run servers and client under `nice -n N` (e.g. -20 on a shared machine)
#   --floor           also run raw_echo.c (raw-uring: raw_loop.h's io_uring loop echoing each receive, nothing
#                     else) in the rotation: the io_uring floor, what the kernel alone charges an io_uring
#                     server per message here; its ratio lines say how far spindle-echo is above it and where
#                     it stands to epoll_echo (a spindle target against epoll_echo below that is below the floor)
#   --no-build        use the existing build/release and build/bench-echo/epoll_echo
#   --out DIR         also keep the results in DIR: echo.csv, one row per run (server, connections,
#                     round, msg/s, the client's latency percentiles p50/p99/p99.9/max and mean, the
#                     server's CPU ticks and CPU per message) and meta-echo.json (the machine and the commit);
#                     scripts/bench/plot DIR draws them
#
# Rows, one per server and connection count: messages/s (round trips completed in the measured window
# / its length), p99 round-trip latency as the client sees it, and server CPU per message: the server's
# utime + stime from /proc/PID/stat (all its threads, 1/CLK_TCK resolution) over the whole client run
# (warm-up included), divided by every round trip of that run, then its user and system parts. Ratio
# lines, of medians: for io_uring, spindle / epoll_echo for messages/s (>1: spindle faster) and
# epoll_echo / spindle for CPU per message (>1: spindle cheaper); for the epoll backend, the same
# messages/s ratio and spindle epoll CPU/msg ÷ epoll_echo CPU/msg (the loop it should cost no more
# than: target <= 1.10). With --floor: raw-uring's CPU per message over epoll_echo's, and spindle io_uring's
# over raw-uring's.
# SPDX-License-Identifier: Apache-2.0
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

reps=3
duration=5
warmup=1
connections="1 10 100 1000"
size=64
port=7400
poll_mode=block
epoll_mode=lt
epoll_busy_poll_us=0
backends="io_uring epoll"
floor=0
server_flags=""
server_cpu=0
client_cpu=1
nice=0
build=1
out_dir=""
while (($# > 0)); do
  case "$1" in
    --repetitions) reps="$2"; shift ;;
    --duration) duration="$2"; shift ;;
    --warmup) warmup="$2"; shift ;;
    --connections) connections="$2"; shift ;;
    --size) size="$2"; shift ;;
    --port) port="$2"; shift ;;
    --poll-mode) poll_mode="$2"; shift ;;
    --epoll-mode) epoll_mode="$2"; shift ;;
    --epoll-busy-poll-us) epoll_busy_poll_us="$2"; shift ;;
    --backends) backends="$2"; shift ;;
    --server-flags) server_flags="$2"; shift ;;
    --server-cpu) server_cpu="$2"; shift ;;
    --client-cpu) client_cpu="$2"; shift ;;
    --nice) nice="$2"; shift ;;
    --floor) floor=1 ;;
    --no-build) build=0 ;;
    --out) out_dir="$2"; shift ;;
    -h|--help) awk 'NR == 1 { next } !/^#/ { exit } !/SPDX-License-Identifier/ { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *) echo "echo.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[[ "$reps" =~ ^[1-9][0-9]*$ ]] || { echo "echo.sh: --repetitions needs a positive integer" >&2; exit 2; }
[[ "$poll_mode" =~ ^(block|spin|hybrid)$ ]] || { echo "echo.sh: --poll-mode takes block, spin or hybrid" >&2; exit 2; }
[[ "$epoll_mode" =~ ^(lt|et)$ ]] || { echo "echo.sh: --epoll-mode takes lt or et" >&2; exit 2; }
[[ "$epoll_busy_poll_us" =~ ^[0-9]+$ ]] || { echo "echo.sh: --epoll-busy-poll-us needs a whole number" >&2; exit 2; }
bench_parse_backends echo.sh "$backends"
# The servers of the rotation: spindle-<backend> for each backend, then the raw loop.
impls=()
for b in "${backend_list[@]}"; do impls+=("spindle-$b"); done
impls+=(epoll_echo)
if ((floor)); then impls+=(raw-uring); fi
command -v python3 >/dev/null || { echo "echo.sh: python3 is needed to read the JSON results" >&2; exit 1; }

root="$SPINDLE_REPO_ROOT"
bin="$root/build/release/apps/spindle-echo"
epoll_bin="$root/build/bench-echo/epoll_echo"
raw_bin="$root/build/bench-echo/raw_echo"
if ((build)); then
  (
    cd "$root" &&
      spindle_install_deps &&
      cmake --preset release &&
      cmake --build build/release -j2 --target spindle-echo
  ) >&2
  mkdir -p "$root/build/bench-echo"
  cc -O2 -o "$epoll_bin" "$root/scripts/bench/epoll_echo.c"
  if ((floor)); then cc -O2 -o "$raw_bin" "$root/scripts/bench/raw_echo.c" -luring; fi
fi
bench_require "$bin" "$epoll_bin"
if ((floor)); then bench_require "$raw_bin"; fi

# A thousand connections take two descriptors each when both ends live on this machine.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
echo "machine: $(bench_machine_line)"
echo "runs: $reps rounds of ${#impls[@]} servers x ${duration}s (+${warmup}s warm-up), ${size}-byte messages; servers on CPU $server_cpu, client on CPU $client_cpu"
echo "spindle-echo server --carriers 1 --poll-mode $poll_mode${server_flags:+ $server_flags} --backend B, B in: ${backend_list[*]}"
floor_line=""
if ((floor)); then floor_line=" raw_echo (raw-uring, the io_uring floor);"; fi
echo "epoll_echo --mode $epoll_mode --busy-poll-us $epoll_busy_poll_us;$floor_line client: spindle-echo client --carriers 1 (default backend)"
echo "nice: $nice; ulimit -n: $(ulimit -n); load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"

read -r -a extra <<<"$server_flags"
out=$(mktemp -d)
server_pid=""
cleanup() {
  if [[ -n "$server_pid" ]]; then kill "$server_pid" 2>/dev/null || true; fi
  rm -rf "$out"
}
trap cleanup EXIT

# Waits until something accepts on $port (at most 10 s).
wait_for_port() {
  local i
  for ((i = 0; i < 1000; ++i)); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
    sleep 0.01
  done
  echo "echo.sh: nothing listens on port $port" >&2
  return 1
}

# utime and stime of a whole process, in clock ticks (fields 14 and 15 of /proc/PID/stat; the
# command name in field 2 is cut off first, as it may hold spaces).
cpu_ticks() {
  sed 's/^.*) //' "/proc/$1/stat" | awk '{ print $12, $13 }'
}

run_one() {  # impl conns tag
  local impl=$1 conns=$2 tag=$3 u0 s0 u1 s1
  if [[ "$impl" == spindle-* ]]; then
    nice -n "$nice" taskset -c "$server_cpu" "$bin" server --carriers 1 --port "$port" --address 127.0.0.1 \
      --poll-mode "$poll_mode" --backend "${impl#spindle-}" "${extra[@]}" 2>"$out/$tag.server.log" &
  elif [[ "$impl" == raw-uring ]]; then
    nice -n "$nice" taskset -c "$server_cpu" "$raw_bin" --port "$port" --address 127.0.0.1 2>"$out/$tag.server.log" &
  else
    nice -n "$nice" taskset -c "$server_cpu" "$epoll_bin" --port "$port" --address 127.0.0.1 --mode "$epoll_mode" \
      --busy-poll-us "$epoll_busy_poll_us" 2>"$out/$tag.server.log" &
  fi
  server_pid=$!
  wait_for_port
  # The startup line names the backend the runtime chose: a server on another one measures nothing asked for.
  if [[ "$impl" == spindle-* ]] && ! grep -q "backend ${impl#spindle-}," "$out/$tag.server.log"; then
    echo "echo.sh: $impl does not run on ${impl#spindle-}: $(cat "$out/$tag.server.log")" >&2
    exit 1
  fi
  read -r u0 s0 < <(cpu_ticks "$server_pid")
  if ! nice -n "$nice" taskset -c "$client_cpu" "$bin" client --carriers 1 --port "$port" --connections "$conns" \
      --size "$size" --duration "$duration" --warmup "$warmup" --json >"$out/$tag.json" 2>"$out/$tag.client.log"; then
    echo "echo.sh: the client failed against $impl ($conns connections): $(cat "$out/$tag.client.log")" >&2
    exit 1
  fi
  read -r u1 s1 < <(cpu_ticks "$server_pid")
  kill -INT "$server_pid"
  wait "$server_pid" || { echo "echo.sh: $impl did not exit cleanly: $(cat "$out/$tag.server.log")" >&2; exit 1; }
  server_pid=""
  echo "$((u1 - u0)) $((s1 - s0))" >"$out/$tag.ticks"
}

# A server left over from another run would answer in place of the one measured.
if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
  echo "echo.sh: something already listens on port $port; stop it first" >&2
  exit 1
fi
bench_out_init "$out_dir" echo.csv

read -r -a conn_list <<<"$connections"
run_s=$(awk -v d="$duration" -v w="$warmup" 'BEGIN { print d + w + 0.5 }')
steps=$((${#conn_list[@]} * reps * ${#impls[@]}))
bench_progress_start "$steps" "$(awk -v n="$steps" -v s="$run_s" 'BEGIN { print n * s }')"
for c in $connections; do
  for ((r = 1; r <= reps; ++r)); do
    bench_order "$r" "${impls[@]}"
    for impl in "${order[@]}"; do
      bench_step "$run_s" "echo $impl $c conns, round $r"
      run_one "$impl" "$c" "${impl}_c${c}_r${r}"
    done
  done
  echo "  done: $c connections" >&2
done

bench_progress_end
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$out" "$reps" "$connections" "$(getconf CLK_TCK)" "${impls[*]}" "$bench_out" <<'PY'
import csv, json, os, statistics, sys
out, reps, conns, hz = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), int(sys.argv[4])
impls, keep = sys.argv[5].split(), sys.argv[6]
names = {"spindle-io_uring": "spindle io_uring", "spindle-epoll": "spindle epoll", "epoll_echo": "epoll_echo",
         "raw-uring": "raw-uring floor"}

def run(impl, c, r):
    tag = os.path.join(out, f"{impl}_c{c}_r{r}")
    j = json.load(open(tag + ".json"))
    user, system = (int(t) for t in open(tag + ".ticks").read().split())
    per = 1e6 / hz / max(j["total_messages"], 1)
    return j["msg_per_s"], j["lat_us"]["p99"], (user + system) * per, user * per, system * per

def med(vals):
    return statistics.median(vals), min(vals), max(vals)

def ratio(a, b):
    return f"{a / b:.3f}" if b else "n/a"

if keep:  # --out: every run, as measured
    with open(os.path.join(keep, "echo.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["server", "connections", "round", "size", "msg_per_s", "total_messages", "p50_us", "p99_us",
                    "p999_us", "max_us", "mean_us", "server_utime_ticks", "server_stime_ticks", "clk_tck",
                    "cpu_us_per_msg", "user_us_per_msg", "sys_us_per_msg"])
        for c in conns:
            for impl in impls:
                for r in range(1, reps + 1):
                    tag = os.path.join(out, f"{impl}_c{c}_r{r}")
                    j = json.load(open(tag + ".json"))
                    ticks = open(tag + ".ticks").read().split()
                    _, _, cpu, user, system = run(impl, c, r)
                    lat = j["lat_us"]
                    w.writerow([impl, c, r, j["size"], j["msg_per_s"], j["total_messages"], lat["p50"], lat["p99"],
                                lat["p999"], lat["max"], lat["mean"], ticks[0], ticks[1], hz, f"{cpu:.4f}",
                                f"{user:.4f}", f"{system:.4f}"])

hdr = (f"{'conns':>5s} {'server':<16s} {'msg/s median [min..max]':>30s} {'p99':>10s} {'CPU/msg':>10s}"
       f" {'user':>8s} {'sys':>8s}")
print()
print(hdr)
print("-" * len(hdr))
for c in conns:
    m = {}
    for impl in impls:
        runs = [run(impl, c, r) for r in range(1, reps + 1)]
        m[impl] = [med([x[k] for x in runs]) for k in range(5)]
        rate, p99, cpu, user, system = m[impl]
        print(f"{c:>5s} {names[impl]:<16s} {f'{rate[0]:.0f} [{rate[1]:.0f}..{rate[2]:.0f}]':>30s}"
              f" {p99[0]:8.1f}us {cpu[0]:8.2f}us {user[0]:6.2f}us {system[0]:6.2f}us")
    raw = m["epoll_echo"]
    if "spindle-io_uring" in m:
        s = m["spindle-io_uring"]
        print(f"{'':>5s} io_uring: msg/s ratio {ratio(s[0][0], raw[0][0])} (spindle / epoll_echo),"
              f" CPU ratio {ratio(raw[2][0], s[2][0])} (epoll_echo / spindle)")
    if "spindle-epoll" in m:
        s = m["spindle-epoll"]
        print(f"{'':>5s} epoll:    msg/s ratio {ratio(s[0][0], raw[0][0])} (spindle / epoll_echo),"
              f" CPU/msg {ratio(s[2][0], raw[2][0])} of epoll_echo's (target <= 1.10)")
    if "raw-uring" in m:
        f = m["raw-uring"]
        line = f"{'':>5s} floor:    raw-uring CPU/msg {ratio(f[2][0], raw[2][0])} of epoll_echo's"
        if "spindle-io_uring" in m:
            line += f"; spindle io_uring {ratio(m['spindle-io_uring'][2][0], f[2][0])} of raw-uring's"
        print(line)
print()
print("Ratios of medians. msg/s ratio: >1 spindle faster. io_uring CPU ratio: >1 spindle cheaper.")
print("epoll backend CPU/msg of epoll_echo's: spindle epoll's CPU per message / epoll_echo's (<= 1.10 wanted).")
if "raw-uring" in impls:
    print("floor: raw_echo.c's io_uring loop (nothing but the echo); spindle io_uring above it is spindle's own cost.")
print("CPU/msg: server utime+stime over the whole client run (warm-up included) / every round trip of it;")
print("user, sys: its two parts (medians of each). User time is the server's own work and varies far less")
print("between runs on a VM than system time, which carries the kernel's TCP and scheduling noise.")
PY
bench_out_finish
