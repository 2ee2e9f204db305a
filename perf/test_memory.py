"""Peak memory (RSS) of a training run: plain, with daifu imported, vaccinated."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ASSERT, record

pytest.importorskip("torch", reason="PyTorch not available")

HERE = Path(__file__).resolve().parent
REPORT = ("import atexit, resource, sys\n"
          "atexit.register(lambda: sys.stderr.write("
          "'RSS %d\\n' % resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))\n")


def _peak(args, cwd) -> int:
    proc = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return int(proc.stderr.rsplit("RSS ", 1)[1].split()[0])  # KiB


def test_peak_rss(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(REPORT + (HERE / "restore_workload.py").read_text())
    plain = _peak([str(script)], tmp_path)
    imported = _peak(["-c", "import daifu, runpy, sys; sys.argv=['train.py'];"
                      "runpy.run_path('train.py', run_name='__main__')"], tmp_path)
    vaccinated = _peak(["-m", "daifu", "--no-console", str(script)], tmp_path)
    record("Memory (peak RSS, training run)", "plain python", plain / 1024, "MiB")
    record("Memory (peak RSS, training run)", "daifu imported, nothing vaccinated",
           imported / 1024, "MiB", "", f"{(imported - plain) / 1024:+.1f} MiB: daifu's modules")
    record("Memory (peak RSS, training run)", "python -m daifu (script vaccinated)",
           vaccinated / 1024, "MiB", "no difference beyond code objects",
           f"{(vaccinated - imported) / 1024:+.1f} MiB vs daifu imported")
    if ASSERT:
        assert vaccinated - imported < 8 * 1024  # KiB: code objects and the engine, not data
