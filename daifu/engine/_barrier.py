"""The function the rewritten bytecode calls: only after an exception, never
on the normal execution path."""

from __future__ import annotations

import sys

from ..cells import RAISE_CODE, Cell
from ._engine import ENGINE


def barrier(exc: BaseException, cell: Cell, lasti: int, stack: tuple) -> int | tuple:
    """Crash barrier: return one of ``_cell``'s answers (``RAISE_CODE``:
    re-raise the exception exactly as it was).  Never raises."""
    try:
        return ENGINE.on_exception(exc, cell, lasti, stack, sys._getframe(1))
    except BaseException:  # daifu must never make a crash worse
        try:
            ENGINE._internal("barrier", None)
        except BaseException:
            pass
        return RAISE_CODE
