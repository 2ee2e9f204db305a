"""Reaching a distributed job's ranks through its store (``engine/_jobstore``,
``engine/_seal``): only this user's sealed commands are taken, once, fresh;
answers are sealed; nobody who reads the store learns what was said."""

from __future__ import annotations

import os
import time

import pytest

from daifu.engine import _seal


def test_a_sealed_message_opens_only_with_its_key_at_its_place(tmp_path, monkeypatch):
    monkeypatch.setenv("DAIFU_JOB_KEY_FILE", str(tmp_path / "missing.key"))
    with pytest.raises(_seal.SealError, match="no daifu key"):
        _seal.load_key()  # a key named by the variable is never made up
    monkeypatch.delenv("DAIFU_JOB_KEY_FILE")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    key = _seal.load_key()
    assert _seal.load_key() == key  # made once, 0600 in a 0700 directory
    path = tmp_path / "config" / "daifu" / "job.key"
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert oct(path.parent.stat().st_mode & 0o777) == "0o700"
    sealed = _seal.seal(key, "cmd|job|0", {"op": "send", "cmd": "exec\nsecret = 42\n"})
    assert "secret" not in sealed and "exec" not in sealed  # encrypted, not only signed
    assert _seal.unseal(key, "cmd|job|0", sealed)["cmd"] == "exec\nsecret = 42\n"
    with pytest.raises(_seal.SealError):
        _seal.unseal(key, "cmd|job|1", sealed)  # moved to another rank's queue
    with pytest.raises(_seal.SealError):
        _seal.unseal(os.urandom(32), "cmd|job|0", sealed)  # another user's key
    import json

    outer = json.loads(sealed)
    flipped = bytearray(__import__("base64").b64decode(outer["c"]))
    flipped[0] ^= 1
    outer["c"] = __import__("base64").b64encode(bytes(flipped)).decode()
    with pytest.raises(_seal.SealError):
        _seal.unseal(key, "cmd|job|0", json.dumps(outer))  # altered
    with pytest.raises(_seal.SealError):
        _seal.unseal(key, "cmd|job|0", "not json")


def test_a_key_others_can_read_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "job.key"
    path.write_text("x" * 44)
    path.chmod(0o644)
    monkeypatch.setenv("DAIFU_JOB_KEY_FILE", str(path))
    with pytest.raises(_seal.SealError, match="nobody else can read"):
        _seal.load_key()
    path.chmod(0o600)
    assert _seal.load_key() == b"x" * 44


@pytest.fixture
def job_store(tmp_path, monkeypatch):
    """A store like torchrun's, a relay for rank 0 of job "j" in this process,
    and a channel to it (this user's key)."""
    pytest.importorskip("torch", reason="PyTorch not available")
    import torch.distributed as dist

    from daifu.engine import _jobstore

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    relay = _jobstore.Relay("j", "127.0.0.1", server.port, 0, _seal.load_key())
    relay.start()
    channel = _jobstore.Channel("j", "127.0.0.1", server.port, 1)
    deadline = time.monotonic() + 10
    while not server.check([_jobstore._fingerprint_key("j", 0)]):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    yield server, channel, _jobstore
    relay.stop(server)


def test_the_relay_answers_this_users_commands_and_drops_everything_else(job_store, tmp_path,
                                                                          monkeypatch):
    server, channel, _jobstore = job_store
    status = channel.ask(None, {"op": "status"}, 5.0)
    assert status[0]["state"] == "running" and status[0]["pid"] == os.getpid()
    # garbage and another user's commands are dropped; the relay goes on
    server.queue_push(_jobstore._queue("j", 0), b"rm -rf /")
    monkeypatch.setenv("DAIFU_JOB_KEY_FILE", str(tmp_path / "other.key"))
    (tmp_path / "other.key").write_bytes(os.urandom(32).hex().encode())
    (tmp_path / "other.key").chmod(0o600)
    stranger = _jobstore.Channel("j", "127.0.0.1", server.port, 1)
    assert stranger.ask(None, {"op": "status"}, 1.0) == {}
    assert channel.other_keys() == [] and stranger.other_keys() == [0]
    monkeypatch.delenv("DAIFU_JOB_KEY_FILE")
    assert channel.ask(None, {"op": "status"}, 5.0)[0]["state"] == "running"


