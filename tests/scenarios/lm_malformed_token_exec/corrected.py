"""Language model: each epoch trains on its own shard of the corpus, and the
epoch-1 shard holds one corrupted record -- a token id past the vocabulary
(a tokenizer/encoding glitch).  Corrected: the shards are cleaned before
training, out-of-range ids clamped to the last id of the vocabulary."""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
import torch.nn.functional as F
from _common import VOCAB, TinyLM, iteration_done, lm_batches, save, setup_determinism, token_corpus

SHARD = 10_000


def load_shards():
    shards = list(token_corpus(3 * SHARD).split(SHARD))
    shards[1] = shards[1].clone()
    shards[1][3_333] = VOCAB + 7  # the corrupted record
    return [shard.clamp(max=VOCAB - 1) for shard in shards]


def train(model, opt, shards, epochs):
    for epoch in range(epochs):
        for step, (x, y) in enumerate(lm_batches(shards[epoch])):
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
    shards = load_shards()
    model = TinyLM()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    train(model, opt, shards, 3)
    save(model, args.out)


if __name__ == "__main__":
    main()
