"""Which source files the live program's vaccinated code came from.

The reload (``daifu.engine._reload``) needs the source each module was
compiled from -- to know what changed, to map the running statement into the
new code, and to vaccinate the new code the same way.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from ._source import ModuleSource


@dataclass
class LoadedFile:
    filename: str
    module: str | None
    _msrc: ModuleSource | None
    selection: object  # cells._transform.Selection
    source: str | None = None

    @property
    def msrc(self) -> ModuleSource:
        """The parsed source (parsed on first use for code loaded from the cache)."""
        if self._msrc is None:
            self._msrc = ModuleSource(self.source or "", self.filename)
        return self._msrc


_lock = threading.Lock()
_files: dict[str, LoadedFile] = {}


def record(filename: str, module: str | None, msrc: ModuleSource, selection) -> None:
    with _lock:
        _files[filename] = LoadedFile(filename, module, msrc, selection)


def record_source(filename: str, module: str | None, source: str, selection) -> None:
    """Like ``record`` for code loaded from the cache: parse only if needed."""
    with _lock:
        _files[filename] = LoadedFile(filename, module, None, selection, source)


def get(filename: str) -> LoadedFile | None:
    return _files.get(filename)


def files() -> list[LoadedFile]:
    with _lock:
        return list(_files.values())
