"""Differential fuzzing, the CI slice: generated programs run the same plain
and vaccinated (tests/fuzz/; the long run is ``make fuzz N=20000``, its
figures are in docs/conformance.md).

* a fixed slice of seeds of pysource-codegen's programs, each program run
  plain twice and vaccinated (every function and the module code) in a forked
  child of this process: the same stdout, exception (type, message, the
  program's lines in the traceback) and exit status;
* every program the fuzzer found and kept (tests/fuzz/kept_programs.txt),
  shrunk: a known daifu bug is ``xfail(strict=True)``.
"""

from __future__ import annotations

import os
import sys

import pytest

from .fuzz import compare, program
from .fuzz.run import parse_kept

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="the fuzzer forks")

SLICE = range(0, 30)  # seeds: about 115 programs, ~20 s on 2 cores


@pytest.mark.slow
def test_generated_programs_run_the_same_vaccinated():
    pytest.importorskip("pysource_codegen")
    counts: dict[str, int] = {}
    differ = []
    for seed in SLICE:
        for kind, source in program.programs(seed):
            verdict = compare.run(source)
            counts[verdict["verdict"]] = counts.get(verdict["verdict"], 0) + 1
            if verdict["verdict"] in ("differs", "harness"):
                differ.append(f"seed {seed} ({kind}):\n{source}\n{compare.explain(verdict)}")
    assert not differ, "\n\n".join(differ[:3])
    assert counts.get("same", 0) >= 100, counts  # (they really were compared)


KEPT = parse_kept()


def _kept_params():
    for item in KEPT:
        marks = []
        if item["status"].startswith("xfail"):
            marks.append(pytest.mark.xfail(strict=True, reason=item["status"]))
        yield pytest.param(item, id=item["name"], marks=marks)


@pytest.mark.parametrize("item", list(_kept_params()))
def test_kept_program_runs_the_same_vaccinated(item):
    verdict = compare.run(item["source"])
    assert verdict["verdict"] in ("same", "differs"), compare.explain(verdict)
    assert verdict["verdict"] == "same", (
        f"{item['name']} (python {sys.version_info[0]}.{sys.version_info[1]}):\n"
        f"{item['source']}\n{compare.explain(verdict)}")


def test_the_harness_tells_a_difference_from_noise():
    # a program that prints its own bytecode differs vaccinated; one that
    # prints the time differs from itself (not compared); one that loops
    # forever is stopped (not compared)
    verdict = compare.run("def f(x):\n    return x[0]\nprint(f.__code__.co_code)\n")
    assert verdict["verdict"] == "differs" and verdict["why"] == "outcome", verdict
    assert compare.run("import time\nprint(time.perf_counter_ns())\n")["verdict"] == "unstable"
    assert compare.run("while True:\n    pass\n", budget=0.2)["verdict"] == "slow"
    same = compare.run("try:\n    [][0]\nexcept IndexError as e:\n    print(e)\n"
                       "raise SystemExit(3)\n")
    assert same["verdict"] == "same", same
    assert same["plain"] == {"stdout": "list index out of range\n", "exception": "SystemExit",
                             "message": "3", "lines": [5], "chain": [], "status": 3}
