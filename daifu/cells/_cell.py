"""Version-neutral descriptions of vaccinated code: cells, guards, code info.

A *cell* is the unit of recovery: one contiguous run of a statement's
bytecode that daifu can re-execute from its start (retry) and, for simple
statements, jump over (skip).  The rewrite (``_py311``) builds one ``Cell`` per
run and stores it as a constant of the rewritten code, so the crash barrier
receives it directly: no lookup tables on the crash path, nothing at all on
the normal path.

*Guards* describe what the function's own exception handlers would do with an
exception raised in the cell, innermost first.  The engine evaluates them at
the crash to decide whether the user's code would catch the exception (then
daifu stays out of the way) or whether it would escape the function (then it
is a crash).
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any

#: what a crash barrier answers; the stub the rewrite appends to every cell
#: dispatches on it.  Besides these codes, an answer can be a 2-tuple
#: ``(function, args)``: continue in new code (after a reload) -- the frame
#: returns ``function(*args)`` -- or a 1-tuple ``(exception,)``: raise that
#: exception instead (a rule's ``SystemExit``), where the statement failed.
RETRY_CODE, SKIP_CODE, RAISE_CODE, CONTINUE_CODE = 0, 1, 2, 3


@dataclass(frozen=True)
class Ref:
    """A side-effect-free expression: ``name`` (looked up in ``scope``: fast,
    global, name or deref), then attributes, read with
    ``inspect.getattr_static`` so that no property or ``__getattr__`` runs;
    or a tuple of ``items``; or a constant."""

    name: str = ""
    scope: str = "name"
    attrs: tuple[str, ...] = ()
    items: tuple[Ref, ...] | None = None
    const: object = None
    is_const: bool = False


@dataclass(eq=False)
class Clause:
    """One ``except X:`` clause.

    ``test`` is the clause's type expression as a side-effect-free recipe
    (``Ref`` lookups: names, attribute chains, tuples) evaluated in the frame's
    namespace without running user code; ``None`` means daifu could not (a call
    in the expression, say) and must assume the clause matches.  ``reraises``
    is true when every path through the clause body ends in a bare ``raise``
    (log-and-re-raise handlers), so the exception escapes anyway and daifu may
    intercept it first.
    """

    test: Ref | None
    text: str = ""
    bare: bool = False
    reraises: bool = False
    lineno: int | None = None
    col: int | None = None


@dataclass(eq=False)
class ExceptGuard:
    """A ``try/except`` around the cell; catches when one of its clauses matches."""

    clauses: tuple[Clause, ...]
    kind: str = "except"


@dataclass(eq=False)
class WithGuard:
    """A ``with`` around the cell; ``slot`` is the value-stack index of its
    ``__exit__``.  ``context`` is the context expression as a ``Ref`` when it is
    a plain name/attribute chain, or the *callee* of a call (``torch.no_grad()``)
    with ``called`` set -- how callers' ``with`` blocks are classified without
    access to their value stack."""

    slot: int
    context: Ref | None = None
    called: bool = False
    args: tuple[Ref, ...] = ()
    kind: str = "with"


@dataclass(eq=False)
class FinallyGuard:
    """A ``finally`` around the cell; it runs and re-raises (``swallows`` if it
    contains ``return``/``break``/``continue``)."""

    swallows: bool = False
    kind: str = "finally"


@dataclass(eq=False)
class OpaqueGuard:
    """A handler daifu cannot reason about (``except*``, unknown shape): assume
    it catches, so daifu never takes an exception the program might handle."""

    reason: str
    kind: str = "opaque"


Guard = ExceptGuard | WithGuard | FinallyGuard | OpaqueGuard


@dataclass(eq=False)
class CodeInfo:
    """What daifu knows about one vaccinated code object."""

    qualname: str
    filename: str
    firstlineno: int
    module: str | None = None
    cells: list[Cell] = field(default_factory=list)
    #: (start, stop, cell, retry copy?) byte ranges of the rewritten code; filled lazily
    ranges: list[tuple[int, int, Cell, bool]] | None = None
    original: types.CodeType | None = None

    def __repr__(self) -> str:
        where = f"{self.filename}:{self.firstlineno}"
        return f"<CodeInfo {self.qualname} {where} cells={len(self.cells)}>"


class Capabilities:
    """``can_retry``/``can_skip``/``can_continue`` from the ``*_reason`` fields
    (None: possible; otherwise why not)."""

    retry_reason: str | None
    skip_reason: str | None
    continue_reason: str | None

    @property
    def can_retry(self) -> bool:
        return self.retry_reason is None

    @property
    def can_skip(self) -> bool:
        return self.skip_reason is None

    @property
    def can_continue(self) -> bool:
        return self.continue_reason is None


@dataclass(eq=False)
class Cell(Capabilities):
    """One recoverable run of a statement (see module docstring)."""

    info: CodeInfo
    index: int
    lineno: int | None
    end_lineno: int | None
    col: int | None
    end_col: int | None
    #: ``ast`` class name of the statement (``Assign``, ``For`` ...).
    stmt: str
    #: what the run is: ``statement``, ``loop-header``, ``loop-init``,
    #: ``condition``, ``with-enter``, ``with-exit``, ``match``, ``return``,
    #: ``raise``, ``loop-end``.
    role: str
    source: str
    retry_reason: str | None
    skip_reason: str | None
    #: what skip does, in words ("continue after the statement", "end the loop").
    skip_effect: str | None
    guards: tuple[Guard, ...]
    #: why ``CONTINUE`` (go on with the innermost loop's next item) is not
    #: possible here, or None when it is
    continue_reason: str | None = "not inside a for loop"
    #: the barrier receives every value-stack item below the cell's base depth
    #: (slot 0 first); ``with_slots`` are the slots holding the ``__exit__`` of
    #: each enclosing ``with`` (innermost first), ``iterator_slot`` the loop
    #: iterator of a loop-header cell
    with_slots: tuple[int, ...] = ()
    iterator_slot: int | None = None
    #: base value-stack depth of the run (diagnostics).
    depth: int = 0
    #: for a ``match`` run: ((pattern/guard spans), "case ...:", line) per case,
    #: so a crash report can name the case whose pattern or guard failed
    cases: tuple = ()

    def describe(self, position: tuple | None) -> tuple[str, int | None]:
        """(statement text, line) for the failing instruction at ``position``."""
        if self.cases and position:
            from ._source import contains

            for spans, text, line in self.cases:
                if any(contains(span, position) for span in spans):
                    return text, line
        return self.source, self.lineno

    def __repr__(self) -> str:
        return (
            f"<Cell {self.info.qualname}#{self.index} line {self.lineno} {self.role} "
            f"{self.source[:40]!r}>"
        )


def cells_of(code: types.CodeType) -> CodeInfo | None:
    """Return the ``CodeInfo`` of a vaccinated code object, or ``None``."""
    for const in code.co_consts:
        if type(const) is Cell:
            return const.info
    return None


def original_code(code: types.CodeType) -> types.CodeType:
    """The unmodified code a vaccinated code object (or a first-call stub)
    was made from (or itself)."""
    info = cells_of(code)
    if info is not None and info.original is not None:
        return info.original
    from ._lazy import pending_of

    pending = pending_of(code)
    return pending.original if pending is not None else code


def is_vaccinated(code: Any) -> bool:
    """True if ``code`` (a code object) was produced by daifu's rewrite."""
    return isinstance(code, types.CodeType) and cells_of(code) is not None
