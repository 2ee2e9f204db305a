"""Typed events, logged through daifu's own structlog logger.

daifu never configures -- or reads -- the program's global structlog
configuration: a program that configures structlog keeps its logs to itself,
and daifu's events go where daifu was told (``--log FILE``, else stderr;
readable lines on a terminal, JSON lines otherwise).

structlog (and its import of ``asyncio``, ``ssl``, ...) is imported only when
the first event that passes the level filter is emitted -- a crash, in a
normal run -- so that a program that never crashes starts as lean as without
daifu.  ``importlib.metadata`` is imported with it: structlog's module
``__getattr__`` imports it on any attribute miss, and daifu must not leave a
module whose ``hasattr()`` imports modules behind it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable, Iterator

from .._record import FrozenInstanceError, record
from .._record import field as _part_field
from .._runtime import RUNTIME, state_record
from ._job import distributed

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)
if TYPE_CHECKING:
    from typing import IO, Any, ClassVar, cast
else:
    def cast(_type, value):  # (typing.cast)
        return value

LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}

class _Factory:
    __slots__ = ("make",)

    def __init__(self, make: Callable[[], Any]) -> None:
        self.make = make


def _make_event(cls: Any) -> Any:
    """What ``@dataclass(frozen=True)`` makes of an event class -- its fields
    in order, with defaults and ``field(default_factory=...)`` -- without the
    code that dataclass generates per class (~0.5 ms each, at every start of
    every job: this module is imported at start-up)."""
    if "_fields" in vars(cls):
        return cls  # (done by ``Event.__init_subclass__``)
    names: list[str] = []
    defaults: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        for name, ann in vars(klass).get("__annotations__", {}).items():
            if str(ann).startswith(("ClassVar", "typing.ClassVar")):
                continue
            if name not in names:
                names.append(name)
            if name in vars(klass):
                defaults[name] = vars(klass)[name]
    for name, value in defaults.items():
        if isinstance(value, _Factory):
            delattr(cls, name)
    cls._fields, cls._defaults = tuple(names), defaults
    return cls


def _field(*, default_factory: Callable[[], Any]) -> Any:
    return _Factory(default_factory)


if TYPE_CHECKING:  # (type checkers know what a frozen dataclass accepts)
    from dataclasses import dataclass, field

    event = dataclass(frozen=True)
else:
    event, field = _make_event, _field

_MISSING = object()


@event
class Event:
    event: ClassVar[str] = "daifu.event"
    level: ClassVar[str] = "info"
    _fields: ClassVar[tuple[str, ...]] = ()
    _defaults: ClassVar[dict[str, Any]] = {}

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        _make_event(cls)  # every event class, decorated or not

    def __init__(self, *args: Any, **kw: Any) -> None:
        names = self._fields
        if len(args) > len(names):
            raise TypeError(f"{type(self).__name__} takes {len(names)} fields, got {len(args)}")
        values = dict(zip(names, args))
        for key, value in kw.items():
            if key not in names or key in values:
                raise TypeError(f"{type(self).__name__}: unexpected or repeated field {key!r}")
            values[key] = value
        for name in names:
            if name not in values:
                default = self._defaults.get(name, _MISSING)
                if default is _MISSING:
                    raise TypeError(f"{type(self).__name__}: missing field {name!r}")
                values[name] = default.make() if isinstance(default, _Factory) else default
        for name in names:
            object.__setattr__(self, name, values[name])

    def __setattr__(self, name: str, value: Any) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self.fields() == other.fields()

    def __hash__(self) -> int:
        return hash((type(self), tuple(repr(getattr(self, n)) for n in self._fields)))

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}={getattr(self, n)!r}" for n in self._fields)
        return f"{type(self).__name__}({inner})"

    def fields(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._fields}


@event
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


@event
class CrashReport(Event):
    """What a human needs to decide (see ``daifu.engine.human._report``)."""

    event: ClassVar[str] = "crash.report"
    where: str
    title: str
    statement: str
    traceback: str
    variables: dict
    done_before: list
    options: list


@event
class CrashWaiting(Event):
    """The job waits for a fix from another terminal."""

    event: ClassVar[str] = "crash.waiting"
    level: ClassVar[str] = "warning"
    where: str
    socket: str
    pid: int
    wait_s: float


@event
class PatchApplied(Event):
    event: ClassVar[str] = "patch.applied"
    where: str
    kind: str
    origin: str
    summary: str


@event
class PatchRejected(Event):
    event: ClassVar[str] = "patch.rejected"
    level: ClassVar[str] = "error"
    where: str
    kind: str
    origin: str
    reason: str


@event
class CrashResumed(Event):
    event: ClassVar[str] = "crash.resumed"
    where: str
    action: str
    attempt: int
    #: milliseconds from the exception reaching the barrier until the retried
    #: statement completed (retry) or execution continued after it (skip)
    latency_ms: float
    #: what the retry may do besides re-executing the statement
    #: (``Crash.retry_note``), or None
    note: str | None = None
    #: the vaccinated frames the exception passed through, unfixed, before it
    #: was taken here (innermost first: ``file:line (function)``)
    passed_through: list[str] = field(default_factory=list)
    #: where it was taken: the function and its statement (after passing
    #: through frames below, this is the only line that names them)
    function: str = ""
    statement: str = ""


@event
class CrashGaveUp(Event):
    event: ClassVar[str] = "crash.gave_up"
    level: ClassVar[str] = "error"
    where: str
    exc_type: str
    reason: str
    attempt: int
    #: as ``CrashResumed.passed_through``, ``function``, ``statement``
    passed_through: list[str] = field(default_factory=list)
    function: str = ""
    statement: str = ""


@event
class BreakPaused(Event):
    """``send PID break``: the job paused at a statement, before running it."""

    event: ClassVar[str] = "break.paused"
    where: str
    function: str
    statement: str


@event
class CrashPassed(Event):
    """No fix here; the exception goes on to a vaccinated caller's barrier
    (debug: the crash is reported once, with its outcome's
    ``passed_through``)."""

    event: ClassVar[str] = "crash.passed"
    level: ClassVar[str] = "debug"
    where: str
    exc_type: str
    reason: str


@event
class TimeoutExtended(Event):
    """A process group's collective timeout, extended so that the other ranks
    outlast a rank that waits for a fix (engine/remote/_distributed.py)."""

    event: ClassVar[str] = "distributed.timeout_extended"
    group: str
    timeout_s: float
    extended_s: float


@event
class RelayUnavailable(Event):
    """A rank's relay (``_jobstore``) could not reach the job's store: the
    rank is reached through this machine's control socket only."""

    event: ClassVar[str] = "relay.unavailable"
    level: ClassVar[str] = "warning"
    store: str
    reason: str


