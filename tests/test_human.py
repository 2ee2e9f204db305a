"""The human recovery loop: report, console (on a pseudo-terminal), live
reload, headless attach over the control socket, journal and replay."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from .support import PtyProcess, assert_identical, load_params, read_events

torch = pytest.importorskip("torch", reason="PyTorch not available")
pytestmark = pytest.mark.slow

TRAIN = textwrap.dedent('''
    import sys
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(7)
    train_data = [(torch.randn(32, 12, generator=g), torch.randint(0, 4, (32,), generator=g))
                  for _ in range(8)]
    test_data = [(torch.randn(16, 12, generator=g), torch.randint(0, 4, (16,), generator=g))
                 for _ in range(2)]
    SCALES = {0: 1.0, 1: 0.5, 2: 0.5}


    def test(model):
        correct = 0
        with torch.no_grad():
            for x, y in test_data:
                correct += (model(x).argmax(1) == y).sum().item()
        return correct


    def train(model, opt, epochs):
        for epoch in range(epochs):
            scale = SCALES[epoch]
            for x, y in train_data:
                loss = F.cross_entropy(model(x), y) * scale
                opt.zero_grad()
                loss.backward()
                opt.step()
            print(f"epoch {epoch} correct {test(model)}", flush=True)


    model = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train(model, opt, 3)
    torch.save(model.state_dict(), sys.argv[1])
    print("done", flush=True)
''')


def python():
    return [sys.executable]


def env():
    return {**os.environ, "PYTHONHASHSEED": "0"}


def reference(tmp_path: Path, source: str) -> dict:
    ref_dir = tmp_path / "ref"
    ref_dir.mkdir(exist_ok=True)
    script = ref_dir / "train_ref.py"
    script.write_text(source)
    proc = subprocess.run([*python(), str(script), "final.pt"], cwd=ref_dir, capture_output=True,
                          text=True, timeout=300, env=env())
    assert proc.returncode == 0, proc.stderr
    return load_params(ref_dir / "final.pt")


# -- console on a pseudo-terminal ---------------------------------------------------------

BUGGY_SCALE = TRAIN.replace("SCALES = {0: 1.0, 1: 0.5, 2: 0.5}",
                           "SCALES = {0: 1.0, 1: None, 2: 0.5}")


def test_console_on_a_terminal_fixes_a_variable_and_retries(tmp_path):
    ref = reference(tmp_path, TRAIN)
    script = tmp_path / "train.py"
    script.write_text(BUGGY_SCALE)
    journal = tmp_path / "session.jsonl"
    p = PtyProcess([*python(), "-m", "daifu", "--journal", str(journal), "--log",
                    str(tmp_path / "log.jsonl"), str(script), "final.pt"], cwd=str(tmp_path),
                   env=env())
    out = p.expect("(daifu) ")
    # the report: exception, the statement in context, callers, variables, options
    assert "TypeError: unsupported operand type(s) for *: 'Tensor' and 'NoneType'" in out
    assert "-->" in out and "loss = F.cross_entropy(model(x), y) * scale" in out
    assert 'train(model, opt, 3)' in out  # the caller is in the traceback
    assert re.search(r"scale\s+= None", out)
    assert re.search(r"x\s+= tensor\(32, 12\) float32 cpu min=\S+ max=\S+", out)
    assert "Sequential module, 276 parameters" in out
    assert "mutating call" not in out  # nothing done before the failing operator
    p.send("vars")
    assert "epoch = 1" in p.expect("epoch = 1")
    p.send("!scale = 0.5")
    p.expect("(daifu) ")
    p.send("p scale * 2")
    p.expect("1.0")
    p.send("retry")
    p.expect("done", timeout=120)
    assert p.wait() == 0
    assert_identical(load_params(tmp_path / "final.pt"), ref)
    records = read_events(journal)
    assert os.stat(journal).st_mode & 0o777 == 0o600
    patches = [r for r in records if r["type"] == "patch"]
    assert [(r["kind"], r["origin"]) for r in patches] == [("exec", "console"),
                                                           ("decision", "console")]
    assert patches[0]["code"] == "scale = 0.5"

    # the same buggy script again, with the journal: no human needed
    (tmp_path / "again").mkdir()
    again = subprocess.run([*python(), "-m", "daifu", "--replay", str(journal), str(script),
                            "final.pt"], cwd=tmp_path / "again", capture_output=True, text=True,
                           timeout=300, env=env())
    assert again.returncode == 0, again.stderr
    assert_identical(load_params(tmp_path / "again" / "final.pt"), ref)


def test_on_a_terminal_the_report_comes_first_and_p_of_a_tensor_is_its_summary(tmp_path):
    """No --log: daifu's log lines go to the terminal too, after the console."""
    script = tmp_path / "train.py"
    script.write_text(BUGGY_SCALE)
    p = PtyProcess([*python(), "-m", "daifu", str(script), "final.pt"], cwd=str(tmp_path),
                   env=env())
    out = p.expect("(daifu) ")
    before_report = out[: out.index("daifu: crash intercepted -- TypeError")]
    assert "crash.intercepted" not in before_report and "journal" not in before_report
    assert "crash.report" not in out  # the console shows the report; no log line repeats it
    p.send("p x")
    shown = p.expect("(daifu) ")
    assert re.search(r"tensor\(32, 12\) float32 cpu min=\S+ max=\S+", shown), shown
    assert "tensor([[" not in shown  # 384 values: the summary alone
    p.send("p y[:3]")
    small = p.expect("(daifu) ")
    assert "tensor(3,) int64 cpu" in small and "tensor([" in small  # small: its values too
    p.send("!scale = 0.5")
    p.expect("(daifu) ")
    p.send("retry")
    after = p.expect("done", timeout=120)
    assert "crash.intercepted" in after  # the held log lines, once the console is done
    assert p.wait() == 0


