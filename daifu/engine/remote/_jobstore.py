"""Every rank of a distributed job, on every node, through the job's own store.

A rank's control socket (``_control``) is reachable only on its own machine.
To reach the ranks on other nodes, each rank of a torchrun job runs a
*relay*: a daemon thread with a client of its own of the job's TCPStore
(``MASTER_ADDR:MASTER_PORT``, which torchrun runs for the job and gives every
rank on every node), blocked on its queue there until a command comes.

* A client -- ``python -m daifu send --job``, ``ps``, ``stacks --job`` on any
  node, or the console's ``ranks``/``rank N``/``all`` in a rank -- pushes a
  sealed command (``_seal``) onto each target rank's queue, with a fresh
  queue for the answers, and collects them.
* The relay opens the command with this user's key; a command it cannot
  open (another user's, altered, for another rank or job), an old one or one
  seen before is dropped.  ``send`` and ``report`` are handed to the rank's
  own control socket -- the same door as a local ``send``/``attach``, so a
  remote command is checked, journaled and agreed exactly as a local one;
  ``status`` and ``stacks`` are answered by the relay (a rank blocked in a
  gloo collective answers: gloo waits without the GIL).
* Answers are sealed too: another user who reads the store learns nothing
  of the job's variables, and cannot make a rank seem to answer.
* A command that acts (``send``) is ordered and confirmed: it carries a
  per-job, per-rank sequence number and its sender's deadline; the rank
  takes it only inside the deadline and only when no later one was taken,
  then answers a fresh *challenge* and runs it only once the sender, still
  waiting, confirmed that challenge (``go``).  A command held back in the
  store and delivered after its sender gave up (and sent a sealed cancel)
  never runs, whatever the clocks say; the sender is told "not delivered"
  (it will never run), its answer, or "delivered, no answer" -- never
  "no answer" for a command that may still run.

Threat model (docs/architecture.md): the store is an unauthenticated TCP
service any user who can reach its port may read and write.  What daifu puts
there must not let anyone but the job's user run code in the job or take
decisions for it, nor read what it answers.  Denial of service through the
store (deleting keys, filling queues) is out of scope: whoever can do that
can already break the job's rendezvous.  Whatever a rank drops is named in
a ``store.dropped`` event.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time

from ..._runtime import RUNTIME, state_record
from .._crash import _installed, is_plumbing
from .._events import RelayUnavailable, StoreDropped, emit
from .._job import distributed, job_file_info
from ._control import SEND_TIMEOUT_S, EndpointError, Session, list_jobs, request, send_to_ranks
from ._rundir import running_jobs
from ._seal import SealError, fingerprint, load_key, seal, unseal

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)
if TYPE_CHECKING:
    from typing import Any

#: ``DAIFU_STORE_RELAY=0``: ranks are reached through this machine's sockets only
RELAY_ENV = "DAIFU_STORE_RELAY"
_PREFIX = "daifu/relay/"
#: how far a command's clock may be ahead of this node's, or behind the relay's start (s)
_SKEW_S = 60.0
#: how long a command stays valid after it was issued (s)
_FRESH_S = 600.0
#: the relay's wait on its queue (a store client times out after this; it then waits again)
_RELAY_WAIT_S = 7 * 86400.0
#: how long a client tries to reach the store
_CONNECT_S = 20.0
#: how long a rank waits for the sender of a command it took to confirm it (s)
_GO_WAIT_S = 10.0
#: what acts on the rank (ordered, confirmed); the rest only reads
_ACTING = ("send",)
#: how long a relay keeps trying to reach a store that is not there yet (s;
#: a launcher that sets MASTER_ADDR/MASTER_PORT without running a store has
#: rank 0's init_process_group make it, later), and its longest pause between tries
_REACH_S, _REACH_PAUSE_S = 600.0, 10.0
#: how long the end of a job waits to wake its relay and see it leave the store (s)
_STOP_S = 2.0


def enabled() -> bool:
    return os.environ.get(RELAY_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def _client(addr: str, port: int, timeout_s: float):
    """A TCPStore client of daifu's own (a client serves one request at a
    time: the job's own store client must never wait behind daifu's)."""
    import datetime  # lazy: 2.2 ms

    import torch.distributed as dist  # lazy: 1.4 s

    # a store that is not there: said here, in one line (TCPStore's own client
    # retries for the whole timeout and prints a C++ stack to stderr)
    socket.create_connection((addr, port), timeout=min(timeout_s, 10.0)).close()
    return dist.TCPStore(addr, port, is_master=False, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=timeout_s))


def _queue(job: str, rank: int) -> str:
    return f"{_PREFIX}{job}/q/{rank}"


def _fingerprint_key(job: str, rank: int) -> str:
    return f"{_PREFIX}{job}/fp/{rank}"


def _seq_key(job: str, rank: int) -> str:
    """The job's counter of commands that act on ``rank`` (``store.add``: an
    attacker who changes it can only make later commands look stale)."""
    return f"{_PREFIX}{job}/seq/{rank}"


def _go_key(reply: str, rank: int) -> str:
    """Where the sender of a command confirms (or cancels) it for ``rank``."""
    return f"{reply}/go/{rank}"


class _Drops:
    """``store.dropped`` events, at most one per reason every few seconds
    (someone who floods a queue with garbage must not flood the log too)."""

    EVERY_S = 5.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def __call__(self, key: str, reason: str) -> None:
        kind = f"{key} {reason.split(' ', 1)[0]}"
        now = time.monotonic()
        with self._lock:
            count = self._held.get(kind, 0) + 1
            if now - self._last.get(kind, -self.EVERY_S) < self.EVERY_S:
                self._held[kind] = count
                return
            self._last[kind], self._held[kind] = now, 0
        try:
            emit(StoreDropped(key=key, reason=reason, count=count))
        except Exception:
            pass


#: name what a rank dropped from the store (``store.dropped``)
dropped = _Drops()


# -- the rank's side ----------------------------------------------------------------


class Relay(threading.Thread):
    """A rank's relay: commands from the store to the rank (see the module)."""

    def __init__(self, job: str, addr: str, port: int, rank: int, key: bytes):
        super().__init__(name="daifu-relay", daemon=True)
        self.job, self.addr, self.port, self.rank, self.key = job, addr, port, rank, key
        self.started_at = time.time()
        self._seen: dict[str, float] = {}  # command id -> when it was issued
        self._void: dict[str, float] = {}  # command id -> when its sender cancelled it
        self._last_seq = 0  # the sequence number of the last command that acts taken
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._waiting = False  # connected, and waiting on its queue
        self._out: Any = None  # the store client answers go out on (made at the first command)

    def stop(self, store: Any = None, timeout_s: float = _STOP_S) -> None:
        """End the relay and wait for it (never raises; ``store``: a client of
        the same store to wake it with, else one is made).

        Run before the interpreter finalizes (``start_relay`` registers it
        with ``threading``'s shutdown): a daemon thread still blocked in the
        store's ``queue_pop`` when finalization begins is killed by
        ``pthread_exit`` the moment the call returns (a command, or the store
        closing), and that unwinds through C++ frames that must not unwind:
        ``std::terminate``, SIGABRT -- a job that finished its work dies at
        exit.  Woken by a ``stop`` in its own queue, it leaves the store first."""
        with self._lock:
            self._stopping.set()
            waiting = self._waiting
        if not self.is_alive():
            return
        if not waiting:  # (not connected yet: it sees the flag before it waits)
            self.join(timeout_s)
            return
        try:
            if store is None:
                store = _client(self.addr, self.port, timeout_s)
            store.queue_push(_queue(self.job, self.rank), b"stop")
        except Exception:
            return  # (no store to reach: the relay's own wait fails and it ends)
        self.join(timeout_s)

    def _connect(self) -> Any:
        """The client the relay waits on, once the store answers (tried again,
        with growing pauses, for ``_REACH_S``: a machine under load may be
        slow to accept, and some launchers start the store later); None when
        it never does, or the relay is stopped first."""
        import datetime  # lazy: 2.2 ms

        deadline, pause, reason = time.monotonic() + _REACH_S, 0.5, ""
        while not self._stopping.is_set() and time.monotonic() < deadline:
            try:
                # a store that is not there is said quickly (its client would
                # retry, and say so on the job's stderr); once connected, the
                # wait for a command has no end
                store = _client(self.addr, self.port, _CONNECT_S)
                if not hasattr(store, "queue_pop"):
                    reason = "this PyTorch's TCPStore has no queues"
                    break
                store.set_timeout(datetime.timedelta(seconds=_RELAY_WAIT_S))
                store.set(_fingerprint_key(self.job, self.rank), fingerprint(self.key, self.job))
                return store
            except Exception as exc:
                reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            self._stopping.wait(pause)
            pause = min(pause * 2, _REACH_PAUSE_S)
        if reason and not self._stopping.is_set():
            emit(RelayUnavailable(store=f"{self.addr}:{self.port}", reason=reason))
        return None

    def run(self) -> None:
        store = self._connect()
        with self._lock:
            if store is None or self._stopping.is_set():
                return  # no store to reach: this node's sockets still serve
            self._waiting = True
        try:
            self._serve(store)
        finally:
            with self._lock:
                self._waiting = False

    def _serve(self, store: Any) -> None:
        place, queue = f"cmd|{self.job}|{self.rank}", _queue(self.job, self.rank)
        failures = 0
        while not self._stopping.is_set():
            try:
                text = store.queue_pop(queue, True)
                failures = 0
            except Exception:
                failures += 1
                if failures > 5 or _store_gone(store):
                    return  # the job's store went away (the job ends)
                time.sleep(1.0)
                continue
            if self._stopping.is_set():
                return
            try:
                message = self._accept(unseal(self.key, place, text), queue, store)
            except (SealError, ValueError, TypeError):
                dropped(queue, f"not sealed for rank {self.rank} of this job with this "
                               "user's key: forged, altered, another user's, or moved from "
                               "another rank or job")
                continue
            if message is None:
                continue
            if message.get("op") in _ACTING:
                if not self._confirmed(message, queue):
                    continue  # (never run: its sender did not confirm it)
            elif _abandoned(store, message):
                continue
            self._reply(message, _answer(message, self.rank))

    def _outbox(self) -> Any:
        """The relay's second connection, made at the first command and kept
        (its first one waits for commands; a store client made and dropped
        per answer would churn connections)."""
        if self._out is None:
            self._out = _client(self.addr, self.port, _CONNECT_S)
        return self._out

    def _reply(self, message: dict, answer: dict) -> None:
        """Push a sealed answer (or stage: ready, running, dropped) for ``message``."""
        try:
            # (the rank in the clear: which seal the client checks it against)
            self._outbox().queue_push(message["reply"], f"{self.rank} " + seal(
                self.key, f"reply|{self.job}|{self.rank}|{message['id']}", answer))
        except Exception:
            pass

    def _accept(self, message: dict, queue: str, store: Any) -> dict | None:
        """The command, if it is fresh, new, inside its sender's deadline and
        (one that acts) later than every one taken before; else None -- named
        in a ``store.dropped`` event.  A cancel voids the command it names."""
        ident, issued, reply = message.get("id"), message.get("t"), message.get("reply")
        deadline = message.get("deadline")
        if not isinstance(ident, str) or not isinstance(reply, str) or \
                not isinstance(issued, (int, float)) or not isinstance(deadline, (int, float)):
            dropped(queue, "malformed: a sealed command without its id, time or deadline")
            return None
        now = time.time()
        why = ""
        if ident in self._seen:
            why = "replayed: a command taken before"
        elif ident in self._void:
            why = "cancelled by its sender, who gave up waiting (held back in the store?)"
        elif issued > now + _SKEW_S or deadline > issued + _FRESH_S + _SKEW_S:
            why = "issued in the future, or with a deadline too far ahead"
        elif issued < self.started_at - _SKEW_S:
            why = "issued before this rank's relay started (an earlier job's?)"
        elif now > deadline + _SKEW_S or issued < now - _FRESH_S:
            why = "expired: its sender's deadline has passed"
        if why:
            dropped(queue, why)
            return None
        for table in (self._seen, self._void):
            for old in [k for k, t in table.items() if t < now - _FRESH_S - _SKEW_S]:
                del table[old]
        self._seen[ident] = issued
        if message.get("op") == "cancel":
            if isinstance(message.get("cancel"), str):
                self._void[message["cancel"]] = now
            return None
        if message.get("op") in _ACTING:
            seq = message.get("seq")
            if not isinstance(seq, int) or seq <= self._last_seq:
                reason = (f"superseded: command #{seq} came after #{self._last_seq} was "
                          "taken")
                dropped(queue, reason)
                if _waiting_client(store, message):
                    self._reply(message, {"stage": "dropped", "reason": reason})
                return None
            self._last_seq = seq
        return message

    def _confirmed(self, message: dict, queue: str) -> bool:
        """Ask the sender of a command that acts to confirm it, with a fresh
        challenge, and wait for that (``_GO_WAIT_S``): a command whose sender
        has given up -- held back in the store and delivered late, or pushed
        again -- is never confirmed and never runs."""
        gone = ("unconfirmed: its sender no longer waits (it gave up, or the command was "
                "held back in the store); not run")
        try:
            if not _waiting_client(self._outbox(), message):
                dropped(queue, gone)
                return False
        except Exception:
            return False
        challenge = os.urandom(16).hex()
        self._reply(message, {"stage": "ready", "challenge": challenge})
        go, place = _go_key(message["reply"], self.rank), \
            f"go|{self.job}|{self.rank}|{message['id']}"
        end = time.monotonic() + _GO_WAIT_S
        polls = 0
        while time.monotonic() < end and not self._stopping.is_set():
            try:
                out = self._outbox()
                if not out.check([go]):
                    polls += 1
                    if polls % 25 == 0 and not _waiting_client(out, message):
                        dropped(queue, gone)
                        return False
                    time.sleep(0.02)
                    continue
                text = out.get(go)
                out.delete_key(go)
            except Exception:
                return False
            try:
                answer = unseal(self.key, place, text)
            except SealError:
                dropped(go, "not sealed for this command with this user's key: forged or "
                            "moved")
                continue
            if answer.get("go") is False:
                self._void[message["id"]] = time.time()
                dropped(queue, "cancelled by its sender, who gave up waiting")
                return False
            if answer.get("go") is True and answer.get("challenge") == challenge:
                self._reply(message, {"stage": "running"})
                return True
            dropped(go, "replayed: a confirmation of another challenge")
        dropped(queue, f"unconfirmed: its sender did not confirm it within {_GO_WAIT_S:g}s "
                       "(it gave up, or the command was held back in the store); not run")
        return False


