"""Reaching a distributed job's ranks through its store (``engine/remote/_jobstore``,
``engine/remote/_seal``): only this user's sealed commands are taken, once, fresh;
answers are sealed; nobody who reads the store learns what was said."""

from __future__ import annotations

import os
import time

import pytest

from daifu.engine.remote import _seal


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

    from daifu.engine.remote import _jobstore

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
            "op": "status", "id": ident, "t": issued, "deadline": issued + 60,
            "reply": reply}))

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
            "deadline": time.time() + 60, "seq": 1, "reply": f"daifu/relay/j/r/{reply}",
            "live": f"daifu/relay/j/r/{reply}/live"}))
    assert channel.ask(None, {"op": "status"}, 5.0)[0]["state"] == "running"
    assert server.queue_len("daifu/relay/j/r/gone") == 0
    # ... and a command that acts is never run once its sender stopped waiting
    # (it could not confirm it: ``Relay._confirmed``)
    assert server.queue_len("daifu/relay/j/r/sent") == 0
    keys = server.num_keys()
    assert channel.ask(None, {"op": "status"}, 5.0)
    assert server.num_keys() == keys  # a client leaves nothing behind in the store


class _Thief:
    """A client's store connection, with another user in the middle: what the
    client pushes onto a rank's queue is popped (``held``) before the rank
    sees it, while ``stealing``; the keys it sets are seen (``names``)."""

    def __init__(self, store, queues):
        self.store, self.queues, self.stealing = store, queues, True
        self.held: list[bytes] = []
        self.names: list[str] = []

    def queue_push(self, name, value):
        if self.stealing and name in self.queues:
            self.held.append(value.encode() if isinstance(value, str) else value)
            return None
        return self.store.queue_push(name, value)

    def set(self, name, value):
        self.names.append(name)
        return self.store.set(name, value)

    def __getattr__(self, name):
        return getattr(self.store, name)


@pytest.fixture
def waiting_rank(job_store, monkeypatch):
    """The relay's process waits on a crash: its control socket takes
    commands (listed in ``ran``, answered at once).  Drops are named in every
    event (not at most one every few seconds)."""
    import threading

    from daifu.engine.remote._control import ControlServer

    server, channel, _jobstore = job_store
    monkeypatch.setattr(_jobstore.dropped, "EVERY_S", 0.0)
    monkeypatch.setattr(_jobstore, "_GO_WAIT_S", 1.0)
    control = ControlServer({"pid": os.getpid(), "since": time.time()}, "report", False)
    control.start()
    ran: list[str] = []

    def serve():
        while (request := control.requests.get()) is not None:
            ran.append(request.text)
            request.reply = {"ok": True, "output": f"ran {request.text}"}
            request.done.set()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server, channel, _jobstore, ran
    control.requests.put(None)  # type: ignore[arg-type]
    control.stop()
    thread.join(5)


def _dropped(logs) -> list[str]:
    return [f"{e['key']}: {e['reason']}" for e in logs if e["event"] == "store.dropped"]


