"""The frame-context mapping: a crashed frame's variables, live and writable.

The engine reads and writes a suspended frame's variables through
``FrameContext`` while the frame waits in its crash barrier; the function then
resumes with the new values.  Module-level code needs nothing special (its
variables are the module dict); function frames write back through the
per-version backend (3.11: ``PyFrame_LocalsToFast``).  Reading never leaves
anything on the frame (3.11's ``frame.f_locals`` would keep a snapshot of
every variable alive until the frame returns; see ``read_locals``).
"""

from __future__ import annotations

import types
from collections.abc import Iterator, MutableMapping

from ._dispatch import backend

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)
if TYPE_CHECKING:
    from typing import Any

_CO_OPTIMIZED = 0x1


def _local_names(code: types.CodeType) -> frozenset[str]:
    return frozenset(code.co_varnames + code.co_cellvars + code.co_freevars)


def read_locals(frame: types.FrameType) -> dict[str, Any]:
    """A new dict of a function frame's variables that leaves the frame as it
    was (module and class-body frames: their namespace dict itself)."""
    if not frame.f_code.co_flags & _CO_OPTIMIZED:
        return frame.f_locals
    back, _ = backend()
    if back is None:  # pragma: no cover - nothing is vaccinated on such a Python
        return dict(frame.f_locals)
    return back.read_locals(frame)


class FrameContext(MutableMapping[str, "Any"]):
    """Live mapping of a suspended frame's variables (reads are always fresh)."""

    __slots__ = ("_frame", "_module", "_names")

    def __init__(self, frame: types.FrameType):
        self._frame = frame
        # module code and class bodies keep their variables in a real dict
        self._module = not frame.f_code.co_flags & _CO_OPTIMIZED
        self._names = None if self._module else _local_names(frame.f_code)

    @property
    def is_module(self) -> bool:
        """Module-level code (or a class body): the variables are a namespace dict."""
        return self._module

    @property
    def names(self) -> frozenset[str] | None:
        """The function's local variable names (``None`` for module code)."""
        return self._names

    def _snapshot(self) -> dict[str, Any]:
        return read_locals(self._frame)

    def __getitem__(self, name: str) -> Any:
        return self._snapshot()[name]

    def __setitem__(self, name: str, value: Any) -> None:
        self.update_many({name: value})

    def __delitem__(self, name: str) -> None:
        if name not in self._snapshot():
            raise KeyError(name)
        self.update_many({}, (name,))

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._snapshot()))

    def __len__(self) -> int:
        return len(self._snapshot())

    def __contains__(self, name: object) -> bool:
        return name in self._snapshot()

    def update_many(self, values: dict[str, Any], deleted: tuple[str, ...] = ()) -> None:
        """Assign and delete several variables at once."""
        if self._module:
            namespace = self._frame.f_locals  # the globals, or a class body's dict
            namespace.update(values)
            for name in deleted:
                namespace.pop(name, None)
            return
        names = self._names or frozenset()
        unknown = [n for n in (*values, *deleted) if n not in names]
        if unknown:
            raise KeyError(
                f"{', '.join(unknown)} {'is' if len(unknown) == 1 else 'are'} not a variable of "
                f"{self._frame.f_code.co_qualname}(); set globals through crash.globals"
            )
        back, reason = backend()
        if back is None:  # pragma: no cover - cannot happen: nothing was vaccinated
            raise RuntimeError(reason)
        back.write_locals(self._frame, values, deleted)

    def __repr__(self) -> str:
        return f"<FrameContext {self._frame.f_code.co_qualname} {sorted(self._snapshot())}>"
