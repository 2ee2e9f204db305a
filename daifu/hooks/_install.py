"""Installing the hook in this process (and making spawned children do it too)."""

from __future__ import annotations

import sys
from types import TracebackType

from ._config import Config
from ._finder import DaifuFinder

_finder: DaifuFinder | None = None


class Installation:
    """Handle returned by ``install``; a context manager."""

    def __init__(self, finder: DaifuFinder):
        self.finder = finder

    def uninstall(self) -> None:
        uninstall()

    def __enter__(self) -> Installation:
        return self

    def __exit__(self, et: type | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.uninstall()


def install(modules: str | None = None, entry: str | None = None,
            config: Config | None = None) -> Installation:
    """Put daifu's finder first on ``sys.meta_path`` (replacing an earlier one)."""
    global _finder
    cfg = config or Config.from_env()
    if modules is not None:
        cfg.modules = modules
    if entry is not None:
        cfg.entry = tuple(x.strip() for x in entry.split(",") if x.strip()) or ("*",)
    cfg.validate()
    cfg.apply()
    uninstall()
    _finder = DaifuFinder(cfg.matcher, cfg.selection())
    sys.meta_path.insert(0, _finder)
    from ._child import patch_spawn

    patch_spawn()
    return Installation(_finder)


def uninstall() -> None:
    global _finder
    if _finder is not None:
        try:
            sys.meta_path.remove(_finder)
        except ValueError:
            pass
        _finder = None


def current() -> DaifuFinder | None:
    return _finder
