# dprc — developer entry points. `make test` works on a fresh machine.
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: install bench-install check test test-fast test-api services browser serve schemathesis lint demo demo-library bench bench-evidence clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# torch is pinned to the CPU wheel that lies on these machines' disk.
$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q "torch==2.13.0"
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

# Benchmarks need the [bench] extras (opacus, matplotlib).
bench-install: install
	$(PY) -m pip install -q -e ".[dev,bench]"

install: $(STAMP)

# ruff (lint and format) and mypy (types, configured in pyproject.toml) on everything
define LINT
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
endef

lint: install
	$(LINT)

# The edit loop: lint, types and the tests that need no service (PostgreSQL, Redis, Celery, an
# API server), no browser and no long run; markers set in tests/conftest.py. Installs only
# when the environment has never been installed (VENV=... reuses an existing one as it is).
check: $(if $(wildcard $(STAMP)),,install)
	$(LINT)
	$(PY) -m pytest -q -m "not slow and not services and not browser" tests

services:
	./scripts/services.sh

# Debian's Chromium for the dashboard's browser tests (tests/browser), installed when missing
browser:
	./scripts/browser.sh

# Two processes (pytest-xdist): one test's waits on servers, workers and subprocesses overlap
# another's work; a module (or an xdist_group) stays on one process, so its module fixtures
# are built once (tests/conftest.py, pytest_xdist_make_scheduler, which also sets torch to one
# thread: 23.5 min for .ci/run on a clean clone on 2 cores, 47 with two threads a process).
TEST_PROCESSES ?= 2
test: lint services browser
	$(PY) -m pytest -q --durations=40 -n $(TEST_PROCESSES) --dist loadgroup tests

# The suite without the tests marked slow and the browser tests (CI runs `make test`).
test-fast: lint services
	$(PY) -m pytest -q -m "not slow and not browser" tests

test-api: install services
	$(PY) -m pytest -q tests/api

serve: install
	$(VENV)/bin/dprc serve

schemathesis: install services
	$(PY) scripts/schemathesis_run.py

# The main job through the service (embedded mode: SQLite + in-process worker).
demo: install
	$(PY) scripts/demo.py

# The library alone: a tiny local Llama, DP-SGD-RC, checkpoint + ledger in runs/demo/.
demo-library: install
	$(PY) -m dprc_core.cli demo

bench: bench-install
	$(PY) benchmarks/norm_layer.py
	$(PY) benchmarks/step.py
	$(PY) benchmarks/accountant.py
	$(PY) benchmarks/dpftrl_linear.py
	$(PY) benchmarks/dpftrl_lm.py
	$(PY) benchmarks/audit.py
	$(PY) benchmarks/budget_contention.py
	$(PY) benchmarks/history_compose.py
	$(PY) benchmarks/distributed.py
	$(PY) benchmarks/sketch_sigma.py
	$(PY) benchmarks/sketch_memory.py
	$(PY) benchmarks/repeated_jobs.py
	$(PY) benchmarks/client_startup.py
	$(PY) benchmarks/secure_noise.py
	$(PY) benchmarks/three_ways.py
	$(PY) benchmarks/inference.py --tokens 48
	$(PY) benchmarks/dpo.py --seeds 20
	$(PY) benchmarks/synthetic.py
	$(PY) benchmarks/report.py

# Utility of randomized vs exact clipping on real text (about 30 min on 2 cores).
bench-evidence: bench-install
	$(PY) benchmarks/utility.py
	$(PY) benchmarks/audit.py
	$(PY) benchmarks/audit.py --cases per-example --eps 1 3 --out docs/benchmarks/audit_per_example.md
	$(PY) benchmarks/audit_step.py
	$(PY) benchmarks/sketch_utility.py
	$(PY) benchmarks/report.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
