"""Assembly of the emitted items into a code object, and reading the
rewritten code back (which cell, original or retry copy, an offset is in)."""

from __future__ import annotations

import dis
import types

from bytecode import Compare, Label, TryBegin, TryEnd
from bytecode.instr import BITFLAG_OPCODES, UNSET

from .._cell import Cell, resolve
from ._emit import _Item
from ._ops import _EXTENDED_ARG, _LOAD_CONST, PY, EntryKey, _Op


def cell_ranges(code: types.CodeType) -> list[tuple[int, int, Cell, bool]]:
    """(start, stop, cell, is the retry copy) in byte offsets of rewritten
    ``code``: the ranges of its exception table that lead to a cell's stub
    (whose first instruction loads the cell's constant, ``_cell.resolve``).
    A cell's first range is its original instructions; a later one is its
    retry copy (appended)."""
    import dis

    raw, consts = code.co_code, code.co_consts
    found: list[tuple[int, int, Cell]] = []
    # private (not in typeshed's dis stub), the same in 3.11 to 3.14
    entries = dis._parse_exception_table(code)  # type: ignore[attr-defined]  # noqa: SLF001
    for entry in entries:
        offset, ext = entry.target, 0
        while offset + 1 < len(raw) and raw[offset] == _EXTENDED_ARG:
            ext = (ext | raw[offset + 1]) << 8
            offset += 2
        if offset + 1 < len(raw) and raw[offset] == _LOAD_CONST:
            arg = ext | raw[offset + 1]
            cell = resolve(consts[arg]) if arg < len(consts) else None
            if cell is not None:
                found.append((entry.start, entry.end, cell))
    seen: set[int] = set()
    out = []
    for start, stop, cell in sorted(found, key=lambda r: r[0]):
        out.append((start, stop, cell, id(cell) in seen))
        seen.add(id(cell))
    return out


def lasti_offset(lasti: int) -> int:
    """The byte offset of instruction number ``lasti`` (what a barrier receives)."""
    return lasti * 2


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


class _NotSpliced(Exception):
    """The fast assembly met something it does not handle: the caller falls
    back to ``bytecode``'s assembly of the whole stream."""


def _cache_table() -> list[int]:
    caches = dis._inline_cache_entries  # type: ignore[attr-defined]  # noqa: SLF001
    out = [0] * 256
    for name, op in dis.opmap.items():
        if op < 256:
            out[op] = caches[op] if isinstance(caches, list) else caches.get(name, 0)
    return out


#: the CACHE entries after each opcode
_CACHES = _cache_table()
_HAS_CONST = frozenset(dis.hasconst)
_HAS_NAME = frozenset(dis.hasname)
_HAS_JUMP = frozenset(dis.hasjrel) | frozenset(dis.hasjabs)
_BACKWARD_JUMPS = frozenset(op for name, op in dis.opmap.items() if "BACKWARD" in name)
_NO_LOCATION = 15  # the location-table code of "no location" (3.11+)
#: opcodes whose argument is ``name index << 1 | flag``
_FLAG_OPS = frozenset(BITFLAG_OPCODES)


def _compare_arg(arg: Compare) -> int:
    """``COMPARE_OP``'s argument, encoded as ``bytecode`` does."""
    if PY.python >= (3, 13):
        return arg._get_mask() + ((arg.value & 0b1111) << 5) + (arg.value & 16)  # noqa: SLF001
    if PY.python >= (3, 12):
        return arg._get_mask() + (arg.value << 4)  # noqa: SLF001
    return arg.value


def _ext(arg: int) -> int:
    """The ``EXTENDED_ARG`` prefixes an argument needs."""
    return 0 if arg < 0x100 else 1 if arg < 0x10000 else 2 if arg < 0x1000000 else 3


def _varint(out: bytearray, value: int, msb: int) -> None:
    """One exception-table item: 6-bit groups, most significant first, bit 6
    set on all but the last, ``msb`` (bit 7) on the first."""
    shift = 24
    while shift and value < 1 << shift:
        shift -= 6
    while shift:
        out.append(((value >> shift) & 0x3F) | 0x40 | msb)
        msb = 0
        shift -= 6
    out.append((value & 0x3F) | msb)


