"""Waiting for a human at a crash.

With a terminal (stdin is a TTY) the console runs there.  Without one, the
job opens its control endpoint and waits for ``python -m daifu attach/send``
from another terminal -- at most ``--wait`` seconds without a command, then
it gives up exactly as without daifu.  SIGTERM while waiting gives up too.
"""

from __future__ import annotations

import fcntl
import os
import signal
import sys
import threading
import time

from .._crash import exception_text
from .._decision import ABORT, PASSED_ON, Decision
from .._events import (
    CrashReport,
    CrashWaiting,
    InternalError,
    NotifyFailed,
    NotifySent,
    emit,
    logs_to_terminal,
    tell,
)
from .._job import distributed
from .._queue import DecisionPatch

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)

if TYPE_CHECKING:
    from .._crash import Crash
    from .._engine import Engine
    from ..remote._control import ControlServer

# The report, console and control endpoint (cmd, socket, json, ...) are
# imported when a crash first waits for a human, not at start-up.


class _Terminated(BaseException):
    pass


#: ``Waiter._serve``: this rank took the job's console over
_TAKEN = "took the job's console"


class JobConsole:
    """Who owns the shared terminal of a distributed job: a lock file per job
    in the private runtime directory (``flock``: released when its holder
    exits, however it exits)."""

    def __init__(self) -> None:
        from ..remote._rundir import runtime_dir  # lazy: 1.9 ms

        job = str(distributed().get("job") or "job").replace("/", "_")
        self.path = os.path.join(runtime_dir(), f"console-{job}.lock")
        self._fd: int | None = None

    def take(self) -> bool:
        if self._fd is not None:
            return True
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{distributed().get('rank', '?')} {os.getpid()}\n".encode())
        self._fd = fd
        return True

    def holder(self) -> str:
        try:
            with open(self.path) as fh:
                return fh.read().split()[0]
        except (OSError, IndexError):
            return "?"

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None


