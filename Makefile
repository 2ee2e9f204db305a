# Quick start (fresh machine):  make demo   |   make test
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
TORCH  ?= torch==2.13.0

.PHONY: setup demo test test-fast bench bench-smoke lint clean

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

## test: the whole test suite (what CI runs)
test: setup
	$(PY) -m pytest

bench: setup
	$(PY) -m pytest perf --benchmark-only

bench-smoke: setup
	$(PY) -m pytest perf --benchmark-disable -q

lint: setup
	$(PY) -m pip install --quiet ruff
	$(PY) -m ruff check daifu tests perf examples

clean:
	rm -rf $(VENV) runs build *.egg-info .benchmarks
