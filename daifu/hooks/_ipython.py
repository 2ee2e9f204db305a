"""``%load_ext daifu``: vaccinate the code of IPython and Jupyter cells.

IPython compiles each top-level statement of a cell with its ``compile``
object (a ``CachingCompiler``) after putting the cell's text into
``linecache`` under the cell's file name.  The extension gives that object a
subclass whose ``__call__`` vaccinates the compiled code against the cell's
text, as the runner does for a script: a loop written at the top of a cell is
protected, functions with a loop are rewritten, every other function and
method defined in the cell gets a first-call stub.  A statement daifu cannot
vaccinate warns and runs as IPython compiled it.

The engine and the import hook are set up as under the runner (rules,
journal, ``DAIFU_MODULES`` and the other ``DAIFU_*`` options); at a crash,
the console opens in the notebook (``input()`` goes to the front end), and
the job can be reached with ``python -m daifu attach PID`` from a terminal
while it waits.  ``%unload_ext daifu`` puts the
original compiler back.
"""

from __future__ import annotations

import ast
import linecache
import sys
import types
import warnings
from typing import Any

from .._errors import NotVaccinatedWarning
from ..cells import ModuleSource, backend, vaccinate_module
from ..engine import ENGINE
from ._config import Config
from ._install import install

_CO_COROUTINE = 0x80
_classes: dict[type, type] = {}


def load_ipython_extension(ip: Any) -> None:
    back, reason = backend()
    if back is None:
        warnings.warn(f"daifu: {reason}", NotVaccinatedWarning, stacklevel=2)
        return
    cfg = Config.from_env()
    # the import hook too: DAIFU_MODULES, and its patches of modules the
    # notebook imports later (multiprocessing spawn, DataLoader, TorchDynamo)
    install(config=cfg)
    if ENGINE.journal is None:
        # a terminal IPython has a TTY; a Jupyter kernel's input() asks the front end
        tty = sys.stdin.isatty() and sys.stderr.isatty()
        cfg.setup_engine("ipython", interactive=True,
                         console=cfg.console and (tty or "ipykernel" in sys.modules))
    compiler = ip.compile
    if getattr(compiler, "_daifu_selection", None) is None:
        compiler.__class__ = _vaccinating(type(compiler))
    compiler._daifu_selection = cfg.selection(module_level=True)
    sys.stderr.write("daifu: cells are vaccinated from now on (%unload_ext daifu to stop)\n")


def unload_ipython_extension(ip: Any) -> None:
    compiler = ip.compile
    if getattr(compiler, "_daifu_selection", None) is not None:
        compiler._daifu_selection = None
        compiler.__class__ = type(compiler).__mro__[1]


def _vaccinating(base: type) -> type:
    cls = _classes.get(base)
    if cls is None:
        cls = type(f"Vaccinating{base.__name__}", (base,), {"__call__": _call})
        _classes[base] = cls
    return cls


def _call(self: Any, source: Any, filename: str, symbol: str) -> types.CodeType:
    code = super(type(self), self).__call__(source, filename, symbol)
    selection = getattr(self, "_daifu_selection", None)
    if selection is None or not isinstance(code, types.CodeType) or symbol != "exec" \
            or code.co_flags & _CO_COROUTINE:
        return code  # ("single": the echoed last expression; top-level await)
    try:
        return _vaccinate(code, filename, selection)
    except Exception as exc:  # never worse: the cell runs as IPython compiled it
        warnings.warn(f"daifu: a statement of cell {filename} is not vaccinated and runs "
                      f"unmodified: {type(exc).__name__}: {exc}", NotVaccinatedWarning,
                      stacklevel=2)
        return code


def _vaccinate(code: types.CodeType, filename: str, selection: Any) -> types.CodeType:
    text = "".join(linecache.getlines(filename))
    if not text:
        return code
    msrc = ModuleSource(text, filename, ast.parse(text, filename))
    with warnings.catch_warnings():
        new, _ = vaccinate_module(code, msrc, selection, "__main__")
    return new
