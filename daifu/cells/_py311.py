"""Bytecode rewrite for CPython 3.11 (the "in-frame barrier").

Nothing is added to the normal execution path.  For every *cell* (a run of one
statement's instructions that can be re-executed from its start) the rewrite

* points the exception table of the cell's instructions at a per-cell *stub*
  appended to the code, with the cell's base stack depth and ``lasti`` pushed.
  CPython then unwinds only to that depth: outer loop iterators, ``with``
  exits and ``except`` state stay on the value stack, the frame stays alive;
* the stub calls the engine's barrier ``barrier(exc, cell, lasti, stackvals)``
  while the frame is suspended and dispatches on its answer (``_cell``'s
  ``*_CODE``): retry, skip, continue, new code; anything else re-raises.  The
  re-raise is a ``RERAISE 1`` covered by the exception-table entry the
  instruction originally had, so the user's handlers, ``with`` exits and
  ``finally`` blocks run exactly as before, with the original traceback and
  ``f_lasti``;
* retry jumps to a *copy* of the cell, appended too: a retried statement that
  fails again has its ``lasti`` in the copy, which is how the engine counts
  attempts without any cost when nothing crashed;
* the engine runs with the program's tracer and profiler suspended (the stub
  switches them off around the barrier call with builtins, which create no
  frames), and daifu's instructions carry no line numbers: a debugger,
  coverage or a profiler sees no event of daifu's.

Only CPython 3.11 is handled here; ``_dispatch`` refuses other versions.
"""

from __future__ import annotations

import ctypes
import sys
import types
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from bytecode import Bytecode, Compare, Instr, Label, TryBegin, TryEnd
from bytecode.instr import CellVar, FreeVar, InstrLocation

from ._cell import (
    CONTINUE_CODE,
    RAISE_CODE,
    RETRY_CODE,
    SKIP_CODE,
    Cell,
    Clause,
    CodeInfo,
    ExceptGuard,
    FinallyGuard,
    Guard,
    OpaqueGuard,
    Ref,
    WithGuard,
)
from ._source import ModuleSource

if TYPE_CHECKING:
    import ast

assert sys.version_info[:2] == (3, 11), "daifu.cells._py311 is for CPython 3.11 only"

PYTHON = (3, 11)
_CO_OPTIMIZED = 0x1
_LOAD_CONST = 100  # dis.opmap["LOAD_CONST"]
_EXTENDED_ARG = 144  # dis.opmap["EXTENDED_ARG"]


# ``Instr.arg`` is typed as the union of every opcode's argument type: these
# only tell the type checker which one an instruction has (no runtime check).
def _int_arg(instr: Instr) -> int:
    return cast(int, instr.arg)


def _label_arg(instr: Instr) -> Label:
    return cast(Label, instr.arg)



class Unsupported(Exception):
    """This code object cannot be rewritten; the message says why."""


class NothingToProtect(Unsupported):
    """The code has no statement of its own (``def f(): pass``): nothing in it
    can fail, so there is nothing to rewrite (and nothing to warn about)."""


# The exception-handling machinery: never part of a cell.
_MACHINERY = frozenset(
    {
        "PUSH_EXC_INFO",
        "POP_EXCEPT",
        "CHECK_EXC_MATCH",
        "CHECK_EG_MATCH",
        "PREP_RERAISE_STAR",
        "WITH_EXCEPT_START",
        "RERAISE",
        "END_ASYNC_FOR",
        "RETURN_GENERATOR",
        "COPY_FREE_VARS",
        "MAKE_CELL",
        "RESUME_QUICK",
    }
)
# No fall-through to the next instruction.
_TERMINAL = frozenset(
    {
        "RETURN_VALUE",
        "RAISE_VARARGS",
        "RERAISE",
        "JUMP_FORWARD",
        "JUMP_BACKWARD",
        "JUMP_BACKWARD_NO_INTERRUPT",
    }
)
_BACKWARD = {
    "JUMP_FORWARD": "JUMP_BACKWARD",
    "POP_JUMP_FORWARD_IF_TRUE": "POP_JUMP_BACKWARD_IF_TRUE",
    "POP_JUMP_FORWARD_IF_FALSE": "POP_JUMP_BACKWARD_IF_FALSE",
    "POP_JUMP_FORWARD_IF_NONE": "POP_JUMP_BACKWARD_IF_NONE",
    "POP_JUMP_FORWARD_IF_NOT_NONE": "POP_JUMP_BACKWARD_IF_NOT_NONE",
}
_FORWARD_ONLY = frozenset({"FOR_ITER", "SEND", "JUMP_IF_TRUE_OR_POP", "JUMP_IF_FALSE_OR_POP"})
# Cleanup code that a handler runs on its way to re-raising.
_PASS_THROUGH = frozenset(
    {
        "COPY",
        "POP_EXCEPT",
        "LOAD_CONST",
        "STORE_FAST",
        "STORE_NAME",
        "STORE_DEREF",
        "STORE_GLOBAL",
        "DELETE_FAST",
        "DELETE_NAME",
        "DELETE_DEREF",
        "DELETE_GLOBAL",
        "POP_TOP",
        "SWAP",
        "NOP",
    }
)
_CLAUSE_STOP = frozenset(
    {"STORE_FAST", "STORE_NAME", "STORE_DEREF", "STORE_GLOBAL", "STORE_ATTR", "STORE_SUBSCR",
     "POP_TOP", "RETURN_VALUE", "RERAISE", "RAISE_VARARGS", "JUMP_FORWARD", "JUMP_BACKWARD",
     "NOP", "PUSH_EXC_INFO", "POP_EXCEPT", "YIELD_VALUE", "FOR_ITER", "BEFORE_WITH"}
)

EntryKey = tuple  # (handler Label, push_lasti: bool, depth: int)


@dataclass
class _Op:
    instr: Instr
    entry: EntryKey | None
    depth: int | None = None


@dataclass
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


# -- frame locals (the frame-context mapping writes through this) ---------------

_locals_to_fast = ctypes.pythonapi.PyFrame_LocalsToFast
_locals_to_fast.argtypes = [ctypes.py_object, ctypes.c_int]
_locals_to_fast.restype = None


