"""Hangs and stragglers in a distributed job (``engine/_watchdog.py``): the
judge's rules on made-up beats, then torchrun jobs (gloo, CPU) that hang.
The jobs that straggle or only look hung are the crash benchmark's
``watch_ddp_*`` cases (tests/test_scenarios.py)."""

from __future__ import annotations

import datetime
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from daifu.engine import _watchdog
from daifu.engine._watchdog import (
    FIRST_HANG_S,
    MIN_HANG_S,
    Judge,
    Progress,
    name_the_hang,
    settings,
)

from .support import PREEMPTED_DDP, assert_identical, load_params, read_events, run_daifu


def beat(n, steps, idle=0.0, slowest=0.5, taken=10, **more):
    return {"n": n, "steps": steps, "idle": idle, "slowest": slowest, "taken": taken,
            "at": "train.py:9 in main", **more}


# -- the judge --------------------------------------------------------------------------


def test_a_job_whose_ranks_all_stop_moving_is_hung_once_past_the_threshold():
    judge = Judge(2, None, now=0.0)
    assert judge.look({0: beat(1, 5), 1: beat(1, 5)}, now=0.0) is None
    # no step since t=0; both main threads idle (rank 0 in the collective, rank 1 asleep)
    assert judge.look({0: beat(2, 5, idle=4.9), 1: beat(2, 5, idle=4.9)}, now=4.9) is None
    verdict = judge.look({0: beat(3, 5, idle=5.5), 1: beat(3, 5, idle=5.5)}, now=5.5)
    assert verdict is not None
    assert verdict["threshold"] == MIN_HANG_S and verdict["quiet"] == {
        0: ("idle", 5.5), 1: ("idle", 5.5)}
    # said once, until the job moves again
    assert judge.look({0: beat(4, 5, idle=6.0), 1: beat(4, 5, idle=6.0)}, now=6.0) is None
    assert judge.look({0: beat(5, 6), 1: beat(5, 6)}, now=6.5) is None
    assert judge.look({0: beat(6, 6, idle=6), 1: beat(6, 6, idle=6)}, now=12.6) is not None


def test_a_rank_that_works_without_stepping_is_not_a_hang():
    """A long evaluation or a checkpoint write on rank 0: its main thread
    moves (CPU, I/O, a saver on its stack) while rank 1 waits."""
    judge = Judge(2, None, now=0.0)
    judge.look({0: beat(1, 5), 1: beat(1, 5)}, now=0.0)
    assert judge.look({0: beat(60, 5, idle=0.2), 1: beat(60, 5, idle=30.0)}, now=30.0) is None


def test_the_threshold_adapts_to_the_slowest_step_and_spares_the_first_steps():
    judge = Judge(2, None, now=0.0)
    # before every rank took its second step: start-up, compilation, a slow first step
    limit, why = judge.threshold({0: beat(1, 1, taken=1), 1: beat(1, 1, taken=5)})
    assert limit == FIRST_HANG_S and "second step" in why
    assert judge.threshold({0: beat(1, 9, slowest=0.1), 1: beat(1, 9, slowest=0.2)})[0] \
        == MIN_HANG_S
    limit, why = judge.threshold({0: beat(1, 9, slowest=4.0), 1: beat(1, 9, slowest=1.0)})
    assert limit == 12.0 and "3 x the slowest step, 4.00 s" in why
    assert judge.threshold({0: beat(1, 9, slowest=900.0), 1: beat(1, 9)})[0] == \
        _watchdog.MAX_HANG_S
    # a rank that never posted: the threshold of the first steps
    assert judge.threshold({0: beat(1, 9)})[0] == FIRST_HANG_S
    assert Judge(2, 2.5, now=0.0).threshold({0: beat(1, 1, taken=0)}) == (2.5, "--hang-after")


def test_a_rank_at_a_crash_or_ended_holds_the_judgement():
    for flag in ("crash", "ended"):
        judge = Judge(2, 1.0, now=0.0)
        judge.look({0: beat(1, 5), 1: beat(1, 5)}, now=0.0)
        assert judge.look({0: beat(2, 5, idle=9), 1: beat(2, 5, idle=9, **{flag: True})},
                          now=9.0) is None
        # (and the wait for it is not counted against the job)
        assert judge.look({0: beat(3, 5, idle=9.5), 1: beat(3, 5, idle=9.5)}, now=9.5) is None


def test_a_rank_that_stopped_posting_counts_as_not_moving():
    """Its interpreter is held in C (the watchdog thread never gets the GIL)."""
    judge = Judge(2, None, now=0.0)
    judge.look({0: beat(1, 5), 1: beat(1, 5)}, now=0.0)
    verdict = judge.look({0: beat(12, 5, idle=6.0), 1: beat(1, 5)}, now=6.0)
    assert verdict is not None and verdict["quiet"][1] == ("silent", 6.0)
    behind, at, waiting = name_the_hang(verdict, {0: beat(12, 5), 1: beat(1, 5)}, {})
    assert behind == 1 and at.startswith("train.py:9 in main (where it was last seen")