def test_a_command_held_back_in_the_store_never_runs_after_its_sender_was_told(waiting_rank):
    """Another user pops the owner's ``exec`` from rank 0's queue; the owner's
    ``send`` is told it was not delivered, and its command never runs when it
    is pushed back later -- nor when it is replayed, or moved to another rank."""
    from daifu.engine._events import capture

    server, channel, _jobstore, ran = waiting_rank
    queue = _jobstore._queue("j", 0)
    thief = _Thief(channel.store, {queue, _jobstore._queue("j", 1)})
    channel.store = thief
    with capture() as logs:
        told = channel.ask([0], {"op": "send", "cmd": "exec\nPWNED = 1\n"}, 1.0)[0]
        assert told["ok"] is False and told["delivered"] is False
        assert told["error"].startswith("not delivered: rank 0 did not take it within 1s")
        assert "cancelled, it will never run" in told["error"]
        command, cancel = thief.held  # (the sealed cancel was popped too)
        # pushed back later, with the client's "still waiting" key made again
        # and its cancel removed: the rank asks its sender to confirm, nobody
        # does, it is not run
        live = next(n for n in thief.names if n.endswith("/live"))
        server.set(live, b"1")
        for name in thief.names:
            if "/go/" in name:
                server.delete_key(name)
        server.queue_push(queue, command)
        server.queue_push(queue, command)  # and once more: a replay
        thief.stealing = False
        assert channel.ask([0], {"op": "status"}, 5.0)[0]["pid"] == os.getpid()
        assert ran == []
        # with the cancel delivered first, a command held back is void at once
        thief.stealing = True
        channel.ask([0], {"op": "send", "cmd": "exec\nPWNED = 2\n"}, 0.5)
        command2, cancel2 = thief.held[2:]
        server.queue_push(queue, cancel2)
        server.queue_push(queue, command2)
        # moved: a command sealed for rank 1 pushed onto rank 0's queue
        channel.world = 2
        channel.ask([1], {"op": "send", "cmd": "exec\nPWNED = 3\n"}, 0.5)
        server.queue_push(queue, thief.held[4])
        thief.stealing = False
        assert channel.ask([0], {"op": "status"}, 5.0)
    assert ran == []
    reasons = _dropped(logs)
    assert any(r.startswith(f"{queue}: unconfirmed: its sender did not confirm it within 1s")
               for r in reasons), reasons
    assert any(r.startswith(f"{queue}: replayed") for r in reasons), reasons
    assert any(r.startswith(f"{queue}: cancelled by its sender") for r in reasons), reasons
    assert any(r.startswith(f"{queue}: not sealed for rank 0 of this job") for r in reasons), \
        reasons
    # the sender is told the truth when it is delivered: applied, with the answer
    told = channel.ask([0], {"op": "send", "cmd": "p 1"}, 5.0)[0]
    assert told["ok"] and told["delivered"] and told["output"] == "ran p 1"
    assert ran == ["p 1"]


def test_a_command_older_than_one_already_taken_is_not_taken(waiting_rank):
    """Commands that act carry the job's sequence number for their rank: one
    held back while a later one was taken is dropped, its sender told so."""
    from daifu.engine._events import capture

    server, channel, _jobstore, ran = waiting_rank
    queue = _jobstore._queue("j", 0)
    thief = _Thief(channel.store, {queue})
    channel.store = thief
    import threading

    told: dict = {}
    with capture() as logs:
        first = threading.Thread(target=lambda: told.update(
            channel.ask([0], {"op": "send", "cmd": "p 'first'"}, 5.0)))
        first.start()
        deadline = time.monotonic() + 5
        while not thief.held:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        thief.stealing = False
        later = channel.ask([0], {"op": "send", "cmd": "p 'later'"}, 5.0)[0]
        server.queue_push(queue, thief.held[0])  # the first one, after the later one ran
        first.join()
    assert later["ok"] and ran == ["p 'later'"]
    assert told[0]["delivered"] is False and "superseded" in told[0]["error"]
    assert any("superseded: command #1 came after #2 was taken" in r for r in _dropped(logs))


def test_a_relay_reaches_a_store_that_comes_up_after_it(tmp_path, monkeypatch):
    # (a busy machine slow to accept; a launcher whose rank 0 makes the store later)
    pytest.importorskip("torch", reason="PyTorch not available")
    import socket

    import torch.distributed as dist

    from daifu.engine.remote import _jobstore

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
    from daifu.engine.remote._doctor import diagnose

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
from daifu.engine.remote import _jobstore
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

    from daifu.engine.remote import _jobstore

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


# -- job decisions agreed in the store (``_distributed.agree``) ---------------------------


@pytest.fixture
def rank_zero_of_two(tmp_path, monkeypatch):
    """This process is rank 0 of a job of two ranks whose store is a TCPStore;
    yields (the store, a client of another user -- a plain store client,
    without the key --, a crash to decide on)."""
    pytest.importorskip("torch", reason="PyTorch not available")
    from types import SimpleNamespace

    import torch.distributed as dist

    from daifu.engine.remote import _distributed, _jobstore

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "2"), ("TORCHELASTIC_RUN_ID", "agree"),
                        ("DAIFU_AGREE_TIMEOUT", "1")):
        monkeypatch.setenv(name, value)
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    monkeypatch.setattr(_distributed, "_group", lambda: object())
    monkeypatch.setattr(_distributed, "_world", lambda: (server, 2, 0))
    monkeypatch.setattr(_distributed, "_state", type(_distributed._state)())  # (no round, no key)
    monkeypatch.setattr(_distributed, "_job_reason", lambda decision, crash: None)
    monkeypatch.setattr(_jobstore.dropped, "EVERY_S", 0.0)
    other = dist.TCPStore("127.0.0.1", server.port, is_master=False)
    yield server, other, SimpleNamespace(where="train.py:9", statement="x = step()")


