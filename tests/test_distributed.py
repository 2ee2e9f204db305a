"""Distributed jobs (torchrun, gloo, CPU): what daifu does per rank today."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch", reason="PyTorch not available")

from .support import assert_identical, load_params, read_events, run_daifu  # noqa: E402

pytestmark = pytest.mark.slow

TRAIN = textwrap.dedent('''
    import os, sys
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    # per rank, the loss scale of each step; a missing step is the bug
    SCALES = {{r: {{s: 1.0 for s in range(6) if (r, s) not in {bad}}} for r in range(2)}}

    def step_loss(model, x, y, rank, step):
        scale = SCALES[rank][step]
        return nn.functional.mse_loss(model(x), y) * scale

    def main():
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        torch.manual_seed(0)
        torch.set_num_threads(1)
        model = nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(rank)
        for step in range(6):
            x, y = torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)
            loss = step_loss(model, x, y, rank, step)
            opt.zero_grad()
            loss.backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= dist.get_world_size()
            opt.step()
        if rank == 0:
            torch.save(model.state_dict(), sys.argv[1])
        dist.destroy_process_group()

    main()
''')

FIX = '''
import daifu

@daifu.on(KeyError, where="step_loss")
def repair(crash):
    crash.globals["SCALES"][crash.vars["rank"]][crash.vars["step"]] = 1.0
    return daifu.RETRY
'''


def torchrun(args, cwd):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env=env)


def test_each_rank_fixed_by_a_rule_with_per_rank_logs_carrying_the_rank(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN.format(bad="{(1, 3)}"))
    (tmp_path / "fix.py").write_text(FIX)
    (tmp_path / "ref.py").write_text(TRAIN.format(bad="()"))
    ref = torchrun(["ref.py", "ref.pt"], tmp_path)
    assert ref.returncode == 0, ref.stderr[-3000:]
    # --log-file (torchrun takes --log for its own --log-dir) with one file per rank
    live = torchrun(["-m", "daifu", "--log-file", "events-{rank}.jsonl", "--log-level", "debug",
                     "--fixes", "fix.py",
                     "train.py", "live.pt"], tmp_path)
    assert live.returncode == 0, live.stderr[-3000:]
    assert_identical(load_params(tmp_path / "live.pt"), load_params(tmp_path / "ref.pt"))
    for rank in (0, 1):
        events = read_events(tmp_path / f"events-{rank}.jsonl")
        assert events and all(e["rank"] == rank and e["world_size"] == 2 and e["local_rank"]
                              == rank and e["job"] for e in events)
    crashes = [e for e in read_events(tmp_path / "events-1.jsonl")
               if e["event"] == "crash.intercepted"]
    assert [c["function"] for c in crashes] == ["step_loss"]
    assert not [e for e in read_events(tmp_path / "events-0.jsonl")
                if e["event"] == "crash.intercepted"]


def test_daifu_around_the_launcher_is_refused_with_how_to_launch(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    proc = run_daifu(["-m", "torch.distributed.run", "--nproc-per-node", "2", "train.py"],
                     cwd=tmp_path)
    assert proc.returncode == 2 and not proc.stdout
    assert "vaccinate the launcher" in proc.stderr
    assert "torchrun [torchrun options] -m daifu [daifu options] train.py" in proc.stderr
