"""The engine: turns an exception stopped at a crash barrier into a decision.

Flow for one exception (see docs/architecture.md):

1. the stub of the failing cell calls ``barrier(exc, cell, lasti, stack)``;
2. the engine declines at once (re-raise, nothing logged) when the exception
   is not a crash: ``BaseException``-only classes, ``StopIteration``, an
   exception daifu already gave up on, one the function's own handlers or a
   target caller's handlers will catch;
3. otherwise it builds a ``Crash``, logs ``crash.intercepted``, and asks the
   patch sources in order -- rules now; console/attach/replay later -- which
   put patches in the queue; the engine applies them until a decision comes;
4. retry/skip resume the frame; no decision (or ``ABORT``) gives up: the
   exception continues exactly as it would have without daifu.

Any failure inside the engine gives up the same way: daifu never makes a
crash worse.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import sys
import threading
import time
import types

from .._record import field, record
from .._record import replace as changed
from ..cells import (
    CONTINUE_CODE,
    RAISE_CODE,
    RETRY_CODE,
    SKIP_CODE,
    Cell,
    backend,
    cell_range,
    cells_of,
    target_files,
)
from ._crash import Crash, always_key, exception_text
from ._decision import (
    ABORT,
    CONTINUE,
    PASSED_ON,
    RELOAD,
    RETRY,
    SKIP,
    AllRanks,
    Decision,
    Resolution,
)
from ._events import (
    BreakPaused,
    CrashGaveUp,
    CrashIntercepted,
    CrashPassed,
    CrashResumed,
    PatchRejected,
    RuleFailed,
    collecting,
    emit,
    held,
    release_held,
    tell,
)
from ._fastpath import passing
from ._guards import handled_above, would_catch
from ._outcomes import Outcomes
from ._patches import Patches
from ._queue import (
    DecisionPatch,
    ExecPatch,
    ReloadPatch,
    ReplacePatch,
)
from ._repeats import Repeats
from ._retries import Retries
from ._rules import RuleBook
from ._signals import live
from .human._break import is_break
from .remote import _distributed

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)
if TYPE_CHECKING:
    from typing import Any

_NOT_CRASHES = (StopIteration, StopAsyncIteration)


@record
class _Pending:
    """A retry decided at (frame, cell): if the retried statement fails again
    (its ``lasti`` is in the cell's retry copy), that is the next attempt of
    the same crash.  Holds no frame: a finished retry leaves nothing alive."""

    attempt: int
    started: float
    #: the thread the retry runs in (``Engine._prune_pending``)
    thread: int = 0


#: retries remembered at once (a finished retry's entry is stale but small)
_MAX_PENDING = 4096


class ExceptionMemo:
    """Exceptions daifu decided something about (gave up on, waited for a
    human on), remembered without owning them.

    A given-up exception goes on up the stack, through the barriers of other
    vaccinated frames, which must leave it alone.  Keeping the exception
    would keep its traceback, every frame on it and all their variables alive
    after the program dropped it (a library that catches a failing step's
    exception 40 times would hold 40 steps of tensors).  So only addresses
    are kept: the exception's, and those of the traceback entry and frame it
    was given up in.  That entry stays on the exception's traceback chain
    while it propagates, so a later barrier recognises it.  A new exception
    that happens to reuse the old addresses first reaches the barrier of the
    frame it was raised in -- with that entry at the head of its chain, which
    the old one can never have there again (any raise adds an entry) -- and
    is taken as new; the stale record is dropped then."""

    def __init__(self, limit: int = 65536) -> None:
        #: id(exc) -> (id of its traceback entry, id of the frame, lasti) at the decision
        self._ids: collections.OrderedDict[int, tuple[int, int, int]] = \
            collections.OrderedDict()
        self._limit = limit  # small tuples of ints: far more than can be in flight
        self._lock = threading.Lock()

    def add(self, exc: BaseException, frame: types.FrameType) -> None:
        tb = exc.__traceback__
        with self._lock:
            self._ids[id(exc)] = (id(tb), id(frame), tb.tb_lasti if tb is not None else -1)
            self._ids.move_to_end(id(exc))
            while len(self._ids) > self._limit:
                self._ids.popitem(last=False)

    def seen(self, exc: BaseException, frame: types.FrameType) -> bool:
        """Was ``exc`` remembered, on its way to ``frame``'s barrier?"""
        mark = self._ids.get(id(exc))
        if mark is None:
            return False
        tb_id, frame_id, lasti = mark
        tb = exc.__traceback__
        if id(tb) == tb_id and id(frame) == frame_id:
            with self._lock:  # a new exception raised here at recycled addresses
                self._ids.pop(id(exc), None)
            return False
        head = tb
        while tb is not None:
            if id(tb) == tb_id:
                if id(tb.tb_frame) != frame_id or tb.tb_lasti != lasti:
                    break  # (another entry at a dead one's address)
                if head is not None and tb is not head:
                    # moved up: the next barrier finds it at the head's next
                    # entry at once (a deep stack is not walked at every frame)
                    with self._lock:
                        self._ids[id(exc)] = (id(head), id(head.tb_frame), head.tb_lasti)
                return True
            tb = tb.tb_next
        with self._lock:  # not this exception: another one's, freed (addresses reused)
            self._ids.pop(id(exc), None)
        return False

    def holds(self, exc: BaseException) -> bool:
        """Is ``exc`` (still propagating, its traceback chain intact) remembered?"""
        mark = self._ids.get(id(exc))
        tb = exc.__traceback__
        while mark is not None and tb is not None:
            if id(tb) == mark[0]:
                return id(tb.tb_frame) == mark[1] and tb.tb_lasti == mark[2]
            tb = tb.tb_next
        return False

    def __len__(self) -> int:
        return len(self._ids)

    def clear(self) -> None:
        with self._lock:
            self._ids.clear()


#: emergency checkpoints one process writes at most (a program that keeps
#: catching crashes daifu gave up on must not fill the disk)
MAX_CHECKPOINTS = 3


def _taken(crash: Crash) -> dict[str, str]:
    """Where an outcome's crash was taken, when it passed frames below (the
    caller's ``crash.intercepted`` is not written: one exception, one report)."""
    if not crash.passed_through:
        return {}
    return {"function": crash.function, "statement": crash.statement}


@record
class EngineSettings:
    """Everything the engine is configured with, in one object: made by the
    runner's ``Config`` (``hooks/_config.py``), or from the environment, and
    given to ``Engine.configure``."""

    #: retries of one statement before it is given up (``--max-attempts``)
    max_attempts: int = 5
    #: the emergency checkpoint when a crash is given up (``--no-checkpoint``)
    checkpoint: bool = True
    #: where it goes (None: the default directory; ``--checkpoint-dir``)
    checkpoint_dir: str | None = None
    #: the journal of crashes and patches (``_journal.Journal``), if any
    journal: Any = None
    #: a journal being replayed (``_journal.Replay``), consulted before the rules
    replay: Any = None
    #: interactive patch sources (console, remote attach) -- consulted after
    #: the rules; each has ``wait(crash, engine) -> str | None`` (why it
    #: stopped waiting without a decision)
    waiters: list[Any] = field(default_factory=list)

    @classmethod
    def from_env(cls) -> EngineSettings:
        return cls(max_attempts=_env_int("DAIFU_MAX_ATTEMPTS", 5),
                   checkpoint=os.environ.get("DAIFU_CHECKPOINT", "1").strip().lower()
                   not in ("0", "false", "no", "off"),
                   checkpoint_dir=os.environ.get("DAIFU_CHECKPOINT_DIR") or None)


def _setting(name: str) -> Any:
    """An engine attribute that is a field of its ``EngineSettings``."""
    return property(lambda self: getattr(self.settings, name),
                    lambda self, value: setattr(self.settings, name, value),
                    doc=f"``self.settings.{name}``")


class Engine(Retries, Patches, Outcomes):
    """One per process (``ENGINE``), configured by one ``EngineSettings``."""

    max_attempts: int = _setting("max_attempts")
    checkpoint: bool = _setting("checkpoint")
    checkpoint_dir: str | None = _setting("checkpoint_dir")
    journal: Any = _setting("journal")
    replay: Any = _setting("replay")
    waiters: list[Any] = _setting("waiters")

    def __init__(self, settings: EngineSettings | None = None) -> None:
        self.settings = settings or EngineSettings.from_env()
        self.rules = RuleBook()
        self.stats: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()  # for the counters and the retry table
        self._tls = threading.local()
        self._pending: dict[tuple[int, Cell], _Pending] = {}
        self.gave_up = ExceptionMemo()
        #: the last handling of each crash site: identical repeats are counted
        self.repeats = Repeats()
        #: a decision taken at a crash for one of its callers (the console's
        #: ``up`` then ``retry``): id(exception) -> (exception, caller frame,
        #: patch); the exception is handed up to that frame's barrier
        #: the exception passed up to a vaccinated caller after no fix, and the
        #: frames it passed (``file:line (function)``); one slot: the next
        #: exception replaces it, its outcome clears it
        self._passed: tuple[BaseException, list[str]] | None = None
        self._forward: dict[int, tuple[BaseException, types.FrameType,
                                       DecisionPatch | ReloadPatch]] = {}
        #: paths of the emergency checkpoints written (at most MAX_CHECKPOINTS)
        self.checkpoints: list[str] = []
        #: standing answers (the console's ``always``): crash key -> (decision,
        #: the exec patches to re-apply first, who said it)
        self.always: dict[tuple, tuple[Decision, tuple[ExecPatch, ...], str]] = {}

    # -- called from the stubs ---------------------------------------------------

    def busy(self) -> bool:
        """Is this thread inside daifu's own handling (a rule, the console)?"""
        return getattr(self._tls, "busy", False)

    def on_exception(self, exc: BaseException, cell: Cell, lasti: int, stack: tuple,
                     frame: types.FrameType) -> int | tuple:
        tls = self._tls
        if getattr(tls, "busy", False):
            # raised inside daifu's own handling (a rule, the console, a library
            # daifu uses that the program vaccinated): never a crash
            return RAISE_CODE
        tls.busy = True
        try:
            if is_break(exc):  # ``send PID break``: a pause, not a crash (``_break``)
                return self._handle_break(exc, cell, lasti, stack, frame)
            if not self._is_crash(exc, cell, stack, frame):
                if self._pending:  # a retry that raised again and is not a crash: it is over
                    with self._lock:
                        self._pending.pop((id(frame), cell), None)
                    self._prune_pending(frame)
                forward = self._forward.get(id(exc))
                if forward is not None and forward[1] is frame:
                    del self._forward[id(exc)]  # the caller handles it itself: nothing to do
                return RAISE_CODE
            # no lock is held while rules or a human work: a crash in another
            # thread is handled at the same time (rules a thread waits on must
            # not deadlock); the waiters serialise the humans themselves
            return self._handle(exc, cell, lasti, stack, frame)
        finally:
            tls.busy = False

    def _is_crash(self, exc: BaseException, cell: Cell, stack: tuple,
                  frame: types.FrameType) -> bool:
        if not isinstance(exc, Exception) or isinstance(exc, _NOT_CRASHES):
            return False
        if self.gave_up.seen(exc, frame):
            return False
        if not (cell.can_retry or cell.can_skip or cell.can_continue):
            return False  # nothing to do here: let the next vaccinated caller try
        if cell.guards:
            exits = [stack[slot] for slot in cell.with_slots if slot < len(stack)]
            if would_catch(cell.guards, exc, frame, exits):
                return False
        return not handled_above(frame, exc, target_files())

    # -- one crash -----------------------------------------------------------------

    def _handle(self, exc, cell, lasti, stack, frame) -> int | tuple:
        forward = self._forward.get(id(exc))
        if forward is not None and forward[0] is exc and forward[1] is not frame:
            return RAISE_CODE  # on its way to the caller the decision is for
        if self._forward and forward is None:
            self._forward.clear()  # a new exception: a decision never delivered is stale
        key = (id(frame), cell)
        with self._lock:
            pending = self._pending.pop(key, None)
        if pending is not None and not _in_retry_copy(cell, frame, lasti):
            pending = None  # the statement failed anew (a later iteration), not its retry
        if pending is not None:
            self._count("recovered", -1)  # that retry did not recover it after all
        attempt = pending.attempt + 1 if pending else 1
        started = pending.started if pending else time.perf_counter()
        crash = Crash(self.submit, exc, cell, frame, lasti, stack, attempt, started)
        self._count("crashes", 1)
        self._tls.crash = crash
        group = self.repeats.begin((crash.where, type(exc).__qualname__, exception_text(exc)))
        self._tls.group = group
        # with a console on the job's own terminal, its report comes first: the
        # log lines of this crash (crash.intercepted, journal.opened, ...) are
        # written once it is handled -- or before a rule runs, so that what a
        # rule prints comes after the line of the crash it answers
        local = any(getattr(w, "console", False) for w in self.waiters)
        ranked = _distributed.active()
        if ranked:  # (peers of an agreement ask whether this rank is at a crash)
            _distributed.mark_at_crash(True)
        try:
            with held() if local else contextlib.nullcontext(), \
                    collecting(group.events, lambda: group.hold):
                return self._handle_crash(crash, key, forward, attempt)
        finally:
            if ranked:
                _distributed.mark_at_crash(False)
            self._tls.group = None
            self._end_group(group, crash)
            self._tls.crash = None
            crash._release()

    def _handle_break(self, exc, cell, lasti, stack, frame) -> int | tuple:
        """A job paused by ``break`` at a statement that has not started: a
        human decides (no rule, replay or standing answer); anything but a
        decision resumes it, running nothing twice."""
        if id(exc) in self._forward:  # a decision taken at the pause, for this caller
            return self._handle(exc, cell, lasti, stack, frame)
        crash = Crash(self.submit, exc, cell, frame, lasti, stack, 1, time.perf_counter())
        self._tls.crash = crash
        try:
            emit(BreakPaused(where=crash.where, function=crash.function,
                             statement=crash.statement))
            decision = None
            for waiter in self.waiters or [_break_waiter()]:
                try:
                    with live(signal.SIGINT, signal.SIGTERM):
                        waiter.wait(crash, self)
                except Exception:
                    self._internal("waiter", crash)
                decision = self._drain(crash)
                if decision is not None:
                    break
            res = crash.resolution
            if decision is None or decision is ABORT:
                decision, res.upward = RETRY, None
            res.decision, res.reason = decision, "break"
            return self._conclude(crash, (id(frame), cell), res)
        except BaseException:
            self._internal("break", crash)
            return RETRY_CODE  # the statement had not started: nothing runs twice
        finally:
            self._tls.crash = None
            crash._release()

    def _handle_crash(self, crash: Crash, key, forward, attempt: int) -> int | tuple:
        exc = crash.exception
        try:
            passed = self._passed
            if passed is not None and passed[0] is not exc:
                passed = self._passed = None  # (another exception: that one went elsewhere)
            crash.passed_through = list(passed[1]) if passed is not None else []
            # one exception, one report: taken again by a caller after no fix
            # below, it is not announced again (in-process listeners hear it)
            (tell if passed is not None else emit)(CrashIntercepted(
                where=crash.where, function=crash.function, statement=crash.statement,
                exc_type=type(exc).__qualname__, message=exception_text(exc), attempt=attempt,
                can_retry=crash.can_retry, can_skip=crash.can_skip))
            self._record("crash", crash)
            res = crash.resolution
            if attempt > self.max_attempts:  # a statement that keeps failing must not bounce around
                res.final = True
            if forward is not None and forward[0] is exc:  # taken at the callee's crash
                del self._forward[id(exc)]
                if not res.final:
                    crash.patches.put(changed(forward[2], frame=0))
                    res.decision, res.reason = self._drain(crash), forward[2].origin
            if res.decision is not None:
                pass
            elif res.final:
                res.reason = (f"the statement failed again after {attempt - 1} retries "
                              f"(max_attempts={self.max_attempts}, DAIFU_MAX_ATTEMPTS)")
            else:
                res.decision, res.reason = self._decide(crash)
            return self._conclude(crash, key, res)
        except KeyboardInterrupt:  # Ctrl-C while a fix was awaited: give up, as asked
            self._give_up(crash, "interrupted (Ctrl-C) while waiting for a fix")
            return RAISE_CODE
        except SystemExit as exit_:  # a rule (or console code) asked the program to exit
            self._give_up(crash, f"a fix called sys.exit({exit_.code!r})")
            if exit_.__context__ is None:
                exit_.__context__ = exc
            return (exit_,)  # raised where the statement failed: finally blocks run
        except BaseException:
            self._internal("engine", crash)
            self._give_up(crash, "daifu failed while handling the crash (see daifu.internal_error)")
            return RAISE_CODE

    def _decide(self, crash: Crash) -> tuple[Decision | None, str]:
        decision = self._drain(crash)
        if decision is not None:
            return decision, "queued patch"
        if self.replay is not None:
            try:
                self.replay.offer(crash)
            except Exception:
                self._internal("replay", crash)
            decision = self._drain(crash)
            if decision is not None:
                return decision, "replay"
        standing = self.always.get(always_key(crash))
        if standing is not None:  # `always DECISION`: this crash's fix, again
            decision, execs, origin = standing
            for patch in execs:
                crash.patches.put(ExecPatch(patch.code, origin=origin, frame=patch.frame))
            crash.patches.put(DecisionPatch(decision, origin=origin))
            decision = self._drain(crash)
            if decision is not None:
                return decision, origin
        for rule in self.rules.matching(crash):
            release_held()  # (what the rule prints comes after the crash's line)
            self._tls.origin = rule.origin
            try:
                verdict = rule.fn(crash)
            except Exception as err:
                import traceback  # lazy: 4.2 ms

                emit(RuleFailed(rule=rule.origin, where=crash.where,
                                error=exception_text(err, with_type=True),
                                traceback="".join(traceback.format_exception(err))))
                continue
            finally:
                self._tls.origin = None
            pending_decision = self._drain(crash)
            if pending_decision is not None:
                return pending_decision, rule.origin
            if verdict is None:
                continue
            scope = "rank"
            if isinstance(verdict, AllRanks):
                verdict, scope = verdict.decision, "job"
            if not isinstance(verdict, Decision):
                emit(PatchRejected(where=crash.where, kind="decision", origin=rule.origin,
                                   reason=f"a rule returns daifu.RETRY, daifu.SKIP, daifu.ABORT "
                                          f"or None, not {verdict!r}"))
                continue
            crash.patches.put(DecisionPatch(verdict, origin=rule.origin, scope=scope))
            decision = self._drain(crash)
            if decision is not None:
                return decision, rule.origin
        if self.waiters and self.rules.target_a_caller(
                crash, lambda code: cells_of(code) is not None):
            # a rule is waiting for it up the stack (first-call vaccination
            # takes a crash first in the helper that raised it): no human yet
            return None, "a rule for a vaccinated caller gets it first"
        if self.waiters:  # a human is asked: what was held back is written first
            self._to_human()
        waited = None
        for waiter in list(self.waiters):
            try:
                with live(signal.SIGINT, signal.SIGTERM):  # (Ctrl-C at the console, preemption)
                    waited = waiter.wait(crash, self)
            except Exception:
                self._internal("waiter", crash)
            decision = self._drain(crash)
            if decision is not None:
                return decision, "interactive"
        if waited and waited != PASSED_ON:
            # a human was asked and did not fix it (the wait expired, ...): that is
            # final -- callers' barriers must not wait again for the same exception
            crash.resolution.final = True
        if waited:
            return None, waited
        if not len(self.rules) and not self.waiters:
            return None, "no fix available (no rules registered, no console)"
        return None, "no rule fixed it"

    def _conclude(self, crash: Crash, key, res: Resolution) -> int | tuple:
        """The stub's answer, made from ``res`` alone: a code (retry, skip,
        continue, raise), a continuation call, or an exception to raise."""
        decision, reason, upward = res.decision, res.reason, res.upward
        if upward is not None:  # the decision is for a caller: hand the exception up
            self._forward[id(crash.exception)] = upward
            passing[2] = False  # (the stubs ask their barriers until it is delivered)
            self._record("outcome", crash, "pass", f"to caller frame {upward[2].frame}")
            self._count("passed", 1)
            what = upward[2].decision.value if isinstance(upward[2], DecisionPatch) \
                else upward[2].kind
            emit(CrashPassed(where=crash.where, exc_type=type(crash.exception).__qualname__,
                             reason=f"{what} in caller frame {upward[2].frame} "
                                    f"({upward[1].f_code.co_qualname})"))
            return RAISE_CODE
        if decision is RELOAD:
            result = res.reload
            if result is not None and result.continuation is not None:
                self._count("recovered", 0 if is_break(crash.exception) else 1)
                emit(CrashResumed(where=crash.where, action="reload", attempt=crash.attempt,
                                  latency_ms=_ms(crash.started)))
                return tuple(result.continuation)  # (function, args): the frame returns it
            if crash.can_retry:
                decision = RETRY
            else:
                decision, reason = None, f"reloaded, but {crash.retry_reason}"
        self._record("outcome", crash, (decision.value if decision else "no-fix"), reason)
        if decision is RETRY or decision is SKIP or decision is CONTINUE:
            # counted as recovered now; a retry that fails again takes it back
            pause = is_break(crash.exception)
            self._count("recovered", 0 if pause else 1)
            self._passed = None
            emit(CrashResumed(where=crash.where, action=decision.value, attempt=crash.attempt,
                              latency_ms=_ms(crash.started),
                              note=crash.retry_note if decision is RETRY else None,
                              passed_through=crash.passed_through,
                              **_taken(crash)))
            resumed = res.continuation
            if resumed is not None and decision is not SKIP:
                return resumed  # (function, args): the loop goes on with another iterator
            if decision is SKIP:
                return SKIP_CODE
            if decision is CONTINUE:
                return CONTINUE_CODE
            if pause:
                return RETRY_CODE  # (no attempt to count: the statement had not started)
            with self._lock:
                self._pending[key] = _Pending(crash.attempt, crash.started,
                                              threading.get_ident())
                passing[2] = False  # (the stubs ask their barriers until it is over)
                while len(self._pending) > _MAX_PENDING:  # stale entries of finished retries
                    self._pending.pop(next(iter(self._pending)))
            return RETRY_CODE
        if is_break(crash.exception):  # a pause never gives up: the job goes on here
            return RETRY_CODE
        passable = decision is None and not res.final and (self.rules or self.waiters)
        if passable and _vaccinated_caller(crash.frame):
            # nobody fixed it here: a vaccinated caller gets its turn (a rule may
            # target it); an explicit ABORT, by contrast, is final
            self._count("passed", 1)
            self._passed = (crash.exception,
                            [*crash.passed_through, f"{crash.where} ({crash.function})"])
            emit(CrashPassed(where=crash.where, exc_type=type(crash.exception).__qualname__,
                             reason=reason))
            return RAISE_CODE
        self._give_up(crash, "aborted by a fix" if decision is ABORT else reason)
        return RAISE_CODE

    def _give_up(self, crash: Crash, reason: str) -> None:
        exc = crash.exception
        if not self.waiters and reason.startswith(("no fix available", "no rule fixed it")):
            # a job nobody is asked about (headless, no --wait): say how to make it wait
            reason += ("; to keep a crash waiting for a fix, run with --wait SECONDS "
                       "(DAIFU_WAIT), then: python -m daifu attach PID")
        self.gave_up.add(exc, crash.frame)
        self._count("gave_up", 1)
        self._passed = None
        emit(CrashGaveUp(where=crash.where, exc_type=type(exc).__qualname__, reason=reason,
                         attempt=crash.attempt, passed_through=crash.passed_through,
                         **_taken(crash)))
        if self.checkpoint and len(self.checkpoints) < MAX_CHECKPOINTS:
            self.save_checkpoint(crash)

    # -- patches ---------------------------------------------------------------

    # -- repeated crashes (``_repeats``) ---------------------------------------------

    # -- diagnostics -----------------------------------------------------------------

    def configure(self, settings: EngineSettings) -> None:
        """Take ``settings`` as the engine's whole configuration."""
        self.settings = settings

    def reset(self) -> None:
        """Forget rules, retries, give-ups, waiters, counters, journal and
        replay (part of ``RUNTIME.reset()``): configured from the environment."""
        self.settings = EngineSettings.from_env()
        self.rules.clear()
        self.repeats.clear()
        self._pending.clear()
        self._forward.clear()
        self._passed = None
        self.gave_up.clear()
        self.stats.clear()


def _break_waiter():
    """Who a pause waits for when the job has no waiter of its own (headless,
    no --wait): the control endpoint, until told -- pausing was asked for."""
    from .human._waiter import Waiter  # lazy: 4.4 ms

    return Waiter(console=sys.stdin.isatty() and sys.stderr.isatty(), wait=None)


def _in_retry_copy(cell: Cell, frame: types.FrameType, lasti: int) -> bool:
    """Did the failing instruction belong to the cell's retry copy?  (Or to
    none of its instructions at all: an exception handed to the cell's stub
    from elsewhere -- 3.13's inlined comprehensions -- counts as its retry's
    while a retry is pending.)"""
    back, _ = backend()
    if back is None:
        return False
    found = cell_range(cell.info, frame.f_code, back.lasti_offset(lasti))
    if found is None or found[2] is not cell:
        return True
    return found[3]


def _vaccinated_caller(frame: types.FrameType) -> bool:
    f = frame.f_back
    while f is not None:
        if cells_of(f.f_code) is not None:
            return True
        f = f.f_back
    return False


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000.0, 3)


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


ENGINE = Engine()


def replace(target: Any, new: Any) -> None:
    """Give function (or method) ``target`` the code of ``new``.

    Every reference to ``target`` -- module attributes, bound methods, objects
    holding it -- runs the new code from its next call; the new code runs with
    ``target``'s globals and closure.  If ``target`` was vaccinated, the new
    code is vaccinated too.  A call of ``target`` that is running right now
    keeps its old code: at a crash, a retry then re-executes that call in its
    nearest vaccinated caller, which calls the new code.  Raises
    ``PatchError`` when the code cannot be swapped (a builtin, different
    closure variables).
    """
    ENGINE.submit(ReplacePatch(target, new))
