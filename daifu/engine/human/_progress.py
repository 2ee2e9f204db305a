"""Progress displays step aside while the console has the terminal.

A rich ``Live`` display (Lightning's ``RichProgressBar``) repaints from its
own thread several times a second: over the ``(daifu)`` prompt, so typed
text was invisible.  tqdm bars leave a half-drawn line that the report
would start on.  While the console runs, live displays are stopped and bars
cleared; after it, they are started and drawn again.  Nothing here imports
rich or tqdm: only displays the program already made are touched.
"""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Iterator
from typing import Any


def _live_displays() -> list[Any]:
    live = sys.modules.get("rich.live")
    kind = getattr(live, "Live", None)
    if kind is None:
        return []
    return [obj for obj in gc.get_objects()
            if isinstance(obj, kind) and getattr(obj, "is_started", False)]


def _bars() -> list[Any]:
    std = sys.modules.get("tqdm.std")
    kind = getattr(std, "tqdm", None)
    if kind is None:
        return []
    try:
        return [bar for bar in list(getattr(kind, "_instances", ())) if not bar.disable]
    except Exception:
        return []


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Stop live displays and clear progress bars for the block; then put
    them back.  Never raises for a display that will not cooperate."""
    lives, bars = [], []
    for display in _live_displays():
        try:
            display.stop()
            lives.append(display)
        except Exception:
            continue
    for bar in _bars():
        try:
            bar.clear()
            bars.append(bar)
        except Exception:
            continue
    try:
        yield
    finally:
        for display in lives:
            try:
                display.start(refresh=True)
            except Exception:
                pass
        for bar in bars:
            try:
                bar.refresh()
            except Exception:
                pass
