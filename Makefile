# tpustream — `make help` lists the targets.
VENV    ?= .venv
PYTHON  ?= python3
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
DEMO_DIR ?= demo-output

.DEFAULT_GOAL := help
.PHONY: help install test test-slow test-scenarios test-all test-unit demo lint bench gcs-server clean

help: ## Show this help.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-10s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# .[bench]: the peers of `tpustream bench load` (seconds more to install, no pin changes), so the suite runs
# their adapters; not .[bench-mosaic] (mosaic-streaming would downgrade numpy and google-cloud-storage).
$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), "tpustream needs Python >= 3.10"'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	@touch $(STAMP)

install: $(STAMP) ## Build .venv (pinned torch 2.9.0 / torchvision 0.24.0 / torch_xla 2.9.0 + the rest).

test: $(STAMP) ## Run the test suite (unit + integration: GCS server on loopback, XLA on CPU), all but the `slow` emulations and the scenarios.
	$(BIN)/pytest -m "not slow and not scenario"

test-slow: $(STAMP) ## Run the `slow` tests only (multi-host and SIGTERM emulations, full-size models, whole DAG runs); CI runs them after `make test`.
	$(BIN)/pytest -m "slow and not scenario"

test-scenarios: $(STAMP) ## Run the scenario suite: the whole pipeline in the combinations a user runs (weights x first/warm-started x input size); CI runs it last.
	$(BIN)/pytest -m scenario

test-all: $(STAMP) ## Run every test, `slow` and the scenarios included (what CI runs, in one pytest session).
	$(BIN)/pytest

test-unit: $(STAMP) ## Run the fast unit tests only.
	$(BIN)/pytest -m "not integration and not slow and not scenario"

demo: $(STAMP) ## Run the whole pipeline locally (kfp.local, XLA CPU) on the bundled digits; prints the champion and its answers on a few val images. Again: challenger vs that champion (`make clean` starts over).
	$(BIN)/tpustream pipeline run-local --root $(DEMO_DIR)/pipeline
	$(BIN)/tpustream predict --model $(DEMO_DIR)/pipeline/registry --sample-val 8 --top-k 1

lint: $(STAMP) ## ruff (lint + format check) and mypy.
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: $(STAMP) ## Shard-writer benchmark (JSON lines).
	$(BIN)/tpustream bench write

gcs-server: $(STAMP) ## Run a GCS-API server (fake-gcs-server, in memory) on 127.0.0.1 until Ctrl-C; prints the `export STORAGE_EMULATOR_HOST=...` line. PORT=N (default a free one), BUCKET=NAME (an empty bucket).
	$(BIN)/tpustream dev gcs-server $(if $(PORT),--port $(PORT)) $(if $(BUCKET),--bucket $(BUCKET))

clean: ## Remove demo output and caches (keeps .venv).
	rm -rf $(DEMO_DIR) .pytest_cache .mypy_cache .ruff_cache
