"""Soak: someone else's test suite passes with that library vaccinated.

``toolz`` (every function, ``DAIFU_ENTRY='**'``, and the default ``'*'`` with
every other function vaccinated at its first call) and
``networkx`` (``'*'``: every function with a loop, ~1000 functions, ~5800
tests) run under ``python -m daifu -m pytest --pyargs``; toolz also a second
time with every module loaded from the code cache.  ``more-itertools`` and
``attrs`` (``'**'``), whose tests ship only in their sdists, run plain and
vaccinated and must give the same pytest summary (a fixed slice in ``make
test``, the whole suites under ``make soak-full``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from .support import read_events

pytestmark = pytest.mark.slow


def soak(tmp_path, package, entry, timeout, env=None, lazy=True):
    log = tmp_path / "events.jsonl"
    log.unlink(missing_ok=True)
    proc = subprocess.run(
        [sys.executable, "-m", "daifu", *([] if lazy else ["--no-lazy"]), "--modules", package,
         "--entry", entry, "--log", str(log),
         "--log-level", "debug", "-m", "pytest", "--pyargs", package, "-q", "-p",
         "no:cacheprovider", "-x"],
        cwd=tmp_path, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    events = read_events(log)
    functions = sum(len(e["functions"]) for e in events if e["event"] == "module.vaccinated")
    skipped = [s for e in events if e["event"] == "module.vaccinated" for s in e["skipped"]]
    passed = re.search(r"(\d+) passed", proc.stdout)
    return proc, int(passed.group(1)) if passed else 0, functions, skipped, events


@pytest.mark.parametrize("entry,min_functions", [("**", 150), ("*", 25)])
def test_toolz_suite_passes_vaccinated(tmp_path, entry, min_functions):
    proc, passed, functions, skipped, events = soak(tmp_path, "toolz", entry, 600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert passed >= 190
    assert functions >= min_functions
    assert skipped == []
    assert not [e for e in events if e["event"] == "daifu.internal_error"]


def test_toolz_suite_passes_on_code_loaded_from_the_cache(tmp_path):
    env = {"DAIFU_CACHE": str(tmp_path / "cache")}
    first = soak(tmp_path, "toolz", "**", 600, env)
    proc, passed, functions, skipped, events = soak(tmp_path, "toolz", "**", 600, env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert passed == first[1] >= 190 and functions == first[2] >= 150
    modules = [e for e in events if e["event"] == "module.vaccinated" and e["functions"]]
    assert modules and all(e["cached"] for e in modules)
    # (the first run rewrote every module it vaccinated; one with nothing to
    # protect is cached too, and may be a hit when the suite imports it again)
    assert not [e for e in first[4]
                if e["event"] == "module.vaccinated" and e["cached"] and e["functions"]]


def test_networkx_suite_passes_vaccinated(tmp_path):
    # (without first-call stubs: the suite calls thousands of networkx functions
    # and test functions once each, and each first call pays its rewrite)
    proc, passed, functions, skipped, events = soak(tmp_path, "networkx", "*", 1800, lazy=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert passed >= 5000
    assert functions >= 900
    assert skipped == []
    assert not [e for e in events if e["event"] == "daifu.internal_error"]


# -- suites that ship only in the sdist: more-itertools (generators, exceptions)
# and attrs (classes, decorators, generated methods) --
#
# Each runs twice, plain and with the package vaccinated (every function,
# --entry '**'), on the installed pinned version with the tests of its sdist
# (tests/sdists.py downloads it once into .cache/sdists/).  `make test` runs a
# fixed slice (each suite's slowest tests left out: a few seconds each);
# DAIFU_SOAK_FULL=1 (`make soak-full`) runs each suite whole.

FULL = os.environ.get("DAIFU_SOAK_FULL") == "1"

# (the plain run fails it too on 3.11.7: it expects the return annotation of
# the converter's __call__, which attrs copies only on newer Pythons)
ATTRS_PLAIN_FAILS = ["tests/test_converters.py::TestPipe::test_wrapped_annotation"]

SDIST_SUITES = {
    # name: (modules vaccinated, {module: at least N functions vaccinated},
    #        the slice's options, options of both runs)
    "more-itertools": (
        "more_itertools", {"more_itertools.more": 200, "more_itertools.recipes": 60},
        # the slowest tests (numeric loops: 90% of the suite's time)
        [f"--deselect=tests/{t}" for t in (
            "test_recipes.py::PrimeFunctionTests::test_primes",
            "test_recipes.py::PrimeFunctionTests::test_nth_prime_approximate",
            "test_recipes.py::PolynomialFromRootsTests::test_large",
            "test_more.py::DiscreteFourierTransformTests::test_roundtrip",
            "test_more.py::TestConcurrentTee::test_concurrent_consumers",
            "test_more.py::ExtractTests::test_all_orderings",
            "test_more.py::TestSerialize::test_concurrent_calls",
            "test_more.py::TestRandomOrderedRange::test_lcg_mitigation")],
        []),
    "attrs": (
        "attr,attrs", {"attr._make": 100, "attr.validators": 40, "attr.converters": 5,
                       "attr._funcs": 5},
        # the hypothesis-driven files (test_make's and test_funcs': 80% of the time)
        ["--ignore=tests/test_make.py", "--ignore=tests/test_funcs.py",
         "--ignore=tests/test_3rd_party.py"],
        ["--hypothesis-seed=0", "-p", "soak_hypothesis",
         *(f"--deselect={t}" for t in ATTRS_PLAIN_FAILS)]),
}


# hypothesis' deadline (attrs' conftest: 400 ms an example) is a timing check,
# not a behavioural one: off in both runs (a busy CI machine missed it once,
# vaccinated code being slower); loaded after attrs' own profile
HYPOTHESIS_PLUGIN = """
import pytest


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    from hypothesis import settings

    settings.register_profile("daifu-soak", parent=settings.default, deadline=None)
    settings.load_profile("daifu-soak")
