# Every target sets itself up on a fresh machine: it creates .venv and installs pylog with its extras.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?= --durations=25

.PHONY: install demo test lint typecheck docs unit bench torture clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev,spark,bench,docs]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m pylog.demo

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests $(wildcard benchmarks)
	$(VENV)/bin/ruff format --check src tests $(wildcard benchmarks)
	$(VENV)/bin/lint-imports

typecheck: $(STAMP)
	$(VENV)/bin/mypy --strict src/pylog

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet -d site

unit: $(STAMP)
	$(VENV)/bin/pytest -q $(PYTEST_ARGS)

test: lint typecheck docs unit

bench: $(STAMP)
	$(PY) -m pip install --quiet -e ".[peers]" || echo "Kafka peers not installable here: their cases are skipped"
	$(PY) benchmarks/run.py
	$(PY) benchmarks/render.py

# The long modes of the reliability tests: thousands of SIGKILLs, minutes of multi-process chaos.
torture: $(STAMP)
	PYLOG_TORTURE=1 $(VENV)/bin/pytest -q -s tests/fault/test_sigkill_loop.py tests/fault/test_exactly_once.py tests/fault/test_chaos.py tests/fault/test_crash_points.py tests/fault/test_compaction_crash.py tests/fault/test_bit_flips.py

clean:
	rm -rf $(VENV) pylog-data pylog-data-remote .pytest_cache .mypy_cache .ruff_cache .hypothesis
