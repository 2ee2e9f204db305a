# Quick start (fresh machine):  make demo   |   make test
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
TORCH  ?= torch==2.13.0

.PHONY: setup demo test test-3.11 test-3.11-most test-3.11-distributed test-3.13 test-3.13-then-distributed check bench scenarios conformance lint clean

# CPython 3.13: built from the source tarball in ../shared/toolchains when this
# machine has none (about 4 minutes, once); torch is optional there
PY313_BUILD ?= $(firstword $(wildcard ../shared/toolchains/python3.13 /work/shared/toolchains/python3.13))
VENV313 ?= .venv-3.13

$(VENV)/.installed: pyproject.toml setup.cfg setup.py daifu/engine/_routes.c daifu/engine/_csignals.c daifu/hooks/_cmain.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH)
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

setup: $(VENV)/.installed

# Lightning and transformers, for the framework tests (torch is already there)
$(VENV)/.frameworks: $(VENV)/.installed
	$(PY) -m pip install --quiet -e '.[test,frameworks]' $(TORCH)
	touch $@

## demo: a CNN training run that crashes twice in epoch 2 and is repaired in situ
demo: setup
	rm -rf runs/mnist
	$(PY) -m daifu --fixes examples/mnist/fixes.py examples/mnist/train.py --epochs 3

## test: the whole test suite and a smoke run of the benchmark harness, on CPython 3.11
## (with torch) and 3.13 (what CI runs).  3.11's venv is set up while CPython 3.13 is
## built (where it is not yet); their editable installs, which build into the same tree,
## one after the other; then the two suites run
## side by side (2 cores: the 3.11 suite waits on subprocesses much of its time), each
## one's output printed whole when it ends; 3.11's distributed tests run after the
## 3.13 suite, so that both lanes end about together.  networkx's soak (~3 min) runs on 3.13 here,
## on both under `make soak-full`.
test:
	$(MAKE) -j2 --output-sync=target $(VENV)/.frameworks $(VENV313)/bin/python  # (3.13 builds meanwhile)
	$(MAKE) $(VENV313)/.installed
	$(PY) -m tests.sdists  # (the soaks' sdists, fetched once, before the suites share them)
	$(MAKE) -j2 --output-sync=target test-3.11-most test-3.13-then-distributed

REQUIRE311 = DAIFU_REQUIRE_TORCH=1 DAIFU_REQUIRE_FRAMEWORKS=1 DAIFU_REQUIRE_SPEEDUPS=1

## test-3.11: the whole suite on 3.11 alone (`make test` splits it in two: the
## distributed and resume tests run after the 3.13 suite, beside the rest of 3.11's)
test-3.11: test-3.11-most test-3.11-distributed

test-3.11-most: setup $(VENV)/.frameworks
	$(REQUIRE311) $(PY) -m pytest --durations=40 --ignore tests/test_distributed.py \
	    --ignore tests/test_resume.py --ignore tests/test_hang.py \
	    --deselect tests/test_scenarios.py::test_case_resumed_from_its_checkpoint_and_exact \
	    --deselect tests/test_scenarios.py::test_case_watched_runs_unchanged_and_names_only_its_straggler \
	    --deselect tests/test_soak.py::test_networkx_suite_passes_vaccinated
	$(PY) -m pytest perf --benchmark-disable -q -p no:cacheprovider

test-3.11-distributed: setup $(VENV)/.frameworks
	$(REQUIRE311) $(PY) -m pytest --durations=10 tests/test_distributed.py tests/test_resume.py \
	    tests/test_hang.py tests/test_scenarios.py::test_case_resumed_from_its_checkpoint_and_exact \
	    tests/test_scenarios.py::test_case_watched_runs_unchanged_and_names_only_its_straggler

test-3.13-then-distributed:
	$(MAKE) test-3.13
	$(MAKE) test-3.11-distributed

## check: the fast lane (about 1.5 minutes on 2 cores): lint, then every test not
## marked slow, on CPython 3.11 -- what to run before each commit; CI runs `make test`
check: lint
	$(PY) -m pytest -m "not slow" -q

## test-3.13: the whole suite under CPython 3.13 (the torch tests skip without torch)
$(VENV313)/bin/python:
	@test -n "$(PY313_BUILD)" || { echo "no CPython 3.13 toolchain (../shared/toolchains/python3.13)"; exit 1; }
	PY313=$$($(PY313_BUILD)) && $$PY313 -m venv $(VENV313)

