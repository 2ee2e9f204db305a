"""Distributed jobs (torchrun, gloo, CPU): what daifu does per rank today."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="PyTorch not available")

from .support import (  # noqa: E402
    PREEMPTED_DDP,
    PREEMPTED_FSDP,
    assert_identical,
    load_params,
    read_events,
    run_daifu,
)

pytestmark = pytest.mark.slow

TRAIN = textwrap.dedent('''
    import os, sys
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    # per rank, the loss scale of each step; a missing step is the bug
    SCALES = {{r: {{s: 1.0 for s in range(6) if (r, s) not in {bad}}} for r in range(2)}}

    def step_loss(model, x, y, rank, step):
        scale = SCALES[rank][step]
        return nn.functional.mse_loss(model(x), y) * scale

    def main():
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        torch.manual_seed(0)
        torch.set_num_threads(1)
        model = nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(rank)
        for step in range(6):
            x, y = torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)
            loss = step_loss(model, x, y, rank, step)
            opt.zero_grad()
            loss.backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= dist.get_world_size()
            opt.step()
        if rank == 0:
            torch.save(model.state_dict(), sys.argv[1])
        dist.destroy_process_group()

    main()
''')

FIX = '''
import daifu

@daifu.on(KeyError, where="step_loss")
def repair(crash):
    crash.globals["SCALES"][crash.vars["rank"]][crash.vars["step"]] = 1.0
    return daifu.RETRY
'''


def torchrun(args, cwd, extra_env=None, nproc: int = 2):
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(extra_env or {})}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", str(nproc), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env=env)


def reference(cwd, nproc: int = 2):
    """The uninterrupted run of the corrected program (no daifu in it), run
    again (four times at most) if gloo aborted a rank: torch 2.13's gloo sometimes
    ends a rank with std::terminate ("terminate called without an active
    exception", SIGABRT) under load, with or without daifu -- the crash
    benchmark's reference runs do the same.  Runs under daifu are never
    retried."""
    return plain_torchrun(["ref.py", "ref.pt"], cwd, nproc=nproc)


def plain_torchrun(args, cwd, nproc: int = 2):
    """A run without daifu in it, run again (four times at most) if gloo
    aborted a rank (``reference``; a CI run met three aborts in a row of the
    four-rank reference while the 3.13 suite ran beside it)."""
    run = torchrun(args, cwd, nproc=nproc)
    for _ in range(4):
        if run.returncode == 0 or "SIGABRT" not in run.stderr and "exitcode: -6" not in run.stderr:
            break
        run = torchrun(args, cwd, nproc=nproc)
    return run


def test_each_rank_fixed_by_a_rule_with_per_rank_logs_carrying_the_rank(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN.format(bad="{(1, 3)}"))
    (tmp_path / "fix.py").write_text(FIX)
    (tmp_path / "ref.py").write_text(TRAIN.format(bad="()"))
    ref = reference(tmp_path)
    assert ref.returncode == 0, ref.stderr[-3000:]
    # --log-file (torchrun takes --log for its own --log-dir) with one file per rank
    live = torchrun(["-m", "daifu", "--log-file", "events-{rank}.jsonl", "--log-level", "debug",
                     "--journal", "journal-{rank}.jsonl", "--fixes", "fix.py",
                     "train.py", "live.pt"], tmp_path)
    assert live.returncode == 0, live.stderr[-3000:]
    assert_identical(load_params(tmp_path / "live.pt"), load_params(tmp_path / "ref.pt"))
    for rank in (0, 1):
        events = read_events(tmp_path / f"events-{rank}.jsonl")
        assert events and all(e["rank"] == rank and e["world_size"] == 2 and e["local_rank"]
                              == rank and e["job"] for e in events)
    crashes = [e for e in read_events(tmp_path / "events-1.jsonl")
               if e["event"] == "crash.intercepted"]
    assert [c["function"] for c in crashes] == ["step_loss"]
    assert not [e for e in read_events(tmp_path / "events-0.jsonl")
                if e["event"] == "crash.intercepted"]
    # the journal of the crashed rank: its records say which rank it is
    records = read_events(tmp_path / "journal-1.jsonl")
    assert records and {(r["type"], r["rank"], r["world_size"]) for r in records} >= {
        ("crash", 1, 2), ("outcome", 1, 2)}
    assert not (tmp_path / "journal-0.jsonl").exists()  # nothing crashed on rank 0


def test_daifu_around_the_launcher_is_refused_with_how_to_launch(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    proc = run_daifu(["-m", "torch.distributed.run", "--nproc-per-node", "2", "train.py"],
                     cwd=tmp_path)
    assert proc.returncode == 2 and not proc.stdout
    assert "vaccinate the launcher" in proc.stderr
    assert "torchrun [torchrun options] -m daifu [daifu options] train.py" in proc.stderr


MAIN_RULES = '''
import daifu

@daifu.on(KeyError, where="main")
def redo_the_call(crash):  # refused: the call already all-reduced the loss metric
    crash.globals["SCALES"][crash.vars["rank"]][crash.vars["step"]] = 1.0
    return daifu.RETRY

@daifu.on(KeyError, where="main")
def drop_it_on_all_ranks(crash):  # refused: rank 0 did not crash, it waits in a collective
    return daifu.all_ranks(daifu.CONTINUE)
'''

METRIC = TRAIN.replace(
    "    scale = SCALES[rank][step]\n    return nn.functional.mse_loss(model(x), y) * scale",
    "    loss = nn.functional.mse_loss(model(x), y)\n"
    "    metric = loss.detach().clone()\n"
    "    dist.all_reduce(metric)\n"
    "    return loss * SCALES[rank][step]")


def test_rank_local_retry_after_a_collective_and_a_lone_all_ranks_decision_are_refused(
        tmp_path):
    """Without a fix that keeps the ranks in step the job fails as without
    daifu -- fast, with the crashed rank's exception -- after each refusal
    said why."""
    assert METRIC != TRAIN
    (tmp_path / "train.py").write_text(METRIC.format(bad="{(1, 3)}"))
    (tmp_path / "fix.py").write_text(MAIN_RULES)
    env = {"DAIFU_AGREE_TIMEOUT": "3"}
    proc = torchrun(["-m", "daifu", "--log-file", "events-{rank}.jsonl", "--fixes", "fix.py",
                     "train.py", "live.pt"], tmp_path, env)
    assert proc.returncode != 0
    assert "KeyError" in proc.stderr
    rejected = [e["reason"] for e in read_events(tmp_path / "events-1.jsonl")
                if e["event"] == "patch.rejected"]
    assert len(rejected) == 2, rejected
    assert "already ran all_reduce" in rejected[0]
    # rank 0 never crashed: the agreement fails fast, not after the 3 s
    assert "rank 0 is not at a crash" in rejected[1] and "refused after 2s" in rejected[1]


def test_nobody_fixes_it_the_job_fails_fast_and_clearly(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN.format(bad="{(1, 3)}"))
    import time

    started = time.monotonic()
    proc = torchrun(["-m", "daifu", "--wait", "2", "train.py", "live.pt"], tmp_path)
    took = time.monotonic() - started
    assert proc.returncode != 0
    assert "KeyError: 3" in proc.stderr and "waiting up to 2s for a fix" in proc.stderr
    assert took < 40, took  # not the extended timeout (62 s on top of gloo's 30 min)
    assert not (tmp_path / "live.pt").exists()


def test_one_console_for_the_job_on_a_shared_terminal(tmp_path):
    """Both ranks crash on one terminal: rank-ownership of the console, the
    other rank listed, one `all` command for both, bit-identical."""
    import pty
    import select
    import time

    (tmp_path / "train.py").write_text(TRAIN.format(bad="{(0, 3), (1, 3)}"))
    (tmp_path / "ref.py").write_text(TRAIN.format(bad="()"))
    assert reference(tmp_path).returncode == 0
    pid, fd = pty.fork()
    if pid == 0:  # the child: torchrun on the terminal
        os.chdir(tmp_path)
        os.environ["OMP_NUM_THREADS"] = "1"
        os.execv(sys.executable, [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                  "--nproc-per-node", "2", "-m", "daifu", "train.py", "live.pt"])
    seen = b""

    def read_until(marker: bytes, timeout: float = 120, since: int = 0) -> None:
        """Read the terminal until ``marker`` appears after offset ``since``."""
        nonlocal seen
        deadline = time.monotonic() + timeout
        while marker not in seen[since:]:
            assert time.monotonic() < deadline, seen.decode(errors="replace")[-3000:]
            ready, _, _ = select.select([fd], [], [], 0.5)
            if ready:
                try:
                    seen += os.read(fd, 65536)
                except OSError:
                    break

    def command(line: bytes, until: bytes, timeout: float = 30) -> int:
        """Type ``line``; wait for ``until`` in what follows; return where it began."""
        mark = len(seen)
        os.write(fd, line + b"\n")
        read_until(until, timeout, mark)
        return mark

    try:
        read_until(b"(daifu) ")
        read_until(b"crashed too")  # the other rank waits and says where the console is
        mark = command(b"ranks", b"\n  rank ")
        read_until(b"(daifu) ", 30, mark)
        other = re.search(rb"\n  rank (\d) \(pid \d+\): ", seen[mark:]).group(1)
        mark = command(b"rank " + other, b"(daifu rank " + other + b") ")  # switch ranks
        command(b"p rank", b"\n" + other + b"\r\n")
        command(b"back", b"back at rank")
        assert b"Traceback" not in seen[mark:]
        command(b"all exec SCALES[rank][step] = 1.0", b"(daifu) ")
        os.write(fd, b"all retry\n")
        _, status = os.waitpid(pid, 0)
    finally:
        try:
            os.kill(pid, 9)
        except OSError:
            pass
        read_until(b"", 1)
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0, seen.decode(errors="replace")[-3000:]
    text = seen.decode(errors="replace")
    assert text.count("type help for commands") == 1  # one console, not one per rank
    assert re.search(r"  on rank [01] of 2 \(local rank [01], pid \d+\), job ", text)
    assert_identical(load_params(tmp_path / "live.pt"), load_params(tmp_path / "ref.pt"))


def test_a_rule_decision_for_all_ranks_runs_when_every_rank_takes_it(tmp_path):
    """Both ranks crash at the same step; the rule's all-ranks CONTINUE drops
    the step on both (agreed in the store), so the result equals a program
    that skips that step on every rank."""
    (tmp_path / "train.py").write_text(TRAIN.format(bad="{(0, 3), (1, 3)}"))
    skipping = TRAIN.format(bad="()").replace(
        "        loss = step_loss(model, x, y, rank, step)\n",
        "        if step == 3:\n            continue\n"
        "        loss = step_loss(model, x, y, rank, step)\n")
    assert skipping != TRAIN.format(bad="()")
    (tmp_path / "ref.py").write_text(skipping)
    (tmp_path / "fix.py").write_text(
        "import daifu\n\n"
        "@daifu.on(KeyError, where='main')\n"
        "def drop_the_step_everywhere(crash):\n"
        "    return daifu.all_ranks(daifu.CONTINUE)\n")
    assert reference(tmp_path).returncode == 0
    live = torchrun(["-m", "daifu", "--log-file", "events-{rank}.jsonl", "--fixes", "fix.py",
                     "train.py", "live.pt"], tmp_path)
    assert live.returncode == 0, live.stderr[-3000:]
    assert_identical(load_params(tmp_path / "live.pt"), load_params(tmp_path / "ref.pt"))
    for rank in (0, 1):
        events = read_events(tmp_path / f"events-{rank}.jsonl")
        applied = [e for e in events if e["event"] == "patch.applied"]
        assert [a["summary"] for a in applied] == ["continue (all ranks)"], applied
        assert not [e for e in events if e["event"] == "patch.rejected"]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_jobs_launched_alike_on_one_machine_stay_apart(tmp_path):
    """torchrun without --standalone or --rdzv-id gives both jobs the run id
    ``none``: each must still be its own job -- its own ranks listed, and a
    ``send --job`` to it fixes it and leaves the other one waiting."""
    import json
    import time

    (tmp_path / "ref.py").write_text(TRAIN.format(bad="()"))
    assert reference(tmp_path).returncode == 0
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    jobs, ranks = {}, []
    for name in ("a", "b"):
        work = tmp_path / name
        work.mkdir()
        (work / "train.py").write_text(TRAIN.format(bad="{(0, 3), (1, 3)}"))
        jobs[name] = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
             "--master-addr", "127.0.0.1", "--master-port", str(_free_port()),
             "-m", "daifu", "--wait", "120", "train.py", "live.pt"],
            cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            listed = json.loads(run_daifu(["ps", "--json"], tmp_path).stdout or "[]")
            ranks = [j for j in listed if j["state"] == "waiting" and "rank" in j]
            if len(ranks) == 4:
                break
            assert time.monotonic() < deadline, listed
            time.sleep(0.5)
        by_job: dict = {}
        for rank in ranks:
            by_job.setdefault(rank["job"], []).append(rank)
        assert len(by_job) == 2, by_job  # two jobs, not one of four ranks
        for members in by_job.values():
            assert sorted(r["rank"] for r in members) == [0, 1]
            assert len({os.path.dirname(r["where"]) for r in members}) == 1
        (job_a, members_a), (job_b, _) = sorted(
            by_job.items(), key=lambda item: f"{os.sep}b{os.sep}" in item[1][0]["where"])
        assert f"{os.sep}a{os.sep}train.py" in members_a[0]["where"]
        pid_a = members_a[0]["pid"]
        fixed = run_daifu(["send", "--job", pid_a, "exec", "SCALES[rank][step] = 1.0"],
                          tmp_path)
        assert fixed.returncode == 1, fixed.stderr  # applied; the ranks still wait
        resumed = run_daifu(["send", "--job", pid_a, "retry"], tmp_path)
        assert resumed.returncode == 0, resumed.stderr
        out_a = jobs["a"].communicate(timeout=120)
        assert jobs["a"].returncode == 0, out_a[1][-3000:]
        assert_identical(load_params(tmp_path / "a" / "live.pt"), load_params(tmp_path / "ref.pt"))
        # job B was not touched: both its ranks still wait at their crash
        listed = json.loads(run_daifu(["ps", "--json"], tmp_path).stdout or "[]")
        waiting_b = [j for j in listed if j.get("job") == job_b and j["state"] == "waiting"]
        assert sorted(r["rank"] for r in waiting_b) == [0, 1]
        assert jobs["b"].poll() is None
        # and it is still steered on its own: given up, it fails as without daifu
        run_daifu(["send", "--job", waiting_b[0]["pid"], "abort"], tmp_path)
        out_b = jobs["b"].communicate(timeout=120)
        assert jobs["b"].returncode != 0 and "KeyError: 3" in out_b[1]
    finally:
        for rank in ranks:  # torchrun starts each rank in a session of its own
            try:
                os.kill(rank["pid"], 9)
            except (OSError, NameError):
                pass
        for proc in jobs.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


HUNG = textwrap.dedent('''
    import os, time
    import torch
    import torch.distributed as dist

    def slow_data():
        time.sleep(60)  # rank 1 is stuck here; rank 0 waits in the all_reduce

    def main():
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        for step in range(1):
            print(f"rank {rank} ready", flush=True)
            if rank == 1:
                slow_data()
            dist.all_reduce(torch.ones(1))

    main()
''')


def test_stacks_of_a_hung_job_name_the_rank_that_is_behind(tmp_path):
    """``python -m daifu stacks --job PID`` while rank 0 waits in an
    all_reduce (blocked in gloo) and rank 1 is elsewhere."""
    import json
    import time

    (tmp_path / "hung.py").write_text(HUNG)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DAIFU_CONSOLE": "0"}
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                             "--nproc-per-node", "2", "-m", "daifu", "hung.py"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        ranks: dict = {}
        deadline = time.monotonic() + 120
        while len(ranks) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
            listed = json.loads(run_daifu(["ps", "--json"], cwd=tmp_path).stdout or "[]")
            ranks = {j["rank"]: j["pid"] for j in listed
                     if "hung.py" in " ".join(map(str, j.get("argv", []))) and "rank" in j}
        assert len(ranks) == 2, ranks
        deadline = time.monotonic() + 60
        while True:  # (until both are past init, rank 0 in the all_reduce: a busy machine)
            got = run_daifu(["stacks", "--job", ranks[0]], cwd=tmp_path)
            if "is behind" in got.stdout or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert got.returncode == 0, got.stderr
        assert "=== rank 0" in got.stdout and "=== rank 1" in got.stdout
        # (through the job's store: the flight recorder's sequence numbers say who is behind)
        assert "rank 1 is behind in process group 0: its last collective is none yet; rank 0 " \
               "issued #1 all_reduce" in got.stdout, got.stdout
        assert "in slow_data" in got.stdout.split("rank 1 is at ")[1]
    finally:
        import signal

        for pid in ranks.values():  # (torchrun starts its ranks in sessions of their own)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()


SPAWNED = '''
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

TABLE = {0: 1.0}


def work(rank, world, init):
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    value = TABLE[rank]              # rank 1 has no entry
    total = torch.tensor([value])
    dist.all_reduce(total)
    print(f"rank {rank} total {total.item()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(work, args=(2, sys.argv[1]), nprocs=2)
'''

SPAWNED_FIX = '''
import daifu

@daifu.on(KeyError)
def fill_in(crash):
    crash.globals["TABLE"][crash.vars["rank"]] = 2.0
    return daifu.RETRY
'''


def test_rank_placeholders_under_mp_spawn_name_each_process_by_its_group_rank(tmp_path):
    """mp.spawn sets no RANK: {rank} in --log-file and --journal is the rank of
    the process group each process made, not 0 in every process."""
    (tmp_path / "spawned.py").write_text(SPAWNED)
    (tmp_path / "fix.py").write_text(SPAWNED_FIX)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("RANK", None)
    proc = subprocess.run([sys.executable, "-m", "daifu", "--log-file", "events-{rank}.jsonl",
                           "--journal", "journal-{rank}.jsonl", "--fixes", "fix.py",
                           "spawned.py", str(tmp_path / "init")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "rank 0 total 3.0" in proc.stdout and "rank 1 total 3.0" in proc.stdout
    crashed = [e for e in read_events(tmp_path / "events-1.jsonl")
               if e["event"] == "crash.intercepted"]
    assert len(crashed) == 1 and crashed[0]["exc_type"] == "KeyError"
    assert (tmp_path / "journal-1.jsonl").exists()
    assert not (tmp_path / "events-0.jsonl").exists() or not [
        e for e in read_events(tmp_path / "events-0.jsonl") if e["event"] == "crash.intercepted"]


# -- two nodes on this machine: two torchrun launchers with a c10d rendezvous ---------------


class TwoNodes:
    """A job of four ranks on two simulated nodes: two torchrun launchers
    (``--nnodes 2``, two ranks each) meeting at a c10d rendezvous on
    127.0.0.1, each node with a runtime directory of its own (its ranks'
    control sockets: what one node cannot see of the other)."""

    def __init__(self, tmp_path, args: list[str], env: dict | None = None):
        self.tmp_path = tmp_path
        port = _free_port()
        self.runtime = []
        self.launchers = []
        for node in (0, 1):
            run = tmp_path / f"node{node}"
            run.mkdir(mode=0o700)
            self.runtime.append(str(run))
            self.launchers.append(subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                 "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                 f"127.0.0.1:{port}", "--rdzv-id", f"two-nodes-{port}", "-m", "daifu", *args],
                cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                start_new_session=True,
                env={**os.environ, "OMP_NUM_THREADS": "1", "DAIFU_RUNTIME_DIR": str(run),
                     **(env or {})}))
        self.pids: set[int] = set()

    def daifu(self, node: int, *args, timeout: float = 120):
        """``python -m daifu ARGS`` on ``node``."""
        return run_daifu(list(args), self.tmp_path, env={"DAIFU_RUNTIME_DIR": self.runtime[node]},
                         timeout=timeout)

    def ranks(self, node: int, state: str | None = None) -> list[dict]:
        """``ps --json`` on ``node``: the job's ranks there and, through its store, elsewhere."""
        import json

        listed = json.loads(self.daifu(node, "ps", "--json").stdout or "[]")
        found = [j for j in listed if "rank" in j and (state is None or j["state"] == state)]
        self.pids |= {j["pid"] for j in found}
        return found

    def wait_for(self, count: int, state: str | None = None, timeout: float = 120) -> list[dict]:
        import time

        deadline = time.monotonic() + timeout
        while True:
            found = self.ranks(0, state)
            if len(found) >= count:
                return found
            assert time.monotonic() < deadline, (found, self.output())
            assert all(p.poll() is None for p in self.launchers), self.output()
            time.sleep(0.5)

    def output(self) -> str:
        return "".join(f"--- node {n} (exit {p.poll()})\n" for n, p in enumerate(self.launchers))

    def close(self) -> None:
        import signal

        for pid in self.pids:  # (torchrun starts each rank in a session of its own)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for proc in self.launchers:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.communicate()


FOUR = TRAIN.replace("for r in range(2)", "for r in range(4)")

#: another user who can reach the job's store (a plain TCPStore client: no daifu
#: key; as uid 65534 when the tests run as root), steered by JSON lines
ATTACKER = textwrap.dedent('''
    import datetime, json, os, sys, time
    import torch.distributed as dist
    if os.geteuid() == 0:  # (after the imports: root's Python is not readable by others)
        os.setgid(65534)
        os.setuid(65534)
    store = dist.TCPStore(sys.argv[1], int(sys.argv[2]), is_master=False,
                          timeout=datetime.timedelta(seconds=60))
    held = []
    print(json.dumps({"uid": os.geteuid()}), flush=True)
    for line in sys.stdin:
        cmd, out = json.loads(line), {}
        if cmd["op"] == "find":  # which of these keys exists
            out["found"] = next((n for n in cmd["names"] if store.check([n])), None)
        elif cmd["op"] == "forge":  # once src is there: dst = src's value, or a text
            store.wait([cmd["src"]], datetime.timedelta(seconds=60))
            for dst, text in cmd["dst"].items():
                store.set(dst, store.get(cmd["src"]) if text is None else text)
        elif cmd["op"] == "steal":  # pop the next n items pushed onto a queue
            end = time.monotonic() + cmd["seconds"]
            while len(held) < cmd["n"] and time.monotonic() < end:
                if store.queue_len(cmd["queue"]):
                    held.append(store.queue_pop(cmd["queue"], False))
                else:
                    time.sleep(0.002)
        elif cmd["op"] == "push":
            store.queue_push(cmd["queue"], held[cmd["index"]])
        out["held"] = len(held)
        print(json.dumps(out), flush=True)
''')


class Attacker:
    def __init__(self, tmp_path, store: str):
        host, _, port = store.rpartition(":")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", ATTACKER, host, port], cwd="/", stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True,
            env={"PATH": os.environ.get("PATH", ""), "HOME": "/tmp", "OMP_NUM_THREADS": "1"})
        self.uid = self.read()["uid"]

    def read(self) -> dict:
        import json

        line = self.proc.stdout.readline()
        assert line, "the attacker's process ended"
        return json.loads(line)

    def send(self, **cmd) -> None:
        import json

        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def __call__(self, **cmd) -> dict:
        self.send(**cmd)
        return self.read()

    def close(self) -> None:
        self.proc.kill()
        self.proc.communicate()


