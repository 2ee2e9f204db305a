"""Workloads for the overhead benchmarks, compiled twice from the same source:
plain, and vaccinated (every function, ``DAIFU_ENTRY='**'``)."""

from __future__ import annotations

import os
import textwrap

TIGHT = textwrap.dedent('''
    def loop_sum(n):
        total = 0
        for i in range(n):
            total += i
        return total


    def loop_many_locals(n):
        a = b = c = d = e = f = g = h = 0
        for i in range(n):
            a += i
            b += a & 255
            c = (c + b) ^ i
            d = c - a
            e = d & 1023
            f += e
            g = f % 7
            h += g
        return h


    def loop_nested(n):
        t = 0
        for i in range(n):
            for j in range(20):
                if j % 3:
                    t += i * j
                else:
                    t -= j
        return t


    def evens(n):
        for i in range(n):
            if i % 2 == 0:
                yield i


    def loop_generator(n):
        total = 0
        for v in evens(n):
            total += v
        return total


    def loop_calls(n):
        out = []
        for i in range(n):
            out.append(min(i, 7) + len(out) % 3)
        return len(out)
''')

TRAINING = textwrap.dedent('''
    import torch
    import torch.nn as nn
    import torch.nn.functional as F


    class CNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 4, 3)
            self.fc = nn.Linear(4 * 13 * 13, 10)

        def forward(self, x):
            return self.fc(torch.max_pool2d(torch.relu(self.conv(x)), 2).flatten(1))


    def make_data(kind, steps, batch, seed=0):
        g = torch.Generator().manual_seed(seed)
        if kind == "cnn":
            xs = torch.randn(steps, batch, 1, 28, 28, generator=g)
        else:
            xs = torch.randn(steps, batch, 64, generator=g)
        ys = torch.randint(0, 10, (steps, batch), generator=g)
        return list(zip(xs, ys))


    def make_model(kind, seed=0):
        torch.manual_seed(seed)
        if kind == "cnn":
            return CNN()
        return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))


    def train(model, data, lr=0.05):
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        total = 0.0
        for x, y in data:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item()
        return total
''')

MODULE_LEVEL = textwrap.dedent('''
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    total = 0.0
    for step in range(STEPS):
        x = torch.randn(32, 64, generator=g)
        y = torch.randint(0, 10, (32,), generator=g)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        total += loss.item()
''')


def compile_both(source: str, name: str, module_level: bool = False):
    """(plain code, vaccinated code) of ``source``."""
    from daifu.cells import Selection, vaccinate_source

    filename = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"<{name}>.py")
    plain = compile(source, filename, "exec", dont_inherit=True)
    vaccinated, report = vaccinate_source(source, filename, Selection(("**",), module_level),
                                          module=name)
    assert not report.skipped, report.skipped
    return plain, vaccinated


def load(code, **extra) -> dict:
    namespace = {"__name__": "perf_workload", **extra}
    exec(code, namespace)
    return namespace
