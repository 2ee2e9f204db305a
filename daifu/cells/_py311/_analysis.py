"""Decoding a code object and the value-stack depth before every instruction."""

from __future__ import annotations

from bytecode import Bytecode, Instr, Label, TryBegin, TryEnd

from ._ops import _TERMINAL, Unsupported, _int_arg, _label_arg, _Op


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


