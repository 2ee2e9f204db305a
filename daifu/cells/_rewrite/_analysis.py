"""Decoding a code object and the value-stack depth before every instruction."""

from __future__ import annotations

import dis
from typing import Any

from bytecode import Bytecode, Instr, Label, TryBegin, TryEnd
from bytecode.instr import BITFLAG2_OPCODES, BITFLAG_OPCODES

from ._ops import PY, Unsupported, _int_arg, _label_arg, _Op, _pushed_nulls
from ._opsets import _TERMINAL


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
    """``instr.stack_effect(jump)`` (see ``_shape``)."""
    shape = _shape(instr)
    return shape.jump_effect if jump else shape.effect


class _Shape:
    """What the analysis asks of an instruction (the same for every
    instruction with its opcode and the arguments that matter)."""

    __slots__ = ("name", "jumps", "effect", "jump_effect", "rule", "jump_rule", "touch")

    def __init__(self, instr: Instr) -> None:
        self.name, self.jumps = instr.name, instr.has_jump()
        #: the stack effect falling through, and on the jump
        self.effect, self.jump_effect = (
            (1, 1) if self.name == "RETURN_GENERATOR"  # (resumed: the sent value, popped next)
            else (instr.stack_effect(jump=False), instr.stack_effect(jump=True)))
        #: how the may-be-NULL slots change falling through, and on the jump
        #: (``_null_rule``; a RETURN_GENERATOR leaves none)
        self.rule = (0, 0, 0) if self.name == "RETURN_GENERATOR" else _null_rule(
            instr, False, self.effect)
        self.jump_rule = _null_rule(instr, True, self.jump_effect) if self.jumps else self.rule
        #: the lowest slot it removes or rewrites, relative to the depth (``_touch``)
        self.touch = _touch_offset(instr)


def _shape(instr: Instr) -> _Shape:
    """``instr``'s ``_Shape``, from a table filled as opcodes (and the
    arguments that matter) are met."""
    op = instr._opcode  # noqa: SLF001
    arg: Any = instr._arg  # noqa: SLF001
    if op < _HAVE_ARGUMENT:
        arg = None
    elif type(arg) is tuple:  # LOAD_GLOBAL/LOAD_ATTR...: (flag, name)
        arg = arg[0] if op in _FLAG_OPS else 0
    elif type(arg) is not int or op in _HAS_CONST:
        arg = 0
    key = (op, arg)
    shape = _SHAPES.get(key)
    if shape is None:
        shape = _SHAPES[key] = _Shape(instr)
    return shape


def _null_rule(instr: Instr, jump: bool, effect: int) -> tuple[int, int, int]:
    """(values popped, values pushed, which pushed ones may be NULL) on the
    jump or falling through."""
    if instr.has_jump():
        pre = instr.pre_and_post_stack_effect(jump=jump)[0]
    else:
        pre = instr.pre_and_post_stack_effect()[0]
    # (bytecode reports a pure push as a positive "pre", and MAP_ADD as
    # popping one: what an instruction pops is at least what it removes)
    pops = max(-min(pre, 0), -effect)
    pushes = effect + pops
    return pops, pushes, _pushed_nulls(instr) & ((1 << pushes) - 1)


_HAVE_ARGUMENT = dis.HAVE_ARGUMENT
_HAS_CONST = frozenset(dis.hasconst)
#: the opcodes whose argument's low bit is a flag (``bytecode`` decodes them
#: as ``(flag, name)``; their stack effect depends on the flag)
_FLAG_OPS = frozenset(BITFLAG_OPCODES) | frozenset(BITFLAG2_OPCODES)
_SHAPES: dict[tuple, _Shape] = {}