_decref = ctypes.pythonapi.Py_DecRef
_decref.argtypes = [ctypes.py_object]
_decref.restype = None


class _LocalsSnapshot:
    """``frame.f_locals`` of a function frame, taken so that the frame is left
    exactly as it was.

    3.11's ``f_locals`` (``PyFrame_FastToLocalsWithError``) builds a dict of
    the variables *into the frame* and keeps it there until the frame dies:
    every value it held -- the step's batch, an ``obj`` the program set to
    None -- would stay alive after the program let go of it.  If the frame had
    no such dict before (the usual case), it is detached again; if it had one
    (the program called ``locals()``, a tracer runs), its contents are put
    back."""

    def __init__(self, frame: types.FrameType):
        self.frame = frame
        self.inner = _interpreter_frame(frame)
        self.had = bool(self.inner.f_locals) if self.inner is not None else True
        self.previous: dict | None = None
        if self.inner is not None and self.had:
            self.previous = dict(ctypes.cast(self.inner.f_locals, ctypes.py_object).value)

    def __enter__(self) -> dict:
        self.snapshot = self.frame.f_locals
        return self.snapshot

    def __exit__(self, *exc) -> None:
        snapshot, inner = self.snapshot, self.inner
        if inner is None:
            return  # layout unknown: leave the dict on the frame (correct, not lean)
        if self.had:
            if self.previous is not None:
                snapshot.clear()
                snapshot.update(self.previous)
        elif inner.f_locals == id(snapshot):
            inner.f_locals = None  # the frame's reference ...
            _decref(snapshot)  # ... is dropped; ours goes when this returns
        else:  # pragma: no cover - someone replaced it in between
            snapshot.clear()


def read_locals(frame: types.FrameType) -> dict:
    """A new dict of a frame's variables, leaving the frame as it was (see
    ``_LocalsSnapshot``).  Namespace frames (module, class body) return
    their namespace itself."""
    if not frame.f_code.co_flags & _CO_OPTIMIZED:
        return frame.f_locals
    with _LocalsSnapshot(frame) as snapshot:
        return dict(snapshot)


def write_locals(frame: types.FrameType, values: dict, deleted: tuple[str, ...] = ()) -> None:
    """Store into a suspended function frame's fast locals (and cells).

    3.11 has no write-through ``f_locals``: refresh the snapshot dict, change
    it, and copy it back with ``PyFrame_LocalsToFast`` (what pdb relies on);
    the frame is then left without the snapshot as before."""
    with _LocalsSnapshot(frame) as snapshot:
        snapshot.update(values)
        for name in deleted:
            snapshot.pop(name, None)
        _locals_to_fast(frame, 1)


class _FrameObject(ctypes.Structure):
    _fields_ = [("ob_refcnt", ctypes.c_ssize_t), ("ob_type", ctypes.c_void_p),
                ("f_back", ctypes.c_void_p), ("f_frame", ctypes.c_void_p)]


class _InterpreterFrame(ctypes.Structure):  # CPython 3.11 Include/internal/pycore_frame.h
    _fields_ = [("f_func", ctypes.c_void_p), ("f_globals", ctypes.c_void_p),
                ("f_builtins", ctypes.c_void_p), ("f_locals", ctypes.c_void_p),
                ("f_code", ctypes.c_void_p), ("frame_obj", ctypes.c_void_p),
                ("previous", ctypes.c_void_p), ("prev_instr", ctypes.c_void_p),
                ("stacktop", ctypes.c_int), ("is_entry", ctypes.c_bool)]


def _interpreter_frame(frame: types.FrameType) -> _InterpreterFrame | None:
    """The interpreter frame behind a frame object, if its layout is the one we
    know (checked against the frame's code and frame object); None otherwise --
    nothing else in it is read then."""
    try:
        outer = _FrameObject.from_address(id(frame))
        if not outer.f_frame:
            return None
        inner = _InterpreterFrame.from_address(outer.f_frame)
        if inner.f_code != id(frame.f_code) or inner.frame_obj != id(frame):
            return None
        return inner
    except Exception:
        return None


def called_from_c(frame: types.FrameType) -> bool | None:
    """Was this (executing) frame entered from C code -- a builtin such as
    ``getattr``/``list``, a type call, a protocol slot -- rather than by a
    Python-to-Python call?  None if the layout check fails."""
    inner = _interpreter_frame(frame)
    return None if inner is None else bool(inner.is_entry)


def running_function(frame: types.FrameType) -> types.FunctionType | None:
    """The function object executing ``frame`` (kept in the interpreter frame's
    first field, ``f_func``; checked against the frame's code)."""
    inner = _interpreter_frame(frame)
    if inner is not None and inner.f_func:
        func = ctypes.cast(inner.f_func, ctypes.py_object).value
        if isinstance(func, types.FunctionType) and func.__code__ is frame.f_code:
            return func
    import gc

    candidates = [r for r in gc.get_referrers(frame.f_code)
                  if isinstance(r, types.FunctionType) and r.__code__ is frame.f_code]
    return candidates[0] if len(candidates) == 1 else None


# -- reading rewritten code ---------------------------------------------------------


def cell_ranges(code: types.CodeType) -> list[tuple[int, int, Cell, bool]]:
    """(start, stop, cell, is the retry copy) in byte offsets of rewritten
    ``code``: the ranges of its exception table that lead to a cell's stub
    (whose first instruction loads the cell).  A cell's first range is its
    original instructions; a later one is its retry copy (appended)."""
    import dis

    raw, consts = code.co_code, code.co_consts
    found: list[tuple[int, int, Cell]] = []
    # private (not in typeshed's dis stub), stable in 3.11
    entries = dis._parse_exception_table(code)  # type: ignore[attr-defined]  # noqa: SLF001
    for entry in entries:
        offset, ext = entry.target, 0
        while offset + 1 < len(raw) and raw[offset] == _EXTENDED_ARG:
            ext = (ext | raw[offset + 1]) << 8
            offset += 2
        if offset + 1 < len(raw) and raw[offset] == _LOAD_CONST:
            arg = ext | raw[offset + 1]
            if arg < len(consts) and type(consts[arg]) is Cell:
                found.append((entry.start, entry.end, consts[arg]))
    seen: set[int] = set()
    out = []
    for start, stop, cell in sorted(found, key=lambda r: r[0]):
        out.append((start, stop, cell, id(cell) in seen))
        seen.add(id(cell))
    return out


