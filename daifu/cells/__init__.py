"""The bytecode rewrite: vaccinated code objects and their cells.

This is the package's face: the engine and the hooks import from here only.
What reads source (``_source``: ``ast``, ``tokenize``) is imported on first
use of its names, not at start-up.
"""

from __future__ import annotations

from ._backend import Backend
from ._cache import CodeCache, default_directory
from ._cell import (
    CONTINUE_CODE,
    RAISE_CODE,
    RETRY_CODE,
    SKIP_CODE,
    Capabilities,
    Cell,
    Clause,
    CodeInfo,
    ExceptGuard,
    FinallyGuard,
    Guard,
    OpaqueGuard,
    Ref,
    WithGuard,
    cells_of,
    is_vaccinated,
    jump_answer,
    original_code,
    resolve,
)
from ._context import FrameContext, read_locals
from ._dispatch import backend
from ._registry import LoadedFile, files, forget, get, record, target_files
from ._transform import (
    Report,
    Selection,
    code_pairs,
    options,
    rewrite_continuation,
    use_barrier,
    vaccinate_function,
    vaccinate_loaded,
    vaccinate_module,
    vaccinate_source,
)

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "CONTINUE_CODE",
    "RAISE_CODE",
    "RETRY_CODE",
    "SKIP_CODE",
    "Backend",
    "Capabilities",
    "Cell",
    "Clause",
    "CodeCache",
    "CodeInfo",
    "ExceptGuard",
    "FinallyGuard",
    "FrameContext",
    "Guard",
    "LoadedFile",
    "ModuleSource",
    "OpaqueGuard",
    "Ref",
    "Report",
    "Selection",
    "WithGuard",
    "backend",
    "cells_of",
    "code_pairs",
    "contains",
    "default_directory",
    "files",
    "forget",
    "get",
    "is_vaccinated",
    "jump_answer",
    "entry_role",
    "map_statement",
    "options",
    "original_code",
    "resolve",
    "read_locals",
    "record",
    "rewrite_continuation",
    "source_for_file",
    "target_files",
    "use_barrier",
    "vaccinate_function",
    "vaccinate_loaded",
    "vaccinate_module",
    "vaccinate_source",
]

_SOURCE = frozenset({"ModuleSource", "contains", "entry_role", "map_statement",
                     "source_for_file"})
if TYPE_CHECKING:
    from ._source import ModuleSource, contains, entry_role, map_statement, source_for_file


def __getattr__(name: str) -> Any:
    if name not in _SOURCE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from . import _source

    for lazy in _SOURCE:
        globals()[lazy] = getattr(_source, lazy)
    return globals()[name]
