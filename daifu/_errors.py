"""Every exception and warning class daifu raises or emits (filter by these)."""

from __future__ import annotations


class DaifuError(Exception):
    """Base class of daifu's own errors."""


class ConfigError(DaifuError, ValueError):
    """A bad option or environment variable (``DAIFU_MODULES`` pattern, ...)."""


class TransformError(DaifuError):
    """A function could not be vaccinated and ``DAIFU_STRICT=1`` asked for an error.

    ``qualname``/``filename`` say which; ``reason`` says why; ``dump`` holds the
    rewritten bytecode listing when one was produced.
    """

    def __init__(self, message: str, *, qualname: str = "", filename: str = "",
                 reason: str = "", dump: str | None = None):
        super().__init__(message)
        self.qualname = qualname
        self.filename = filename
        self.reason = reason
        self.dump = dump


class PatchError(DaifuError):
    """A patch could not be applied (bad code, a fix that raised, a replace
    with incompatible code ...).  The job keeps its state."""


class DaifuWarning(UserWarning):
    """Base class of daifu's warnings."""


class NotVaccinatedWarning(DaifuWarning):
    """daifu could not transform something and runs the original code instead."""


class UnsupportedPythonWarning(NotVaccinatedWarning):
    """This Python version is not known to daifu; nothing is vaccinated."""
