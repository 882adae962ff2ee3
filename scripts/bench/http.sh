#!/usr/bin/env bash
# spindle-httpd on each of its I/O backends against nginx on the hello route, all on one CPU, with
# wrk on another. Builds the spindle-httpd target of the release preset, installs wrk and nginx-light
# when missing, then for each connection count N: one warm-up run of each server, then R runs of
#   taskset -c 1 wrk -t1 -cN -dD --latency http://127.0.0.1:PORT/hello
# against each server in turn (forward, then backward), each pinned with taskset -c 0:
# spindle-httpd --carriers 1 --backend io_uring (spindle-uring), spindle-httpd --carriers 1
# --backend epoll (spindle-epoll), nginx (one worker process), and with the epoll backend the raw
# epoll loop of scripts/bench/raw_http.c (raw-epoll), its reference.
# Prints per N and server: requests/s median [min..max], server CPU µs per request (utime + stime
# from /proc/PID/stat over the run, divided by the requests wrk counted) and its user part (the
# server's own work, far steadier between runs on a VM than the kernel's share), p99 latency (median
# of the runs), and the ratios: each spindle backend / nginx, and spindle-epoll's CPU per request over
# raw-epoll's (target <= 1.10).
# --floor: also runs raw_http.c's io_uring loop (raw-uring) in the same rotation: the raw loops answer
# the same bytes and do nothing else, so what they cost per request is what the kernel charges any
# server here (the floor), and the extra ratio lines say how far nginx and spindle-httpd are above it.
# Each run also gives the TCP segments per request (OutSegs of /proc/net/snmp over the run, both ends of
# the loopback counted): 2 when every ACK rides on a request or an answer; at 10,000 connections 3.1-3.2
# in a good run and near 4 in the mode of issue 19, where each request gets an ACK of its own.
# --fresh: each measured run gets a server started for it and warmed up for W seconds, instead of one
# server per backend for the whole sweep (a run at 10,000 connections keeps the TCP state its start
# gave it, so runs on one server are not independent draws).
# --rss: instead, opens --rss-connections keep-alive connections to each spindle-httpd and nginx (one
# request on each, then idle) and prints the server's VmRSS before and after, and the growth per
# connection.
# --files "1M 100M": instead, large static files: writes a file of each size (random bytes) once into a
# temporary document root that both servers serve, spindle-httpd --root (file bodies of 64 KiB or more,
# its spliceMinBytes, leave through splice(2)) and nginx with `sendfile on; tcp_nopush on;`; checks each
# server's copy of each file once (curl: status 200, size and sha256 as written; a mismatch ends the
# script with status 1), then per size one warm-up run of each server and R runs of
#   taskset -c 1 wrk -t1 -cF -dD --timeout 60s --latency http://127.0.0.1:PORT/files/SIZE.bin
# (F = --file-connections keep-alive connections, each fetching the file again and again) in the same
# alternating order. Prints per size and server: requests/s and MB/s (10^6 bytes wrk read per second)
# median [min..max], server CPU µs per request and per MiB read by wrk (utime + stime, as above) and
# the user part per MiB, p99 latency of a whole response (median of the runs), and the ratios of each
# spindle backend to nginx: MB/s and CPU per MiB. wrk reads 8 KiB at a time, so with a fast server
# the client's CPU can cap MB/s; CPU per MiB is the comparison that holds then.
#
# usage: scripts/bench/http.sh [--connections "10 100 1000 10000"] [--duration D] [--warmup W]
#                              [--repetitions R] [--server-cpu C] [--client-cpu C] [--floor]
#                              [--backends "io_uring epoll"] [--fresh] [--rss [--rss-connections N]]
#                              [--files "1M 100M" [--file-connections F]] [--out DIR]
#                              [--no-build] [--port-base P]
#   --connections L   connection counts to sweep (default "10 100 1000 10000")
#   --duration D      seconds per measured run (default 10)
#   --warmup W        seconds of the warm-up run per server and N (default 3)
#   --repetitions R   measured runs per server and N, in alternating order (default 3)
#   --server-cpu C    CPU the servers are pinned to (default 0)
#   --client-cpu C    CPU wrk is pinned to (default 1)
#   --floor           add raw_http.c's io_uring loop beside its epoll loop
#   --fresh           a new server for every measured run, warmed up for W seconds first (see above)
#   --backends L      spindle-httpd's backends to measure, each its own server run with --backend B
#                     (default "io_uring epoll"; raw-epoll runs when epoll is among them or with --floor;
#                     raw_http.c needs cc and liburing-dev)
#   --rss             memory mode (see above)
#   --rss-connections N  connections in memory mode (default 10000)
#   --files L         large-file mode (see above): file sizes, each a number of bytes or of KiB, MiB or
#                     GiB with a K, M or G suffix (e.g. "1M 100M"); not with --rss or --floor
#   --file-connections F  wrk's keep-alive connections in large-file mode (default 4)
#   --out DIR         also keep the results in DIR: http.csv (one row per measured run: req/s, requests,
#                     errors, CPU and user µs per request, p99), http-latency.csv (wrk's latency
#                     percentiles of each measured run, from scripts/bench/wrk_percentiles.lua), in
#                     memory mode http-rss.csv, in large-file mode http-files.csv (one row per measured
#                     run: req/s, bytes, MB/s, errors, CPU µs per request and per MiB, user µs per MiB,
#                     p99), and meta-http.json (meta-http-rss.json in memory mode, meta-http-files.json
#                     in large-file mode): the machine and the commit; scripts/bench/plot DIR draws them
#   --no-build        use the existing build/release/apps/spindle-httpd and build/bench-http/raw_http
#   --port-base P     the servers listen on P (spindle-httpd io_uring), P+1 (nginx), P+2 (raw-epoll),
#                     P+3 (raw-uring), P+4 (spindle-httpd epoll) (default 18080): another run of this
#                     script on the same machine, from another checkout, keeps the default ports
# SPDX-License-Identifier: Apache-2.0
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

