"""Workload for the restore-time comparison (perf/test_restore.py).

A CNN trained for a few epochs on MNIST-shaped data; at global step CRASH_AT
a transient failure raises inside the training step (``--flaky``).

  --flaky                  fail once at CRASH_AT (the buggy program)
  --ckpt-every N           save model+optimizer+RNG every N steps (checkpoint-retry)
  --resume                 start from the latest checkpoint
  --times FILE             append "<event> <perf_counter>" lines (probes)
Iteration ends are written to $DAIFU_BENCH_LOG as "step <k>\t<wall clock>".
"""

import argparse
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

CRASH_AT = 60
STEPS_PER_EPOCH = 32
EPOCHS = 3
_LOG = os.environ.get("DAIFU_BENCH_LOG")
TIMES = None


def probe(event):
    if TIMES:
        with open(TIMES, "a") as fh:
            fh.write(f"{event} {time.perf_counter():.9f} {time.time():.6f}\n")
    return event


def iteration_done(step):
    if _LOG:
        with open(_LOG, "a") as fh:
            fh.write(f"step {step}\t{time.time():.6f}\n")


class Flaky:
    """A transient failure: raises once at CRASH_AT."""

    def __init__(self, enabled):
        self.enabled = enabled

    def check(self, step, _probe=None):
        if self.enabled and step == CRASH_AT:
            self.enabled = False
            probe("raise")
            raise RuntimeError("transient failure in the training step")
        return step


def model_and_data():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    images = torch.randn(STEPS_PER_EPOCH * 32, 1, 28, 28, generator=g)
    labels = torch.randint(0, 10, (STEPS_PER_EPOCH * 32,), generator=g)
    model = nn.Sequential(nn.Conv2d(1, 8, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                          nn.Linear(8 * 13 * 13, 10))
    return model, images, labels


def main():
    global TIMES
    parser = argparse.ArgumentParser()
    parser.add_argument("--flaky", action="store_true")
    parser.add_argument("--ckpt-every", type=int, default=0)
    parser.add_argument("--ckpt-dir", default="ckpt")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--times")
    args = parser.parse_args()
    TIMES = args.times
    torch.set_num_threads(1)
    model, images, labels = model_and_data()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    flaky = Flaky(args.flaky)
    start = 0
    if args.resume:
        names = sorted(os.listdir(args.ckpt_dir), key=lambda n: int(n.split(".")[0]))
        state = torch.load(os.path.join(args.ckpt_dir, names[-1]), weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        torch.set_rng_state(state["rng"])
        start = state["step"] + 1
    step = 0
    for epoch in range(EPOCHS):
        for i in range(STEPS_PER_EPOCH):
            step = epoch * STEPS_PER_EPOCH + i
            if step < start:
                continue
            x, y = images[i * 32:(i + 1) * 32], labels[i * 32:(i + 1) * 32]
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            flaky.check(step, probe("statement"))
            opt.step()
            if args.ckpt_every and step % args.ckpt_every == 0:
                os.makedirs(args.ckpt_dir, exist_ok=True)
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                            "rng": torch.get_rng_state(), "step": step},
                           os.path.join(args.ckpt_dir, f"{step}.pt"))
            iteration_done(step)
    torch.save(model.state_dict(), "final.pt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
