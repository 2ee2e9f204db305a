"""Version-neutral descriptions of vaccinated code: cells, guards, code info.

A *cell* is the unit of recovery: one contiguous run of a statement's
bytecode that daifu can re-execute from its start (retry) and, for simple
statements, jump over (skip).  The rewrite (``_rewrite``) builds one ``Cell``
per run.  The rewritten code holds only plain constants (it can be marshalled,
cached, and shipped by value to a process without daifu, where it runs
unprotected): each cell's stub loads ``(CELL_MARK, key, index)``, and the
barrier finds the cell by that key in this process's registry of
``CodeInfo`` (``resolve``).  Nothing of this is on the normal path.

*Guards* describe what the function's own exception handlers would do with an
exception raised in the cell, innermost first.  The engine evaluates them at
the crash to decide whether the user's code would catch the exception (then
daifu stays out of the way) or whether it would escape the function (then it
is a crash).
"""

from __future__ import annotations

import itertools
import os
import types

from .._record import field, record
from .._runtime import RUNTIME, state_record

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)
if TYPE_CHECKING:
    from typing import Any

#: what a crash barrier answers; the stub the rewrite appends to every cell
#: dispatches on it.  Besides these codes, an answer can be a 2-tuple
#: ``(function, args)``: continue in new code (after a reload) -- the frame
#: returns ``function(*args)`` -- or a 1-tuple ``(exception,)``: raise that
#: exception instead (a rule's ``SystemExit``), where the statement failed.
RETRY_CODE, SKIP_CODE, RAISE_CODE, CONTINUE_CODE = 0, 1, 2, 3


def jump_answer(cell_index: int, code: int) -> int:
    """What the barrier hands the stub for a retry, skip or continue of cell
    ``cell_index``: the cells of a function share their stub code, and each
    (cell, jump) has its own number to dispatch on (never ``RAISE_CODE``)."""
    return 4 * cell_index + code


@record(frozen=True)
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


@record(eq=False)
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


@record(eq=False)
class ExceptGuard:
    """A ``try/except`` around the cell; catches when one of its clauses matches."""

    clauses: tuple[Clause, ...]
    kind: str = "except"


@record(eq=False)
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


@record(eq=False)
class FinallyGuard:
    """A ``finally`` around the cell; it runs and re-raises (``swallows`` if it
    contains ``return``/``break``/``continue``)."""

    swallows: bool = False
    kind: str = "finally"


@record(eq=False)
class OpaqueGuard:
    """A handler daifu cannot reason about (``except*``, unknown shape): assume
    it catches, so daifu never takes an exception the program might handle."""

    reason: str
    kind: str = "opaque"


Guard = ExceptGuard | WithGuard | FinallyGuard | OpaqueGuard

#: the builtin through which the stubs read the engine's ``passing`` list
#: (``use_barrier`` installs it; ``_rewrite._emit._passing``): a name, so
#: that rewritten code holds plain constants and, in a process without
#: daifu's engine, finds nothing and re-raises as if daifu were not there
PASSING = "__daifu_passing__"
#: what that list holds, by index: the exception passing on and the
#: constant of the stub of the frame that catches it, "quiet"
#: (``engine._fastpath.passing``); then what every barrier call needs
#: (``use_barrier``): ``sys``, the barrier, and ``sys.getprofile`` and
#: ``sys.gettrace`` as method-wrappers (called through ``__call__``: no
#: profile event); what an armed function's trap calls (``_armed``); the
#: quick check every stub calls first (a method-wrapper too)
(P_EXC, P_STUB, P_QUIET, P_SYS, P_BARRIER, P_GETPROFILE, P_GETTRACE, P_UPGRADE,
 P_QUICK) = range(9)


def own_catch(guards) -> str | None:
    """The name of the class the innermost handler of ``guards`` catches
    first, where it can be tested without the general evaluator (a stub
    tests its own group's, the engine a caller's it remembers: see
    ``engine._fastpath.ROUTES``): an ``except Name:``
    (a global or builtin, read as the handler reads it) that does not
    re-raise; None otherwise (a ``with``, a tuple, an attribute, a local,
    a bare ``except``, or ``BaseException``, which daifu's own pause
    request derives from)."""
    if not guards or not isinstance(guards[0], ExceptGuard):
        return None
    if not guards[0].clauses:
        return None
    clause = guards[0].clauses[0]
    test = clause.test
    if (test is None or clause.bare or clause.reraises or test.scope != "global"
            or test.attrs or test.items is not None or test.is_const
            or test.name == "BaseException"):
        return None
    return test.name