def test_a_command_is_taken_once_and_only_while_fresh(job_store):
    server, channel, _jobstore = job_store
    key = channel.key
    queue = _jobstore._queue("j", 0)

    def push(ident: str, issued: float, reply: str) -> None:
        server.queue_push(queue, _seal.seal(key, "cmd|j|0", {
            "op": "status", "id": ident, "t": issued, "reply": reply}))

    push("once", time.time(), "daifu/relay/j/r/a")
    push("once", time.time(), "daifu/relay/j/r/b")  # the same command again: a replay
    push("old", time.time() - 3600, "daifu/relay/j/r/c")  # issued before the relay started
    assert channel.ask(None, {"op": "status"}, 5.0)  # (all of the above were handled first)
    assert server.queue_len("daifu/relay/j/r/a") == 1
    assert server.queue_len("daifu/relay/j/r/b") == 0
    assert server.queue_len("daifu/relay/j/r/c") == 0
    answer = server.queue_pop("daifu/relay/j/r/a", False).decode()
    assert answer.startswith("0 ") and "running" not in answer  # the answer is sealed
    assert _seal.unseal(key, "reply|j|0|once", answer[2:])["state"] == "running"


def test_a_command_whose_client_stopped_waiting_is_dropped_unanswered(job_store):
    # a client that polls a busy rank gives up and asks again: the relay must
    # not answer every abandoned command first, falling ever further behind
    server, channel, _jobstore = job_store
    for op, reply in (("status", "gone"), ("send", "sent")):
        server.queue_push(_jobstore._queue("j", 0), _seal.seal(channel.key, "cmd|j|0", {
            "op": op, "cmd": "continue", "id": op, "t": time.time(),
            "reply": f"daifu/relay/j/r/{reply}", "live": f"daifu/relay/j/r/{reply}/live"}))
    assert channel.ask(None, {"op": "status"}, 5.0)[0]["state"] == "running"
    assert server.queue_len("daifu/relay/j/r/gone") == 0
    # ... but a decision is always handed on (a job-wide one must reach every
    # rank): here it is refused, as this process waits on no crash
    assert server.queue_len("daifu/relay/j/r/sent") == 1
    keys = server.num_keys()
    assert channel.ask(None, {"op": "status"}, 5.0)
    assert server.num_keys() == keys  # a client leaves nothing behind in the store


def test_a_relay_reaches_a_store_that_comes_up_after_it(tmp_path, monkeypatch):
    # (a busy machine slow to accept; a launcher whose rank 0 makes the store later)
    pytest.importorskip("torch", reason="PyTorch not available")
    import socket

    import torch.distributed as dist

    from daifu.engine import _jobstore

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))

    def free_port() -> int:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return sock.getsockname()[1]

    port = free_port()
    relay = _jobstore.Relay("late", "127.0.0.1", port, 0, _seal.load_key())
    relay.start()
    time.sleep(1.0)
    assert relay.is_alive()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    try:
        channel = _jobstore.Channel("late", "127.0.0.1", port, 1)
        answers = channel.ask(None, {"op": "status"}, 15.0)
        assert answers[0]["pid"] == os.getpid()
    finally:
        relay.stop(server)
    assert not relay.is_alive()
    # stopped before it ever connected: it ends at once
    waiting = _jobstore.Relay("never", "127.0.0.1", free_port(), 0, _seal.load_key())
    waiting.start()
    started = time.monotonic()
    waiting.stop()
    assert not waiting.is_alive() and time.monotonic() - started < 2.0


def test_stacks_name_this_process_threads_and_its_line(job_store):
    _, channel, _ = job_store
    answer = channel.ask(None, {"op": "stacks"}, 5.0)[0]
    main = answer["threads"][0]
    assert main["main"] and main["thread"] == "MainThread"
    assert any(name == "test_stacks_name_this_process_threads_and_its_line"
               for _, _, name, _ in main["frames"])
    assert not any(t["thread"] == "daifu-relay" for t in answer["threads"])


