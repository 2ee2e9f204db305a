"""The function the rewritten bytecode calls: only after an exception, never
on the normal execution path."""

from __future__ import annotations

import sys
import types

from ..cells import RAISE_CODE, jump_answer, resolve
from ..cells._cell import _INFOS
from ._engine import ENGINE
from ._guards import caught_above, known_route, passing, remember_route, take_passing

# ``passing`` (imported above) is read by the stubs by name, as the builtin
# ``cells._cell.PASSING`` (``cells.use_barrier`` installs it)
__all__ = ["barrier", "passing"]


def barrier(exc: BaseException, ref: tuple, lasti: int, stack: tuple) -> int | tuple:
    """Crash barrier, called by the stub of the cell ``ref`` names
    (``cells.resolve``): return one of ``_cell``'s answers (``RAISE_CODE``:
    re-raise the exception exactly as it was; a retry, skip or continue as
    the number the stub of that very cell dispatches on).  Never raises."""
    try:
        if passing[0] is not None:
            passing[0] = passing[1] = None
        frame = sys._getframe(1)
        # this cell's exception takes the route a search found to a sure
        # catch before, and the engine is quiet: on to that handler, nothing
        # else asked (the commonest call, from a loop of EAFP code)
        catcher = known_route(exc, ref, frame)  # (its stub's constant)
        if catcher is not None and passing[2]:
            passing[1] = catcher
            passing[0] = exc
            return RAISE_CODE
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
                if taken[1] is not None and not cell.guards:
                    remember_route(ref, exc, frame, taken[0], taken[1])
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