#: what a rank only reads for a client: dropped when its client is gone
_READ_ONLY = ("status", "stacks", "report")


def _abandoned(store, message: dict) -> bool:
    """Has the client that sent this read-only ``message`` stopped waiting
    for its answer?  (It is then dropped unanswered: a relay slowed down by
    a busy machine must not fall ever further behind a client that polls.
    A ``send`` is always handed on: one rank of a job-wide decision must not
    drop what the others took.)"""
    if message.get("op") not in _READ_ONLY:
        return False
    live = message.get("live")
    if not isinstance(live, str) or not live.startswith(_PREFIX):
        return False
    try:
        return not store.check([live])
    except Exception:
        return False


def _waiting_client(store, message: dict) -> bool:
    """Is the client of ``message`` still waiting for its answer?"""
    live = message.get("live")
    try:
        return isinstance(live, str) and live.startswith(_PREFIX) and bool(store.check([live]))
    except Exception:
        return False


def _store_gone(store) -> bool:
    try:
        store.check(["daifu/alive"])
        return False
    except Exception:
        return True


def _answer(message: dict, rank: int) -> dict:
    """What the rank answers to one command (never raises)."""

    op = message.get("op")
    me = {"rank": rank, "pid": os.getpid(), "host": socket.gethostname()}
    try:
        if op == "stacks":
            return {"ok": True, **me, **stacks()}
        if op == "status":
            try:
                status = request(os.getpid(), {"op": "status"}, timeout=3.0)
            except (EndpointError, OSError):
                return {"ok": True, **me, **_running()}
            return {**status, **me, "state": "waiting"}
        if op == "report":
            return _report()
        if op == "send" and isinstance(message.get("cmd"), str):
            try:
                return request(os.getpid(), {"op": "send", "cmd": message["cmd"],
                                             "scope": "job" if message.get("scope") == "job"
                                             else "rank",
                                             "origin": str(message.get("origin") or "store")})
            except (EndpointError, OSError):
                return {"ok": False, "error": f"rank {rank} does not wait on a crash"}
        return {"ok": False, "error": f"unknown request {op!r}"}
    except Exception as exc:  # a client's problem must never reach the job
        return {"ok": False, "error": f"rank {rank}: {type(exc).__name__}: {exc}"}