def _analyse_depths(ops: list[_Op], label_at: dict[Label, int], track_nulls: bool = True) -> int:
    """Fill ``op.depth`` (stack depth before each instruction) and ``op.nulls``
    (the slots that may hold NULL then, unless ``track_nulls`` is false: the
    depths alone, for the stack size of assembled code); return the max depth."""
    if not ops:
        raise Unsupported("empty code")
    for op in ops:
        op.depth = None
        op.nulls = 0
        op.shape = None
    peak = 0

    def flow(i: int, depth: int, nulls: int) -> None:
        nonlocal peak
        if i >= len(ops):
            raise Unsupported("control flow falls off the end of the code")
        if depth < 0:
            raise Unsupported(f"negative stack depth at instruction {i}")
        op = ops[i]
        if op.depth is None:
            op.depth, op.nulls = depth, nulls
            peak = max(peak, depth)
            work.append(i)
        elif op.depth != depth:
            raise Unsupported(f"inconsistent stack depth at instruction {i}: {op.depth} != {depth}")
        elif nulls & ~op.nulls:  # a NULL that arrives another way: look again
            op.nulls |= nulls
            work.append(i)

    work: list[int] = []
    flow(0, 0, 0)
    n = len(ops)
    while work:
        i = work.pop()
        while True:  # (on along the fall-through while it reaches new instructions)
            op = ops[i]
            depth = op.depth
            assert depth is not None
            instr = op.instr
            if op.entry is not None:
                target, lasti, edepth = op.entry
                flow(label_at[target], edepth + int(lasti) + 1, op.nulls & ((1 << edepth) - 1))
            shape = op.shape = _shape(instr)
            name = shape.name
            if shape.jumps:
                effect = shape.jump_effect
                after = depth + effect
                peak = max(peak, after, depth + max(0, effect))
                flow(label_at[_label_arg(instr)], after,
                     _nulls_after(instr, name, shape.jump_rule, depth, op.nulls)
                     if track_nulls else 0)
            if name in _TERMINAL:
                break
            after = depth + shape.effect
            if after > peak:
                peak = after
            nulls = _nulls_after(instr, name, shape.rule, depth, op.nulls) if track_nulls else 0
            i += 1
            if i < n and after >= 0 and ops[i].depth is None:
                ops[i].depth, ops[i].nulls = after, nulls
                continue
            flow(i, after, nulls)
            break
    return peak


def _nulls_after(instr: Instr, name: str, rule: tuple[int, int, int], depth: int,
                 nulls: int) -> int:
    """The may-be-NULL slots after the instruction (see ``_pushed_nulls``;
    ``rule``: ``_null_rule``'s for the path taken)."""
    if name == "SWAP":
        a, b = depth - 1, depth - _int_arg(instr)
        bit_a, bit_b = (nulls >> a) & 1, (nulls >> b) & 1
        return (nulls & ~((1 << a) | (1 << b))) | (bit_a << b) | (bit_b << a)
    if name == "COPY":
        return nulls | (((nulls >> (depth - _int_arg(instr))) & 1) << depth)
    if name == "RETURN_GENERATOR":
        return 0
    pops, _, pushed = rule
    kept = depth - pops
    return (nulls & ((1 << kept) - 1)) | (pushed << kept)


def _touch(instr: Instr, depth: int) -> int:
    """Lowest value-stack index the instruction removes or rewrites on its
    fall-through and error paths (reads do not count)."""
    return depth + _shape(instr).touch


def _touch_offset(instr: Instr) -> int:
    """``_touch`` less the depth."""
    name = instr.name
    arg = _int_arg(instr)  # only read below for opcodes with an int argument
    # bytecode's 3.11 stack model: PRECALL pops the arguments, CALL the
    # callable and self/NULL -- but PRECALL may rewrite those two slots
    # (3.13: CALL pops the callable, self-or-NULL and the arguments: generic)
    if name == "PRECALL":
        return -(arg + 2)
    if name == "CALL" and PY.precall:
        return -2
    if name in ("COPY", "KW_NAMES", "FOR_ITER", "NOP", "RESUME", "NOT_TAKEN"):
        return 0
    if name == "SWAP":
        return -arg
    if name in ("LIST_APPEND", "SET_ADD", "LIST_EXTEND", "SET_UPDATE", "DICT_UPDATE",
                "DICT_MERGE"):
        return -1 - arg
    if name == "MAP_ADD":
        return -2 - arg
    if instr.has_jump():
        pre = min(instr.pre_and_post_stack_effect(jump=True)[0],
                  instr.pre_and_post_stack_effect(jump=False)[0])
    else:
        pre = instr.pre_and_post_stack_effect()[0]
    return min(pre, 0)