conns="10 100 1000 10000"
duration=10
warmup=3
reps=3
server_cpu=0
client_cpu=1
rss=0
rss_conns=10000
files=""
files_mode=0
file_conns=4
floor=0
fresh=0
backends="io_uring epoll"
out_dir=""
build=1
port_base=18080
while (($# > 0)); do
  case "$1" in
    --connections) conns="$2"; shift ;;
    --duration) duration="$2"; shift ;;
    --warmup) warmup="$2"; shift ;;
    --repetitions) reps="$2"; shift ;;
    --server-cpu) server_cpu="$2"; shift ;;
    --client-cpu) client_cpu="$2"; shift ;;
    --rss) rss=1 ;;
    --floor) floor=1 ;;
    --fresh) fresh=1 ;;
    --backends) backends="$2"; shift ;;
    --rss-connections) rss_conns="$2"; shift ;;
    --files) files="$2"; files_mode=1; shift ;;
    --file-connections) file_conns="$2"; shift ;;
    --out) out_dir="$2"; shift ;;
    --no-build) build=0 ;;
    --port-base) port_base="$2"; shift ;;
    -h|--help) awk 'NR == 1 { next } !/^#/ { exit } !/SPDX-License-Identifier/ { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *) echo "http.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
bench_parse_backends http.sh "$backends"
((!fresh || (!rss && !files_mode))) || { echo "http.sh: --fresh goes with the connection sweep only, not --rss or --files" >&2; exit 2; }

