#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Runs redis_py_compare.py with a Python that has python3-redis: Debian's /usr/bin/python3 first (a
# python3 earlier on PATH, from pyenv say, may lack it), then python3 from PATH. Exit 77 (skipped, with
# the reason) when none has it or redis-server is missing.
here=$(dirname "$0")
for py in /usr/bin/python3 python3; do
  if command -v "$py" >/dev/null 2>&1 && "$py" -c 'import redis' >/dev/null 2>&1; then
    exec "$py" "$here/redis_py_compare.py" "$@"
  fi
done
echo "SKIP: python3-redis (Debian's python3-redis) is not installed"
exit 77
