"""Typed events, logged through structlog with stable event names.

The library never configures logging.  If the application (or daifu's runner)
configured structlog, events go through it; otherwise they go to stderr
through a private logger, so that daifu never writes to a program's stdout.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from dataclasses import dataclass
from typing import Any, ClassVar

import structlog


@dataclass(frozen=True)
class Event:
    event: ClassVar[str] = "daifu.event"
    level: ClassVar[str] = "info"

    def fields(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class CrashIntercepted(Event):
    event: ClassVar[str] = "crash.intercepted"
    level: ClassVar[str] = "warning"
    where: str
    function: str
    statement: str
    exc_type: str
    message: str
    attempt: int
    can_retry: bool
    can_skip: bool


@dataclass(frozen=True)
class CrashReport(Event):
    """What a human needs to decide (see ``daifu.engine._report``)."""

    event: ClassVar[str] = "crash.report"
    where: str
    title: str
    statement: str
    traceback: str
    variables: dict
    done_before: list
    options: list


@dataclass(frozen=True)
class CrashWaiting(Event):
    """The job waits for a fix from another terminal."""

    event: ClassVar[str] = "crash.waiting"
    level: ClassVar[str] = "warning"
    where: str
    socket: str
    pid: int
    wait_s: float


@dataclass(frozen=True)
class PatchApplied(Event):
    event: ClassVar[str] = "patch.applied"
    where: str
    kind: str
    origin: str
    summary: str


@dataclass(frozen=True)
class PatchRejected(Event):
    event: ClassVar[str] = "patch.rejected"
    level: ClassVar[str] = "error"
    where: str
    kind: str
    origin: str
    reason: str


@dataclass(frozen=True)
class CrashResumed(Event):
    event: ClassVar[str] = "crash.resumed"
    where: str
    action: str
    attempt: int
    #: milliseconds from the exception reaching the barrier until the retried
    #: statement completed (retry) or execution continued after it (skip)
    latency_ms: float


@dataclass(frozen=True)
class CrashGaveUp(Event):
    event: ClassVar[str] = "crash.gave_up"
    level: ClassVar[str] = "error"
    where: str
    exc_type: str
    reason: str
    attempt: int


@dataclass(frozen=True)
class CrashPassed(Event):
    """No fix here; the exception goes on to a vaccinated caller's barrier."""

    event: ClassVar[str] = "crash.passed"
    where: str
    exc_type: str
    reason: str


@dataclass(frozen=True)
class RuleFailed(Event):
    event: ClassVar[str] = "rule.failed"
    level: ClassVar[str] = "error"
    rule: str
    where: str
    error: str
    traceback: str


@dataclass(frozen=True)
class ModuleVaccinated(Event):
    event: ClassVar[str] = "module.vaccinated"
    level: ClassVar[str] = "debug"
    module: str
    file: str
    functions: list[str]
    skipped: list[str]
    #: loaded from the code cache instead of rewritten
    cached: bool = False


@dataclass(frozen=True)
class RunSummary(Event):
    """At exit (runner only), when at least one crash was intercepted."""

    event: ClassVar[str] = "daifu.summary"
    crashes: int
    recovered: int
    gave_up: int


@dataclass(frozen=True)
class InternalError(Event):
    event: ClassVar[str] = "daifu.internal_error"
    level: ClassVar[str] = "error"
    where: str
    error: str
    traceback: str


_fallback: Any = None


class _CurrentStderr:
    """Write to whatever ``sys.stderr`` is now (tests and tools replace it)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def _logger() -> Any:
    global _fallback
    if structlog.is_configured():
        return structlog.get_logger("daifu")
    if _fallback is None:
        _fallback = structlog.wrap_logger(
            structlog.PrintLogger(file=_CurrentStderr()),
            wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
            processors=[
                structlog.processors.add_log_level,
                structlog.processors.TimeStamper(fmt="%H:%M:%S"),
                structlog.dev.ConsoleRenderer(colors=False),
            ],
        )
    return _fallback


def emit(ev: Event) -> None:
    """Log one event; never raises."""
    try:
        getattr(_logger(), ev.level)(ev.event, **ev.fields())
    except Exception:  # logging must never break recovery
        pass