def lasti_offset(lasti: int) -> int:
    """The byte offset of instruction number ``lasti`` (what a barrier receives)."""
    return lasti * 2


# -- decoding and analysis ------------------------------------------------------


def _flatten(bc: Bytecode) -> tuple[list[_Op], dict[Label, int]]:
    ops: list[_Op] = []
    label_at: dict[Label, int] = {}
    pending: list[Label] = []
    current: TryBegin | None = None
    for item in bc:
        if isinstance(item, Label):
            pending.append(item)
        elif isinstance(item, TryBegin):
            current = item
        elif isinstance(item, TryEnd):
            if item.entry is current:
                current = None
        elif isinstance(item, Instr):
            for label in pending:
                label_at[label] = len(ops)
            pending.clear()
            key = None
            if current is not None:
                if not isinstance(current.stack_depth, int):
                    raise Unsupported("exception table entry without a stack depth")
                key = (current.target, bool(current.push_lasti), current.stack_depth)
            ops.append(_Op(item, key))
        else:
            raise Unsupported(f"unexpected bytecode item {item!r}")
    for label in pending:
        label_at[label] = len(ops)
    return ops, label_at


def _effect(instr: Instr, jump: bool) -> int:
    if instr.name == "RETURN_GENERATOR":
        return 1  # on resumption the sent value is on the stack (popped next)
    return instr.stack_effect(jump=jump)


def _analyse_depths(ops: list[_Op], label_at: dict[Label, int]) -> int:
    """Fill ``op.depth`` (stack depth before each instruction); return the max."""
    if not ops:
        raise Unsupported("empty code")
    for op in ops:
        op.depth = None
    peak = 0

    def flow(i: int, depth: int) -> None:
        nonlocal peak
        if i >= len(ops):
            raise Unsupported("control flow falls off the end of the code")
        if depth < 0:
            raise Unsupported(f"negative stack depth at instruction {i}")
        known = ops[i].depth
        if known is None:
            ops[i].depth = depth
            peak = max(peak, depth)
            work.append(i)
        elif known != depth:
            raise Unsupported(f"inconsistent stack depth at instruction {i}: {known} != {depth}")

    work: list[int] = []
    flow(0, 0)
    while work:
        i = work.pop()
        op = ops[i]
        depth = op.depth
        assert depth is not None
        instr = op.instr
        if op.entry is not None:
            target, lasti, edepth = op.entry
            flow(label_at[target], edepth + int(lasti) + 1)
        if instr.has_jump():
            after = depth + _effect(instr, True)
            peak = max(peak, after, depth + max(0, _effect(instr, True)))
            flow(label_at[_label_arg(instr)], after)
        if instr.name not in _TERMINAL:
            after = depth + _effect(instr, False)
            peak = max(peak, after)
            flow(i + 1, after)
    return peak


def _touch(instr: Instr, depth: int) -> int:
    """Lowest value-stack index the instruction removes or rewrites on its
    fall-through and error paths (reads do not count)."""
    name = instr.name
    arg = _int_arg(instr)  # only read below for opcodes with an int argument
    # bytecode's 3.11 stack model: PRECALL pops the arguments, CALL the
    # callable and self/NULL -- but PRECALL may rewrite those two slots
    if name == "PRECALL":
        return depth - (arg + 2)
    if name == "CALL":
        return depth - 2
    if name in ("COPY", "KW_NAMES", "FOR_ITER", "NOP", "RESUME"):
        return depth
    if name == "SWAP":
        return depth - arg
    if name in ("LIST_APPEND", "SET_ADD", "LIST_EXTEND", "SET_UPDATE", "DICT_UPDATE",
                "DICT_MERGE"):
        return depth - 1 - arg
    if name == "MAP_ADD":
        return depth - 2 - arg
    if instr.has_jump():
        pre = min(instr.pre_and_post_stack_effect(jump=True)[0],
                  instr.pre_and_post_stack_effect(jump=False)[0])
    else:
        pre = instr.pre_and_post_stack_effect()[0]
    return depth + min(pre, 0)


def _location(instr: Instr) -> tuple:
    loc = instr.location
    if loc is None:
        return (None, None, None, None)
    return (loc.lineno, loc.end_lineno, loc.col_offset, loc.end_col_offset)


# -- cells ------------------------------------------------------------------------


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
            touch = _touch(op.instr, depth)
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
            if touch >= depth and (op.entry is None or op.entry[2] <= depth):
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
            if not op.instr.has_jump():
                continue
            t = label_at[_label_arg(op.instr)]
            hit = owner.get(t)
            if hit is not None and t != hit.start and owner.get(j) is not hit:
                new_forced.add(t)
        if new_forced <= forced:
            return runs
        forced |= new_forced


def _drop_implicit_returns(ops: list[_Op], stmts: list) -> None:
    """The ``return None`` the compiler adds at the end of a function (or
    module) carries the location of the last statement; it is not part of
    that statement (which then ends where skip can continue: at that return)."""
    import ast

    for i in range(1, len(ops)):
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
            if ops[i].instr.name == "FOR_ITER" and depth == run.base - 1:
                run.skip_target, run.skip_pops = t, 1
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


# -- handler chains (what the function's own handlers would do) ------------------


