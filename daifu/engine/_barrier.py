"""The functions the rewritten bytecode calls.  They are entered only after
an exception (``barrier``), after a retried statement completed (``resumed``)
or to continue in reloaded code (``take_continuation``); the normal execution
path never reaches them."""

from __future__ import annotations

import sys

from ..cells._cell import RAISE_CODE, Cell
from ._engine import ENGINE


def barrier(exc: BaseException, cell: Cell, lasti: int, stack: tuple) -> int:
    """Crash barrier: return one of ``_cell``'s ``*_CODE`` answers (``RAISE_CODE``:
    re-raise the exception exactly as it was).  Never raises."""
    try:
        return ENGINE.on_exception(exc, cell, lasti, stack, sys._getframe(1))
    except BaseException:  # daifu must never make a crash worse
        try:
            ENGINE._internal("barrier", None)
        except BaseException:
            pass
        return RAISE_CODE


def take_continuation() -> tuple:
    """(function, args) to continue a reloaded running function in new code."""
    return ENGINE.take_continuation()


def resumed(cell: Cell) -> None:
    """A retried statement completed."""
    try:
        ENGINE.on_resumed(cell, sys._getframe(1))
    except Exception:
        pass
