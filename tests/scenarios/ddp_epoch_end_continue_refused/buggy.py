"""Local SGD on gloo (CPU), one process per rank under torchrun: each rank
trains its own copy of the model, and at the end of the epoch the ranks
average their parameters (``dist.all_reduce``) -- the only collective of the
loop, run once, in its last iteration.

Each step logs the loss weighted by a per-rank schedule.  The bug: the
schedule misses the steps named by --missing (RANK:STEP,...), so
``LOG_WEIGHTS[rank][step]`` raises KeyError in the logging statement on that
rank alone -- in the first pass through the loop, before any all_reduce ran:
this rank's flight recorder has no record of the epoch-end collective yet."""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402

from _common import iteration_done, save, setup_determinism  # noqa: E402

STEPS = 8
parser = argparse.ArgumentParser()
parser.add_argument("--out")
parser.add_argument("--missing", default="")
ARGS = parser.parse_args()
MISSING = {tuple(int(v) for v in item.split(":")) for item in ARGS.missing.split(",") if item}
LOG_WEIGHTS = {r: {s: 1.0 for s in range(STEPS) if (r, s) not in MISSING}
               for r in range(int(os.environ.get("WORLD_SIZE", "2")))}


def train(model, opt, rank):
    g = torch.Generator().manual_seed(100 + rank)
    history = []
    for step in range(STEPS):
        x, y = torch.randn(16, 8, generator=g), torch.randn(16, 1, generator=g)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        history.append(loss.item() * LOG_WEIGHTS[rank][step])
        if step == STEPS - 1:  # the epoch's end: the ranks average their models
            with torch.no_grad():
                for p in model.parameters():
                    dist.all_reduce(p)
                    p /= dist.get_world_size()
        iteration_done(f"train {step} rank {rank}")
    return history


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    setup_determinism()
    torch.manual_seed(0)  # (the same starting model on every rank)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    train(model, opt, rank)
    if rank == 0:
        save(model, ARGS.out)
    del model, opt
    import gc

    gc.collect()
    dist.destroy_process_group()


main()
