#!/usr/bin/env bash
# On a GPU machine with sglang installed: start an SGLang runtime on the model, wait for /health,
# then run the SGLang backend's live tests (pytest -m sglang) against it. Exit status = the tests'.
#
#   EGRM_MODEL      local HF model folder to serve (default: the fetched SmolLM2-135M-Instruct)
#   SGLANG_PYTHON   python that has sglang (default: python3); PYTHON: the project's (.venv/bin/python)
#   SGLANG_PORT     runtime port (default 30000); SGLANG_ARGS: extra launch_server flags
#   WAIT_S          how long to wait for the runtime to come up (default 900)
set -euo pipefail
cd "$(dirname "$0")/.."

MODEL="${EGRM_MODEL:-${XDG_CACHE_HOME:-$HOME/.cache}/egrm/models/SmolLM2-135M-Instruct}"
SGLANG_PYTHON="${SGLANG_PYTHON:-python3}"
PYTHON="${PYTHON:-.venv/bin/python}"
PORT="${SGLANG_PORT:-30000}"
URL="http://127.0.0.1:${PORT}"
LOG="$(mktemp -t egrm-sglang-XXXXXX.log)"

"$SGLANG_PYTHON" -c "import sglang" 2>/dev/null || { echo "gpu-check: '$SGLANG_PYTHON' has no sglang (pip install sglang)" >&2; exit 2; }
[ -d "$MODEL" ] || { echo "gpu-check: no model folder at $MODEL (run 'egrm fetch-model' or set EGRM_MODEL)" >&2; exit 2; }

# shellcheck disable=SC2086  # SGLANG_ARGS is a list of flags
"$SGLANG_PYTHON" -m sglang.launch_server --model-path "$MODEL" --host 127.0.0.1 --port "$PORT" ${SGLANG_ARGS:-} >"$LOG" 2>&1 &
RUNTIME=$!
trap 'kill "$RUNTIME" 2>/dev/null; wait "$RUNTIME" 2>/dev/null || true' EXIT

echo "gpu-check: waiting for $URL/health (log: $LOG)"
deadline=$(( $(date +%s) + ${WAIT_S:-900} ))
until "$PYTHON" -c "import httpx, sys; sys.exit(httpx.get('$URL/health', timeout=30).status_code != 200)" 2>/dev/null; do
    if ! kill -0 "$RUNTIME" 2>/dev/null; then echo "gpu-check: the runtime exited" >&2; tail -n 50 "$LOG" >&2; exit 1; fi
    if [ "$(date +%s)" -gt "$deadline" ]; then echo "gpu-check: no /health after ${WAIT_S:-900}s" >&2; tail -n 50 "$LOG" >&2; exit 1; fi
    sleep 2
done

EGRM_SGLANG_URL="$URL" EGRM_MODEL="$MODEL" "$PYTHON" -m pytest -m sglang -p no:cacheprovider -rA tests/engines/test_sglang_live.py
