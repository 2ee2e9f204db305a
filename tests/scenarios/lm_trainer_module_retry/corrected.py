"""A two-file project: this script and trainer.py beside it, which holds the
training loop.  One read in the middle of epoch 1 fails with a transient
I/O error (simulated: the 37th read); reading the batch again returns the
same data.  With default settings daifu vaccinates the project -- the
modules under the script's directory -- so the crash is taken inside
Trainer.run, and a retry re-reads that one batch (only the script
vaccinated, it was taken at `trainer.run(3)`: a retry there would train
from the start again)."""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
from _common import TinyLM, lm_batches, save, setup_determinism, token_corpus
from trainer import Trainer


class ShardReader:
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


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    args = parser.parse_args()
    setup_determinism()
    model = TinyLM()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    trainer = Trainer(model, opt, ShardReader(token_corpus(12_000)))
    trainer.run(3)
    save(model, args.out)


if __name__ == "__main__":
    main()
