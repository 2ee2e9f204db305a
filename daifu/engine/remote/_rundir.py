"""This user's private runtime directory: control sockets of jobs that wait
on a crash (``<pid>.sock``) and the job files of running jobs
(``<pid>.job``, what ``python -m daifu ps`` lists).  Only ``os`` and
``sys``: the runner registers its job here at start-up."""

from __future__ import annotations

import faulthandler
import os
import signal
import sys

from ..._private import check_private as _check_private
from ..._private import open_private
from ..._record import field
from ..._runtime import RUNTIME, state_record

RUNTIME_ENV = "DAIFU_RUNTIME_DIR"


class EndpointError(Exception):
    """The control endpoint cannot be opened safely."""


def _candidates() -> list[str]:
    """Where control sockets may live, in order of preference."""
    explicit = os.environ.get(RUNTIME_ENV)
    if explicit:
        return [explicit]
    out = []
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isdir(xdg) and os.stat(xdg).st_uid == os.getuid():
        out.append(os.path.join(xdg, "daifu"))
    out.append(os.path.join(os.environ.get("TMPDIR") or "/tmp", f"daifu-{os.getuid()}"))
    # anyone can create /tmp/daifu-$UID first; then the sockets live here
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local",
                                                             "state")
    out.append(os.path.join(state, "daifu", "run"))
    return out


def runtime_dir(create: bool = True, quiet: bool = False) -> str:
    """This user's private directory for control sockets.  ``DAIFU_RUNTIME_DIR``
    must be private; otherwise a default that another user created (or made
    readable) is passed over, and the job says where it listens instead."""
    candidates = _candidates()
    problems = []
    for n, path in enumerate(candidates):
        last = n == len(candidates) - 1
        if create:
            try:
                os.makedirs(path, 0o700) if last else os.mkdir(path, 0o700)
            except FileExistsError:
                pass
            except OSError as exc:
                problems.append(f"{path}: {exc.strerror}")
                continue
        try:
            check_private(path)
        except EndpointError as exc:
            if len(candidates) == 1:
                raise
            problems.append(str(exc))
            continue
        if problems and create and not quiet:
            sys.stderr.write(f"daifu: not using {'; '.join(problems)}\n"
                             f"daifu: control sockets are in {path}\n")
        return path
    raise EndpointError("no private directory for control sockets: " + "; ".join(problems))


def runtime_dirs() -> list[str]:
    """The private directories where this user's jobs may listen (clients
    look in all of them)."""
    out = []
    for path in _candidates():
        if not os.path.lexists(path):
            continue
        try:
            check_private(path)
        except EndpointError:
            if os.environ.get(RUNTIME_ENV):
                raise
            continue
        out.append(path)
    return out


def check_private(path: str) -> None:
    """Refuse a directory that another user could write or read."""
    _check_private(path, "control sockets", EndpointError)


# -- job files: the running jobs ``ps`` lists ------------------------------------------

@state_record
class _Registered:
    """This process's job files (``RUNTIME.parts``)."""

    #: (pid, path) of each job file written: a forked child leaves it alone
    files: list[tuple[int, str]] = field(default_factory=list)
    #: the descriptors faulthandler writes stacks to (kept open)
    stacks: list[int] = field(default_factory=list)


_state = RUNTIME.part(__name__, _Registered())


def _js(value) -> str:
    """A JSON text for str / int / float / list / dict / None (no json import
    at start-up)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_js(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_js(str(k))}: {_js(v)}" for k, v in value.items()) + "}"
    text = str(value)
    return '"' + "".join(c if c >= " " and c not in '"\\' else f"\\u{ord(c):04x}"
                         for c in text) + '"'


def register_job(info: dict) -> str | None:
    """Write ``<runtime dir>/<pid>.job`` (mode 0600) for ``ps``; removed by
    ``unregister_job`` at exit.  Never fails the job: returns None when the
    directory cannot be had."""

    try:
        directory = runtime_dir(create=True, quiet=True)
        path = os.path.join(directory, f"{os.getpid()}.job")
        fd = open_private(path, "job files", OSError,
                          os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(_js(info) + "\n")
    except (OSError, EndpointError):
        return None
    _state.files.append((os.getpid(), path))
    return path


#: the signal ``python -m daifu stacks`` sends: a real-time one, which no
#: program is likely to use for itself (SIGUSR1 is SLURM's and Lightning's)
STACKS_SIGNAL = getattr(signal, "SIGRTMIN", 34) + 5


def stacks_path(pid: int) -> str:
    return os.path.join(runtime_dir(create=False, quiet=True), f"{pid}.stacks")


def serve_stacks() -> int | None:
    """Let ``python -m daifu stacks`` read this process's threads' stacks:
    ``faulthandler`` writes them, from its C signal handler (so it works
    while the main thread is blocked in C: a read, a sleep, a collective),
    to ``<runtime dir>/<pid>.stacks`` (0600) on ``STACKS_SIGNAL``.  Returns
    the signal, or None where that cannot be set up (the job runs on)."""

    try:
        path = os.path.join(runtime_dir(create=True, quiet=True), f"{os.getpid()}.stacks")
        fd = open_private(path, "the stacks file", OSError, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
    except (OSError, ValueError, RuntimeError, EndpointError):
        return None
    try:
        # (a bare descriptor, kept open for faulthandler: a file object left
        # open would be a ResourceWarning at exit under -X dev, -W default,
        # unittest and pytest)
        faulthandler.register(STACKS_SIGNAL, file=fd, all_threads=True, chain=False)
    except (OSError, ValueError, RuntimeError):
        os.close(fd)
        return None
    _state.stacks.append(fd)  # (kept open: faulthandler writes to it)
    _state.files.append((os.getpid(), path))
    return STACKS_SIGNAL


def unregister_job() -> None:
    directories = set()
    while _state.files:
        pid, path = _state.files.pop()
        if pid == os.getpid():
            try:
                os.unlink(path)
            except OSError:
                pass
            directories.add(os.path.dirname(path))
    if not os.environ.get(RUNTIME_ENV):
        # a default directory (/tmp/daifu-$UID) left empty goes too: a job
        # leaves nothing behind (a program checking its temporary directory
        # for leaks -- CPython's own tests -- sees none); one another job
        # still uses is not empty, and is kept
        for directory in directories:
            try:
                os.rmdir(directory)
            except OSError:
                pass


def running_jobs() -> list[dict]:
    """The job files of this user's live daifu jobs (stale ones, of jobs
    that were killed -- and their ``.stacks`` files: a rank ended by SIGTERM
    or SIGKILL removes neither -- are removed)."""
    import json  # lazy: 1.6 ms

    jobs = []
    for directory in runtime_dirs():
        for name in sorted(os.listdir(directory)):
            stem, dot, kind = name.rpartition(".")
            if not dot or kind not in ("job", "stacks") or not stem.isdigit():
                continue
            path = os.path.join(directory, name)
            pid = int(stem)
            if not _alive(pid):
                try:
                    os.unlink(path)
                except OSError:
                    pass
                continue
            if kind != "job":
                continue
            try:
                with open(path, encoding="utf-8") as fh:
                    info = json.loads(fh.read())
            except (OSError, ValueError):
                continue
            if isinstance(info, dict):
                jobs.append({**info, "pid": pid})
    return jobs


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
