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
echo "== ruff"; .venv/bin/ruff check memoriesd memories_cli tests scripts
echo "== mypy"; .venv/bin/mypy memoriesd
echo "== pytest"
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
