"""What the function's own handlers would do with an exception: the guards
of a cell, read from the exception table and the handler code."""

from __future__ import annotations

import types
from functools import lru_cache
from typing import TYPE_CHECKING, cast

from bytecode import Bytecode, Instr
from bytecode.instr import CellVar, FreeVar

from .._cell import (
    Cell,
    Clause,
    ExceptGuard,
    FinallyGuard,
    Guard,
    OpaqueGuard,
    Ref,
    WithGuard,
    resolve,
)
from .._source import ModuleSource
from ._analysis import _flatten
from ._ops import (
    _CALL_FUNCTION_EX,
    _CLAUSE_STOP,
    _GET_ITER,
    _INTRINSIC_STOPITERATION_ERROR,
    _ITERATING,
    _PASS_THROUGH,
    POP_JUMP_IF_FALSE,
    PY,
    EntryKey,
    _int_arg,
    _location,
    _Op,
)

if TYPE_CHECKING:
    import ast


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
        elif name in ("LOAD_FAST", "LOAD_FAST_CHECK"):
            stack.append(Ref(cast(str, ins.arg), "fast"))
        elif name == "LOAD_FAST_LOAD_FAST":  # 3.13 superinstruction: two locals
            first, second = cast("tuple[str, str]", ins.arg)
            stack += [Ref(first, "fast"), Ref(second, "fast")]
        elif name in ("LOAD_DEREF", "LOAD_CLASSDEREF"):
            var = ins.arg
            var_name = var.name if isinstance(var, (CellVar, FreeVar)) else cast(str, var)
            stack.append(Ref(var_name, "deref"))
        elif name == "LOAD_ATTR" and stack:
            if PY.load_attr_method_flag:  # 3.12+: (method form, name)
                method, attr = cast("tuple[bool, str]", ins.arg)
            else:
                method, attr = False, cast(str, ins.arg)
            base = stack.pop()
            if method or base.items is not None or base.is_const:
                return None
            stack.append(Ref(base.name, base.scope, base.attrs + (attr,)))
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
    import ast  # lazy: 1.3 ms

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
    import ast  # lazy: 1.3 ms

    items = getattr(stmt, "items", None) or []
    if not 0 <= item_index < len(items):
        return WithGuard(slot=slot)
    expr = items[item_index].context_expr
    if isinstance(expr, ast.Call):
        func = _ref_from_ast(expr.func, code)
        # (the positional arguments: the exception classes of ``suppress``,
        # ``assertRaises``, ``pytest.raises``, whatever keywords follow)
        args = tuple(_ref_from_ast(a, code) for a in expr.args)
        if any(a is None for a in args):
            args = ()
        return WithGuard(slot=slot, context=func, called=True, args=cast("tuple[Ref, ...]", args))
    return WithGuard(slot=slot, context=_ref_from_ast(expr, code))


def _walk_to_reraise(ops: list[_Op], i: int) -> int | None:
    """From a cleanup handler's start, the index of the RERAISE it ends in."""
    for k in range(i, min(i + 12, len(ops))):
        instr = ops[k].instr
        if instr.name == "RERAISE":
            return k
        if instr.name == "CALL_INTRINSIC_1" and instr.arg == _INTRINSIC_STOPITERATION_ERROR:
            continue  # a generator's PEP 479 guard: only StopIteration, never a crash
        if instr.name not in _PASS_THROUGH:
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
        # a typed clause: <type expression> CHECK_EXC_MATCH POP_JUMP_(FORWARD_)IF_FALSE
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
        if jmp.name != POP_JUMP_IF_FALSE:
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
        elif name == "LOAD_CONST" and resolve(ops[h].instr.arg) is not None:
            # (rewritten code: a daifu stub, which stands for the cell's own
            # guards -- 3.13 hands an inlined comprehension's exception to it)
            guards.extend(cast(Cell, resolve(ops[h].instr.arg)).guards)
            break
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
    import dis  # lazy: 1.9 ms

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


# -- reading unmodified code for the engine's decisions --------------------------------


@lru_cache(maxsize=512)
def returns_truthy(code: types.CodeType) -> bool:
    """Can the code return something other than a constant false value (an
    ``__exit__`` that may suppress)?"""
    import dis  # lazy: 1.9 ms

    previous = None
    for ins in dis.get_instructions(code):
        if ins.opname == "RETURN_CONST" and ins.argval:
            return True
        if ins.opname == "RETURN_VALUE":
            if previous is None or previous.opname != "LOAD_CONST" or previous.argval:
                return True
        if ins.opname not in ("CACHE", "EXTENDED_ARG"):
            previous = ins
    return False


@lru_cache(maxsize=512)
def has_except_handler(code: types.CodeType) -> bool:
    """Any ``except`` clause (typed or bare) in the code?"""
    import dis  # lazy: 1.9 ms

    instrs = list(dis.get_instructions(code))
    for ins, nxt in zip(instrs, instrs[1:]):
        if ins.opname in ("CHECK_EXC_MATCH", "CHECK_EG_MATCH"):
            return True
        if ins.opname == "PUSH_EXC_INFO" and nxt.opname == "POP_TOP":
            return True
    return False



def c_passes_through(code: types.CodeType, offset: int, callee: str) -> bool:
    """Does the instruction at byte ``offset`` reach the Python function
    named ``callee`` through C that catches no crash?  ``f(*args, **kw)``
    (``CALL_FUNCTION_EX``); a class's ``__next__`` run by ``FOR_ITER`` or by
    the other instructions that iterate (directly, or through ``zip``,
    ``enumerate``, ``itertools``...), and its ``__iter__`` by ``GET_ITER``:
    C that catches ``StopIteration`` alone -- never a crash.  (Not the old
    sequence protocol: its iterator stops at the ``IndexError`` that
    ``__getitem__`` raises.)"""
    raw = code.co_code  # the unquickened instructions: base opcodes
    if not 0 <= offset < len(raw):
        return False
    op = raw[offset]
    return op == _CALL_FUNCTION_EX or (op in _ITERATING and callee == "__next__") \
        or (op == _GET_ITER and callee == "__iter__")


def effects(code: types.CodeType, start: int, stop: int) -> list[tuple[str, str, object]]:
    """What the instructions in bytes [start, stop) of ``code`` did that a retry
    repeats: ``(kind, detail, positions)`` with kind ``call``, ``store`` or
    ``in-place`` (detail: the operator)."""
    import dis  # lazy: 1.9 ms

    out: list[tuple[str, str, object]] = []
    # ``stop`` is where the exception was raised: the instruction holding it
    # (``stop`` may point into its inline cache) did not complete -- a call
    # that raised did not do its work
    ran = [ins for ins in dis.get_instructions(code) if start <= ins.offset <= stop]
    for ins in ran[:-1]:
        if ins.opname in ("CALL", "CALL_KW", "CALL_FUNCTION_EX"):
            out.append(("call", "", ins.positions))
        elif ins.opname in ("STORE_ATTR", "STORE_SUBSCR", "DELETE_SUBSCR", "DELETE_ATTR"):
            out.append(("store", "", ins.positions))
        elif ins.opname == "BINARY_OP" and "=" in ins.argrepr:
            out.append(("in-place", ins.argrepr, ins.positions))
    return out