def test_the_rank_behind_is_named_from_the_flight_recorder():
    verdict = {"quiet": {0: ("idle", 6.0), 1: ("idle", 6.0)}}
    answers = {
        0: {"at": "train.py:43 in main", "innermost": "torch/autograd/graph.py:9",
            "collectives": [{"pg": "0", "seq": 25, "name": "all_reduce", "sizes": [[161]],
                             "where": "train.py:43 in main"},
                            {"pg": "0", "seq": 26, "name": "all_reduce", "sizes": [[161]],
                             "where": "train.py:43 in main"}]},
        1: {"at": "train.py:42 in main (time.sleep(600))", "innermost": "train.py:42",
            "collectives": [{"pg": "0", "seq": 25, "name": "all_reduce", "sizes": [[161]],
                             "where": "train.py:43 in main"}]}}
    behind, at, waiting = name_the_hang(verdict, {}, answers)
    assert (behind, at) == (1, "train.py:42 in main (time.sleep(600))")
    assert waiting == "#26 all_reduce [[161]] at train.py:43 in main"
    # without the recorder: the rank whose main thread is not in torch.distributed
    for a in answers.values():
        a["collectives"] = None
    answers[0]["innermost"] = "/x/torch/distributed/distributed_c10d.py:3 in all_reduce"
    assert name_the_hang(verdict, {}, answers)[0] == 1


def test_a_straggler_is_named_once_and_not_while_the_job_stands_still():
    judge = Judge(2, None, now=0.0)
    slow = beat(40, 30, idle=0.3, samples=40, own=0.75, step_s=0.4, hot="train.py:40 in main",
                regular=True)
    fast = beat(40, 30, idle=0.1, samples=40, own=0.1, step_s=0.4, regular=True)
    [seen] = judge.stragglers({0: fast, 1: slow})
    assert seen["rank"] == 1 and seen["at"] == "train.py:40 in main"
    assert seen["own_s"] == pytest.approx(0.3) and seen["others_s"] == pytest.approx(0.04)
    assert judge.stragglers({0: fast, 1: slow}) == []  # (once)
    # the same shares while nothing moves: a hang, not a straggler
    assert Judge(2, None, 0.0).stragglers({0: {**fast, "idle": 9.0}, 1: slow}) == []
    # a rank that stopped once lately (a slow first step, an evaluation, a checkpoint)
    assert Judge(2, None, 0.0).stragglers({0: fast, 1: {**slow, "regular": False}}) == []
    # too few samples, or alike
    assert Judge(2, None, 0.0).stragglers({0: fast, 1: {**slow, "samples": 5}}) == []
    assert Judge(2, None, 0.0).stragglers({0: fast, 1: {**slow, "own": 0.12}}) == []


def test_progress_moves_with_steps_cpu_io_or_a_checkpoint_write():
    p = Progress(now=0.0)
    p.update(0.5, 0, cpu=1.0, io=100)           # (the first reading)
    p.update(1.0, 0, cpu=1.01, io=100)          # idle: 2% of the tick on the CPU
    assert p.moved_t == 0.5
    p.update(1.5, 0, cpu=1.2, io=100)           # 38%: it computes
    assert p.moved_t == 1.5
    p.update(2.0, 0, cpu=1.2, io=200)           # it read or wrote
    assert p.moved_t == 2.0
    p.update(2.5, 0, cpu=1.2, io=200, saving=True)  # in a saver, however idle
    assert p.moved_t == 2.5
    p.update(3.0, 1, cpu=1.2, io=200)           # the first step: not a gap
    p.update(3.5, 2, cpu=1.2, io=200)
    p.update(5.5, 3, cpu=1.2, io=200)
    assert (p.gaps, p.slowest) == (2, 2.0)
    # a steady pace, then one long stop: not regular until it leaves the window
    q = Progress(now=0.0)
    for k in range(1, 30):
        q.update(k * 0.5, k, cpu=None, io=None)
    assert q.regular(14.5)
    q.update(22.5, 30, cpu=None, io=None)
    assert not q.regular(22.5)


