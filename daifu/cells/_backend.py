"""What a per-version bytecode backend provides (``cells/_dispatch.py`` picks one).

Everything that knows a CPython version's bytecode, exception table or frame
layout lives behind this interface; the rest of daifu (the driver in
``cells/_transform.py``, the engine) only calls these functions.
"""

from __future__ import annotations

import types

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)
if TYPE_CHECKING:
    from typing import Any, Protocol

    from ._cell import Cell, CodeInfo, Guard
    from ._source import ModuleSource
else:
    Protocol = object  # (nothing checks a backend against it at run time)


class Backend(Protocol):
    """One CPython version's rewrite and frame access (``cells/_rewrite``, with
    the frame module its ``_versions`` entry names)."""

    @property
    def PYTHON(self) -> tuple[int, int]:  # noqa: N802 - a module constant
        """The (major, minor) version the backend is for."""
        ...

    @property
    def Unsupported(self) -> type[Exception]:  # noqa: N802 - a module's exception class
        """Raised by ``rewrite`` when code cannot be rewritten (the message says why)."""
        ...

    @property
    def NothingToProtect(self) -> type[Exception]:  # noqa: N802
        """Raised by ``rewrite`` for code without statements of its own (no warning)."""
        ...

    @property
    def Continuation(self) -> Any:  # noqa: N802
        """The request for a continuation in new code (see ``rewrite``)."""
        ...

    def rewrite(self, code: types.CodeType, info: CodeInfo, msrc: ModuleSource, scope: Any,
                replace_consts: dict | None = None,
                continuation: Any = None) -> types.CodeType:
        """The vaccinated version of ``code`` (its cells appended to ``info.cells``)."""
        ...

    def chain_for_code(self, code: types.CodeType, offset: int,
                       msrc: ModuleSource | None) -> tuple[Guard, ...]:
        """The handlers around byte ``offset`` of *unmodified* code, innermost first."""
        ...

    def cell_ranges(self, code: types.CodeType) -> list[tuple[int, int, Cell, bool]]:
        """(start, stop, cell, is the retry copy) byte ranges of rewritten code."""
        ...

    def lasti_offset(self, lasti: int) -> int:
        """The byte offset of the instruction a barrier's ``lasti`` names."""
        ...

    def read_locals(self, frame: types.FrameType) -> dict[str, Any]:
        """A new dict of a function frame's variables, leaving the frame as it was."""
        ...

    def write_locals(self, frame: types.FrameType, values: dict[str, Any],
                     deleted: tuple[str, ...] = ()) -> None:
        """Store into (and delete from) a suspended function frame's variables."""
        ...

    def called_from_c(self, frame: types.FrameType) -> bool | None:
        """Was the executing frame entered from C code (None: cannot tell)?"""
        ...

    def running_function(self, frame: types.FrameType) -> types.FunctionType | None:
        """The function object executing ``frame``, if it can be found."""
        ...

    def arm(self, code: types.CodeType, info: CodeInfo, msrc: ModuleSource, scope: Any,
            replace_consts: dict | None = None) -> types.CodeType:
        """``code`` armed (``_armed``): vaccinated at its first exception."""
        ...

    def armed_end(self, armed: types.CodeType) -> int:
        """Where armed code's traps begin (0: none)."""
        ...

    def trap_at(self, armed: types.CodeType, offset: int) -> tuple | None:
        """The constant of the trap byte ``offset`` of armed code leads to."""
        ...

    def trap_path(self, armed: types.CodeType, new: types.CodeType,
                  lasti: int) -> tuple | None:
        """Where armed code's trap for instruction ``lasti`` calls the upgrade,
        and where vaccinated ``new`` calls the barrier for that cell."""
        ...

    def swap_code(self, frame: types.FrameType, new: types.CodeType, call_old: int,
                  resume_old: int, call_new: int, resume_new: int) -> bool:
        """Move a frame suspended in a Python call onto ``new`` (``_armed``)."""
        ...

    def returns_truthy(self, code: types.CodeType) -> bool:
        """Can (unmodified) code return something other than a false constant?"""
        ...

    def has_except_handler(self, code: types.CodeType) -> bool:
        """Has (unmodified) code an ``except`` clause?"""
        ...

    def effects(self, code: types.CodeType, start: int,
                stop: int) -> list[tuple[str, str, Any]]:
        """Calls, stores and in-place operations in bytes [start, stop) of code."""
        ...

    def c_passes_through(self, code: types.CodeType, offset: int, callee: str) -> bool:
        """Does the instruction at byte ``offset`` reach the Python function
        named ``callee`` through C that catches no crash (``f(*args)``,
        ``FOR_ITER`` running ``__next__`` ...)?"""
        ...