def test_console_bad_input_keeps_the_job_waiting(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(BUGGY_SCALE)
    p = PtyProcess([*python(), "-m", "daifu", "--log", str(tmp_path / "log.jsonl"), str(script),
                    "final.pt"], cwd=str(tmp_path), env=env())
    p.expect("(daifu) ")
    p.send("frobnicate")
    assert "unknown command 'frobnicate'" in p.expect("type help")
    p.send("!scale = = 2")
    p.expect("code does not compile")
    p.send("!scale = undefined_name")
    p.expect("NameError")
    p.send("p 1/0")
    p.expect("ZeroDivisionError")
    p.send("next")  # continue: inside with/loops? here it is allowed
    p.expect("(daifu) ")
    p.send("abort")
    assert p.wait() == 1
    assert "TypeError: unsupported operand" in p.output


# -- reload ---------------------------------------------------------------------------------

def start_headless(tmp_path: Path, script: Path, *extra: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [*python(), "-m", "daifu", "--wait", "120", "--log", str(tmp_path / "log.jsonl"),
         "--journal", str(tmp_path / "journal.jsonl"), *extra, str(script), "final.pt"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(),
        stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    sock = Path(os.environ["DAIFU_RUNTIME_DIR"]) / f"{proc.pid}.sock"
    while not sock.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            out, err = proc.communicate()
            raise AssertionError(f"the job did not wait on a crash:\n{out}\n{err}")
        time.sleep(0.1)
    return proc


def daifu_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*python(), "-m", "daifu", *args], capture_output=True, text=True,
                          timeout=120, env=env())


SHAPE_BUG_IN_TEST = TRAIN.replace(
    "correct += (model(x).argmax(1) == y).sum().item()",
    "correct += (model(x.t()).argmax(1) == y).sum().item()")


def test_reload_fixes_an_inactive_function(tmp_path):
    ref = reference(tmp_path, TRAIN)
    script = tmp_path / "train.py"
    script.write_text(SHAPE_BUG_IN_TEST)
    proc = start_headless(tmp_path, script)
    listing = daifu_cli("ps")
    assert str(proc.pid) in listing.stdout and "RuntimeError" in listing.stdout
    script.write_text(TRAIN)  # the developer fixes test() in their editor
    sent = daifu_cli("send", str(proc.pid), "reload")
    assert sent.returncode == 0, sent.stdout + sent.stderr
    assert "changed  train.py: test()" in sent.stdout
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert_identical(load_params(tmp_path / "final.pt"), ref)


ACTIVE_BUG = TRAIN.replace("loss = F.cross_entropy(model(x), y) * scale",
                           "loss = F.cross_entropy(model(x), y.float()) * scale")


def test_reload_continues_the_running_training_loop_in_new_code(tmp_path):
    """The wrong statement is inside the running batch loop of train(): the
    loop continues in the edited code with its iterators and variables."""
    ref = reference(tmp_path, TRAIN)
    script = tmp_path / "train.py"
    script.write_text(ACTIVE_BUG)
    proc = start_headless(tmp_path, script)
    script.write_text(TRAIN)
    sent = daifu_cli("send", str(proc.pid), "reload")
    assert sent.returncode == 0, sent.stdout + sent.stderr
    assert "running: continues in the new code at line" in sent.stdout
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert out.count("epoch") == 3
    assert_identical(load_params(tmp_path / "final.pt"), ref)
    events = read_events(tmp_path / "log.jsonl")
    assert [e["action"] for e in events if e["event"] == "crash.resumed"] == ["reload"]
    journal = read_events(tmp_path / "journal.jsonl")
    reload_record = next(r for r in journal if r.get("kind") == "reload")
    diff = "".join(reload_record["diff"].values()).splitlines()
    assert "-            loss = F.cross_entropy(model(x), y.float()) * scale" in diff
    assert "+            loss = F.cross_entropy(model(x), y) * scale" in diff


def test_reload_with_a_syntax_error_changes_nothing(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(ACTIVE_BUG)
    proc = start_headless(tmp_path, script)
    script.write_text(ACTIVE_BUG.replace("def test(model):", "def test(model:"))
    bad = daifu_cli("send", str(proc.pid), "reload")
    assert bad.returncode == 2
    assert "nothing was changed" in bad.stdout
    still = daifu_cli("send", str(proc.pid), "p scale")
    assert still.returncode == 1 and still.stdout.strip() == "1.0"  # the job kept its state
    script.write_text(TRAIN)
    assert daifu_cli("send", str(proc.pid), "reload").returncode == 0
    proc.communicate(timeout=300)
    assert proc.returncode == 0


# -- headless attach ---------------------------------------------------------------------------

def test_headless_exec_and_retry_from_another_process(tmp_path):
    ref = reference(tmp_path, TRAIN)
    script = tmp_path / "train.py"
    script.write_text(BUGGY_SCALE)
    proc = start_headless(tmp_path, script)
    assert daifu_cli("send", str(proc.pid), "exec", "scale = 0.5").returncode == 1  # still waits
    assert daifu_cli("send", str(proc.pid), "bogus").returncode == 2
    assert daifu_cli("send", str(proc.pid), "exec", "scale = = 1").returncode == 2
    retry = daifu_cli("send", str(proc.pid), "retry")
    assert retry.returncode == 0, retry.stdout + retry.stderr
    proc.communicate(timeout=300)
    assert proc.returncode == 0
    assert_identical(load_params(tmp_path / "final.pt"), ref)
    waiting = [e for e in read_events(tmp_path / "log.jsonl") if e["event"] == "crash.waiting"]
    assert waiting and waiting[0]["socket"].endswith(f"{proc.pid}.sock")


def test_a_runtime_directory_too_deep_for_a_unix_socket_address_still_works(tmp_path,
                                                                            monkeypatch):
    # an AF_UNIX address holds 107 bytes of path: a job whose socket path was
    # longer could not wait for a fix ("AF_UNIX path too long"; a CI run's
    # pytest directories for a two-node case came to 108)
    deep = tmp_path / ("runtime-" * 8) / ("node-" * 8)
    deep.mkdir(parents=True, mode=0o700)
    assert len(str(deep / "4194304.sock")) > 108
    monkeypatch.setenv("DAIFU_RUNTIME_DIR", str(deep))
    script = tmp_path / "train.py"
    script.write_text(BUGGY_SCALE)
    proc = start_headless(tmp_path, script)
    sock = deep / f"{proc.pid}.sock"  # (made where it belongs, private)
    assert stat.S_ISSOCK(sock.stat().st_mode) and stat.S_IMODE(sock.stat().st_mode) == 0o600
    assert daifu_cli("send", str(proc.pid), "exec", "scale = 0.5").returncode == 1
    retry = daifu_cli("send", str(proc.pid), "retry")
    assert retry.returncode == 0, retry.stdout + retry.stderr
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert "path too long" not in err


def test_wait_expiry_exits_like_without_daifu(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(BUGGY_SCALE)
    plain = subprocess.run([*python(), str(script), "final.pt"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=300, env=env())
    under = subprocess.run([*python(), "-m", "daifu", "--wait", "1", "--log",
                            str(tmp_path / "log.jsonl"), str(script), "final.pt"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=300, env=env())
    assert under.returncode == plain.returncode == 1
    tb = plain.stderr[plain.stderr.index("Traceback"):]
    assert under.stderr.endswith(tb)
    gave_up = [e for e in read_events(tmp_path / "log.jsonl") if e["event"] == "crash.gave_up"]
    assert gave_up[0]["reason"] == "no fix within --wait 1s"


def test_sigterm_while_waiting_ends_the_job(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(BUGGY_SCALE)
    proc = start_headless(tmp_path, script)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert err.rstrip().splitlines()[-1].startswith("TypeError: unsupported operand")
    gave_up = [e for e in read_events(tmp_path / "log.jsonl") if e["event"] == "crash.gave_up"]
    assert gave_up[0]["reason"] == "aborted by a fix"
    assert any(e["event"] == "patch.applied" and e["origin"] == "sigterm"
               for e in read_events(tmp_path / "log.jsonl"))


def test_attach_to_a_pid_that_is_not_waiting():
    proc = daifu_cli("send", str(os.getpid()), "retry")
    assert proc.returncode == 3
    assert "no daifu job with pid" in proc.stderr


def test_the_endpoint_a_client_can_see_always_listens(tmp_path, monkeypatch):
    """A client polls for ``PID.sock`` and connects (``daifu send`` from a
    script): the name appears only once the socket listens and goes before
    it closes, so no client is ever refused by an endpoint it found (a bound,
    not yet listening, or closed socket answers ECONNREFUSED)."""
    import socket

    from daifu.engine.remote import _control

    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("DAIFU_RUNTIME_DIR", str(runtime))
    server = _control.ControlServer({}, "report", console_is_local=False)
    sock = runtime / f"{os.getpid()}.sock"
    seen = []

    def probe(*_args):
        if sock.exists():  # whatever a client finds, it can connect to
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
                client.connect(str(sock))
            seen.append("connected")
        else:
            seen.append("absent")

    rename, unlink = os.rename, os.unlink
    monkeypatch.setattr(os, "rename", lambda *a: (probe(), rename(*a), probe()))
    monkeypatch.setattr(os, "unlink", lambda *a: (probe(), unlink(*a), probe()))
    server.start()
    assert stat.S_IMODE(sock.stat().st_mode) == 0o600
    assert os.listdir(runtime) == [sock.name]  # (the staged name is gone)
    server.stop()
    assert not sock.exists()
    assert seen[-4:] == ["absent", "connected", "connected", "absent"], seen


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create a second user-id: not "
                    "available")
def test_another_user_is_refused(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(BUGGY_SCALE)
    proc = start_headless(tmp_path, script)
    sock = Path(os.environ["DAIFU_RUNTIME_DIR"]) / f"{proc.pid}.sock"
    assert stat.S_IMODE(sock.stat().st_mode) == 0o600
    assert stat.S_IMODE(sock.parent.stat().st_mode) == 0o700
    # open the file-system permissions so that only the peer-credential check is left
    opened = [p for p in (sock.parent, *sock.parent.parents) if p.stat().st_mode & 0o001 == 0]
    modes = {p: stat.S_IMODE(p.stat().st_mode) for p in opened}
    for p in opened:
        os.chmod(p, modes[p] | 0o011)
    os.chmod(sock, 0o666)
    marker = tmp_path / "pwned"
    request = json.dumps({"op": "send", "cmd": f"exec open({str(marker)!r}, 'w')"}) + "\n"
    try:
        code = textwrap.dedent(f'''
            import os, socket
            os.setgid(65534); os.setuid(65534)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect({str(sock)!r})
            s.sendall({request.encode()!r})
            print(s.recv(65536).decode())
        ''')
        other = subprocess.run([*python(), "-c", code], capture_output=True, text=True,
                               timeout=60)
        assert "permission denied: peer uid 65534" in other.stdout, other.stderr
        assert not marker.exists()
    finally:
        for p, mode in modes.items():
            os.chmod(p, mode)
    assert daifu_cli("send", str(proc.pid), "abort").returncode == 1
    proc.communicate(timeout=60)


def test_insecure_runtime_directory_is_refused(tmp_path):
    loose = tmp_path / "loose"
    loose.mkdir()
    os.chmod(loose, 0o777)
    script = tmp_path / "train.py"
    script.write_text(BUGGY_SCALE)
    proc = subprocess.run(
        [*python(), "-m", "daifu", "--wait", "30", "--log", str(tmp_path / "log.jsonl"),
         str(script), "final.pt"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**env(), "DAIFU_RUNTIME_DIR": str(loose)}, stdin=subprocess.DEVNULL)
    assert proc.returncode == 1  # gave up at once instead of listening in a public place
    assert "refusing to use it" in proc.stderr
    assert not list(loose.iterdir())
    listing = subprocess.run([*python(), "-m", "daifu", "ps"], capture_output=True, text=True,
                             env={**env(), "DAIFU_RUNTIME_DIR": str(loose)}, timeout=60)
    assert listing.returncode == 3 and "refusing to use it" in listing.stderr


def test_attach_console_from_another_terminal(tmp_path):
    ref = reference(tmp_path, TRAIN)
    script = tmp_path / "train.py"
    script.write_text(BUGGY_SCALE)
    proc = start_headless(tmp_path, script)
    client = PtyProcess([*python(), "-m", "daifu", "attach", str(proc.pid)], cwd=str(tmp_path),
                        env=env())
    out = client.expect("(daifu) ")
    assert "TypeError: unsupported operand" in out and "attached" in out
    client.send("p scale")
    assert "None" in client.expect("(daifu) ")
    client.send("exec")
    client.send("scale = 0.5")
    client.send("")
    client.expect("(daifu) ")
    client.send("retry")
    assert f"job {proc.pid}: retry" in client.expect(f"job {proc.pid}: retry")
    assert client.wait() == 0
    proc.communicate(timeout=300)
    assert proc.returncode == 0
    assert_identical(load_params(tmp_path / "final.pt"), ref)


EDITOR = '''
import sys
line, path = sys.argv[1], sys.argv[2]
assert line.startswith("+")
with open(path) as fh:
    source = fh.read()
with open(path, "w") as fh:
    fh.write(source.replace("y.float()", "y"))
'''


def test_edit_opens_the_editor_at_the_failing_line_then_reloads(tmp_path):
    ref = reference(tmp_path, TRAIN)
    script = tmp_path / "train.py"
    script.write_text(ACTIVE_BUG)
    editor = tmp_path / "editor.py"
    editor.write_text(EDITOR)
    p = PtyProcess([*python(), "-m", "daifu", "--log", str(tmp_path / "log.jsonl"), str(script),
                    "final.pt"], cwd=str(tmp_path),
                   env={**env(), "EDITOR": f"{sys.executable} {editor}"})
    p.expect("(daifu) ")
    p.send("edit")
    assert "running: continues in the new code" in p.expect("done", timeout=120)
    assert p.wait() == 0
    assert_identical(load_params(tmp_path / "final.pt"), ref)


def test_replay_against_a_changed_script_warns_and_skips(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(BUGGY_SCALE)
    proc = start_headless(tmp_path, script)
    assert daifu_cli("send", str(proc.pid), "exec", "scale = 0.5").returncode == 1
    assert daifu_cli("send", str(proc.pid), "retry").returncode == 0
    proc.communicate(timeout=300)
    # the script changed where it crashes: the recorded fix no longer applies
    script.write_text(BUGGY_SCALE.replace("loss = F.cross_entropy(model(x), y) * scale",
                                          "loss = scale * F.cross_entropy(model(x), y)"))
    log = tmp_path / "replay.jsonl"
    again = subprocess.run([*python(), "-m", "daifu", "--replay", str(tmp_path / "journal.jsonl"),
                            "--log", str(log), str(script), "final.pt"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=300, env=env())
    assert again.returncode == 1  # nothing applied: the crash continues as without daifu
    skipped = [e for e in read_events(log) if e["event"] == "replay.skipped"]
    assert skipped and "the script changed" in skipped[0]["reason"]


LIVE = textwrap.dedent('''
    import time
    from rich.live import Live
    from rich.text import Text
    from tqdm import tqdm

    def run():
        done = []
        with Live(Text("training"), refresh_per_second=20) as live:
            for step in tqdm(range(6), desc="steps"):
                live.update(Text(f"training step {step}"))
                done.append(10 // (step - 3))   # fails at step 3
                time.sleep(0.01)
        print("finished", done, flush=True)

    run()
''')


def test_live_displays_and_progress_bars_step_aside_while_the_console_has_the_terminal(
        tmp_path):
    import select

    script = tmp_path / "live.py"
    script.write_text(LIVE)
    p = PtyProcess([*python(), "-m", "daifu", "--log", str(tmp_path / "log.jsonl"),
                    str(script)], cwd=str(tmp_path), env=env())
    p.expect("(daifu) ")
    # the prompt stays alone: nothing repaints over it while a person types
    ready, _, _ = select.select([p.master], [], [], 1.0)
    assert not ready, os.read(p.master, 4096)
    p.send("!step = 5")
    p.expect("(daifu) ")
    p.send("retry")
    tail = p.expect("finished", timeout=60)
    assert "steps" in tail  # the bar is drawn again after the console
    assert p.wait() == 0


def test_sigterm_the_instant_the_endpoint_opens_gives_up_the_crash(tmp_path):
    # the socket is how a client (or a scheduler's script) knows the job waits:
    # a SIGTERM sent the moment it appears must find daifu's handler in place
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""\
        import os, signal
        from daifu.engine.remote import _control

        _start = _control.ControlServer.start

        def start(self):
            path = _start(self)
            os.kill(os.getpid(), signal.SIGTERM)
            return path

        _control.ControlServer.start = start
        """) + BUGGY_SCALE)
    proc = subprocess.Popen(
        [*python(), "-m", "daifu", "--wait", "120", "--log", str(tmp_path / "log.jsonl"),
         str(script), "final.pt"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=env(), stdin=subprocess.DEVNULL)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    assert err.rstrip().splitlines()[-1].startswith("TypeError: unsupported operand")
    gave_up = [e for e in read_events(tmp_path / "log.jsonl") if e["event"] == "crash.gave_up"]
    assert gave_up[0]["reason"] == "aborted by a fix"
    assert not (Path(os.environ["DAIFU_RUNTIME_DIR"]) / f"{proc.pid}.sock").exists()
