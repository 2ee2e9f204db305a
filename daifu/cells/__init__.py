"""The bytecode rewrite: vaccinated code objects and their cells.

This is the package's face: the engine and the hooks import from here only.
What reads source (``_source``: ``ast``, ``tokenize``) is imported on first
use of its names, not at start-up.
"""

from __future__ import annotations

from .._firstuse import first_use
from ._armed import armed_guards, complete_running, handlers_code, trap_of, upgrade
from ._backend import Backend
from ._cache import CodeCache, default_directory
from ._cell import _INFOS as INFOS
from ._cell import (
    CONTINUE_CODE,
    MISSING,
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
    IdentityMemo,
    OpaqueGuard,
    Ref,
    WithGuard,
    cells_of,
    code_infos,
    is_vaccinated,
    jump_answer,
    own_catch,
    own_test,
    resolve,
    route_catch,
)
from ._context import FrameContext, read_locals
from ._dispatch import SUPPORTED, backend, cell_at, cell_range, flat_arming
from ._lazy import original_code, pending_of, use_dynamo
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

def load_rewrite(warm: bool = True) -> None:
    """Import the rewrite now (what vaccinating the first function imports)
    and, with ``warm``, run it once (``_core.warm``), so that the first
    crash -- which rewrites armed code in full -- does not wait for either
    (``engine._preload``)."""
    # (and frame access, ctypes: what an upgrade uses)
    from ._rewrite import _core, swap_code  # noqa: F401  # lazy: 59.3 ms

    if warm:
        _core.warm()


__all__ = [
    "INFOS",
    "MISSING",
    "SUPPORTED",
    "IdentityMemo",
    "load_rewrite",
    "pending_of",
    "trace_original",
    "use_dynamo",
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
    "flat_arming",
    "cell_at",
    "cell_range",
    "cells_of",
    "code_infos",
    "code_pairs",
    "contains",
    "exception_entries",
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
    "own_catch",
    "own_test",
    "route_catch",
    "resolve",
    "read_locals",
    "record",
    "rewrite_continuation",
    "set_const",
    "source_for_file",
    "target_files",
    "armed_guards",
    "complete_running",
    "handlers_code",
    "trap_of",
    "upgrade",
    "use_barrier",
    "vaccinate_function",
    "vaccinate_loaded",
    "vaccinate_module",
    "vaccinate_source",
]

#: names imported on first use, by module (``ast``, ``tokenize``, ``ctypes``
#: are not for start-up)
_LAZY = {name: (module, name) for name, module in (
    ("ModuleSource", "_source"), ("contains", "_source"), ("entry_role", "_source"),
    ("map_statement", "_source"), ("source_for_file", "_source"),
    ("trace_original", "_dynamo"), ("set_const", "_consts"),
    ("exception_entries", "_exctable"))}
if TYPE_CHECKING:
    from ._consts import set_const
    from ._dynamo import trace_original
    from ._exctable import exception_entries
    from ._source import ModuleSource, contains, entry_role, map_statement, source_for_file


def __getattr__(name: str) -> Any:
    return first_use(__name__, _LAZY, globals(), name)
