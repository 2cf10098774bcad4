#!/usr/bin/env bash
# Memories end to end on a throw-away home: install, start the daemon, create a vault, keep notes,
# ingest Markdown, search, lock, prove nothing readable is on disk, stop.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e . >/dev/null
export PATH="$PWD/.venv/bin:$PATH"

DEMO=$(mktemp -d /tmp/memories-demo.XXXXXX)
export MEMORIES_HOME="$DEMO/home"
mkdir -p "$MEMORIES_HOME"
# Cheap KDF parameters keep the demo quick; the defaults (64 MiB, t=3, p=4) stay strong.
printf '[vault]\nkdf_memory_kib = 8192\nkdf_iterations = 1\nkdf_lanes = 1\n' > "$MEMORIES_HOME/config.toml"
trap 'memories daemon stop >/dev/null 2>&1 || true; rm -rf "$DEMO"' EXIT
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "start the daemon on a throw-away home ($MEMORIES_HOME)"
memories daemon start

step "create a vault (passphrase from stdin, as a script would)"
VAULT=$(printf 'demo passphrase\n' | memories vault create demo --passphrase-stdin | tail -n 1)
echo "vault id: $VAULT"

step "add notes and read one back"
ID=$(memories memory add demo "The staging database password rotates every Monday. CANARY-7f3a" --title "Ops notes" --tag ops)
memories memory add demo "Buy oat milk and coffee beans" --title "Shopping" >/dev/null
memories memory list demo
memories memory read demo "$ID"

if memories rag --help >/dev/null 2>&1; then
  step "ingest a folder of Markdown notes and search it (English and Chinese)"
  NOTES="$DEMO/notes"; mkdir -p "$NOTES/sub"
  printf '# Backup plan\n\nCopy the vault directory while it is locked. Restore it by copying it back. CANARY-7f3a\n' > "$NOTES/backup.md"
  printf -- '---\ntags: [travel]\n---\n# 旅行计划\n\n我们下个月去北京看长城，然后去上海。\n' > "$NOTES/sub/travel.md"
  memories rag ingest demo "$NOTES" --recursive
  memories rag search demo "restore the vault" --limit 3
  memories rag search demo "长城" --limit 3
  memories rag status demo

  step "ask a grounded question through a loopback OpenAI-compatible service (scripts/demo_llm.py)"
  .venv/bin/python scripts/demo_llm.py "$DEMO/llm.port" & LLM_PID=$!
  trap 'kill $LLM_PID 2>/dev/null || true; memories daemon stop >/dev/null 2>&1 || true; rm -rf "$DEMO"' EXIT
  for _ in $(seq 50); do [ -s "$DEMO/llm.port" ] && break; sleep 0.1; done
  PORT=$(cat "$DEMO/llm.port")
  memories daemon stop
  cat >> "$MEMORIES_HOME/config.toml" <<CFG
[rag.generation]
protocol = "compatible"
url = "http://127.0.0.1:$PORT/v1/chat/completions"
model = "demo"
CFG
  printf 'demo passphrase\n' | memories vault unlock demo --passphrase-stdin
  memories rag ask demo "How do I restore a vault backup?"
  memories --json rag ask demo "How do I restore a vault backup?" | head -n 20

  step "the same question through a loopback Gemini-protocol service"
  memories daemon stop
  sed -i '/^\[rag.generation\]/,$d' "$MEMORIES_HOME/config.toml"
  cat >> "$MEMORIES_HOME/config.toml" <<CFG
[rag.generation]
protocol = "gemini"
url = "http://127.0.0.1:$PORT/v1beta/models/gemini-2.5-flash:generateContent"
model = "gemini-2.5-flash"
CFG
  printf 'demo passphrase\n' | memories vault unlock demo --passphrase-stdin
  memories rag ask demo "我们下个月去北京看什么？"
fi

step "lock the vault: the daemon forgets the key"
memories vault lock demo
memories memory list demo || echo "(locked, as expected)"

step "nothing readable on disk: search every byte of every file under the home for the note text"
# -a: read binary files (the sealed log, head and vectors) as text too; LC_ALL=C: match raw bytes.
# The Chinese canary is a phrase of the note, not a single word: the jieba dictionary cache under
# HOME/cache holds every dictionary word (public data) and would match 长城 on its own.
if LC_ALL=C grep -rlaF -e "CANARY-7f3a" -e "staging database" -e "Ops notes" -e "去北京看长城" "$MEMORIES_HOME"; then
  echo "FAIL: plaintext found on disk" >&2; exit 1
fi
echo "no plaintext found in $(find "$MEMORIES_HOME" -type f | wc -l) files"
ls -la "$MEMORIES_HOME/vaults/$VAULT"

step "unlock again and stop the daemon"
printf 'demo passphrase\n' | memories vault unlock demo --passphrase-stdin
memories memory read demo "$ID" | head -n 1
memories daemon stop
echo
echo "demo finished"