def _running() -> dict:
    return {"state": "running", "argv": sys.argv[:], "cwd": os.getcwd(),
            "started": _STARTED, **distributed()}


_STARTED = time.time()


def _report() -> dict:
    try:
        session = Session(os.getpid())
    except (EndpointError, OSError):
        return {"ok": False, "error": "this rank does not wait on a crash"}
    try:
        return session.open()
    finally:
        session.close()


def stacks(limit: int = 12) -> dict:
    """This process's threads' Python stacks (innermost last, as tracebacks
    print them) and its last collectives (PyTorch's flight recorder)."""
    import traceback  # lazy: 4.2 ms

    names = {t.ident: t.name for t in threading.enumerate()}
    main = threading.main_thread().ident
    threads: list[dict[str, Any]] = []
    for ident, frame in sys._current_frames().items():
        if names.get(ident) == "daifu-relay":
            continue
        threads.append({"thread": names.get(ident, f"{ident:#x}"), "main": ident == main,
                        "frames": [(f.filename, f.lineno, f.name, f.line or "")
                                   for f in traceback.extract_stack(frame)
                                   if not is_plumbing(f.filename)]})
    threads.sort(key=lambda t: not t["main"])
    out: dict[str, Any] = {"threads": threads, "collectives": collectives(limit)}
    frames = threads[0]["frames"] if threads and threads[0]["main"] else []
    if frames:
        def name(f: tuple) -> str:
            return f"{f[0]}:{f[1]} in {f[2]}" + (f" ({f[3]})" if f[3] else "")

        out["innermost"] = name(frames[-1])
        own = [f for f in frames if not _installed(f[0])]
        out["at"] = name(own[-1]) if own else out["innermost"]
    return out


