"""The rank-local decision check (engine/remote/_distributed.py), without a cluster.

A fake collective records what PyTorch's flight recorder records -- the
Python stack where it was issued -- and the process "is" rank 1 of 2; the
end-to-end versions with torchrun, gloo and DDP are in test_distributed.py
and the crash benchmark's ddp_* cases."""

from __future__ import annotations

import threading
import traceback

import pytest

import daifu
from daifu.engine._events import capture as capture_logs
from daifu.engine.remote import _distributed

from .support import crashes, vaccinate

SOURCE = '''
LOG = []
TABLE = {0: 1, 1: 1, 3: 1}

def all_reduce(value):
    COLLECTIVE(value)

def reduced(step):
    all_reduce(step)
    return TABLE[step]

def train():
    for step in range(4):
        scale = reduced(step)
        all_reduce(scale)
        LOG.append((step, scale))

def reduced_after(step):
    value = TABLE[step]
    all_reduce(value)
    return value

def train_lookup_first():
    for step in range(4):
        scale = reduced_after(step)
        LOG.append((step, scale))

def train_lookup_after():
    for step in range(4):
        all_reduce(step)
        scale = TABLE[step]
        all_reduce(scale)
        LOG.append((step, scale))

ACCS = {1: 0.5}

def epoch_end():
    for epoch in range(2):
        all_reduce(epoch)
        acc = ACCS[epoch]
        all_reduce(acc)
        LOG.append((epoch, acc))

def epoch_log():
    for epoch in range(2):
        all_reduce(epoch)
        acc = ACCS[epoch]
        if acc > 0:
            LOG.append((epoch, round(acc, 2)))
'''


@pytest.fixture
def rank_one(monkeypatch):
    """This process is rank 1 of 2; collectives go to a fake flight recorder."""
    entries: list[dict] = []

    def collective(value):
        stack = traceback.extract_stack()[:-1]
        entries.append({
            "frames": [{"filename": f.filename, "name": f.name, "line": f.lineno}
                       for f in reversed(stack)],
            "record_id": len(entries), "collective_seq_id": len(entries) + 1,
            "profiling_name": "gloo:all_reduce", "thread_id": str(threading.get_ident())})

    monkeypatch.setattr(_distributed, "active", lambda: True)
    monkeypatch.setattr(_distributed, "_group", lambda: object())
    monkeypatch.setattr(_distributed, "_collectives", lambda: list(entries))
    monkeypatch.setenv("RANK", "1")
    ns = vaccinate(SOURCE, lazy=True)
    ns["COLLECTIVE"] = collective
    return ns


def _rejected(logs):
    return [e["reason"] for e in logs if e["event"] == "patch.rejected"]


def test_continue_past_a_collective_and_retry_of_a_call_that_ran_one_are_refused(rank_one):
    ns = rank_one

    @daifu.on(KeyError, where="train")
    def drop(crash):
        return daifu.CONTINUE

    @daifu.on(KeyError, where="train")
    def redo(crash):
        crash.globals["TABLE"][2] = 1
        return daifu.RETRY

    with capture_logs() as logs, crashes(KeyError):
        ns["train"]()
    reasons = _rejected(logs)
    assert len(reasons) == 2, reasons
    assert "going on with the loop's next item on rank 1 alone would leave out all_reduce " \
        "(collective #4) at line 15" in reasons[0]
    assert "the failing statement already ran all_reduce (collective #5) on rank 1" \
        in reasons[1]
    assert ns["LOG"] == [(0, 1), (1, 1)]


@pytest.mark.parametrize("program, where", [
    # the lookup fails in the helper, after the helper's collective: retried there
    ("train", "reduced"),
    # the loop's statement ran no collective (in this or an earlier iteration)
    ("train_lookup_after", "train_lookup_after"),
])
def test_retry_of_a_statement_that_ran_no_collective_is_allowed(rank_one, program, where):
    ns = rank_one

    @daifu.on(KeyError, where=where)
    def fix(crash):
        crash.globals["TABLE"][2] = 1
        return daifu.RETRY

    with capture_logs() as logs:
        ns[program]()
    assert not _rejected(logs)
    assert ns["LOG"] == [(s, 1) for s in range(4)]


def test_skip_of_a_statement_whose_collective_already_ran_is_allowed(rank_one):
    # the statement ran its all_reduce and then failed: skipping the rest of it
    # leaves no collective out (it was refused, with advice that could never work)
    ns = rank_one
    ns["TABLE"].pop(3)

    @daifu.on(KeyError, where="train")
    def skip(crash):
        crash.vars["scale"] = 1
        return daifu.SKIP

    with capture_logs() as logs:
        ns["train"]()
    assert not _rejected(logs)
    assert ns["LOG"] == [(s, 1) for s in range(4)]


