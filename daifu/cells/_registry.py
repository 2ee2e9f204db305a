"""Which source files the live program's vaccinated code came from.

The reload (``daifu.engine._reload``) needs the source each module was
compiled from -- to know what changed, to map the running statement into the
new code, and to vaccinate the new code the same way.
"""

from __future__ import annotations

from .. import _record
from .._runtime import RUNTIME

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)

if TYPE_CHECKING:
    from ._source import ModuleSource
    from ._transform import Selection


@_record.record
class LoadedFile:
    filename: str
    module: str | None
    selection: Selection
    source: str
    _msrc: ModuleSource | None = None

    @property
    def msrc(self) -> ModuleSource:
        """The parsed source (parsed on first use: code loaded from the cache
        was never parsed)."""
        if self._msrc is None:
            from ._source import ModuleSource  # (ast: not at start-up)  # lazy: 17.3 ms

            self._msrc = ModuleSource(self.source, self.filename)
        return self._msrc


def record(filename: str, module: str | None, selection: Selection, source: str,
           msrc: ModuleSource | None = None) -> LoadedFile:
    loaded = LoadedFile(filename, module, selection, source, msrc)
    with RUNTIME.files_lock:
        RUNTIME.files[filename] = loaded
    return loaded


def get(filename: str) -> LoadedFile | None:
    return RUNTIME.files.get(filename)


def files() -> list[LoadedFile]:
    with RUNTIME.files_lock:
        return list(RUNTIME.files.values())


def forget(filename: str) -> None:
    """Stop treating ``filename`` as vaccinated (tests that unload a module)."""
    with RUNTIME.files_lock:
        gone = RUNTIME.files.pop(filename, None) is not None
    if gone:
        RUNTIME.dropped()


def target_files() -> dict[str, LoadedFile]:
    """The files with vaccinated code (a live mapping: ``name in target_files()``)."""
    return RUNTIME.files
