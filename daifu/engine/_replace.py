"""``daifu.replace``: swap a function's code everywhere it is referenced."""

from __future__ import annotations

import types
import warnings

from .._errors import PatchError
from ..cells import is_vaccinated, vaccinate_function

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)
if TYPE_CHECKING:
    from typing import Any

    from ._crash import Crash


def _function(obj: Any, role: str) -> types.FunctionType:
    if isinstance(obj, (staticmethod, classmethod)) or isinstance(obj, types.MethodType):
        obj = obj.__func__
    if isinstance(obj, property):
        raise PatchError(f"daifu.replace: {role} is a property; replace its fget instead")
    if not isinstance(obj, types.FunctionType):
        raise PatchError(
            f"daifu.replace: {role} must be a Python function or method, not "
            f"{type(obj).__name__} ({obj!r})"
        )
    return obj


def apply_replace(target: Any, new: Any, crash: Crash | None) -> tuple[int, str] | None:
    """Swap the code; returns (the outermost level of the crashed stack
    where ``target`` runs, its name), or None when it is not running there."""
    fn = _function(target, "target")
    nf = _function(new, "the replacement")
    old_code, new_code = fn.__code__, nf.__code__
    if old_code.co_freevars != new_code.co_freevars:
        raise PatchError(
            f"daifu.replace: {fn.__qualname__} closes over {old_code.co_freevars or 'nothing'} "
            f"but the replacement closes over {new_code.co_freevars or 'nothing'}; they must "
            "match (define the replacement inside the same enclosing function, or replace that)"
        )
    if is_vaccinated(old_code) and not is_vaccinated(new_code):
        probe = types.FunctionType(new_code, nf.__globals__, nf.__name__, nf.__defaults__,
                                   nf.__closure__)
        with warnings.catch_warnings(record=True):
            if vaccinate_function(probe):
                new_code = probe.__code__
    fn.__code__ = new_code
    fn.__defaults__ = nf.__defaults__
    fn.__kwdefaults__ = nf.__kwdefaults__
    if crash is None or crash._frame is None:
        return None
    running = [level for level, frame in enumerate(crash.frames()) if frame.f_code is old_code]
    return (max(running), fn.__qualname__) if running else None


def rerun_level(crash: Crash, replaced: tuple[int, str]) -> int:
    """Where a retry re-executes the call of a function replaced while it
    ran (``replaced``: its outermost level on the crashed stack, its name):
    the nearest vaccinated caller above it, whose statement calls it anew
    (through library frames such as ``Module.__call__``).  Raises
    ``PatchError`` when there is none."""
    level, name = replaced
    up = crash.vaccinated_caller(level)
    if up is not None:
        return up
    raise PatchError(f"cannot retry: {name}() was replaced while it runs (frame {level}), and a "
                     "running call keeps its old code; none of its callers is vaccinated to "
                     "call it again (vaccinate the caller with --entry, or skip)")
