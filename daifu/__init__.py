"""daifu: in-situ crash recovery for Python training jobs.

A crash in a vaccinated function stops at a *crash barrier* inside the live
frame; fixes (rules now; console, remote attach and replay later) patch the
live program, and the failing statement is retried or skipped::

    import daifu

    @daifu.on(FileNotFoundError)
    def make_dir(crash):
        os.makedirs(os.path.dirname(crash.vars["path"]), exist_ok=True)
        return daifu.RETRY

Run a script with ``python -m daifu train.py``; see README.md and docs/.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

from . import engine
from ._errors import (
    ConfigError,
    DaifuError,
    DaifuWarning,
    NotVaccinatedWarning,
    PatchError,
    TransformError,
    UnsupportedPythonWarning,
)
from ._version import __version__ as __version__
from .cells import vaccinate_function
from .engine import (
    ABORT,
    CONTINUE,
    ENGINE,
    RELOAD,
    RETRY,
    SKIP,
    Crash,
    Decision,
    Rule,
    Where,
    all_ranks,
    replace,
)

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)
if TYPE_CHECKING:
    from typing import Any, TypeVar

    F = TypeVar("F", bound=Callable[..., Any])



def on(exc_type: type[BaseException] | tuple[type[BaseException], ...] = Exception,
       where: Where = None) -> Callable[[F], F]:
    """Register a rule: ``fn(crash)`` is called for crashes of ``exc_type``.

    ``where`` narrows it: a qualname glob (``"train"``, ``"Trainer.*"``), a file
    (``"train.py"``), a ``"file.py:LINE"`` (any line of the failing statement),
    or a predicate ``where(crash) -> bool``.  The rule returns ``daifu.RETRY``
    (re-execute the failing statement), ``daifu.SKIP`` (continue after it),
    ``daifu.CONTINUE`` (go on with the innermost for loop's next item, like a
    ``continue`` statement), ``daifu.ABORT`` (give up for good) or ``None``
    (not mine: ask the next rule).
    Rules run in registration order; a rule that raises is reported and skipped.
    """
    types_ = exc_type if isinstance(exc_type, tuple) else (exc_type,)
    for t in types_:
        if not (isinstance(t, type) and issubclass(t, BaseException)):
            raise TypeError(f"daifu.on expects exception classes, got {t!r}")

    def register(fn: F) -> F:
        if not callable(fn):
            raise TypeError(f"daifu.on decorates a callable, got {fn!r}")
        ENGINE.rules.add(Rule(fn, types_, where))
        return fn

    return register


def vaccinate(fn: F) -> F:
    """Mark a function as an entry point and vaccinate it now if the import
    hook did not already.  If it cannot be vaccinated, warns
    (``NotVaccinatedWarning``) and returns the function unchanged."""
    target = fn.__func__ if isinstance(fn, (staticmethod, classmethod)) else fn

    vaccinate_function(target)
    _engine_for_plain_python()
    return fn


def _engine_for_plain_python() -> None:
    from .hooks import ensure_engine  # lazy: 41.0 ms

    try:
        ensure_engine()
    except ConfigError as exc:  # a bad DAIFU_* variable must not stop an import

        warnings.warn(f"daifu: {exc}; crashes get rules only", DaifuWarning, stacklevel=3)


def install(modules: str | None = None, entry: str | None = None) -> Any:
    """Install the import hook for modules matching ``modules`` (default
    ``DAIFU_MODULES``).  Returns a handle; ``handle.uninstall()`` or use it as
    a context manager."""
    from .hooks import ensure_engine  # lazy: 41.0 ms
    from .hooks import install as _install  # lazy: 41.0 ms

    handle = _install(modules=modules, entry=entry)
    ensure_engine()
    return handle


def load_ipython_extension(ip: Any) -> None:
    """``%load_ext daifu`` in IPython or Jupyter: the code of every cell run
    from now on is vaccinated (see ``daifu.hooks._ipython``)."""
    from .hooks import load_ipython_extension as load  # lazy: 56.0 ms

    load(ip)


def unload_ipython_extension(ip: Any) -> None:
    """``%unload_ext daifu``: cells run from now on are not vaccinated."""
    from .hooks import unload_ipython_extension as unload  # lazy: 56.0 ms

    unload(ip)


def uninstall() -> None:
    """Remove daifu's import hook (vaccinated code stays vaccinated)."""
    from .hooks import uninstall as _uninstall  # lazy: 41.0 ms

    _uninstall()


def resume(path: str, map_location: Any = None, **objects: Any) -> dict[str, Any]:
    """Resume a checkpoint daifu saved (a crash given up, SIGTERM, the
    console's ``checkpoint``) into the running program, in one call::

        position = daifu.resume(args.resume, model=model, optimizer=opt,
                                scheduler=sched, loader=train_loader)

    Each object gets its saved state, looked up by the keyword's name (or
    the only one of its kind); ``daifu.resume(path)`` alone restores the
    objects the checkpoint names (``model``, ``opt``...) where it is called.
    The RNG (python, numpy, torch, CUDA) is set as it was at the start of the
    iteration to resume, and a ``DataLoader`` passed goes on, at its next
    ``iter()``, with the next batch of the same shuffled order.  Returns the
    loop position saved (``{"epoch": 1, "step": 3}``).  ``path`` may be
    the manifest a preempted distributed job wrote (``...-manifest.json``):
    each rank takes its own file from it, in a job of as many ranks.  Raises
    ``daifu.ResumeError`` (nothing changed) when the file is not daifu's, was
    written by a newer daifu, or does not hold what was passed; and when an
    object's ``load_state_dict`` refuses its state (the objects before it
    were loaded; the RNG and the loaders not touched)."""
    from .engine import resume as _resume  # lazy: 13.0 ms

    return _resume(path, map_location=map_location, **objects)


def __getattr__(name: str) -> Any:
    """``load_checkpoint``, ``restore_rng`` and ``ResumeError`` (``engine.persist``):
    imported on first use, not at every start of every job."""
    if name in ("load_checkpoint", "restore_rng", "ResumeError"):
        return getattr(engine, name)
    raise AttributeError(f"module 'daifu' has no attribute {name!r}")


__all__ = [
    "ABORT",
    "CONTINUE",
    "RELOAD",
    "RETRY",
    "SKIP",
    "ConfigError",
    "Crash",
    "DaifuError",
    "DaifuWarning",
    "Decision",
    "NotVaccinatedWarning",
    "PatchError",
    "ResumeError",
    "TransformError",
    "UnsupportedPythonWarning",
    "all_ranks",
    "install",
    "load_checkpoint",
    "load_ipython_extension",
    "on",
    "replace",
    "restore_rng",
    "resume",
    "uninstall",
    "unload_ipython_extension",
    "vaccinate",
]
