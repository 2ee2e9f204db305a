"""DistributedDataParallel on gloo (CPU), one process per rank under torchrun.

The bug: the per-rank loss-scale schedule misses the steps named by --missing
(RANK:STEP,...), so ``SCALES[rank][step]`` raises KeyError -- after the step's
metric was already all-reduced across the ranks."""

import argparse
import datetime
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from _common import iteration_done, save, setup_determinism  # noqa: E402

STEPS = 8
parser = argparse.ArgumentParser()
parser.add_argument("--out")
parser.add_argument("--missing", default="")
parser.add_argument("--pg-timeout", type=float, default=60.0)
parser.add_argument("--scale-in-loop", action="store_true")  # the lookup in train(), not here
ARGS = parser.parse_args()
MISSING = {tuple(int(v) for v in item.split(":")) for item in ARGS.missing.split(",") if item}
SCALES = {r: {s: 1.0 for s in range(STEPS) if (r, s) not in MISSING}
          for r in range(int(os.environ.get("WORLD_SIZE", "2")))}


def reduced_loss(model, x, y, rank, step):
    loss = nn.functional.mse_loss(model(x), y)
    metric = loss.detach().clone()
    dist.all_reduce(metric)  # the mean loss over the ranks, for the log
    if not ARGS.scale_in_loop:
        loss = loss * SCALES[rank][step]
    return loss, metric.item() / dist.get_world_size()


def train(model, opt, rank):
    g = torch.Generator().manual_seed(100 + rank)
    for step in range(STEPS):
        x, y = torch.randn(16, 8, generator=g), torch.randn(16, 1, generator=g)
        loss, mean = reduced_loss(model, x, y, rank, step)
        if ARGS.scale_in_loop:
            scale = SCALES[rank][step]
            loss = loss * scale
        opt.zero_grad()
        loss.backward()  # DDP all-reduces the gradients here
        opt.step()
        iteration_done(f"train {step} rank {rank}")


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=ARGS.pg_timeout))
    rank = dist.get_rank()
    setup_determinism()
    model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    train(model, opt, rank)
    if rank == 0:
        save(model.module, ARGS.out)
    # DDP's objects are freed while Python still runs: left to the collection
    # at interpreter exit, the process group goes with them there, and one of
    # gloo's threads may then free a Python object -- torch 2.13 aborts
    # (SIGABRT, "terminate called without an active exception"; a few runs in
    # a hundred under load, with or without daifu)
    del model, opt
    import gc

    gc.collect()
    dist.destroy_process_group()


main()
