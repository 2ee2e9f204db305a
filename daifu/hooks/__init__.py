"""The import hook (finder + loader), the runner (``python -m daifu``) and
child-process activation."""

from ._config import Config
from ._finder import DaifuFinder, DaifuLoader
from ._install import Installation, current, install, uninstall
from ._patterns import ModuleMatcher

__all__ = [
    "Config",
    "DaifuFinder",
    "DaifuLoader",
    "Installation",
    "ModuleMatcher",
    "current",
    "install",
    "uninstall",
]
