"""The function the rewritten bytecode calls: only after an exception, never
on the normal execution path."""

from __future__ import annotations

import operator
import os
import sys
import threading
import types
from collections.abc import Callable

from .._runtime import RUNTIME, state_record
from ..cells import INFOS as _INFOS
from ..cells import (
    RAISE_CODE,
    WithGuard,
    armed_guards,
    jump_answer,
    resolve,
    target_files,
    upgrade,
)
from ._engine import _NOT_CRASHES, ENGINE
from ._fastpath import ROUTES, passing, remember_route
from ._guards import caught_above, handled_above, take_passing, take_through, would_catch
from ._signals import deliver, hold, release
from .human._break import is_break

_getframe = sys._getframe
_get_ident = threading.get_ident
#: the main thread: the only one Python runs signal handlers on
_MAIN = threading.main_thread().ident

# ``passing`` (imported above) is read by the stubs by name, as the builtin
# ``cells._cell.PASSING`` (``cells.use_barrier`` installs it)
__all__ = ["NO_QUICK_CHECK", "barrier", "entry", "judge", "passing", "upgraded"]

#: what the stubs call first where daifu's C extension is not there (the
#: C ``_routes.quick``'s place): a builtin that answers False to ``(exc,
#: ref)`` -- "ask the barrier", whose Python route check follows
NO_QUICK_CHECK: Callable = operator.is_


@state_record
class _Entry:
    """Which barrier the stubs call (``RUNTIME.parts``)."""

    #: where ``entry`` put the route check: "in C", or "in Python: <why>"
    #: (``python -m daifu --version`` says it)
    check: str = ""


_state = RUNTIME.part(__name__, _Entry())


def entry() -> tuple[Callable, Callable]:
    """What the stubs call: the barrier and the quick check they call
    before it.  The C ``_routes.barrier`` and ``_routes.quick`` when daifu's
    extension is built (and ``DAIFU_SPEEDUPS`` is not ``0``), else
    ``barrier`` and ``NO_QUICK_CHECK``.  Both barriers first check the
    exception's remembered route (``_fastpath.ROUTES``), then hand anything
    else to ``judge``; in C the check takes a fraction of its time in
    Python, and ``quick`` makes it before the stub suspends tracing
    (docs/performance.md, "Handled exceptions", has both)."""
    if os.environ.get("DAIFU_SPEEDUPS", "1") == "0":
        _state.check = "in Python: DAIFU_SPEEDUPS=0"
    elif getattr(sys, "_is_gil_enabled", lambda: True)() is False:
        # the C check reads borrowed references under the GIL, and importing
        # it would turn the GIL back on for the program
        _state.check = "in Python: a free-threaded build"
    else:
        try:
            from . import _routes  # type: ignore[attr-defined,unused-ignore]  # (C)  # lazy: 0.0 ms
        except ImportError:
            _state.check = ("in Python: daifu/engine/_routes.c was not built "
                            "(no C compiler at install?)")
        else:
            _state.check = "in C"
            c_barrier, quick = _routes.install(ROUTES, passing, judge, RAISE_CODE)
            return c_barrier, quick
    return barrier, NO_QUICK_CHECK


def barrier(exc: BaseException, ref: tuple, lasti: int, stack: tuple) -> int | tuple:
    """Crash barrier, called by the stub of the cell ``ref`` names
    (``cells.resolve``): return one of ``_cell``'s answers (``RAISE_CODE``:
    re-raise the exception exactly as it was; a retry, skip or continue as
    the number the stub of that very cell dispatches on).  Never raises.
    (The C ``_routes.barrier`` is the same function.)"""
    # the end of an iteration (a class's ``__next__`` ending a ``for``):
    # never a crash (``_engine._NOT_CRASHES``); while the engine is quiet,
    # nothing else to ask
    if (type(exc) is StopIteration or type(exc) is StopAsyncIteration) and passing[2]:
        return RAISE_CODE
    frame = _getframe(1)
    try:
        # this cell's exception takes the route a search found to a sure
        # catch before, and the engine is quiet: on to that handler, nothing
        # else asked (the commonest call, from a loop of EAFP code).  The
        # check of ``_fastpath.ROUTES``, written out: identity and offset reads
        route = ROUTES.get(ref)
        if route is not None and route[0] is type(exc) and passing[2] \
                and route[1] is frame.f_code:
            f: types.FrameType = frame
            for code, at in route[2]:  # the callers up to the handler
                f = f.f_back  # type: ignore[assignment]
                if f is None or f.f_code is not code or f.f_lasti != at:
                    break
            else:  # what its ``except name:`` holds now (``LOAD_GLOBAL``)
                name, g = route[3], f.f_globals
                if name is None:  # (into C code at the caller's call, as before)
                    return RAISE_CODE
                if type(name) is str:
                    held = (g[name] if name in g else f.f_builtins.get(name)) is route[4]
                else:  # ``except (A, B):``: each name (a loop: a generator costs ~1 us)
                    held, i = True, 0
                    for n in name:
                        if (g[n] if n in g else f.f_builtins.get(n)) is not route[4][i]:
                            held = False
                            break
                        i += 1
                if held:
                    passing[1] = route[5]  # (the handler's frame's stub)
                    passing[0] = exc
                    return RAISE_CODE
    except Exception:  # (a globals dict of the program's own class that raised)
        pass
    return judge(exc, ref, lasti, stack, frame)


