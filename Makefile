# Quick start (fresh machine):  make demo   |   make test
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
TORCH  ?= torch==2.13.0

.PHONY: setup demo test bench scenarios lint clean

$(VENV)/.installed: pyproject.toml setup.cfg
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH)
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

setup: $(VENV)/.installed

## demo: a CNN training run that crashes twice in epoch 2 and is repaired in situ
demo: setup
	rm -rf runs/mnist
	$(PY) -m daifu --fixes examples/mnist/fixes.py examples/mnist/train.py --epochs 3

## test: the whole test suite and a smoke run of the benchmark harness (what CI runs)
test: setup
	DAIFU_REQUIRE_TORCH=1 $(PY) -m pytest
	$(PY) -m pytest perf --benchmark-disable -q -p no:cacheprovider

## bench: the full performance harness; asserts the targets, rewrites docs/performance.md
bench: setup
	DAIFU_PERF_ASSERT=1 DAIFU_PERF_REPORT=docs/performance.md $(PY) -m pytest perf -p no:cacheprovider

## scenarios: the crash benchmark with its restore-time table (docs/benchmark.md)
scenarios: setup
	$(PY) -m tests.scenarios.run --table docs/benchmark.md

## lint: ruff and mypy (what CI runs before the tests)
lint: setup
	$(PY) -m pip install --quiet ruff mypy
	$(PY) -m ruff check daifu tests perf examples
	$(PY) -m mypy

clean:
	rm -rf $(VENV) runs build *.egg-info .benchmarks
