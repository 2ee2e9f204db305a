"""Rules: fixes written ahead of time, consulted in order at every crash."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from fnmatch import fnmatchcase

from .._record import record

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)
if TYPE_CHECKING:
    from typing import Any

    from ._crash import Crash

Where = str | Callable[["Crash"], bool] | None


@record(eq=False)
class Rule:
    fn: Callable[[Crash], Any]
    exc_types: tuple[type[BaseException], ...]
    where: Where

    @property
    def origin(self) -> str:
        mod = getattr(self.fn, "__module__", "?")
        return f"rule:{mod}.{getattr(self.fn, '__qualname__', repr(self.fn))}"

    def matches(self, crash: Crash) -> bool:
        if not isinstance(crash.exception, self.exc_types):
            return False
        where = self.where
        if where is None:
            return True
        if callable(where):
            return bool(where(crash))
        return _where_matches(where, crash)


def _where_matches(where: str, crash: Crash) -> bool:
    """``"train"``/``"Trainer.*"`` (qualname glob), ``"train.py:42"`` (file:line,
    the line anywhere in the failing statement) or ``"train.py"`` (file)."""
    head, sep, tail = where.rpartition(":")
    if sep and tail.isdigit():
        line = int(tail)
        lo, hi = crash.cell.lineno or 0, crash.cell.end_lineno or crash.cell.lineno or 0
        return _file_matches(head, crash.filename) and lo <= line <= hi
    if where.endswith(".py") or os.sep in where:
        return _file_matches(where, crash.filename)
    name = crash.function
    return fnmatchcase(name, where) or fnmatchcase(name.rpartition(".")[2], where)


def _where_names(where: str, code: Any, lineno: int | None) -> bool:
    """``_where_matches`` for a frame that has not crashed (its current line)."""
    head, sep, tail = where.rpartition(":")
    if sep and tail.isdigit():
        return _file_matches(head, code.co_filename) and lineno == int(tail)
    if where.endswith(".py") or os.sep in where:
        return _file_matches(where, code.co_filename)
    name = code.co_qualname
    return fnmatchcase(name, where) or fnmatchcase(name.rpartition(".")[2], where)


def _file_matches(pattern: str, filename: str) -> bool:
    pattern = os.path.normpath(pattern)
    filename = os.path.normpath(filename)
    return filename == pattern or filename.endswith(os.sep + pattern) or fnmatchcase(
        filename, pattern
    )


class RuleBook:
    """The registered rules, in registration order."""

    def __init__(self) -> None:
        self._rules: list[Rule] = []
        self._lock = threading.Lock()

    def add(self, rule: Rule) -> None:
        with self._lock:
            # registering the same function again (a fixes file imported twice,
            # a re-run cell) replaces the earlier registration
            self._rules = [r for r in self._rules if getattr(r.fn, "__code__", r.fn) is not
                           getattr(rule.fn, "__code__", rule.fn)]
            self._rules.append(rule)

    def matching(self, crash: Crash) -> list[Rule]:
        with self._lock:
            rules = list(self._rules)
        out = []
        for rule in rules:
            try:
                if rule.matches(crash):
                    out.append(rule)
            except Exception:  # a broken `where` predicate must not stop the others
                continue
        return out

    def target_a_caller(self, crash: Crash, vaccinated: Callable[[Any], bool]) -> bool:
        """Does a rule for this exception name (by function, file or line) a
        caller of the crashed frame that is vaccinated -- whose barrier will
        take the exception if it is handed up?  A rule without ``where``, or
        with a predicate, already had its turn here."""
        with self._lock:
            rules = [r for r in self._rules if isinstance(r.where, str)
                     and isinstance(crash.exception, r.exc_types)]
        if not rules:
            return False
        f = crash.frame.f_back
        while f is not None:
            if vaccinated(f.f_code):
                code = f.f_code
                for rule in rules:
                    try:
                        if _where_names(rule.where, code, f.f_lineno):  # type: ignore[arg-type]
                            return True
                    except Exception:
                        continue
            f = f.f_back
        return False

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()

    def __len__(self) -> int:
        return len(self._rules)
