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

test: $(VENV)/.installed redis
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m pytest

lint: $(VENV)/.installed
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

bench: $(VENV)/.installed redis
	$(PY) benchmarks/bench_policy.py