def _ref_from_instrs(instrs: list[Instr]) -> Ref | None:
    """The clause's type expression as a side-effect-free ``Ref``, or None."""
    stack: list[Ref] = []
    for ins in instrs:
        name = ins.name
        if name == "LOAD_GLOBAL":
            push_null, gname = cast("tuple[bool, str]", ins.arg)
            if push_null:
                return None
            stack.append(Ref(gname, "global"))
        elif name == "LOAD_NAME":
            stack.append(Ref(cast(str, ins.arg), "name"))
        elif name == "LOAD_FAST":
            stack.append(Ref(cast(str, ins.arg), "fast"))
        elif name in ("LOAD_DEREF", "LOAD_CLASSDEREF"):
            var = ins.arg
            var_name = var.name if isinstance(var, (CellVar, FreeVar)) else cast(str, var)
            stack.append(Ref(var_name, "deref"))
        elif name == "LOAD_ATTR" and stack:
            base = stack.pop()
            if base.items is not None or base.is_const:
                return None
            stack.append(Ref(base.name, base.scope, base.attrs + (cast(str, ins.arg),)))
        elif name == "LOAD_CONST":
            stack.append(Ref(const=ins.arg, is_const=True))
        elif name == "BUILD_TUPLE" and len(stack) >= _int_arg(ins):
            items = tuple(stack[len(stack) - _int_arg(ins) :])
            del stack[len(stack) - _int_arg(ins) :]
            stack.append(Ref(items=items))
        else:
            return None
    return stack[0] if len(stack) == 1 else None


def _ref_from_ast(node, code: types.CodeType) -> Ref | None:
    """A ``Ref`` for a name / attribute chain / tuple expression in ``code``."""
    import ast

    if isinstance(node, ast.Name):
        if code.co_name == "<module>" or code.co_flags & 0x1 == 0:  # not CO_OPTIMIZED
            return Ref(node.id, "name")
        if node.id in code.co_cellvars or node.id in code.co_freevars:
            return Ref(node.id, "deref")
        if node.id in code.co_varnames:
            return Ref(node.id, "fast")
        return Ref(node.id, "global")
    if isinstance(node, ast.Attribute):
        base = _ref_from_ast(node.value, code)
        if base is None or base.items is not None or base.is_const:
            return None
        return Ref(base.name, base.scope, base.attrs + (node.attr,))
    if isinstance(node, ast.Tuple):
        items = tuple(_ref_from_ast(e, code) for e in node.elts)
        return None if any(i is None for i in items) else Ref(items=cast("tuple[Ref, ...]", items))
    if isinstance(node, ast.Constant):
        return Ref(const=node.value, is_const=True)
    return None


def _with_guard(slot: int, stmt, item_index: int, code: types.CodeType) -> WithGuard:
    """Describe the ``with`` item whose handler was found, for callers' frames
    where the live ``__exit__`` cannot be read."""
    import ast

    items = getattr(stmt, "items", None) or []
    if not 0 <= item_index < len(items):
        return WithGuard(slot=slot)
    expr = items[item_index].context_expr
    if isinstance(expr, ast.Call):
        func = _ref_from_ast(expr.func, code)
        args = tuple(_ref_from_ast(a, code) for a in expr.args)
        if any(a is None for a in args) or expr.keywords:
            args = ()
        return WithGuard(slot=slot, context=func, called=True, args=cast("tuple[Ref, ...]", args))
    return WithGuard(slot=slot, context=_ref_from_ast(expr, code))


def _walk_to_reraise(ops: list[_Op], i: int) -> int | None:
    """From a cleanup handler's start, the index of the RERAISE it ends in."""
    for k in range(i, min(i + 12, len(ops))):
        name = ops[k].instr.name
        if name == "RERAISE":
            return k
        if name not in _PASS_THROUGH:
            return None
    return None


def _classify_handler(ops, label_at, h, depth, msrc: ModuleSource | None, code, seen_with):
    """Handler starting with PUSH_EXC_INFO at ``h``.  Returns (guard, catches_all)."""
    nxt = ops[h + 1].instr if h + 1 < len(ops) else None
    if nxt is None:
        return OpaqueGuard("handler at end of code"), True
    if nxt.name == "WITH_EXCEPT_START":
        stmt = _stmt_at(msrc, code, _location(nxt))
        if stmt is None:
            return WithGuard(slot=depth - 1), False
        n = seen_with.get(id(stmt), 0)
        seen_with[id(stmt)] = n + 1
        items = cast("ast.With | ast.AsyncWith", stmt).items  # WITH_EXCEPT_START: a with
        return _with_guard(depth - 1, stmt, len(items) - 1 - n, code), False
    clauses: list[Clause] = []
    j = h + 1
    for _ in range(64):
        first = ops[j].instr
        if first.name == "POP_TOP":  # bare `except:` (always the last clause)
            pos = _location(first)
            clauses.append(Clause(None, text="except:", bare=True,
                                  reraises=bool(msrc and msrc.clause_reraises(pos)),
                                  lineno=pos[0], col=pos[2]))
            return ExceptGuard(tuple(clauses)), False
        if first.name == "RERAISE":  # no clause matched
            return ExceptGuard(tuple(clauses)), False
        # a typed clause: <type expression> CHECK_EXC_MATCH POP_JUMP_FORWARD_IF_FALSE
        k = j
        while k < len(ops) and ops[k].instr.name not in ("CHECK_EXC_MATCH", "CHECK_EG_MATCH"):
            if ops[k].instr.name in _CLAUSE_STOP or ops[k].instr.has_jump():
                break
            k += 1
        if k >= len(ops) or ops[k].instr.name not in ("CHECK_EXC_MATCH", "CHECK_EG_MATCH"):
            if not clauses:
                pos = _location(ops[h + 1].instr)
                swallows = bool(msrc and msrc.finally_swallows(pos[0]))
                return FinallyGuard(swallows=swallows), swallows
            return OpaqueGuard("unrecognised except clause"), True
        if ops[k].instr.name == "CHECK_EG_MATCH":
            return OpaqueGuard("except* clause"), True
        jmp = ops[k + 1].instr
        if not jmp.name.startswith("POP_JUMP_FORWARD_IF_FALSE"):
            return OpaqueGuard("unrecognised except clause"), True
        type_instrs = [ops[x].instr for x in range(j, k)]
        test = _ref_from_instrs(type_instrs)
        pos = _location(ops[k].instr)
        handler = msrc.handler_at(pos) if msrc else None
        text = ""
        if handler is not None and handler.type is not None and msrc is not None:

            text = "except " + (msrc.segment(handler.type) or "?") + ":"
        clauses.append(Clause(test, text=text, reraises=bool(msrc and msrc.clause_reraises(pos)),
                              lineno=pos[0], col=pos[2]))
        j = label_at[jmp.arg]
    return OpaqueGuard("too many except clauses"), True