def test_a_forged_agreement_is_dropped_and_the_refused_decision_stays_refused(
        rank_zero_of_two):
    """The other user writes rank 1's answer to rank 0's job-wide retry (rank 1
    is not at that crash): in the clear, as rank 0's sealed answer moved to
    rank 1's place, and as a genuine answer of rank 1 from an earlier attempt.
    Each is dropped and the retry refused; with rank 1 really there it is agreed."""
    import threading

    from daifu._errors import PatchError
    from daifu.engine._decision import RETRY
    from daifu.engine._events import capture
    from daifu.engine.remote import _distributed

    server, other, crash = rank_zero_of_two
    theirs = "daifu/agree/1/1"
    other.set(theirs, "train.py:9|x = step()|retry")  # (what rank 0 posted before: its text)
    other.set("daifu/at-crash/1", "1")
    with capture() as logs, pytest.raises(PatchError, match="not every rank of the job took it"
                                          ) as refused:
        _distributed.agree(RETRY, crash)
    assert "daifu/agree/1/1" in str(refused.value)
    assert any(r.startswith("daifu/agree/1/1: not sealed for rank 1's agree of round 1")
               for r in _dropped(logs)), _dropped(logs)
    assert any(r.startswith("daifu/at-crash/1: not sealed") for r in _dropped(logs))

    def move() -> None:  # rank 0's own sealed answer, copied to rank 1's place
        import datetime

        other.wait(["daifu/agree/1/0"], datetime.timedelta(seconds=10))
        other.set(theirs, other.get("daifu/agree/1/0"))

    mover = threading.Thread(target=move)
    mover.start()
    with capture() as logs, pytest.raises(PatchError, match="not every rank"):
        _distributed.agree(RETRY, crash)
    mover.join()
    assert any(r.startswith("daifu/agree/1/1: not sealed") for r in _dropped(logs))
    # a genuine answer of rank 1 from an earlier attempt of the round, replayed
    # (this user's key made it: rank 1 sealed it then)
    key, job = _distributed._key(), "agree"
    other.set(theirs, _seal.seal(key, f"agree|{job}|1|1", {
        "what": "train.py:9|x = step()|retry", "nonce": "earlier", "refuse": ""}))
    other.set(f"{theirs}/seen", _seal.seal(key, f"seen|{job}|1|1", {
        "nonces": {"0": "before", "1": "earlier"}}))
    with pytest.raises(PatchError, match="not every rank"):
        _distributed.agree(RETRY, crash)
    assert _distributed._state.rounds == 0  # (no round happened)
    # rank 1 at the same crash, taking the same decision: agreed
    import torch.distributed as dist

    rank1 = _distributed._Meeting(dist.TCPStore("127.0.0.1", server.port, is_master=False),
                                  key, job, 1, 2, 1)
    done: list = []
    peer = threading.Thread(target=lambda: done.append(
        rank1.run("train.py:9|x = step()|retry", "", 10.0)))
    peer.start()
    _distributed.agree(RETRY, crash)
    peer.join()
    assert sorted(done[0]) == [0, 1] and _distributed._state.rounds == 1