def test_the_options_and_their_variables(tmp_path):
    assert settings({})["hang_after"] is None and settings({})["on_hang"] == "save"
    assert settings({"DAIFU_HANG_AFTER": "off"})["hang_after"] == 0
    assert settings({"DAIFU_HANG_AFTER": "7.5"})["hang_after"] == 7.5
    assert settings({"DAIFU_WAIT": "inf"})["wait"] is None
    assert settings({"DAIFU_ON_HANG": "report", "DAIFU_CHECKPOINT": "0"})["on_hang"] == "report"
    bad = run_daifu(["--hang-after", "-3", "x.py"], cwd=tmp_path)
    assert bad.returncode == 2 and "--hang-after must be seconds > 0, auto or off, got '-3'" \
        in bad.stderr
    bad = run_daifu(["--on-hang", "kill", "x.py"], cwd=tmp_path)
    assert bad.returncode == 2 and "invalid choice: 'kill'" in bad.stderr


# -- torchrun jobs ------------------------------------------------------------------------

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="PyTorch not available")

#: the preempted job of tests/test_distributed.py, where rank 1 hangs before
#: step 20's backward pass (``--case hang``: in Python; ``gil``: in a C call
#: that holds the GIL) while rank 0 waits in DDP's all-reduce
TRAIN = PREEMPTED_DDP.replace(
    "import argparse, sys, time", "import argparse, ctypes, sys, time").replace(
    'p.add_argument("--out", default="final.pt")',
    'p.add_argument("--out", default="final.pt")\np.add_argument("--case", default="none")'
).replace(
    "        opt.zero_grad()\n",
    "        opt.zero_grad()\n"
    "        if not args.resume and rank == 1 and epoch * 8 + i == 20:\n"
    "            print(f'hanging {time.time()}', flush=True)\n"
    "            if args.case == 'hang':\n"
    "                time.sleep(600)  # HANG\n"
    "            if args.case == 'gil':\n"
    "                ctypes.PyDLL(None).sleep(600)  # HOLDS THE GIL\n")


def _line(marker: str) -> int:
    return next(n for n, text in enumerate(TRAIN.splitlines(), 1) if marker in text)


def launch(tmp_path, *args, daifu_args=(), env=None, timeout=240):
    """A 2-rank torchrun job of TRAIN under daifu."""
    (tmp_path / "train.py").write_text(TRAIN)
    full = {**os.environ, "OMP_NUM_THREADS": "1", "DAIFU_CONSOLE": "0",
            "DAIFU_CHECKPOINT_DIR": str(tmp_path / "ck"), **(env or {})}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", "-m", "daifu", "--log-file", "events-{rank}.jsonl", *daifu_args, "train.py",
           *args]
    started = time.monotonic()
    run = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=timeout,
                         env=full, stdin=subprocess.DEVNULL)
    run.took = time.monotonic() - started  # type: ignore[attr-defined]
    return run


def events(tmp_path, name):
    return {r: [e for e in read_events(tmp_path / f"events-{r}.jsonl") if e["event"] == name]
            for r in (0, 1) if (tmp_path / f"events-{r}.jsonl").exists()}


