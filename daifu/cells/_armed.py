"""Armed code: a function vaccinated at its first exception, in its own frame.

Rewriting a function in full -- its cells, their stubs and retry copies --
takes about a millisecond, and code is run far more often than it fails: a
program importing 600 functions paid most of a second before its first line.
So at import a function is only *armed* (``_rewrite._core.arm``): its
original instructions, unchanged and at the same offsets, with each cell's
exception-table entry pointed at a *trap* shared by the cells of one base
depth and handler.  A trap is the shared part of a vaccinated stub
(``_rewrite._emit._group_items``) with one difference: it calls ``upgrade``
(``_cell.P_UPGRADE``) where a stub calls the barrier.  An exception the
program's own ``except`` takes, or one passing on to a handler a barrier
found, never calls it: armed code handles those as vaccinated code does.

The first exception that reaches a trap makes the function's vaccinated code
(``complete``: the full rewrite of the original, with the same instructions
before the traps), and then *moves the frame onto it* (``upgrade``): the
frame is suspended in the Python call of the upgrade, made by the trap, so
it returns through its interpreter frame, which holds the code it runs and
where a return goes on.  Both are set to the vaccinated code's stub for the
failing cell, at the point just after its own barrier call, whose stack the
trap has built alike (the same shared stub part).  The upgrade then asks the
barrier and returns its answer: from there on the frame is vaccinated code
answering a barrier call -- the retry copy, skip or continue, the re-raise
under the original handler -- and the function object gets the new code for
its next calls.  ``_readback.trap_path`` checks the two layouts against each
other and the frame module (``swap_code``) the frame's layout; anything
unexpected leaves the frame on its armed code and the exception goes on as
without daifu (the function's next calls are vaccinated).

A frame only returns through its interpreter frame when the trap's call of
the upgrade was a plain Python call: with a PEP 523 frame evaluator set
(TorchDynamo's, inside a compiled region) it is not, and that first
exception goes on unprotected in that frame.  Generators are vaccinated at
once (a generator's frame belongs to it).  ``cells_of`` makes the cells of
armed code when anything asks for them (the engine's walk over callers, a
report): the rewrite, without moving any frame.
"""

from __future__ import annotations

import threading
import types
import warnings

from .._errors import NotVaccinatedWarning
from .._record import field
from .._runtime import RUNTIME, state_record
from . import _registry
from ._cell import CodeInfo, info_of, use_completion
from ._dispatch import backend

_CO_OPTIMIZED = 0x1  # a function's code (module and class bodies are not)
_TRANSIENT = (RecursionError, MemoryError)


@state_record
class _Armed:
    """The lock under which armed code is completed (one rewrite per code)."""

    lock: threading.RLock = field(default_factory=threading.RLock)


_state = RUNTIME.part(__name__, _Armed())


def complete(info: CodeInfo, armed: types.CodeType, ahead: bool = False) -> types.CodeType | None:
    """The vaccinated code of ``armed`` (``info``'s): made once, its cells in
    ``info``; None (with a warning, once) if it cannot be made -- the armed
    code then runs as the original would.  ``ahead`` (of any exception:
    ``complete_running``): no warning, and the next call tries again."""
    with _state.lock:
        if info.upgraded is not None:
            return info.upgraded
        if info.refused is not None:
            return None
        back, _ = backend()
        try:
            new, reason = _rewrite(info, armed), None
        except Exception as exc:  # (``Unsupported``: said why; anything else is daifu's)
            if isinstance(exc, _TRANSIENT) or isinstance(exc.__cause__, _TRANSIENT):
                info.cells.clear()  # (at the recursion limit: the next exception tries again)
                return None
            new, reason = None, str(exc) or type(exc).__name__
        if new is None:
            info.cells.clear()
            if ahead:  # (a function that may never fail: said if one does)
                return None
            info.refused = reason or "its source code is not available"
            try:
                warnings.warn(f"daifu: {info.qualname} ({info.filename}:{info.firstlineno}) "
                              f"is not vaccinated and runs unmodified: {info.refused}",
                              NotVaccinatedWarning, stacklevel=3)
            except Exception:  # (-W error: the warning is the program's to see, not to raise)
                pass
            return None
        assert back is not None  # (``_rewrite`` made code: there is a backend)
        info.upgraded, info.ranges, info.armed_end = new, None, back.armed_end(armed)
        return new


#: the largest armed code (bytes of instructions) ``complete_running`` makes
#: vaccinated ahead of a crash (a module of thousands of statements: at the
#: crash, as before)
AHEAD_MAX_BYTES = 8192


