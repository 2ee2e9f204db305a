"""``send PID break``: pause a running job at its next statement in a
vaccinated frame, with no exception of the program raised; ``continue``
resumes it with nothing run twice (engine/human/_break.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from daifu.engine import ENGINE
from daifu.engine._events import capture
from daifu.engine.human import _break
from daifu.engine.human._console import run_line

from .support import vaccinate

PROGRAM = '''
import sys
from daifu.engine.human._break import arm

def work(n, log, pause_at):
    total = 0
    for i in range(n):
        if i == pause_at:
            arm(sys._getframe())
        log.append(i)
        total += i
    return total, log

def guarded(n, log, pause_at):
    try:
        return work(n, log, pause_at)
    except Exception:              # the program's own handler never sees the pause
        return "caught"
'''


class Scripted:
    """A waiter that runs console commands at the pause (as attach would)."""

    def __init__(self, *lines):
        self.lines, self.outputs, self.seen = lines, [], []

    def wait(self, crash, engine):
        self.seen.append((crash.function, crash.statement, type(crash.exception).__name__))
        for line in self.lines:
            console, out = run_line(crash, engine.door(crash), line, "test")
            self.outputs.append((line, console.ok, out.strip()))
            if console.decision is not None:
                return None
        return "no decision"


@pytest.fixture
def program():
    yield vaccinate(PROGRAM)
    _break._disarm()


def test_a_paused_job_continues_with_nothing_run_twice(program):
    waiter = Scripted("p i", "p total", "continue")
    ENGINE.waiters.append(waiter)
    with capture() as events:
        total, log = program["guarded"](6, [], 3)
    assert (total, log) == (15, [0, 1, 2, 3, 4, 5])  # nothing twice, nothing caught
    assert waiter.seen == [("work", "log.append(i)", "Break")]
    assert waiter.outputs[:2] == [("p i", True, "3"), ("p total", True, "3")]
    assert [e["event"] for e in events if e["event"].startswith(("break", "crash."))] == [
        "break.paused", "crash.resumed"]  # (no crash.intercepted: it is no crash)
    assert sys.gettrace() is None  # the tracer is gone once paused


def test_at_a_pause_exec_changes_the_frame_and_skip_leaves_the_statement_out(program):
    ENGINE.waiters.append(Scripted("!total = 100", "skip"))
    total, log = program["guarded"](6, [], 3)
    assert (total, log) == (100 + 3 + 4 + 5, [0, 1, 2, 4, 5])


def test_a_pause_with_nobody_deciding_resumes_and_rules_never_see_it(program):
    import daifu

    seen = []

    @daifu.on(BaseException)
    def rule(crash):
        seen.append(crash)
        return daifu.ABORT

    ENGINE.waiters.append(Scripted("abort"))  # (abort at a pause: there is nothing to abort)
    assert program["guarded"](4, [], 1) == (6, [0, 1, 2, 3])
    assert seen == []
    assert ENGINE.summary() is None  # a pause is not a crash to speak of


def test_a_break_that_reaches_no_vaccinated_statement_is_dropped(monkeypatch, capsys):
    # armed in code that is not vaccinated, with no vaccinated statement to
    # come: the tracer stayed on for the rest of the run (every call traced)
    monkeypatch.setattr(_break, "ARMED_S", 0.05)
    calls = []

    def plain(i):  # not vaccinated
        calls.append(i)

    try:
        _break.arm(sys._getframe())
        assert sys.gettrace() is not None
        deadline = time.monotonic() + 5
        while sys.gettrace() is not None and time.monotonic() < deadline:
            plain(len(calls))
    finally:
        _break._disarm()
    assert sys.gettrace() is None and not _break._state.armed
    assert calls and time.monotonic() < deadline
    err = capsys.readouterr().err
    assert "daifu: break: dropped" in err and "within 0.05s" in err


def _start(tmp_path: Path, source: str) -> subprocess.Popen:
    (tmp_path / "job.py").write_text(source)
    env = {**os.environ, "DAIFU_RUNTIME_DIR": str(tmp_path / "run")}
    env.pop("DAIFU_WAIT", None)
    return subprocess.Popen([sys.executable, "-m", "daifu", "--log-file", "events.jsonl",
                             "job.py"], cwd=tmp_path, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _daifu(tmp_path: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "DAIFU_RUNTIME_DIR": str(tmp_path / "run")}
    return subprocess.run([sys.executable, "-m", "daifu", *args], cwd=tmp_path, env=env,
                          input=stdin, capture_output=True, text=True, timeout=60)


JOB = '''
import time

def step(i, log):
    log.append(i)
    time.sleep(0.02)

def main():
    log = []
    for i in range(150):
        step(i, log)
    print("done", len(log), log == list(range(150)))

main()
'''


def _wait_registered(tmp_path: Path, job: subprocess.Popen) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if (tmp_path / "run").is_dir() and any((tmp_path / "run").rglob(f"{job.pid}.job")):
            return
        time.sleep(0.05)
    raise AssertionError("the job never registered")


@pytest.mark.slow
def test_send_break_pauses_a_headless_job_and_continue_resumes_it(tmp_path):
    job = _start(tmp_path, JOB)
    try:
        _wait_registered(tmp_path, job)
        time.sleep(0.3)
        paused = _daifu(tmp_path, "send", str(job.pid), "break")
        assert paused.returncode == 1, paused.stderr  # paused: waiting
        assert paused.stdout.startswith("paused at ") and "job.py" in paused.stdout
        listed = _daifu(tmp_path, "ps")
        assert "waiting" in listed.stdout and "Break" in listed.stdout
        where = _daifu(tmp_path, "send", str(job.pid), "p len(log)")
        assert where.returncode == 1 and where.stdout.strip().isdigit(), where
        resumed = _daifu(tmp_path, "send", str(job.pid), "continue")
        assert resumed.returncode == 0, resumed.stderr
        out, err = job.communicate(timeout=60)
    finally:
        job.kill()
    assert job.returncode == 0, err
    assert out.strip() == "done 150 True"  # nothing ran twice, nothing was left out


@pytest.mark.slow
def test_attach_to_a_running_job_pauses_it_first(tmp_path):
    job = _start(tmp_path, JOB)
    try:
        _wait_registered(tmp_path, job)
        time.sleep(0.3)
        attached = _daifu(tmp_path, "attach", str(job.pid), stdin="p i >= 0\ncontinue\n")
        assert "paused at " in attached.stdout and "True" in attached.stdout, attached
        out, err = job.communicate(timeout=60)
    finally:
        job.kill()
    assert out.strip() == "done 150 True", err


CALLER = '''
import time

def step(i, log, calls):
    calls.append(i)
    time.sleep(0.02)          # where the job is when break arrives
    log.append(i)             # ... so it pauses here, in step()

def main():
    log, calls = [], []
    total = 0
    for i in range(150):
        step(i, log, calls)
        total += i
    print("done", log == list(range(150)), calls == list(range(150)), total)

main()
'''


@pytest.mark.slow
def test_up_and_down_at_a_pause_reach_the_caller_and_continue_resumes(tmp_path):
    job = _start(tmp_path, CALLER)
    try:
        _wait_registered(tmp_path, job)
        time.sleep(0.3)
        paused = _daifu(tmp_path, "send", str(job.pid), "break")
        assert paused.returncode == 1, paused.stderr
        assert paused.stdout.startswith("paused at ")
        assert "in step(): log.append(i)" in paused.stdout
        here = _daifu(tmp_path, "send", str(job.pid), "p total")
        assert here.returncode == 2 and "NameError" in here.stdout  # main's, not step's
        i = _daifu(tmp_path, "send", str(job.pid), "p i").stdout.strip()
        up = _daifu(tmp_path, "send", str(job.pid), "up")
        assert up.returncode == 1, up
        assert "> frame 1: " in up.stdout and "in main()" in up.stdout
        assert "step(i, log, calls)" in up.stdout
        caller = _daifu(tmp_path, "send", str(job.pid), "p total, i, len(log)")
        assert caller.returncode == 1, caller
        assert caller.stdout.strip() == f"({sum(range(int(i)))}, {i}, {i})"
        down = _daifu(tmp_path, "send", str(job.pid), "down")
        assert down.returncode == 1 and "> frame 0: " in down.stdout and "in step()" in down.stdout
        assert _daifu(tmp_path, "send", str(job.pid), "p total").returncode == 2
        assert _daifu(tmp_path, "send", str(job.pid), "up").returncode == 1
        # continue with main() in focus resumes where it paused (a retry of the
        # caller's call would have run step() again up to the pause)
        resumed = _daifu(tmp_path, "send", str(job.pid), "continue")
        assert resumed.returncode == 0, resumed.stderr
        out, err = job.communicate(timeout=60)
    finally:
        job.kill()
    assert job.returncode == 0, err
    assert out == "done True True 11175\n"  # nothing ran twice, nothing was left out


RELOADED = '''
import sys
from daifu.engine.human._break import arm

def work(n, log):
    for i in range(n):
        if i == 2:
            arm(sys._getframe())
        log.append(i)
    return log
'''


def test_at_a_pause_reload_continues_the_running_loop_in_the_new_code(tmp_path, monkeypatch):
    import daifu
    from daifu import cells as _registry

    path = tmp_path / "paused_reload.py"
    path.write_text(RELOADED)
    monkeypatch.syspath_prepend(str(tmp_path))
    daifu.install(modules="paused_reload")
    try:
        import paused_reload

        class Edit(Scripted):
            def wait(self, crash, engine):
                path.write_text(RELOADED.replace("log.append(i)", "log.append(i * 10)"))
                return super().wait(crash, engine)

        waiter = Edit("reload")
        ENGINE.waiters.append(waiter)
        assert paused_reload.work(4, []) == [0, 1, 20, 30]
        assert waiter.outputs[0][1], waiter.outputs
    finally:
        _break._disarm()
        daifu.uninstall()
        sys.modules.pop("paused_reload", None)
        _registry.forget(str(path))
