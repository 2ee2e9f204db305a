"""Language model: from epoch 1 the loss switches to label smoothing -- and is
called with (batch, seq, vocab) logits, which cross_entropy reads as
(batch, classes, ...): a shape error inside the running training loop."""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
import torch.nn.functional as F
from _common import VOCAB, TinyLM, iteration_done, lm_batches, save, setup_determinism, token_corpus


def train(model, opt, corpus, epochs):
    for epoch in range(epochs):
        for step, (x, y) in enumerate(lm_batches(corpus)):
            logits = model(x)
            if epoch == 0:
                loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
            else:
                loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1),
                                       label_smoothing=0.1)
            opt.zero_grad()
            loss.backward()
            opt.step()
            iteration_done(f"train {epoch} {step}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    args = parser.parse_args()
    setup_determinism()
    corpus = token_corpus(12_000)
    model = TinyLM()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    train(model, opt, corpus, 3)
    save(model, args.out)


if __name__ == "__main__":
    main()
