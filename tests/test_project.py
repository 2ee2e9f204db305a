"""The project is vaccinated by default, not only the script: the modules
whose file lives under the script's directory (the ``-m`` package's), never
installed or standard ones; ``--modules`` narrows or widens it, and
``--explain`` says what was vaccinated and why."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

TRAINER = """
    class Trainer:
        def __init__(self, data):
            self.data = data

        def run(self):
            total = 0
            for step, x in enumerate(self.data):
                total += 10 // x
            return total
"""

TRAIN = """
    import sys
    from mingpt.trainer import Trainer
    print(Trainer([1, 0, 5]).run())
"""

FIXES = """
    import daifu

    @daifu.on(ZeroDivisionError)
    def fix(crash):
        print("fixed in", crash.function, "at", crash.statement, file=sys.stderr)
        if "x" in crash.vars:
            crash.vars["x"] = 2
        return daifu.RETRY

    import sys
"""


def project(tmp_path: Path) -> Path:
    (tmp_path / "mingpt").mkdir()
    (tmp_path / "mingpt" / "__init__.py").write_text("")
    (tmp_path / "mingpt" / "trainer.py").write_text(textwrap.dedent(TRAINER))
    (tmp_path / "train.py").write_text(textwrap.dedent(TRAIN))
    (tmp_path / "fixes.py").write_text(textwrap.dedent(FIXES))
    return tmp_path


def daifu(args, cwd, env=None):
    return subprocess.run([sys.executable, "-m", "daifu", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120,
                          env={**os.environ, "DAIFU_CONSOLE": "0", **(env or {})})


def test_a_crash_in_a_module_beside_the_script_is_taken_where_it_happens(tmp_path):
    # (minGPT: the loop lives in mingpt/trainer.py; only the script was
    # vaccinated, so the crash was taken at `Trainer(...).run()`, and a retry
    # re-ran the whole training)
    project(tmp_path)
    got = daifu(["--fixes", "fixes.py", "train.py"], tmp_path)
    assert got.returncode == 0, got.stderr
    assert got.stdout == f"{10 + 5 + 2}\n"  # the failing step retried, nothing else again
    assert "fixed in Trainer.run at total += 10 // x" in got.stderr


def test_modules_dash_vaccinates_the_script_alone(tmp_path):
    project(tmp_path)
    got = daifu(["--modules", "-", "--fixes", "fixes.py", "--max-attempts", "1", "train.py"],
                tmp_path)
    assert "fixed in <module> at print(Trainer([1, 0, 5]).run())" in got.stderr
    assert "fixed in Trainer.run" not in got.stderr


def test_explain_says_what_is_vaccinated_and_why(tmp_path):
    project(tmp_path)
    # a virtual environment inside the project is never the project's
    venv = tmp_path / "venv" / "lib" / "site-packages" / "helper"
    venv.mkdir(parents=True)
    (venv / "__init__.py").write_text("VALUE = 1\n")
    (tmp_path / "train.py").write_text(textwrap.dedent("""
        import sys
        sys.path.append(sys.argv[1])
        import helper, json
        from mingpt.trainer import Trainer
        print(helper.VALUE)
    """))
    got = daifu(["--explain", "train.py", str(venv.parent)], tmp_path)
    assert got.returncode == 0, got.stderr
    lines = got.stderr.splitlines()
    assert lines[0].startswith("daifu: vaccinating the script train.py (__main__); the "
                               f"project's modules: those under {tmp_path.resolve()} (")
    assert f"daifu: vaccinated mingpt.trainer ({tmp_path}/mingpt/trainer.py): in the project, " \
        f"{tmp_path.resolve()}" in lines
    assert not [line for line in lines if "json" in line or "helper" in line]  # not candidates
    widened = daifu(["--explain", "--modules", "+json", "train.py", str(venv.parent)], tmp_path)
    assert any(line.startswith("daifu: vaccinated json (") and "'json'" in line
               for line in widened.stderr.splitlines())


def test_an_installed_copy_of_a_project_name_is_not_the_projects(tmp_path):
    # a name the project has (helper/) resolved to an installed package first
    project(tmp_path)
    (tmp_path / "helper").mkdir()
    (tmp_path / "helper" / "__init__.py").write_text("WHERE = 'project'\n")
    site = tmp_path / "env" / "site-packages" / "helper"
    site.mkdir(parents=True)
    (site / "__init__.py").write_text("WHERE = 'installed'\n")
    (tmp_path / "train.py").write_text(textwrap.dedent("""
        import sys
        sys.path.insert(0, sys.argv[1])
        import helper
        print(helper.WHERE)
    """))
    got = daifu(["--explain", "train.py", str(site.parent)], tmp_path)
    assert got.stdout == "installed\n", got.stderr
    assert any("not vaccinated helper" in line and "site-packages" in line
               for line in got.stderr.splitlines())


def test_dash_m_vaccinates_the_package_it_runs(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "loop.py").write_text(textwrap.dedent(TRAINER))
    (tmp_path / "pkg" / "train.py").write_text(
        "from pkg.loop import Trainer\nimport sibling\nprint(Trainer([1, 0, 5]).run())\n")
    (tmp_path / "sibling.py").write_text("X = 1\n")
    (tmp_path / "fixes.py").write_text(textwrap.dedent(FIXES))
    got = daifu(["--explain", "--fixes", "fixes.py", "-m", "pkg.train"], tmp_path)
    assert got.returncode == 0, got.stderr
    assert got.stdout == "17\n"
    assert "fixed in Trainer.run" in got.stderr
    assert f"daifu: vaccinated pkg.loop ({tmp_path}/pkg/loop.py): in the project, " \
        f"{(tmp_path / 'pkg').resolve()}" in got.stderr.splitlines()
    assert "sibling" not in got.stderr


def test_the_emergency_checkpoint_of_a_two_file_project_has_the_loops_position(tmp_path):
    # (minGPT: only `{'tnow': ...}` -- the loop lived in an unvaccinated module,
    # its frame gone by the time the crash was taken at the script's call)
    torch = pytest.importorskip("torch", reason="PyTorch not available")
    (tmp_path / "trainer.py").write_text(textwrap.dedent("""
        import torch

        def train(model, opt, epochs, bad):
            for epoch in range(epochs):
                for step in range(4):
                    x = torch.ones(2, 3) * (step + 1)
                    loss = model(x).sum() / (0 if (epoch, step) == bad else 1)
                    if not torch.isfinite(loss):
                        raise FloatingPointError(f"loss is {loss.item()}")
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
    """))
    (tmp_path / "train.py").write_text(textwrap.dedent("""
        import torch
        from trainer import train
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        train(model, opt, 3, (1, 2))
    """))
    log = tmp_path / "events.jsonl"
    got = daifu(["--log", str(log), "--checkpoint-dir", "ck", "train.py"], tmp_path)
    assert got.returncode == 1 and "FloatingPointError" in got.stderr
    from .support import read_events

    events = read_events(log)
    (crash,) = [e for e in events if e["event"] == "crash.intercepted"]
    assert (crash["function"], crash["statement"]) == ("train", "raise FloatingPointError("
                                                       "f\"loss is {loss.item()}\")")
    (saved,) = [e for e in events if e["event"] == "checkpoint.saved"]
    ck = torch.load(saved["path"], weights_only=False)
    assert (ck["position"]["epoch"], ck["position"]["step"]) == (1, 2)
    assert set(ck["modules"]) == {"model"} and set(ck["optimizers"]) == {"opt"}
