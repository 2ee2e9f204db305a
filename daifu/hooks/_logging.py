"""Logging setup for daifu's entry points (the runner, spawned children).

Only an application configures logging; this runs from the runner, and only
if nobody configured structlog before: readable lines on a TTY, JSON lines
otherwise or to ``--log FILE``.
"""

from __future__ import annotations

import logging
import sys

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "error": logging.ERROR}


class _Stderr:
    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def configure(log_file: str | None = None, level: str = "info") -> bool:
    """Configure structlog unless already configured; True if we did."""
    if structlog.is_configured():
        return False
    if log_file:
        stream = open(log_file, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - process-long
        renderer = structlog.processors.JSONRenderer(default=repr)
    else:
        stream = _Stderr()
        if sys.stderr.isatty():
            renderer = structlog.dev.ConsoleRenderer()
        else:
            renderer = structlog.processors.JSONRenderer(default=repr)
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS.get(level, logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=False,
    )
    return True
