"""The retries in flight: while one is remembered the engine is not quiet, and
the stubs ask the barrier about every handled exception; a retry that is
over -- its statement succeeded, or will not run -- is forgotten."""

from __future__ import annotations

import threading
import types

from ..cells import (
    backend,
    cell_range,
)
from ._fastpath import passing
from .human._break import armed

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)
if TYPE_CHECKING:
    from typing import Any


class Retries:
    """A part of ``Engine`` (``_engine.py``): see this module."""

    if TYPE_CHECKING:  # (the engine's, used here)
        _forward: Any
        _lock: Any
        _pending: Any

    def quiet(self) -> bool:
        """Nothing a barrier must be asked about for an exception the program
        handles: no retry or forwarded decision in flight, no pause requested
        (``_fastpath.passing``: the stubs pass such exceptions on themselves
        only then; the engine clears its copy whenever it starts to keep any
        of these, the barrier sets it from this)."""
        return not (self._pending or self._forward or armed())

    def _prune_pending(self, frame: types.FrameType) -> None:
        """Forget this thread's retries that are over: a retried statement
        that succeeded leaves no trace (nothing runs on success), and while
        one is remembered the engine is not quiet -- every handled exception
        would be judged in full.  A retry is over when its frame is no longer
        on this thread's stack (below ``frame``), or is there but out of the
        cell's retry copy."""
        me = threading.get_ident()
        mine = [(key, p) for key, p in list(self._pending.items()) if p.thread == me]
        if not mine:
            return
        live: dict[int, types.FrameType] = {}
        f: types.FrameType | None = frame
        while f is not None:
            live[id(f)] = f
            f = f.f_back
        back, _ = backend()
        over = []
        for key, _pending in mine:
            f = live.get(key[0])
            cell = key[1]
            found = (cell_range(cell.info, f.f_code, back.lasti_offset(f.f_lasti))
                     if f is not None and back is not None else None)
            if found is None or found[2] is not cell or not found[3]:
                over.append(key)
        if over:
            with self._lock:
                for key in over:
                    self._pending.pop(key, None)

    def drop_pending(self, frame: types.FrameType) -> None:
        """A retry in ``frame`` will not run after all (a signal's exception is
        raised there instead): forget it, so the stubs pass handled exceptions
        on by themselves again."""
        with self._lock:
            for key in [k for k in self._pending if k[0] == id(frame)]:
                del self._pending[key]
        passing[2] = self.quiet()
