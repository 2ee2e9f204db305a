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

import json
import os
import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from queue import Queue
from typing import Any

from .._private import check_private as _check_private

RUNTIME_ENV = "DAIFU_RUNTIME_DIR"


class EndpointError(Exception):
    """The control endpoint cannot be opened safely."""


def runtime_dir(create: bool = True) -> str:
    """This user's private directory for control sockets."""
    path = os.environ.get(RUNTIME_ENV)
    if not path:
        xdg = os.environ.get("XDG_RUNTIME_DIR")
        if xdg and os.path.isdir(xdg) and os.stat(xdg).st_uid == os.getuid():
            path = os.path.join(xdg, "daifu")
        else:
            path = os.path.join("/tmp", f"daifu-{os.getuid()}")
    if create:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
    check_private(path)
    return path


def check_private(path: str) -> None:
    """Refuse a directory that another user could write or read."""
    _check_private(path, "control sockets", EndpointError)


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


def _lines(conn: socket.socket) -> Iterator[dict]:
    buf = b""
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            return
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line.strip():
                try:
                    yield json.loads(line)
                except ValueError:
                    yield {"op": "malformed", "raw": line[:200].decode(errors="replace")}


@dataclass
class Request:
    """A command from a client, executed by the waiting thread."""

    text: str
    origin: str
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
        directory = runtime_dir()
        self.path = os.path.join(directory, f"{os.getpid()}.sock")
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)
        try:
            sock.bind(self.path)
        finally:
            os.umask(old_umask)
        os.chmod(self.path, 0o600)
        sock.listen(8)
        self._sock = sock
        threading.Thread(target=self._accept, name="daifu-control", daemon=True).start()
        return self.path

    def stop(self) -> None:
        self._closed.set()
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
        try:
            os.unlink(self.path)
        except OSError:
            pass

    def _accept(self) -> None:
        sock = self._sock
        assert sock is not None  # (started)
        while not self._closed.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                uid = peer_uid(conn)
                if uid != os.getuid():
                    _read_request(conn)  # answering before the client sent would break its pipe
                    _send(conn, {"ok": False, "error": f"permission denied: peer uid {uid} is not "
                                 f"the job's uid {os.getuid()}"})
                    return
                origin = f"attach:pid{peer_pid(conn)}"
                for message in _lines(conn):
                    op = message.get("op")
                    if op == "status":
                        _send(conn, {"ok": True, **self.status,
                                     "waiting_s": round(time.time() - self.status["since"], 1)})
                        return
                    if self.local and op in ("send", "attach", None):
                        _send(conn, {"ok": False, "error": "a console is active in the job's own "
                                     "terminal; use it there"})
                        return
                    if op == "attach":
                        _send(conn, {"ok": True, "report": self.report})
                        continue
                    command = message.get("cmd")
                    if not isinstance(command, str) or op not in ("send", None):
                        _send(conn, {"ok": False, "error": f"malformed request: {message!r:.200}"})
                        if op == "send" or op == "malformed":
                            return
                        continue
                    if self._closed.is_set():
                        _send(conn, {"ok": False, "error": "the crash is no longer waiting"})
                        return
                    request = Request(command, origin)
                    self.requests.put(request)
                    while not request.done.wait(0.2):
                        if self._closed.is_set():
                            request.reply = {"ok": False, "error": "the crash stopped waiting"}
                            break
                    try:
                        _send(conn, request.reply)
                    finally:
                        request.sent.set()
                    if op == "send" or request.reply.get("resumed"):
                        return
            except (OSError, ValueError):
                return


# -- clients ---------------------------------------------------------------------------


def _connect(pid: int, timeout: float = 5.0) -> socket.socket:
    directory = runtime_dir(create=False)
    path = os.path.join(directory, f"{pid}.sock")
    if not os.path.exists(path):
        raise EndpointError(f"no daifu job with pid {pid} is waiting on a crash "
                            f"(no socket {path})")
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(timeout)
    try:
        conn.connect(path)
    except OSError as exc:
        conn.close()
        raise EndpointError(f"cannot connect to job {pid}: {exc}") from None
    return conn


def request(pid: int, message: dict, timeout: float = 600.0) -> dict:
    with _connect(pid) as conn:
        conn.settimeout(timeout)
        _send(conn, message)
        for reply in _lines(conn):
            return reply
    raise EndpointError(f"job {pid} closed the connection without answering")


def list_jobs() -> list[dict]:
    """Status of every job of this user that waits on a crash."""
    try:
        directory = runtime_dir(create=False)
    except EndpointError as exc:
        if "does not exist" in str(exc):
            return []
        raise
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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Session:
    """An attached console (``python -m daifu attach PID``)."""

    def __init__(self, pid: int):
        self.conn = _connect(pid)
        self.conn.settimeout(None)
        self._messages = _lines(self.conn)

    def open(self) -> dict:
        _send(self.conn, {"op": "attach"})
        return next(self._messages, {"ok": False, "error": "no answer"})

    def command(self, text: str) -> dict:
        _send(self.conn, {"cmd": text})
        return next(self._messages, {"ok": False, "error": "the job closed the connection"})

    def close(self) -> None:
        self.conn.close()
