"""Resume as if it never stopped: a crash given up mid-iteration (after the
failed step drew random numbers and took its batch), resumed with one
``daifu.resume`` call, ends bit-identical to a run that never crashed -- with
a shuffled ``DataLoader`` (in the main process and with workers), a
``Dataset`` that draws from ``random`` and torch, dropout, and the training
loop written as ``for`` or as ``while`` (``engine/persist/_resume.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from .support import assert_identical, load_params, read_events

pytestmark = pytest.mark.torch

TRAIN = textwrap.dedent('''
    import argparse, random
    import torch
    import torch.nn as nn
    from torch.utils.data import DataLoader, Dataset

    p = argparse.ArgumentParser()
    p.add_argument("--out")
    p.add_argument("--resume")
    p.add_argument("--crash", default="")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--loop", default="for")
    p.add_argument("--kind", default="plain")  # plain, stateful, persistent, stateful-persistent
    args = p.parse_args()
    crash = tuple(int(v) for v in args.crash.split(",")) if args.crash else None

    torch.manual_seed(0)
    random.seed(0)
    torch.use_deterministic_algorithms(True)


    class Noisy(Dataset):
        def __len__(self):
            return 40

        def __getitem__(self, i):
            x = torch.full((4,), float(i)) / 40 + torch.rand(4) * 0.1
            return x * (1 + random.random()), torch.tensor([float(i % 3)])


    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)
    if args.kind.startswith("stateful"):
        from torchdata.stateful_dataloader import StatefulDataLoader as DataLoader
    loader = DataLoader(Noisy(), batch_size=8, shuffle=True, num_workers=args.workers,
                        persistent_workers=args.kind.endswith("persistent"))
    EPOCHS = 3
    start_epoch = start_i = 0
    if args.resume:
        import daifu
        position = daifu.resume(args.resume, model=model, optimizer=opt, scheduler=sched,
                                loader=loader)
        start_epoch, start_i = position["epoch"], position["i"]


    def step(epoch, i, x, y):
        out = model(x)
        noise = random.random()
        if (epoch, i) == crash:
            raise RuntimeError(f"bad step {epoch},{i}")
        loss = ((out - y) ** 2).mean() * (1 + noise)
        opt.zero_grad()
        loss.backward()
        opt.step()


    def train_for():
        for epoch in range(start_epoch, EPOCHS):
            for i, (x, y) in enumerate(loader):
                step(epoch, i, x, y)
            sched.step()
            random.random()  # (an epoch's end draws too)


    def train_while():
        epoch = start_epoch
        while True:
            if epoch >= EPOCHS:
                break
            it = iter(loader)
            i = start_i if epoch == start_epoch else 0
            while i < len(loader):
                x, y = next(it)
                step(epoch, i, x, y)
                i += 1
            sched.step()
            random.random()
            epoch += 1


    (train_for if args.loop == "for" else train_while)()
    torch.save(model.state_dict(), args.out)
''')


def _run(args, cwd: Path, daifu: bool) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAIFU_")}
    env.update(DAIFU_CONSOLE="0", DAIFU_CHECKPOINT_DIR=str(cwd / "ck"))
    argv = [sys.executable, *(["-m", "daifu", "--log-file", "events.jsonl"] if daifu else []),
            "train.py", *args]
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300, env=env)


_references: dict[tuple[int, str, str], Path] = {}


def _reference(tmp_path_factory, workers: int, loop: str, kind: str = "plain") -> Path:
    key = (workers, loop, kind)
    if key not in _references:
        where = tmp_path_factory.mktemp(f"reference-{workers}-{loop}-{kind}")
        (where / "train.py").write_text(TRAIN)
        done = _run(["--workers", str(workers), "--loop", loop, "--kind", kind,
                     "--out", "ref.pt"], where, daifu=False)
        assert done.returncode == 0, done.stderr
        _references[key] = where / "ref.pt"
    return _references[key]


@pytest.mark.slow
@pytest.mark.parametrize(("workers", "loop", "crash", "kind"), [
    (0, "for", "1,2", "plain"),    # mid-epoch, main-process loading
    (2, "for", "1,2", "plain"),    # mid-epoch, two workers (each one's RNG through its batches)
    (0, "for", "1,0", "plain"),    # the first batch of an epoch (the epoch's end code ran)
    (0, "while", "2,4", "plain"),  # a ``while`` loop, the last batch of the run
    (2, "while", "0,0", "plain"),  # the very first step, nothing stepped yet
    # torchdata's StatefulDataLoader (it makes its own iterators and sampler)
    (0, "for", "1,2", "stateful"),
    (2, "while", "1,2", "stateful"),
    # persistent workers: the third epoch, its workers' RNG past two epochs
    (2, "for", "2,3", "persistent"),
    (2, "for", "1,1", "stateful-persistent"),
])
def test_a_crash_resumed_with_one_call_ends_as_if_it_never_stopped(tmp_path, tmp_path_factory,
                                                                   workers, loop, crash, kind):
    pytest.importorskip("torch", reason="PyTorch not available")
    if kind.startswith("stateful"):
        pytest.importorskip("torchdata.stateful_dataloader", reason="torchdata not installed")
    reference = _reference(tmp_path_factory, workers, loop, kind)
    (tmp_path / "train.py").write_text(TRAIN)
    common = ["--workers", str(workers), "--loop", loop, "--kind", kind]
    crashed = _run([*common, "--crash", crash, "--out", "x.pt"], tmp_path, daifu=True)
    assert crashed.returncode == 1 and f"RuntimeError: bad step {crash}" in crashed.stderr
    saved = [e for e in read_events(tmp_path / "events.jsonl") if e["event"] == "checkpoint.saved"]
    assert len(saved) == 1, crashed.stderr[-3000:]
    epoch, i = (int(v) for v in crash.split(","))
    assert saved[0]["position"]["epoch"] == epoch and saved[0]["position"]["i"] == i

    import torch

    ck = torch.load(saved[0]["path"], weights_only=False)
    assert ck["format"] == 1 and ck["rng_at"] == "loader-header"
    entry = ck["loaders"]["loader"]
    assert entry["batches"] == i  # (the failed batch is taken again)
    # persistent workers: the epochs before, each with the batches it handed out
    assert [e["batches"] for e in entry.get("epochs", [])] == \
        ([5] * epoch if kind.endswith("persistent") else [])
    # a StatefulDataLoader's own state_dict, at the same point
    assert ("state_dict" in entry) == kind.startswith("stateful")
    header = "        for i, (x, y) in enumerate(loader):" if loop == "for" \
        else "        while i < len(loader):"
    if crash == "0,0":  # (no optimizer step yet: no loop known)
        assert ck["loop"] is None
    else:
        assert ck["loop"]["function"] == f"train_{loop}"
        assert ck["loop"]["line"] == TRAIN.splitlines().index(header) + 1, ck["loop"]

    resumed = _run([*common, "--resume", saved[0]["path"], "--out", "resumed.pt"], tmp_path,
                   daifu=False)
    assert resumed.returncode == 0, resumed.stderr
    assert_identical(load_params(tmp_path / "resumed.pt"), load_params(reference))


def _checkpoint(tmp_path: Path) -> str:
    """A checkpoint of TRAIN crashed at (1, 2)."""
    (tmp_path / "train.py").write_text(TRAIN)
    crashed = _run(["--crash", "1,2", "--out", "x.pt"], tmp_path, daifu=True)
    assert crashed.returncode == 1, crashed.stderr
    return next(e["path"] for e in read_events(tmp_path / "events.jsonl")
                if e["event"] == "checkpoint.saved")


@pytest.mark.slow
def test_resume_refuses_what_does_not_match_with_a_clear_error(tmp_path):
    torch = pytest.importorskip("torch", reason="PyTorch not available")
    import daifu

    path = _checkpoint(tmp_path)
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Dropout(0.3),
                                torch.nn.Linear(16, 1))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    wrong = torch.optim.Adam(model.parameters())
    # an Adam where an SGD was saved: refused, and the model (checked first) untouched
    with pytest.raises(daifu.ResumeError, match="Adam.load_state_dict.. refused"):
        daifu.resume(path, model=model, optimizer=wrong)
    # (the optimizer was restored last: the model had been loaded -- put back by hand)
    model.load_state_dict(before)
    other = torch.nn.Linear(3, 3)
    with pytest.raises(daifu.ResumeError, match="Linear.load_state_dict.. refused"):
        daifu.resume(path, model=other)
    with pytest.raises(daifu.ResumeError, match="daifu restores modules"):
        daifu.resume(path, model=model, steps=3)
    ck = torch.load(path, weights_only=False)
    ck["format"] = 99
    torch.save(ck, tmp_path / "newer.pt")
    with pytest.raises(daifu.ResumeError, match=r"checkpoint format 99\); this daifu .* reads "
                                                r"formats up to 1"):
        daifu.resume(str(tmp_path / "newer.pt"), model=model)
    torch.save({"model": model.state_dict()}, tmp_path / "theirs.pt")
    with pytest.raises(daifu.ResumeError, match="not a checkpoint daifu wrote"):
        daifu.resume(str(tmp_path / "theirs.pt"), model=model)
    with pytest.raises(daifu.ResumeError, match="no checkpoint at"):
        daifu.resume(str(tmp_path / "none.pt"), model=model)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


@pytest.mark.slow
def test_resume_by_the_names_the_checkpoint_holds(tmp_path):
    torch = pytest.importorskip("torch", reason="PyTorch not available")
    import random

    import daifu

    path = _checkpoint(tmp_path)
    ck = torch.load(path, weights_only=False)
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Dropout(0.3),
                                torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)
    loader = torch.utils.data.DataLoader(list(range(40)), batch_size=8, shuffle=True)
    position = daifu.resume(path)  # (model, opt, sched and loader: found here by name)
    assert position == {"epoch": 1, "i": 2}
    assert all(torch.equal(v, ck["modules"]["model"][k]) for k, v in model.state_dict().items())
    assert opt.state_dict()["state"].keys() == ck["optimizers"]["opt"]["state"].keys()
    assert sched.state_dict() == ck["schedulers"]["sched"]
    assert random.getstate() == ck["rng"]["python"]
    # the loader goes on with the third batch of the order it had
    assert len(list(loader)) == 5 - 2
    del model, opt, sched, loader
    with pytest.raises(daifu.ResumeError, match=r"none of the objects .*\(model, opt, sched, "
                                                r"loader\) is here by that name"):
        daifu.resume(path)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_stateful_loaders_own_state_dict_is_kept_at_the_resume_point(workers):
    """A program that restores its ``StatefulDataLoader`` itself, from the
    checkpoint's ``state_dict`` (torchdata's own format), goes on with the
    batch of the failed iteration, in the same order."""
    torch = pytest.importorskip("torch", reason="PyTorch not available")
    sdl = pytest.importorskip("torchdata.stateful_dataloader", reason="torchdata not installed")
    from daifu.engine.persist._resume import KEEPER, keep_stateful_loaders

    def make():
        return sdl.StatefulDataLoader(list(range(40)), batch_size=4, shuffle=True,
                                      num_workers=workers,
                                      generator=torch.Generator().manual_seed(1))

    keep_stateful_loaders()
    KEEPER.reset()
    whole = [b.tolist() for b in make()]
    loader = make()
    it = iter(loader)
    for _ in range(3):
        next(it)
        KEEPER.on_step(None, (), {})  # (torch's optimizer step hook)
    assert next(it).tolist() == whole[3]  # (the header kept the point: 3 batches taken)
    next(it)  # (the failed iteration took one more)
    state = KEEPER.loader_state(loader)["state_dict"]
    again = make()
    again.load_state_dict(state)
    assert [b.tolist() for b in again] == whole[3:]
    del it


def test_the_kept_python_rng_is_the_state_random_reports():
    """The raw copy of ``random``'s state (one memmove) says what
    ``getstate()`` says, gauss cache included."""
    import random

    from daifu.engine.persist._resume import _python_reader, _python_state

    reader = _python_reader()
    assert reader is not None  # (CPython 3.11 and 3.13 have this layout)
    random.seed(7)
    random.gauss(0, 1)  # (leaves a cached second value)
    assert _python_state(reader.read(), random._inst.gauss_next) == random.getstate()
    random.random()
    assert _python_state(reader.read(), random._inst.gauss_next) == random.getstate()


PREEMPTED = textwrap.dedent('''
    import argparse, time
    import torch
    import torch.nn as nn

    p = argparse.ArgumentParser()
    p.add_argument("--out")
    p.add_argument("--resume")
    p.add_argument("--pause", type=float, default=0.02)
    p.add_argument("--loop", default="accumulate")
    args = p.parse_args()

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.2), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.8)
    ACCUMULATE, MAX_STEPS = 3, 40
    start = 0
    if args.resume:
        import daifu
        position = daifu.resume(args.resume, model=model, optimizer=opt, scheduler=sched)
        start = position["it"]


    def accumulate(it):
        # nanoGPT's shape: ``while True`` around the micro-steps of one update
        while True:
            for micro in range(ACCUMULATE):
                x = torch.randn(8, 4)
                loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean() / ACCUMULATE
                loss.backward()
                time.sleep(args.pause)
            opt.step()
            opt.zero_grad()
            sched.step()
            print("step", it, flush=True)
            it += 1
            if it >= MAX_STEPS:
                break


    def plain_while(it):
        while it < MAX_STEPS:
            x = torch.randn(8, 4)
            loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            print("step", it, flush=True)
            time.sleep(args.pause)
            it += 1


    (accumulate if args.loop == "accumulate" else plain_while)(start)
    torch.save(model.state_dict(), args.out)
''')


@pytest.mark.slow
@pytest.mark.parametrize("loop", ["accumulate", "plain_while"])
def test_sigterm_saves_at_the_training_loops_header_of_any_kind(tmp_path, loop):
    """SIGTERM is saved where the loop around ``optimizer.step()`` starts
    its next iteration -- a ``while`` loop with no ``for`` on the stack, and
    never between the micro-steps of a gradient accumulation -- and the run
    resumed from it with ``daifu.resume`` equals one never stopped."""
    pytest.importorskip("torch", reason="PyTorch not available")
    import signal

    (tmp_path / "train.py").write_text(PREEMPTED)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAIFU_")}
    env.update(DAIFU_CONSOLE="0", DAIFU_CHECKPOINT_DIR=str(tmp_path / "ck"))
    proc = subprocess.Popen([sys.executable, "-m", "daifu", "--log-file", "events.jsonl",
                             "train.py", "--loop", loop, "--out", "x.pt"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, env=env)
    assert proc.stdout is not None
    for _ in range(4):
        assert proc.stdout.readline().startswith("step"), proc.communicate()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM, err
    saved = [e for e in read_events(tmp_path / "events.jsonl") if e["event"] == "checkpoint.saved"]
    assert len(saved) == 1 and saved[0]["position"]["state"] == "iteration-complete", saved
    import torch

    ck = torch.load(saved[0]["path"], weights_only=False)
    header = "    while True:" if loop == "accumulate" else "    while it < MAX_STEPS:"
    line = PREEMPTED.splitlines().index(header) + 1
    assert ck["loop"]["line"] == line, ck["loop"]
    assert ck["where"].endswith(f"train.py:{line}"), ck["where"]  # (not a micro-step's)
    resumed = _run_plain(tmp_path, ["--loop", loop, "--resume", saved[0]["path"], "--pause", "0",
                                    "--out", "resumed.pt"])
    reference = _run_plain(tmp_path, ["--loop", loop, "--pause", "0", "--out", "ref.pt"])
    assert resumed.returncode == 0 and reference.returncode == 0, resumed.stderr + reference.stderr
    assert_identical(load_params(tmp_path / "resumed.pt"), load_params(tmp_path / "ref.pt"))


def _run_plain(cwd: Path, args) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAIFU_")}
    return subprocess.run([sys.executable, "train.py", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env=env)


ENV = textwrap.dedent('''
    import argparse, random
    import numpy as np
    import torch
    import torch.nn as nn

    p = argparse.ArgumentParser()
    p.add_argument("--out")
    p.add_argument("--resume")
    p.add_argument("--crash", type=int, default=-1)
    args = p.parse_args()
    torch.manual_seed(0)


    class Env:  # gymnasium's shape: a generator of its own
        def __init__(self, seed):
            self._np_random = np.random.default_rng(seed)
            self.noise = random.Random(seed)
            self.gen = torch.Generator().manual_seed(seed)
            self.legacy = np.random.RandomState(seed)

        def step(self):
            obs = self._np_random.normal(size=4) + self.noise.random() + self.legacy.rand()
            return torch.tensor(obs, dtype=torch.float32) + torch.rand(4, generator=self.gen)


    env = Env(3)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    start = 0
    if args.resume:
        import daifu
        start = daifu.resume(args.resume, model=model, optimizer=opt, env=env)["step"]


    def train():
        for step in range(start, 30):
            obs = env.step()
            if step == args.crash:
                raise RuntimeError("the env broke")
            loss = model(obs).pow(2).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()


    train()
    torch.save(model.state_dict(), args.out)
''')


@pytest.mark.slow
def test_generators_the_program_holds_itself_resume_where_they_were(tmp_path):
    """An RL-style env with its own numpy ``Generator`` (gymnasium's
    ``np_random``), a ``random.Random``, a legacy ``RandomState`` and a
    ``torch.Generator``: kept at each step, restored by ``daifu.resume(...,
    env=env)``, the resumed run equals the one never stopped."""
    torch = pytest.importorskip("torch", reason="PyTorch not available")
    (tmp_path / "train.py").write_text(ENV)
    crashed = _run(["--crash", "17", "--out", "x.pt"], tmp_path, daifu=True)
    assert crashed.returncode == 1 and "the env broke" in crashed.stderr
    path = next(e["path"] for e in read_events(tmp_path / "events.jsonl")
                if e["event"] == "checkpoint.saved")
    ck = torch.load(path, weights_only=False)
    assert set(ck["generators"]) == {"env._np_random", "env.noise", "env.gen", "env.legacy"}
    assert ck["position"] == {"step": 17}
    assert _run_plain(tmp_path, ["--resume", path, "--out", "resumed.pt"]).returncode == 0
    assert _run_plain(tmp_path, ["--out", "ref.pt"]).returncode == 0
    assert_identical(load_params(tmp_path / "resumed.pt"), load_params(tmp_path / "ref.pt"))
    # resumed under daifu, crashed again: the generators are kept there too
    (tmp_path / "events.jsonl").unlink()
    again = _run(["--resume", path, "--crash", "25", "--out", "y.pt"], tmp_path, daifu=True)
    assert again.returncode == 1 and "the env broke" in again.stderr
    second = next(e["path"] for e in read_events(tmp_path / "events.jsonl")
                  if e["event"] == "checkpoint.saved")
    ck = torch.load(second, weights_only=False)
    assert len(ck["generators"]) == 4 and ck["loop"]["steps"] == 25
    assert _run_plain(tmp_path, ["--resume", second, "--out", "twice.pt"]).returncode == 0
    assert_identical(load_params(tmp_path / "twice.pt"), load_params(tmp_path / "ref.pt"))
    # the env not passed: its generators go on from where they are -- another run
    (tmp_path / "train.py").write_text(ENV.replace(", env=env)", ")"))
    assert _run_plain(tmp_path, ["--resume", path, "--out", "other.pt"]).returncode == 0
    assert not all(torch.equal(a, b) for a, b in zip(load_params(tmp_path / "other.pt").values(),
                                                    load_params(tmp_path / "ref.pt").values()))


@pytest.mark.slow
def test_a_resumed_run_that_crashes_again_resumes_again_exactly(tmp_path, tmp_path_factory):
    """Crash, resume under daifu, crash again in a later epoch, resume again:
    the keeping goes on from where the first checkpoint left it."""
    torch = pytest.importorskip("torch", reason="PyTorch not available")
    reference = _reference(tmp_path_factory, 2, "for")
    (tmp_path / "train.py").write_text(TRAIN)
    common = ["--workers", "2"]
    first = _run([*common, "--crash", "1,2", "--out", "x.pt"], tmp_path, daifu=True)
    assert first.returncode == 1, first.stderr[-3000:]
    saved = [e["path"] for e in read_events(tmp_path / "events.jsonl")
             if e["event"] == "checkpoint.saved"]
    (tmp_path / "events.jsonl").unlink()
    second = _run([*common, "--resume", saved[0], "--crash", "2,1", "--out", "y.pt"], tmp_path,
                  daifu=True)
    assert second.returncode == 1 and "bad step 2,1" in second.stderr, second.stderr[-3000:]
    again = [e["path"] for e in read_events(tmp_path / "events.jsonl")
             if e["event"] == "checkpoint.saved"]
    assert len(again) == 1
    ck = torch.load(again[0], weights_only=False)
    assert ck["position"]["epoch"] == 2 and ck["loaders"]["loader"]["batches"] == 1
    assert ck["loop"]["steps"] == 5 * 2 + 1  # (counted on from the first checkpoint's 5 + 2)
    resumed = _run([*common, "--resume", again[0], "--out", "resumed.pt"], tmp_path, daifu=False)
    assert resumed.returncode == 0, resumed.stderr
    assert_identical(load_params(tmp_path / "resumed.pt"), load_params(reference))