$(VENV313)/.installed: $(VENV313)/bin/python pyproject.toml setup.cfg setup.py daifu/engine/_routes.c daifu/engine/_csignals.c daifu/hooks/_cmain.c
	$(VENV313)/bin/python -m pip install --quiet --upgrade pip
	$(VENV313)/bin/python -m pip install --quiet -e '.[test]'
	touch $@

test-3.13: $(VENV313)/.installed
	DAIFU_REQUIRE_SPEEDUPS=1 $(VENV313)/bin/python -m pytest --durations=40
	$(VENV313)/bin/python -m pytest perf --benchmark-disable -q -p no:cacheprovider

## bench: the full performance harness on CPython 3.11 and 3.13, one after the other;
## asserts the targets, rewrites each version's table in docs/performance.md (however
## the asserts end: a missed target's rows are marked); fails if either run failed
BENCH = DAIFU_PERF_ASSERT=1 DAIFU_PERF_REPORT=docs/performance.md
bench: setup $(VENV313)/.installed
	$(BENCH) $(PY) -m pytest perf -p no:cacheprovider; a=$$?; \
	$(BENCH) $(VENV313)/bin/python -m pytest perf -p no:cacheprovider; b=$$?; \
	test $$a -eq 0 && test $$b -eq 0

## scenarios: the crash benchmark with its restore-time table (docs/benchmark.md)
scenarios: setup $(VENV)/.frameworks
	$(PY) -m tests.scenarios.run --table docs/benchmark.md

## conformance: CPython's whole regression suite (python -m test, -j2) on 3.11 and 3.13,
## plain and with the test package vaccinated, compared test case by test case; fails on a
## difference not in tests/conformance/known_differences.toml (hours: docs/conformance.md)
conformance: setup
	@test -x $(VENV313)/bin/python || test -n "$(PY313_BUILD)" || { echo "no CPython 3.13 toolchain (../shared/toolchains/python3.13)"; exit 1; }
	test -x $(VENV313)/bin/python || { PY313=$$($(PY313_BUILD)) && $$PY313 -m venv $(VENV313) && $(VENV313)/bin/python -m pip install --quiet -e '.[test]'; }
	$(PY) -m tests.conformance.run --python 3.11=$(PY) --python 3.13=$(VENV313)/bin/python

.PHONY: soak-full fuzz

## soak-full: the whole more-itertools and attrs suites (their sdists' tests), plain and
## vaccinated, on 3.11 and 3.13, and networkx's on 3.11 (make test runs it on 3.13)
## (`make test` runs a fixed slice of each sdist suite; ~6 minutes a Python)
soak-full: setup
	@test -x $(VENV313)/bin/python || { echo "no $(VENV313): make test-3.13 makes it"; exit 1; }
	$(PY) -m tests.sdists
	DAIFU_SOAK_FULL=1 $(PY) -m pytest tests/test_soak.py -k "sdist or networkx" -q -s
	DAIFU_SOAK_FULL=1 $(VENV313)/bin/python -m pytest tests/test_soak.py -k sdist -q -s

## fuzz: generated programs (pysource-codegen) run plain and vaccinated until N are compared,
## one after the other in one process; differences shrunk into .cache/fuzz/findings.txt
## (CPython 3.11; FUZZ_PY=.venv-3.13/bin/python for 3.13).  `make test` runs a fixed slice
N ?= 20000
FUZZ_PY ?= $(PY)
fuzz: setup
	$(FUZZ_PY) -m tests.fuzz.run -n $(N)

## lint: ruff and mypy (what CI runs before the tests)
## lint: ruff, mypy (3.11 and 3.13 rules), and the import contracts (setup.cfg,
## [importlinter]: the layers, the engine's wings, no import cycle)
lint: setup
	$(PY) -m pip install --quiet ruff mypy
	$(PY) -m ruff check daifu tests perf examples
	$(PY) -m mypy
	$(PY) -m mypy --config-file .ci/mypy-3.13.ini
	$(VENV)/bin/lint-imports

clean:
	rm -rf $(VENV) $(VENV313) runs build *.egg-info .benchmarks