def flight_recorder_off() -> bool:
    """PyTorch's flight recorder keeps each rank's recent collectives (2000 by
    default); the user can turn it off with ``TORCH_FR_BUFFER_SIZE=0``."""
    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        value = os.environ.get(name)
        if value is not None:
            try:
                return int(value) <= 0
            except ValueError:
                return False
    return False


def collectives(limit: int = 12) -> list[dict] | None:
    """The last ``limit`` collectives of each process group, as PyTorch's
    flight recorder has them (None when it is off or unavailable)."""
    if flight_recorder_off():
        return None
    try:
        import pickle  # lazy: 2.1 ms

        import torch  # lazy: 1.4 s

        dump = pickle.loads(torch._C._distributed_c10d._dump_fr_trace())  # type: ignore
    except Exception:
        return None
    out = []
    for e in dump.get("entries") or []:
        frames = e.get("frames") or []
        user = next((f for f in frames if "torch/" not in str(f.get("filename", ""))
                     .replace("\\", "/")), frames[0] if frames else {})
        pg = e.get("process_group")
        out.append({"pg": str(pg[0] if isinstance(pg, (list, tuple)) and pg else pg),
                    "seq": int(e.get("collective_seq_id") or 0),
                    "name": str(e.get("profiling_name") or "").split(":")[-1],
                    "sizes": e.get("input_sizes"), "record": int(e.get("record_id") or 0),
                    "where": f"{user.get('filename', '?')}:{user.get('line', '?')} in "
                             f"{user.get('name', '?')}" if user else "?"})
    out.sort(key=lambda c: c["record"])
    by_pg: dict[str, list[dict]] = {}
    for c in out:
        by_pg.setdefault(c["pg"], []).append(c)
    return [c for group in by_pg.values() for c in group[-limit:]]


