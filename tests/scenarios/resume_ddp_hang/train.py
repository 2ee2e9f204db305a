"""DistributedDataParallel on gloo (CPU), hung: rank 1 never reaches its
all-reduce.

Two ranks train an MLP with dropout and momentum on a shuffled
DistributedSampler.  With ``--hang N``, rank 1 sleeps forever before the
backward pass of step N while rank 0 waits in DDP's all-reduce; daifu's
watchdog names rank 1 and its line, every rank saves, rank 0 writes the
manifest and the job ends; the program, started again with ``--resume
MANIFEST``, goes on with ``daifu.resume``.

The ``watch_ddp_*`` cases run it with what only looks like a hang (a slow
first step, a long evaluation or a slow checkpoint write on rank 0) or with
a straggler (rank 1 slower at every step): daifu names the straggler and
lets every one of them finish, changing nothing."""

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


def evaluate(model, seconds=8.0):
    """A long evaluation on rank 0 alone (its CPU busy); draws nothing from
    the global RNG (its own generator, dropout off)."""
    g = torch.Generator().manual_seed(7)
    model.eval()
    end = time.monotonic() + seconds
    with torch.no_grad():
        while time.monotonic() < end:
            model(torch.randn(64, 8, generator=g))
    model.train()


def save_checkpoint(state, path, seconds=8.0):
    """A checkpoint written to a slow file system: little CPU, few bytes at
    a time."""
    import io

    buf = io.BytesIO()
    torch.save(state, buf)
    data, chunks = buf.getvalue(), int(seconds / 0.1)
    with open(path, "wb") as fh:
        for k in range(chunks):
            fh.write(data[k * len(data) // chunks:(k + 1) * len(data) // chunks])
            time.sleep(0.1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out")
    p.add_argument("--resume")
    p.add_argument("--pause", type=float, default=0.0)
    p.add_argument("--hang", type=int, default=-1)
    p.add_argument("--slow-first", type=float, default=0.0)  # rank 0's first step
    p.add_argument("--straggle", type=float, default=0.0)    # rank 1, every step
    p.add_argument("--evaluate-at", type=int, default=-1)    # rank 0, 8 s of CPU
    p.add_argument("--save-at", type=int, default=-1)        # rank 0, 8 s, nearly idle
    p.add_argument("--epochs", type=int, default=EPOCHS)
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
    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            step = epoch * len(loader) + i
            if rank == 1 and step == args.hang:
                time.sleep(3600)  # the hang: rank 0 waits in the all-reduce below
            if rank == 0 and step == 0 and not args.resume:
                time.sleep(args.slow_first)  # a slow first step (a warm-up, a compilation)
            loss.backward()  # DDP all-reduces the gradients here
            opt.step()
            if rank == 0 and step == args.evaluate_at:
                evaluate(model.module)
            if rank == 0 and step == args.save_at:
                save_checkpoint(model.module.state_dict(), "checkpoint.pt")
            if rank == 1:
                time.sleep(args.straggle)  # the straggler: rank 0 waits for it every step
            iteration_done(f"train {epoch} {i} rank {rank}")
            time.sleep(args.pause)
    if rank == 0:
        save(model.module, args.out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
