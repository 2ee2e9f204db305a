"""Vision CNN: a leftover debugging line in the training loop reads a
per-step record -- deleted (corrected)."""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
import torch.nn.functional as F
from _common import SmallCNN, iteration_done, mnist_like, save, setup_determinism
from torch.utils.data import DataLoader

DEBUG = {step: f"step {step}" for step in range(12)}


def train(model, loader, opt, epochs):
    seen = 0
    for epoch in range(epochs):
        model.train()
        for step, (x, y) in enumerate(loader):
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            seen += 1
            iteration_done(f"train {epoch} {step}")
    return seen


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    args = parser.parse_args()
    setup_determinism()
    loader = DataLoader(mnist_like(512), batch_size=64, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    model = SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    train(model, loader, opt, 3)
    save(model, args.out)


if __name__ == "__main__":
    main()