def _stmt_at(msrc: ModuleSource | None, code: types.CodeType, pos) -> ast.stmt | None:
    if msrc is None or pos[0] is None:
        return None
    scope = msrc.scope_for(code)
    if scope is None:
        return None
    return msrc.statements(scope).lookup(pos)


def handler_chain(ops, label_at, entry: EntryKey | None, msrc: ModuleSource | None,
                  code: types.CodeType) -> tuple[Guard, ...]:
    """The guards an exception meets from ``entry`` outwards, innermost first."""
    guards: list[Guard] = []
    seen_with: dict[int, int] = {}
    for _ in range(256):
        if entry is None:
            break
        target, _lasti, depth = entry
        h = label_at[target]
        name = ops[h].instr.name
        if name == "PUSH_EXC_INFO":
            guard, catches_all = _classify_handler(ops, label_at, h, depth, msrc, code, seen_with)
            guards.append(guard)
            if catches_all:
                break
            cleanup = ops[h].entry  # SETUP_CLEANUP covering the handler body
            if cleanup is None:
                break  # the handler's re-raise leaves the frame
            k = _walk_to_reraise(ops, label_at[cleanup[0]])
            if k is None:
                guards.append(OpaqueGuard("unrecognised handler cleanup"))
                break
            entry = ops[k].entry
        elif name == "END_ASYNC_FOR":
            entry = ops[h].entry
        else:
            k = _walk_to_reraise(ops, h)
            if k is None:
                guards.append(OpaqueGuard(f"unrecognised handler starting with {name}"))
                break
            entry = ops[k].entry
    return tuple(guards)


def chain_for_code(code: types.CodeType, offset: int, msrc: ModuleSource | None):
    """Guards around the instruction at byte ``offset`` of an *unmodified* code
    object (used for caller frames at crash time)."""
    import dis

    bc = Bytecode.from_code(code, conserve_exception_block_stackdepth=True)
    ops, label_at = _flatten(bc)
    offsets = [i.offset for i in dis.get_instructions(code) if i.opname != "EXTENDED_ARG"]
    idx = None
    for n, off in enumerate(offsets):
        if off > offset:
            break
        idx = n
    if idx is None or idx >= len(ops):
        return ()
    return handler_chain(ops, label_at, ops[idx].entry, msrc, code)


# -- emission -------------------------------------------------------------------------


@dataclass
class _Item:
    instr: Instr | None = None
    key: EntryKey | None = None
    label: Label | None = None


def _instr(name: str, arg=None, loc: InstrLocation | None = None) -> Instr:
    if arg is None:
        return Instr(name, location=loc)
    return Instr(name, arg, location=loc)


def _call(args_count: int, loc) -> list[Instr]:
    """PRECALL/CALL for a callable already placed under its arguments."""
    return [_instr("PRECALL", args_count, loc), _instr("CALL", args_count, loc)]


@dataclass
class Continuation:
    """Asks ``rewrite`` for a *continuation* of new code: a variant entered at
    ``stmt`` (the statement corresponding to the one that failed in the old
    code) with ``nstack`` values pushed back onto the value stack.

    Every local variable becomes a positional parameter (``params``, filled by
    ``rewrite``), followed by hidden parameters for closure cells and for the
    stack values; ``unbound`` passed for a variable leaves it unbound.
    """

    stmt: object
    role: str
    nstack: int
    unbound: object
    target: object = None
    params: list[str] = field(default_factory=list)
    cell_params: dict[str, str] = field(default_factory=dict)  # hidden name -> cell var
    stack_params: list[str] = field(default_factory=list)


