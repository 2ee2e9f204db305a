"""Hardened edges: files on shared machines, bad input, the control channel,
the console, the repository.  Each test is named after what broke."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from .support import crashes, run_daifu

ROOT = Path(__file__).resolve().parents[1]
OTHER_UID = 54321  # the tests run as root in CI containers: chown simulates another user

CRASHY = '''
def train(d):
    for _ in range(1):
        x = 10 // d
    return x

print("result", train(0))
'''

FIXED_BY_RULE = '''
import daifu

@daifu.on(ZeroDivisionError)
def fix(crash):
    crash.vars["d"] = 5
    return daifu.RETRY
''' + CRASHY


def _script(tmp_path: Path, text: str = FIXED_BY_RULE, name: str = "job.py") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _one_line_error(proc: subprocess.CompletedProcess, code: int = 2) -> str:
    assert proc.returncode == code, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


can_chown = pytest.mark.skipif(os.getuid() != 0, reason="needs root to fake another user's file "
                               "(not available)")

# -- files ---------------------------------------------------------------------------------


def test_journal_through_a_planted_symlink_is_refused_and_the_target_untouched(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("someone else's\n")
    os.chmod(victim, 0o644)
    link = tmp_path / "journal.jsonl"
    link.symlink_to(victim)
    line = _one_line_error(run_daifu(["--journal", link, _script(tmp_path)], cwd=tmp_path))
    assert "symbolic link" in line
    assert victim.read_text() == "someone else's\n"
    assert stat.S_IMODE(victim.stat().st_mode) == 0o644


def test_a_journal_others_may_write_is_refused(tmp_path):
    planted = tmp_path / "journal.jsonl"
    planted.write_text("")
    os.chmod(planted, 0o666)
    line = _one_line_error(run_daifu(["--journal", planted, _script(tmp_path)], cwd=tmp_path))
    assert "others may write it" in line and planted.read_text() == ""


@can_chown
def test_a_journal_another_user_created_is_refused(tmp_path):
    planted = tmp_path / "journal.jsonl"
    planted.write_text("")
    os.chmod(planted, 0o600)
    os.chown(planted, OTHER_UID, OTHER_UID)
    line = _one_line_error(run_daifu(["--journal", planted, _script(tmp_path)], cwd=tmp_path))
    assert f"belongs to uid {OTHER_UID}" in line


def test_a_new_journal_and_log_are_created_0600(tmp_path):
    journal, log = tmp_path / "j.jsonl", tmp_path / "log.jsonl"
    proc = run_daifu(["--journal", journal, "--log", log, _script(tmp_path)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE(journal.stat().st_mode) == 0o600
    assert stat.S_IMODE(log.stat().st_mode) == 0o600  # it holds variable values


def _journal_of_a_fixed_crash(tmp_path: Path) -> Path:
    journal = tmp_path / "recorded.jsonl"
    proc = run_daifu(["--journal", journal, _script(tmp_path)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    return journal


@pytest.mark.parametrize("how", ["writable", pytest.param("other-user", marks=pytest.mark.skipif(
    os.getuid() != 0, reason="needs root to fake another user's file: not available"))])
def test_replay_of_a_journal_someone_else_could_have_written_is_refused(tmp_path, how):
    journal = _journal_of_a_fixed_crash(tmp_path)
    if how == "writable":
        os.chmod(journal, 0o666)
    else:
        os.chown(journal, OTHER_UID, OTHER_UID)
    line = _one_line_error(run_daifu(["--replay", journal, _script(tmp_path, CRASHY)],
                                     cwd=tmp_path))
    assert "refusing to use the journal to replay" in line


@pytest.mark.parametrize("content,expected", [
    (b"\x00\xff\xfe binary", "not UTF-8 text"),
    (b"[1, 2]\n{}\n", "not a daifu journal record"),
    (b'{"type": "crash", "crash": 1}\n{}\n', 'needs "crash" (a number) and "key"'),
    (b'{"type": "patch", "kind": "decision", "decision": "explode"}\n{}\n',
     "malformed 'decision' patch"),
])
def test_replay_of_something_that_is_not_a_journal_is_one_line(tmp_path, content, expected):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(content)
    os.chmod(bad, 0o600)
    line = _one_line_error(run_daifu(["--replay", bad, _script(tmp_path, CRASHY)], cwd=tmp_path))
    assert expected in line


def test_a_planted_tmp_runtime_dir_makes_the_job_listen_in_a_private_one(tmp_path):
    # anyone can create /tmp/daifu-$UID first and so stop another user's jobs
    # from waiting for a fix
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    planted = tmp / f"daifu-{os.getuid()}"
    planted.mkdir()
    os.chmod(planted, 0o777)
    env = {k: v for k, v in os.environ.items() if k not in ("DAIFU_RUNTIME_DIR",
                                                           "XDG_RUNTIME_DIR")}
    env.update(TMPDIR=str(tmp), XDG_STATE_HOME=str(tmp_path / "state"), DAIFU_CONSOLE="0")
    proc = subprocess.Popen([sys.executable, "-m", "daifu", "--wait", "60",
                             str(_script(tmp_path, CRASHY))], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    fallback = tmp_path / "state" / "daifu" / "run"
    deadline = time.monotonic() + 60
    while not (fallback / f"{proc.pid}.sock").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    assert stat.S_IMODE(fallback.stat().st_mode) == 0o700
    listed = subprocess.run([sys.executable, "-m", "daifu", "ps"], env=env, capture_output=True,
                            text=True, timeout=60)
    assert str(proc.pid) in listed.stdout, listed.stdout + listed.stderr
    sent = subprocess.run([sys.executable, "-m", "daifu", "send", str(proc.pid), "abort"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert sent.returncode == 1
    out, err = proc.communicate(timeout=60)
    assert f"control sockets are in {fallback}" in err
    assert not list(planted.iterdir())


def test_journals_are_pruned_and_listed(tmp_path):
    state = tmp_path / "state"
    folder = state / "daifu" / "journal"
    folder.mkdir(parents=True)
    os.chmod(state / "daifu", 0o700)
    os.chmod(folder, 0o700)
    for n in range(105):
        old = folder / f"old-{n:03d}.jsonl"
        old.write_text("{}\n")
        os.utime(old, (1_000_000 + n, 1_000_000 + n))
    env = {"XDG_STATE_HOME": str(state)}
    proc = run_daifu([_script(tmp_path)], cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    left = sorted(p.name for p in folder.iterdir())
    assert len(left) == 100 and "old-000.jsonl" not in left and "old-104.jsonl" in left
    listing = run_daifu(["journal"], cwd=tmp_path, env=env)
    assert listing.returncode == 0 and "job-" in listing.stdout.splitlines()[1]
    shown = run_daifu(["journal", "show", "1"], cwd=tmp_path, env=env)
    assert shown.returncode == 0
    assert "crash #1" in shown.stdout and "ZeroDivisionError" in shown.stdout
    assert "decision" in shown.stdout and "outcome  retry" in shown.stdout


# -- bad input -------------------------------------------------------------------------------


def _same_as_python(tmp_path: Path, args: list[str], env: dict | None = None) -> None:
    plain = subprocess.run([sys.executable, *args], cwd=tmp_path, capture_output=True,
                           text=True, timeout=60)
    under = run_daifu(args, cwd=tmp_path, env=env)
    events = [line for line in under.stderr.splitlines() if line.startswith("{")]
    stderr = "\n".join(line for line in under.stderr.splitlines() if not line.startswith("{"))
    assert under.returncode == plain.returncode != 0
    assert stderr.strip() == plain.stderr.strip().replace(f"{sys.executable}: ", "", 0)
    assert "daifu" not in stderr or "daifu" in plain.stderr
    return events


def test_a_script_with_a_syntax_error_fails_as_with_python(tmp_path):
    (tmp_path / "bad.py").write_text("def (\n")
    _same_as_python(tmp_path, ["bad.py"])


def test_a_script_with_a_bad_encoding_fails_as_with_python(tmp_path):
    (tmp_path / "enc.py").write_bytes(b'x = "\xff"\n')
    _same_as_python(tmp_path, ["enc.py"])


def test_a_vaccinated_import_with_a_syntax_error_fails_as_with_python(tmp_path):
    (tmp_path / "broken.py").write_text("def (\n")
    (tmp_path / "imports.py").write_text("import broken\n")
    _same_as_python(tmp_path, ["imports.py"], env={"DAIFU_MODULES": "broken"})


def test_dash_m_of_a_missing_module_is_one_line(tmp_path):
    for name in ("no.such.module", "nosuchmodule"):
        plain = subprocess.run([sys.executable, "-m", name], capture_output=True, text=True)
        under = run_daifu(["-m", name], cwd=tmp_path)
        assert under.returncode == plain.returncode == 1
        assert under.stderr == plain.stderr and len(under.stderr.splitlines()) == 1


def test_a_directory_with_main_runs_as_with_python(tmp_path):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "__main__.py").write_text(
        "import sys\nprint(__name__, sys.argv[1:], sys.path[0].endswith('app'))\n")
    plain = subprocess.run([sys.executable, "app", "x"], cwd=tmp_path, capture_output=True,
                           text=True)
    under = run_daifu(["app", "x"], cwd=tmp_path)
    assert under.returncode == 0 and under.stdout == plain.stdout == "__main__ ['x'] True\n"


@pytest.mark.parametrize("args,expected", [
    (["--log", "{missing}/x.jsonl"], "cannot open the log file (--log-file)"),
    (["--dump", "{missing}/x.txt"], "cannot open the dump (--dump)"),
    (["--journal", "{missing}/j.jsonl"], "is not a directory"),
    (["--max", "3"], "unrecognized arguments: --max"),
])
def test_bad_options_are_one_line_and_exit_2(tmp_path, args, expected):
    args = [a.format(missing=tmp_path / "no" / "such" / "dir") for a in args]
    proc = run_daifu([*args, _script(tmp_path)], cwd=tmp_path)
    text = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and not proc.stdout
    assert expected in text[-1], proc.stderr
    assert not (tmp_path / "no").exists()


def test_entry_names_that_match_nothing_are_warned_about(tmp_path):
    proc = run_daifu(["--no-lazy", "--entry", "trian", _script(tmp_path)], cwd=tmp_path)
    assert proc.returncode == 1  # nothing vaccinated for it: the crash is not caught in train
    assert "daifu: warning: --entry/DAIFU_ENTRY 'trian' matched no function" in proc.stderr


def test_reload_of_a_binary_file_is_a_rejected_reload(tmp_path, monkeypatch):
    import daifu
    from daifu import cells as _registry
    from daifu.engine._events import capture

    (tmp_path / "binmod.py").write_text("def f(d):\n    for _ in range(1):\n        x = 1 // d\n"
                                        "    return x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    daifu.install(modules="binmod")
    try:
        import binmod

        (tmp_path / "binmod.py").write_bytes(b"\xff\xfe\x00binary")

        @daifu.on(ZeroDivisionError)
        def reload_it(crash):
            return daifu.RELOAD

        with capture() as events, crashes(ZeroDivisionError):
            binmod.f(0)
    finally:
        daifu.uninstall()
        sys.modules.pop("binmod", None)
        _registry.forget(str(tmp_path / "binmod.py"))
    rejected = [e["reason"] for e in events if e["event"] == "patch.rejected"]
    assert rejected and "is not UTF-8 text" in rejected[0]
    assert not [e for e in events if e["event"] == "daifu.internal_error"]


# -- the control channel -------------------------------------------------------------------


@pytest.fixture
def waiting_job(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "daifu", "--wait", "120",
                             str(_script(tmp_path, CRASHY))], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, env={**os.environ, "DAIFU_CONSOLE": "0"})
    sock = Path(os.environ["DAIFU_RUNTIME_DIR"]) / f"{proc.pid}.sock"
    deadline = time.monotonic() + 60
    while not sock.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    yield proc, sock
    if proc.poll() is None:
        proc.kill()
    proc.communicate()


def _talk(sock: Path, payload: bytes, timeout: float = 10) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        conn.connect(str(sock))

        def send():
            try:
                conn.sendall(payload)
            except OSError:  # the job stopped reading (and answered): fine
                pass

        threading.Thread(target=send, daemon=True).start()
        data = b""
        while not data.endswith(b"\n"):
            chunk = conn.recv(65536)
            if not chunk:
                break
            data += chunk
        return data


def test_control_channel_answers_garbage_with_an_error_and_keeps_serving(waiting_job, tmp_path):
    proc, sock = waiting_job
    for payload in (b"[1]\n", b"null\n", b"[" * 200_000 + b"\n", b"not json\n"):
        reply = json.loads(_talk(sock, payload))
        assert reply["ok"] is False and "malformed request" in reply["error"]
    started = time.monotonic()
    reply = json.loads(_talk(sock, b"x" * (100 << 20), timeout=30))  # 100 MB, no newline
    assert "longer than" in reply["error"] and time.monotonic() - started < 15
    idle = []
    for _ in range(40):  # idle connections are capped, the job still answers
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(str(sock))
        idle.append(conn)
    busy = json.loads(_talk(sock, b'{"op": "status"}\n'))
    assert busy["ok"] is False and "too many connections" in busy["error"]
    for conn in idle:
        conn.close()
    time.sleep(0.5)
    sent = run_daifu(["send", proc.pid, "p d + 1"], cwd=tmp_path)
    assert sent.returncode == 1 and sent.stdout == "1\n", sent.stdout + sent.stderr
    assert run_daifu(["send", proc.pid, "abort"], cwd=tmp_path).returncode == 1
    out, err = proc.communicate(timeout=60)
    assert "Traceback" not in err.split("ZeroDivisionError")[0]  # nothing from the channel
    assert proc.returncode == 1


@pytest.mark.slow
def test_send_retry_exits_0_when_the_job_resumed_even_if_it_finishes_at_once(tmp_path):
    for _ in range(8):
        proc = subprocess.Popen([sys.executable, "-m", "daifu", "--wait", "60",
                                 str(_script(tmp_path, CRASHY))], cwd=tmp_path,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                stdin=subprocess.DEVNULL,
                                env={**os.environ, "DAIFU_CONSOLE": "0"})
        sock = Path(os.environ["DAIFU_RUNTIME_DIR"]) / f"{proc.pid}.sock"
        while not sock.exists():
            assert proc.poll() is None
            time.sleep(0.05)
        assert run_daifu(["send", proc.pid, "exec", "d = 2"], cwd=tmp_path).returncode == 1
        sent = run_daifu(["send", proc.pid, "retry"], cwd=tmp_path)
        assert sent.returncode == 0, sent.stderr
        assert sent.stdout == ""  # the command's result only: no log line of the job's
        proc.communicate(timeout=60)
        assert proc.returncode == 0


def test_a_client_of_a_silent_endpoint_gives_up_in_time(tmp_path):
    runtime = Path(os.environ["DAIFU_RUNTIME_DIR"])
    fake_pid = 999_999_9
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(runtime / f"{fake_pid}.sock"))
    server.listen(1)
    held = []
    threading.Thread(target=lambda: held.append(server.accept()), daemon=True).start()
    try:
        started = time.monotonic()
        proc = run_daifu(["send", fake_pid, "retry"], cwd=tmp_path,
                         env={"DAIFU_SEND_TIMEOUT": "2"})
        assert proc.returncode == 3 and "did not answer within 2s" in proc.stderr
        assert time.monotonic() - started < 15
    finally:
        server.close()
        os.unlink(runtime / f"{fake_pid}.sock")


# -- commands and the repository ------------------------------------------------------------


def test_help_doctor_and_command_help_are_commands_not_scripts(tmp_path):
    for args, expected in ((["help"], "commands:"), (["doctor"], "bytecode backend"),
                           (["ps", "--help"], "python -m daifu ps"),
                           (["journal", "-h"], "python -m daifu journal")):
        proc = run_daifu(args, cwd=tmp_path)
        assert proc.returncode == 0 and expected in proc.stdout, proc.stdout + proc.stderr
        assert "can't open file" not in proc.stderr


def test_a_command_whose_reader_goes_away_ends_quietly(tmp_path):
    # ``python -m daifu ps | head -3``: the pipe closes before the command
    # has written everything; a shell tool stops without a traceback
    for args in (["help"], ["doctor"], ["ps", "--help"]):
        proc = subprocess.Popen([sys.executable, "-m", "daifu", *args], cwd=tmp_path,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        proc.stdout.close()  # (before the child writes: its first flush meets EPIPE)
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=60) == 141, err
        assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_the_repository_tracks_no_run_outputs_and_has_its_license():
    tracked = subprocess.run(["git", "ls-files", "runs"], cwd=ROOT, capture_output=True,
                             text=True).stdout
    assert tracked == ""  # a tracked checkpoint dir hid the demo's second crash
    ignored = subprocess.run(["git", "check-ignore", "runs/mnist/checkpoints/epoch2.pt"],
                             cwd=ROOT, capture_output=True, text=True)
    assert ignored.returncode == 0
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    assert 'license = "MIT"' in (ROOT / "pyproject.toml").read_text()
    assert "[flake8]" not in (ROOT / "setup.cfg").read_text()


def test_torch_imports_without_warnings():
    pytest.importorskip("torch", reason="PyTorch not available")
    proc = subprocess.run([sys.executable, "-W", "error::UserWarning", "-c", "import torch"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


# -- the console ---------------------------------------------------------------------------

TWO_CRASHES = '''
def step(d):
    for _ in range(1):
        x = 10 // d
    return x

print("first", step(0), flush=True)
print("second", step(0), flush=True)
'''


def _two_consoles(tmp_path: Path, env: dict, stdout=None):
    from .support import PtyProcess

    (tmp_path / "two.py").write_text(TWO_CRASHES)
    p = PtyProcess([sys.executable, "-m", "daifu", "two.py"], cwd=str(tmp_path), env=env,
                   stdout=stdout)
    for _ in range(2):
        out = p.expect("(daifu) ", timeout=60)
        assert "crash intercepted -- ZeroDivisionError" in out
        p.send("!d = 5")
        p.expect("(daifu) ")
        p.send("retry")
    assert p.wait() == 0
    return p


def test_the_console_talks_to_the_terminal_when_stdout_is_redirected(tmp_path):
    # `python -m daifu train.py > train.log` looked hung: the report and the
    # prompt went into the log file
    env = {**os.environ, "HOME": str(tmp_path), "NO_COLOR": "1"}
    with open(tmp_path / "train.log", "w") as log:
        p = _two_consoles(tmp_path, env, stdout=log)
    assert (tmp_path / "train.log").read_text() == "first 2\nsecond 2\n"
    assert "\x1b[" not in p.output  # NO_COLOR: daifu's event lines are not coloured


def test_console_history_is_read_once_and_capped(tmp_path):
    # ~/.daifu_history doubled at every console of a process (24 answers: 20 MB)
    home = tmp_path / "home"
    home.mkdir()
    (home / ".daifu_history").write_text("old\n")
    _two_consoles(tmp_path, {**os.environ, "HOME": str(home)})
    history = (home / ".daifu_history").read_text().splitlines()
    assert history == ["old", "!d = 5", "retry", "!d = 5", "retry"]
