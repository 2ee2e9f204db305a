"""Language model: from epoch 1 the validation loss is measured every 8 steps
and drives the learning rate (ReduceLROnPlateau).  evaluate() -- not the
training loop -- passes flattened logits with unflattened targets to
cross_entropy: a batch-size mismatch at the first evaluation.  Corrected:
the targets are flattened too."""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
import torch.nn.functional as F
from _common import VOCAB, TinyLM, iteration_done, lm_batches, save, setup_determinism, token_corpus


def evaluate(model, val, tag):
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for i, (x, y) in enumerate(lm_batches(val)):
            logits = model(x)
            total += F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1),
                                     reduction="sum").item()
            count += y.numel()
            iteration_done(f"eval {tag} {i}")
    model.train()
    return total / count


def train(model, opt, sched, corpus, val, epochs):
    for epoch in range(epochs):
        for step, (x, y) in enumerate(lm_batches(corpus)):
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            if epoch >= 1 and step % 8 == 3:
                sched.step(evaluate(model, val, f"{epoch} {step}"))
            iteration_done(f"train {epoch} {step}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    args = parser.parse_args()
    setup_determinism()
    corpus = token_corpus(12_000)
    val = token_corpus(2_100, seed=4)
    model = TinyLM()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=0,
                                                       threshold=0.1)
    train(model, opt, sched, corpus, val, 3)
    save(model, args.out)


if __name__ == "__main__":
    main()
