#!/usr/bin/env bash
# Install Memories with its test dependencies into .venv (created if missing) and run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
# The sync tests run the real `syncthing` and `rclone` on 127.0.0.1 (issue 30): install the Debian
# packages when they are missing and we may (root, apt-get); else say in one line what will skip.
missing=()
for prog in syncthing rclone; do command -v "$prog" >/dev/null 2>&1 || missing+=("$prog"); done
if [ "${#missing[@]}" -gt 0 ]; then
  why="not root with apt-get here"
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "== apt-get install ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q "${missing[@]}" >/dev/null 2>&1; } || true
    still=()
    for prog in "${missing[@]}"; do command -v "$prog" >/dev/null 2>&1 || still+=("$prog"); done
    missing=("${still[@]+"${still[@]}"}")
    why="apt-get install failed"
  fi
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "== ${missing[*]} not installed ($why: apt-get install ${missing[*]}): the sync tests through ${missing[*]} will skip"
  fi
fi
echo "== ruff"; .venv/bin/ruff check memoriesd memories_cli tests scripts bench
echo "== mypy"; .venv/bin/mypy memoriesd memories_cli
echo "== lint-imports"; .venv/bin/lint-imports  # contracts: [tool.importlinter] in pyproject.toml
echo "== vulture"; .venv/bin/vulture  # paths, confidence and whitelist: [tool.vulture] in pyproject.toml
echo "== deptry"; .venv/bin/deptry .
echo "== pytest"
# Two worker processes, one test file each at a time (a file's module fixtures, e.g. a shared daemon,
# stay in one worker): most tests wait on daemons, sockets and timers, so two cores run ~1.4x faster.
exec .venv/bin/python -m pytest -q -p no:cacheprovider -n "${MEMORIES_TEST_WORKERS:-2}" --dist loadfile "$@"
