"""The first crash: from the raise to the first rule, in a job that has run
for a while (what the first crash imports was imported off its path,
``engine/_preload.py``) and, side by side, with the preload off (the
imports paid at the crash)."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import textwrap

from conftest import ASSERT, record, size

PROGRAM = '''
import time

def main():
    end = time.monotonic() + 0.6
    while time.monotonic() < end:  # a job at work (the preload runs 0.3 s after start-up here)
        [[] for _ in range(100)]
    out = []
    for i in range(3):
        t0 = time.perf_counter()
        d = 0 if i == 1 else 1
        out.append(1 / d)
    print(out)

main()
'''
FIX = '''
import time
import daifu

@daifu.on(ZeroDivisionError)
def fix(crash):
    print(f"latency {(time.perf_counter() - crash.vars['t0']) * 1e3:.3f}")
    crash.vars["d"] = 2
    return daifu.RETRY
'''


def test_first_crash_raise_to_rule(tmp_path):
    (tmp_path / "prog.py").write_text(textwrap.dedent(PROGRAM))
    (tmp_path / "fix.py").write_text(textwrap.dedent(FIX))

    def once(preload: str) -> float:
        out = subprocess.run([sys.executable, "-m", "daifu", "--fixes", "fix.py", "prog.py"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=120,
                             env={**os.environ, "DAIFU_PRELOAD": preload, "DAIFU_CONSOLE": "0"})
        assert out.returncode == 0 and "[1.0, 0.5, 1.0]" in out.stdout, out.stderr
        return float(out.stdout.split("latency ")[1].split()[0])

    warm, cold = [], []
    for _ in range(size(5, 1)):
        warm.append(once("0.3"))
        cold.append(once("0"))
    w, c = statistics.median(warm), statistics.median(cold)
    record("First crash", "raise to rule, after the preload", w, "ms", "<= 5 ms",
           f"preload off: {c:.1f} ms (the imports at the crash)")
    if ASSERT:
        assert w <= 5.0
