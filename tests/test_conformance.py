"""The fast slice of ``make conformance`` (tests/conformance/, docs/conformance.md):
a fixed handful of CPython's regression test modules (exceptions, generators,
``with``, contextlib, scopes, tracing, the grammar, ...) run by libregrtest on
this interpreter, plain and with the ``test`` package vaccinated
(``--modules 'test.*' --entry '**'``), compared test case by test case.  A
difference that recurs and is not in ``tests/conformance/known_differences.toml``
fails.  About a minute on 2 cores."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_conformance_fast_slice(tmp_path):
    if importlib.util.find_spec("test.libregrtest") is None:  # pragma: no cover
        pytest.fail("CPython's test package (test.libregrtest) is not installed here")
    ver = f"{sys.version_info[0]}.{sys.version_info[1]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAIFU_")}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.conformance.run", "--slice", "fast",
         "--python", f"{ver}={sys.executable}", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
    report = proc.stdout + proc.stderr[-3000:]
    assert proc.returncode == 0, report
    summary = json.loads((tmp_path / "summary.json").read_text())
    (run,) = summary["reports"]
    assert run["python"] == ver
    assert run["modules"] >= 10 and run["tests"] > 1000, report  # (it really ran them)
    assert not run["new"], report
