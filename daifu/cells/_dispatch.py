"""Pick the bytecode rewrite for the running interpreter.

One small module per CPython version (``_py311`` ...), each asserting its
version.  An interpreter daifu does not know gets ``None`` and a reason: the
caller warns and runs the original code.
"""

from __future__ import annotations

import sys

from ._backend import Backend

SUPPORTED = ((3, 11), (3, 13))


def backend(version: tuple[int, int] | None = None) -> tuple[Backend | None, str | None]:
    """Return ``(module, None)`` for a supported interpreter, else ``(None, reason)``."""
    ver = version or sys.version_info[:2]
    running = sys.version_info[:2]
    if ver == (3, 11) and running == (3, 11):
        from . import _py311

        return _py311, None
    if ver == (3, 13) and running == (3, 13):
        from . import _py313

        return _py313, None
    known = ", ".join(f"{a}.{b}" for a, b in SUPPORTED)
    return None, (
        f"daifu does not know the bytecode of Python {ver[0]}.{ver[1]} (supported: {known}); "
        "the program runs unmodified, without crash interception"
    )
