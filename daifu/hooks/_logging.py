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
        fd = open_private(log_file, "the log file (--log)", ConfigError)
        stream = os.fdopen(fd, "a", buffering=1, encoding="utf-8")
        _events.configure(stream, level, json=True)
    else:
        _events.configure(None, level)