def rewrite(
    code: types.CodeType,
    info: CodeInfo,
    msrc: ModuleSource,
    scope,
    hooks,
    replace_consts: dict | None = None,
    continuation: Continuation | None = None,
) -> types.CodeType:
    """Rewrite one code object; raise ``Unsupported`` if it cannot be done.

    ``hooks`` provides ``barrier`` (the engine function the stubs call)."""
    if code.co_flags & (0x80 | 0x100 | 0x200):  # COROUTINE, ITERABLE_COROUTINE, ASYNC_GENERATOR
        raise Unsupported("async functions and async generators are not vaccinated yet")
    bc = Bytecode.from_code(code, conserve_exception_block_stackdepth=True)
    ops, label_at = _flatten(bc)
    if replace_consts:
        for op in ops:
            if op.instr.name == "LOAD_CONST" and isinstance(op.instr.arg, types.CodeType):
                new = replace_consts.get(id(op.instr.arg))
                if new is not None:
                    op.instr.arg = new
    _analyse_depths(ops, label_at)

    index = msrc.statements(scope)
    stmts = [index.lookup(_location(op.instr)) if op.instr.location else None for op in ops]
    _drop_implicit_returns(ops, stmts)
    runs = _build_runs(ops, label_at, stmts)
    if not runs:
        if all(stmt is None for stmt in stmts):
            raise NothingToProtect("no statements")
        raise Unsupported("no statement could be made recoverable")

    label_of: dict[int, Label] = {}
    labels_at: dict[int, list[Label]] = {}
    for label, i in label_at.items():
        label_of.setdefault(i, label)
        labels_at.setdefault(i, []).append(label)

    def label_for(i: int) -> Label:
        if i not in label_of:
            label_of[i] = Label()
        return label_of[i]

    for run in runs:
        run.role = _role(run, ops)
    if continuation is not None:
        target = next((r for r in runs if r.stmt is continuation.stmt
                       and r.role == continuation.role and r.base == continuation.nstack), None)
        if target is None:
            raise Unsupported(
                "the new code has no place to continue at: the failing statement's loops, "
                "with and try blocks must keep their structure")
        continuation.target = label_for(target.start)
    # cells
    headers = {id(r.stmt): r for r in runs if r.role == "loop-header"}
    for n, run in enumerate(runs):
        role = run.role
        skip_reason, skip_effect = _plan_skip(run, role, ops, label_at)
        continue_reason = _plan_continue(run, headers, msrc)
        retry_reason = "a raise statement always raises" if role == "raise" else None
        guards = handler_chain(ops, label_at, run.entry, msrc, code)
        with_slots = tuple(g.slot for g in guards if isinstance(g, WithGuard))
        first = ops[run.start].instr
        line, end_line, col, end_col = _location(first)
        stmt = run.stmt
        run.cell = Cell(
            info=info,
            index=n,
            lineno=stmt.lineno,
            end_lineno=stmt.end_lineno,
            col=getattr(stmt, "col_offset", col),
            end_col=getattr(stmt, "end_col_offset", end_col),
            stmt=type(stmt).__name__,
            role=role,
            source=msrc.text(stmt),
            retry_reason=retry_reason,
            skip_reason=skip_reason,
            skip_effect=skip_effect,
            guards=guards,
            continue_reason=continue_reason,
            with_slots=with_slots,
            iterator_slot=run.base - 1 if role == "loop-header" else None,
            depth=run.base,
            cases=msrc.cases(stmt) if role == "match" else (),
        )
        info.cells.append(run.cell)
        if run.skip_target is not None:
            label_for(run.skip_target)
        if run.continue_target is not None:
            label_for(run.continue_target)
        for _, t, _ in _exits(run, ops, label_at):
            label_for(t)

    owner: dict[int, _Run] = {}
    for run in runs:
        for i in range(run.start, run.stop):
            owner[i] = run

    items: list[_Item] = []
    # 1. the original code, cells pointed at their stubs
    for i, op in enumerate(ops):
        if i in label_of:
            items.append(_Item(label=label_of[i]))
        for extra in labels_at.get(i, ()):
            if extra is not label_of.get(i):
                items.append(_Item(label=extra))
        owner_run = owner.get(i)
        key = (owner_run.stub, True, owner_run.base) if owner_run is not None else op.entry
        items.append(_Item(op.instr, key))
    # trailing labels (none expected)
    for lb in labels_at.get(len(ops), ()):
        items.append(_Item(label=lb))

    # 2. retry copies, 3. stubs
    generator = bool(code.co_flags & 0x20)
    for run in runs:
        _emit_copy(items, run, ops, label_at, label_for)
    for run in runs:
        _emit_stub(items, run, ops, label_for, hooks, generator)
    if continuation is not None:
        _emit_continuation_prologue(items, bc, code, runs, continuation, label_for)

    final_ops, final_labels = _as_ops(items)
    stacksize = _analyse_depths(final_ops, final_labels)

    out = bc.copy()
    out.clear()
    out.extend(_with_try_blocks(items))
    try:
        new_code = out.to_code(stacksize=max(stacksize, code.co_stacksize),
                               compute_exception_stack_depths=False)
    except Exception as exc:  # bytecode refused what we built: a daifu bug
        raise Unsupported(f"bytecode assembly failed: {exc}") from exc
    return new_code


def _emit_copy(items, run: _Run, ops, label_at, label_for) -> None:
    """The cell's *retry copy*: the same instructions, covered by the same
    stub, appended after the original code.  Retry jumps here, so a failure
    of the retried statement has its ``lasti`` in the copy: that is how the
    engine counts attempts, with nothing added to the normal path.  Exits
    jump back into the original code (backward: the copy lies after it)."""
    assert run.cell is not None  # set by ``rewrite`` before any emission
    if not run.cell.can_retry:
        return
    key = (run.stub, True, run.base)
    inner: dict[int, Label] = {i: Label() for i in range(run.start, run.stop)}
    tramp: dict[int, Label] = {}  # forward-only jumps out of the copy
    items.append(_Item(label=run.copy))
    for i in range(run.start, run.stop):
        op = ops[i]
        if i != run.start:
            items.append(_Item(label=inner[i]))
        ins = op.instr.copy()
        if ins.has_jump():
            t = label_at[ins.arg]
            if t in run:
                ins.arg = inner[t] if t != run.start else run.copy
            elif ins.name in _FORWARD_ONLY:
                ins.arg = tramp.setdefault(t, Label())
            else:
                ins = Instr(_BACKWARD.get(ins.name, ins.name), label_for(t),
                            location=ins.location)
        items.append(_Item(ins, key))
    if ops[run.stop - 1].instr.name not in _TERMINAL:  # falls through: straight back
        items.append(_Item(_instr("JUMP_BACKWARD", label_for(run.stop), _NOWHERE),
                           _target_key(ops, run.stop)))
    for t, lab in tramp.items():
        items.append(_Item(label=lab))
        items.append(_Item(_instr("JUMP_BACKWARD", label_for(t), _NOWHERE), _target_key(ops, t)))


def _target_key(ops, t: int) -> EntryKey | None:
    """The exception-table entry for a jump landing at instruction ``t``
    (``JUMP_BACKWARD`` checks for signals: a ``KeyboardInterrupt`` there
    belongs to the handler of where the jump goes)."""
    key = ops[t].entry if t < len(ops) else None
    if key is not None and (ops[t].depth is None or key[2] > ops[t].depth):
        return None
    return key


#: daifu's own instructions have no line: a tracer sees no line event for them
_NOWHERE = InstrLocation(None, None, None, None)


