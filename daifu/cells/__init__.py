"""The bytecode rewrite: vaccinated code objects and their cells."""

from ._cell import Cell, CodeInfo, cells_of, is_vaccinated
from ._context import FrameContext
from ._dispatch import backend
from ._transform import (
    Report,
    Selection,
    options,
    vaccinate_function,
    vaccinate_loaded,
    vaccinate_module,
    vaccinate_source,
)

__all__ = [
    "Cell",
    "CodeInfo",
    "FrameContext",
    "Report",
    "Selection",
    "backend",
    "cells_of",
    "is_vaccinated",
    "options",
    "vaccinate_function",
    "vaccinate_loaded",
    "vaccinate_module",
    "vaccinate_source",
]
