"""Where daifu's events go, for daifu's entry points (the runner, spawned children).

daifu has its own logger (``daifu.engine._events``) and never configures the
program's logging or structlog: events go to ``--log FILE`` as JSON lines, or
to stderr -- readable lines on a terminal, JSON lines otherwise.
"""

from __future__ import annotations

import os

from .._errors import ConfigError
from .._private import open_private
from ..engine import _events


def configure(log_file: str | None = None, level: str = "info") -> None:
    """Point daifu's events at ``log_file`` (JSON lines, mode 0600) or stderr.
    Raises ``ConfigError`` with one line when the file cannot be used."""
    if log_file:
        log_file = expand_path(log_file)
        fd = open_private(log_file, "the log file (--log-file)", ConfigError, sink=True)
        stream = os.fdopen(fd, "a", buffering=1, encoding="utf-8")
        _events.configure(stream, level, json=True)
    else:
        _events.configure(None, level)


def expand_path(path: str) -> str:
    """``{rank}``, ``{local_rank}``, ``{world_size}`` and ``{pid}`` in a log
    file name: one file per rank of a distributed job (``events-{rank}.jsonl``).
    Outside a distributed job the rank fields are 0 and 1."""
    if "{" not in path:
        return path
    from ..engine._events import distributed

    where = {"rank": 0, "local_rank": 0, "world_size": 1, **distributed(), "pid": os.getpid()}
    try:
        return path.format_map(where)
    except (KeyError, ValueError, IndexError) as exc:
        raise ConfigError(f"bad placeholder in the file name {path!r} ({exc}); use "
                          "{rank}, {local_rank}, {world_size} or {pid}") from None