@state_record
class _Relayed:
    """This rank's relay (``RUNTIME.parts``)."""

    #: the relay ``start_relay`` started (once per process), or None
    relay: Relay | None = None


_state = RUNTIME.part(__name__, _Relayed())


def start_relay() -> None:
    """Start this rank's relay (once; never raises): when the job has a store
    address, a rank and a key, and ``DAIFU_STORE_RELAY`` is not 0.  A key
    that cannot be had (missing where ``DAIFU_JOB_KEY_FILE`` points, others
    can read it, too short) is said here, as the rank starts
    (``relay.unavailable``), not first when someone sends it a command."""
    if _state.relay is not None or not enabled():
        return

    where: dict = {}
    try:
        where = job_file_info()
        if "store" not in where or "job" not in where or "rank" not in where:
            return
        addr, _, port = where["store"].rpartition(":")
        relay = Relay(where["job"], addr, int(port), int(where["rank"]), load_key(create=True))
    except SealError as exc:  # (this node's sockets still serve)
        emit(RelayUnavailable(store=str(where.get("store")), reason=(
            f"{exc} -- rank {where.get('rank')} is reached on this machine only, and its "
            "decisions for all ranks are refused")))
        return
    except ValueError:
        return
    _state.relay = relay
    relay.start()
    try:  # stopped when the main thread ends, before anything is finalized (see stop)
        threading._register_atexit(relay.stop)  # type: ignore[attr-defined]
    except (AttributeError, RuntimeError):
        pass  # (the interpreter is already shutting down)


