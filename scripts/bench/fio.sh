#!/usr/bin/env bash
# Runs spindle-iobench and fio side by side on the same file: 4 KiB random reads at depth 1, 16
# and 128, on one carrier (one CPU) and on every CPU (one carrier or fio job per CPU), through the
# page cache and, where the file system takes it, with O_DIRECT. Runs alternate (spindle, fio,
# fio with registered files and buffers) for each repetition, pinned to the same CPUs with
# taskset, and the table gives medians [min..max] and the ratios.
#
# usage: scripts/bench/fio.sh [--repetitions N] [--duration S] [--ramp S] [--file PATH] [--size SIZE]
#                             [--depths "1 16 128"] [--nice N] [--fixed-buffers] [--no-direct] [--no-build]
#                             [--out DIR]
#   --repetitions N  A/B rounds per configuration; the median is reported (default 3)
#   --duration S     measured seconds per run, after the ramp (default 3)
#   --ramp S         warm-up seconds per run, not counted (default 1)
#   --file PATH      test file (default build/bench-fio/iobench.dat: the repository's file system)
#   --size SIZE      test file size, fio-style suffixes (default 1g); created and filled if shorter
#   --depths LIST    queue depths per carrier / per fio job (default "1 16 128")
#   --nice N         run both tools under `nice -n N` (e.g. -20 on a machine shared with other work)
#   --fixed-buffers  spindle uses registered buffers (core/fixed.h) and the matched fio run --fixedbufs
#   --no-direct      skip the O_DIRECT runs
#   --no-build       use the existing build/release (do not configure and build first)
#   --out DIR        also keep the results in DIR: fio.csv (one row per run and tool: IOPS, p99 and
#                    clat p99) and meta-fio.json (the machine and the commit); scripts/bench/plot DIR draws them
#
# Conventions: depth is per carrier for spindle and per job (iodepth) for fio, and --numjobs equals
# the carrier count, so both keep depth x carriers I/Os in flight. Latency p99 is spindle's
# call-to-return time against fio's total latency (lat = slat + clat; clat is shown too).
# "p99 ratio" is fio / spindle: above 1 favours spindle; "IOPS ratio" is spindle / fio.
# SPDX-License-Identifier: Apache-2.0
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

reps=3
duration=3
ramp=1
file=""
size=1g
depths="1 16 128"
fixed=0
nice=0
direct=1
build=1
out_dir=""
while (($# > 0)); do
  case "$1" in
    --repetitions) reps="$2"; shift ;;
    --duration) duration="$2"; shift ;;
    --ramp) ramp="$2"; shift ;;
    --file) file="$2"; shift ;;
    --size) size="$2"; shift ;;
    --depths) depths="$2"; shift ;;
    --nice) nice="$2"; shift ;;
    --fixed-buffers) fixed=1 ;;
    --no-direct) direct=0 ;;
    --no-build) build=0 ;;
    --out) out_dir="$2"; shift ;;
    -h|--help) awk 'NR == 1 { next } !/^#/ { exit } !/SPDX-License-Identifier/ { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *) echo "fio.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[[ "$reps" =~ ^[1-9][0-9]*$ ]] || { echo "fio.sh: --repetitions needs a positive integer" >&2; exit 2; }
# fio takes whole seconds for --runtime and --ramp_time.
[[ "$duration" =~ ^[1-9][0-9]*$ ]] || { echo "fio.sh: --duration needs a whole number of seconds" >&2; exit 2; }
[[ "$ramp" =~ ^[0-9]+$ ]] || { echo "fio.sh: --ramp needs a whole number of seconds" >&2; exit 2; }
bench_install_tools fio.sh fio=fio || exit 1
command -v python3 >/dev/null || { echo "fio.sh: python3 is needed to read the JSON results" >&2; exit 1; }

if ((build)); then bench_build spindle-iobench; fi
bin="$SPINDLE_REPO_ROOT/build/release/apps/spindle-iobench"
bench_require "$bin"
bench_out_init "$out_dir" fio.csv
if [[ -z "$file" ]]; then
  mkdir -p "$SPINDLE_REPO_ROOT/build/bench-fio"
  file="$SPINDLE_REPO_ROOT/build/bench-fio/iobench.dat"
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