@event
class StoreDropped(Event):
    """Something a rank read from the job's store (``_jobstore``,
    ``_distributed``) was not what it must be -- not sealed with this user's
    key for that place (forged, altered, moved from another rank, round or
    job), replayed, expired, superseded by a later command, or cancelled by
    its sender -- and was dropped.  ``count``: how many were dropped for the
    same reason since the last such event (at most one every few seconds)."""

    event: ClassVar[str] = "store.dropped"
    level: ClassVar[str] = "warning"
    key: str
    reason: str
    count: int = 1


@event
class RuleFailed(Event):
    event: ClassVar[str] = "rule.failed"
    level: ClassVar[str] = "error"
    rule: str
    where: str
    error: str
    traceback: str


@event
class ModuleVaccinated(Event):
    event: ClassVar[str] = "module.vaccinated"
    level: ClassVar[str] = "debug"
    module: str
    file: str
    functions: list[str]
    skipped: list[str]
    #: loaded from the code cache instead of rewritten
    cached: bool = False
    #: the module was imported before daifu's hook; its functions were swapped in place
    in_place: bool = False
    #: functions given a first-call stub: vaccinated when first called
    first_call: list[str] = field(default_factory=list)


@event
class RunSummary(Event):
    """At exit (runner only), when the run had a crash: one daifu recovered,
    or the one the program died of.  Exceptions daifu gave up on that the
    program then handled itself are not crashes (``handled_by_program``);
    emitted before the program's own traceback, which stays the last line."""

    event: ClassVar[str] = "daifu.summary"
    crashes: int
    recovered: int
    gave_up: int
    handled_by_program: int = 0
    #: the emergency checkpoint written when a crash was given up
    checkpoint: str | None = None


