# The front door: `make serve` and `make test` each set everything up on a fresh machine.
PYTHON ?= python3
# The CPU wheel first: an unpinned torch would pull a multi-GB CUDA build. GPU users override it.
TORCH_SPEC ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: install model serve test lint typecheck bench loadtest soak clean

$(INSTALLED): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[server,dev,eval]'
	touch $@

install: $(INSTALLED)

model: install  ## download and convert the default model once (idempotent)
	$(BIN)/egrm fetch-model

serve: model  ## run the service on the embedded default model
	$(BIN)/egrm serve --host $(HOST) --port $(PORT)

lint: install
	$(BIN)/ruff check app tests loadtest
	$(BIN)/ruff format --check app tests loadtest

typecheck: install
	$(BIN)/mypy app

test: model lint typecheck  ## everything CI runs
	$(BIN)/pytest

bench: model  ## every benchmark, one JSON line each
	$(BIN)/python -m loadtest.bench_parallel --json
	$(BIN)/python -m loadtest.bench_concurrency --json
	$(BIN)/python -m loadtest.bench_latency

loadtest: model  ## locust (4 users, 60 s) against a fresh server; CSV + HTML in reports/; fails on any error
	$(BIN)/python -m loadtest.run_locust --users $(or $(USERS),4) --run-time $(or $(RUN_TIME),60s)

soak: model  ## steady load for DURATION seconds (default 600): RSS, errors, latency (JSON)
	$(BIN)/python -m loadtest.soak --duration $(or $(DURATION),600)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info