class Waiter:
    """An interactive patch source (``Engine.waiters``)."""

    def __init__(self, console: bool, wait: float | None, notify: str | None = None):
        self.console = console
        self.wait_s = wait  # None: forever; 0: do not wait without a console
        self.notify = notify  # a shell command run when a crash starts waiting
        # one human at a time: a crash in another thread waits its turn (no
        # engine-wide lock is held, so rules in other threads go on meanwhile)
        self._lock = threading.Lock()

    def wait(self, crash: Crash, engine: Engine) -> str | None:
        if not self.console and self.wait_s == 0:
            return None
        with self._lock:
            return self._wait(crash, engine)

    def _wait(self, crash: Crash, engine: Engine) -> str | None:
        from ._report import build as build_report  # lazy: 16.4 ms

        report = build_report(crash)
        event = CrashReport(where=crash.where, title=report.title, statement=report.statement,
                            traceback="".join(report.traceback), variables=report.variables,
                            done_before=report.done_before, options=report.options)
        # (on the job's terminal the console shows the report itself: the log
        # line with all of it is for log files)
        (tell if self.console and logs_to_terminal() else emit)(event)
        status = {"pid": os.getpid(), "where": crash.where, "function": crash.function,
                  "statement": crash.statement, "exc_type": type(crash.exception).__qualname__,
                  "message": exception_text(crash.exception, 200), "since": time.time(),
                  "argv": sys.argv[:], "console": self.console, **distributed()}
        owner = None
        if self.console and distributed():
            # one console per job: the first crashed rank owns the shared
            # terminal; the others wait (its `ranks` lists them) and take the
            # terminal over, in turn, once it is free
            owner = JobConsole()
            if not owner.take():
                waited = self._remote(crash, engine, {**status, "console": False}, report,
                                      owner)
                if waited != _TAKEN:
                    return waited
        if self.console:
            try:
                return self._console(crash, engine, status, report)
            finally:
                if owner is not None:
                    owner.release()
        return self._remote(crash, engine, status, report)

    def _remote(self, crash: Crash, engine: Engine, status: dict, report,
                owner: JobConsole | None = None) -> str | None:
        """Wait for commands over the control endpoint (``attach``/``send``).

        SIGTERM is trapped before the endpoint exists: a client (or a test)
        that sees the socket may signal at once, and that SIGTERM must give
        up the crash, not kill the job before the handler is in."""
        previous = self._trap_sigterm()
        server: ControlServer | None = None
        try:
            server = self._open(status, report.render(), local=False)
            if server is None:
                return "the control endpoint could not be opened (see daifu.internal_error)"
            return self._wait_remote(crash, engine, server, status, report, owner)
        except _Terminated:
            crash.patches.put(DecisionPatch(ABORT, origin="sigterm"))
            return "SIGTERM while waiting"
        finally:
            if server is not None:
                server.stop()
            self._restore_sigterm(previous)

    def _wait_remote(self, crash: Crash, engine: Engine, server: ControlServer, status: dict,
                     report, owner: JobConsole | None) -> str | None:
        emit(CrashWaiting(where=crash.where, socket=server.path, pid=os.getpid(),
                          wait_s=self.wait_s if self.wait_s is not None and owner is None
                          else -1))
        self._notify(crash, server)
        if owner is not None:
            sys.stderr.write(f"daifu: rank {status.get('rank')} crashed too ({status['exc_type']} "
                             f"at {crash.where}); it waits while the console on rank "
                             f"{owner.holder()} is open (there: `ranks`, "
                             f"`rank {status.get('rank')}`, `all ...`)\n")
        else:
            sys.stderr.write(report.render() + "\n")
            limit = "forever" if self.wait_s is None else f"up to {self.wait_s:g}s"
            sys.stderr.write(f"daifu: waiting {limit} for a fix -- from another terminal: "
                             f"python -m daifu attach {os.getpid()}\n")
        sys.stderr.flush()
        return self._serve(crash, engine, server, until=owner.take if owner is not None else None)

    def _console(self, crash: Crash, engine: Engine, status: dict, report) -> str | None:
        from ._console import PASS, run_local  # lazy: 60.9 ms
        from ._progress import paused  # lazy: 3.0 ms

        server = self._open(status, report.render(), local=True)
        self._notify(crash, server)
        try:
            with paused():  # progress bars and live displays step aside
                console = run_local(crash, engine.door(crash))
        finally:
            if server is not None:
                server.stop()
        return PASSED_ON if console.decision is PASS else None

    def _serve(self, crash: Crash, engine: Engine, server: ControlServer,
               until=None) -> str | None:
        """Run remote commands until one decides.  ``until``: another rank
        holds the job's console -- wait as long as it does (no ``--wait``
        deadline), and return ``_TAKEN`` once ``until()`` took it over."""
        import queue  # lazy: 1.0 ms

        from ._console import PASS, run_line  # lazy: 60.9 ms

        deadline = None if self.wait_s is None or until else time.monotonic() + self.wait_s
        while True:
            if until is not None and until():
                return _TAKEN
            timeout = 0.5 if deadline is None else min(0.5, deadline - time.monotonic())
            if timeout <= 0:
                return f"no fix within --wait {self.wait_s:g}s"
            try:
                req = server.requests.get(timeout=timeout)
            except queue.Empty:
                continue
            console, output = run_line(crash, engine.door(crash), req.text, req.origin,
                                       req.scope)
            decision = console.decision
            resumed = isinstance(decision, Decision) and decision is not ABORT
            req.reply = {"ok": console.ok, "output": output, "resumed": resumed,
                         "decision": "pass" if decision is PASS else (
                             decision.value if isinstance(decision, Decision) else None)}
            req.done.set()
            req.sent.wait(5.0)  # the client hears the answer before the job goes on
            if decision is PASS:
                return PASSED_ON
            if decision is not None:
                return None
            if deadline is not None and self.wait_s is not None:
                deadline = time.monotonic() + self.wait_s  # it bounds idleness, not a session

    def _notify(self, crash: Crash, server: ControlServer | None) -> None:
        """Run ``--notify CMD`` (in the background; it never holds the job up)."""
        if not self.notify:
            return
        import subprocess  # lazy: 5.1 ms

        pid = os.getpid()
        env = dict(os.environ, DAIFU_PID=str(pid), DAIFU_WHERE=crash.where,
                   DAIFU_FUNCTION=crash.function, DAIFU_STATEMENT=crash.statement,
                   DAIFU_EXCEPTION=type(crash.exception).__qualname__,
                   DAIFU_MESSAGE=exception_text(crash.exception, 500, one_line=True),
                   DAIFU_ATTACH=f"{sys.executable} -m daifu attach {pid}",
                   DAIFU_SOCKET=server.path if server is not None else "",
                   DAIFU_ARGV=" ".join(sys.argv))
        try:
            subprocess.Popen(self.notify, shell=True, env=env, stdin=subprocess.DEVNULL,
                             start_new_session=True)
        except OSError as exc:
            emit(NotifyFailed(where=crash.where, command=self.notify, error=str(exc)))
            return
        emit(NotifySent(where=crash.where, command=self.notify))

    def _open(self, status, report, local: bool) -> ControlServer | None:
        from ..remote._control import ControlServer, EndpointError  # lazy: 13.9 ms

        server = ControlServer(status, report, console_is_local=local)
        try:
            server.start()
        except (EndpointError, OSError) as exc:
            emit(InternalError(where=status["where"], error=f"control endpoint: {exc}",
                               traceback=""))
            sys.stderr.write(f"daifu: cannot open the control endpoint: {exc}\n")
            return None
        except BaseException:  # SIGTERM half-way: leave no socket behind
            server.stop()
            raise
        return server

    @staticmethod
    def _trap_sigterm():
        if threading.current_thread() is not threading.main_thread():
            return None

        def handler(signum, frame):
            raise _Terminated()

        return signal.signal(signal.SIGTERM, handler)

    @staticmethod
    def _restore_sigterm(previous) -> None:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
