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
    msrc: ModuleSource
    selection: object  # cells._transform.Selection


_lock = threading.Lock()
_files: dict[str, LoadedFile] = {}


def record(filename: str, module: str | None, msrc: ModuleSource, selection) -> None:
    with _lock:
        _files[filename] = LoadedFile(filename, module, msrc, selection)


def get(filename: str) -> LoadedFile | None:
    return _files.get(filename)


def files() -> list[LoadedFile]:
    with _lock:
        return list(_files.values())