def splice(items: list[_Item], stub_start: int, stacksize: int, bc) -> types.CodeType:
    """Assemble ``items`` with ``bytecode`` doing only the first part (the
    original code and the retry copies, ``items[:stub_start]``) and daifu the
    stubs after it, which are most of the instructions and use a handful of
    opcodes with plain arguments: their bytes, and the exception table and
    its entries for all of the code, are written here.

    Raises ``_NotSpliced`` if the first part's code does not map instruction
    for instruction onto its items, or a stub holds an argument of a kind not
    handled here."""
    first = [it.label if it.label is not None else it.instr for it in items[:stub_start]]
    out = bc.copy()
    out.clear()
    out.extend(first)
    code1 = out.to_code(stacksize=stacksize, compute_exception_stack_depths=False,
                        compute_jumps_passes=200)
    raw1 = code1.co_code
    # where each instruction of the first part landed (code units), and its labels
    label_off: dict[Label, int] = {}
    spans: list[tuple[int, int, EntryKey | None]] = []  # (start, stop, key) of every instruction
    pos, n1, pending = 0, len(raw1), []
    for it in items[:stub_start]:
        if it.label is not None:
            pending.append(it.label)
            continue
        start = pos
        while pos < n1 and raw1[pos] == _EXTENDED_ARG:
            pos += 2
        assert it.instr is not None  # an item is a label or an instruction
        if pos >= n1 or raw1[pos] != it.instr._opcode:  # noqa: SLF001
            raise _NotSpliced(f"the assembled code differs from the items at {pos // 2}")
        pos += 2 + 2 * _CACHES[raw1[pos]]
        for label in pending:
            label_off[label] = start // 2
        pending.clear()
        spans.append((start // 2, pos // 2, it.key))
    if pos != n1:
        raise _NotSpliced("the assembled code is longer than its items")
    for label in pending:
        label_off[label] = n1 // 2

    # the stubs: opcode and (resolved) argument, laid out until no EXTENDED_ARG
    # prefix a jump needs moves anything further
    consts, names = list(code1.co_consts), list(code1.co_names)
    const_at: dict = {}
    name_at = {name: i for i, name in enumerate(names)}
    for i, value in enumerate(consts):
        if value is None or type(value) in (int, str):
            const_at.setdefault((type(value), value), i)
    ops: list[list] = []  # [opcode, arg or Label, key, ext, start]
    labels2: list[tuple[Label, int]] = []  # label -> index into ops
    for it in items[stub_start:]:
        if it.label is not None:
            labels2.append((it.label, len(ops)))
            continue
        instr = it.instr
        assert instr is not None  # an item is a label or an instruction
        opcode, arg = instr._opcode, instr._arg  # noqa: SLF001
        if isinstance(arg, Label):
            pass
        elif opcode in _HAS_CONST:
            if not (arg is None or type(arg) in (int, str, tuple)):
                raise _NotSpliced(f"constant {arg!r}")
            const_key = (type(arg), arg)
            if const_key not in const_at:
                const_at[const_key] = len(consts)
                consts.append(arg)
            arg = const_at[const_key]
        elif opcode in _HAS_NAME:
            flag = 0
            if isinstance(arg, tuple):  # (method form, name): 3.12+ LOAD_ATTR
                flag, arg = (1 if arg[0] else 0), arg[1]
            if not isinstance(arg, str):
                raise _NotSpliced(f"name {arg!r}")
            if arg not in name_at:
                name_at[arg] = len(names)
                names.append(arg)
            arg = name_at[arg] << 1 | flag if opcode in _FLAG_OPS else name_at[arg]
        elif isinstance(arg, Compare):
            arg = _compare_arg(arg)
        elif arg is UNSET:
            arg = 0
        elif type(arg) is not int:
            raise _NotSpliced(f"argument {arg!r} of {instr.name}")
        ops.append([opcode, arg, it.key, 0 if isinstance(arg, Label) else _ext(arg), 0])
    base = n1 // 2
    for _ in range(200):
        off = base
        for op in ops:
            op[4] = off
            off += op[3] + 1 + _CACHES[op[0]]
        end = off
        for label, index in labels2:
            label_off[label] = ops[index][4] if index < len(ops) else end
        moved = False
        for op in ops:
            target = op[1]
            if isinstance(target, Label):
                after = op[4] + op[3] + 1 + _CACHES[op[0]]
                dest = label_off[target]
                delta = after - dest if op[0] in _BACKWARD_JUMPS else dest - after
                if delta < 0:
                    raise _NotSpliced("a jump in the wrong direction")
                if _ext(delta) > op[3]:
                    op[3] = _ext(delta)
                    moved = True
        if not moved:
            break
    else:
        raise _NotSpliced("jumps did not settle")
    code = bytearray(raw1)
    for opcode, arg, key, ext, start in ops:
        if isinstance(arg, Label):
            after = start + ext + 1 + _CACHES[opcode]
            dest = label_off[arg]
            arg = after - dest if opcode in _BACKWARD_JUMPS else dest - after
        for k in range(ext, 0, -1):
            code += bytes((_EXTENDED_ARG, (arg >> (8 * k)) & 0xFF))
        code += bytes((opcode, arg & 0xFF))
        code += bytes(2 * _CACHES[opcode])
        spans.append((start, start + ext + 1 + _CACHES[opcode], key))
    # the exception table: consecutive instructions with the same entry merged
    table = bytearray()
    run_start, run_stop = 0, 0
    run_key: EntryKey | None = None
    for start, stop, key in [*spans, (end, end, None)]:
        if key == run_key and start == run_stop:
            run_stop = stop
            continue
        if run_key is not None:
            target, lasti, depth = run_key
            _varint(table, run_start, 0x80)
            _varint(table, run_stop - run_start, 0)
            _varint(table, label_off[target], 0)
            _varint(table, depth << 1 | int(lasti), 0)
        run_start, run_stop, run_key = start, stop, key
    # the stubs have no line: "no location" entries of up to 8 code units
    lines = bytearray(code1.co_linetable)
    left = end - base
    while left > 0:
        chunk = min(left, 8)
        lines.append(0x80 | _NO_LOCATION << 3 | (chunk - 1))
        left -= chunk
    return code1.replace(co_code=bytes(code), co_consts=tuple(consts), co_names=tuple(names),
                         co_exceptiontable=bytes(table), co_linetable=bytes(lines),
                         co_stacksize=stacksize)
