"""daifu's per-process state, in one place, with one ``reset()``.

Everything that lives for the whole process is reachable from ``RUNTIME``:
its own fields below, and one *part* per module that keeps process state
(``RUNTIME.part``: a record of that module's fields -- the SIGTERM handler's,
the signal hold's, the event sink's ...), listed in ``RUNTIME.parts``.  No
module keeps state in its own globals (``tests/test_layers.py`` checks:
no ``global`` statement, and every module-level container is a constant
table, a cache of a pure computation, or one of the fast path's objects that
C code holds).  ``RUNTIME.reset()`` returns it all to a fresh start (the
tests do between tests; nothing in a normal run needs to): each part that
can be reset says how (``on_reset``); a part that records what was done to
the process (a handler installed, a hook registered with ``os``) keeps it."""

from __future__ import annotations

import threading
from collections.abc import Callable

from ._record import field, record

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)
if TYPE_CHECKING:
    from typing import Any, TypeVar

    T = TypeVar("T")


@record
class Runtime:
    #: filename -> ``cells._registry.LoadedFile``: the vaccinated files (the
    #: engine's "target files" and the reload's candidates)
    files: dict[str, Any] = field(default_factory=dict)
    files_lock: threading.Lock = field(default_factory=threading.Lock)
    #: ``DAIFU_ENTRY`` name patterns that selected at least one function
    matched_entries: set[str] = field(default_factory=set)
    #: the unsupported-Python warning was given
    warned_version: bool = False
    #: the console read ``~/.daifu_history`` (once per process)
    history_read: bool = False
    #: the runner emitted its summary
    summarised: bool = False
    #: module -> that module's process state (``part``)
    parts: dict[str, Any] = field(default_factory=dict)
    _resets: list[Callable[[], None]] = field(default_factory=list)
    _drops: list[Callable[[], None]] = field(default_factory=list)

    def part(self, module: str, state: T) -> T:
        """Keep ``state``, the record of ``module``'s process state, and
        return it (``_state = RUNTIME.part(__name__, _State())``)."""
        self.parts[module] = state
        return state

    def on_reset(self, fn: Callable[[], None]) -> Callable[[], None]:
        """Register the reset of a package's own state object (engine, options ...)."""
        self._resets.append(fn)
        return fn

    def on_drop(self, fn: Callable[[], None]) -> Callable[[], None]:
        """Register what to forget when a file stops being vaccinated: what
        the engine keeps about callers' files holds only while the set of
        vaccinated files grows (``dropped``, and every ``reset``)."""
        self._drops.append(fn)
        return fn

    def dropped(self) -> None:
        """A file stopped being vaccinated (``cells._registry.forget``)."""
        for fn in self._drops:
            fn()

    def reset(self) -> None:
        """Forget everything: vaccinated files, rules, patches, counters,
        options, where events go."""
        with self.files_lock:
            self.files.clear()
        self.dropped()
        self.matched_entries.clear()
        self.warned_version = self.history_read = self.summarised = False
        for fn in self._resets:
            fn()


RUNTIME = Runtime()


def _state_init(self: Any, **fields: Any) -> None:
    spec = type(self).__record__
    for name in spec.names:
        if name in fields:
            value = fields.pop(name)
        elif name in spec.factories:
            value = spec.factories[name]()
        else:
            value = spec.defaults[name]
        setattr(self, name, value)
    if fields:
        raise TypeError(f"{type(self).__name__}: no field {sorted(fields)[0]!r}")


def state_record(cls: type[T]) -> type[T]:
    """``@record`` for a module's process state (``RUNTIME.part``): the same
    fields, defaults, ``field(default_factory=...)`` and repr, with one
    generic ``__init__`` (by keyword) instead of one compiled per class: a
    part is made once, at import, where compiling its ``__init__`` would
    cost every start ~0.2 ms."""
    cls.__init__ = _state_init  # type: ignore[method-assign]  # (record keeps a class's own)
    return record(cls)