@event
class ManifestSaved(Event):
    """A preempted distributed job: rank 0 wrote the manifest naming every
    rank's checkpoint (``persist/_preempt``); ``daifu.resume(path)`` in each
    rank of a job of the same size takes that rank's.  ``consistent``: every
    rank saved at the same step, at the loop's header."""

    event: ClassVar[str] = "checkpoint.manifest"
    level: ClassVar[str] = "warning"
    path: str
    world_size: int
    step: int
    ranks: dict
    missing: list
    consistent: bool = True


@event
class HangDetected(Event):
    """A distributed job stopped moving (``engine/_watchdog``): no rank took
    an optimizer step, and none used its CPU or did I/O, for
    ``threshold_s``.  ``behind`` is the rank that is behind (the others wait
    in ``waiting``), ``at`` its line; ``diagnosis`` is the doctor's
    (``stacks --job``); ``action``: "save" (every rank saves, then the job
    ends), "wait" (for a person, ``--wait``) or "report"."""

    event: ClassVar[str] = "hang.detected"
    level: ClassVar[str] = "error"
    behind: int | None
    at: str
    waiting: str
    idle_s: float
    threshold_s: float
    why: str
    diagnosis: list
    action: str


@event
class StragglerSeen(Event):
    """A rank that keeps its peers waiting at every collective, while the
    job still moves (``engine/_watchdog``): ``own_s`` is its own time per
    step (outside the collectives), ``others_s`` the median of the others',
    ``late_s`` how much longer they wait for it each step, ``at`` the line
    it spends its time at, ``samples`` how many samples of each rank this
    rests on.  Nothing is stopped for it."""

    event: ClassVar[str] = "straggler"
    level: ClassVar[str] = "warning"
    straggler: int
    at: str
    late_s: float
    own_s: float
    others_s: float
    samples: int


@event
class CheckpointSaved(Event):
    """A crash was given up: the training state was saved (``_checkpoint``);
    ``daifu.load_checkpoint(path)`` reads it."""

    event: ClassVar[str] = "checkpoint.saved"
    level: ClassVar[str] = "warning"
    where: str
    path: str
    bytes: int
    seconds: float
    objects: dict
    position: dict
    #: the checkpoints a Lightning or HF Trainer on the stack saved itself
    frameworks: dict = field(default_factory=dict)
    #: the directory where DCP wrote the job's sharded state (FSDP2, DTensor)
    sharded: str = ""


@event
class CheckpointNote(Event):
    """Said while saving: the state is large (with an estimate), or one object's
    ``state_dict()`` failed."""

    event: ClassVar[str] = "checkpoint.note"
    level: ClassVar[str] = "warning"
    where: str
    message: str


@event
class CheckpointFailed(Event):
    event: ClassVar[str] = "checkpoint.failed"
    level: ClassVar[str] = "error"
    where: str
    reason: str


@event
class InternalError(Event):
    event: ClassVar[str] = "daifu.internal_error"
    level: ClassVar[str] = "error"
    where: str
    error: str
    traceback: str


@event
class NotifySent(Event):
    """``--notify CMD`` was started: the job waits for a fix."""

    event: ClassVar[str] = "notify.sent"
    level: ClassVar[str] = "info"
    where: str
    command: str


@event
class NotifyFailed(Event):
    """``--notify CMD`` could not be started (the job waits all the same)."""

    event: ClassVar[str] = "notify.failed"
    level: ClassVar[str] = "warning"
    where: str
    command: str
    error: str


class _CurrentStderr:
    """Write to whatever ``sys.stderr`` is now (tests and tools replace it) --
    except while the console captures a command's output: daifu's events
    still go to the job's stderr, not to the person who sent the command."""

    def write(self, text: str) -> int:
        return (_state.pinned[-1] if _state.pinned else sys.stderr).write(text)

    def flush(self) -> None:
        (_state.pinned[-1] if _state.pinned else sys.stderr).flush()