def _suspend_tracing() -> list:
    """Push ``sys.getprofile()`` and ``sys.gettrace()`` and switch both off,
    so that the Python code daifu calls next (the engine) produces no call or
    line events for a debugger, coverage or a profiler.  Builtins only: they
    create no frames (a profiler sees ``getprofile`` and ``setprofile``
    called; nothing else of daifu)."""
    no_profile, no_trace = Label(), Label()
    return [
        _instr("PUSH_NULL", loc=_NOWHERE),
        _instr("LOAD_CONST", sys.getprofile, _NOWHERE),
        *_call(0, _NOWHERE),
        _instr("COPY", 1, _NOWHERE),
        _instr("POP_JUMP_FORWARD_IF_NONE", no_profile, _NOWHERE),
        _instr("PUSH_NULL", loc=_NOWHERE),
        _instr("LOAD_CONST", sys.setprofile, _NOWHERE),
        # bytecode's InstrArg has no type for a constant's value
        Instr("LOAD_CONST", None, location=_NOWHERE),  # type: ignore[arg-type]
        *_call(1, _NOWHERE),
        _instr("POP_TOP", loc=_NOWHERE),
        no_profile,
        _instr("PUSH_NULL", loc=_NOWHERE),
        _instr("LOAD_CONST", sys.gettrace, _NOWHERE),
        *_call(0, _NOWHERE),
        _instr("COPY", 1, _NOWHERE),
        _instr("POP_JUMP_FORWARD_IF_NONE", no_trace, _NOWHERE),
        _instr("PUSH_NULL", loc=_NOWHERE),
        _instr("LOAD_CONST", sys.settrace, _NOWHERE),
        # bytecode's InstrArg has no type for a constant's value
        Instr("LOAD_CONST", None, location=_NOWHERE),  # type: ignore[arg-type]
        *_call(1, _NOWHERE),
        _instr("POP_TOP", loc=_NOWHERE),
        no_trace,
    ]


def _restore_tracing() -> list:
    """``[profile, trace, result]`` -> ``[result]``, the tracer and profiler
    set back exactly as they were (after daifu's frame has returned, so
    neither sees its return)."""
    trace_off, profile_off = Label(), Label()
    return [
        _instr("SWAP", 2, _NOWHERE),  # profile, result, trace
        _instr("COPY", 1, _NOWHERE),
        _instr("POP_JUMP_FORWARD_IF_NONE", trace_off, _NOWHERE),
        _instr("PUSH_NULL", loc=_NOWHERE),
        _instr("LOAD_CONST", sys.settrace, _NOWHERE),
        _instr("COPY", 3, _NOWHERE),
        *_call(1, _NOWHERE),
        _instr("POP_TOP", loc=_NOWHERE),
        trace_off,
        _instr("POP_TOP", loc=_NOWHERE),
        _instr("SWAP", 2, _NOWHERE),  # result, profile
        _instr("COPY", 1, _NOWHERE),
        _instr("POP_JUMP_FORWARD_IF_NONE", profile_off, _NOWHERE),
        _instr("PUSH_NULL", loc=_NOWHERE),
        _instr("LOAD_CONST", sys.setprofile, _NOWHERE),
        _instr("COPY", 3, _NOWHERE),
        *_call(1, _NOWHERE),
        _instr("POP_TOP", loc=_NOWHERE),
        profile_off,
        _instr("POP_TOP", loc=_NOWHERE),
    ]


def _items(seq: list, key) -> list[_Item]:
    return [_Item(label=x) if isinstance(x, Label) else _Item(x, key) for x in seq]


def _emit_stub(items, run: _Run, ops, label_for, hooks, generator: bool) -> None:
    assert run.cell is not None  # set by ``rewrite`` before any emission
    barrier = hooks.barrier
    b = run.base
    cell_loc = ops[run.start].instr.location
    fallback, traced_fallback, answered = Label(), Label(), Label()
    on_retry, on_skip, on_continue, on_raise, on_other = (Label() for _ in range(5))
    guard_key = (fallback, False, b + 2)  # any failure in the stub: re-raise the original
    traced_key = (traced_fallback, False, b + 5)  # the barrier call, tracing suspended
    loc = _NOWHERE  # the stub has no line: a tracer sees no event for it
    # the first instruction loads the cell: that is how ``cell_ranges`` finds it
    head = [_instr("LOAD_CONST", run.cell, loc), *_suspend_tracing()]
    # stack: ..., lasti, exc, cell, profile, trace
    call = [
        _instr("PUSH_NULL", loc=loc),
        _instr("LOAD_CONST", barrier, loc),
        _instr("COPY", 6, loc),  # exc
        _instr("COPY", 6, loc),  # cell
        _instr("COPY", 9, loc),  # lasti
    ]
    depth = b + 10
    for n, slot in enumerate(range(b)):  # the whole stack below the cell
        call.append(_instr("COPY", depth + n - slot, loc))
    call.append(_instr("BUILD_TUPLE", b, loc))
    call += _call(4, loc)
    # ..., lasti, exc, cell, profile, trace, answer -> ..., lasti, exc, answer
    body = [answered, *_restore_tracing(), _instr("SWAP", 2, loc), _instr("POP_TOP", loc=loc)]

    def branch(code: int, target: Label) -> list:
        return [_instr("COPY", 1, loc), _instr("LOAD_CONST", code, loc),
                _instr("COMPARE_OP", Compare.EQ, loc),
                _instr("POP_JUMP_FORWARD_IF_TRUE", target, loc)]

    if run.cell.can_retry:
        body += branch(RETRY_CODE, on_retry)
    if run.skip_target is not None and run.cell.can_skip:
        body += branch(SKIP_CODE, on_skip)
    if run.continue_target is not None:
        body += branch(CONTINUE_CODE, on_continue)
    body += branch(RAISE_CODE, on_raise)
    # a tuple: (exception,) raises it here; (function, args) continues in new code
    body += [_instr("GET_LEN", loc=loc), _instr("LOAD_CONST", 1, loc),
             _instr("COMPARE_OP", Compare.EQ, loc),
             _instr("POP_JUMP_FORWARD_IF_TRUE", on_other, loc)]
    if generator:  # no continuation in new code for a generator's frame
        body.append(_instr("JUMP_FORWARD", on_raise, loc))
    items.append(_Item(label=run.stub))
    items.extend(_items(head, guard_key))
    items.extend(_items(call, traced_key))
    items.extend(_items(body, guard_key))
    if not generator:
        # continue in new code (a reload changed this very function): call the
        # continuation and return what it returns.  Not covered by any handler:
        # the continuation runs the user's with/finally exits itself, and its
        # exception must leave this frame untouched.
        items.extend(_items([
            _instr("SWAP", 3, loc), _instr("POP_TOP", loc=loc), _instr("POP_TOP", loc=loc),
            _instr("UNPACK_SEQUENCE", 2, loc),  # (fn, args) -> args, fn
            _instr("PUSH_NULL", loc=loc),
            _instr("SWAP", 3, loc),  # NULL, fn, args
            _instr("CALL_FUNCTION_EX", 0, loc),
            _instr("RETURN_VALUE", loc=loc),
        ], None))
    # (exception,): raised where the statement failed; the user's handlers,
    # with exits and finally blocks see it as if the statement had raised it
    items.append(_Item(label=on_other))
    items.append(_Item(_instr("UNPACK_SEQUENCE", 1, loc), guard_key))
    items.append(_Item(_instr("RAISE_VARARGS", 1, cell_loc), run.entry))
    items.append(_Item(label=on_raise))
    items.append(_Item(_instr("POP_TOP", loc=loc), run.entry))
    items.append(_Item(_instr("RERAISE", 1, loc), run.entry))
    # the barrier call failed (RecursionError at the limit): answer "re-raise"
    items.append(_Item(label=traced_fallback))
    items.extend(_items([_instr("POP_TOP", loc=loc), _instr("LOAD_CONST", RAISE_CODE, loc),
                         _instr("JUMP_BACKWARD", answered, loc)], guard_key))
    items.append(_Item(label=fallback))
    items.append(_Item(_instr("POP_TOP", loc=loc), run.entry))
    items.append(_Item(_instr("RERAISE", 1, loc), run.entry))
    if run.cell.can_retry:
        items.append(_Item(label=on_retry))
        for _ in range(3):
            items.append(_Item(_instr("POP_TOP", loc=loc), None))
        items.append(_Item(_instr("JUMP_BACKWARD", run.copy, loc), run.entry))
    if run.skip_target is not None and run.cell.can_skip:
        items.append(_Item(label=on_skip))
        for _ in range(3 + run.skip_pops):
            items.append(_Item(_instr("POP_TOP", loc=loc), None))
        items.append(_Item(_instr("JUMP_BACKWARD", label_for(run.skip_target), loc),
                           _target_key(ops, run.skip_target)))
    if run.continue_target is not None:
        items.append(_Item(label=on_continue))
        for _ in range(3):
            items.append(_Item(_instr("POP_TOP", loc=loc), None))
        items.append(_Item(_instr("JUMP_BACKWARD", label_for(run.continue_target), loc),
                           run.entry))


