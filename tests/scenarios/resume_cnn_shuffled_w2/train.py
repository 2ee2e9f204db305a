"""Vision CNN, resumed: a shuffled DataLoader with two workers, a Dataset
that augments with ``random`` and torch (in the workers), dropout in the
model, and a gradient-clip schedule read per step.  The buggy program's
schedule is one entry short (``--bug``): step 20 (epoch 2, batch 4), after its batch,
forward and backward drew their random numbers, raises IndexError; nobody
fixes it and daifu saves the emergency checkpoint.  Without ``--bug`` the
schedule is complete (the reference), and ``--resume PATH`` goes on with ``daifu.resume`` (the
loader with batch 4 of epoch 2's order, the RNG as at that batch's start)."""

import argparse
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
import torch.nn as nn
import torch.nn.functional as F
from _common import SmallCNN, iteration_done, mnist_like, save, setup_determinism
from torch.utils.data import DataLoader, Dataset

CLIP = [1.0, 0.5, 0.25]  # max grad norm, per 10 steps


class Augmented(Dataset):
    def __init__(self):
        self.images = mnist_like(96, seed=5)

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        x, y = self.images[i]
        if random.random() < 0.5:
            x = x.flip(-1)
        return x + 0.1 * torch.randn_like(x), y


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.cnn = SmallCNN()
        self.drop = nn.Dropout(0.2)

    def forward(self, x):
        return self.cnn(self.drop(x))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out")
    p.add_argument("--resume")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--bug", action="store_true", help="the clip schedule one entry short")
    args = p.parse_args()
    clip = CLIP[:-1] if args.bug else CLIP
    setup_determinism(0)
    random.seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = DataLoader(Augmented(), batch_size=12, shuffle=True, num_workers=2)
    start_epoch, step = 0, 0
    if args.resume:
        import daifu
        position = daifu.resume(args.resume, model=model, optimizer=opt, loader=loader)
        start_epoch, step = position["epoch"], position["step"]
    for epoch in range(start_epoch, args.epochs):
        model.train()
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip[step // 10])
            opt.step()
            iteration_done(f"train {epoch} {step}")
            step += 1
    save(model, args.out)


if __name__ == "__main__":
    main()
