# The two README commands: `make run` (set up, then run the pipeline) and `make test` (set up, then test).
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
PYTHON ?= python3
VENV ?= .venv
BIN := $(abspath $(VENV))/bin
STAMP := $(VENV)/.installed
# pip prints one warning per package for the machine's local index folders that do not exist; hide only those.
QUIET_PIP := { grep -v "is ignored: it is neither a file nor a directory" || true; }

.PHONY: setup run test test-slow bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -e '.[dev]' 2>&1 | $(QUIET_PIP)
	touch $(STAMP)

setup: $(STAMP)

# one local Prefect server and one warm stage server for all stages (flows/server.py, flows/warm.py): stages
# skip an ephemeral Prefect server and their library imports
run: setup
	PATH="$(BIN):$$PATH" python -m flows.server -- dvc repro

# the default suite (minutes); the end-to-end tests marked slow (real pipelines, servers, clusters and signals;
# about four times as long) run with `make test-slow`, and CI (.ci/run) runs both
test: setup
	$(BIN)/python -m pytest -q -m "not slow" $(PYTEST_ARGS)

test-slow: setup
	$(BIN)/python -m pytest -q -m slow $(PYTEST_ARGS)

bench: setup
	$(BIN)/python bench/bench_envs.py
	$(BIN)/python bench/bench_sampling.py
	$(BIN)/python bench/bench_overhead.py --noop

clean:
	rm -rf $(VENV) .prefect mlruns .pytest_cache
