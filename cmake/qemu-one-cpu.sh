#!/bin/bash
# The aarch64 flavour's test emulator: runs an AArch64 program under qemu-user ($1) on one host CPU.
#
# qemu-user translates STLR and LDAR into plain host stores and loads with barriers on their far
# sides only, so on an x86 host a store-release followed by a load-acquire can be reordered (the
# store waits in the store buffer), which ARMv8 forbids (its STLR/LDAR pairs are sequentially
# consistent). Code that is correct on AArch64, such as the Chase-Lev deque's pop() and the
# carriers' park handshake, then fails under it when its threads run on two host CPUs at once: the
# deque's stress test handed one item to two takers about once in six runs. On one CPU the threads
# interleave but never run at the same time, and the reordering cannot be seen. Each program gets
# one CPU of those allowed, by its process id, so that ctest's parallel tests still spread out.
# SPDX-License-Identifier: Apache-2.0
qemu="$1"
shift
allowed=$(taskset -pc $$ 2>/dev/null | sed 's/.*: //')
cpus=()
IFS=',' read -ra parts <<< "$allowed"
for p in "${parts[@]}"; do
  if [[ "$p" == *-* ]]; then
    for ((c = ${p%-*}; c <= ${p#*-}; ++c)); do cpus+=("$c"); done
  elif [[ -n "$p" ]]; then
    cpus+=("$p")
  fi
done
if ((${#cpus[@]} == 0)); then exec "$qemu" "$@"; fi
exec taskset -c "${cpus[$(($$ % ${#cpus[@]}))]}" "$qemu" "$@"
