"""Language model: the validation split is written to data/val.pt up front,
and validation starts at epoch 1 -- loading it from a mistyped directory
(dta/).  FileNotFoundError at the start of epoch 1; fixed from the console."""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
import torch.nn.functional as F
from _common import VOCAB, TinyLM, iteration_done, lm_batches, save, setup_determinism, token_corpus


def write_split(tokens, path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.save(tokens, path)


def evaluate(model, val, epoch):
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for i, (x, y) in enumerate(lm_batches(val)):
            logits = model(x)
            total += F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1),
                                     reduction="sum").item()
            count += y.numel()
            iteration_done(f"eval {epoch} {i}")
    model.train()
    return total / count


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    args = parser.parse_args()
    setup_determinism()
    corpus = token_corpus(12_000)
    write_split(token_corpus(2_100, seed=4), os.path.join("data", "val.pt"))
    model = TinyLM()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=0,
                                                       threshold=0.1)
    val_path = os.path.join("dta", "val.pt")
    val = None
    for epoch in range(3):
        if epoch >= 1:
            if val is None:
                val = torch.load(val_path, weights_only=True)
            sched.step(evaluate(model, val, epoch))
        for step, (x, y) in enumerate(lm_batches(corpus)):
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            iteration_done(f"train {epoch} {step}")
    save(model, args.out)


if __name__ == "__main__":
    main()
