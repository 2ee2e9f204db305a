"""Vision CNN: from epoch 1 the model is evaluated after every epoch (the
validation loss drives a plateau LR scheduler) through a helper; the
evaluation loop hands it the images as they are (corrected)."""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
import torch.nn.functional as F
from _common import SmallCNN, iteration_done, mnist_like, save, setup_determinism, train_epoch
from torch.utils.data import DataLoader


def predict(model, images):
    return model(images)


def evaluate(model, loader, epoch):
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for step, (x, y) in enumerate(loader):
            output = predict(model, x)
            total += F.cross_entropy(output, y, reduction="sum").item()
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
    val_loader = DataLoader(mnist_like(256, seed=2), batch_size=64)
    model = SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=0)
    for epoch in range(3):
        train_epoch(model, train_loader, opt, epoch)
        if epoch >= 1:
            sched.step(evaluate(model, val_loader, epoch))
        iteration_done(f"epoch {epoch}")
    save(model, args.out)


if __name__ == "__main__":
    main()
