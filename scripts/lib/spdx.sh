#!/usr/bin/env bash
# Checks, or adds, the licence line that every spindle source file carries: the SPDX identifier of the
# Apache License 2.0 behind "//" (C, C++, assembly) or "#" (CMake, shell, Python, pkg-config templates,
# help2man include files), as the first line, or, in a script with a #! line, after the comment block that
# follows it.
#
# usage: scripts/lib/spdx.sh --check [FILE...]
#        scripts/lib/spdx.sh --add [FILE...]
# Without FILEs it works on the source files git tracks (git ls-files, from the repository root);
# files of other kinds (Markdown, JSON, fuzz corpora) are left alone. --add is idempotent, so after a
# merge it can simply be run again.
# Exit status: 0 when every file has the line (--check) or now has it (--add); 1 when --check finds a
# file without it (each one named on stderr) or a file cannot be read or written; 2 on bad usage.
# SPDX-License-Identifier: Apache-2.0
set -euo pipefail

readonly SPDX_TAG='SPDX-License-Identifier: Apache-2.0'

usage() {
  awk 'NR == 1 { next } !/^#/ { exit } $0 != "# SPDX-License-Identifier: Apache-2.0" { sub(/^# ?/, ""); print }' "${BASH_SOURCE[0]}"
}

# Prints the comment leader for a file, "//" or "#", or nothing when the file is not a source file.
comment_leader() {
  local path=$1 base first
  base=${path##*/}
  case "$base" in
    *.cpp | *.cc | *.h | *.hpp | *.c | *.S) echo '//'; return 0 ;;
    *.sh | *.py | *.cmake | *.cmake.in | *.pc.in | *.h2m | CMakeLists.txt) echo '#'; return 0 ;;
    *.*) return 0 ;;
  esac
  # No extension: a script when its first line is a shell or Python #! line.
  IFS= read -r first <"$path" 2>/dev/null || return 0
  if [[ "$first" =~ ^\#!.*(sh|bash|python3?)([[:space:]]|$) ]]; then echo '#'; fi
}

# Succeeds when the licence line, exactly, is in the file's header: the lines from the top up to the
# first one that is not a comment ("#..." or "//...").
has_tag() {
  awk -v tag="$SPDX_TAG" '
    $0 == "// " tag || $0 == "# " tag { found = 1; exit }
    !/^[[:space:]]*(#|\/\/)/ { exit }
    END { exit !found }' "$1"
}

# Inserts the licence line: in a file with a #! line, after the comment block that follows it (so that
# a script printing its own header as help, `sed -n 2,Np`, prints the same lines); else as line 1.
add_tag() {
  local path=$1 leader=$2 tmp first="" at=0
  tmp=$(mktemp "${path}.spdx.XXXXXX") || return 1
  IFS= read -r first <"$path" || true
  if [[ "$first" == '#!'* ]]; then
    at=$(awk 'NR == 1 { next } !/^#/ { exit } { n = NR } END { print (n ? n : 1) }' "$path")
  fi
  {
    head -n "$at" -- "$path"
    printf '%s %s\n' "$leader" "$SPDX_TAG"
    tail -n +"$((at + 1))" -- "$path"
  } >"$tmp" || { rm -f -- "$tmp"; return 1; }
  # Keep the file's mode (scripts stay executable).
  chmod --reference="$path" -- "$tmp" && mv -- "$tmp" "$path"
}

mode=""
case "${1:-}" in
  --check | --add) mode=${1#--}; shift ;;
  -h | --help) usage; exit 0 ;;
  *) echo "spdx.sh: expected --check or --add${1:+, got \"$1\"}" >&2; usage >&2; exit 2 ;;
esac

files=()
if (($# > 0)); then
  files=("$@")
else
  repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
  cd "$repo_root"
  if ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    echo "spdx.sh: $repo_root is not a git checkout; name the files to $mode" >&2
    exit 2
  fi
  mapfile -t files < <(git ls-files)
fi

missing=0
failed=0
for f in "${files[@]}"; do
  if [[ ! -f "$f" || ! -r "$f" ]]; then
    # A tracked file deleted in the work tree is not this script's business.
    if (($# == 0)) && [[ ! -e "$f" ]]; then continue; fi
    echo "spdx.sh: cannot read $f" >&2
    failed=1
    continue
  fi
  leader=$(comment_leader "$f")
  [[ -n "$leader" ]] || continue
  has_tag "$f" && continue
  if [[ "$mode" == check ]]; then
    echo "spdx.sh: no '$SPDX_TAG' line in $f" >&2
    missing=$((missing + 1))
  elif add_tag "$f" "$leader"; then
    echo "spdx.sh: added to $f"
  else
    echo "spdx.sh: cannot write $f" >&2
    failed=1
  fi
done

if ((missing > 0)); then
  echo "spdx.sh: $missing file(s) lack the licence line; run scripts/lib/spdx.sh --add" >&2
  exit 1
fi
exit "$failed"
