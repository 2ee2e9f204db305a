"""``DAIFU_MODULES``: which modules the import hook claims.

A comma-separated list of dotted-name globs.  Matching is on package
boundaries: ``mylib`` covers ``mylib`` and ``mylib.x.y`` but not ``mylibrary``;
each component is an ``fnmatch`` glob (``mylib.trainer.*``, ``exp_?``, ``*``).
daifu never claims itself or the libraries it is built on.
"""

from __future__ import annotations

import re
from fnmatch import fnmatchcase

from .._errors import ConfigError
from .._record import record

NEVER = ("daifu", "bytecode", "structlog")

_COMPONENT = re.compile(r"^[A-Za-z0-9_*?\[\]!-]+$")
_LITERAL = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@record(frozen=True)
class ModulePattern:
    text: str
    parts: tuple[str, ...]

    def matches(self, parts: list[str]) -> bool:
        if len(parts) < len(self.parts):
            return False
        return all(fnmatchcase(name, pat) for name, pat in zip(parts, self.parts))


def _check_component(text: str, comp: str) -> None:
    if not comp:
        raise ConfigError(
            f"bad DAIFU_MODULES pattern {text!r}: empty name component (leading, trailing or "
            "doubled dot). Patterns are dotted module names with * ? [] globs, e.g. "
            "'train,mylib.trainer.*'"
        )
    if not _COMPONENT.match(comp) or comp.count("[") != comp.count("]"):
        raise ConfigError(
            f"bad DAIFU_MODULES pattern {text!r}: {comp!r} is not a module name or glob "
            "(letters, digits, _ and the glob characters * ? [ ] only). Example: "
            "'train,mylib.trainer.*'"
        )
    if "[" in comp:
        try:
            re.compile(__import__("fnmatch").translate(comp))
        except re.error as exc:
            raise ConfigError(f"bad DAIFU_MODULES pattern {text!r}: {exc}") from None


class ModuleMatcher:
    """Answers ``matches(fullname)`` fast: a first-component set rejects most
    imports before any glob is tried."""

    def __init__(self, patterns: tuple[ModulePattern, ...]):
        self.patterns = patterns
        firsts = {p.parts[0] for p in patterns}
        self._any_first = any(not _LITERAL.match(f) for f in firsts)
        self._firsts = frozenset(firsts)

    @classmethod
    def parse(cls, text: str | None) -> ModuleMatcher:
        """Parse ``DAIFU_MODULES``; raise ``ConfigError`` with a fix-it message."""
        patterns = []
        for raw in (text or "").split(","):
            item = raw.strip()
            if not item:
                continue
            if any(ch.isspace() for ch in item):
                raise ConfigError(f"bad DAIFU_MODULES pattern {item!r}: contains whitespace")
            if item.startswith("."):
                raise ConfigError(
                    f"bad DAIFU_MODULES pattern {item!r}: relative names are not allowed; "
                    "use the absolute dotted name"
                )
            parts = tuple(item.split("."))
            for comp in parts:
                _check_component(item, comp)
            patterns.append(ModulePattern(item, parts))
        return cls(tuple(patterns))

    def __bool__(self) -> bool:
        return bool(self.patterns)

    def matches(self, fullname: str) -> bool:
        first, _, _ = fullname.partition(".")
        if not self._any_first and first not in self._firsts:
            return False
        if first in NEVER:
            return False
        parts = fullname.split(".")
        return any(p.matches(parts) for p in self.patterns)

    def which(self, fullname: str) -> str:
        """The first pattern that matches ``fullname`` ("" for none)."""
        parts = fullname.split(".")
        return next((p.text for p in self.patterns if p.matches(parts)), "")

    def __repr__(self) -> str:
        return f"ModuleMatcher({','.join(p.text for p in self.patterns)!r})"