def test_two_nodes_no_other_user_steers_the_job_and_any_rank_is_reached_from_any_node(
        tmp_path):
    """Every rank crashes at step 3 on both nodes.  ``ps`` on one node lists
    the four ranks; a rank's console (``ranks``) lists the other three.
    Another user who can reach the job's store forges the other ranks'
    answers to a retry for all ranks sent to rank 0 alone: dropped, refused.
    They pop the owner's ``exec`` from rank 0's queue: the owner is told it
    was not delivered, and pushed back (again, and onto rank 1's queue) it
    never runs.  Then one ``send --job`` from node 1 fixes every rank and
    ``send --job PID --rank N retry`` from node 0 resumes each, including the
    ranks on node 1: bit-identical to an uninterrupted run of the corrected
    program."""
    import threading
    import time

    from daifu.engine.remote._jobstore import Channel, _queue

    assert FOUR != TRAIN
    (tmp_path / "train.py").write_text(FOUR.format(bad="{(0, 3), (1, 3), (2, 3), (3, 3)}"))
    (tmp_path / "ref.py").write_text(FOUR.format(bad="()"))
    ref = reference(tmp_path, nproc=4)
    assert ref.returncode == 0, ref.stderr[-3000:]
    nodes = TwoNodes(tmp_path, ["--wait", "120", "--log-file", "events-{rank}.jsonl",
                                "train.py", "live.pt"], env={"DAIFU_AGREE_TIMEOUT": "4"})
    attacker = None
    try:
        waiting = nodes.wait_for(4, "waiting")
        assert sorted(j["rank"] for j in waiting) == [0, 1, 2, 3]
        here = {j["pid"] for j in waiting if j.get("host") is None}  # (node 0's own sockets)
        assert len(here) == 2, waiting
        on_node0 = sorted((j for j in waiting if j["pid"] in here), key=lambda j: j["rank"])
        listed = nodes.daifu(0, "send", on_node0[0]["pid"], "ranks")
        assert listed.returncode == 1, listed.stderr
        others = re.findall(r"\n  rank (\d) \(pid \d+\): .*train\.py:\d+ KeyError",
                            listed.stdout)
        assert sorted(others) == sorted({"0", "1", "2", "3"} - {str(on_node0[0]["rank"])}), \
            listed.stdout
        rank0 = next(j for j in waiting if j["rank"] == 0)
        job, store = rank0["job"], rank0["job"].rpartition("@")[2]
        attacker = Attacker(tmp_path, store)
        assert attacker.uid != 0 or os.geteuid() != 0
        prefix = attacker(op="find", names=[f"{p}daifu/at-crash/0" for p in (
            "default_pg/0//", "/worker/attempt_0/default_pg/0//", "")])["found"]
        assert prefix, "rank 0's at-crash mark is not in the store"
        prefix = prefix[:-len("daifu/at-crash/0")]
        # 1. a retry for all ranks, sent to rank 0 alone: the others' answers forged
        addr, _, port = store.rpartition(":")
        owner = Channel(job, addr, int(port), 4)
        what = f"{rank0['where']}|{rank0['statement']}|retry"
        attacker.send(op="forge", src=f"{prefix}daifu/agree/1/0", dst={
            f"{prefix}daifu/agree/1/1": None,  # rank 0's own answer, moved
            f"{prefix}daifu/agree/1/2": what, f"{prefix}daifu/agree/1/3": what})
        refused: dict = {}
        retry = threading.Thread(target=lambda: refused.update(owner.ask(
            [0], {"op": "send", "cmd": "retry", "scope": "job"}, 60.0)))
        retry.start()
        attacker.read()  # (forged, as soon as rank 0 posted its answer)
        # 2. meanwhile (rank 0's relay waits in the agreement) the owner's exec
        # to rank 0 is popped from its queue, and its cancel after it
        attacker.send(op="steal", queue=_queue(job, 0), n=2, seconds=20)
        told = Channel(job, addr, int(port), 4).ask(  # (a client of its own: another thread)
            [0], {"op": "send", "cmd": "exec\nMARK = 1\n"}, 1.5)[0]
        assert attacker.read()["held"] == 2
        assert told["delivered"] is False and "it will never run" in told["error"], told
        retry.join()
        assert not refused[0]["ok"] and not refused[0]["resumed"], refused
        assert "retry for all ranks: not every rank of the job took it within 4s" in \
            refused[0]["output"] and "daifu/agree/1/1, daifu/agree/1/2, daifu/agree/1/3 is " \
            "not sealed by a rank of this job" in refused[0]["output"], refused
        time.sleep(0.5)  # (later: its sender was told it failed)
        for queue in (_queue(job, 0), _queue(job, 0), _queue(job, 1)):  # back, again, moved
            attacker(op="push", queue=queue, index=0)
        node1_pid = next(j["pid"] for j in nodes.ranks(1, "waiting") if j.get("host") is None)
        mark = nodes.daifu(1, "send", "--job", node1_pid, "--rank", "0", "p",
                           "globals().get('MARK')")
        assert mark.returncode == 1 and mark.stdout.strip().endswith("None"), \
            mark.stdout + mark.stderr
        dropped = {r: [e["reason"] for e in read_events(tmp_path / f"events-{r}.jsonl")
                       if e["event"] == "store.dropped"] for r in (0, 1)}
        assert any(r.startswith("not sealed for rank 1's agree of round 1") for r in
                   dropped[0]), dropped
        assert any(r.startswith("unconfirmed") for r in dropped[0]), dropped
        assert any(r.startswith("replayed") for r in dropped[0]), dropped
        assert any(r.startswith("not sealed for rank 1 of this job") for r in dropped[1]), \
            dropped
        # 3. the owner fixes every rank from node 1, and resumes each from node 0
        fixed = nodes.daifu(1, "send", "--job", node1_pid, "exec", "SCALES[rank][step] = 1.0")
        assert fixed.returncode == 1, fixed.stdout + fixed.stderr  # applied; all still wait
        assert "not waiting" not in fixed.stderr and "did not answer" not in fixed.stderr
        node1_ranks = sorted(j["rank"] for j in nodes.ranks(1, "waiting") if j.get("host")
                             is None)
        for rank in node1_ranks + [r for r in range(4) if r not in node1_ranks]:
            resumed = nodes.daifu(0, "send", "--job", on_node0[0]["pid"], "--rank", rank,
                                  "retry")
            assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        for proc in nodes.launchers:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err[-3000:]
    finally:
        if attacker is not None:
            attacker.close()
        nodes.close()
    assert_identical(load_params(tmp_path / "live.pt"), load_params(tmp_path / "ref.pt"))


