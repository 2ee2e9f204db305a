"""The two functions the rewritten bytecode calls.  Both are entered only
after an exception (``barrier``) or after a retried statement completed
(``resumed``); the normal execution path never reaches them."""

from __future__ import annotations

import sys

from ..cells._cell import Cell
from ._engine import ENGINE, RAISE_CODE


def barrier(exc: BaseException, cell: Cell, lasti: int, stack: tuple) -> int:
    """Crash barrier: return 0 (retry), 1 (skip) or 2 (re-raise the exception
    exactly as it was).  Never raises."""
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
