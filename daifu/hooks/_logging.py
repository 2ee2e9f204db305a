"""Where daifu's events go, for daifu's entry points (the runner, spawned children).

daifu has its own logger (``daifu.engine._events``) and never configures the
program's logging or structlog: events go to ``--log FILE`` as JSON lines, or
to stderr -- readable lines on a terminal, JSON lines otherwise.
"""

from __future__ import annotations

import os
import stat

from .._errors import ConfigError
from ..engine import _events


def open_private(path: str, purpose: str) -> int:
    """Open ``path`` for appending without following a symbolic link, creating
    it with mode 0600; refuse a file that belongs to another user or that
    others may write (it could be read or planted by them).  Returns the fd."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        if os.path.islink(path):
            reason = "it is a symbolic link"
        raise ConfigError(f"cannot open {purpose} {path}: {reason}") from None
    st = os.fstat(fd)
    problem = None
    if not stat.S_ISREG(st.st_mode):
        problem = "it is not a regular file"
    elif st.st_uid != os.getuid():
        problem = f"it belongs to uid {st.st_uid}, not to you (uid {os.getuid()})"
    elif st.st_mode & 0o022:
        problem = (f"it has mode {stat.S_IMODE(st.st_mode):o}: others may write it "
                   f"(fix: chmod 600 {path})")
    if problem is not None:
        os.close(fd)
        raise ConfigError(f"refusing to use {purpose} {path}: {problem}")
    return fd


def configure(log_file: str | None = None, level: str = "info") -> None:
    """Point daifu's events at ``log_file`` (JSON lines, mode 0600) or stderr.
    Raises ``ConfigError`` with one line when the file cannot be used."""
    if log_file:
        fd = open_private(log_file, "the log file (--log)")
        stream = os.fdopen(fd, "a", buffering=1, encoding="utf-8")
        _events.configure(stream, level, json=True)
    else:
        _events.configure(None, level)
