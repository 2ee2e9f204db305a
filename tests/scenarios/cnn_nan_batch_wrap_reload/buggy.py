"""Vision CNN: each epoch streams a fresh shard of data; shard 1 holds a
corrupted record (NaN pixels), so one batch of epoch 1 gives a non-finite
loss.  The training loop guards the update: it raises FloatingPointError
before a NaN can reach the weights."""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
import torch.nn.functional as F
from _common import SmallCNN, iteration_done, mnist_like, save, setup_determinism
from torch.utils.data import DataLoader

CORRUPT_SHARD, CORRUPT_RECORD = 1, 54


def load_shard(k):
    shard = mnist_like(256, seed=10 + k)
    if k == CORRUPT_SHARD:
        shard.images[CORRUPT_RECORD, 0, 5:9] = float("nan")
    return shard


def train_epoch(model, loader, opt, epoch):
    model.train()
    for step, (x, y) in enumerate(loader):
        loss = F.cross_entropy(model(x), y)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"non-finite loss {loss.item()} at epoch {epoch} step {step}")
        opt.zero_grad()
        loss.backward()
        opt.step()
        iteration_done(f"train {epoch} {step}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    args = parser.parse_args()
    setup_determinism()
    model = SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for epoch in range(3):
        loader = DataLoader(load_shard(epoch), batch_size=32, shuffle=True,
                            generator=torch.Generator().manual_seed(epoch))
        train_epoch(model, loader, opt, epoch)
        iteration_done(f"epoch {epoch}")
    save(model, args.out)


if __name__ == "__main__":
    main()
