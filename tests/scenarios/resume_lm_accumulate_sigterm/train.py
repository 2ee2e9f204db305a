"""Language model, preempted: nanoGPT's loop -- ``while True`` around the
micro-steps of a gradient accumulation, random batches drawn from the
corpus (``torch.randint``), dropout, a cosine learning-rate schedule set by
hand each iteration, ``iter_num`` counted by the program.  The job gets
SIGTERM (a scheduler's preemption) after iteration 5; daifu lets the
current iteration finish and saves at the ``while True`` header -- never
between the micro-steps -- then the job ends as python's does on SIGTERM.
The same program, started again with ``--resume PATH``, goes on with
``daifu.resume``.  (Preempted, it runs with ``--pause``: a pause per
micro-step, so that the preemption lands while an iteration runs.)"""

import argparse
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
import torch.nn as nn
import torch.nn.functional as F
from _common import TinyLM, iteration_done, save, setup_determinism, token_corpus

BATCH, SEQ, ACCUMULATE, MAX_ITERS = 8, 24, 3, 24


class DropLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.lm = TinyLM()
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        return self.drop(self.lm(x))


def get_batch(corpus):
    ix = torch.randint(len(corpus) - SEQ - 1, (BATCH,))
    x = torch.stack([corpus[i : i + SEQ] for i in ix])
    y = torch.stack([corpus[i + 1 : i + 1 + SEQ] for i in ix])
    return x, y


def lr_at(it):
    return 3e-3 * 0.5 * (1 + math.cos(math.pi * it / MAX_ITERS))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out")
    p.add_argument("--resume")
    p.add_argument("--pause", type=float, default=0.0, help="seconds per micro-step")
    args = p.parse_args()
    setup_determinism(0)
    corpus = token_corpus(6000)
    model = DropLM()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    iter_num = 0
    if args.resume:
        import daifu
        iter_num = daifu.resume(args.resume, model=model, optimizer=opt)["iter_num"]
    while True:
        for group in opt.param_groups:
            group["lr"] = lr_at(iter_num)
        for micro_step in range(ACCUMULATE):
            x, y = get_batch(corpus)
            logits = model(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1)) / ACCUMULATE
            loss.backward()
            time.sleep(args.pause)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        iteration_done(f"train 0 {iter_num}")
        iter_num += 1
        if iter_num >= MAX_ITERS:
            break
    save(model, args.out)


if __name__ == "__main__":
    main()
