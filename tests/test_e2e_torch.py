"""End to end: ``python -m daifu`` on real PyTorch training scripts (CPU)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from .support import assert_identical, load_params, read_events

torch = pytest.importorskip("torch", reason="PyTorch not available")

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "examples" / "mnist"
pytestmark = pytest.mark.slow


def run(args, cwd, env=None, timeout=300):
    full_env = dict(os.environ, PYTHONHASHSEED="0", **(env or {}))
    full_env.pop("DAIFU_MODULES", None)
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=full_env)


def corrected_demo(tmp: Path) -> Path:
    """The demo script with its bug fixed (what a restart would run)."""
    source = (DEMO / "train.py").read_text()
    buggy = "    return model(data.flatten(1))  # BUG: the CNN wants (N, 1, 28, 28) images\n"
    assert buggy in source
    fixed = tmp / "train_fixed.py"
    fixed.write_text(source.replace(buggy, "    return model(data)\n"))
    return fixed


@pytest.mark.parametrize("how", [[], ["--no-arm"]], ids=["armed", "rewritten-at-import"])
def test_demo_crash_in_epoch_2_recovered_bit_identical(tmp_path, how):
    # (armed, the default: each function rewritten in full at its first crash;
    # --no-arm: every function rewritten at import)
    # uninterrupted run of the corrected program (checkpoint directory exists)
    ref_dir = tmp_path / "ref"
    (ref_dir / "ckpt").mkdir(parents=True)
    fixed = corrected_demo(tmp_path)
    ref = run([str(fixed), "--ckpt-dir", "ckpt", "--out", "final.pt"], cwd=ref_dir)
    assert ref.returncode == 0, ref.stderr

    # the buggy program under daifu: both crashes repaired in the live process
    live_dir = tmp_path / "live"
    live_dir.mkdir()
    log = tmp_path / "events.jsonl"
    live = run(["-m", "daifu", *how, "--fixes", str(DEMO / "fixes.py"), "--log", str(log),
                str(DEMO / "train.py"), "--ckpt-dir", "ckpt", "--out", "final.pt"], cwd=live_dir)
    assert live.returncode == 0, live.stderr
    assert "[fix] replaced predict()" in live.stdout
    assert "[fix] created ckpt" in live.stdout
    assert (live_dir / "ckpt" / "epoch2.pt").exists()

    assert_identical(load_params(live_dir / "final.pt"), load_params(ref_dir / "final.pt"))
    assert live.stdout.splitlines()[-1] == ref.stdout.splitlines()[-1]  # same checksum line

    evs = read_events(log)
    crashes = [e for e in evs if e["event"] == "crash.intercepted"]
    # the first crash is taken where it is raised (Net.forward), passed up by
    # the frames no rule fixes, and fixed in evaluate, where the rule is: one
    # exception, one report -- its outcome says where it was taken and which
    # frames it passed through (crash.passed is a debug line)
    assert [(c["function"], c["statement"]) for c in crashes] == [
        ("Net.forward", "x = F.max_pool2d(F.relu(self.conv1(x)), 2)"),
        ("main", "torch.save(model.state_dict(), ckpt_path)"),
    ]
    assert not [e for e in evs if e["event"] == "crash.passed"]
    resumed = [e for e in evs if e["event"] == "crash.resumed"]
    assert [e["action"] for e in resumed] == ["retry", "retry"]
    assert [p.rsplit(" ", 1)[1] for p in resumed[0]["passed_through"]] == [
        "(Net.forward)", "(predict)"]
    assert resumed[1]["passed_through"] == []
    assert not [e for e in evs if e["event"] == "crash.gave_up"]


def test_without_a_fix_the_crash_is_exactly_as_without_daifu(tmp_path):
    plain = run([str(DEMO / "train.py"), "--ckpt-dir", "ckpt"], cwd=tmp_path)
    log = tmp_path / "events.jsonl"
    under = run(["-m", "daifu", "--log", str(log), str(DEMO / "train.py"), "--ckpt-dir",
                 "ckpt"], cwd=tmp_path)
    assert plain.returncode == under.returncode == 1
    assert under.stdout == plain.stdout
    assert under.stderr == plain.stderr  # the whole traceback, byte for byte
    assert plain.stderr.rstrip().splitlines()[-1].startswith("RuntimeError: Expected 3D")
    gave_up = [e for e in read_events(log) if e["event"] == "crash.gave_up"]
    assert len(gave_up) == 1 and gave_up[0]["reason"].startswith("no fix available")


MODULE_LEVEL = '''
import os, sys
import torch
import torch.nn as nn

torch.manual_seed(0)
torch.set_num_threads(1)
g = torch.Generator().manual_seed(3)
X = torch.randn(256, 20, generator=g)
Y = (X[:, :5].sum(1, keepdim=True) > 0).float()
model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
log_dir = sys.argv[1]

for epoch in range(4):
    perm = torch.randperm(256, generator=g)
    for i in range(0, 256, 32):
        idx = perm[i:i + 32]
        loss = nn.functional.binary_cross_entropy_with_logits(model(X[idx]), Y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    with open(os.path.join(log_dir, f"epoch{epoch}.txt"), "w") as fh:
        fh.write(f"{loss.item():.6f}")
torch.save(model.state_dict(), "final.pt")
'''

MODULE_FIXES = '''
import os, daifu

@daifu.on(FileNotFoundError)
def create_log_dir(crash):
    os.makedirs(crash.vars["log_dir"], exist_ok=True)
    return daifu.RETRY
'''


def test_module_level_training_loop_recovered_bit_identical(tmp_path):
    script = tmp_path / "train_flat.py"
    script.write_text(MODULE_LEVEL)
    (tmp_path / "fixes.py").write_text(MODULE_FIXES)
    ref_dir, live_dir = tmp_path / "ref", tmp_path / "live"
    (ref_dir / "logs").mkdir(parents=True)
    live_dir.mkdir()
    ref = run([str(script), "logs"], cwd=ref_dir)
    assert ref.returncode == 0, ref.stderr
    live = run(["-m", "daifu", "--fixes", str(tmp_path / "fixes.py"), str(script), "logs"],
               cwd=live_dir)
    assert live.returncode == 0, live.stderr
    assert_identical(load_params(live_dir / "final.pt"), load_params(ref_dir / "final.pt"))
    assert sorted(os.listdir(live_dir / "logs")) == [f"epoch{i}.txt" for i in range(4)]


LONG_RUN = '''
import time, torch
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(10**9):
    loss = model(torch.ones(8, 4)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    if step == 5:
        print("running", flush=True)
    time.sleep(0.001)
'''


@pytest.mark.parametrize("under_daifu", [False, True], ids=["plain", "daifu"])
def test_ctrl_c_still_stops_training(tmp_path, under_daifu):
    script = tmp_path / "long.py"
    script.write_text(LONG_RUN)
    args = ["-m", "daifu", str(script)] if under_daifu else [str(script)]
    proc = subprocess.Popen([sys.executable, *args], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "running"
        time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    # CPython exits through SIGINT after an uncaught KeyboardInterrupt
    assert proc.returncode == -signal.SIGINT
    assert err.rstrip().splitlines()[-1] == "KeyboardInterrupt"
    assert "daifu" not in err.split("Traceback", 1)[-1]


SHAPE_BUG = textwrap.dedent('''
    import torch, torch.nn as nn, torch.nn.functional as F
    torch.manual_seed(0); torch.set_num_threads(1)
    g = torch.Generator().manual_seed(5)
    train_data = [(torch.randn(16, 10, generator=g), torch.randint(0, 3, (16,), generator=g))
                  for _ in range(6)]
    # the evaluation set was stored with another layout: (N, 2, 5) instead of (N, 10)
    test_data = [(torch.randn(8, 2, 5, generator=g), torch.randint(0, 3, (8,), generator=g))
                 for _ in range(3)]
    model = nn.Linear(10, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def test(model):
        correct = 0
        for x, y in test_data:
            correct += (model(x).argmax(-1) == y).sum().item()
        return correct

    def main():
        for epoch in range(3):
            for x, y in train_data:
                loss = F.cross_entropy(model(x), y)
                opt.zero_grad(); loss.backward(); opt.step()
            if epoch >= 1:
                print("correct", test(model))
        torch.save(model.state_dict(), "final.pt")

    main()
''')


def test_shape_error_in_test_fixed_by_exec_patch(tmp_path):
    """A shape error in test() during epoch 2: a rule reshapes the batch in the
    live frame (an exec patch) and retries, for every evaluation batch."""
    buggy = tmp_path / "shape.py"
    buggy.write_text(SHAPE_BUG)
    fixed = tmp_path / "shape_fixed.py"
    fixed.write_text(SHAPE_BUG.replace("(model(x).argmax(-1)",
                                       "(model(x.reshape(len(x), -1)).argmax(-1)"))
    fixes = tmp_path / "fixes.py"
    fixes.write_text(textwrap.dedent('''
        import daifu

        @daifu.on(RuntimeError, where="test")
        def flatten_batch(crash):
            if "cannot be multiplied" not in str(crash.exception):
                return None
            crash.exec("x = x.reshape(len(x), -1)")
            return daifu.RETRY
        '''))
    (tmp_path / "ref").mkdir()
    (tmp_path / "live").mkdir()
    ref = run([str(fixed)], cwd=tmp_path / "ref")
    log = tmp_path / "events.jsonl"
    live = run(["-m", "daifu", "--fixes", str(fixes), "--log", str(log), str(buggy)],
               cwd=tmp_path / "live")
    assert ref.returncode == 0 and live.returncode == 0, live.stderr
    assert live.stdout == ref.stdout
    assert_identical(load_params(tmp_path / "live" / "final.pt"),
                     load_params(tmp_path / "ref" / "final.pt"))
    evs = read_events(log)
    # 3 batches x 2 epochs, each fixed the same way: three in full, the rest counted
    assert sum(e["event"] == "crash.intercepted" for e in evs) == 3
    assert sum(e["event"] == "patch.applied" and e["kind"] == "exec" for e in evs) == 3
    assert [e["count"] for e in evs if e["event"] == "crash.repeated"][-1] == 6
    assert [e["recovered"] for e in evs if e["event"] == "daifu.summary"] == [6]
