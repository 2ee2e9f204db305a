"""Soak: someone else's test suite passes with that library vaccinated.

``toolz`` (every function, ``DAIFU_ENTRY='**'``, and the default ``'*'`` with
every other function vaccinated at its first call) and
``networkx`` (``'*'``: every function with a loop, ~1000 functions, ~5800
tests) run under ``python -m daifu -m pytest --pyargs``; toolz also a second
time with every module loaded from the code cache.
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
