"""The frame-context mapping: a crashed frame's variables, live and writable.

The engine reads and writes a suspended frame's variables through
``FrameContext`` while the frame waits in its crash barrier; the function then
resumes with the new values.  Module-level code needs nothing special (its
variables are the module dict); function frames write back through the
per-version backend (3.11: ``PyFrame_LocalsToFast``).
"""

from __future__ import annotations

import types
from collections.abc import Iterator, MutableMapping
from typing import Any

from ._dispatch import backend


def _local_names(code: types.CodeType) -> frozenset[str]:
    return frozenset(code.co_varnames + code.co_cellvars + code.co_freevars)


class FrameContext(MutableMapping[str, Any]):
    """Live mapping of a suspended frame's variables (reads are always fresh)."""

    __slots__ = ("_frame", "_module", "_names")

    def __init__(self, frame: types.FrameType):
        self._frame = frame
        self._module = frame.f_locals is frame.f_globals
        self._names = None if self._module else _local_names(frame.f_code)

    @property
    def is_module(self) -> bool:
        return self._module

    @property
    def names(self) -> frozenset[str] | None:
        """The function's local variable names (``None`` for module code)."""
        return self._names

    def _snapshot(self) -> dict[str, Any]:
        return self._frame.f_locals

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
            self._frame.f_globals.update(values)
            for name in deleted:
                self._frame.f_globals.pop(name, None)
            return
        unknown = [n for n in (*values, *deleted) if n not in self._names]
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
