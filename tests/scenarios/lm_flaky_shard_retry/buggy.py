"""Language model fed by a shard reader over a network filesystem: one read
in the middle of epoch 1 fails with a transient I/O error (simulated: the
37th read of the run).  The read itself is idempotent -- reading the batch
again returns the same data."""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
import torch.nn.functional as F
from _common import VOCAB, TinyLM, iteration_done, lm_batches, save, setup_determinism, token_corpus


class ShardReader:
    """Random access to the batches of a tokenized shard."""

    def __init__(self, corpus, fail_at=None):
        self.batches = list(lm_batches(corpus))
        self.reads = 0
        self.fail_at = fail_at

    def __len__(self):
        return len(self.batches)

    def read_batch(self, i):
        self.reads += 1
        if self.reads == self.fail_at:  # the filesystem hiccups once
            raise OSError(f"transient read error: shard batch {i}")
        x, y = self.batches[i]
        return x.clone(), y.clone()


def train(model, opt, reader, epochs):
    for epoch in range(epochs):
        for step in range(len(reader)):
            x, y = reader.read_batch(step)
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            iteration_done(f"train {epoch} {step}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    args = parser.parse_args()
    setup_determinism()
    reader = ShardReader(token_corpus(12_000), fail_at=37)
    model = TinyLM()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    train(model, opt, reader, 3)
    save(model, args.out)


if __name__ == "__main__":
    main()