def judge(exc: BaseException, ref: tuple, lasti: int, stack: tuple,
          frame: types.FrameType) -> int | tuple:
    """The barrier's answer for an exception that took no remembered route,
    in ``frame`` (the stub's).  Never raises.  On the main thread the
    program's signals are held back meanwhile (``_signals``): a handler
    never runs, nor raises, in daifu's code."""
    if _get_ident() != _MAIN:
        return _judge(exc, ref, lasti, stack, frame)
    hold()
    try:
        answer = _judge(exc, ref, lasti, stack, frame)
    finally:
        late = release()  # (with the C module: delivered where the program runs next)
    return _deliver(late, frame, lasti, answer) if late else answer


def _deliver(late: list[int], frame: types.FrameType, lasti: int,
             answer: int | tuple) -> int | tuple:
    """The signals that came while the program's were held, delivered now
    (without the C module): one that raises makes the answer raise it here,
    at the failing statement."""
    raised = deliver(late, frame)
    if raised is None:
        return answer
    ENGINE.drop_pending(frame)
    raised.__traceback__ = types.TracebackType(
        raised.__traceback__, frame, 2 * lasti, frame.f_lineno or 0)
    return (raised,)


def upgraded(exc: BaseException, mark: tuple, lasti: int, stack: tuple) -> int | tuple:
    """What the trap of an armed function calls (``cells._armed``): the
    function is vaccinated and this frame moved onto its vaccinated code,
    just after the barrier call of the failing cell's stub, where this
    answer lands -- the barrier's (``judge``).  Where the frame cannot be
    moved, "re-raise": this exception goes on as without daifu, and the
    function's next calls are vaccinated.  An exception a caller handles
    (``caught_above``: armed callers answer from their traps' handlers)
    is re-raised at once, and the function stays armed.  Never raises."""
    frame = _getframe(1)
    main = _get_ident() == _MAIN
    if main:
        hold()  # (the rewrite is Python code too: no handler of the program runs in it)
    answer: int | tuple = RAISE_CODE
    try:
        if _handled(exc, frame, lasti) is None:
            try:
                ref = upgrade(frame, mark, lasti, _getframe(0))
            except BaseException:  # daifu must never make a crash worse
                ref = None
            if ref is not None:
                answer = _judge(exc, ref, lasti, stack, frame)
        else:
            _handled_again(frame, mark, lasti)
    finally:
        late = release() if main else []
    return _deliver(late, frame, lasti, answer) if late else answer


#: exceptions the program handles at an armed function's traps before it is
#: vaccinated for its next calls (whose handled exceptions then take the
#: remembered routes, in C): one that raises now and then stays armed
HANDLED_BEFORE_UPGRADE = 16


def _handled_again(frame: types.FrameType, mark: tuple, lasti: int) -> None:
    info = _INFOS.get(mark[1]) if type(mark) is tuple and len(mark) == 3 else None
    if info is None:
        return
    info.handled += 1
    if info.handled == HANDLED_BEFORE_UPGRADE and not profiled():
        try:
            upgrade(frame, mark, lasti, None)  # (the function's next calls; not this frame)
        except Exception:
            pass


#: the modules of profilers that count calls by code object
_PROFILERS = ("_lsprof", "profile", "yappi")