@contextlib.contextmanager
def pinned_stderr() -> Iterator[None]:
    """Keep daifu's events on the current ``sys.stderr`` inside the block."""
    _state.pinned.append(sys.stderr)
    try:
        yield
    finally:
        _state.pinned.pop()


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Keep events that would be written to stderr back until the block ends
    (the console on the job's terminal: its report and prompt are not
    interleaved with log lines); then write them, in order."""
    _state.held.append([])
    try:
        yield
    finally:
        kept = _state.held.pop()
        for ev in kept:
            write(ev)  # (to the block around this one, if it holds too)


def release_held() -> None:
    """Write what the innermost ``held`` block kept back so far, in order,
    and go on holding (a rule is about to run: what it prints must come
    after the lines of the crash it answers)."""
    if _state.held:
        kept, _state.held[-1] = _state.held[-1], []
        for ev in kept:
            try:
                _write(ev)
            except Exception:
                pass


@record
class _Sink:
    """Where daifu's events go; the structlog logger is built on first use."""

    stream: IO[str] | _CurrentStderr
    level: int = LEVELS["info"]
    json: bool | None = None  # None: JSON unless the stream is a terminal
    logger: Any = None


@state_record
class _Events:
    """Where this process's events go, and who else sees them (``RUNTIME.parts``)."""

    sink: _Sink = _part_field(default_factory=lambda: _Sink(_CurrentStderr()))
    #: held while the sink is replaced or its logger built
    lock: threading.Lock = _part_field(default_factory=threading.Lock)
    #: the job's own stderr, while the console redirects sys.stderr
    pinned: list[Any] = _part_field(default_factory=list)
    #: events kept back while a console is on the terminal (one list per ``held`` block)
    held: list[list[Event]] = _part_field(default_factory=list)
    #: per thread: ``building`` -- the thread is importing what the logger
    #: needs (structlog, rich...); ``deferred`` -- the events emitted
    #: meanwhile (by a vaccinated module those imports load: ``--modules
    #: attr``, which rich imports), written once the logger is built.  (The
    #: build held ``lock`` while importing: that event's write waited for the
    #: lock its own thread held, and the job hung at start-up.)
    building: threading.local = _part_field(default_factory=threading.local)
    #: in-process observers of every event (``capture()``; the test suite's guard)
    listeners: list[Callable[[Event], None]] = _part_field(default_factory=list)
    #: per thread: the events of the crash this thread handles (``collecting``)
    collecting: threading.local = _part_field(default_factory=threading.local)


_state = RUNTIME.part(__name__, _Events())


def configure(stream: IO[str] | None = None, level: str = "info",
              json: bool | None = None) -> None:
    """Send daifu's events to ``stream`` (default: the current ``sys.stderr``)
    at ``level`` and above.  Called by daifu's entry points; a library that
    imports daifu gets readable lines on stderr at ``info``."""
    with _state.lock:
        _state.sink = _Sink(stream if stream is not None else _CurrentStderr(),
                      LEVELS.get(level, LEVELS["info"]), json)


def _reset() -> None:
    configure()
    _state.pinned.clear()
    _state.held.clear()


RUNTIME.on_reset(_reset)


def _is_tty(stream: Any) -> bool:
    target = sys.stderr if isinstance(stream, _CurrentStderr) else stream
    try:
        return bool(target.isatty())
    except Exception:
        return False


def warm() -> None:
    """Import what building the logger imports (``_preload``)."""
    # lazy: 1.2 ms
    from ._quietrandom import program_random_untouched  # (only where a logger is built)

    _state.building.on = True
    try:
        with program_random_untouched():
            import importlib.metadata  # noqa: F401 - see the module docstring  # lazy: 39.5 ms

            import structlog  # lazy: 129.1 ms

            structlog.dev.ConsoleRenderer  # noqa: B018 - (structlog.dev imports rich, if installed)
    finally:
        _state.building.on = False
        _write_deferred()


def _write_deferred() -> None:
    deferred = getattr(_state.building, "deferred", None)
    while deferred:
        _write(deferred.pop(0))


