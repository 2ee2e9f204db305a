"""daifu's per-process state, in one place, with one ``reset()``.

The packages keep their own objects (the engine, the transform options, the
event sink), but everything that lives for the whole process is reachable
from ``RUNTIME``, and ``RUNTIME.reset()`` returns all of it to a fresh start
(the tests do between tests; nothing in a normal run needs to)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from ._record import field, record

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)
if TYPE_CHECKING:
    from typing import Any


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
    _resets: list[Callable[[], None]] = field(default_factory=list)
    _drops: list[Callable[[], None]] = field(default_factory=list)

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