HUNG_FOUR = textwrap.dedent('''
    import time
    import torch
    import torch.distributed as dist

    def idle():
        time.sleep(120)  # rank 3 left out the last all_reduce; the others wait in it

    def main():
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        for step in range(3):
            if rank == 3 and step == 2:
                continue  # the bug: rank 3 skips one collective
            dist.all_reduce(torch.ones(2))
        if rank == 3:
            idle()
        dist.barrier()

    main()
''')


def test_stacks_of_a_two_node_job_name_the_rank_that_skipped_a_collective(tmp_path):
    """``stacks --job`` from node 1, while three ranks wait in an all_reduce
    (blocked in gloo) that rank 3, on node 1, left out."""
    import time

    (tmp_path / "hung.py").write_text(HUNG_FOUR)
    nodes = TwoNodes(tmp_path, ["hung.py"], env={"DAIFU_CONSOLE": "0"})
    try:
        nodes.wait_for(4)
        pid = next(j["pid"] for j in nodes.ranks(1) if j.get("host") is None)
        deadline = time.monotonic() + 60
        while True:
            got = nodes.daifu(1, "stacks", "--job", pid)
            if "is behind" in got.stdout or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert got.returncode == 0, got.stdout + got.stderr
        for rank in range(4):
            assert f"=== rank {rank} (pid " in got.stdout
        assert "rank 3 is behind in process group 0: its last collective is #2 all_reduce " \
               "[[2]]" in got.stdout, got.stdout
        assert "ranks 0, 1, 2 issued #3 all_reduce [[2]]" in got.stdout
        assert "hung.py:7 in idle" in got.stdout.split("rank 3 is at ")[1]
    finally:
        nodes.close()