def own_test(guards) -> tuple[str, str] | None:
    """What a stub tests of its own group's handler: ``("global", name)``
    (``own_catch``; read with ``LOAD_GLOBAL``), or, in module and class
    bodies, ``("name", name)`` for an ``except Name:`` read with
    ``LOAD_NAME`` -- the handler's own lookup; None otherwise."""
    name = own_catch(guards)
    if name is not None:
        return ("global", name)
    if not guards or not isinstance(guards[0], ExceptGuard) or not guards[0].clauses:
        return None
    clause = guards[0].clauses[0]
    test = clause.test
    if (test is None or clause.bare or clause.reraises or test.scope != "name"
            or test.attrs or test.items is not None or test.is_const or not test.name
            or test.name == "BaseException"):
        return None
    return ("name", test.name)


def route_catch(guards) -> str | tuple[str, ...] | None:
    """What a remembered route (``engine._fastpath.ROUTES``) checks of the
    handler that catches: ``own_catch``'s name, or the names of an ``except
    (A, B):`` whose items are all such names; None otherwise."""
    name = own_catch(guards)
    if name is not None:
        return name
    if not guards or not isinstance(guards[0], ExceptGuard) or not guards[0].clauses:
        return None
    clause = guards[0].clauses[0]
    test = clause.test
    if test is None or clause.bare or clause.reraises or test.items is None or test.attrs \
            or test.is_const or not test.items:
        return None
    names = []
    for item in test.items:
        if (item.scope != "global" or item.attrs or item.items is not None or item.is_const
                or not item.name or item.name == "BaseException"):
            return None
        names.append(item.name)
    return tuple(names)


@record(eq=False)
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
    #: what the rewritten code's cell constants name it by (``resolve``):
    #: unique in this process, and kept when the code cache stores it
    key: str = ""
    #: the text of the source this code was made from, once a reload made
    #: another text the file's running source (None: the registry's text)
    source: str | None = None
    #: armed (``_armed``): the code made at import holds only traps; its
    #: vaccinated code (``upgraded``, with the cells) is made at its first
    #: exception, or when something asks for its cells (``cells_of``)
    armed: bool = False
    upgraded: types.CodeType | None = None
    #: armed code: the handlers around each group of cells (a trap's, by the
    #: index its constant holds): what the engine asks of a caller, or of
    #: the program's own exceptions, without making the cells
    traps: list = field(default_factory=list)
    #: where the armed code's traps begin: below it, both codes hold the same
    #: instructions at the same offsets (the cells' ranges are the vaccinated
    #: code's)
    armed_end: int = 0
    #: why the armed code could not be vaccinated (it then runs as it is)
    refused: str | None = None
    #: exceptions the program handled at armed code's traps (``engine._barrier``)
    handled: int = 0

    def __post_init__(self) -> None:
        if not self.key:
            where = f"{self.filename}:{self.firstlineno}"
            self.key = f"{self.qualname}@{where}#{_TOKEN}.{next(_SERIAL)}"
        _INFOS[self.key] = self

    def __setstate__(self, state: dict) -> None:  # (loaded from the code cache)
        self.__dict__.update(state)
        _INFOS[self.key] = self

    def __getstate__(self) -> dict:  # (the upgrade is this process's, not the cache's)
        state = dict(self.__dict__)
        if self.armed:
            state.update(upgraded=None, refused=None, cells=[], ranges=None, armed_end=0,
                         handled=0)
        return state

    def ref(self, cell: Cell) -> tuple:
        """The constant a cell's stub loads (see ``resolve``)."""
        return (CELL_MARK, self.key, cell.index)

    def __repr__(self) -> str:
        where = f"{self.filename}:{self.firstlineno}"
        return f"<CodeInfo {self.qualname} {where} cells={len(self.cells)}>"


#: the first item of the constant each cell's stub loads: (CELL_MARK, key, index)
CELL_MARK = "daifu.cell"
#: the first item of the constant an armed function's traps load:
#: (ARMED_MARK, key, index of the trap's group in ``CodeInfo.traps``)
ARMED_MARK = "daifu.armed"
#: every CodeInfo made or loaded in this process, by key (a vaccinated
#: function's code refers to its info only through the key)
_INFOS: dict[str, CodeInfo] = {}
_TOKEN = os.urandom(4).hex()
_SERIAL = itertools.count()