def complete_running(frame: types.FrameType | None) -> None:
    """Make now the vaccinated code of the armed functions running at
    ``frame`` and below it (the loop and its callers: what a crash passes
    through, whose cells the engine asks for) -- what ``cells_of`` makes at
    a crash, ahead of it (``engine._preload``).  No frame is moved: the
    first crash in one moves it (``upgrade``) without a rewrite.  Never
    raises."""
    while frame is not None:
        code = frame.f_code
        try:
            info = info_of(code)
            if info is not None and info.armed and info.upgraded is None \
                    and info.refused is None and len(code.co_code) <= AHEAD_MAX_BYTES:
                complete(info, code, ahead=True)
        except Exception:  # (the crash makes it, or says why it cannot)
            pass
        frame = frame.f_back


def _rewrite(info: CodeInfo, armed: types.CodeType) -> types.CodeType | None:
    back, _ = backend()
    original = info.original
    loaded = _registry.get(original.co_filename) if original is not None else None
    msrc = loaded.msrc if loaded is not None else None
    scope = msrc.scope_for(original) if msrc is not None and original is not None else None
    if back is None or msrc is None or scope is None or original is None:
        return None
    # the functions nested in it: armed too, in the same places of co_consts
    children = {id(o): a for o, a in zip(original.co_consts, armed.co_consts)
                if o is not a and type(o) is types.CodeType}
    info.cells.clear()
    return back.rewrite(original, info, msrc, scope, children)


def upgrade(frame: types.FrameType, mark: tuple, lasti: int,
            helper: types.FrameType | None) -> tuple | None:
    """Vaccinate the armed code ``frame`` runs and move the frame onto it
    (see the module docstring): the constant of the failing cell's stub in
    the vaccinated code, the frame now suspended just after that stub's
    barrier call; None if the frame stays on its armed code.  ``helper``:
    the frame of the function the trap called (and that calls this), which
    must return into ``frame`` through its interpreter frame; None: the
    function gets its vaccinated code for its next calls, the frame is left
    as it is."""
    armed = frame.f_code
    info = info_of(armed)
    if info is None or not info.armed or type(mark) is not tuple or mark[1] != info.key:
        return None
    new = complete(info, armed)
    if new is None:
        return None
    back, _ = backend()
    assert back is not None  # (``complete`` made code: there is a backend)
    if armed.co_flags & _CO_OPTIMIZED:
        func = back.running_function(frame)
        if func is not None and func.__code__ is armed:
            try:
                func.__code__ = new  # (its next calls run vaccinated code)
            except ValueError:  # pragma: no cover - the same free variables: never
                pass
    if helper is None or back.called_from_c(helper) is not False \
            or new.co_stacksize > armed.co_stacksize \
            or new.co_nlocals != armed.co_nlocals:
        return None
    path = back.trap_path(armed, new, lasti)
    if path is None:
        return None
    ref, call_old, resume_old, call_new, resume_new = path
    if not back.swap_code(frame, new, call_old, resume_old, call_new, resume_new):
        return None
    return ref


def handlers_code(code: types.CodeType) -> types.CodeType:
    """The code whose exception table holds the program's own handlers
    around ``code``'s instructions: for armed code (whose table leads its
    cells to traps) the original, where its instructions are where armed
    code has them, else the vaccinated code (made now); ``code`` itself
    otherwise."""
    info = info_of(code)
    if info is None or not info.armed or code is info.upgraded:
        return code
    original = info.original
    back, _ = backend()
    if original is not None and back is not None \
            and back.armed_end(code) == len(original.co_code) + 2:  # (its NOP after them)
        return original
    new = complete(info, code)
    return new if new is not None else code


def trap_of(code: types.CodeType, offset: int) -> tuple | None:
    """The constant of the trap that byte ``offset`` of armed code leads to
    (the very object its traps load: the stubs compare it by identity), or
    None (not armed code, or no cell holds it)."""
    info = info_of(code)
    if info is None or not info.armed or code is info.upgraded:
        return None
    back, _ = backend()
    mark = back.trap_at(code, offset) if back is not None else None
    if mark is None or mark[1] != info.key or not 0 <= mark[2] < len(info.traps):
        return None
    return mark


def armed_guards(code: types.CodeType, offset: int) -> tuple | None:
    """The program's handlers around byte ``offset`` of armed code, when a
    cell holds it (its trap's group's: what the cell's ``guards`` will be),
    without making the cells; None otherwise (not armed, or not a cell's)."""
    mark = trap_of(code, offset)
    if mark is None:
        return None
    info = info_of(code)
    assert info is not None  # (``trap_of`` found it)
    return info.traps[mark[2]]


use_completion(complete)