ncpu=$(nproc)
last=$((ncpu - 1))
one_cpu=$last           # one carrier / one fio job: the last CPU (CPU 0 takes most interrupts)
all_cpus="0-$last"

# Lay the file out with data (spindle-iobench writes the missing part), then read it once so the
# page cache holds it for the buffered runs.
"$bin" --file "$file" --size "$size" --rw read --duration 0.05 >/dev/null
size_bytes=$(stat -c %s "$file")
cat "$file" >/dev/null

fixed_note="plain buffers"
fio_fixed=()
spindle_fixed=()
if ((fixed)); then
  if ! err=$("$bin" --file "$file" --duration 0.05 --fixed-buffers 2>&1 >/dev/null); then
    echo "fio.sh: spindle-iobench --fixed-buffers is not available: $err" >&2
    exit 1
  fi
  fixed_note="registered buffers (spindle --fixed-buffers, fio --fixedbufs)"
  fio_fixed=(--fixedbufs)
  spindle_fixed=(--fixed-buffers)
fi

modes=(0)
direct_note=""
if ((direct)); then
  if python3 -c 'import os,sys; os.close(os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECT))' "$file" 2>/dev/null; then
    modes+=(1)
  else
    direct_note="O_DIRECT: refused by $(df -T "$file" | awk 'NR==2 { print $2 }') for $file; direct runs skipped"
  fi
fi

echo "machine: $(bench_machine_line)"
echo "file: $file ($((size_bytes >> 20)) MiB, $(df -T "$file" | awk 'NR==2 { print $2 " on " $1 }'))"
echo "runs: $reps A/B rounds x ${duration}s (+${ramp}s ramp), 4k randread, $fixed_note; one carrier on CPU $one_cpu, all on CPUs $all_cpus"
echo "fio: $(fio --version) --ioengine=io_uring --norandommap --randrepeat=0 --invalidate=0, no SQPOLL, no hipri;"
echo "     'fio+reg' adds --registerfiles --fixedbufs (fio's best without SQPOLL/IOPOLL, which spindle does not use)"
[[ -z "$direct_note" ]] || echo "$direct_note"
echo "nice: $nice; load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"

run_spindle() {  # carriers depth direct cpus outfile
  local args=(--file "$file" --rw randread --bs 4k --carriers "$1" --depth "$2" --duration "$duration" --ramp "$ramp" --json
        "${spindle_fixed[@]}")
  (($3)) && args+=(--direct)
  nice -n "$nice" taskset -c "$4" "$bin" "${args[@]}" >"$5"
}

run_fio() {  # carriers depth direct cpus outfile extra...
  local c=$1 d=$2 dir=$3 cpus=$4 o=$5
  shift 5
  nice -n "$nice" taskset -c "$cpus" fio --name=cmp --filename="$file" --size="$size_bytes" --ioengine=io_uring --rw=randread --bs=4k \
    --iodepth="$d" --numjobs="$c" --thread --time_based --runtime="$duration" --ramp_time="$ramp" \
    --direct="$dir" --norandommap --randrepeat=0 --invalidate=0 --group_reporting \
    --clat_percentiles=1 --lat_percentiles=1 --output-format=json "$@" >"$o"
}

