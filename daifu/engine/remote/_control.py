"""Remote attach: a per-process control endpoint while a crash waits.

Security: anything that accepts patches executes code, so the endpoint is a
Unix domain socket (never a network port) at ``<runtime dir>/<pid>.sock``:
the runtime directory must be owned by this user with mode 0700 (daifu
refuses to use it otherwise), the socket is 0600, and every connection's peer
credentials (``SO_PEERCRED``) must carry this process's user id.

Protocol: newline-delimited JSON.  A client sends one request
``{"op": "status"}``, ``{"op": "send", "cmd": "..."}`` or ``{"op": "attach"}``
(then ``{"cmd": "..."}`` per command); the job answers ``{"ok": ..., ...}``.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
import threading
import time
from collections.abc import Iterator
from queue import Queue
from typing import Any

from ..._record import field, record
from ._rundir import (  # noqa: F401 - re-exported: where sockets live
    RUNTIME_ENV,
    EndpointError,
    _alive,
    check_private,
    runtime_dir,
    runtime_dirs,
)


def _read_request(conn: socket.socket, timeout: float = 1.0) -> None:
    """Read (and drop) a client's first line, waiting at most ``timeout``."""
    conn.settimeout(timeout)
    received = 0
    try:
        while received < 65536:
            chunk = conn.recv(4096)
            if not chunk or b"\n" in chunk:
                return
            received += len(chunk)
    except OSError:
        return


def peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid


def peer_pid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[0]


def _send(conn: socket.socket, message: dict) -> None:
    conn.sendall((json.dumps(message) + "\n").encode())


#: the longest request line a job reads (a reload's sources arrive from disk,
#: not over the socket; code sent with exec is small)
MAX_LINE = 1 << 20
#: connections served at once; more are answered "busy" and closed
MAX_CONNECTIONS = 8
#: how long a client may take to send its first request
FIRST_REQUEST_S = 10.0


class ProtocolError(Exception):
    """A client sent something that is not a request (one line saying why)."""


def _decode(line: bytes) -> dict:
    try:
        message = json.loads(line)
    except (ValueError, RecursionError):
        raise ProtocolError("not a JSON line") from None
    if not isinstance(message, dict):
        raise ProtocolError(f"a request is a JSON object, not {type(message).__name__}")
    return message


def _lines(conn: socket.socket, limit: int = MAX_LINE) -> Iterator[dict]:
    """The JSON objects a peer sends, one per line.  ``ProtocolError`` for a
    line that is not one or longer than ``limit`` (read in linear time)."""
    buf = bytearray()
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            return
        start = len(buf)
        buf += chunk
        end = buf.find(b"\n", start)
        while end != -1:
            line = bytes(buf[:end])
            del buf[:end + 1]
            if line.strip():
                yield _decode(line)
            end = buf.find(b"\n")
        if len(buf) > limit:
            raise ProtocolError(f"a request line longer than {limit} bytes")


@record
class Request:
    """A command from a client, executed by the waiting thread."""

    text: str
    origin: str
    #: "rank" or "job": a decision for every rank of a distributed job (``send --job``)
    scope: str = "rank"
    done: threading.Event = field(default_factory=threading.Event)
    #: set once the reply was written to the client (the job may exit right
    #: after resuming: the client must still hear that it resumed)
    sent: threading.Event = field(default_factory=threading.Event)
    reply: dict[str, Any] = field(default_factory=dict)