# -- a preempted job: SIGTERM to torchrun's agent -----------------------------------------



def _launch_until(tmp_path, args: list[str], marker: str, daifu_args=()) -> subprocess.Popen:
    """torchrun -m daifu train.py ARGS (2 ranks, gloo), returned once rank 0
    printed a line starting with ``marker``."""
    import time

    env = {**os.environ, "OMP_NUM_THREADS": "1", "DAIFU_CONSOLE": "0",
           "DAIFU_CHECKPOINT_DIR": str(tmp_path / "ck")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", "daifu", *daifu_args, "--log-file", "events-{rank}.jsonl", "train.py", *args],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        stdin=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, proc.communicate(timeout=60)
            if line.startswith(marker):
                return proc
        raise AssertionError(f"no line {marker!r} in 120 s")
    except BaseException:
        proc.kill()
        proc.communicate()
        raise


def _preempt(tmp_path, program: str, after: str) -> tuple[dict[int, dict], str]:
    """``program`` run plainly to its end (ref.pt), then under daifu until
    rank 0 printed ``after``, then SIGTERM to torchrun's agent (it passes it
    on to every rank): each rank's one ``checkpoint.saved`` event, and the
    agent's stderr."""
    import signal

    (tmp_path / "ref.py").write_text(program)
    (tmp_path / "train.py").write_text(program)
    ref = plain_torchrun(["ref.py", "--out", "ref.pt"], tmp_path)
    assert ref.returncode == 0, ref.stderr[-3000:]
    proc = _launch_until(tmp_path, ["--pause", "0.05"], after)
    try:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    saved = {r: [e for e in read_events(tmp_path / f"events-{r}.jsonl")
                 if e["event"] == "checkpoint.saved"] for r in (0, 1)}
    assert all(len(v) == 1 for v in saved.values()), (saved, err[-3000:])
    return {r: v[0] for r, v in saved.items()}, err


@pytest.mark.parametrize("after", ["step 0 2", "step 0 6"], ids=["mid_epoch", "epoch_end"])
def test_sigterm_to_torchrun_saves_every_rank_at_one_step_and_the_manifest_resumes_exactly(
        tmp_path, after):
    """Preemption of a DDP job: SIGTERM to torchrun's agent, which passes it
    on to every rank.  The ranks agree on one step through the job's store,
    each saves its own file there, rank 0 writes the manifest; the job run
    again with ``daifu.resume(manifest)`` ends bit-identical to a run never
    stopped (a shuffled DistributedSampler, dropout, momentum)."""
    saved, err = _preempt(tmp_path, PREEMPTED_DDP, after)
    assert {v["position"]["state"] for v in saved.values()} == {"iteration-complete"}
    manifests = [e for e in read_events(tmp_path / "events-0.jsonl")
                 if e["event"] == "checkpoint.manifest"]
    assert len(manifests) == 1 and manifests[0]["consistent"], (manifests, err[-3000:])
    manifest = json.loads(Path(manifests[0]["path"]).read_text())
    assert manifest["ranks"] == {str(r): saved[r]["path"] for r in (0, 1)}
    assert manifest["world_size"] == 2 and manifest["steps"] == {"0": manifest["step"],
                                                                 "1": manifest["step"]}
    assert stat.S_IMODE(os.stat(manifests[0]["path"]).st_mode) == 0o600
    resumed = plain_torchrun(["train.py", "--resume", manifests[0]["path"], "--out", "live.pt"],
                             tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed 0" in resumed.stdout and "resumed 1" in resumed.stdout
    assert_identical(load_params(tmp_path / "live.pt"), load_params(tmp_path / "ref.pt"))
    # a job of another size is told so, before anything is changed
    other = torchrun(["train.py", "--resume", manifests[0]["path"]], tmp_path, nproc=1)
    assert other.returncode != 0
    assert "holds a job of 2 ranks; this one has 1" in other.stderr


def test_sigterm_to_an_fsdp_job_writes_its_shards_with_dcp_and_resumes_exactly(tmp_path):
    """A preempted FSDP2 job: at the step every rank agreed on, the ranks
    write their sharded model and Adam state together into one
    ``torch.distributed.checkpoint`` directory (rank 0's ``.metadata`` and a
    ``.distcp`` file per rank), each rank's file keeps the rest and names
    it; resumed from the manifest, the job ends bit-identical."""
    import torch
    import torch.distributed.checkpoint as dcp

    saved, _ = _preempt(tmp_path, PREEMPTED_FSDP, "step 0 2")
    shards = {saved[r]["sharded"] for r in (0, 1)}
    assert len(shards) == 1 and shards != {""}, saved  # (one directory, for both)
    directory = Path(shards.pop())
    assert sorted(p.name for p in directory.iterdir()) == [".metadata", "__0_0.distcp",
                                                           "__1_0.distcp"]
    for r in (0, 1):
        ck = torch.load(saved[r]["path"], weights_only=False)
        assert ck["sharded"]["modules"] == ["model"] and ck["sharded"]["optimizers"] == ["opt"]
        assert ck["modules"]["model"] == {"daifu.dcp": True}  # (not in the rank's file)
    # what DCP wrote names every parameter and Adam's state by its name
    keys = set(dcp.FileSystemReader(str(directory)).read_metadata().state_dict_metadata)
    assert {"modules.model.0.weight", "optimizers.opt.state.0.weight.exp_avg"} <= keys, keys
    manifest = next(e for e in read_events(tmp_path / "events-0.jsonl")
                    if e["event"] == "checkpoint.manifest")
    assert manifest["consistent"], manifest
    resumed = plain_torchrun(["train.py", "--resume", manifest["path"], "--out", "live.pt"],
                             tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "torch.distributed is disabled" not in resumed.stderr
    assert_identical(load_params(tmp_path / "live.pt"), load_params(tmp_path / "ref.pt"))
    # an ordinary DCP checkpoint: read here into the model unsharded, in one
    # process (another shape), it holds what the job resumed from
    whole = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.2),
                                torch.nn.Linear(16, 1))
    state = {"modules": {"model": whole.state_dict()}}
    dcp.load(state, checkpoint_id=str(directory), no_dist=True)
    assert_identical(state["modules"]["model"], load_params(tmp_path / "at-resume.pt"))


HANGS_AT_3 = PREEMPTED_DDP.replace(
    "        time.sleep(args.pause * (1 + rank))  # (rank 1 lags: the ranks learn of it apart)",
    "        time.sleep(args.pause * (1 + rank))\n"
    "        if rank == 1 and epoch == 0 and i == 3:\n"
    "            print('hung', flush=True)\n"
    "            time.sleep(600)  # (rank 0 waits in the next all-reduce, in C)")


def test_sigterm_while_a_rank_is_stuck_in_a_collective_saves_it_from_a_thread_in_time(tmp_path):
    """Rank 1 hangs; rank 0 waits in DDP's all-reduce, in C, where no Python
    signal handler runs.  SIGTERM to torchrun: rank 0 is saved
    "mid-iteration" from daifu's watcher thread a few seconds later and
    dies of SIGTERM, rank 1 at its --grace -- both well before torchrun's
    agent would kill them (30 s), and each with its file."""
    import signal
    import time

    assert "print('hung'" in HANGS_AT_3
    (tmp_path / "train.py").write_text(HANGS_AT_3)
    proc = _launch_until(tmp_path, ["--pause", "0.01"], "hung", daifu_args=["--grace", "8"])
    try:
        time.sleep(1.0)  # (rank 0 is in the all-reduce by now)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    saved = {r: [e for e in read_events(tmp_path / f"events-{r}.jsonl")
                 if e["event"] == "checkpoint.saved"] for r in (0, 1)}
    assert [len(saved[0]), len(saved[1])] == [1, 1], (saved, err[-3000:])
    assert saved[0][0]["position"]["state"] == "mid-iteration"
    assert saved[1][0]["position"]["state"] == "mid-iteration"
    assert took < 25, took  # (torchrun's agent kills at 30 s)
    assert all(os.path.exists(saved[r][0]["path"]) for r in (0, 1))
