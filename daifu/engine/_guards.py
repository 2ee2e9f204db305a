"""Would the program handle this exception itself?

Semantics daifu keeps: an exception the program catches never reaches the
engine.  The crashed frame's own handlers are known precisely (the rewrite
recorded them as guards, and the barrier receives the live ``__exit__`` of
every enclosing ``with``).  Callers are checked too when their code belongs
to a vaccinated module or the main script (``target files``): an exception
that ``main()``'s ``try/except`` will handle is not a crash.  Frames in other
code are opaque and assumed not to catch.
"""

from __future__ import annotations

import contextlib
import dis
import types
from functools import lru_cache
from typing import Any

from ..cells._cell import Cell, CodeInfo, ExceptGuard, FinallyGuard, Guard, OpaqueGuard, WithGuard
from ..cells._cell import cells_of
from ..cells._dispatch import backend
from ..cells._source import source_for_file


def would_catch(guards: tuple[Guard, ...], exc: BaseException, frame: types.FrameType,
                exits: list[Any] | None) -> bool:
    """Evaluate the guards innermost-first; ``exits`` are the live ``__exit__``
    callables of the enclosing ``with`` statements (None when unknown)."""
    exit_iter = iter(exits or ())
    namespace: dict[str, Any] | None = None
    for guard in guards:
        if isinstance(guard, ExceptGuard):
            for clause in guard.clauses:
                if clause.bare or clause.test is None:
                    matched = True
                else:
                    if namespace is None:
                        namespace = dict(frame.f_locals)
                    try:
                        types_ = eval(clause.test, frame.f_globals, namespace)
                        matched = isinstance(exc, types_)
                    except Exception:
                        matched = True  # the real handler will meet the same problem
                if matched:
                    if clause.reraises:
                        break  # handled, then re-raised: it escapes all the same
                    return True
        elif isinstance(guard, WithGuard):
            exit_fn = next(exit_iter, None)
            if exit_fn is not None and suppresses(getattr(exit_fn, "__self__", None), exc):
                return True
        elif isinstance(guard, FinallyGuard):
            if guard.swallows:
                return True
        elif isinstance(guard, OpaqueGuard):
            return True
    return False


def suppresses(cm: Any, exc: BaseException) -> bool:
    """Known context managers that swallow exceptions."""
    if cm is None:
        return False
    try:
        if isinstance(cm, contextlib.suppress):
            return isinstance(exc, cm._exceptions)
        cls = type(cm)
        mod, name = cls.__module__, cls.__name__
        if mod.startswith("_pytest") and name in ("RaisesContext", "RaisesExc", "RaisesGroup"):
            expected = getattr(cm, "expected_exception", None) or getattr(
                cm, "expected_exceptions", None)
            return expected is None or isinstance(exc, expected)
        if mod == "unittest.case" and name == "_AssertRaisesContext":
            return isinstance(exc, cm.expected)
    except Exception:
        return False
    return False


def caught_by_callers(frame: types.FrameType, exc: BaseException, targets: set[str]) -> bool:
    """Does a handler in a caller frame that belongs to a target file catch it?"""
    f = frame.f_back
    hops = 0
    while f is not None and hops < 256:
        hops += 1
        code = f.f_code
        if code.co_filename in targets:
            guards = guards_at(code, f.f_lasti)
            if guards and would_catch(guards, exc, f, None):
                return True
        f = f.f_back
    return False


def guards_at(code: types.CodeType, offset: int) -> tuple[Guard, ...]:
    try:
        return _guards_at(code, offset)
    except Exception:
        return ()


@lru_cache(maxsize=2048)
def _guards_at(code: types.CodeType, offset: int) -> tuple[Guard, ...]:
    info = cells_of(code)
    if info is not None:
        cell = cell_at(info, code, offset)
        if cell is not None:
            return cell.guards
    back, _ = backend()
    if back is None:
        return ()
    return back.chain_for_code(code, offset, source_for_file(code.co_filename))


def cell_at(info: CodeInfo, code: types.CodeType, offset: int) -> Cell | None:
    """The cell whose instructions include byte ``offset`` of rewritten ``code``."""
    if info.ranges is None:
        info.ranges = _ranges(code)
    for start, stop, cell in info.ranges:
        if start <= offset < stop:
            return cell
    return None


def _ranges(code: types.CodeType) -> list[tuple[int, int, Cell]]:
    instrs = list(dis.get_instructions(code))
    by_offset = {ins.offset: n for n, ins in enumerate(instrs)}
    out = []
    for entry in dis._parse_exception_table(code):  # noqa: SLF001 - stable since 3.11
        n = by_offset.get(entry.target)
        if n is None:
            continue
        for ins in instrs[n : n + 10]:
            if ins.opname == "LOAD_CONST" and type(ins.argval) is Cell:
                out.append((entry.start, entry.end, ins.argval))
                break
    return out
