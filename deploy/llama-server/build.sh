#!/usr/bin/env bash
# Build llama.cpp's `llama-server` once, from a pinned source reachable through the package index,
# and cache the binary in the user cache (like the model). Idempotent: a cached binary is kept.
#
# Why this source: the llama-cpp-python sdist vendors the whole llama.cpp tree (tools/server
# included), and PyPI is reachable where GitHub is not. We build the server target alone:
# Release, native CPU, static libraries (one self-contained binary), no TLS, no web UI.
#
#   usage: deploy/llama-server/build.sh [PIP]     prints the binary's path on its last line
set -euo pipefail

PIP=${1:-pip}
SDIST_VERSION=0.3.36
SDIST_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
CACHE=${EGRM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/egrm}/llama.cpp/$SDIST_VERSION
BIN=$CACHE/bin/llama-server

if [ -x "$BIN" ] && "$BIN" --version >/dev/null 2>&1; then
    echo "$BIN"
    exit 0
fi

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
"$PIP" download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
    "llama-cpp-python==$SDIST_VERSION" -d "$WORK" >&2
SDIST="$WORK/llama_cpp_python-$SDIST_VERSION.tar.gz"
echo "$SDIST_SHA256  $SDIST" | sha256sum --check --quiet
tar xzf "$SDIST" -C "$WORK"
SRC="$WORK/llama_cpp_python-$SDIST_VERSION/vendor/llama.cpp"

start=$(date +%s)
cmake -S "$SRC" -B "$WORK/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON >&2
cmake --build "$WORK/build" --target llama-server -j "$(nproc)" >&2
echo "llama-server built in $(( $(date +%s) - start )) s" >&2

# The converter travels with the binary: it turns the judge's safetensors into a GGUF of the same
# weights (F32/F16), so llama-server can serve exactly what the embedded engine serves.
mkdir -p "$CACHE/bin"
cp -r "$SRC/convert_hf_to_gguf.py" "$SRC/gguf-py" "$SRC/conversion" "$CACHE/"
install -m 0755 "$WORK/build/bin/llama-server" "$BIN.tmp"
mv "$BIN.tmp" "$BIN"
echo "$BIN"