read -r -a depth_list <<<"$depths"
round_s=$(awk -v d="$duration" -v r="$ramp" 'BEGIN { print 3 * (d + r + 0.3) }')
steps=$((${#modes[@]} * 2 * ${#depth_list[@]} * reps))
bench_progress_start "$steps" "$(awk -v n="$steps" -v s="$round_s" 'BEGIN { print n * s }')"
for dir in "${modes[@]}"; do
  for c in 1 "$ncpu"; do
    if ((c == 1)); then cpus=$one_cpu; else cpus=$all_cpus; fi
    for d in $depths; do
      for ((r = 1; r <= reps; ++r)); do
        tag="dir${dir}_c${c}_d${d}_r${r}"
        bench_step "$round_s" "fio $( ((dir)) && echo direct || echo 'page cache') carriers=$c QD=$d, round $r/$reps"
        run_spindle "$c" "$d" "$dir" "$cpus" "$out/$tag.spindle.json"
        run_fio "$c" "$d" "$dir" "$cpus" "$out/$tag.fio.json" "${fio_fixed[@]}"
        run_fio "$c" "$d" "$dir" "$cpus" "$out/$tag.fioreg.json" --registerfiles --fixedbufs
      done
      echo "  done: direct=$dir carriers=$c depth=$d" >&2
    done
  done
done

bench_progress_end
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$out" "$reps" "$depths" "$ncpu" "${modes[*]}" "$bench_out" <<'PY'
import csv, json, os, statistics, sys
out, reps, depths, ncpu, modes = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), int(sys.argv[4]), sys.argv[5].split()
keep = sys.argv[6]

def spindle(path):
    j = json.load(open(path))
    return j["iops"], j["lat_us"]["p99"]

def fio(path):
    text = open(path).read()
    j = json.loads(text[text.index("{"):])  # fio may print notes before the JSON
    rd = j["jobs"][0]["read"]
    pct = lambda key: rd[key]["percentile"]["99.000000"] / 1000.0
    return rd["iops"], pct("lat_ns"), pct("clat_ns")

def stats(vals):
    return statistics.median(vals), min(vals), max(vals)

if keep:  # --out: every run of each tool, as measured
    with open(os.path.join(keep, "fio.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["direct", "carriers", "depth", "round", "tool", "iops", "p99_us", "clat_p99_us"])
        for dir in modes:
            for c in (1, ncpu):
                for d in depths:
                    for r in range(1, reps + 1):
                        tag = os.path.join(out, f"dir{dir}_c{c}_d{d}_r{r}")
                        iops, p99 = spindle(tag + ".spindle.json")
                        w.writerow([dir, c, d, r, "spindle", iops, p99, ""])
                        for tool, suffix in (("fio", ".fio.json"), ("fio+reg", ".fioreg.json")):
                            w.writerow([dir, c, d, r, tool, *fio(tag + suffix)])

hdr = (f"{'config':24s} {'spindle IOPS':>26s} {'fio IOPS':>9s} {'ratio':>6s} {'fio+reg':>9s} {'ratio':>6s}"
       f" {'spindle p99':>11s} {'fio p99':>8s} {'(clat)':>8s} {'p99 ratio':>9s}")
print()
print(hdr)
print("-" * len(hdr))
for dir in modes:
    for c in (1, ncpu):
        for d in depths:
            s, f, g = [], [], []
            for r in range(1, reps + 1):
                tag = f"dir{dir}_c{c}_d{d}_r{r}"
                s.append(spindle(os.path.join(out, tag + ".spindle.json")))
                f.append(fio(os.path.join(out, tag + ".fio.json")))
                g.append(fio(os.path.join(out, tag + ".fioreg.json")))
            si, sp = stats([x[0] for x in s]), stats([x[1] for x in s])
            fi, fp, fc = stats([x[0] for x in f]), stats([x[1] for x in f]), stats([x[2] for x in f])
            gi = stats([x[0] for x in g])
            name = f"{'direct' if dir == '1' else 'page cache'} c={c} QD={d}"
            srange = f"{si[0]:.0f} [{si[1]:.0f}..{si[2]:.0f}]"
            print(f"{name:24s} {srange:>26s} {fi[0]:9.0f} {si[0] / fi[0]:6.2f} {gi[0]:9.0f} {si[0] / gi[0]:6.2f}"
                  f" {sp[0]:9.2f}us {fp[0]:6.2f}us {fc[0]:6.2f}us {fp[0] / sp[0]:9.2f}")
print()
print("IOPS ratio = spindle / fio (medians); p99 ratio = fio lat p99 / spindle p99 (>1: spindle better);")
print("QD is per carrier (spindle) and per job (fio iodepth); c carriers = c fio jobs.")
PY
bench_out_finish
