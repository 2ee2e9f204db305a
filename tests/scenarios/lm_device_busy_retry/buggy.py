"""Language model on a shared accelerator: in the middle of epoch 1 another
job grabs the device for a moment (simulated: it holds a lock file for
0.25 s).  Moving the next batch to the device fails with "device busy"."""

import argparse
import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
import torch.nn.functional as F
from _common import VOCAB, TinyLM, iteration_done, lm_batches, save, setup_determinism, token_corpus

DEVICE = torch.device("cpu")
LOCK = "device.lock"


def other_job_grabs_device(seconds):
    """Another process takes the device; it lets go after ``seconds``."""
    with open(LOCK, "w") as fh:
        fh.write("held by another job\n")
    threading.Timer(seconds, os.remove, args=(LOCK,)).start()


def to_device(x, y):
    if os.path.exists(LOCK):
        raise RuntimeError(f"device busy: {DEVICE} is held by another process ({LOCK})")
    return x.to(DEVICE), y.to(DEVICE)


def train(model, opt, corpus, epochs):
    for epoch in range(epochs):
        for step, (x, y) in enumerate(lm_batches(corpus)):
            if epoch == 1 and step == 9:
                other_job_grabs_device(0.25)
            x, y = to_device(x, y)
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
    corpus = token_corpus(12_000)
    model = TinyLM()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    train(model, opt, corpus, 3)
    save(model, args.out)


if __name__ == "__main__":
    main()