# -- the clients' side ------------------------------------------------------------------


class StoreError(Exception):
    """The job's store cannot be used to reach its ranks (one line saying why)."""


class Channel:
    """A client of one job's ranks through its store."""

    def __init__(self, job: str, addr: str, port: int, world: int, timeout_s: float = 5.0):
        try:
            self.key = load_key(create=False)
        except SealError as exc:
            raise StoreError(str(exc)) from None
        try:
            self.store = _client(addr, port, timeout_s)
        except Exception as exc:
            raise StoreError(f"cannot reach the job's store at {addr}:{port}: "
                             f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
                             ) from None
        self.job, self.world = job, world

    @classmethod
    def for_job(cls, info: dict) -> Channel:
        """The channel of the job a job file or status describes; raises
        ``StoreError`` saying why there is none."""
        if not enabled():
            raise StoreError(f"{RELAY_ENV}=0")
        store = info.get("store")
        if "job" not in info or not info.get("world_size") or not isinstance(store, str) \
                or ":" not in store:
            raise StoreError("the job has no store address (MASTER_ADDR, MASTER_PORT)")
        addr, _, port = store.rpartition(":")
        try:
            return cls(info["job"], addr, int(port), int(info["world_size"]))
        except ValueError:
            raise StoreError(f"not a store address: {store!r}") from None

    def other_keys(self) -> list[int]:
        """Ranks whose relay holds another key than this client (their commands
        would be dropped): another node's home with its own key file."""
        mine = fingerprint(self.key, self.job)
        out = []
        for rank in range(self.world):
            name = _fingerprint_key(self.job, rank)
            try:
                if self.store.check([name]) and self.store.get(name).decode() != mine:
                    out.append(rank)
            except Exception:
                continue
        return out

    def ask(self, ranks: list[int] | None, message: dict, timeout: float) -> dict[int, dict]:
        """Send ``message`` to ``ranks`` (None: every rank); their answers by
        rank, as they come, within ``timeout`` (missing: no answer)."""
        import uuid  # lazy: 4.0 ms

        targets = list(range(self.world)) if ranks is None else list(ranks)
        reply_queue = f"{_PREFIX}{self.job}/r/{uuid.uuid4().hex}"
        live = f"{reply_queue}/live"  # there while this client waits (``_abandoned``)
        self.store.set(live, b"1")
        try:
            return self._ask(targets, message, timeout, reply_queue, live)
        finally:  # (also on Ctrl-C: the relays stop answering a client that left)
            for name in (live, reply_queue):
                try:
                    self.store.delete_key(name)
                except Exception:
                    pass

    def _ask(self, targets: list[int], message: dict, timeout: float, reply_queue: str,
             live: str) -> dict[int, dict]:
        import uuid  # lazy: 4.0 ms

        acting = message.get("op") in _ACTING
        idents: dict[int, str] = {}
        issued = time.time()
        # (the deadline to take it: the whole wait, at most how long a command is valid)
        take = min(timeout, _FRESH_S)
        for rank in targets:
            ident = idents[rank] = uuid.uuid4().hex
            payload = {**message, "id": ident, "t": issued, "deadline": issued + take,
                       "reply": reply_queue, "live": live,
                       "origin": message.get("origin") or
                       f"store:{socket.gethostname()}:pid{os.getpid()}"}
            if acting:
                payload["seq"] = int(self.store.add(_seq_key(self.job, rank), 1))
            self.store.queue_push(_queue(self.job, rank),
                                  seal(self.key, f"cmd|{self.job}|{rank}", payload))
        answers: dict[int, dict] = {}
        confirmed: set[int] = set()  # the ranks told to run it (``Relay._confirmed``)
        running: set[int] = set()
        deadline = time.monotonic() + timeout
        take_by = time.monotonic() + take
        while len(answers) < len(targets) and time.monotonic() < deadline:
            try:
                waiting = self.store.queue_len(reply_queue)
            except Exception:
                break
            if not waiting:
                time.sleep(0.05)
                continue
            head, _, text = self.store.queue_pop(reply_queue, False).decode().partition(" ")
            rank = int(head) if head.isdigit() else -1
            if rank not in idents or rank in answers:
                continue
            try:
                answer = unseal(self.key, f"reply|{self.job}|{rank}|{idents[rank]}", text)
            except SealError:
                continue  # not the rank's answer: someone else's writing
            stage = answer.get("stage")
            if stage == "ready":
                challenge = answer.get("challenge")
                if acting and rank not in confirmed and isinstance(challenge, str) and \
                        time.monotonic() < take_by:
                    self.store.set(_go_key(reply_queue, rank), seal(
                        self.key, f"go|{self.job}|{rank}|{idents[rank]}",
                        {"go": True, "challenge": challenge}))
                    confirmed.add(rank)
            elif stage == "running":
                running.add(rank)
            elif stage == "dropped":
                answers[rank] = {"ok": False, "delivered": False,
                                 "error": f"not delivered ({answer.get('reason')}); it will "
                                          "never run"}
            else:
                answers[rank] = {**answer, "delivered": True} if acting else answer
        if acting:
            for rank in targets:
                if rank in answers:
                    continue
                if rank in confirmed:
                    state = "runs it" if rank in running else "was told to run it"
                    answers[rank] = {
                        "ok": False, "delivered": True, "error":
                        f"delivered: rank {rank} {state}, but its answer did not come within "
                        f"{timeout:g}s -- it may have been applied (see python -m daifu ps)"}
                    continue
                self._cancel(rank, idents[rank], reply_queue)
                answers[rank] = {
                    "ok": False, "delivered": False, "error":
                    f"not delivered: rank {rank} did not take it within {take:g}s (it is "
                    "busy, gone, or someone holds the job's store up); cancelled, it will "
                    "never run"}
        return answers

    def _cancel(self, rank: int, ident: str, reply_queue: str) -> None:
        """Void a command this client gave up on: a sealed ``go: false`` where
        the rank would wait for the confirmation, and a sealed cancel in its
        queue (the command could not run without the confirmation anyway)."""
        import uuid  # lazy: 4.0 ms

        now = time.time()
        try:
            self.store.set(_go_key(reply_queue, rank), seal(
                self.key, f"go|{self.job}|{rank}|{ident}", {"go": False}))
            self.store.queue_push(_queue(self.job, rank), seal(
                self.key, f"cmd|{self.job}|{rank}",
                {"op": "cancel", "cancel": ident, "id": uuid.uuid4().hex, "t": now,
                 "deadline": now + _FRESH_S, "reply": "", "live": ""}))
        except Exception:
            pass


