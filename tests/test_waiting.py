"""Waiting for a human: once per exception, for as long as asked, without
blocking other threads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import daifu

from .support import run_daifu, vaccinate

NESTED = '''
def inner(d):
    for _ in range(1):
        return 10 // d

def middle(d):
    for _ in range(1):
        return inner(d)

def outer(d):
    for _ in range(1):
        return middle(d)

outer(0)
'''


def test_wait_is_once_per_exception_not_once_per_vaccinated_frame(tmp_path):
    # three vaccinated frames on the stack: `--wait 1` waited 3 s and printed
    # the report three times (under torchrun, --wait 3600 meant hours)
    script = tmp_path / "nested.py"
    script.write_text(NESTED)
    started = time.monotonic()
    proc = run_daifu(["--wait", "1", script], cwd=tmp_path, env={"DAIFU_CONSOLE": "0"})
    elapsed = time.monotonic() - started
    assert proc.returncode == 1
    assert proc.stderr.count("daifu: waiting up to 1s") == 1, proc.stderr
    assert proc.stderr.count("crash intercepted") == 1
    assert elapsed < 2.8, elapsed
    last = proc.stderr.rstrip().splitlines()[-1]
    assert last == "ZeroDivisionError: integer division or modulo by zero"


def _wait_for_socket(proc: subprocess.Popen, timeout: float = 60) -> Path:
    sock = Path(os.environ["DAIFU_RUNTIME_DIR"]) / f"{proc.pid}.sock"
    deadline = time.monotonic() + timeout
    while not sock.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the job did not wait"
        time.sleep(0.05)
    return sock


@pytest.mark.slow
def test_wait_inf_waits_until_told(tmp_path):
    # `--wait inf` / DAIFU_WAIT=inf gave up at once (the job was lost)
    script = tmp_path / "nested.py"
    script.write_text(NESTED)
    for how in (["--wait", "inf"], ["--wait", "forever"]):
        proc = subprocess.Popen([sys.executable, "-m", "daifu", *how, str(script)], cwd=tmp_path,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                stdin=subprocess.DEVNULL, env={**os.environ, "DAIFU_CONSOLE": "0"})
        _wait_for_socket(proc)
        time.sleep(1.5)
        assert proc.poll() is None  # still waiting
        sent = run_daifu(["send", proc.pid, "exec", "d = 5"], cwd=tmp_path)
        assert sent.returncode == 1, sent.stderr  # applied; still waiting
        # --job needs a rank of a distributed job: refused, nothing sent
        sent = run_daifu(["send", "--job", proc.pid, "retry"], cwd=tmp_path)
        assert sent.returncode == 3 and "not a rank of a distributed job" in sent.stderr
        assert proc.poll() is None
        sent = run_daifu(["send", proc.pid, "retry"], cwd=tmp_path)
        assert sent.returncode == 0, sent.stderr
        proc.communicate(timeout=60)
        assert proc.returncode == 0


NO_LOOP = '''
def inner(d):
    return 10 // d

def outer(d):
    r = inner(d)
    return r + 1

d = 0
result = outer(d)
print("result", result)
'''


@pytest.mark.slow
def test_send_exits_2_when_its_decision_is_refused_and_the_job_still_waits(tmp_path):
    # `up`, `up`, `next` in a module-level statement that is in no loop: the
    # refusal was printed, but send exited 0 as if the job had resumed
    script = tmp_path / "noloop.py"
    script.write_text(NO_LOOP)
    proc = subprocess.Popen([sys.executable, "-m", "daifu", "--wait", "60", str(script)],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, stdin=subprocess.DEVNULL,
                            env={**os.environ, "DAIFU_CONSOLE": "0"})
    try:
        _wait_for_socket(proc)
        up = run_daifu(["send", proc.pid, "up"], cwd=tmp_path)
        assert up.returncode == 1 and "in outer()" in up.stdout, up
        up = run_daifu(["send", proc.pid, "up"], cwd=tmp_path)
        assert up.returncode == 1 and "in <module>()" in up.stdout, up
        assert "result = outer(d)" in up.stdout
        refused = run_daifu(["send", proc.pid, "next"], cwd=tmp_path)
        assert refused.returncode == 2, refused
        assert "cannot continue in caller frame 2 (<module>): not inside a loop" in refused.stdout
        refused = run_daifu(["send", proc.pid, "continue"], cwd=tmp_path)  # (only after break)
        assert refused.returncode == 2, refused
        time.sleep(0.3)
        assert proc.poll() is None  # still waiting, the focus still on <module>
        still = run_daifu(["send", proc.pid, "p d"], cwd=tmp_path)
        assert still.returncode == 1 and still.stdout.strip() == "0"
        assert run_daifu(["send", proc.pid, "exec", "d = 5"], cwd=tmp_path).returncode == 1
        sent = run_daifu(["send", proc.pid, "retry"], cwd=tmp_path)  # outer(d) again
        assert sent.returncode == 0, sent
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert out == "result 3\n"


def test_wait_env_inf_and_bad_values(tmp_path):
    script = tmp_path / "nested.py"
    script.write_text(NESTED)
    proc = subprocess.Popen([sys.executable, "-m", "daifu", str(script)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL,
                            env={**os.environ, "DAIFU_CONSOLE": "0", "DAIFU_WAIT": "inf"})
    _wait_for_socket(proc)
    assert run_daifu(["send", proc.pid, "abort"], cwd=tmp_path).returncode == 1
    proc.communicate(timeout=60)
    assert proc.returncode == 1
    for bad in ("nan", "-1", "soon"):
        res = run_daifu(["--wait", bad, script], cwd=tmp_path)
        assert res.returncode == 2
        assert res.stderr.strip().splitlines() == [
            f"python -m daifu: error: --wait/DAIFU_WAIT must be a number of seconds >= 0 or "
            f"'inf', not {bad!r}"]


def test_a_crash_in_another_thread_is_handled_while_a_rule_waits_for_it():
    # the engine held one lock while a rule worked: a rule waiting for a
    # thread that then crashed deadlocked the job
    ns = vaccinate('''
        def work(box, key):
            for _ in range(1):
                return box[key]
    ''')
    box = {}
    worker_result = []

    def worker():
        worker_result.append(ns["work"](box, "w"))

    @daifu.on(KeyError)
    def fix(crash):
        key = crash.vars["key"]
        if key == "main":
            t = threading.Thread(target=worker)
            t.start()
            t.join(timeout=20)  # the worker crashes too, and its own rule must run
            assert not t.is_alive(), "the worker's crash was blocked by the main thread's"
            box["main"] = "main fixed"
        else:
            box[key] = "worker fixed"
        return daifu.RETRY

    assert ns["work"](box, "main") == "main fixed"
    assert worker_result == ["worker fixed"]


def test_notify_runs_a_command_when_the_job_starts_waiting(tmp_path):
    # what a person is told (who crashed, where, how to attach) arrives in the
    # command's environment; the job does not wait for the command
    note = tmp_path / "note.txt"
    script = tmp_path / "nested.py"
    script.write_text(NESTED)
    command = (f'printf "%s|%s|%s|%s" "$DAIFU_PID" "$DAIFU_WHERE" "$DAIFU_EXCEPTION" '
               f'"$DAIFU_ATTACH" > {note}')
    proc = subprocess.Popen([sys.executable, "-m", "daifu", "--wait", "60", "--notify", command,
                             str(script)], cwd=tmp_path, env={**os.environ, "DAIFU_CONSOLE": "0"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    try:
        _wait_for_socket(proc)
        deadline = time.monotonic() + 30
        while not (note.exists() and note.read_text()):
            assert time.monotonic() < deadline, "the notify command did not run"
            time.sleep(0.05)
        pid, where, exc, attach = note.read_text().split("|")
        assert pid == str(proc.pid) and where.endswith("nested.py:4")
        assert exc == "ZeroDivisionError" and attach.endswith(f"-m daifu attach {proc.pid}")
        listed = subprocess.run([sys.executable, "-m", "daifu", "ps", "--json"],
                                capture_output=True, text=True, timeout=60)
        jobs = {job["pid"]: job for job in json.loads(listed.stdout)}
        assert jobs[proc.pid]["state"] == "waiting"
        assert jobs[proc.pid]["exc_type"] == "ZeroDivisionError"
        subprocess.run([sys.executable, "-m", "daifu", "send", str(proc.pid), "abort"],
                       capture_output=True, timeout=60)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1 and '"event": "notify.sent"' in err


def test_ps_lists_running_jobs_too(tmp_path):
    script = tmp_path / "slow.py"
    marker = tmp_path / "started"
    script.write_text(f"import time, pathlib\npathlib.Path({str(marker)!r}).touch()\n"
                      "time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-m", "daifu", str(script), "--flag"],
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        job_file = Path(os.environ["DAIFU_RUNTIME_DIR"]) / f"{proc.pid}.job"
        assert job_file.exists() and (job_file.stat().st_mode & 0o777) == 0o600
        listed = subprocess.run([sys.executable, "-m", "daifu", "ps"], capture_output=True,
                                text=True, timeout=60)
        line = next(x for x in listed.stdout.splitlines() if x.strip().startswith(str(proc.pid)))
        assert "running" in line
        assert f"{script} --flag" in listed.stdout
        listed_json = subprocess.run([sys.executable, "-m", "daifu", "ps", "--json"],
                                     capture_output=True, text=True, timeout=60)
        job = next(j for j in json.loads(listed_json.stdout) if j["pid"] == proc.pid)
        assert job["state"] == "running" and job["argv"] == [str(script), "--flag"]
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    # SIGTERM skipped the job's atexit: its file is stale; ps skips and removes it
    done = subprocess.run([sys.executable, "-m", "daifu", "ps", "--json"], capture_output=True,
                          text=True, timeout=60)
    assert proc.pid not in {j["pid"] for j in json.loads(done.stdout)}
    assert not job_file.exists()


def test_a_finished_job_removes_its_job_file(tmp_path):
    script = tmp_path / "quick.py"
    script.write_text("import os\nprint(os.getpid())\n")
    proc = run_daifu([script], cwd=tmp_path)
    pid = int(proc.stdout.strip())
    assert not (Path(os.environ["DAIFU_RUNTIME_DIR"]) / f"{pid}.job").exists()


PLAIN_PYTHON = '''
import daifu

@daifu.vaccinate
def step(d):
    return 10 // d

print(step(0))
'''


def test_plain_python_with_daifu_vaccinate_waits_and_journals(tmp_path):
    # no runner: @daifu.vaccinate (and daifu.install()) give the engine the
    # same --wait/DAIFU_WAIT, endpoint and journal as `python -m daifu`
    script = tmp_path / "plain.py"
    script.write_text(PLAIN_PYTHON)
    journal = tmp_path / "journal.jsonl"
    proc = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
                            env={**os.environ, "DAIFU_WAIT": "60", "DAIFU_JOURNAL": str(journal)})
    try:
        _wait_for_socket(proc)
        assert run_daifu(["send", proc.pid, "exec", "d = 5"], cwd=tmp_path).returncode == 1
        sent = run_daifu(["send", proc.pid, "retry"], cwd=tmp_path)
        assert sent.returncode == 0, sent.stderr
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert out.strip() == "2"
    kinds = [r.get("kind") for r in (json.loads(x) for x in journal.read_text().splitlines())]
    assert "exec" in kinds and "decision" in kinds, kinds


def test_ps_shows_the_ranks_of_a_distributed_job_together(tmp_path):
    # what torchrun sets for its workers (any launcher setting RANK/WORLD_SIZE)
    script = tmp_path / "slow.py"
    script.write_text("import os, time, pathlib\n"
                      "pathlib.Path(os.environ['MARK']).touch()\ntime.sleep(60)\n")
    procs = []
    try:
        for rank in (1, 0):
            env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
                   "TORCHELASTIC_RUN_ID": "job-42", "MARK": str(tmp_path / f"m{rank}")}
            procs.append(subprocess.Popen([sys.executable, "-m", "daifu", str(script)],
                                          cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"m{r}").exists() for r in (0, 1)):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        listed = json.loads(subprocess.run([sys.executable, "-m", "daifu", "ps", "--json"],
                                           capture_output=True, text=True, timeout=60).stdout)
        ours = [j for j in listed if j.get("job") == "job-42"]
        assert [(j["rank"], j["world_size"], j["local_rank"]) for j in ours] == [(0, 2, 0),
                                                                                  (1, 2, 1)]
        text = subprocess.run([sys.executable, "-m", "daifu", "ps"], capture_output=True,
                              text=True, timeout=60).stdout
        assert "rank 0 of 2 (local rank 0), job job-42" in text
        assert text.index("rank 0 of 2") < text.index("rank 1 of 2")
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=60)


def test_stacks_of_a_running_job_blocked_in_c(tmp_path):
    """``python -m daifu stacks PID``: every thread's stack of a job that has
    not crashed, while its main thread is blocked in C (a sleep here)."""
    (tmp_path / "blocked.py").write_text(
        "import threading, time\n"
        "def worker():\n"
        "    while True:\n"
        "        time.sleep(0.05)\n"
        "def main():\n"
        "    threading.Thread(target=worker, daemon=True).start()\n"
        "    print('ready', flush=True)\n"
        "    time.sleep(60)\n"
        "main()\n")
    proc = subprocess.Popen([sys.executable, "-m", "daifu", "blocked.py"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        got = run_daifu(["stacks", proc.pid], cwd=tmp_path)
        assert got.returncode == 0, got.stderr
        assert 'blocked.py", line 8 in main' in got.stdout  # the main thread, in its sleep
        assert 'blocked.py", line 4 in worker' in got.stdout  # the other thread
        assert proc.poll() is None  # and the job runs on
        none = run_daifu(["stacks", "1"], cwd=tmp_path)
        assert none.returncode == 3 and "no daifu job of yours with pid 1" in none.stderr
    finally:
        proc.kill()
        proc.communicate()


@pytest.mark.slow
def test_what_an_exec_prints_goes_to_the_jobs_stdout_and_to_the_sender(tmp_path):
    # `send PID exec 'print(...)'` returned the text to the sender and the
    # job's own stdout missed it (while later `always` repeats printed there)
    script = tmp_path / "nested.py"
    script.write_text(NESTED)
    proc = subprocess.Popen([sys.executable, "-m", "daifu", "--wait", "inf", str(script)],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, stdin=subprocess.DEVNULL,
                            env={**os.environ, "DAIFU_CONSOLE": "0"})
    _wait_for_socket(proc)
    sent = run_daifu(["send", proc.pid, "exec", "print('from the fix', d)"], cwd=tmp_path)
    assert sent.returncode == 1 and "from the fix 0" in sent.stdout, sent.stderr
    assert run_daifu(["send", proc.pid, "exec", "d = 5"], cwd=tmp_path).returncode == 1
    assert run_daifu(["send", proc.pid, "retry"], cwd=tmp_path).returncode == 0
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out == "from the fix 0\n"
