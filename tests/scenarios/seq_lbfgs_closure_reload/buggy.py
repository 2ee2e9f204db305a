"""Sequence model trained with LBFGS, written as pytorch/examples'
time_sequence_prediction is: the training loop is module-level code, and
each step defines the closure LBFGS calls.  A smoothness penalty added from
step 2 on slices the output wrongly: a RuntimeError inside the closure.
The fix is an edit of the closure; every later step's ``def closure`` must
make the corrected function."""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
import torch.nn as nn
from _common import iteration_done, save, setup_determinism


class Sequence(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTMCell(1, 16)
        self.linear = nn.Linear(16, 1)

    def forward(self, x):
        h = torch.zeros(x.size(0), 16)
        c = torch.zeros(x.size(0), 16)
        outputs = []
        for t in range(x.size(1)):
            h, c = self.lstm(x[:, t:t + 1], (h, c))
            outputs.append(self.linear(h))
        return torch.cat(outputs, dim=1)


parser = argparse.ArgumentParser()
parser.add_argument("--out")
parser.add_argument("--steps", type=int, default=5)
args = parser.parse_args()
setup_determinism()
g = torch.Generator().manual_seed(2)
phase = torch.randint(-20, 20, (8, 1), generator=g).double()
wave = torch.sin((torch.arange(40).double() + phase) / 4.0).float()
inputs, target = wave[:, :-1], wave[:, 1:]
seq = Sequence()
criterion = nn.MSELoss()
optimizer = torch.optim.LBFGS(seq.parameters(), lr=0.8, max_iter=4)
for i in range(args.steps):
    def closure():
        optimizer.zero_grad()
        out = seq(inputs)
        loss = criterion(out, target)
        if i >= 2:  # a smoothness penalty from step 2 on
            loss = loss + 1e-3 * (out[:, 1:] - out[:, :-2]).pow(2).mean()  # BUG: :-1
        loss.backward()
        return loss
    optimizer.step(closure)
    iteration_done(f"train 0 {i}")
save(seq, args.out)
