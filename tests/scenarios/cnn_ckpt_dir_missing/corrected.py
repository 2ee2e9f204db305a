"""Vision CNN: checkpoints go to a directory created up front (corrected)."""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
from _common import SmallCNN, iteration_done, mnist_like, save, setup_determinism, train_epoch
from torch.utils.data import DataLoader


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    args = parser.parse_args()
    setup_determinism()
    loader = DataLoader(mnist_like(512), batch_size=64, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    model = SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ckpt_dir = os.path.join("runs", "ckpt")
    os.makedirs(ckpt_dir, exist_ok=True)
    for epoch in range(3):
        train_epoch(model, loader, opt, epoch)
        if epoch >= 1:
            torch.save(model.state_dict(), os.path.join(ckpt_dir, f"epoch{epoch}.pt"))
        iteration_done(f"epoch {epoch}")
    save(model, args.out)


if __name__ == "__main__":
    main()