def _emit_continuation_prologue(items, bc, code, runs, spec: Continuation, label_for) -> None:
    """Turn the rewritten code into a continuation (see ``Continuation``)."""
    from bytecode import CompilerFlags

    module = not code.co_flags & 0x1  # not CO_OPTIMIZED: module-level code
    prologue: list[Instr | Label] = []
    stack_names = [f".daifu_stack{i}" for i in range(spec.nstack)]
    spec.stack_params = stack_names
    if module:
        for name in stack_names:  # the engine puts them in the globals first
            prologue += [Instr("LOAD_NAME", name), ]
        for name in stack_names:
            prologue += [Instr("DELETE_NAME", name)]
    else:
        varnames = list(code.co_varnames)
        cell_only = [c for c in code.co_cellvars if c not in varnames]
        spec.cell_params = {f".daifu_cell_{c}": c for c in cell_only}
        spec.params = varnames + list(spec.cell_params) + stack_names
        cellvars = set(code.co_cellvars)
        for name in varnames:
            skip = Label()
            if name in cellvars:  # a cell argument: its slot holds the cell now
                load, delete = Instr("LOAD_DEREF", CellVar(name)), Instr("DELETE_DEREF",
                                                                        CellVar(name))
            else:
                load, delete = Instr("LOAD_FAST", name), Instr("DELETE_FAST", name)
            # (bytecode's InstrArg has no type for a constant's value)
            prologue += [load, Instr("LOAD_CONST", spec.unbound),  # type: ignore[arg-type]
                         Instr("IS_OP", 0), Instr("POP_JUMP_FORWARD_IF_FALSE", skip), delete, skip]
        for hidden, cell in spec.cell_params.items():
            skip = Label()
            prologue += [Instr("LOAD_FAST", hidden),
                         Instr("LOAD_CONST", spec.unbound),  # type: ignore[arg-type]
                         Instr("IS_OP", 0), Instr("POP_JUMP_FORWARD_IF_TRUE", skip),
                         Instr("LOAD_FAST", hidden), Instr("STORE_DEREF", CellVar(cell)), skip]
        prologue += [Instr("LOAD_FAST", name) for name in stack_names]
        bc.argnames = spec.params
        bc.argcount = len(spec.params)
        bc.posonlyargcount = 0
        bc.kwonlyargcount = 0
        bc.flags = CompilerFlags(int(bc.flags) & ~(0x4 | 0x8))  # no *args / **kwargs
    prologue.append(Instr("JUMP_FORWARD", cast(Label, spec.target)))  # set by ``rewrite``
    # insert right after the first RESUME (cells and free variables are set up)
    at = next(n for n, it in enumerate(items) if it.instr is not None and it.instr.name == "RESUME")
    items[at + 1 : at + 1] = [_Item(label=ins) if isinstance(ins, Label) else _Item(ins, None)
                              for ins in prologue]


def _as_ops(items: list[_Item]) -> tuple[list[_Op], dict[Label, int]]:
    ops: list[_Op] = []
    labels: dict[Label, int] = {}
    for it in items:
        if it.label is not None:
            labels[it.label] = len(ops)
        else:
            assert it.instr is not None  # an item is a label or an instruction
            ops.append(_Op(it.instr, it.key))
    return ops, labels


def _with_try_blocks(items: list[_Item]) -> list:
    out: list = []
    current_key = None
    current: TryBegin | None = None
    for it in items:
        if it.label is not None:
            out.append(it.label)
            continue
        if it.key != current_key:
            if current is not None:
                out.append(TryEnd(current))
            current = TryBegin(it.key[0], it.key[1], it.key[2]) if it.key is not None else None
            if current is not None:
                out.append(current)
            current_key = it.key
        out.append(it.instr)
    if current is not None:
        out.append(TryEnd(current))
    return out
