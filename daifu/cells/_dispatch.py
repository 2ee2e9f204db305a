"""Pick the bytecode rewrite for the running interpreter.

There is one rewrite (``_rewrite``) for every supported version; what differs
between versions is data (``_versions.TABLE``).  An interpreter without a
tested entry gets ``None`` and a reason: the caller warns and runs the
original code.
"""

from __future__ import annotations

import sys

from . import _versions
from ._backend import Backend

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)
if TYPE_CHECKING:
    import types

    from ._cell import Cell, CodeInfo

SUPPORTED = _versions.supported()


def backend(version: tuple[int, int] | None = None) -> tuple[Backend | None, str | None]:
    """Return ``(module, None)`` for a supported interpreter, else ``(None, reason)``."""
    ver = version or sys.version_info[:2]
    if ver == sys.version_info[:2] and _versions.running() is not None:
        from . import _rewrite  # lazy: 0.8 ms

        return _rewrite, None  # type: ignore[return-value]  # (module __getattr__)
    known = ", ".join(f"{a}.{b}" for a, b in SUPPORTED)
    return None, (
        f"daifu does not know the bytecode of Python {ver[0]}.{ver[1]} (supported: {known}); "
        "the program runs unmodified, without crash interception"
    )


def flat_arming() -> str:
    """How flat code is armed here (``_rewrite._flat``): its walk in C or
    in Python, its trap laid out ahead of time for this interpreter's
    bytecode or by the rewrite (``bytecode`` imported)."""
    if _versions.running() is None:
        return "not at all (an unsupported Python)"
    from ._rewrite import _flat  # lazy: 2.1 ms

    walk = "in Python" if _flat.flat_start is _flat.py_flat_start else "in C"
    trap = ("its trap laid out ahead of time" if _flat._TAIL is not None  # noqa: SLF001
            else "its trap laid out by the rewrite (none ahead of time for this bytecode)")
    return f"{walk}, {trap}"


def cell_at(info: CodeInfo, code: types.CodeType, offset: int) -> Cell | None:
    """The cell whose instructions include byte ``offset`` of rewritten ``code``."""
    found = cell_range(info, code, offset)
    return found[2] if found is not None else None


def cell_range(info: CodeInfo, code: types.CodeType, offset: int
               ) -> tuple[int, int, Cell, bool] | None:
    """(start, stop, cell, in its retry copy) of the range holding ``offset``
    (of armed code: its vaccinated code's, below its traps; ``_armed``)."""
    if info.armed and code is not info.upgraded:
        if info.upgraded is None or offset >= info.armed_end:
            return None
        code = info.upgraded
    if info.ranges is None:
        back, _ = backend()
        info.ranges = back.cell_ranges(code) if back is not None else []
    for found in info.ranges:
        if found[0] <= offset < found[1]:
            return found
    return None
