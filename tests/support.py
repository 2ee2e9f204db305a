"""Helpers shared by the tests."""

from __future__ import annotations

import contextlib
import itertools
import json
import linecache
import re
import textwrap
from pathlib import Path

from daifu.cells import Selection, options, vaccinate_source

_counter = itertools.count()


class Raised:
    """What ``crashes`` caught (``value``, ``type``), as pytest's ExceptionInfo."""

    value: BaseException
    type: type


@contextlib.contextmanager
def crashes(expected, match: str | None = None):
    """``pytest.raises`` for an exception daifu must take as a crash.

    daifu counts ``pytest.raises`` in a caller as the program handling the
    exception (a test that expects it is not crashing), so a test of what
    daifu does with an exception nobody handles -- rules, give-ups, the
    console -- expects it through this instead: a catch-all in a frame that is
    not vaccinated, which daifu does not count as handling."""
    info = Raised()
    try:
        yield info
    except BaseException as exc:
        if not isinstance(exc, expected):
            raise
        if match is not None and not re.search(match, str(exc)):
            raise AssertionError(f"{match!r} does not match {str(exc)!r}") from exc
        info.value, info.type = exc, type(exc)
    else:
        raise AssertionError(f"DID NOT RAISE {expected}")


def read_events(path: Path) -> list[dict]:
    """The records of a daifu event log or journal (JSON lines; [] if absent)."""
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def load_params(path: Path) -> dict:
    import torch

    return torch.load(path, weights_only=True)


def same_params(a: dict, b: dict) -> bool:
    """Bit-identical parameters: same names, dtypes and values."""
    import torch

    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def assert_identical(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    differ = [k for k in a if not same_params({k: a[k]}, {k: b[k]})]
    assert not differ, f"parameters differ: {differ}"


def vaccinate(source: str, entries=("**",), module_level: bool = False, name: str | None = None,
              lazy: bool = False, armed: bool = False):
    """Compile ``source`` with daifu's rewrite and return its namespace
    (``armed``: armed code, vaccinated at its first exception, as the runner
    makes it; the tests' ``options.strict`` is off for it, as strict
    mode rewrites everything at once).

    The source is registered with linecache so tracebacks and inspect work.
    """
    source = textwrap.dedent(source)
    name = name or f"snippet_{next(_counter)}"
    filename = f"/daifu-tests/{name}.py"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    strict, options.strict = options.strict, options.strict and not armed
    try:
        code, report = vaccinate_source(source, filename,
                                        Selection(entries, module_level, lazy, armed=armed),
                                        module=name)
    finally:
        options.strict = strict
    namespace = {"__name__": name, "__file__": filename}
    exec(code, namespace)
    namespace["__report__"] = report
    return namespace


def plain(source: str, name: str | None = None):
    source = textwrap.dedent(source)
    name = name or f"plain_{next(_counter)}"
    filename = f"/daifu-tests/{name}.py"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {"__name__": name, "__file__": filename}
    exec(compile(source, filename, "exec"), namespace)
    return namespace




class PtyProcess:
    """A child process on a pseudo-terminal (stdin/stdout/stderr are a TTY)."""

    def __init__(self, argv: list[str], cwd: str, env: dict | None = None, stdout=None):
        """``stdout``: a file for the child's stdout instead of the terminal."""
        import os
        import pty
        import subprocess

        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen(argv, cwd=cwd, stdin=slave,
                                     stdout=slave if stdout is None else stdout, stderr=slave,
                                     env=env, close_fds=True, start_new_session=True)
        os.close(slave)
        self.output = ""
        self._pos = 0  # expect() searches after the previous match

    def expect(self, text: str, timeout: float = 60.0) -> str:
        """Read until ``text`` appears after the previous match; return the
        output from the previous match up to here."""
        import os
        import select
        import time

        deadline = time.monotonic() + timeout
        while text not in self.output[self._pos:]:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{text!r} not seen; output so far:\n{self.output}")
            ready, _, _ = select.select([self.master], [], [], left)
            if ready:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:
                    chunk = b""
                if not chunk:
                    raise EOFError(f"{text!r} not seen before the end:\n{self.output}")
                self.output += chunk.decode(errors="replace").replace("\r\n", "\n")
        start = self._pos
        self._pos = self.output.index(text, self._pos) + len(text)
        return self.output[start:]

    def send(self, line: str) -> None:
        import os

        os.write(self.master, (line + "\n").encode())

    def wait(self, timeout: float = 60.0) -> int:
        import os

        try:
            while True:  # drain so the child never blocks on a full terminal
                self.expect("\x00never\x00", timeout=0.2)
        except (TimeoutError, EOFError):
            pass
        code = self.proc.wait(timeout)
        try:
            self.expect("\x00never\x00", timeout=0.5)
        except (TimeoutError, EOFError):
            pass
        os.close(self.master)
        return code


def run_daifu(args, cwd, env=None, timeout=120, **kw):
    """``python -m daifu ARGS`` in ``cwd`` (text output captured)."""
    import os
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "daifu", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, **kw)