"""


def _summary(stdout: str) -> str:
    """pytest's last line less its time: '757 passed, 8 deselected, 3824 subtests passed'."""
    lines = [line for line in stdout.splitlines() if re.search(r"\d+ (passed|failed)", line)]
    return re.sub(r" in [\d.]+s.*$", "", lines[-1].strip("= ")) if lines else ""


@pytest.mark.parametrize("name", list(SDIST_SUITES))
def test_sdist_suite_passes_vaccinated(tmp_path, name):
    from .sdists import SdistError, unpacked

    modules, expected, slice_options, options = SDIST_SUITES[name]
    try:
        sdist = unpacked(name)
    except SdistError as exc:
        pytest.fail(f"the tests of {name} are not here: {exc}")
    # (--deselect takes node ids of the rootdir, the sdist; --ignore paths;
    # the runs' own files -- .hypothesis/ -- go to tmp_path)
    chosen = [*options, *([] if FULL else slice_options)]
    args = ["-m", "pytest", str(sdist / "tests"), "--rootdir", str(sdist), "-q",
            "-p", "no:cacheprovider", "-x",
            *(o.replace("=tests/", f"={sdist}/tests/") if o.startswith("--ignore") else o
              for o in chosen)]
    (tmp_path / "soak_hypothesis.py").write_text(HYPOTHESIS_PLUGIN)  # (cwd: on sys.path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAIFU_")}
    timeout = 1800 if FULL else 600
    plain = subprocess.run([sys.executable, *args], cwd=tmp_path, capture_output=True, text=True,
                           timeout=timeout, env=env)
    assert plain.returncode == 0, "plain run fails:\n" + plain.stdout[-3000:] + plain.stderr[-3000:]
    log = tmp_path / "events.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "daifu", "--modules", modules, "--entry", "**", "--log", str(log),
         "--log-level", "debug", *args],
        cwd=tmp_path, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert _summary(proc.stdout) == _summary(plain.stdout) != "", (plain.stdout[-500:],
                                                                  proc.stdout[-500:])
    print(f"{name} ({'whole' if FULL else 'slice'}): {_summary(proc.stdout)}")  # (pytest -s)
    passed = int(re.search(r"(\d+) passed", _summary(proc.stdout)).group(1))
    assert passed >= (700 if name == "more-itertools" else 1000)
    events = read_events(log)
    vaccinated = {e["module"]: len(e["functions"]) for e in events
                  if e["event"] == "module.vaccinated"}
    too_few = {m: vaccinated.get(m, 0) for m, n in expected.items() if vaccinated.get(m, 0) < n}
    assert not too_few, f"functions vaccinated: {vaccinated}"
    assert not [s for e in events if e["event"] == "module.vaccinated" for s in e["skipped"]]
    assert not [e for e in events if e["event"] == "daifu.internal_error"]
