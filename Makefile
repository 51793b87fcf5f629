# The two commands a newcomer runs: `make demo` and `make test` (`make test-fast` while
# working: the same checks, and only the tests that need no Redis).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python

.PHONY: demo test test-slow test-all test-fast test-django6 lint format bench redis screenshots

PIP    := $(PY) -m pip install --disable-pip-version-check --progress-bar on

# `make demo` installs the runtime only; `make test` adds the test tools on top.
$(VENV)/.installed: requirements.txt pyproject.toml
	@test -x $(PY) || { echo "make: creating $(VENV) with $(PYTHON)"; $(PYTHON) -m venv $(VENV); }
	@echo "make: installing the runtime (requirements.txt) into $(VENV); a minute or so the first time"
	$(PIP) --upgrade pip
	$(PIP) -r requirements.txt
	@touch $@

$(VENV)/.installed-dev: $(VENV)/.installed requirements-dev.txt requirements-tools.txt
	@echo "make: installing the test tools (requirements-dev.txt) into $(VENV)"
	$(PIP) -r requirements-dev.txt
	@touch $@

# The same suite on Django 6.1 and Python 3.12, in a virtualenv of its own, with Django's
# own django.tasks and no backport (requirements-django6.txt).
# Python 3.12: python3.12 from PATH, or pyenv's 3.12 (.ci/python312 finds it, as for CI);
# `make test-django6 PYTHON_DJ6=/path/to/python3.12` to choose one.
PYTHON_DJ6 ?= $(shell bash .ci/python312)
VENV_DJ6   := .venv-dj6
PY_DJ6     := $(VENV_DJ6)/bin/python

$(VENV_DJ6)/.installed: requirements-django6.txt requirements-tools.txt pyproject.toml
	@test -x $(PY_DJ6) || test -n "$(PYTHON_DJ6)" || { echo "make: no Python 3.12 found (python3.12 on PATH, or pyenv's 3.12); set PYTHON_DJ6=/path/to/python3.12" >&2; exit 1; }
	@test -x $(PY_DJ6) || { echo "make: creating $(VENV_DJ6) with $(PYTHON_DJ6)"; $(PYTHON_DJ6) -m venv $(VENV_DJ6); }
	@echo "make: installing Django 6.1 and the test tools (requirements-django6.txt) into $(VENV_DJ6)"
	$(PY_DJ6) -m pip install --disable-pip-version-check --progress-bar on --upgrade pip
	$(PY_DJ6) -m pip install --disable-pip-version-check --progress-bar on -r requirements-django6.txt
	@# The backport apart, off the suite's path: tests/redis/test_django6.py's both-frameworks test.
	$(PY_DJ6) -m pip install --disable-pip-version-check --no-deps --upgrade --target $(VENV_DJ6)/backport "django-tasks>=0.12,<0.13" "django-stubs-ext>=5,<7" "typing_extensions>=4"
	@touch $@

redis:
	bash .ci/ensure-redis

# `make demo DEMO_ARGS="--duration 20 --no-web"` runs it unattended (CI, tests).
DEMO_ARGS ?=
demo: $(VENV)/.installed
	$(PY) manage.py migrate --noinput
	$(PY) manage.py fairqueue_demo $(DEMO_ARGS)

# A stock Node BullMQ worker for tests/e2e/test_node_worker.py (skipped there without node).
tests/node/node_modules/.installed: tests/node/package.json tests/node/package-lock.json
	@if command -v npm >/dev/null 2>&1; then \
		cd tests/node && npm ci --no-audit --no-fund --loglevel=error && touch node_modules/.installed; \
	else echo "npm not found: the Node worker test will be skipped"; fi

# pytest-xdist processes: 2, one per core (at 4, browser and quickstart tests beside the
# suite's own Redis servers and workers failed now and then on a 2-core machine). Tests marked `serial` (live workers and loops with
# deadlines) run after, in one process: beside other test processes they starve.
TEST_WORKERS ?= 2

# `make test` leaves out the slow and the serial tests (whole demos, browsers, fresh
# projects, live loops with deadlines, the benchmarks' smoke runs); `make test-slow` runs
# just those, `make test-all` both, as CI does.
test: $(VENV)/.installed-dev redis tests/node/node_modules/.installed
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
	$(PY) -m pytest -n $(TEST_WORKERS) -m "not serial and not slow"

test-slow: $(VENV)/.installed-dev redis tests/node/node_modules/.installed
	$(PY) -m pytest -n $(TEST_WORKERS) -m "slow and not serial"
	$(PY) -m pytest -m serial

test-all: test test-slow

# ruff, mypy and the tests that need no Redis (tests/unit: the scheduling math, settings,
# checks, models, docs): seconds, no Redis started. CI (.ci/run) runs `make test`.
test-fast: $(VENV)/.installed-dev
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
	$(PY) -m pytest tests/unit -q -n $(TEST_WORKERS)

# `make test`'s pytest run on Django 6.1 / Python 3.12 (ruff ran in `make test`; the
# benchmarks' smoke runs, on the versions requirements.txt resolves to, ran there too).
test-django6: $(VENV_DJ6)/.installed redis tests/node/node_modules/.installed
	$(PY_DJ6) -c "import django, sys; print('make: Django', django.get_version(), 'on Python', sys.version.split()[0])"
	$(PY_DJ6) -m pytest -n $(TEST_WORKERS) -m "not serial" --ignore=tests/e2e/test_benchmarks_smoke.py
	$(PY_DJ6) -m pytest -m serial --ignore=tests/e2e/test_benchmarks_smoke.py

# docs/screenshots/: every console page light and dark, the overview, a culprit tenant,
# a job and the plan list at 400 px (tests/e2e/test_console_themes.py; needs chromium).
screenshots: $(VENV)/.installed-dev redis
	FAIRQUEUE_SCREENSHOTS=1 $(PY) -m pytest tests/e2e/test_console_themes.py -q

lint: $(VENV)/.installed-dev
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .
	$(PY) -m mypy

bench: $(VENV)/.installed-dev redis
	$(PY) benchmarks/bench_policy.py