#: a DDP job on gloo (CPU) of 2 ranks: an MLP with dropout and momentum over a
#: shuffled DistributedSampler, 3 epochs of 8 steps; ``--resume MANIFEST``
#: goes on with ``daifu.resume``.  tests/test_distributed.py preempts it,
#: tests/test_hang.py makes a rank hang in it.
PREEMPTED_DDP = textwrap.dedent('''
    import argparse, sys, time
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler
    import daifu

    p = argparse.ArgumentParser()
    p.add_argument("--resume")
    p.add_argument("--pause", type=float, default=0.0)
    p.add_argument("--out", default="final.pt")
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(256, 8, generator=g), torch.randn(256, 1, generator=g))
    sampler = DistributedSampler(data, shuffle=True, seed=3)
    loader = DataLoader(data, batch_size=16, sampler=sampler)
    model = DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    start_epoch = 0
    if args.resume:
        position = daifu.resume(args.resume, model=model, optimizer=opt, loader=loader)
        start_epoch = position["epoch"]
        print(f"resumed {rank} {position}", flush=True)  # (one write: ranks share the pipe)
    for epoch in range(start_epoch, 3):
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if rank == 0:
                print("step", epoch, i, flush=True)
            time.sleep(args.pause * (1 + rank))  # (rank 1 lags: the ranks learn of it apart)
    if rank == 0:
        torch.save(model.module.state_dict(), args.out)
    dist.destroy_process_group()
''')

#: ``PREEMPTED_DDP`` sharded with FSDP2 (``fully_shard``: the parameters and
#: Adam's state are ``DTensor`` shards), its final parameters gathered whole
PREEMPTED_FSDP = PREEMPTED_DDP.replace(
    "model = DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 1)))\n"
    "opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)\n",
    "from torch.distributed.device_mesh import init_device_mesh\n"
    "from torch.distributed.fsdp import fully_shard\n"
    "model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 1))\n"
    "mesh = init_device_mesh('cpu', (dist.get_world_size(),))\n"
    "fully_shard(model[0], mesh=mesh)\n"
    "fully_shard(model[3], mesh=mesh)\n"
    "fully_shard(model, mesh=mesh)\n"
    "opt = torch.optim.Adam(model.parameters(), lr=0.01)\n").replace(
    "if rank == 0:\n    torch.save(model.module.state_dict(), args.out)",
    "full = {k: v.full_tensor() for k, v in model.state_dict().items()}  # (a collective)\n"
    "if rank == 0:\n    torch.save(full, args.out)").replace(
    "    print(f\"resumed {rank} {position}\", flush=True)",
    "    print(f\"resumed {rank} {position}\", flush=True)\n"
    "    at = {k: v.full_tensor() for k, v in model.state_dict().items()}\n"
    "    if rank == 0:\n"
    "        torch.save(at, 'at-resume.pt')  # (the parameters as resumed, whole)")
assert "fully_shard" in PREEMPTED_FSDP and "at-resume.pt" in PREEMPTED_FSDP