class ControlServer:
    """Accepts clients while a crash waits; commands go to ``requests``."""

    def __init__(self, status: dict[str, Any], report: str, console_is_local: bool):
        self.status = status
        self.report = report
        self.local = console_is_local
        self.requests: Queue[Request] = Queue()
        self.path = ""
        self._sock: socket.socket | None = None
        self._closed = threading.Event()

    def start(self) -> str:
        # The socket is bound and listening under a name no client looks
        # for, then renamed into place: a client that sees ``PID.sock``
        # connects (a bound socket not yet listening refuses the connection).
        directory = runtime_dir()
        self.path = os.path.join(directory, f"{os.getpid()}.sock")
        staged = self.path + ".new"
        for stale in (self.path, staged):
            try:
                os.unlink(stale)
            except FileNotFoundError:
                pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)
        try:
            with unix_address(staged) as where:
                sock.bind(where)
        finally:
            os.umask(old_umask)
        os.chmod(staged, 0o600)
        sock.listen(64)
        os.rename(staged, self.path)
        self._sock = sock
        threading.Thread(target=self._accept, name="daifu-control", daemon=True).start()
        return self.path

    def stop(self) -> None:
        # the name goes first: a client then finds no endpoint rather than
        # one that refuses it
        self._closed.set()
        try:
            os.unlink(self.path)
        except OSError:
            pass
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass

    def _accept(self) -> None:
        sock = self._sock
        assert sock is not None  # (started)
        slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        while not self._closed.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            if not slots.acquire(blocking=False):
                _refuse(conn, "too many connections to this job; try again")
                continue
            threading.Thread(target=self._serve_one, args=(conn, slots), daemon=True,
                             name="daifu-control-client").start()

    def _serve_one(self, conn: socket.socket, slots: threading.BoundedSemaphore) -> None:
        try:
            with conn:
                self._serve(conn)
        except Exception:  # a client's problem must never show up in the job's output
            pass
        finally:
            slots.release()

    def _serve(self, conn: socket.socket) -> None:
        uid = peer_uid(conn)
        if uid != os.getuid():
            _read_request(conn)  # answering before the client sent would break its pipe
            _send(conn, {"ok": False, "error": f"permission denied: peer uid {uid} is not "
                         f"the job's uid {os.getuid()}"})
            return
        origin = f"attach:pid{peer_pid(conn)}"
        conn.settimeout(FIRST_REQUEST_S)
        try:
            for message in _lines(conn):
                conn.settimeout(None)  # an attached human may think for a while
                if not self._handle(conn, message, origin):
                    return
        except ProtocolError as exc:
            _send(conn, {"ok": False, "error": f"malformed request: {exc}"})
        except (OSError, ValueError):
            return

    def _handle(self, conn: socket.socket, message: dict, origin: str) -> bool:
        """Answer one request; False when the connection is done."""
        op = message.get("op")
        if origin == f"attach:pid{os.getpid()}" and isinstance(message.get("origin"), str):
            origin = message["origin"]  # the relay (``_jobstore``): who sent it through the store
        if op == "status":
            _send(conn, {"ok": True, **self.status,
                         "waiting_s": round(time.time() - self.status["since"], 1)})
            return False
        if self.local and op in ("send", "attach", None):
            _send(conn, {"ok": False, "error": "a console is active in the job's own "
                         "terminal; use it there"})
            return False
        if op == "attach":
            _send(conn, {"ok": True, "report": self.report})
            return True
        command = message.get("cmd")
        if not isinstance(command, str) or op not in ("send", None):
            _send(conn, {"ok": False, "error": f"malformed request: {message!r:.200}"})
            return op is None
        if self._closed.is_set():
            _send(conn, {"ok": False, "error": "the crash is no longer waiting"})
            return False
        request = Request(command, origin, "job" if message.get("scope") == "job" else "rank")
        self.requests.put(request)
        while not request.done.wait(0.2):
            if self._closed.is_set():
                request.reply = {"ok": False, "error": "the crash stopped waiting"}
                break
        try:
            _send(conn, request.reply)
        finally:
            request.sent.set()
        return not (op == "send" or request.reply.get("resumed"))


def _refuse(conn: socket.socket, error: str) -> None:
    """Answer and close at once (the accepting thread must not wait on anyone)."""
    try:
        with conn:
            conn.setblocking(False)
            try:
                conn.recv(65536)  # what the client already sent (so the close is clean)
            except OSError:
                pass
            conn.setblocking(True)
            conn.settimeout(0.5)
            _send(conn, {"ok": False, "error": error})
    except OSError:
        pass


#: the longest path an AF_UNIX address holds (``sun_path``: 108 bytes with its NUL)
_SUN_PATH_MAX = 107


