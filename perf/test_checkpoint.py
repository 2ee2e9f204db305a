"""The emergency checkpoint against the yardstick: ``torch.save`` of the same
objects' state dicts to the same disk, side by side (target: +10% at most --
the collection walk, the RNG states and the atomic rename are the extra)."""

from __future__ import annotations

import os
import statistics
import sys
import time

import pytest
from conftest import ASSERT, record, size


def test_emergency_checkpoint_costs_what_torch_save_costs(tmp_path):
    torch = pytest.importorskip("torch", reason="PyTorch not available")
    from daifu.engine.persist._checkpoint import save

    width = size(2048, 256)
    model = torch.nn.Sequential(*(torch.nn.Linear(width, width) for _ in range(3)))
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(2, width)).sum().backward()
    opt.step()  # (Adam's state: two more tensors per parameter)
    frame = sys._getframe()

    def ours():
        save(frame, "perf", None, path=str(tmp_path / "ours.pt"))

    def theirs():
        path = tmp_path / "theirs.pt"
        with open(path, "wb") as fh:
            torch.save({"modules": {"model": model.state_dict()},
                        "optimizers": {"opt": opt.state_dict()}}, fh)
            fh.flush()
            os.fsync(fh.fileno())

    a: list[float] = []
    b: list[float] = []
    ours()
    theirs()
    for r in range(size(7, 1)):
        for fn, acc in ((ours, a), (theirs, b)) if r % 2 == 0 else ((theirs, b), (ours, a)):
            t0 = time.perf_counter()
            fn()
            acc.append(time.perf_counter() - t0)
    mine, yard = statistics.median(a), statistics.median(b)
    mb = os.path.getsize(tmp_path / "ours.pt") / 1e6
    record("Emergency checkpoint", f"save of {mb:.0f} MB of state (model + Adam)", mine * 1e3,
           "ms", "<= 1.1x torch.save", f"{mine / yard:.2f}x torch.save of the same "
           f"({yard * 1e3:.0f} ms)")
    if ASSERT:
        assert mine <= 1.1 * yard
