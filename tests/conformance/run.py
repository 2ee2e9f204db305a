"""CPython's regression suite run plain and vaccinated, compared test case by
test case (``make conformance``; docs/conformance.md).

    python -m tests.conformance.run                 # the whole suite, 3.11 and 3.13
    python -m tests.conformance.run --slice fast    # the CI slice (tests/test_conformance.py)
    python -m tests.conformance.run --python 3.13 test_with test_scope

For each interpreter, ``python -m test`` (libregrtest, through ``_regrtest.py``)
runs twice with the same options: plain, then with every worker process under
``python -m daifu --modules 'test.*' --entry '**'`` (the test modules,
``test.support`` and libregrtest's worker vaccinated, every function).  No
``-u``: the tests that need a resource (network, cpu, largefile, ...) skip as
libregrtest skips them by default.  Every test case's result (pass, fail,
error, skip, expected failure, unexpected success; failing subtests by their
own id) and every module's state and environment warnings are compared.  The
modules with a difference are run again, both sides: a difference that does not
recur on both sides is *flaky* (listed, not failed on).  Every difference that
recurs must be in ``known_differences.toml`` (with its reason) or the check
fails; entries the run no longer sees are printed, to be removed.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
DRIVER = HERE / "_regrtest.py"
KNOWN = HERE / "known_differences.toml"

#: the interpreters compared, by default (``--python VER=PATH`` overrides)
PYTHONS = {"3.11": ROOT / ".venv" / "bin" / "python",
           "3.13": ROOT / ".venv-3.13" / "bin" / "python"}

#: what daifu runs each worker with on the vaccinated side
DAIFU_ARGS = "--modules 'test.*' --entry '**'"

#: the CI slice: exceptions, generators, ``with``, scopes, tracing, the grammar;
#: about a minute per interpreter, both sides, on 2 cores
FAST = ["test_exceptions", "test_generators", "test_contextlib", "test_with", "test_grammar",
        "test_scope", "test_sys_settrace", "test_raise", "test_patma", "test_keywordonlyarg",
        "test_decorators", "test_dataclasses", "test_coroutines", "test_contextlib_async"]

#: libregrtest's options, the same on both sides (``--timeout``: a module that
#: runs longer is killed and counted TIMEOUT)
REGRTEST = ["--timeout", "600"]

#: what changes from run to run in libregrtest's warnings: addresses, id()s
_ADDRESS = re.compile(r"0x[0-9a-fA-F]+|\b\d{9,}\b")
_STR_ID = re.compile(r"^(\S+) \((\S+)\)(.*)$", re.S)


@dataclass
class Side:
    """One run of the suite: module -> (state, warnings), (module, test id) ->
    outcome (a test class imported by several modules runs in each)."""
    modules: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    tests: dict[tuple[str, str], str] = field(default_factory=dict)
    detail: dict[tuple[str, str], str] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=dict)
    why: dict[str, str] = field(default_factory=dict)
    wall: float = 0.0

    def count(self, module: str) -> int:
        return self.stats.get(module, 0)


@dataclass(frozen=True)
class Difference:
    python: str
    kind: str  # "test" | "module" | "warning"
    id: str
    plain: str
    daifu: str
    module: str
    detail: str = ""

    def line(self) -> str:
        text = f"{self.python}  {self.kind:7} {self.id}: plain={self.plain}  daifu={self.daifu}"
        return text + (f"\n        {self.detail}" if self.detail else "")


def _test_id(text: str) -> str:
    """``str(test)`` as libregrtest reports failures -> the test's ``id()``
    (``name (pkg.mod.Class.name) (i=1)`` -> ``pkg.mod.Class.name (i=1)``)."""
    m = _STR_ID.match(text)
    if m and (m.group(2).endswith("." + m.group(1)) or m.group(2) == m.group(1)):
        return m.group(2) + m.group(3)
    return text


def _first_line(text: str) -> str:
    lines = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    return lines[-1].strip()[:300] if lines else ""


def load(path: Path) -> Side:
    """The results ``_regrtest.py --results`` wrote."""
    side = Side()
    if not path.exists():
        return side
    for raw in path.read_text(encoding="utf-8").splitlines():
        rec = json.loads(raw)
        module = rec["module"]
        merged: list[str] = []  # ("  Before: ...", "  After: ..." go with their warning)
        for w in rec.get("warnings", []):
            w = _ADDRESS.sub("?", w.removeprefix(module + " "))
            if w[:1].isspace() and merged:
                merged[-1] += " | " + w.strip()
            else:
                merged.append(w)
        warnings = tuple(sorted(set(merged)))
        side.modules[module] = (rec["state"] or "NONE", warnings)
        tail = [ln.strip() for ln in rec.get("tail", []) if ln.strip()]
        if tail:  # (a worker that died or timed out: the end of its output)
            side.why[module] = " | ".join(tail[-12:])
        found: dict[str, set[str]] = {}

        def put(test_id, outcome, detail="", _found=found, _module=module):
            _found.setdefault(test_id, set()).add(outcome)
            if detail:
                side.detail.setdefault((_module, test_id), detail)

        for blob in rec.get("xml", []):
            for case in ET.fromstring(blob).iter("testcase"):
                name = case.get("name")
                if not name:  # the parent of failing subtests (listed below by their ids)
                    continue
                outcome, detail = "pass", ""
                for child in case:
                    if child.tag in ("error", "failure"):
                        outcome = "error" if child.tag == "error" else "fail"
                        detail = _first_line(child.get("message", ""))
                    elif child.tag == "skipped":
                        outcome = "skip"
                    elif child.tag == "output":
                        outcome = "xfail"
                    elif child.tag == "outcome":
                        outcome = "xpass"
                put(name, outcome, detail)
        for key, outcome in (("errors", "error"), ("failures", "fail")):
            for text, tb in rec.get(key) or []:
                test_id = _test_id(text)
                if outcome not in found.get(test_id, ()):
                    put(test_id, outcome, _first_line(tb))
        for test_id, outcomes in found.items():
            side.tests[module, test_id] = "+".join(sorted(outcomes))
        side.stats[module] = len(found)
    return side


def compare(python: str, plain: Side, daifu: Side) -> list[Difference]:
    """The differences: of a test case's outcome; of a module's environment
    warnings; of a module's state where neither of those says it (a crash, a
    timeout, a failure with no failing test case, ...)."""
    tests: list[Difference] = []
    for key in sorted(set(plain.tests) | set(daifu.tests)):
        p = plain.tests.get(key, "absent")
        d = daifu.tests.get(key, "absent")
        if p == d:
            continue
        module, test_id = key
        if "absent" in (p, d) and plain.modules.get(module, ("",))[0] != \
                daifu.modules.get(module, ("",))[0]:
            continue  # the module's own difference says it (it crashed, timed out, ...)
        detail = daifu.detail.get(key) or plain.detail.get(key, "")
        tests.append(Difference(python, "test", test_id, p, d, module, detail))
    with_tests = {d.module for d in tests}
    out: list[Difference] = []
    for module in sorted(set(plain.modules) | set(daifu.modules)):
        p_state, p_warn = plain.modules.get(module, ("ABSENT", ()))
        d_state, d_warn = daifu.modules.get(module, ("ABSENT", ()))
        warn_diff = sorted(set(p_warn) ^ set(d_warn))
        for w in warn_diff:
            out.append(Difference(python, "warning", module, "yes" if w in p_warn else "-",
                                  "yes" if w in d_warn else "-", module, w))
        ordinary = {p_state, d_state} <= {"PASSED", "ENV_CHANGED", "FAILED"}
        explained = ordinary and ((warn_diff and "FAILED" not in (p_state, d_state))
                                  or module in with_tests)
        if p_state != d_state and not explained:
            why = daifu.why.get(module) or plain.why.get(module)
            out.append(Difference(python, "module", module, p_state, d_state, module,
                                  f"test cases: {plain.count(module)} plain, "
                                  f"{daifu.count(module)} daifu" + (f"; {why}" if why else "")))
    return out + tests


def load_known(path: Path = KNOWN) -> tuple[list[dict], list[dict], list[dict]]:
    """The listed differences, flaky tests and excluded tests."""
    data = tomllib.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    known, flaky = data.get("difference", []), data.get("flaky", [])
    exclude = data.get("exclude", [])
    for entry in known + flaky + exclude:
        missing = {"id", "reason"} - set(entry)
        if missing:
            raise SystemExit(f"{path}: an entry lacks {sorted(missing)}: {entry}")
    return known, flaky, exclude


def matches(entry: dict, diff: Difference) -> bool:
    return (diff.python in entry.get("python", [diff.python])
            and entry.get("kind", diff.kind) == diff.kind
            and fnmatch.fnmatchcase(diff.id, entry["id"])
            and fnmatch.fnmatchcase(diff.plain, entry.get("plain", "*"))
            and fnmatch.fnmatchcase(diff.daifu, entry.get("daifu", "*"))
            and fnmatch.fnmatchcase(diff.detail, entry.get("detail", "*")))


def run_side(python: str, exe: Path, out: Path, name: str, tests: list[str], jobs: int,
             vaccinated: bool, log, ignore: list[str], reuse: bool = False) -> Side:
    results = out / f"{name}.jsonl"
    done = out / f"{name}.done"  # (the side ran to its end; its wall time in seconds)
    if reuse and done.exists():
        side = load(results)
        side.wall = float(done.read_text())
        log(f"[{python}] {name}: the results of the last run ({results})")
        return side
    results.unlink(missing_ok=True)
    done.unlink(missing_ok=True)
    cmd = [str(exe), str(DRIVER), "--results", str(results)]
    if vaccinated:
        cmd += ["--daifu", DAIFU_ARGS]
    ignored = [arg for pat in ignore for arg in ("--ignore", pat)]
    cmd += ["--", f"-j{jobs}", *REGRTEST, *ignored, "--junit-xml", str(out / f"{name}.xml"), *tests]
    env = {**os.environ, "DAIFU_CONSOLE": "0"}
    for var in ("DAIFU_MODULES", "DAIFU_ENTRY", "DAIFU_LAZY", "PYTHONPATH"):
        env.pop(var, None)
    log(f"[{python}] {name}: {' '.join(cmd)}  (log: {out / (name + '.log')})")
    start = time.monotonic()
    with open(out / f"{name}.log", "w", encoding="utf-8") as fh:
        subprocess.run(cmd, cwd=out, env=env, stdout=fh, stderr=subprocess.STDOUT, check=False)
    side = load(results)
    side.wall = time.monotonic() - start
    done.write_text(f"{side.wall:.1f}\n")
    log(f"[{python}] {name}: {len(side.modules)} modules, {len(side.tests)} test cases, "
        f"{side.wall / 60:.1f} min")
    return side


@dataclass
class Report:
    python: str
    plain: Side
    daifu: Side
    known: list[Difference] = field(default_factory=list)
    new: list[Difference] = field(default_factory=list)
    flaky: list[Difference] = field(default_factory=list)
    confirm_wall: float = 0.0


def check(python: str, exe: Path, out: Path, tests: list[str], jobs: int, known: list[dict],
          flaky: list[dict], exclude: list[dict], confirm: bool, log,
          reuse: bool = False) -> Report:
    out.mkdir(parents=True, exist_ok=True)
    ignore = [e["id"] for e in exclude if python in e.get("python", [python])]
    plain = run_side(python, exe, out, "plain", tests, jobs, False, log, ignore, reuse)
    daifu = run_side(python, exe, out, "daifu", tests, jobs, True, log, ignore, reuse)
    report = classify(Report(python, plain, daifu), known, flaky)
    if report.new and confirm:  # once more, both sides: does it recur?
        again = sorted({d.module for d in report.new})
        start = time.monotonic()
        jobs = min(jobs, len(again))
        run_side(python, exe, out, "plain-again", again, jobs, False, log, ignore)
        run_side(python, exe, out, "daifu-again", again, jobs, True, log, ignore)
        report.confirm_wall = time.monotonic() - start
        report = classify(report, known, flaky, out)
    return report


def classify(report: Report, known: list[dict], flaky: list[dict],
             again: Path | None = None) -> Report:
    """Sort the differences: listed, flaky (listed as flaky, or, when the modules
    that differ were run again (``plain-again``, ``daifu-again`` in *again*), not
    the same on both sides the second time), new."""
    recurring = None
    if again is not None and (again / "plain-again.jsonl").exists():
        plain2, daifu2 = load(again / "plain-again.jsonl"), load(again / "daifu-again.jsonl")
        recurring = {(d.kind, d.id, d.plain, d.daifu)
                     for d in compare(report.python, plain2, daifu2)}
        rerun = set(plain2.modules) & set(daifu2.modules)
    report.known, report.flaky, report.new = [], [], []
    for diff in compare(report.python, report.plain, report.daifu):
        if any(matches(e, diff) for e in known):
            report.known.append(diff)
        elif any(matches(e, diff) for e in flaky):
            report.flaky.append(diff)
        elif recurring is not None and diff.module in rerun and \
                (diff.kind, diff.id, diff.plain, diff.daifu) not in recurring:
            report.flaky.append(diff)
        else:
            report.new.append(diff)
    return report


def table(reports: list[Report]) -> str:
    head = ("python", "modules run", "skipped", "failing plain", "test cases compared",
            "differences", "listed", "new", "flaky", "plain min", "daifu min")
    rows = [head]
    for r in reports:
        states = [s for s, _ in r.plain.modules.values()]
        skipped = sum(s in ("SKIPPED", "RESOURCE_DENIED", "DID_NOT_RUN") for s in states)
        failing = sum(s not in ("PASSED", "ENV_CHANGED", "SKIPPED", "RESOURCE_DENIED",
                                "DID_NOT_RUN") for s in states)
        compared = len(set(r.plain.tests) | set(r.daifu.tests))
        rows.append((r.python, str(len(set(r.plain.modules) | set(r.daifu.modules)) - skipped),
                     str(skipped), str(failing), str(compared),
                     str(len(r.known) + len(r.new)), str(len(r.known)), str(len(r.new)),
                     str(len(r.flaky)), f"{r.plain.wall / 60:.1f}", f"{r.daifu.wall / 60:.1f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(c.rjust(w) if n else c.ljust(w) for n, (c, w) in
                       enumerate(zip(row, widths, strict=True))) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def stale(reports: list[Report], known: list[dict], flaky: list[dict]) -> list[dict]:
    seen = [d for r in reports for d in r.known + r.flaky]
    pythons = {r.python for r in reports}
    return [e for e in known if set(e.get("python", pythons)) & pythons
            and not e.get("racy") and not any(matches(e, d) for d in seen)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.conformance.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("tests", nargs="*", help="test modules (default: the whole suite)")
    p.add_argument("--python", action="append", metavar="VER[=PATH]",
                   help="an interpreter (3.11, 3.13, or VER=PATH; default both)")
    p.add_argument("--slice", choices=("fast",), help="the fixed CI slice instead")
    p.add_argument("-j", "--jobs", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--out", type=Path, default=ROOT / "build" / "conformance",
                   help="logs, JUnit XML and results (default build/conformance)")
    p.add_argument("--known", type=Path, default=KNOWN)
    p.add_argument("--no-confirm", action="store_true",
                   help="do not re-run the modules that differ (a difference is not "
                        "told from a flaky test then)")
    p.add_argument("--compare", action="store_true",
                   help="compare the results already in --out, run nothing")
    p.add_argument("--reuse", action="store_true",
                   help="take a side that ran to its end from the last run in --out "
                        "instead of running it again (a run cut short goes on)")
    ns = p.parse_args(argv)
    tests = FAST if ns.slice == "fast" else ns.tests
    pythons = {}
    for spec in ns.python or list(PYTHONS):
        ver, _, path = spec.partition("=")
        pythons[ver] = Path(path) if path else PYTHONS[ver]
    known, flaky, exclude = load_known(ns.known)
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # (started in the background by a shell: SIGINT ignored, and the workers would
        # inherit that; the tests that interrupt themselves, _thread.interrupt_main(),
        # would then hang)
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    start = time.monotonic()
    reports = []
    for ver, exe in pythons.items():
        out = ns.out / ver
        if ns.compare:
            plain, daifu = load(out / "plain.jsonl"), load(out / "daifu.jsonl")
            for side, name in ((plain, "plain"), (daifu, "daifu")):
                if (out / f"{name}.done").exists():
                    side.wall = float((out / f"{name}.done").read_text())
            reports.append(classify(Report(ver, plain, daifu), known, flaky, out))
            continue
        if not exe.exists():
            log(f"[{ver}] no interpreter at {exe} (make test-3.13 builds .venv-3.13)")
            return 2
        reports.append(check(ver, exe, out, tests, ns.jobs, known, flaky, exclude,
                             not ns.no_confirm, log, ns.reuse))
    wall = time.monotonic() - start
    print(table(reports))
    what = "fast slice" if ns.slice else "selected modules" if tests else "whole suite"
    print(f"\nwall time: {wall / 60:.1f} min ({what}, -j{ns.jobs})")
    for title, attr in (("differences listed in " + ns.known.name, "known"),
                        ("flaky (did not recur on both sides, or listed as flaky)", "flaky"),
                        ("NEW differences (not in " + ns.known.name + ")", "new")):
        diffs = [d for r in reports for d in getattr(r, attr)]
        if diffs:
            print(f"\n{title}: {len(diffs)}")
            for d in diffs:
                print("  " + d.line())
    if not tests and not ns.compare:
        for entry in stale(reports, known, flaky):
            print(f"\nno longer seen (remove it from {ns.known.name}): {entry['id']} "
                  f"({entry['reason'].splitlines()[0]})")
    summary = {"wall_s": round(wall, 1), "reports": [
        {"python": r.python, "modules": len(r.plain.modules), "tests": len(r.plain.tests),
         "plain_s": round(r.plain.wall, 1), "daifu_s": round(r.daifu.wall, 1),
         **{k: [d.__dict__ for d in getattr(r, k)] for k in ("known", "new", "flaky")}}
        for r in reports]}
    ns.out.mkdir(parents=True, exist_ok=True)
    (ns.out / "summary.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    return 1 if any(r.new for r in reports) or not reports else 0


if __name__ == "__main__":
    raise SystemExit(main())
