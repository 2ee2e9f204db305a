"""A nanoGPT-like model trained with ``torch.compile`` (inductor): its forward
checks that the activations are finite -- a data-dependent branch, so Dynamo
compiles it as two graphs with a graph break between them.  The epoch-1 shard
holds one corrupted record, a token id past the vocabulary: the bounds check
of the compiled embedding kernel raises RuntimeError ("index out of bounds")
at run time, inside the compiled model, in the middle of epoch 1.
Corrected: the shards are cleaned before training, out-of-range ids clamped
to the last id of the vocabulary."""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
import torch.nn as nn
import torch.nn.functional as F
from _common import VOCAB, iteration_done, lm_batches, save, setup_determinism, token_corpus

SHARD = 4_000
CONTEXT, DIM, HEADS = 32, 32, 2


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))
        self.register_buffer("mask", torch.tril(torch.ones(CONTEXT, CONTEXT)).bool())

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, HEADS, C // HEADS).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (C // HEADS) ** -0.5
        att = att.masked_fill(~self.mask[:T, :T], float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, layers=2):
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, DIM), nn.Embedding(CONTEXT, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(DIM), nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, idx, targets):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        if not torch.isfinite(x).all():  # data-dependent: a graph break
            raise FloatingPointError("non-finite embeddings")
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.view(-1, VOCAB), targets.reshape(-1))


def load_shards():
    shards = list(token_corpus(2 * SHARD).split(SHARD))
    shards[1] = shards[1].clone()
    shards[1][1_300] = VOCAB + 7  # the corrupted record
    return [shard.clamp(max=VOCAB - 1) for shard in shards]


def train(model, opt, shards, epochs):
    for epoch in range(epochs):
        for step, (x, y) in enumerate(lm_batches(shards[epoch])):
            loss = model(x, y)
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
    model = TinyGPT()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    train(torch.compile(model), opt, shards, 2)
    save(model, args.out)


if __name__ == "__main__":
    main()
