# The two commands a newcomer runs: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python

.PHONY: demo test lint format bench redis

$(VENV)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	touch $@

redis:
	bash .ci/ensure-redis

# `make demo DEMO_ARGS="--duration 20 --no-web"` runs it unattended (CI, tests).
DEMO_ARGS ?=
demo: $(VENV)/.installed
	$(PY) manage.py migrate --noinput
	$(PY) manage.py fairqueue_demo $(DEMO_ARGS)

# A stock Node BullMQ worker for tests/test_node_worker.py (skipped there without node).
tests/node/node_modules/.installed: tests/node/package.json tests/node/package-lock.json
	@if command -v npm >/dev/null 2>&1; then \
		cd tests/node && npm ci --no-audit --no-fund --loglevel=error && touch node_modules/.installed; \
	else echo "npm not found: the Node worker test will be skipped"; fi

test: $(VENV)/.installed redis tests/node/node_modules/.installed
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m pytest

lint: $(VENV)/.installed
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

bench: $(VENV)/.installed redis
	$(PY) benchmarks/bench_policy.py