@contextlib.contextmanager
def unix_address(path: str) -> Iterator[str]:
    """``path`` as ``bind``/``connect`` take it.  A socket path longer than
    an AF_UNIX address holds (a runtime directory deep in a project or a
    test's temporary directory) is reached through a descriptor of its
    directory, ``/proc/self/fd/N/<name>`` on Linux: the socket is made in
    that directory all the same, with its permissions.  (Refused, the job
    could not wait for a fix: ``AF_UNIX path too long``.)"""
    if len(os.fsencode(path)) <= _SUN_PATH_MAX or not os.path.isdir("/proc/self/fd"):
        yield path
        return
    fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}/{os.path.basename(path)}"
    finally:
        os.close(fd)


# -- clients ---------------------------------------------------------------------------


def _socket_path(pid: int) -> str:
    dirs = runtime_dirs()
    for directory in dirs:
        path = os.path.join(directory, f"{pid}.sock")
        if os.path.exists(path):
            return path
    where = " or ".join(dirs) or "any private runtime directory"
    raise EndpointError(f"no daifu job with pid {pid} is waiting on a crash "
                        f"(no {pid}.sock in {where})")


def _connect(pid: int, timeout: float = 5.0) -> socket.socket:
    path = _socket_path(pid)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(timeout)
    try:
        with unix_address(path) as where:
            conn.connect(where)
    except OSError as exc:
        conn.close()
        raise EndpointError(f"cannot connect to job {pid}: {exc}") from None
    return conn


#: how long ``send`` waits for the job to answer (a reload may take a while)
SEND_TIMEOUT_S = float(os.environ.get("DAIFU_SEND_TIMEOUT", "120"))


def request(pid: int, message: dict, timeout: float = SEND_TIMEOUT_S) -> dict:
    with _connect(pid) as conn:
        conn.settimeout(timeout)
        _send(conn, message)
        try:
            for reply in _lines(conn):
                return reply
        except TimeoutError:
            raise EndpointError(f"job {pid} did not answer within {timeout:g}s "
                                "(DAIFU_SEND_TIMEOUT)") from None
        except ProtocolError as exc:
            raise EndpointError(f"job {pid} answered something else: {exc}") from None
    raise EndpointError(f"job {pid} closed the connection without answering")


def list_jobs() -> list[dict]:
    """Status of every job of this user that waits on a crash."""
    jobs = []
    for directory in runtime_dirs():
        jobs += _jobs_in(directory)
    return jobs


def _jobs_in(directory: str) -> list[dict]:
    jobs = []
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".sock") or not name[:-5].isdigit():
            continue
        pid = int(name[:-5])
        try:
            status = request(pid, {"op": "status"}, timeout=3.0)
        except (EndpointError, OSError):
            if not _alive(pid):  # a stale socket left by a killed job
                try:
                    os.unlink(os.path.join(directory, name))
                except OSError:
                    pass
            continue
        if status.get("ok"):
            jobs.append({"pid": pid, **status})
    return jobs


def send_to_ranks(ranks: list[dict], text: str) -> dict[int, dict]:
    """The same command to every rank at once, as a decision for all of them
    (each rank holds its answer until every rank has agreed)."""
    replies: dict[int, dict] = {}

    def one(job: dict) -> None:
        try:
            replies[job["pid"]] = request(job["pid"], {"op": "send", "cmd": text,
                                                       "scope": "job"})
        except (EndpointError, OSError) as exc:
            replies[job["pid"]] = {"ok": False, "error": str(exc)}

    threads = [threading.Thread(target=one, args=(job,), daemon=True) for job in ranks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return replies


class Session:
    """An attached console (``python -m daifu attach PID``)."""

    def __init__(self, pid: int):
        self.pid = pid
        self.conn = _connect(pid)
        self._messages = _lines(self.conn)

    def open(self) -> dict:
        self.conn.settimeout(30.0)  # a job that is alive answers at once
        _send(self.conn, {"op": "attach"})
        try:
            hello = next(self._messages, {"ok": False, "error": "no answer"})
        except TimeoutError:
            raise EndpointError(f"job {self.pid} did not answer within 30s") from None
        self.conn.settimeout(None)  # then each command takes as long as it takes
        return hello

    def command(self, text: str) -> dict:
        _send(self.conn, {"cmd": text})
        return next(self._messages, {"ok": False, "error": "the job closed the connection"})

    def close(self) -> None:
        self.conn.close()