class JobRanks:
    """The ranks of one distributed job, reached the best way there is:
    through the job's store when it has one (every rank, on every node),
    else through this machine's control sockets (the ranks here).  Answers
    are by rank."""

    def __init__(self, info: dict):
        self.job = str(info.get("job"))
        self.world = int(info.get("world_size") or 0)
        self.channel: Channel | None = None
        #: why the ranks are reached on this machine only
        self.local_only = ""
        try:
            self.channel = Channel.for_job(info)
        except StoreError as exc:
            self.local_only = str(exc)

    @property
    def everywhere(self) -> bool:
        """Are the ranks on other nodes reached too?"""
        return self.channel is not None

    def statuses(self, timeout: float = 5.0) -> dict[int, dict]:
        """Every rank's status that answers: ``state`` "waiting" (with where it
        crashed) or "running"."""
        if self.channel is not None:
            return self.channel.ask(None, {"op": "status"}, timeout)

        out: dict[int, dict] = {}
        for job in running_jobs():
            if job.get("job") == self.job and "rank" in job:
                out[int(job["rank"])] = {**job, "state": "running",
                                         "host": socket.gethostname()}
        for job in list_jobs():
            if job.get("job") == self.job and "rank" in job:
                out[int(job["rank"])] = {**job, "state": "waiting",
                                         "host": socket.gethostname()}
        return out

    def send(self, ranks: list[dict], text: str, scope: str = "job",
             timeout: float | None = None) -> dict[int, dict]:
        """``text`` to the waiting ``ranks`` (their statuses) at once."""

        if self.channel is not None:
            return self.channel.ask([int(r["rank"]) for r in ranks],
                                    {"op": "send", "cmd": text, "scope": scope},
                                    SEND_TIMEOUT_S if timeout is None else timeout)
        if scope == "rank":  # (one rank's own decision: no agreement)
            return {int(r["rank"]): _local_send(int(r["pid"]), text) for r in ranks}
        by_pid = send_to_ranks(ranks, text)
        return {int(r["rank"]): by_pid.get(r["pid"], {}) for r in ranks}

    def session(self, status: dict):
        """A console session with one waiting rank (``open``, ``command``, ``close``)."""
        if self.channel is not None:
            return _StoreSession(self.channel, int(status["rank"]))

        return Session(int(status["pid"]))

    def stacks(self, timeout: float = 5.0) -> dict[int, dict]:
        """Every answering rank's threads' stacks and last collectives (the
        store only: on this machine alone, ``stacks`` reads faulthandler)."""
        if self.channel is None:
            return {}
        return self.channel.ask(None, {"op": "stacks"}, timeout)

    def unanswered(self, answers: dict[int, dict]) -> str:
        """Why the ranks missing from ``answers`` did not answer, in one line."""
        missing = [r for r in range(self.world) if r not in answers]
        if not missing:
            return ""
        names = ", ".join(map(str, missing))
        if self.channel is None:
            return (f"rank{'s' if len(missing) > 1 else ''} {names}: not on this machine (ranks "
                    f"elsewhere are reached through the job's store; here: {self.local_only})")
        keys = self.channel.other_keys()
        other = [r for r in missing if r in keys]
        if other:
            return (f"rank{'s' if len(other) > 1 else ''} {', '.join(map(str, other))} "
                    f"hold{'s' if len(other) == 1 else ''} another daifu key (their nodes "
                    f"read another {KEY_HINT}); the others did not answer")
        return (f"rank{'s' if len(missing) > 1 else ''} {names} did not answer (not started "
                f"yet, ended, busy holding the interpreter in C, or started with "
                f"{RELAY_ENV}=0)")