def plain(tmp_path, *args):
    """The job without daifu, run again if gloo aborted a rank (torch 2.13's
    gloo sometimes ends a rank with SIGABRT under load, with or without daifu)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for _ in range(3):
        run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                              "--nproc-per-node", "2", "train.py", *args], cwd=tmp_path,
                             capture_output=True, text=True, timeout=240, env=env)
        if run.returncode == 0 or "exitcode: -6" not in run.stderr:
            return run
    return run


@pytest.mark.slow
@needs_torch
def test_a_rank_hung_in_python_is_named_every_rank_saves_and_the_job_resumes_exactly(tmp_path):
    """Rank 1 sleeps forever at step 20; rank 0 waits in DDP's all-reduce.
    The watchdog names rank 1 and its line within 3 x the slowest step plus
    a bounded slack, both ranks save, the job ends with status 124, and the
    job launched again from the manifest ends bit-identical to a run that
    never hung (a shuffled sampler, dropout, momentum)."""
    run = launch(tmp_path, "--case", "hang", "--pause", "0.05")
    assert "hanging" in run.stdout, run.stderr[-3000:]
    assert "exitcode  : 124" in run.stderr, run.stderr[-3000:]
    hung_at = float(run.stdout.split("hanging ")[1].split()[0])
    [hang] = events(tmp_path, "hang.detected")[0]
    assert hang["behind"] == 1, hang
    assert hang["at"].startswith(f"{tmp_path / 'train.py'}:{_line('# HANG')} in <module>")
    assert "all_reduce" in hang["waiting"] and hang["action"] == "save"
    assert any("rank 1 is behind in process group 0" in line for line in hang["diagnosis"])
    # within 3 x the slowest step (at least MIN_HANG_S) plus the watchdog's
    # tick, the doctor's round and a loaded machine's slack
    detected = datetime.datetime.fromisoformat(hang["timestamp"].replace("Z", "+00:00")) \
        .timestamp()
    assert hang["threshold_s"] == MIN_HANG_S
    assert detected - hung_at < hang["threshold_s"] + 6.0, (detected - hung_at, hang)
    assert "daifu: the job hangs: rank 1 has not moved" in run.stderr
    saved = events(tmp_path, "checkpoint.saved")
    assert [len(saved[0]), len(saved[1])] == [1, 1], run.stderr[-3000:]
    assert {s[0]["position"]["state"] for s in saved.values()} == {"mid-iteration"}
    [manifest] = events(tmp_path, "checkpoint.manifest")[0]
    assert manifest["consistent"] and manifest["missing"] == [] and manifest["step"] == 20
    assert json.loads(Path(manifest["path"]).read_text())["reason"] == "hang"
    # launched again (torchrun --max-restarts would; see docs/limitations.md)
    resumed = plain(tmp_path, "--resume", manifest["path"], "--out", "live.pt")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    ref = plain(tmp_path, "--out", "ref.pt")
    assert ref.returncode == 0, ref.stderr[-3000:]
    assert_identical(load_params(tmp_path / "live.pt"), load_params(tmp_path / "ref.pt"))


@pytest.mark.slow
@needs_torch
def test_a_rank_holding_the_interpreter_in_c_is_named_and_the_others_save(tmp_path):
    """Rank 1 in a C call that holds the GIL: its watchdog cannot run, so it
    stops posting (``--pause``: it has posted its second step by then; a
    rank stuck so before is judged at the first steps' 300 s).  Rank 0
    names it with the line it was last seen at, saves, and the manifest
    says rank 1 saved nothing."""
    run = launch(tmp_path, "--case", "gil", "--pause", "0.05")
    assert "hanging" in run.stdout, run.stderr[-3000:]
    [hang] = events(tmp_path, "hang.detected")[0]
    assert hang["behind"] == 1 and "it no longer answers" in hang["at"], hang
    assert hang["at"].startswith(f"{tmp_path / 'train.py'}:")
    [manifest] = events(tmp_path, "checkpoint.manifest")[0]
    assert manifest["missing"] == [1] and not manifest["consistent"]
    assert len(events(tmp_path, "checkpoint.saved")[0]) == 1
    assert run.returncode != 0


def test_what_a_hang_does_follows_the_options():
    """save at once by default; after --wait S with a person to act; never
    with --wait inf, --on-hang report or --no-checkpoint."""
    def dog(**env):
        return _watchdog.Watchdog(None, b"k" * 32, "job", 2, 0, settings(env), engine=None)

    assert dog()._action() == "save" and dog()._save_now(0.0)
    waits = dog(DAIFU_WAIT="30")
    assert waits._action() == "wait"
    assert not waits._save_now(29.0) and waits._save_now(30.0)
    forever = dog(DAIFU_WAIT="inf")
    assert forever._action() == "wait" and not forever._save_now(1e9)
    for env in ({"DAIFU_ON_HANG": "report"}, {"DAIFU_CHECKPOINT": "0"}):
        assert dog(**env)._action() == "report" and not dog(**env)._save_now(1e9)


def test_no_watchdog_outside_a_launcher_or_when_turned_off(monkeypatch):
    monkeypatch.setattr(_watchdog, "_state", type(_watchdog._state)())  # (no watchdog yet)
    monkeypatch.delenv("RANK", raising=False)
    _watchdog.start(engine=None)
    assert _watchdog._state.dog is None
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("DAIFU_HANG_AFTER", "off")
    _watchdog.start(engine=None)
    assert _watchdog._state.dog is None


@pytest.mark.slow
@needs_torch
def test_with_wait_the_hung_job_waits_for_a_person_then_saves(tmp_path):
    """``--wait 6``: the hang is named with how to look at it, nothing is
    saved for 6 s (the peers' collective timeouts are extended by the wait),
    then every rank saves as without a person."""
    run = launch(tmp_path, "--case", "hang", "--pause", "0.05", daifu_args=["--wait", "6"])
    assert "exitcode  : 124" in run.stderr, run.stderr[-3000:]
    [hang] = events(tmp_path, "hang.detected")[0]
    assert hang["behind"] == 1 and hang["action"] == "wait"
    assert "the job waits 6 s for you, then every rank saves (python -m daifu stacks --job" \
        in run.stderr
    saved = events(tmp_path, "checkpoint.saved")
    assert [len(saved[0]), len(saved[1])] == [1, 1], run.stderr[-3000:]

    def stamp(e):
        return datetime.datetime.fromisoformat(e["timestamp"].replace("Z", "+00:00")).timestamp()

    assert min(stamp(s[0]) for s in saved.values()) - stamp(hang) >= 6.0
    [manifest] = events(tmp_path, "checkpoint.manifest")[0]
    assert manifest["consistent"]