def _answer(collectives, at="train.py:9 in main"):
    return {"ok": True, "threads": [], "collectives": collectives, "at": at, "innermost": at}


def _c(seq, name="all_reduce", sizes=((4,),), where="train.py:20 in main", pg="0"):
    return {"pg": pg, "seq": seq, "name": name, "sizes": [list(s) for s in sizes],
            "record": seq, "where": where}


def test_the_doctor_names_the_rank_behind_and_the_collective_that_differs():
    from daifu.engine._doctor import diagnose

    # rank 1 issued one all_reduce fewer: the others wait in #3
    behind = diagnose({0: _answer([_c(1), _c(2), _c(3)]),
                       1: _answer([_c(1), _c(2)], at="train.py:31 in load_batch")})
    assert behind[0].startswith("rank 1 is behind in process group 0: its last collective is "
                                "#2 all_reduce [[4]] at train.py:20 in main; rank 0 issued #3")
    assert behind[1] == "  rank 1 is at train.py:31 in load_batch"
    # same count, but rank 1's second collective has other sizes (a padded tensor)
    sizes = diagnose({0: _answer([_c(1), _c(2)]),
                      1: _answer([_c(1), _c(2, sizes=((5,),), where="train.py:24 in main")])})
    assert sizes == ["collective #2 of process group 0 differs between the ranks:",
                     "  rank 0: #2 all_reduce [[4]] at train.py:20 in main",
                     "  rank 1: #2 all_reduce [[5]] at train.py:24 in main"]
    # another order: a broadcast where the others all_reduce
    order = diagnose({0: _answer([_c(1), _c(2)]), 1: _answer([_c(1), _c(2, name="broadcast")])})
    assert "collective #2 of process group 0 differs" in order[0]
    assert diagnose({0: _answer([_c(1)]), 1: _answer([_c(1)])}) == []  # in step
    # no flight recorder: where the main threads are
    blind = diagnose({0: _answer(None, at="x/torch/distributed/distributed_c10d.py:3252"),
                      1: _answer(None, at="train.py:31 in load_batch")})
    assert blind[0].startswith("ranks 0 wait in a collective; rank 1 is elsewhere (behind)")


_EXITING_RANK = """
import atexit, datetime, sys, time
import torch.distributed as dist
from daifu.engine import _jobstore
_jobstore.start_relay()
store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=False,
                      timeout=datetime.timedelta(seconds=20))
deadline = time.monotonic() + 20
while not store.check([_jobstore._fingerprint_key(sys.argv[2], 0)]):
    assert time.monotonic() < deadline, "the relay never reached the store"
    time.sleep(0.02)
atexit.register(lambda: store.set("exiting", "1"))  # (atexit: after threads' shutdown hooks)
"""


@pytest.mark.slow
def test_a_command_that_comes_while_a_rank_exits_does_not_kill_it(tmp_path, monkeypatch):
    """The relay leaves the store before the interpreter finalizes: a daemon
    thread whose ``queue_pop`` returned during finalization would end in
    ``std::terminate`` (SIGABRT) -- a job that did all its work would die at
    exit (seen under torchrun when ``ps`` polled the ranks of an ending job)."""
    pytest.importorskip("torch", reason="PyTorch not available")
    import datetime
    import subprocess
    import sys

    import torch.distributed as dist

    from daifu.engine import _jobstore

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    job = f"run@127.0.0.1:{server.port}"
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "config"), "RANK": "0",
           "LOCAL_RANK": "0", "WORLD_SIZE": "1", "TORCHELASTIC_RUN_ID": "run",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(server.port)}
    child = subprocess.Popen([sys.executable, "-c", _EXITING_RANK, str(server.port), job],
                             env=env, stderr=subprocess.PIPE, text=True)
    try:
        server.wait(["exiting"], datetime.timedelta(seconds=60))
        time.sleep(0.02)  # (the child is finalizing now: it takes longer with torch loaded)
        server.queue_push(_jobstore._queue(job, 0), b"a command, late")
        _, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == 0, err
    assert "terminate called" not in err
