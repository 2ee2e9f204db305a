"""What the desync check costs at a crash in a distributed job: reading this
rank's collectives from PyTorch's flight recorder (engine/remote/_distributed.py).

Measured in a subprocess (a one-rank gloo group on a FileStore) after N
collectives issued 20 Python frames deep, as a training step issues them;
the first read symbolizes every recorded stack, later reads reuse that."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ASSERT, record, size

pytest.importorskip("torch", reason="PyTorch not available")

PROGRAM = '''
import json, sys, tempfile, time
import torch, torch.distributed as dist
from daifu.engine.remote import _distributed

store = dist.FileStore(tempfile.mktemp(), 1)
dist.init_process_group("gloo", store=store, rank=0, world_size=1)
t = torch.ones(4)

def deep(n):
    if n:
        return deep(n - 1)
    dist.all_reduce(t)

for _ in range(int(sys.argv[1])):
    deep(20)
times = []
for _ in range(3):
    t0 = time.perf_counter()
    entries = _distributed._collectives()
    times.append(time.perf_counter() - t0)
print(json.dumps({"entries": len(entries), "times": times}))
dist.destroy_process_group()
'''


def test_reading_the_flight_recorder_at_a_crash(tmp_path):
    n = size(3000, 50)
    proc = subprocess.run([sys.executable, "-c", PROGRAM, str(n)], capture_output=True,
                          text=True, timeout=600, cwd=tmp_path,
                          env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["entries"] == min(n, 2000)  # the recorder's default size
    first, later = out["times"][0], min(out["times"][1:])
    section = "Desync check (distributed jobs)"
    record(section, f"first read of the flight recorder ({out['entries']} collectives)",
           first * 1000, "ms", "< 10 s (once per process; a restart costs minutes)",
           "symbolizes every recorded stack")
    record(section, "later reads", later * 1000, "ms", "< 0.5 s")
    if ASSERT:
        assert first < 10 and later < 0.5
