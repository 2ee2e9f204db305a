"""Shared machinery of the performance harness.

* ``interleaved(a, b)`` times two callables alternately (ABBA order) in one
  process and returns the median-based ratio -- the comparison these noisy,
  shared machines allow.  pytest-benchmark reports each variant as well.
* Targets are asserted only when ``DAIFU_PERF_ASSERT=1`` (``make bench``);
  the CI smoke run (``--benchmark-disable``) checks that the harness works.
* Every number goes into ``RESULTS``, with the test that measured it; with
  ``DAIFU_PERF_REPORT=FILE`` the session rewrites the results table in that
  Markdown file however the run ends: the rows with a target of a test that
  failed (a target missed) are marked, and the table's first line names
  those tests.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

RESULTS: list[dict] = []
#: the test running now (its rows are marked if it fails), and the failed ones
_CURRENT: list[str] = [""]
FAILED: dict[str, str] = {}
ASSERT = os.environ.get("DAIFU_PERF_ASSERT") == "1"
FULL = ASSERT or os.environ.get("DAIFU_PERF_FULL") == "1"


def size(full, smoke):
    """Workload size: full for `make bench`, tiny for the smoke run."""
    return full if FULL else smoke


def record(section: str, name: str, value, unit: str, target: str = "", note: str = "") -> None:
    RESULTS.append({"section": section, "name": name, "value": value, "unit": unit,
                    "target": target, "note": note, "test": _CURRENT[0]})


def interleaved(plain, vaccinated, rounds: int) -> tuple[float, float, float]:
    """Median seconds of each, alternating ABBA; returns (plain, vacc, overhead)."""
    a: list[float] = []
    b: list[float] = []
    plain()
    vaccinated()  # warm-up (quickening, caches)
    for r in range(rounds):
        order = ((plain, a), (vaccinated, b)) if r % 2 == 0 else ((vaccinated, b), (plain, a))
        for fn, acc in order:
            t0 = time.perf_counter()
            fn()
            acc.append(time.perf_counter() - t0)
    pa, pb = statistics.median(a), statistics.median(b)
    return pa, pb, pb / pa - 1.0


def fresh(module: str, function: str, *args):
    """``module.function(*args)`` (its result JSON) in a new interpreter: for
    the measurements of work done in this process (the transform) that the
    state earlier tests leave behind (a heap of torch, threads, imported
    modules) slows by more than their targets allow -- each passes alone."""
    import subprocess

    code = (f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
            f"import {module}; print(json.dumps({module}.{function}(*json.loads(sys.argv[1]))))")
    out = subprocess.run([sys.executable, "-c", code, json.dumps(args)], capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


_VERSION = f"{sys.version_info[0]}.{sys.version_info[1]}"
#: each Python version's results go between its own markers in the report
TABLE_START = f"<!-- perf-table:start {_VERSION} -->"
TABLE_END = f"<!-- perf-table:end {_VERSION} -->"


def _render() -> str:
    lines = [f"Measured {time.strftime('%Y-%m-%d')} on {platform.machine()}, "
             f"{os.cpu_count()} cores, Python {platform.python_version()}.", ""]
    if FAILED:
        lines += [f"**{len(FAILED)} test(s) failed in this run; their rows are marked "
                  "MISSED:** " + "; ".join(f"`{t}` ({why})" for t, why in FAILED.items()), ""]
    section = None
    for row in RESULTS:
        if row["section"] != section:
            section = row["section"]
            lines += ["", f"**{section}**", "", "| measurement | value | target | note |",
                      "|---|---:|---|---|"]
        value = row["value"]
        shown = f"{value:+.2%}" if row["unit"] == "ratio" else (
            f"{value:.3g} {row['unit']}" if isinstance(value, float) else f"{value} {row['unit']}")
        note = row["note"]
        if row["test"] in FAILED and row["target"]:  # (a row without a target missed nothing)
            note = f"**MISSED** {note}".rstrip()
        lines.append(f"| {row['name']} | {shown} | {row['target']} | {note} |")
    return "\n".join(lines)


def pytest_runtest_setup(item):
    _CURRENT[0] = item.nodeid.split("::", 1)[-1]


def pytest_runtest_logreport(report):
    if report.failed:
        test = report.nodeid.split("::", 1)[-1]
        crash = getattr(report.longrepr, "reprcrash", None)
        message = crash.message if crash is not None else report.outcome
        FAILED.setdefault(test, " ".join(message.split())[:120])


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if RESULTS:
        terminalreporter.write_sep("=", "daifu performance")
        terminalreporter.write_line(_render())


def pytest_configure(config):
    # journals of the jobs the harness starts stay out of $HOME
    state = tempfile.mkdtemp(prefix="daifu-perf-state-")
    config.add_cleanup(lambda: shutil.rmtree(state, ignore_errors=True))
    os.environ["XDG_STATE_HOME"] = state


def pytest_sessionfinish(session, exitstatus):
    if not RESULTS:
        return
    out = os.environ.get("DAIFU_PERF_JSON")
    if out:
        Path(out).write_text(json.dumps(RESULTS, indent=1))
    report = os.environ.get("DAIFU_PERF_REPORT")
    if report:  # (however the asserts ended: a missed target is marked, not hidden)
        doc = Path(report)
        text = doc.read_text()
        if TABLE_START not in text:  # a version measured for the first time: a new section
            text += (f"\n\n### CPython {_VERSION}\n\n{TABLE_START}\n{TABLE_END}\n")
        start = text.index(TABLE_START) + len(TABLE_START)
        end = text.index(TABLE_END)
        doc.write_text(text[:start] + "\n" + _render() + "\n" + text[end:])
