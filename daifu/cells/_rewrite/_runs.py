"""Runs of a statement's instructions that can be re-executed: the cells, and
what retry, skip and continue would do at each."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bytecode import Label

from ..._record import field, record
from .._cell import Cell
from .._source import ModuleSource
from ._analysis import _effect
from ._ops import INLINED_CALLS, PY, EntryKey, _label_arg, _Op
from ._opsets import _MACHINERY, _TERMINAL

if TYPE_CHECKING:
    import ast


@record
class _Run:
    start: int
    base: int
    stmt: ast.stmt
    entry: EntryKey | None
    stop: int = 0  # exclusive
    cell: Cell | None = None
    stub: Label = field(default_factory=Label)
    copy: Label = field(default_factory=Label)
    skip_target: int | None = None
    skip_pops: int = 0
    continue_target: int | None = None
    role: str = ""

    def __contains__(self, i: int) -> bool:
        return self.start <= i < self.stop


def _build_runs(ops: list[_Op], label_at: dict[Label, int], stmts: list) -> list[_Run]:
    forced: set[int] = set()
    while True:
        runs: list[_Run] = []
        run: _Run | None = None
        for i, op in enumerate(ops):
            depth = op.depth
            stmt = stmts[i]
            if depth is None or stmt is None or op.instr.name in _MACHINERY:
                if run is not None:
                    runs.append(run)
                    run = None
                continue
            touch = depth + op.shape.touch  # (``_touch``: the analysis gave it its shape)
            if (
                run is not None
                and i not in forced
                and run.stmt is stmt
                and run.entry == op.entry
                and touch >= run.base
            ):
                run.stop = i + 1
                continue
            if run is not None:
                runs.append(run)
                run = None
            if touch >= depth and (op.entry is None or op.entry[2] <= depth) \
                    and not op.nulls & ((1 << depth) - 1):
                # (the stub hands every value below the base to the engine:
                # none of them may be a NULL of a call being set up)
                run = _Run(start=i, base=depth, stmt=stmt, entry=op.entry, stop=i + 1)
        if run is not None:
            runs.append(run)

        # A cell must be entered only at its start: split where a jump from
        # outside the cell lands inside it.
        owner: dict[int, _Run] = {}
        for r in runs:
            for i in range(r.start, r.stop):
                owner[i] = r
        new_forced = set()
        for j, op in enumerate(ops):
            if not (op.shape.jumps if op.shape is not None else op.instr.has_jump()):
                continue
            t = label_at[_label_arg(op.instr)]
            hit = owner.get(t)
            if hit is not None and t != hit.start and owner.get(j) is not hit:
                new_forced.add(t)
        if new_forced <= forced:
            return _before_inlined_calls(runs, ops) if PY.inline_call_unwind else runs
        forced |= new_forced


def _before_inlined_calls(runs: list[_Run], ops: list[_Op]) -> list[_Run]:
    """3.13 looks up the handler of an exception coming back from a frame a
    call runs inline at the instruction *before* the call (``PY.
    inline_call_unwind``): that instruction must have the call's entry.  A
    run followed by such a call outside it (a decorator applied after the
    function is made, ``__exit__`` called after its arguments are loaded)
    gives its last instruction back to the call's handler; with its stub's
    depth the unwinding would leave the stack inconsistent, and CPython
    would crash.  (A run that *starts* at such a call -- a loop header's
    ``FOR_ITER`` -- gets a NOP of its own before it: ``emit``.)"""
    starts = {r.start for r in runs}
    kept = []
    for run in runs:
        while run.stop < len(ops) and run.stop > run.start \
                and ops[run.stop].instr.name in INLINED_CALLS and run.stop not in starts:
            run.stop -= 1
        if run.stop > run.start:
            kept.append(run)
    return kept


def _drop_implicit_returns(ops: list[_Op], stmts: list) -> None:
    """The ``return None`` the compiler adds at the end of a function (or
    module) carries the location of the last statement; it is not part of
    that statement (which then ends where skip can continue: at that return)."""
    import ast  # lazy: 1.3 ms

    if PY.return_const:  # 3.12, 3.13: RETURN_CONST None
        for i, op in enumerate(ops):
            if (op.instr.name == "RETURN_CONST" and op.instr.arg is None
                    and stmts[i] is not None and not isinstance(stmts[i], ast.Return)):
                stmts[i] = None
        return
    for i in range(1, len(ops)):  # LOAD_CONST None, RETURN_VALUE
        if (ops[i].instr.name == "RETURN_VALUE" and ops[i - 1].instr.name == "LOAD_CONST"
                and ops[i - 1].instr.arg is None and stmts[i] is not None
                and stmts[i] is stmts[i - 1] and not isinstance(stmts[i], ast.Return)):
            stmts[i] = stmts[i - 1] = None


def _role(run: _Run, ops: list[_Op]) -> str:
    names = {ops[i].instr.name for i in range(run.start, run.stop)}
    kind = type(run.stmt).__name__
    if kind in ("For", "AsyncFor"):
        if "FOR_ITER" in names:
            return "loop-header"
        if "GET_ITER" in names or "GET_AITER" in names:
            return "loop-init"
        return "loop-end"
    if kind in ("While", "If"):
        return "condition"
    if kind in ("With", "AsyncWith"):
        return "with-enter" if "BEFORE_WITH" in names else "with-exit"
    if kind == "Match":
        return "match"
    if kind == "Return":
        return "return"
    if kind == "Raise":
        return "raise"
    if kind in ("Try", "TryStar"):
        return "except-clause"
    return "statement"


_SIMPLE = frozenset(
    {"Expr", "Assign", "AugAssign", "AnnAssign", "Delete", "Assert", "Import", "ImportFrom",
     "Pass", "Global", "Nonlocal", "FunctionDef", "AsyncFunctionDef", "ClassDef"}
)


def _exits(run: _Run, ops: list[_Op], label_at: dict[Label, int]) -> list[tuple[int, int, int]]:
    """Edges leaving the run: (from index, target index, depth at target)."""
    out = []
    for i in range(run.start, run.stop):
        instr = ops[i].instr
        depth = ops[i].depth
        assert depth is not None  # a run only holds instructions with a known depth
        if instr.has_jump():
            t = label_at[_label_arg(instr)]
            if t not in run:
                out.append((i, t, depth + _effect(instr, True)))
        if instr.name not in _TERMINAL and i + 1 not in run:
            out.append((i, i + 1, depth + _effect(instr, False)))
    return out


def _plan_skip(run: _Run, role: str, ops, label_at) -> tuple[str | None, str | None]:
    """Decide whether skip is possible; set run.skip_target.  Returns
    (reason it is not, what it does)."""
    exits = _exits(run, ops, label_at)
    if role == "loop-header":
        for i, t, depth in exits:
            if ops[i].instr.name != "FOR_ITER":
                continue
            if not PY.end_for_skips:  # 3.11: past the loop, the iterator popped
                if depth == run.base - 1:
                    run.skip_target, run.skip_pops = t, 1
                    return None, "end the loop as if the iterator were exhausted"
            # 3.13: an exhausted FOR_ITER pops the iterator and goes on after
            # the END_FOR and POP_TOP it targets (bytecode models them as run)
            elif (t + 2 < len(ops)
                    and ops[t].instr.name == "END_FOR" and ops[t + 1].instr.name == "POP_TOP"
                    and ops[t + 2].depth == run.base - 1):
                run.skip_target, run.skip_pops = t + 2, 1
                return None, "end the loop as if the iterator were exhausted"
        return "the loop's exit could not be located", None
    if role != "statement" or type(run.stmt).__name__ not in _SIMPLE:
        return f"skip is offered for simple statements and loop headers, not a {role}", None
    targets = {(t, depth) for _, t, depth in exits}
    if len(targets) == 1:
        t, depth = targets.pop()
        if depth == run.base:
            run.skip_target = t
            return None, "continue after the statement"
    return "the statement has no single continuation", None


def _plan_continue(run: _Run, headers: dict[int, _Run], msrc: ModuleSource) -> str | None:
    """``CONTINUE`` jumps to the innermost for loop's header, like a ``continue``
    statement -- possible only when no ``try``/``with`` lies between (their
    exits would be skipped) and the stack holds nothing beyond the loop's own.
    At a failing loop header it is the loop's next item: ``next()`` again."""
    if run.role == "loop-header":
        run.continue_target = run.start
        return None
    loop = msrc.enclosing_loop(run.stmt)
    if loop is None:
        return "not inside a loop"
    if type(loop).__name__ != "For":
        return "only for loops support continue (this is a while loop)"
    header = headers.get(id(loop))
    if header is None:
        return "the loop header could not be located"
    if run.entry != header.entry or run.base != header.base:
        return "a try, with or except block between the statement and the loop would be skipped"
    run.continue_target = header.start
    return None