def _local_send(pid: int, text: str) -> dict:
    try:
        return request(pid, {"op": "send", "cmd": text})
    except (EndpointError, OSError) as exc:
        return {"ok": False, "error": str(exc)}


#: where a user makes every node use the same key
KEY_HINT = "key file: point DAIFU_JOB_KEY_FILE at one file every node reads"


class _StoreSession:
    """``rank N`` with a rank on another node: one command at a time."""

    def __init__(self, channel: Channel, rank: int):
        self.channel, self.rank = channel, rank

    def _one(self, message: dict, timeout: float) -> dict:
        answer = self.channel.ask([self.rank], message, timeout).get(self.rank)
        return answer or {"ok": False, "error": f"rank {self.rank} did not answer within "
                                                f"{timeout:g}s"}

    def open(self) -> dict:
        return self._one({"op": "report"}, 30.0)

    def command(self, text: str) -> dict:
        return self._one({"op": "send", "cmd": text, "scope": "rank"}, SEND_TIMEOUT_S)

    def close(self) -> None:
        pass


def place(status: dict) -> str:
    """Where a rank runs: its pid, and its host when that is not this one."""
    host = status.get("host")
    return f"pid {status.get('pid')}" + (f" on {host}" if host and host !=
                                          socket.gethostname() else "")
