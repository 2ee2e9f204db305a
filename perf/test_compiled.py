"""Step time of a ``torch.compile``'d training loop: vaccinated vs plain.

A nanoGPT-like model whose forward has a graph break (a data-dependent check
of its activations), compiled with inductor (``make bench``; the smoke run
uses the ``eager`` backend: no C++ compile) and trained with AdamW by a loop
compiled twice from the same source, plain and vaccinated, in one process.
TorchDynamo compiles the vaccinated forward from its original code
(``daifu/cells/_dynamo.py``), so both loops run the same graphs: the same
frames are converted, the losses are bit-identical, and the step times are
the same up to noise.  (Before, the graph break made Dynamo run the whole
vaccinated forward eagerly.)
"""

from __future__ import annotations

import textwrap

import pytest
import workloads
from conftest import ASSERT, FULL, interleaved, record, size

torch = pytest.importorskip("torch", reason="PyTorch not available")

COMPILED = textwrap.dedent('''
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    VOCAB, CONTEXT, DIM, HEADS = 64, 32, 32, 2


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


    def make_data(steps, batch=16, seed=0):
        g = torch.Generator().manual_seed(seed)
        tokens = torch.randint(0, VOCAB, (steps, batch, CONTEXT + 1), generator=g)
        return [(t[:, :-1], t[:, 1:]) for t in tokens]


    def make_loop(backend, data, seed=0):
        """A compiled model and its optimizer; ``loop()`` trains one pass over ``data``."""
        torch.manual_seed(seed)
        model = TinyGPT()
        compiled = torch.compile(model, backend=backend)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)

        def loop():
            losses = []
            for x, y in data:
                loss = compiled(x, y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.detach())
            return torch.stack(losses)

        return loop
''')


def test_compiled_training_step_overhead():
    import torch._dynamo as dyn

    from daifu.cells._dynamo import trace_original

    assert trace_original()  # (what `python -m daifu` does when the program imports Dynamo)
    torch.set_num_threads(1)
    plain_code, vacc_code = workloads.compile_both(COMPILED, "compiled")
    plain, vacc = workloads.load(plain_code), workloads.load(vacc_code)
    backend = "inductor" if FULL else "eager"
    steps = size(20, 2)
    data = plain["make_data"](steps)
    frames = dyn.utils.counters["frames"]
    runs = {}
    for name, ns in (("plain", plain), ("vaccinated", vacc)):
        before = dict(frames)
        loop = ns["make_loop"](backend, data)
        losses = loop()  # (compiles: the same frames for both)
        runs[name] = (loop, losses, {k: frames[k] - before.get(k, 0) for k in frames})
    assert torch.equal(runs["plain"][1], runs["vaccinated"][1])  # bit for bit
    assert runs["plain"][2] == runs["vaccinated"][2] and runs["plain"][2]["ok"] >= 2
    p, v, overhead = interleaved(runs["plain"][0], runs["vaccinated"][0], rounds=size(31, 2))
    record("Normal-execution overhead (wall clock, interleaved medians)",
           f"torch.compile ({backend}) nanoGPT-like training step, a graph break in its "
           "forward", overhead, "ratio", "<= 1%", f"{p / steps * 1e3:.2f} ms per step plain")
    if ASSERT:
        assert overhead <= 0.01