def discard(info: CodeInfo) -> None:
    """Forget ``info`` (a throwaway rewrite's, ``_rewrite._core.warm``)."""
    _INFOS.pop(info.key, None)


def code_infos() -> list[CodeInfo]:
    """Every vaccinated code object's info this process knows (a snapshot)."""
    return list(_INFOS.values())


def is_cell_ref(value: Any) -> bool:
    """Is ``value`` the constant a cell's stub loads?"""
    return (type(value) is tuple and len(value) == 3 and value[0] == CELL_MARK
            and type(value[1]) is str and type(value[2]) is int)


def resolve(ref: Any) -> Cell | None:
    """The cell a stub's constant names, if this process knows it."""
    if not is_cell_ref(ref):
        return None
    info = _INFOS.get(ref[1])
    if info is None:
        return None
    cells, index = info.cells, ref[2]
    if 0 <= index < len(cells) and cells[index].index == index:
        return cells[index]
    return next((c for c in cells if c.index == index), None)


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


@record(eq=False)
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
            from ._source import contains  # lazy: 17.3 ms

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
    """Return the ``CodeInfo`` of a vaccinated code object, or ``None``.  For
    armed code, its cells are made first (``_armed``: the rewrite, not the
    upgrade of a running frame); None if it cannot be vaccinated."""
    info = info_of(code)
    if info is not None and info.armed and info.upgraded is None:
        complete = _state.complete
        if info.refused is not None or complete is None or complete(info, code) is None:
            return None
    return info


def info_of(code: types.CodeType) -> CodeInfo | None:
    """The ``CodeInfo`` of vaccinated or armed code as it is (``cells_of``
    without making an armed function's cells): for its original code."""
    info = _INFO_BY_ID.find(id(code), code)
    if info is MISSING:
        info = _scan(code)
        _INFO_BY_ID.keep(id(code), code, info)
    return info


def _scan(code: types.CodeType) -> CodeInfo | None:
    for const in code.co_consts:
        if is_cell_ref(const):
            cell = resolve(const)
            return cell.info if cell is not None else None
        if type(const) is tuple and len(const) == 3 and const[0] == ARMED_MARK:
            info = _INFOS.get(const[1]) if type(const[1]) is str else None
            return info if info is not None and info.armed else None
    return None


@state_record
class _Wired:
    """What the transform gives this module (``use_completion``)."""

    #: ``complete(info, armed code)``: the vaccinated code of armed code
    #: (its cells in ``info``), or None
    complete: Any = None


_state = RUNTIME.part(__name__, _Wired())


def use_completion(complete: Any) -> None:
    """``complete(info, armed code)`` (``_armed.complete``)."""
    _state.complete = complete


class IdentityMemo:
    """A bounded memo of values computed from an object, keyed by its id
    (and anything else): hashing a code object hashes its bytecode and
    constants on every call (~0.15 us for a small function, more for a large
    one), and the handled-exception path asks for every caller.  An entry
    holds its object, so the id is not reused while the entry stands; the
    oldest entry goes first past ``limit``."""

    def __init__(self, limit: int = 4096) -> None:
        #: key -> (obj, value): a hot loop may read it in place, as ``find`` does
        self.entries: dict = {}
        self._limit = limit

    def find(self, key: object, obj: object) -> Any:
        """The value kept for ``obj`` under ``key``, or ``MISSING``."""
        hit = self.entries.get(key)
        return hit[1] if hit is not None and hit[0] is obj else MISSING

    def keep(self, key: object, obj: object, value: object) -> None:
        entries = self.entries
        entries[key] = (obj, value)
        if len(entries) > self._limit:
            try:
                del entries[next(iter(entries))]
            except (KeyError, RuntimeError, StopIteration):  # (another thread got there first)
                pass


MISSING = object()
#: id(code) -> its info (a code object's info never changes once it exists)
_INFO_BY_ID = IdentityMemo()


def is_vaccinated(code: Any) -> bool:
    """True if ``code`` (a code object) was produced by daifu's rewrite
    (armed or vaccinated)."""
    return isinstance(code, types.CodeType) and info_of(code) is not None