def profiled() -> bool:
    """A profiler may be watching: one is set (``sys.setprofile``; 3.12+:
    cProfile is a ``sys.monitoring`` tool), or a profiler's module is loaded
    (on 3.11 the trap has switched the profiler off while daifu runs).  It
    counts calls by code object: a function given its vaccinated code
    mid-run would be two functions of one name, the later replacing the
    earlier in ``pstats`` (the function stays armed); and on 3.12+ it sees
    daifu's Python (the preload does no rewrite ahead then)."""
    if sys.getprofile() is not None or any(name in sys.modules for name in _PROFILERS):
        return True
    monitoring = getattr(sys, "monitoring", None)
    return monitoring is not None and monitoring.get_tool(monitoring.PROFILER_ID) is not None


def _handled(exc: BaseException, frame: types.FrameType, lasti: int) -> int | None:
    """``RAISE_CODE`` for an exception that is no crash at an armed frame,
    while nothing is in flight (the engine's ``_is_crash``, without the
    cell): the end of an iteration, one given up below, one an ``except``
    of the frame's own around the failing instruction or a caller handles
    (or a vaccinated caller will decide); else None (the upgrade, then the
    barrier's judgement)."""
    try:
        if passing[0] is not None:
            passing[0] = passing[1] = None
        if ENGINE._pending or ENGINE._forward or not isinstance(exc, Exception):
            return None
        if isinstance(exc, _NOT_CRASHES) or ENGINE.gave_up.seen(exc, frame):
            return RAISE_CODE
        own = armed_guards(frame.f_code, 2 * lasti)
        if own and would_catch(own, exc, frame, None) is True \
                or caught_above(exc, frame) or handled_above(frame, exc, target_files()):
            taken = take_passing()
            if taken is not None and ENGINE.quiet():  # (the stubs between let it pass)
                passing[1], passing[0] = taken[0], exc
            return RAISE_CODE
    except Exception:  # (the walk failed: a RecursionError at the limit): as a stub's
        return RAISE_CODE  # barrier call that fails, re-raise
    return None


def _judge(exc: BaseException, ref: tuple, lasti: int, stack: tuple,
           frame: types.FrameType) -> int | tuple:
    try:
        if passing[0] is not None:
            passing[0] = passing[1] = None
        # the program's own exception on its way to the frame a barrier below
        # found to catch it (``caught_above``): re-raise at once
        if caught_above(exc, frame) and not ENGINE._pending and not ENGINE._forward:
            return RAISE_CODE
        try:  # (``cells.resolve``, inlined: this runs for every exception a cell sees)
            cell = _INFOS[ref[1]].cells[ref[2]]
            if cell.index != ref[2]:
                raise LookupError
        except Exception:
            cell = resolve(ref)
            if cell is None:  # code of a vaccination this process does not know
                return RAISE_CODE
        answer = ENGINE.on_exception(exc, cell, lasti, stack, frame)
        passing[2] = quiet = ENGINE.quiet()
        if isinstance(answer, int):
            if answer != RAISE_CODE:
                return jump_answer(cell.index, answer)
            taken = take_passing()
            if taken is not None and quiet:  # (the stubs between let it pass)
                passing[1] = taken[0]
                passing[0] = exc
                # (a ``with`` around the raise: its ``__exit__`` runs as the
                # exception passes, and catches it or not -- handled either way)
                if taken[1] is not None and all(type(g) is WithGuard for g in cell.guards):
                    remember_route(ref, exc, frame, taken[0], taken[1])
            elif quiet and not cell.guards and not is_break(exc):
                if not (cell.can_retry or cell.can_skip or cell.can_continue):
                    # (nothing can be done at this cell: a ``raise``; the next
                    # vaccinated caller decides, whatever the exception)
                    remember_route(ref, exc, frame, None, ((), None, None))
                else:
                    through = take_through()  # (left for C code that may catch it)
                    if through is not None:
                        remember_route(ref, exc, frame, None, ((through,), None, None))
            return RAISE_CODE
        if len(answer) == 1:  # raised by the stub's re-raise: add this frame's entry
            new = answer[0]
            new.__traceback__ = types.TracebackType(  # (lasti counts 2-byte units)
                new.__traceback__, frame, 2 * lasti, cell.lineno or frame.f_lineno)
        return answer
    except BaseException:  # daifu must never make a crash worse
        try:
            ENGINE._internal("barrier", None)
        except BaseException:
            pass
        return RAISE_CODE
