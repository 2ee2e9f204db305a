"""Where daifu's events go, for daifu's entry points (the runner, spawned children).

daifu has its own logger (``daifu.engine._events``) and never configures the
program's logging or structlog: events go to ``--log FILE`` as JSON lines, or
to stderr -- readable lines on a terminal, JSON lines otherwise.
"""

from __future__ import annotations

import os
import sys
import threading

from .._errors import ConfigError
from .._private import open_private
from ..engine import configure_events, event_placeholders, rank_unknown_yet

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)
if TYPE_CHECKING:
    from typing import Any


def configure(log_file: str | None = None, level: str = "info", fmt: str = "auto") -> None:
    """Point daifu's events at ``log_file`` (mode 0600) or stderr.  ``fmt``
    (``--log-format``): ``json`` lines, ``console`` lines for people, or
    ``auto``: JSON in a file or a pipe, for people on a terminal.  Raises
    ``ConfigError`` with one line when the file cannot be used."""
    json = {"json": True, "console": False}.get(fmt)
    if log_file and rank_unknown_yet(log_file):
        expand_path(log_file)  # (a bad placeholder is said now)
        configure_events(_RankFile(log_file), level,  # type: ignore[arg-type]
                          json=True if json is None else json)
    elif log_file:
        log_file = expand_path(log_file)
        fd = open_private(log_file, "the log file (--log-file)", ConfigError, sink=True)
        configure_events(_FdStream(fd), level,  # type: ignore[arg-type]
                          json=True if json is None else json)
    else:
        configure_events(None, level, json=json)


class _FdStream:
    """A log file as a bare descriptor written a line at a time: never a
    file object left open at exit (a ``ResourceWarning`` under ``-X dev``,
    pytest, unittest), and each line one ``write`` in append mode."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._pending = ""

    def write(self, text: str) -> int:
        self._pending += text
        if "\n" in self._pending:
            lines, _, self._pending = self._pending.rpartition("\n")
            try:
                os.write(self._fd, (lines + "\n").encode("utf-8", "replace"))
            except OSError:
                pass  # (a log that cannot be written must not stop the job)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self._fd


class _RankFile:
    """A per-rank log file (``events-{rank}.jsonl``) of a process that has no
    ``RANK`` from a launcher (``mp.spawn``): opened at its first line, named
    with the rank of the process group the program has made by then."""

    def __init__(self, template: str) -> None:
        self.template = template
        self._stream: Any = None
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            if self._stream is None:
                path = expand_path(self.template)
                try:
                    fd = open_private(path, "the log file (--log-file)", OSError, sink=True)
                except OSError as exc:
                    sys.stderr.write(f"daifu: {exc}; daifu's log goes to stderr\n")
                    self._stream = sys.stderr
                else:
                    self._stream = _FdStream(fd)
            return self._stream.write(text)

    def flush(self) -> None:
        if self._stream is not None:
            self._stream.flush()

    def isatty(self) -> bool:
        return False


def expand_path(path: str) -> str:
    """``{rank}``, ``{local_rank}``, ``{world_size}`` and ``{pid}`` in a log
    file name: one file per rank of a distributed job (``events-{rank}.jsonl``).
    The rank is the launcher's (``RANK``), else that of the process group
    the program made (``mp.spawn``); outside a distributed job 0 and 1."""
    if "{" not in path:
        return path
    where = event_placeholders()
    try:
        return path.format_map(where)
    except (KeyError, ValueError, IndexError) as exc:
        raise ConfigError(f"bad placeholder in the file name {path!r} ({exc}); use "
                          "{rank}, {local_rank}, {world_size} or {pid}") from None

