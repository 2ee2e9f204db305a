"""The import hook (finder + loader), the runner (``python -m daifu``) and
child-process activation.  This is the package's face: ``daifu`` imports
from here only.  The runner and the notebook extension load on first use."""

from __future__ import annotations

from .._firstuse import first_use
from ._config import Config
from ._finder import DaifuFinder, DaifuLoader
from ._install import Installation, current, ensure_engine, install, uninstall
from ._patterns import ModuleMatcher

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)
if TYPE_CHECKING:
    from typing import Any

    from ._ipython import load_ipython_extension, unload_ipython_extension
    from ._runner import main

#: name -> (module, its name there), imported on first use
_LAZY = {"main": ("_runner", "main"),
         "load_ipython_extension": ("_ipython", "load_ipython_extension"),
         "unload_ipython_extension": ("_ipython", "unload_ipython_extension")}


def __getattr__(name: str) -> Any:
    return first_use(__name__, _LAZY, globals(), name)


__all__ = [
    "ensure_engine",
    "load_ipython_extension",
    "main",
    "unload_ipython_extension",
    "Config",
    "DaifuFinder",
    "DaifuLoader",
    "Installation",
    "ModuleMatcher",
    "current",
    "install",
    "uninstall",
]