def test_a_job_wide_decision_one_rank_cannot_take_is_refused_on_every_rank(rank_zero_of_two,
                                                                         monkeypatch):
    """One rank's reason to refuse (its statement already ran a collective)
    travels with its answer: every rank refuses, at once."""
    import threading

    import torch.distributed as dist

    from daifu._errors import PatchError
    from daifu.engine._decision import RETRY
    from daifu.engine.remote import _distributed

    server, _, crash = rank_zero_of_two
    rank1 = _distributed._Meeting(dist.TCPStore("127.0.0.1", server.port, is_master=False),
                                  _distributed._key(), "agree", 1, 2, 1)
    peer = threading.Thread(target=lambda: rank1.run(
        "train.py:9|x = step()|retry", "rank 1 ran all_reduce already", 10.0))
    peer.start()
    with pytest.raises(PatchError, match="retry for all ranks refused: rank 1 ran all_reduce"):
        _distributed.agree(RETRY, crash)
    peer.join()


def test_a_key_that_cannot_be_had_is_said_when_the_rank_starts(tmp_path, monkeypatch):
    from daifu.engine._events import capture
    from daifu.engine.remote import _jobstore

    path = tmp_path / "job.key"
    path.write_text("x" * 44)
    path.chmod(0o644)  # others can read it
    for name, value in (("DAIFU_JOB_KEY_FILE", str(path)), ("RANK", "3"), ("WORLD_SIZE", "4"),
                        ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "1"),
                        ("TORCHELASTIC_RUN_ID", "k")):
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(_jobstore, "_state", type(_jobstore._state)())  # (no relay yet)
    with capture() as logs:
        _jobstore.start_relay()
    said = [e for e in logs if e["event"] == "relay.unavailable"]
    assert len(said) == 1 and said[0]["store"] == "127.0.0.1:1", logs
    assert said[0]["reason"].startswith(f"refusing the daifu key {path}")
    assert "rank 3 is reached on this machine only" in said[0]["reason"]
    assert _jobstore._state.relay is None


def test_the_files_of_a_rank_killed_by_sigterm_are_removed(tmp_path, monkeypatch):
    """A rank ended by SIGTERM (preemption: it dies of the signal, as under
    python) leaves its job and stacks files; the next ``ps`` removes both."""
    import subprocess
    import sys

    from daifu.engine.remote._rundir import running_jobs

    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    monkeypatch.setenv("DAIFU_RUNTIME_DIR", str(run))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    pid = int(gone.stdout)
    for name in (f"{pid}.job", f"{pid}.stacks", f"{os.getpid()}.stacks"):
        (run / name).write_text("{}")
        (run / name).chmod(0o600)
    assert running_jobs() == []
    assert sorted(p.name for p in run.iterdir()) == [f"{os.getpid()}.stacks"]  # (alive: kept)


class _MemoryStore:
    """The part of a c10d store a ``Boundary`` uses, in memory."""

    def __init__(self):
        self.values: dict[str, bytes] = {}

    def set(self, name, value):
        self.values[name] = value.encode() if isinstance(value, str) else value

    def get(self, name):
        return self.values[name]

    def check(self, names):
        return all(n in self.values for n in names)


@pytest.mark.parametrize(("have", "late", "expected"), [
    ((True, True, True), None, "ck/job.dcp"),  # every rank holds shards: DCP, rank 0's
    ((True, False, True), None, None),         # one rank holds none: each file its own
    ((True, True, True), 2, None),             # one rank never says in time: the same
])
def test_the_ranks_agree_on_one_dcp_directory_or_on_none(have, late, expected):
    """``Boundary.shards``: a collective DCP save only where every rank said
    it holds sharded state at the agreed step; whatever rank 0 decides,
    every rank that waits learns it (none is left alone in the collective)."""
    import threading

    from daifu.engine.remote._boundary import Boundary

    store, key = _MemoryStore(), os.urandom(32)
    got: dict[int, object] = {}

    def rank(r: int) -> None:
        b = Boundary(store, key, "job", 3, r)
        if r == late:
            time.sleep(1.0)  # (after rank 0 gave up waiting)
        got[r] = b.shards(7, have[r], "ck/job.dcp" if r == 0 else None,
                          0.5 if r == 0 else 5.0)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    answers = {r: got[r] for r in range(3)}
    assert answers == {0: expected, 1: expected if have[1] else None, 2: expected}
    # a forged or stale decision (another step) is not taken
    b = Boundary(store, key, "job", 3, 1)
    store.set(b._name("shards", None), "forged")
    assert b.shards(7, True, None, 0.2) is None
