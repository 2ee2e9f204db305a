"""The bytecode rewrite (the "in-frame barrier"), one for every CPython
version: what differs between versions is asked of ``_versions.TABLE``.

Nothing is added to the normal execution path.  For every *cell* (a run of one
statement's instructions that can be re-executed from its start) the rewrite

* points the exception table of the cell's instructions at a per-cell *stub*
  appended to the code, with the cell's base stack depth and ``lasti`` pushed.
  CPython then unwinds only to that depth: outer loop iterators, ``with``
  exits and ``except`` state stay on the value stack, the frame stays alive;
* the stub calls the engine's barrier ``barrier(exc, cell, lasti, stackvals)``
  while the frame is suspended and dispatches on its answer (``_cell``'s
  ``*_CODE``): retry, skip, continue, new code; anything else re-raises.  The
  re-raise is a ``RERAISE 1`` covered by the exception-table entry the
  instruction originally had, so the user's handlers, ``with`` exits and
  ``finally`` blocks run exactly as before, with the original traceback and
  ``f_lasti``;
* (3.12+) conditional jumps only go forward: retry copies leave through small
  trampolines; an exhausted ``FOR_ITER`` skips the ``END_FOR``/``POP_TOP`` it
  targets, which the skip and the trampolines account for;
* retry jumps to a *copy* of the cell, appended too: a retried statement that
  fails again has its ``lasti`` in the copy, which is how the engine counts
  attempts without any cost when nothing crashed;
* the engine runs with the program's tracer and profiler suspended (the stub
  switches them off around the barrier call with builtins, which create no
  frames), and daifu's instructions carry no line numbers: a debugger,
  coverage or a profiler sees no event of daifu's.

``_dispatch`` imports this package only on a supported version.  The package
itself holds only frame access; reading rewritten code back (``_readback``)
and the rewrite (``_core``, with the ``bytecode`` library) are imported on
first use of any of their names: a start whose modules all come from the
code cache never imports ``bytecode``, nor does an exception the program
handles, nor does arming code that is all flat (``_flat.arm``).
"""

from __future__ import annotations

import importlib

from .._versions import running

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)
if TYPE_CHECKING:
    from typing import Any

_running = running()
assert _running is not None, "daifu.cells._dispatch imports this only on a supported version"
_entry = _running
PYTHON = _entry.python

#: frame access (one module per frame-layout family, ``_versions``: it builds
#: ctypes structures) and what ``_core`` provides: both imported on first use
_FRAMES = frozenset({"called_from_c", "read_locals", "running_function", "swap_code",
                     "write_locals"})
_LAZY = frozenset({"Continuation", "NothingToProtect", "Unsupported", "c_passes_through",
                   "chain_for_code", "effects", "has_except_handler", "returns_truthy",
                   "rewrite", "plan", "emit", "assemble", "Plan"})
#: reading rewritten code back, without ``bytecode`` (``_readback``)
_READBACK = frozenset({"armed_end", "cell_ranges", "lasti_offset", "trap_at", "trap_path"})

__all__ = ["PYTHON", "Continuation", "NothingToProtect", "Unsupported", "arm", "armed_end",
           "called_from_c",
           "c_passes_through", "cell_ranges", "chain_for_code", "effects", "has_except_handler",
           "lasti_offset", "read_locals", "returns_truthy", "rewrite", "running_function",
           "swap_code", "trap_at", "trap_path", "write_locals"]


def arm(code, info, msrc, scope, replace_consts=None):
    """``_core.arm``; flat code armed by ``_flat.arm``, without ``bytecode``."""
    from . import _flat  # lazy: 2.1 ms

    new, walked = _flat.arm(code, info, msrc, scope, replace_consts)
    if new is not None:
        return new
    from . import _core  # lazy: 59.3 ms

    return _core.arm(code, info, msrc, scope, replace_consts, walked=walked)


def __getattr__(name: str) -> Any:
    if name in _FRAMES:
        frames = importlib.import_module(f"daifu.cells.{_entry.frames}")
        for lazy in _FRAMES:
            globals()[lazy] = getattr(frames, lazy)
        return globals()[name]
    if name in _READBACK:
        from . import _readback  # lazy: 1.8 ms

        for lazy in _READBACK:
            globals()[lazy] = getattr(_readback, lazy)
        return globals()[name]
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from . import _core  # lazy: 59.3 ms

    for lazy in _LAZY:
        globals()[lazy] = getattr(_core, lazy)
    return globals()[name]
