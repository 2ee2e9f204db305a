"""Vision CNN: from epoch 1 the model is evaluated after every epoch (the
validation loss drives a plateau LR scheduler).  One validation batch holds a
corrupt image (NaN): its loss is not finite, and the check raises -- at every
evaluation, at the same statement."""

import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
import torch.nn.functional as F
from _common import SmallCNN, iteration_done, mnist_like, save, setup_determinism, train_epoch
from torch.utils.data import DataLoader


def evaluate(model, loader, epoch):
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for step, (x, y) in enumerate(loader):
            loss = F.cross_entropy(model(x), y, reduction="sum").item()
            if not math.isfinite(loss):
                raise FloatingPointError(f"non-finite validation loss at batch {step}")
            total += loss
            count += len(y)
            iteration_done(f"eval {epoch} {step}")
    return total / count


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    args = parser.parse_args()
    setup_determinism()
    train_loader = DataLoader(mnist_like(512), batch_size=64, shuffle=True,
                              generator=torch.Generator().manual_seed(0))
    val = mnist_like(256, seed=2)
    val.images[150, 0, 3, 3] = float("nan")  # a corrupt image in batch 2
    val_loader = DataLoader(val, batch_size=64)
    model = SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=0)
    for epoch in range(4):
        train_epoch(model, train_loader, opt, epoch)
        if epoch >= 1:
            sched.step(evaluate(model, val_loader, epoch))
        iteration_done(f"epoch {epoch}")
    save(model, args.out)


if __name__ == "__main__":
    main()
