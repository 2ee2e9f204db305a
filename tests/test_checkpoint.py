"""The emergency checkpoint: a crash nobody fixes ends the job, and the
training state is saved first; resuming from it with ``daifu.load_checkpoint``
gives the parameters of a run that never crashed, bit for bit."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap

import pytest

from .support import assert_identical, load_params, read_events

pytestmark = pytest.mark.torch

TRAIN = textwrap.dedent('''
    import argparse, random, sys
    import torch
    import torch.nn as nn

    p = argparse.ArgumentParser()
    p.add_argument("--out")
    p.add_argument("--resume")
    p.add_argument("--bug", action="store_true")
    args = p.parse_args()

    torch.manual_seed(0)
    random.seed(0)
    torch.use_deterministic_algorithms(True)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    EPOCHS, STEPS = 3, 6

    def batch(epoch, step):
        if args.bug and (epoch, step) == (1, 3):
            raise KeyError(f"no batch {step} in shard {epoch}")
        x = torch.randn(16, 4)
        return x, x.sum(dim=1, keepdim=True) * random.random()

    start_epoch = start_step = 0
    if args.resume:
        import daifu
        ck = daifu.load_checkpoint(args.resume)
        model.load_state_dict(ck["modules"]["model"])
        opt.load_state_dict(ck["optimizers"]["opt"])
        sched.load_state_dict(ck["schedulers"]["sched"])
        daifu.restore_rng(ck)
        start_epoch, start_step = ck["position"]["epoch"], ck["position"]["step"]

    def train():
        for epoch in range(start_epoch, EPOCHS):
            for step in range(start_step if epoch == start_epoch else 0, STEPS):
                x, y = batch(epoch, step)
                loss = (model(x) - y).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
            sched.step()

    train()
    torch.save({k: v for k, v in model.state_dict().items()}, args.out)
''')


def _run(args, cwd, env=None, daifu=True):
    argv = [sys.executable, *(["-m", "daifu"] if daifu else []), *args]
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=180,
                          env={**os.environ, "DAIFU_CONSOLE": "0", **(env or {})})


@pytest.mark.slow
def test_a_crash_given_up_saves_the_state_and_resuming_from_it_is_exact(tmp_path):
    pytest.importorskip("torch", reason="PyTorch not available")
    (tmp_path / "train.py").write_text(TRAIN)
    env = {"DAIFU_CHECKPOINT_DIR": str(tmp_path / "ck")}
    crashed = _run(["--log-file", "events.jsonl", "train.py", "--bug", "--out", "x.pt"],
                   tmp_path, env)
    assert crashed.returncode == 1 and "KeyError: 'no batch 3 in shard 1'" in crashed.stderr
    events = read_events(tmp_path / "events.jsonl")
    saved = [e for e in events if e["event"] == "checkpoint.saved"]
    assert len(saved) == 1, events
    path = saved[0]["path"]
    assert os.path.dirname(path) == str(tmp_path / "ck")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert saved[0]["objects"] == {"modules": ["model"], "optimizers": ["opt"],
                                   "schedulers": ["sched"]}
    assert saved[0]["position"]["epoch"] == 1 and saved[0]["position"]["step"] == 3
    summary = [e for e in events if e["event"] == "daifu.summary"]
    assert summary and summary[-1]["checkpoint"] == path  # named in the job's last lines
    assert not [f for f in os.listdir(tmp_path / "ck") if f.endswith(".tmp")]

    import torch

    ck = torch.load(path, weights_only=False)
    assert set(ck) >= {"modules", "optimizers", "schedulers", "scalers", "rng", "position",
                       "where", "exception", "time", "daifu"}
    assert ck["exception"] == "KeyError: 'no batch 3 in shard 1'"
    line = TRAIN.splitlines().index("            x, y = batch(epoch, step)") + 1
    assert ck["where"].endswith(f"train.py:{line}") and {"python", "torch"} <= set(ck["rng"])

    resumed = _run(["train.py", "--resume", path, "--out", "resumed.pt"], tmp_path,
                   daifu=False)
    assert resumed.returncode == 0, resumed.stderr
    reference = _run(["train.py", "--out", "reference.pt"], tmp_path, daifu=False)
    assert reference.returncode == 0, reference.stderr
    assert_identical(load_params(tmp_path / "resumed.pt"), load_params(tmp_path / "reference.pt"))


@pytest.mark.slow
def test_no_checkpoint_and_a_directory_that_cannot_be_written(tmp_path):
    pytest.importorskip("torch", reason="PyTorch not available")
    (tmp_path / "train.py").write_text(TRAIN)
    off = _run(["--no-checkpoint", "--log-file", "off.jsonl", "train.py", "--bug", "--out",
                "x.pt"], tmp_path, {"DAIFU_CHECKPOINT_DIR": str(tmp_path / "ck")})
    assert off.returncode == 1 and not (tmp_path / "ck").exists()
    assert not [e for e in read_events(tmp_path / "off.jsonl")
                if e["event"].startswith("checkpoint.")]
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    if os.access(locked, os.W_OK):  # (root writes anywhere: a file where the directory goes)
        locked.rmdir()
        locked.write_text("not a directory")
    failed = _run(["--log-file", "ev.jsonl", "train.py", "--bug", "--out", "x.pt"], tmp_path,
                  {"DAIFU_CHECKPOINT_DIR": str(locked / "sub")})
    # the original exception, as without daifu, and one clear line; nothing half-written
    assert failed.returncode == 1 and "KeyError: 'no batch 3 in shard 1'" in failed.stderr
    reasons = [e["reason"] for e in read_events(tmp_path / "ev.jsonl")
               if e["event"] == "checkpoint.failed"]
    assert len(reasons) == 1 and str(locked) in reasons[0], reasons


def test_a_program_without_training_state_gets_no_file(tmp_path):
    (tmp_path / "plain.py").write_text(textwrap.dedent('''
        def main():
            for i in range(3):
                total = 10 // (1 - i)
        main()
    '''))
    got = _run(["plain.py"], tmp_path, {"DAIFU_CHECKPOINT_DIR": str(tmp_path / "ck")})
    assert got.returncode == 1 and "ZeroDivisionError" in got.stderr
    assert not (tmp_path / "ck").exists()


@pytest.mark.slow
def test_checkpoint_on_demand_while_the_job_waits(tmp_path):
    """``send PID checkpoint [PATH]`` (the console's ``checkpoint``) saves the
    same state while the job waits at a crash; the job goes on waiting."""
    pytest.importorskip("torch", reason="PyTorch not available")
    import time

    from .test_waiting import _wait_for_socket

    (tmp_path / "train.py").write_text(TRAIN)
    proc = subprocess.Popen([sys.executable, "-m", "daifu", "--wait", "inf", "--no-checkpoint",
                             "train.py", "--bug", "--out", "x.pt"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, env={**os.environ, "DAIFU_CONSOLE": "0"})
    try:
        _wait_for_socket(proc)
        target = tmp_path / "now.pt"
        sent = _run(["send", str(proc.pid), "checkpoint", str(target)], tmp_path)
        assert sent.returncode == 1, sent.stderr  # done; the job still waits
        assert f"saved {target}" in sent.stdout and "position epoch=1, step=3" in sent.stdout
        assert stat.S_IMODE(os.stat(target).st_mode) == 0o600
        time.sleep(0.3)
        assert proc.poll() is None
        bad = _run(["send", str(proc.pid), "checkpoint", str(tmp_path / "no" / "dir.pt")],
                   tmp_path)
        assert bad.returncode == 2 and "nothing was written" in bad.stdout  # (refused)
        assert _run(["send", str(proc.pid), "abort"], tmp_path).returncode == 1
        proc.communicate(timeout=60)
        assert proc.returncode == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    import torch

    ck = torch.load(target, weights_only=False)
    assert ck["position"]["epoch"] == 1 and set(ck["modules"]) == {"model"}


PREEMPTED = textwrap.dedent('''
    import argparse, sys, time
    import torch
    import torch.nn as nn

    p = argparse.ArgumentParser()
    p.add_argument("--out")
    p.add_argument("--resume")
    p.add_argument("--pause", type=float, default=0.05)
    p.add_argument("--own-handler", action="store_true")
    args = p.parse_args()
    if args.own_handler:
        import signal
        signal.signal(signal.SIGTERM, lambda *a: (print("my handler", flush=True),
                                                   sys.exit(7)))
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    EPOCHS, STEPS = 2, 40
    start_epoch, start_step = 0, 0
    if args.resume:
        import daifu
        ck = daifu.load_checkpoint(args.resume)
        assert ck["state"] == "iteration-complete" and ck["reason"] == "SIGTERM"
        model.load_state_dict(ck["modules"]["model"])
        opt.load_state_dict(ck["optimizers"]["opt"])
        daifu.restore_rng(ck)
        start_epoch, start_step = ck["position"]["epoch"], ck["position"]["step"] + 1

    def train():
        for epoch in range(start_epoch, EPOCHS):
            for step in range(start_step if epoch == start_epoch else 0, STEPS):
                x = torch.randn(8, 4)
                loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                print("step", epoch, step, flush=True)
                time.sleep(args.pause)

    train()
    torch.save(model.state_dict(), args.out)
''')


def _preempt(tmp_path, args, after_steps=5, env=None):
    proc = subprocess.Popen([sys.executable, "-m", "daifu", "--log-file", "events.jsonl",
                             "train.py", *args], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
                            env={**os.environ, "DAIFU_CONSOLE": "0",
                                 "DAIFU_CHECKPOINT_DIR": str(tmp_path / "ck"), **(env or {})})
    assert proc.stdout is not None
    seen = ""
    for _ in range(after_steps):
        seen += proc.stdout.readline()
        assert seen.splitlines()[-1].startswith("step"), proc.communicate()
    import signal
    import time

    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, seen + out, err, time.monotonic() - sent


@pytest.mark.slow
def test_sigterm_saves_at_the_loops_next_iteration_and_ends_as_python_does(tmp_path):
    pytest.importorskip("torch", reason="PyTorch not available")
    (tmp_path / "train.py").write_text(PREEMPTED)
    rc, out, err, _ = _preempt(tmp_path, ["--out", "x.pt"])
    assert rc == -15, err  # killed by SIGTERM: status 143 in a shell, as under python
    saved = [e for e in read_events(tmp_path / "events.jsonl") if e["event"] == "checkpoint.saved"]
    assert len(saved) == 1 and saved[0]["position"]["state"] == "iteration-complete"
    last = [line for line in out.splitlines() if line.startswith("step")][-1].split()
    assert (saved[0]["position"]["epoch"], saved[0]["position"]["step"]) == \
        (int(last[1]), int(last[2]))  # the last step that finished
    path = saved[0]["path"]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    resumed = _run(["train.py", "--resume", path, "--out", "resumed.pt", "--pause", "0"],
                   tmp_path, daifu=False)
    assert resumed.returncode == 0, resumed.stderr
    reference = _run(["train.py", "--out", "reference.pt", "--pause", "0"], tmp_path,
                     daifu=False)
    assert reference.returncode == 0, reference.stderr
    assert_identical(load_params(tmp_path / "resumed.pt"), load_params(tmp_path / "reference.pt"))


def test_sigterm_grace_runs_out_mid_iteration(tmp_path):
    pytest.importorskip("torch", reason="PyTorch not available")
    (tmp_path / "train.py").write_text(PREEMPTED)
    rc, out, err, took = _preempt(tmp_path, ["--out", "x.pt", "--pause", "0.3"], after_steps=1,
                                  env={"DAIFU_GRACE": "0.05"})
    assert rc == -15 and took < 20, err
    saved = [e for e in read_events(tmp_path / "events.jsonl") if e["event"] == "checkpoint.saved"]
    assert len(saved) == 1 and saved[0]["position"]["state"] == "mid-iteration", saved


def test_a_programs_own_sigterm_handler_is_kept(tmp_path):
    pytest.importorskip("torch", reason="PyTorch not available")
    (tmp_path / "train.py").write_text(PREEMPTED)
    rc, out, err, _ = _preempt(tmp_path, ["--out", "x.pt", "--own-handler"])
    assert rc == 7 and "my handler" in out, err
    assert not (tmp_path / "ck").exists()


def test_a_forked_worker_dies_of_sigterm_as_without_daifu(tmp_path):
    # daifu's SIGTERM handler is the parent's: a forked worker (DataLoader,
    # multiprocessing.Pool) gets the default action back, so that a SIGTERM
    # the kernel delivers just before the worker blocks still ends it
    # (Pool.terminate() hung on a worker blocked on its task queue's lock)
    (tmp_path / "train.py").write_text(textwrap.dedent('''
        import os, signal, multiprocessing as mp

        def disposition(_):
            return signal.getsignal(signal.SIGTERM) is signal.SIG_DFL

        def main():
            print("parent handles SIGTERM:", signal.getsignal(signal.SIGTERM)
                  is not signal.SIG_DFL, flush=True)
            with mp.get_context("fork").Pool(2) as pool:
                print("workers default:", all(pool.map(disposition, range(4))), flush=True)
            print("parent blocks SIGTERM:",
                  signal.SIGTERM in signal.pthread_sigmask(signal.SIG_BLOCK, []), flush=True)
            lock = mp.get_context("fork").Lock()
            lock.acquire()
            child = mp.get_context("fork").Process(target=lock.acquire)  # blocks for good
            child.start()
            child.terminate()
            child.join(20)
            print("blocked worker ended by SIGTERM:", child.exitcode == -signal.SIGTERM,
                  flush=True)
        main()
    '''))
    proc = subprocess.run([sys.executable, "-m", "daifu", "train.py"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "DAIFU_CONSOLE": "0"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["parent handles SIGTERM: True", "workers default: True",
                                        "parent blocks SIGTERM: False",
                                        "blocked worker ended by SIGTERM: True"], proc.stderr


def test_sigterm_without_training_state_ends_at_once(tmp_path):
    (tmp_path / "train.py").write_text(textwrap.dedent('''
        import time
        def main():
            for i in range(1000):
                print("step", i, flush=True)
                time.sleep(0.05)
        main()
    '''))
    rc, out, err, took = _preempt(tmp_path, [], after_steps=2)
    assert rc == -15 and took < 10, err
    assert not (tmp_path / "ck").exists()


LIGHTNING = textwrap.dedent('''
    import argparse, warnings
    import lightning as L
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset

    p = argparse.ArgumentParser()
    p.add_argument("--resume")
    p.add_argument("--bug", action="store_true")
    args = p.parse_args()
    warnings.filterwarnings("ignore")

    class Net(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 2)

        def training_step(self, batch, batch_idx):
            weights = {step: 1.0 for step in range(5 if args.bug else 100)}
            x, y = batch
            return F.cross_entropy(self.lin(x), y) * weights[self.global_step]

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    L.seed_everything(0, verbose=False)
    data = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
    trainer = L.Trainer(max_epochs=2, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(Net(), DataLoader(data, batch_size=8), ckpt_path=args.resume)
    print("global_step", trainer.global_step)
''')

HF = textwrap.dedent('''
    import argparse, os, warnings
    import torch
    from torch.utils.data import Dataset
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments
    from transformers.utils import logging as hf_logging

    p = argparse.ArgumentParser()
    p.add_argument("--resume")
    p.add_argument("--bug", action="store_true")
    args = p.parse_args()
    warnings.filterwarnings("ignore")
    hf_logging.set_verbosity_error()

    class Sequences(Dataset):
        def __init__(self, n):
            g = torch.Generator().manual_seed(1)
            self.ids = torch.randint(3, 40, (n, 12), generator=g)
        def __len__(self):
            return len(self.ids)
        def __getitem__(self, i):
            return {"input_ids": self.ids[i], "labels": self.ids[i, 0] % 3}

    class Buggy(Trainer):
        def compute_loss(self, model, inputs, *a, **kw):
            if args.bug and self.state.global_step == 3:
                raise KeyError("no loss weight for step 3")
            return super().compute_loss(model, inputs, *a, **kw)

    config = BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=16, num_labels=3)
    torch.manual_seed(0)
    training = TrainingArguments(output_dir="hf-out", max_steps=8, per_device_train_batch_size=8,
                                 save_strategy="no", logging_strategy="no", report_to=[],
                                 use_cpu=True, seed=0, disable_tqdm=True)
    trainer = Buggy(model=BertForSequenceClassification(config), args=training,
                    train_dataset=Sequences(64))
    trainer.train(resume_from_checkpoint=args.resume)
    print("global_step", trainer.state.global_step)
''')


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["lightning", "transformers"])
def test_a_trainer_on_the_stack_saves_its_own_checkpoint_to_resume_from(tmp_path, framework):
    """A Lightning or HF ``Trainer`` on the crashed stack is asked for its own
    checkpoint too, so that ``fit(ckpt_path=...)`` / ``train(
    resume_from_checkpoint=...)`` resume from the crash point."""
    pytest.importorskip("lightning" if framework == "lightning" else "transformers",
                        reason=f"{framework} not installed")
    (tmp_path / "train.py").write_text(LIGHTNING if framework == "lightning" else HF)
    crashed = _run(["--log-file", "events.jsonl", "train.py", "--bug"], tmp_path,
                   {"DAIFU_CHECKPOINT_DIR": str(tmp_path / "ck")})
    assert crashed.returncode == 1 and "KeyError" in crashed.stderr, crashed.stderr[-3000:]
    saved = [e for e in read_events(tmp_path / "events.jsonl") if e["event"] == "checkpoint.saved"]
    assert len(saved) == 1 and framework in saved[0]["frameworks"], saved
    own = saved[0]["frameworks"][framework]
    assert os.path.exists(own) and os.path.exists(saved[0]["path"])
    import torch

    # (daifu's file names it too: ``ck["frameworks"]["lightning"]``)
    assert torch.load(saved[0]["path"], weights_only=False)["frameworks"] == {framework: own}
    step = 5 if framework == "lightning" else 3
    if framework == "lightning":
        assert torch.load(own, weights_only=False)["global_step"] == step
        assert stat.S_IMODE(os.stat(own).st_mode) == 0o600
    else:
        assert own.endswith(f"checkpoint-{step}") and os.path.isfile(
            os.path.join(own, "trainer_state.json"))
    resumed = _run(["train.py", "--resume", own], tmp_path, daifu=False)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert resumed.stdout.split()[-1] == ("16" if framework == "lightning" else "8")


def test_a_full_disk_leaves_no_partial_file_and_says_so_in_one_line(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch", reason="PyTorch not available")
    import errno

    from daifu.engine.persist import _checkpoint

    model = torch.nn.Linear(3, 3)  # noqa: F841 - found in this frame
    real = torch.save

    def full(obj, fh, *a, **kw):
        real(obj, fh, *a, **kw)  # (part of it reached the disk)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(_checkpoint.CheckpointError) as err:
        _checkpoint.save(sys._getframe(), "here", None, directory=str(tmp_path))
    assert "No space left on device" in str(err.value) and "nothing was written" in str(err.value)
    assert "\n" not in str(err.value) and os.listdir(tmp_path) == []


def test_a_full_disk_is_named_when_the_writer_says_only_that_a_write_failed(tmp_path,
                                                                            monkeypatch):
    torch = pytest.importorskip("torch", reason="PyTorch not available")
    import errno
    import types

    from daifu.engine.persist import _checkpoint

    model = torch.nn.Linear(3, 3)  # noqa: F841 - found in this frame

    def failed(obj, fh, *a, **kw):  # (torch's C++ writer, its OSError as the context)
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            raise RuntimeError("PytorchStreamWriter failed writing file data/0: file write "
                               "failed") from None

    monkeypatch.setattr(torch, "save", failed)
    with pytest.raises(_checkpoint.CheckpointError, match="No space left on device"):
        _checkpoint.save(sys._getframe(), "here", None, directory=str(tmp_path))
    # no errno at all: the space left on the file system says it
    monkeypatch.setattr(torch, "save", lambda *a, **kw: (_ for _ in ()).throw(
        RuntimeError("file write failed")))
    monkeypatch.setattr(os, "statvfs", lambda path: types.SimpleNamespace(f_bavail=3,
                                                                          f_frsize=4096))
    with pytest.raises(_checkpoint.CheckpointError) as err:
        _checkpoint.save(sys._getframe(), "here", None, directory=str(tmp_path))
    assert "No space left on device (RuntimeError: file write failed)" in str(err.value)
    assert os.listdir(tmp_path) == []


def test_checkpoint_names_never_collide_and_a_killed_saves_file_goes_at_the_next_save(
        tmp_path, monkeypatch):
    """Containers that share a directory have pids alike (pid 1 in each): the
    name holds the rank, the host and a random part.  A save killed half-way
    leaves its temporary file, nobody holding it: the next save removes it
    (and leaves alone one that a live save holds)."""
    import fcntl

    torch = pytest.importorskip("torch", reason="PyTorch not available")
    from daifu.engine.persist import _checkpoint

    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    names = {_checkpoint._file_name() for _ in range(50)}
    assert len(names) == 50
    assert all("-rank3-" in n and f"-{os.getpid()}-" in n and n.endswith(".pt") for n in names)
    dead = tmp_path / ".train-1.pt.0a1b2c.daifu.tmp"
    dead.write_bytes(b"half a checkpoint")
    live = tmp_path / ".train-2.pt.3d4e5f.daifu.tmp"
    live.write_bytes(b"being written")
    other = tmp_path / "notes.tmp"
    other.write_text("not daifu's")
    with open(live, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        model = torch.nn.Linear(3, 3)  # noqa: F841 - found in this frame
        done = _checkpoint.save(sys._getframe(), "here", None, directory=str(tmp_path))
        left = sorted(p.name for p in tmp_path.iterdir())
    assert done is not None and left == sorted([live.name, other.name,
                                                os.path.basename(done["path"])])


def test_large_state_is_announced_with_an_estimate(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch", reason="PyTorch not available")
    from daifu.engine.persist import _checkpoint

    model = torch.nn.Linear(64, 64)  # noqa: F841 - found in this frame
    monkeypatch.setattr(_checkpoint, "LARGE_BYTES", 1000)
    said: list[str] = []
    done = _checkpoint.save(sys._getframe(), "here", None, directory=str(tmp_path),
                            say=said.append)
    assert done is not None and done["objects"] == {"modules": ["model"]}
    assert len(said) == 1 and said[0].startswith("saving 0.0 GiB of state: about")


def test_a_manifest_is_read_for_this_rank_and_a_wrong_one_is_refused_naming_why(
        tmp_path, monkeypatch):
    """``daifu.resume(manifest)``: each rank takes its own file; a job of
    another size, a newer format, a rank with no file are refused before
    anything changes; a relative path is read beside the manifest."""
    pytest.importorskip("torch", reason="PyTorch not available")
    import json

    import daifu

    def manifest(**fields):
        body = {"daifu": "0.1.0", "format": 1, "world_size": 2,
                "ranks": {"0": "rank0.pt", "1": "rank1.pt"}, **fields}
        path = tmp_path / "job-manifest.json"
        path.write_text(json.dumps(body))
        return path

    for name, value in (("RANK", "1"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "1")):
        monkeypatch.setenv(name, value)
    with pytest.raises(daifu.ResumeError, match="no checkpoint at .*rank1.pt"):
        daifu.resume(manifest())  # (this rank's file, found beside the manifest)
    with pytest.raises(daifu.ResumeError, match="holds a job of 3 ranks; this one has 2"):
        daifu.resume(str(manifest(world_size=3)))
    with pytest.raises(daifu.ResumeError, match="manifest format 9"):
        daifu.resume(manifest(format=9))
    with pytest.raises(daifu.ResumeError, match="rank 1 saved no checkpoint"):
        daifu.resume(manifest(ranks={"0": "rank0.pt", "1": None}))
    (tmp_path / "job-manifest.json").write_text("not json")
    with pytest.raises(daifu.ResumeError, match="is not a manifest daifu wrote"):
        daifu.resume(tmp_path / "job-manifest.json")
