"""A soak of CPython's own test suite: each module's tests run with the test
module itself vaccinated (every function, ``--entry '**'``; or with default
settings, for the debugger, tracer and scoping tests), under
``python -m daifu`` (through ``cpython_tier.py``: ``unittest`` minus the tests
that inspect daifu's own bytecode, each listed with its reason).  They
exercise exceptions, ``with``, ``contextlib``,
generators, ``match`` and the grammar as CPython's developers test them;
vaccinated code must behave exactly like the original."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

MODULES = ["test_exceptions", "test_with", "test_contextlib", "test_generators",
           "test_patma", "test_grammar"]


#: the tests of tools that look at frames (debuggers, tracers) and of
#: scoping, run with default settings: every function of the test module is
#: vaccinated at import and must be invisible to them
DEFAULT_SETTINGS = ["test_bdb", "test_sys_settrace", "test_trace", "test_pdb", "test_scope",
                    "test_exceptions", "test_generators", "test_with", "test_contextlib"]


@pytest.mark.slow
@pytest.mark.parametrize("name,entry", [(m, "**") for m in MODULES]
                         + [(m, None) for m in DEFAULT_SETTINGS],
                         ids=[f"{m}-all" for m in MODULES] + [f"{m}-defaults"
                                                             for m in DEFAULT_SETTINGS])
def test_cpython_lib_test_passes_vaccinated(name, entry, tmp_path):
    if importlib.util.find_spec(f"test.{name}") is None:  # pragma: no cover
        pytest.fail(f"CPython's test.{name} is not installed with this interpreter")
    env = {**os.environ, "DAIFU_CONSOLE": "0", "PYTHONWARNINGS": "ignore::DeprecationWarning"}
    env.pop("DAIFU_LAZY", None)
    proc = subprocess.run(
        [sys.executable, "-m", "daifu", "--modules", f"test.{name}",
         *(["--entry", entry] if entry else []),
         "--log", str(tmp_path / "events.jsonl"), "--log-level", "debug",
         str(Path(__file__).with_name("cpython_tier.py")), f"test.{name}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=900, env=env)
    tail = proc.stderr[-4000:]
    assert proc.returncode == 0, tail
    assert "\nOK" in proc.stderr, tail
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert not [e for e in events if e["event"] == "daifu.internal_error"]
    mine = [e for e in events
            if e["event"] == "module.vaccinated" and e["module"] == f"test.{name}"]
    assert mine and len(mine[0]["functions"]) > 20, "the test module was not vaccinated"