def _build(sink: _Sink) -> Any:
    # lazy: 1.2 ms
    from ._quietrandom import program_random_untouched  # (only where a logger is built)

    with program_random_untouched():
        import importlib.metadata  # noqa: F401 - see the module docstring  # lazy: 39.5 ms

        import structlog  # lazy: 129.1 ms

    as_json = sink.json if sink.json is not None else not _is_tty(sink.stream)
    if as_json:
        stamp = structlog.processors.TimeStamper(fmt="iso", utc=True)
        renderer: Any = structlog.processors.JSONRenderer(default=repr)
    else:
        stamp = structlog.processors.TimeStamper(fmt="%H:%M:%S")
        colors = _is_tty(sink.stream) and not os.environ.get("NO_COLOR")
        renderer = structlog.dev.ConsoleRenderer(colors=colors)
    # (lines for people leave out the fields with nothing in them; JSON keeps
    # every field, its schema stable)
    steps: list[Any] = [structlog.processors.add_log_level, stamp, renderer]
    if not as_json:
        steps.insert(0, _without_empty)
    return structlog.wrap_logger(
        structlog.PrintLogger(file=cast("Any", sink.stream)),
        processors=steps,
        wrapper_class=structlog.make_filtering_bound_logger(sink.level),
        context_class=dict,
        cache_logger_on_first_use=True,
    )


def _without_empty(_logger: Any, _name: str, fields: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None and v != "" and v != []}


@contextlib.contextmanager
def collecting(into: list[Event], hold: Callable[[], bool]) -> Iterator[None]:
    """Also append the events this thread emits inside the block to ``into``;
    while ``hold()`` is true they are only appended, not written (the engine
    writes them later with ``write``, or counts them: ``_repeats``)."""
    previous = getattr(_state.collecting, "current", None)
    _state.collecting.current = (into, hold)
    try:
        yield
    finally:
        _state.collecting.current = previous


def tell(ev: Event) -> None:
    """Give one event to the in-process listeners only, not to the log."""
    for listener in list(_state.listeners):
        try:
            listener(ev)
        except Exception:
            pass


def logs_to_terminal() -> bool:
    """Do daifu's log lines go to the process's stderr (not a file)?"""
    return isinstance(_state.sink.stream, _CurrentStderr)


def emit(ev: Event) -> None:
    """Log one event; never raises."""
    try:
        for listener in list(_state.listeners):
            listener(ev)
        current = getattr(_state.collecting, "current", None)
        if current is not None:
            current[0].append(ev)
            if current[1]():
                return
        write(ev)
    except Exception:  # logging must never break recovery
        pass


def write(ev: Event) -> None:
    """Write one event to the log (listeners are not told again); never raises."""
    try:
        if _state.held and isinstance(_state.sink.stream, _CurrentStderr):
            _state.held[-1].append(ev)
            return
        _write(ev)
    except Exception:  # logging must never break recovery
        pass


_DISTRIBUTED = distributed()


def _write(ev: Event) -> None:
    try:
        sink = _state.sink
        if LEVELS[ev.level] < sink.level:
            return
        if sink.logger is None:
            if getattr(_state.building, "on", False):  # (emitted by an import of the build)
                if not hasattr(_state.building, "deferred"):
                    _state.building.deferred = []
                _state.building.deferred.append(ev)
                return
            _state.building.on = True
            try:  # (no lock held while importing: two first events may both build)
                logger = _build(sink)
            finally:
                _state.building.on = False
            with _state.lock:
                if sink.logger is None:
                    sink.logger = logger
        fields = ev.fields()
        if _DISTRIBUTED:
            fields = {**_DISTRIBUTED, **fields}
        getattr(sink.logger, ev.level)(ev.event, **fields)
    except Exception:  # logging must never break recovery
        pass
    _write_deferred()


@contextlib.contextmanager
def capture() -> Iterator[list[dict[str, Any]]]:
    """Collect the events emitted inside the block as dicts
    (``{"event": ..., "log_level": ..., **fields}``), like structlog's
    ``capture_logs`` for daifu's own logger."""
    records: list[dict[str, Any]] = []

    def listen(ev: Event) -> None:
        records.append({"event": ev.event, "log_level": ev.level, **ev.fields()})

    _state.listeners.append(listen)
    try:
        yield records
    finally:
        _state.listeners.remove(listen)
