"""Restore time, three ways, on one workload and one crash point:

* in situ: daifu, a rule retries (broken into detection, patch, resume);
* restart from scratch: a fresh process of the corrected program, up to the
  end of the crashing iteration;
* checkpoint-retry: the same program saving checkpoints every N steps; after
  the crash, a fresh process loads the last one and replays to the crash point.

Plus the engine's own latency: from "patch available" (the rule returned) to
the first instruction of the retried statement.  Target: under 1 ms.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ASSERT, FULL, record

pytest.importorskip("torch", reason="PyTorch not available")

HERE = Path(__file__).resolve().parent
CRASH_AT = 60
CKPT_EVERY = 25


def _run(args, cwd: Path, tag: str) -> tuple[subprocess.CompletedProcess, float, dict, dict]:
    log = cwd / f"{tag}.iter"
    times = cwd / f"{tag}.times"
    for f in (log, times):
        if f.exists():
            f.unlink()
    env = dict(os.environ, DAIFU_BENCH_LOG=str(log), PYTHONHASHSEED="0")
    launched = time.time()
    proc = subprocess.run([sys.executable, *args, "--times", str(times)], cwd=cwd,
                          capture_output=True, text=True, timeout=600, env=env)
    steps = {}
    if log.exists():
        for line in log.read_text().splitlines():
            tag_, _, stamp = line.rpartition("\t")
            steps[int(tag_.split()[1])] = float(stamp)
    probes: dict[str, list[tuple[float, float]]] = {}
    if times.exists():
        for line in times.read_text().splitlines():
            event, perf, wall = line.split()
            probes.setdefault(event, []).append((float(perf), float(wall)))
    return proc, launched, steps, probes


def _once(work: Path) -> dict:
    shutil.copy(HERE / "restore_workload.py", work / "restore_workload.py")
    shutil.copy(HERE / "restore_fix.py", work / "restore_fix.py")
    out = {}
    # in situ
    proc, _, steps, probes = _run(["-m", "daifu", "--no-console", "--log", "events.jsonl",
                                   "--fixes", "restore_fix.py", "restore_workload.py",
                                   "--flaky"], work, "insitu")
    assert proc.returncode == 0, proc.stderr[-2000:]
    raise_perf, raise_wall = probes["raise"][0]
    rule = probes["rule"][0][0]
    patched = probes["patched"][0][0]
    resumed = [p for p, _ in probes["statement"] if p > patched][0]
    out["insitu"] = steps[CRASH_AT] - raise_wall
    out["detection"] = rule - raise_perf
    out["patch"] = patched - rule
    out["engine"] = resumed - patched
    # restart from scratch
    proc, launched, steps, _ = _run(["restore_workload.py"], work, "restart")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out["restart"] = steps[CRASH_AT] - launched
    # checkpoint-retry
    shutil.rmtree(work / "ckpt", ignore_errors=True)
    proc, _, _, _ = _run(["restore_workload.py", "--flaky", "--ckpt-every", str(CKPT_EVERY)],
                         work, "ckpt-crash")
    assert proc.returncode == 1 and "transient failure" in proc.stderr
    proc, launched, steps, _ = _run(["restore_workload.py", "--resume", "--ckpt-every",
                                     str(CKPT_EVERY)], work, "ckpt-resume")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out["checkpoint"] = steps[CRASH_AT] - launched
    return out


def test_restore_time_three_ways(tmp_path):
    runs = [_once(tmp_path) for _ in range(3 if FULL else 1)]
    m = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    section = f"Restore time (crash at step {CRASH_AT}; median of {len(runs)})"
    record(section, "in situ (daifu, rule retries): exception -> end of the crashing iteration",
           m["insitu"] * 1e3, "ms")
    record(section, "  detection: exception -> rule called", m["detection"] * 1e3, "ms")
    record(section, "  patch: rule's own work", m["patch"] * 1e3, "ms")
    record(section, "  engine latency: patch available -> retried statement starts",
           m["engine"] * 1e3, "ms", "< 1 ms")
    record(section, "restart from scratch: launch -> end of the same iteration", m["restart"],
           "s")
    record(section, f"checkpoint-retry (every {CKPT_EVERY} steps): launch -> same iteration",
           m["checkpoint"], "s")
    record(section, "speed-up vs restart", round(m["restart"] / m["insitu"]), "x")
    record(section, "speed-up vs checkpoint-retry", round(m["checkpoint"] / m["insitu"]), "x")
    if ASSERT:
        assert m["engine"] < 0.001
        assert m["insitu"] < m["checkpoint"] < m["restart"] * 1.5
