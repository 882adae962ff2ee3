#!/usr/bin/env bash
# scripts/lib/spdx.sh on files made here: --check fails on each kind of file without the licence line and
# names it, --add puts the line in the right place (after a #! line and its comment block) and keeps the
# mode, a second --add
# changes nothing, files that are not sources are left alone, and bad usage exits 2.
# usage: spdx_test.sh PATH/TO/spdx.sh     Exit status: 0 pass, 1 fail.
# SPDX-License-Identifier: Apache-2.0
set -euo pipefail

spdx=$1
tmp=$(mktemp -d)
trap 'rm -rf -- "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
tag='SPDX-License-Identifier: Apache-2.0'

printf '#pragma once\nint f();\n' >"$tmp/a.h"
printf '#!/usr/bin/env bash\necho hi\n' >"$tmp/run"
chmod 755 "$tmp/run"
printf '#!/usr/bin/env python3\n"""Doc."""\n' >"$tmp/b.py"
printf 'project(x)\n' >"$tmp/CMakeLists.txt"
printf 'Name: x\n' >"$tmp/x.pc.in"
printf '[NAME]\nx \\- a program\n' >"$tmp/x.h2m"
printf '#!/bin/sh\n# usage: tool\n# more help\necho hi\n' >"$tmp/tool.sh"
# The identifier inside a sentence is not the licence line.
printf '// mentions SPDX-License-Identifier: Apache-2.0 in passing\nint x;\n' >"$tmp/mention.cpp"
printf '# notes\n' >"$tmp/README.md"
printf 'plain data\n' >"$tmp/data"

rc=0
out=$(bash "$spdx" --check "$tmp/a.h" "$tmp/run" "$tmp/b.py" "$tmp/CMakeLists.txt" "$tmp/x.pc.in" "$tmp/tool.sh" \
  "$tmp/x.h2m" "$tmp/mention.cpp" "$tmp/README.md" "$tmp/data" 2>&1) || rc=$?
((rc == 1)) || fail "--check on files without the line exited $rc, not 1"
for f in a.h run b.py CMakeLists.txt x.pc.in tool.sh x.h2m mention.cpp; do
  grep -qF "$tmp/$f" <<<"$out" || fail "--check did not name $f: $out"
done
for f in README.md data; do
  ! grep -qF "$tmp/$f" <<<"$out" || fail "--check named $f, which is not a source file"
done

bash "$spdx" --add "$tmp/a.h" "$tmp/run" "$tmp/b.py" "$tmp/CMakeLists.txt" "$tmp/x.pc.in" "$tmp/tool.sh" \
  "$tmp/x.h2m" "$tmp/README.md" "$tmp/data" >/dev/null
[[ "$(head -n 1 "$tmp/a.h")" == "// $tag" ]] || fail "a.h: first line is '$(head -n 1 "$tmp/a.h")'"
[[ "$(sed -n 2p "$tmp/a.h")" == '#pragma once' ]] || fail "a.h lost its first line"
[[ "$(head -n 1 "$tmp/run")" == '#!/usr/bin/env bash' ]] || fail "run: the #! line moved"
[[ "$(sed -n 2p "$tmp/run")" == "# $tag" ]] || fail "run: second line is '$(sed -n 2p "$tmp/run")'"
[[ -x "$tmp/run" ]] || fail "run is no longer executable"
[[ "$(sed -n 2p "$tmp/b.py")" == "# $tag" ]] || fail "b.py: second line is '$(sed -n 2p "$tmp/b.py")'"
[[ "$(head -n 1 "$tmp/CMakeLists.txt")" == "# $tag" ]] || fail "CMakeLists.txt: no line"
[[ "$(head -n 1 "$tmp/x.pc.in")" == "# $tag" ]] || fail "x.pc.in: no line"
# help2man ignores what comes before an include file's first section.
[[ "$(head -n 2 "$tmp/x.h2m")" == "# $tag"$'\n[NAME]' ]] || fail "x.h2m: first lines are '$(head -n 2 "$tmp/x.h2m")'"
# After the #! line's comment block: `sed -n 2,3p` (a script's own help) still gives that block.
[[ "$(sed -n 2,3p "$tmp/tool.sh")" == $'# usage: tool\n# more help' ]] || fail "tool.sh: its help block moved"
[[ "$(sed -n 4p "$tmp/tool.sh")" == "# $tag" ]] || fail "tool.sh: fourth line is '$(sed -n 4p "$tmp/tool.sh")'"
[[ "$(sed -n 5p "$tmp/tool.sh")" == 'echo hi' ]] || fail "tool.sh lost its code"
[[ "$(cat "$tmp/README.md")" == '# notes' ]] || fail "README.md was changed"
[[ "$(cat "$tmp/data")" == 'plain data' ]] || fail "data was changed"

bash "$spdx" --check "$tmp/a.h" "$tmp/run" "$tmp/b.py" "$tmp/CMakeLists.txt" "$tmp/tool.sh" ||
  fail "--check after --add failed"
before=$(cat "$tmp/a.h" "$tmp/run")
bash "$spdx" --add "$tmp/a.h" "$tmp/run" >/dev/null
[[ "$(cat "$tmp/a.h" "$tmp/run")" == "$before" ]] || fail "a second --add changed the files"

rc=0; bash "$spdx" --check "$tmp/no-such-file.cpp" 2>/dev/null || rc=$?
((rc == 1)) || fail "--check on a missing file exited $rc, not 1"
rc=0; bash "$spdx" --frobnicate 2>/dev/null || rc=$?
((rc == 2)) || fail "an unknown option exited $rc, not 2"
rc=0; bash "$spdx" 2>/dev/null || rc=$?
((rc == 2)) || fail "no mode exited $rc, not 2"
echo "spdx.sh: all checks passed"
