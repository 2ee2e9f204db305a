"""DistributedDataParallel on gloo (CPU), hung: rank 1 never reaches its
all-reduce.

Two ranks train an MLP with dropout and momentum on a shuffled
DistributedSampler.  With ``--hang N``, rank 1 sleeps forever before the
backward pass of step N while rank 0 waits in DDP's all-reduce; daifu's
watchdog names rank 1 and its line, every rank saves, rank 0 writes the
manifest and the job ends; the program, started again with ``--resume
MANIFEST``, goes on with ``daifu.resume``."""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402
from torch.utils.data.distributed import DistributedSampler  # noqa: E402

from _common import iteration_done, save, setup_determinism  # noqa: E402

EPOCHS = 3


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out")
    p.add_argument("--resume")
    p.add_argument("--pause", type=float, default=0.0)
    p.add_argument("--hang", type=int, default=-1)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    setup_determinism()
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(256, 8, generator=g), torch.randn(256, 1, generator=g))
    sampler = DistributedSampler(data, shuffle=True, seed=3)
    loader = DataLoader(data, batch_size=16, sampler=sampler)
    model = DistributedDataParallel(
        nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    start_epoch = 0
    if args.resume:
        import daifu

        start_epoch = daifu.resume(args.resume, model=model, optimizer=opt,
                                   loader=loader)["epoch"]
    for epoch in range(start_epoch, EPOCHS):
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            if rank == 1 and epoch * len(loader) + i == args.hang:
                time.sleep(3600)  # the hang: rank 0 waits in the all-reduce below
            loss.backward()  # DDP all-reduces the gradients here
            opt.step()
            iteration_done(f"train {epoch} {i} rank {rank}")
            time.sleep(args.pause)
    if rank == 0:
        save(model.module, args.out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
