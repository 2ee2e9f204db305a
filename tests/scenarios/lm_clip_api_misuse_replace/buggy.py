"""Language model: gradient clipping is switched on from epoch 1 -- and the
helper hands clip_grad_norm_ the module instead of its parameters (TypeError:
the module is not iterable).  The bug is in clip(), not in the loop."""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
import torch.nn.functional as F
from _common import VOCAB, TinyLM, iteration_done, lm_batches, save, setup_determinism, token_corpus

MAX_NORM = 0.2


def clip(model):
    return torch.nn.utils.clip_grad_norm_(model, MAX_NORM)


def train(model, opt, corpus, epochs):
    for epoch in range(epochs):
        for step, (x, y) in enumerate(lm_batches(corpus)):
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
            opt.zero_grad()
            loss.backward()
            if epoch >= 1:
                clip(model)
            opt.step()
            iteration_done(f"train {epoch} {step}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    args = parser.parse_args()
    setup_determinism()
    corpus = token_corpus(12_000)
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    train(model, opt, corpus, 3)
    save(model, args.out)


if __name__ == "__main__":
    main()
