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
echo "== ruff"; .venv/bin/ruff check memoriesd memories_cli tests scripts bench
echo "== mypy"; .venv/bin/mypy memoriesd memories_cli
echo "== lint-imports"; .venv/bin/lint-imports  # contracts: [tool.importlinter] in pyproject.toml
echo "== vulture"; .venv/bin/vulture  # paths, confidence and whitelist: [tool.vulture] in pyproject.toml
echo "== deptry"; .venv/bin/deptry .
echo "== pytest"
# Two worker processes, one test file each at a time (a file's module fixtures, e.g. a shared daemon,
# stay in one worker): most tests wait on daemons, sockets and timers, so two cores run ~1.4x faster.
exec .venv/bin/python -m pytest -q -p no:cacheprovider -n "${MEMORIES_TEST_WORKERS:-2}" --dist loadfile "$@"