def test_skip_of_a_statement_whose_collective_is_still_to_come_is_refused(rank_one):
    # the lookup fails before the statement's all_reduce: skipping it would
    # leave that collective out -- and the refusal says retry is safe here
    ns = rank_one
    calls = []

    @daifu.on(KeyError, where="train_lookup_first")
    def skip(crash):
        calls.append(crash.statement)
        return daifu.SKIP

    with capture_logs() as logs, crashes(KeyError):
        ns["train_lookup_first"]()
    assert calls == ["scale = reduced_after(step)"]
    reason = _rejected(logs)[0]
    assert "skipping the failing statement on rank 1 alone would leave out all_reduce" in reason
    assert "retry is safe on this rank alone" in reason and "fix the cause" not in reason


def test_a_refused_retry_names_the_skip_that_is_safe(rank_one):
    ns = rank_one

    @daifu.on(KeyError, where="train")
    def redo(crash):
        return daifu.RETRY

    with capture_logs() as logs, crashes(KeyError):
        ns["train"]()
    reason = _rejected(logs)[0]
    assert "already ran all_reduce" in reason and "skip is safe on this rank alone" in reason


def test_a_first_pass_continue_past_a_collective_not_seen_yet_is_refused(rank_one):
    """In the first pass through the loop the flight recorder has not seen the
    collective further down the body (an epoch-end all_reduce): the source
    says it is there.  Code that calls nothing but builtins may be left out."""
    ns = rank_one

    @daifu.on(KeyError, where="epoch_end")
    def drop(crash):
        return daifu.CONTINUE

    @daifu.on(KeyError, where="epoch_log")
    def drop_log(crash):
        return daifu.CONTINUE

    with capture_logs() as logs, crashes(KeyError):
        ns["epoch_end"]()
    reason = _rejected(logs)[0]
    assert "going on with the loop's next item on rank 1 alone would leave out " \
        "all_reduce(acc) at line 41, which may run a collective" in reason, reason
    assert ns["LOG"] == []
    with capture_logs() as logs:
        ns["epoch_log"]()
    assert not _rejected(logs)
    assert ns["LOG"] == [(1, 0.5)]


def test_a_call_into_torch_distributed_is_known_for_a_collective(rank_one):
    pytest.importorskip("torch", reason="PyTorch not available")
    ns = vaccinate('''
import torch.distributed as dist
ACCS = {}

def evaluate():
    for epoch in range(2):
        acc = ACCS[epoch]
        dist.all_reduce(acc)
''', lazy=True)

    @daifu.on(KeyError, where="evaluate")
    def drop(crash):
        return daifu.CONTINUE

    with capture_logs() as logs, crashes(KeyError):
        ns["evaluate"]()
    assert "would leave out dist.all_reduce(acc) at line 8, a collective the other ranks " \
        "run" in _rejected(logs)[0]


def test_without_the_flight_recorder_rank_local_decisions_are_refused(rank_one, monkeypatch):
    ns = rank_one
    monkeypatch.setattr(_distributed, "_collectives", lambda: None)

    @daifu.on(KeyError, where="train_lookup_after")
    def fix(crash):
        crash.globals["TABLE"][2] = 1
        return daifu.RETRY

    with capture_logs() as logs, crashes(KeyError):
        ns["train_lookup_after"]()
    assert "flight recorder is off (TORCH_FR_BUFFER_SIZE=0)" in _rejected(logs)[0]


def test_without_a_process_group_a_launchers_environment_changes_nothing(monkeypatch):
    """RANK/WORLD_SIZE set but no process group initialized (or one rank):
    decisions are not checked."""
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    ns = vaccinate(SOURCE, lazy=True)
    ns["COLLECTIVE"] = lambda value: None
    assert not _distributed.active()

    @daifu.on(KeyError, where="train")
    def drop(crash):
        return daifu.CONTINUE

    with capture_logs() as logs:
        ns["train"]()
    assert not _rejected(logs)
    assert ns["LOG"] == [(0, 1), (1, 1), (3, 1)]


@pytest.mark.parametrize("env, job", [
    # torchrun without --standalone/--rdzv-id: every job's run id is "none"
    ({"TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "node1", "MASTER_PORT": "29500"},
     "node1:29500"),
    ({"TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "node1", "MASTER_PORT": "29501"},
     "node1:29501"),
    ({"TORCHELASTIC_RUN_ID": "exp7", "MASTER_ADDR": "node1", "MASTER_PORT": "29500"},
     "exp7@node1:29500"),
    ({"TORCHELASTIC_RUN_ID": "exp7"}, "exp7"),
    ({}, None),
])
def test_a_jobs_identity_is_its_store_address_with_its_run_id(env, job):
    from daifu.engine._job import job_identity

    assert job_identity(env) == job
