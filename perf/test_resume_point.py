"""What keeping the resume point costs each training iteration
(``engine/persist/_resume.py``): at the optimizer step and at the loader header
after it, the RNG states (python, numpy, torch) and the loaders' positions
-- against one step of a small model (MNIST's CNN, a batch of 64, on CPU),
measured side by side (target: <= 0.1 % of the step)."""

from __future__ import annotations

import statistics
import time

import pytest
from conftest import ASSERT, record, size


def test_keeping_the_resume_point_costs_a_fraction_of_a_small_step():
    torch = pytest.importorskip("torch", reason="PyTorch not available")
    import sys

    from daifu.engine.persist._resume import KEEPER, keep_loaders

    nn = torch.nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 16, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3),
                          nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 5 * 5, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))
    keep_loaders()
    loader = torch.utils.data.DataLoader(list(range(100_000)), batch_size=64, shuffle=True)
    it = iter(loader)
    hooks = sys.modules["torch.optim.optimizer"]._global_optimizer_post_hooks
    saved = dict(hooks)
    hooks.clear()  # (the step measured plain: the keeping is called by hand)

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    def keep():  # what one iteration of ``for x, y in loader: ... opt.step()`` adds
        KEEPER.on_step(opt, (), {})
        KEEPER.on_header(it)

    step()
    keep()
    n = size(200, 10)
    steps: list[float] = []
    keeps: list[float] = []
    for _ in range(size(15, 2)):
        t0 = time.perf_counter()
        for _ in range(n // 10):
            step()
        steps.append((time.perf_counter() - t0) / (n // 10))
        t0 = time.perf_counter()
        for _ in range(n):
            keep()
        keeps.append((time.perf_counter() - t0) / n)
    s, k = statistics.median(steps), statistics.median(keeps)
    hooks.update(saved)
    KEEPER.reset()
    record("Resume point", "kept per iteration (RNG states + loader position, at the step "
           "and the header)", k * 1e6, "us", "<= 0.1% of a small step",
           f"{100 * k / s:.3f}% of an MNIST CNN step ({s * 1e3:.1f} ms, batch 64)")
    if ASSERT:
        assert k <= 0.001 * s