# size_bytes SIZE: prints the bytes of a --files size (1048576 for 1M).
# Errors: returns 1 when SIZE is not a positive number with an optional K, M or G suffix.
size_bytes() {
  [[ "$1" =~ ^([0-9]{1,9})([KMG]?)$ ]] && ((10#${BASH_REMATCH[1]} > 0)) || return 1
  local n=$((10#${BASH_REMATCH[1]}))
  case ${BASH_REMATCH[2]} in
    K) n=$((n << 10)) ;;
    M) n=$((n << 20)) ;;
    G) n=$((n << 30)) ;;
  esac
  echo "$n"
}
# Large-file mode: the sizes as given (they name the files) and their bytes.
file_sizes=()
declare -A file_bytes=()
if ((files_mode)); then
  ((!rss && !floor)) || { echo "http.sh: --files does not go with --rss or --floor" >&2; exit 2; }
  [[ "$file_conns" =~ ^[1-9][0-9]*$ ]] ||
    { echo "http.sh: --file-connections takes a positive number, not '$file_conns'" >&2; exit 2; }
  read -r -a file_sizes <<<"$files"
  ((${#file_sizes[@]} > 0)) || { echo "http.sh: --files needs at least one size, e.g. \"1M 100M\"" >&2; exit 2; }
  for size in "${file_sizes[@]}"; do
    [[ -z "${file_bytes[$size]:-}" ]] || { echo "http.sh: --files names $size twice" >&2; exit 2; }
    file_bytes[$size]=$(size_bytes "$size") ||
      { echo "http.sh: --files takes sizes such as 4096, 64K, 1M or 1G, not '$size'" >&2; exit 2; }
  done
fi

# spindle-httpd's server name and port for each backend.
declare -A spindle_name=([io_uring]=spindle-uring [epoll]=spindle-epoll)
declare -A spindle_port=([io_uring]=$port_base [epoll]=$((port_base + 4)))
nginx_port=$((port_base + 1))
raw_epoll_port=$((port_base + 2))
raw_uring_port=$((port_base + 3))

# wrk and nginx-light, where missing (and curl, which checks the files of large-file mode).
install_bench_tools() {
  local had_nginx=1 priv=() extra=()
  command -v nginx >/dev/null 2>&1 || had_nginx=0
  ((!files_mode)) || extra=(curl=curl)
  bench_install_tools http.sh wrk=wrk nginx=nginx-light "${extra[@]}" || return 1
  ((had_nginx)) && return 0
  [[ "$(id -u)" == 0 ]] || priv=(sudo)
  # Debian's package starts its own nginx on port 80: it would share the CPUs we measure.
  if command -v service >/dev/null 2>&1; then "${priv[@]}" service nginx stop >&2 || true; fi
}

build_httpd() {
  (
    cd "$SPINDLE_REPO_ROOT" &&
      spindle_install_deps &&
      cmake --preset release &&
      cmake --build --preset release --target spindle-httpd
  ) >&2
}

install_bench_tools
if ((build)); then build_httpd; fi
httpd="$SPINDLE_REPO_ROOT/build/release/apps/spindle-httpd"
bench_require "$httpd"
raw_http="$SPINDLE_REPO_ROOT/build/bench-http/raw_http"
# The raw loops: raw-epoll is the epoll backend's reference, raw-uring only the floor. Memory mode and
# large-file mode measure spindle-httpd and nginx only (the raw loops serve no files).
raw_modes=()
if ((!rss && !files_mode)); then
  if ((floor)) || [[ -n "${seen_backend[epoll]:-}" ]]; then raw_modes+=(epoll); fi
  if ((floor)); then raw_modes+=(uring); fi
fi
if ((${#raw_modes[@]} > 0 && build)); then
  mkdir -p "$(dirname "$raw_http")"
  cc -O2 -o "$raw_http" "$SPINDLE_REPO_ROOT/scripts/bench/raw_http.c" -luring ||
    { echo "http.sh: cannot build scripts/bench/raw_http.c" >&2; exit 1; }
fi
((${#raw_modes[@]} == 0)) || bench_require "$raw_http"

# 10,000 connections need as many descriptors in wrk and in each server.
hard=$(ulimit -Hn)
want=20000
[[ "$hard" != unlimited ]] && ((hard < want)) && want=$hard
ulimit -n "$want"

tmp=$(mktemp -d)
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

# Large-file mode: the files, written once, served by both servers as /files/SIZE.bin from one root.
root_args=()
nginx_files=""
if ((files_mode)); then
  docroot="$tmp/docroot"
  mkdir -p "$docroot/files"
  declare -A file_sha=()
  for size in "${file_sizes[@]}"; do
    head -c "${file_bytes[$size]}" /dev/urandom >"$docroot/files/$size.bin" ||
      { echo "http.sh: cannot write the $size file in $docroot" >&2; exit 1; }
    file_sha[$size]=$(sha256sum <"$docroot/files/$size.bin" | awk '{ print $1 }')
  done
  root_args=(--root "$docroot")
  nginx_files="location /files/ { root $docroot; sendfile on; tcp_nopush on; }"
fi

cat >"$tmp/nginx.conf" <<EOF
daemon off;
master_process off;           # one process: the worker itself (what we pin and measure)
worker_processes 1;
worker_rlimit_nofile $want;
pid $tmp/nginx.pid;
error_log $tmp/error.log warn;
events { worker_connections $want; }
http {
  access_log off;
  keepalive_requests 1000000;
  keepalive_timeout 75s;
  server_tokens off;          # "Server: nginx", as short as spindle's "Server: spindle"
  default_type text/plain;
  charset utf-8;              # "Content-Type: text/plain; charset=utf-8", as spindle sends
  client_body_temp_path $tmp/body;
  proxy_temp_path $tmp/proxy;
  fastcgi_temp_path $tmp/fastcgi;
  uwsgi_temp_path $tmp/uwsgi;
  scgi_temp_path $tmp/scgi;
  server {
    listen 127.0.0.1:$nginx_port backlog=4096;
    location / { return 200 "Hello, World!"; }
    $nginx_files
  }
}
EOF

wait_port() {
  local i
  for ((i = 0; i < 100; i++)); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "http.sh: nothing listens on port $1" >&2
  return 1
}

# A server left over from another run would share the port (spindle-httpd listens with SO_REUSEPORT)
# and take part of the load, out of sight of the CPU figures: refuse to measure then.
for p in "${spindle_port[@]}" "$nginx_port" "$raw_epoll_port" "$raw_uring_port"; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
    echo "http.sh: something already listens on port $p; stop it first" >&2
    exit 1
  fi
done
# The servers of the rotation: name, pid, port.
servers=()
declare -A pid_of=() port_of=() backend_of=()
# start_server NAME: starts the server of the rotation called NAME, pinned to the server CPU, sets
# pid_of[NAME] and waits until it listens. Errors: exits with status 1 when it does not come up, or
# when a spindle-httpd runs on another backend than the one asked for.
start_server() {
  local name=$1 b mode
  case $name in
    spindle-*)
      b=${backend_of[$name]}
      taskset -c "$server_cpu" "$httpd" --carriers 1 --backend "$b" --address 127.0.0.1 --port "${port_of[$name]}" \
        "${root_args[@]}" 2>"$tmp/$name.log" &
      ;;
    nginx) taskset -c "$server_cpu" nginx -p "$tmp" -c "$tmp/nginx.conf" 2>"$tmp/nginx.stderr" & ;;
    raw-*)
      mode=${name#raw-}
      taskset -c "$server_cpu" "$raw_http" --mode "$mode" --address 127.0.0.1 --port "${port_of[$name]}" \
        2>"$tmp/$name.log" &
      ;;
  esac
  pid_of[$name]=$!
  pids+=("$!")
  wait_port "${port_of[$name]}" || exit 1
  if [[ $name == spindle-* ]]; then
    # Its startup line names the backend the runtime chose: another one would measure nothing asked for.
    grep -q "backend $b" "$tmp/$name.log" || { echo "http.sh: $name does not run on $b: $(cat "$tmp/$name.log")" >&2; exit 1; }
  fi
}
# stop_server NAME: stops it (SIGINT, as a user would) and waits for it to exit.
stop_server() {
  local name=$1 pid=${pid_of[$1]} p kept=()
  kill -INT "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  for p in "${pids[@]}"; do [[ $p == "$pid" ]] || kept+=("$p"); done
  pids=("${kept[@]}")
}
for b in "${backend_list[@]}"; do
  name=${spindle_name[$b]}
  servers+=("$name")
  port_of[$name]=${spindle_port[$b]} backend_of[$name]=$b
done
spindle_servers=("${servers[@]}")
servers+=(nginx)
port_of[nginx]=$nginx_port
for mode in "${raw_modes[@]}"; do
  if [[ $mode == epoll ]]; then port_of[raw-$mode]=$raw_epoll_port; else port_of[raw-$mode]=$raw_uring_port; fi
  servers+=("raw-$mode")
done
for server in "${servers[@]}"; do start_server "$server"; done

# CPU ticks of a process, all threads: "utime stime" (the command name, field 2, holds no spaces here).
cpu_ticks() { awk '{ print $14, $15 }' "/proc/$1/stat"; }
# TCP segments this network namespace has sent so far (the Tcp: lines of /proc/net/snmp: names, values).
tcp_out_segs() {
  awk '$1 == "Tcp:" { if (!col) { for (i = 2; i <= NF; i++) if ($i == "OutSegs") col = i } else print $col }' /proc/net/snmp
}
rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }

# Every server is up: from here on there is something to keep.
if ((rss)); then
  bench_run_name=http-rss  # meta-http-rss.json: beside a sweep's meta-http.json
  bench_out_init "$out_dir" http-rss.csv
elif ((files_mode)); then
  bench_run_name=http-files  # meta-http-files.json, likewise
  bench_out_init "$out_dir" http-files.csv
else
  bench_out_init "$out_dir" http.csv http-latency.csv
fi
echo "machine: $(bench_machine_line)"
spindle_pids=""
for name in "${spindle_servers[@]}"; do spindle_pids+="$name pid ${pid_of[$name]}, "; done
echo "spindle-httpd: ${spindle_pids}$(nginx -v 2>&1) pid ${pid_of[nginx]}; servers on CPU $server_cpu, wrk on CPU $client_cpu"
((!fresh)) || echo "--fresh: each measured run gets a new server (the pids above are the first ones)"

if ((rss)); then
  command -v python3 >/dev/null || { echo "http.sh: python3 is needed for --rss" >&2; exit 1; }
  bench_progress_start $((${#spindle_servers[@]} + 1)) $(((${#spindle_servers[@]} + 1) * 8))
  for server in "${spindle_servers[@]}" nginx; do
    bench_step 8 "http --rss $server, $rss_conns idle connections"
    pid=${pid_of[$server]} port=${port_of[$server]}
    before=$(rss_kib "$pid")
    rm -f "$tmp/ready" "$tmp/release"
    taskset -c "$client_cpu" python3 "$SPINDLE_REPO_ROOT/scripts/bench/http_idle_clients.py" \
      "$port" "$rss_conns" "$tmp/ready" "$tmp/release" &
    client=$!
    while [[ ! -e "$tmp/ready" ]]; do
      kill -0 "$client" 2>/dev/null || { echo "http.sh: the idle client failed" >&2; exit 1; }
      sleep 0.2
    done
    # Settled: spindle-httpd gives an idle connection's fiber up after --idle-fiber-release (1 s) and
    # its sweep looks every 0.5 s; nginx has nothing to settle.
    sleep 3
    after=$(rss_kib "$pid")
    touch "$tmp/release"
    wait "$client" || true
    awk -v s="$server" -v n="$rss_conns" -v b="$before" -v a="$after" 'BEGIN {
      printf "%-13s %6d idle keep-alive connections: VmRSS %d KiB -> %d KiB, %.2f KiB per connection\n",
             s, n, b, a, (a - b) / n }'
    bench_row http-rss.csv server,connections,rss_before_kib,rss_after_kib,kib_per_connection "$server" "$rss_conns" \
      "$before" "$after" "$(awk -v n="$rss_conns" -v b="$before" -v a="$after" 'BEGIN { printf "%.3f", (a - b) / n }')"
    sleep 2
  done
  bench_progress_end
  bench_out_finish
  exit 0
fi

# What wrk fetches (large-file mode: a file) and its further options.
wrk_path=/hello
wrk_opts=()
# One wrk run: prints "requests_per_s cpu_us_per_request p99_us requests errors user_us_per_request
# bytes seconds cpu_us user_us segments_per_request" (bytes: what wrk read, headers included, over its
# seconds; cpu_us and user_us: the server's whole CPU time and its user part over the run; segments:
# TCP segments sent over the run, by both ends).
# With a fifth argument, also leaves wrk's whole output in that file (its latency percentiles
# included: the "cdf PERCENT US" lines of wrk_percentiles.lua, which only runs after the measurement).
run_wrk() {
  local pid=$1 port=$2 n=$3 d=$4 keep=${5:-} u0 s0 u1 s1 out g0 g1
  read -r u0 s0 < <(cpu_ticks "$pid")
  g0=$(tcp_out_segs)
  out=$(taskset -c "$client_cpu" wrk -t1 -c"$n" -d"${d}s" "${wrk_opts[@]}" --latency \
    -s "$SPINDLE_REPO_ROOT/scripts/bench/wrk_percentiles.lua" "http://127.0.0.1:$port$wrk_path")
  g1=$(tcp_out_segs)
  read -r u1 s1 < <(cpu_ticks "$pid")
  [[ -z "$keep" ]] || printf '%s\n' "$out" >"$keep"
  awk -v c0="$((u0 + s0))" -v c1="$((u1 + s1))" -v u="$((u1 - u0))" -v hz="$(getconf CLK_TCK)" -v segs="$((g1 - g0))" '
    function us(v) {
      if (v ~ /us$/) return v + 0; if (v ~ /ms$/) return v * 1000; if (v ~ /s$/) return v * 1e6; return v
    }
    /requests in/ { reqs = $1 }
    /^Requests\/sec:/ { rps = $2 }
    $1 == "99%" { p99 = us($2) }
    /Socket errors:/ { errs += $4 + $6 + $8 + $10 }
    /Non-2xx/ { errs += $NF }
    $1 == "summary" { bytes = $2; secs = $3 / 1e6 }
    END {  # %.0f for the bytes: %d in mawk stops at 2^31 - 1
      printf "%.1f %.3f %.1f %d %d %.3f %.0f %.6f %.0f %.0f %.3f\n", rps, (reqs > 0 ? (c1 - c0) / hz * 1e6 / reqs : 0), p99,
             reqs, errs + 0, (reqs > 0 ? u / hz * 1e6 / reqs : 0), bytes, secs, (c1 - c0) / hz * 1e6, u / hz * 1e6,
             (reqs > 0 ? segs / reqs : 0)
    }
  ' <<<"$out"
}

# stats V...: "median min max" of the values.
stats() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { printf "%s %s %s\n", v[int((NR + 1) / 2)], v[1], v[NR] }'; }

# verify_file SERVER SIZE: fetches the SIZE file from SERVER once and compares it with the source.
# Errors: exits with status 1, saying what differs, on a failed fetch, a status other than 200, or a
# size or sha256 other than the file's.
verify_file() {
  local server=$1 size=$2 got="$tmp/fetched" code bytes sha
  code=$(curl -sS --max-time 120 -o "$got" -w '%{http_code}' "http://127.0.0.1:${port_of[$server]}/files/$size.bin") ||
    { echo "http.sh: $server: fetching /files/$size.bin failed (curl)" >&2; exit 1; }
  [[ "$code" == 200 ]] || { echo "http.sh: $server answered /files/$size.bin with status $code, not 200" >&2; exit 1; }
  bytes=$(stat -c %s "$got")
  sha=$(sha256sum <"$got" | awk '{ print $1 }')
  rm -f "$got"
  if [[ "$bytes" != "${file_bytes[$size]}" || "$sha" != "${file_sha[$size]}" ]]; then
    echo "http.sh: $server sent a wrong /files/$size.bin: $bytes bytes, sha256 $sha; the file has ${file_bytes[$size]}" \
      "bytes, sha256 ${file_sha[$size]}" >&2
    exit 1
  fi
}

# The expected seconds of a measured run, and of the warm-up runs of one step.
run_s=$(awk -v d="$duration" 'BEGIN { print d + 0.3 }')
warm_s=$(awk -v w="$warmup" -v n="${#servers[@]}" 'BEGIN { print (w + 0.3) * n }')

if ((files_mode)); then
  # Every copy is right before anything is measured.
  for size in "${file_sizes[@]}"; do
    for server in "${servers[@]}"; do verify_file "$server" "$size"; done
  done
  echo "checked: each server's copy of each file (${file_sizes[*]}) has the file's size and sha256"
  wrk_opts=(--timeout 60s)  # wrk's default, 2 s, would count a slow 100 MiB response as an error
  bench_progress_start $((${#file_sizes[@]} * (1 + reps * ${#servers[@]}))) \
    "$(awk -v c="${#file_sizes[@]}" -v w="$warm_s" -v r="$((reps * ${#servers[@]}))" -v s="$run_s" 'BEGIN { print c * (w + r * s) }')"
  printf '%-6s %-13s %22s %22s %10s %10s %10s %9s %6s\n' size server "req/s median [min..max]" "MB/s median [min..max]" \
    "cpu us/req" "cpu us/MiB" "user/MiB" "p99 ms" errors
  for size in "${file_sizes[@]}"; do
    wrk_path="/files/$size.bin"
    bench_step "$warm_s" "http --files warm-up of ${#servers[@]} servers, $size"
    for server in "${servers[@]}"; do
      run_wrk "${pid_of[$server]}" "${port_of[$server]}" "$file_conns" "$warmup" >/dev/null
    done
    declare -A rps=() mbs=() cpu=() cpumib=() usermib=() p99=() errs=()
    for ((r = 1; r <= reps; r++)); do
      bench_order "$r" "${servers[@]}"
      for server in "${order[@]}"; do
        bench_step "$run_s" "http --files $server $size, run $r/$reps"
        read -r a b c d e _ g h k l _ < <(run_wrk "${pid_of[$server]}" "${port_of[$server]}" "$file_conns" "$duration")
        # MB/s: 10^6 bytes per second; CPU per MiB: over the MiB wrk read (a response cut off at the end included).
        read -r mb cm um < <(awk -v b="$g" -v t="$h" -v c="$k" -v u="$l" 'BEGIN {
          mib = b / 1048576
          printf "%.3f %.3f %.3f\n", (t > 0 ? b / t / 1e6 : 0), (mib > 0 ? c / mib : 0), (mib > 0 ? u / mib : 0) }')
        bench_row http-files.csv server,file_bytes,connections,round,duration_s,requests_per_s,requests,bytes,mb_per_s,errors,cpu_us_per_request,cpu_us_per_mib,user_us_per_mib,p99_us \
          "$server" "${file_bytes[$size]}" "$file_conns" "$r" "$duration" "$a" "$d" "$g" "$mb" "$e" "$b" "$cm" "$um" "$c"
        rps[$server]+="$a " mbs[$server]+="$mb " cpu[$server]+="$b " cpumib[$server]+="$cm " usermib[$server]+="$um "
        p99[$server]+="$c "
        errs[$server]=$((${errs[$server]:-0} + e))
      done
    done
    declare -A medmb=() medcpumib=() medrps=()
    for server in "${servers[@]}"; do
      # shellcheck disable=SC2086  # the lists are space-separated numbers
      read -r m lo hi < <(stats ${rps[$server]})
      # shellcheck disable=SC2086
      read -r bm blo bhi < <(stats ${mbs[$server]})
      # shellcheck disable=SC2086
      read -r cm _ _ < <(stats ${cpu[$server]})
      # shellcheck disable=SC2086
      read -r mm _ _ < <(stats ${cpumib[$server]})
      # shellcheck disable=SC2086
      read -r um _ _ < <(stats ${usermib[$server]})
      # shellcheck disable=SC2086
      read -r pm _ _ < <(stats ${p99[$server]})
      medrps[$server]=$m medmb[$server]=$bm medcpumib[$server]=$mm
      printf '%-6s %-13s %8.1f [%.1f..%.1f] %7.0f [%.0f..%.0f] %10.1f %10.1f %10.1f %9.2f %6d\n' "$size" "$server" \
        "$m" "$lo" "$hi" "$bm" "$blo" "$bhi" "$cm" "$mm" "$um" "$(awk -v p="$pm" 'BEGIN { print p / 1000 }')" \
        "${errs[$server]}"
    done
    for server in "${spindle_servers[@]}"; do
      printf '%-6s ratio %s/nginx: MB/s %s, cpu/MiB %s, req/s %s\n' "$size" "$server" \
        "$(ratio "${medmb[$server]}" "${medmb[nginx]}")" "$(ratio "${medcpumib[$server]}" "${medcpumib[nginx]}")" \
        "$(ratio "${medrps[$server]}" "${medrps[nginx]}")"
    done
    unset rps mbs cpu cpumib usermib p99 errs medmb medcpumib medrps
  done
  bench_progress_end
  bench_out_finish
  exit 0
fi

read -r -a conn_list <<<"$conns"
# --fresh: no warm-up step per connection count; each measured run starts its server and warms it up.
if ((fresh)); then
  run_s=$(awk -v d="$duration" -v w="$warmup" 'BEGIN { print d + w + 1 }')
  warm_steps=0
else
  warm_steps=1
fi
steps=$((${#conn_list[@]} * (warm_steps + reps * ${#servers[@]})))
bench_progress_start "$steps" "$(awk -v c="${#conn_list[@]}" -v w="$warm_s" -v k="$warm_steps" -v r="$((reps * ${#servers[@]}))" \
  -v s="$run_s" 'BEGIN { print c * (k * w + r * s) }')"
printf '%-6s %-13s %28s %10s %9s %10s %18s %7s\n' N server "req/s median [min..max]" "cpu us/req" "user us" "p99 us" \
  "segs/req [min..max]" errors
for n in $conns; do
  if ((!fresh)); then
    bench_step "$warm_s" "http warm-up of ${#servers[@]} servers, $n conns"
    for server in "${servers[@]}"; do run_wrk "${pid_of[$server]}" "${port_of[$server]}" "$n" "$warmup" >/dev/null; done
  fi
  declare -A rps=() cpu=() user=() p99=() segs=() errs=()
  for ((r = 1; r <= reps; r++)); do
    bench_order "$r" "${servers[@]}"
    for server in "${order[@]}"; do
      bench_step "$run_s" "http $server $n conns, run $r/$reps"
      if ((fresh)); then
        stop_server "$server"
        start_server "$server"
        run_wrk "${pid_of[$server]}" "${port_of[$server]}" "$n" "$warmup" >/dev/null
      fi
      read -r a b c d e f _ _ _ _ g < <(run_wrk "${pid_of[$server]}" "${port_of[$server]}" "$n" "$duration" "$tmp/wrk.out")
      bench_row http.csv server,connections,round,duration_s,requests_per_s,requests,errors,cpu_us_per_request,user_us_per_request,p99_us,segments_per_request,fresh \
        "$server" "$n" "$r" "$duration" "$a" "$d" "$e" "$b" "$f" "$c" "$g" "$fresh"
      awk '$1 == "cdf" { print $2, $3 }' "$tmp/wrk.out" |
        bench_rows http-latency.csv server,connections,round,percentile,latency_us "$server" "$n" "$r"
      rps[$server]+="$a " cpu[$server]+="$b " user[$server]+="$f " p99[$server]+="$c " segs[$server]+="$g "
      errs[$server]=$((${errs[$server]:-0} + e))
    done
  done
  declare -A med=() medcpu=()
  for server in "${servers[@]}"; do
    # shellcheck disable=SC2086  # the lists are space-separated numbers
    read -r m lo hi < <(stats ${rps[$server]})
    # shellcheck disable=SC2086
    read -r cm _ _ < <(stats ${cpu[$server]})
    # shellcheck disable=SC2086
    read -r pm _ _ < <(stats ${p99[$server]})
    # shellcheck disable=SC2086
    read -r um _ _ < <(stats ${user[$server]})
    # shellcheck disable=SC2086
    read -r sm slo shi < <(stats ${segs[$server]})
    med[$server]=$m medcpu[$server]=$cm
    printf '%-6s %-13s %12.0f [%.0f..%.0f] %10.2f %9.2f %10.0f %6.2f [%.2f..%.2f] %7d\n' "$n" "$server" "$m" "$lo" "$hi" \
      "$cm" "$um" "$pm" "$sm" "$slo" "$shi" "${errs[$server]}"
  done
  for server in "${spindle_servers[@]}"; do
    printf '%-6s ratio %s/nginx: req/s %s, cpu/req %s\n' "$n" "$server" \
      "$(ratio "${med[$server]}" "${med[nginx]}")" "$(ratio "${medcpu[$server]}" "${medcpu[nginx]}")"
  done
  if [[ -n "${seen_backend[epoll]:-}" ]]; then
    printf '%-6s ratio spindle-epoll/raw-epoll: req/s %s, cpu/req %s (target <= 1.10)\n' "$n" \
      "$(ratio "${med[spindle-epoll]}" "${med[raw-epoll]}")" "$(ratio "${medcpu[spindle-epoll]}" "${medcpu[raw-epoll]}")"
  fi
  if ((floor)); then
    printf '%-6s floor: raw-uring/nginx cpu/req %s, raw-epoll/nginx %s; nginx/raw-epoll %s' "$n" \
      "$(ratio "${medcpu[raw-uring]}" "${medcpu[nginx]}")" "$(ratio "${medcpu[raw-epoll]}" "${medcpu[nginx]}")" \
      "$(ratio "${medcpu[nginx]}" "${medcpu[raw-epoll]}")"
    if [[ -n "${seen_backend[io_uring]:-}" ]]; then
      printf '; spindle-uring/raw-uring %s' "$(ratio "${medcpu[spindle-uring]}" "${medcpu[raw-uring]}")"
    fi
    printf '\n'
  fi
  unset rps cpu user p99 segs errs med medcpu
done
bench_progress_end
bench_out_finish
