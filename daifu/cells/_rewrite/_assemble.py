"""Assembly of the emitted items into a code object, and reading the
rewritten code back (which cell, original or retry copy, an offset is in)."""

from __future__ import annotations

import types

from bytecode import Label, TryBegin, TryEnd

from .._cell import Cell, resolve
from ._emit import _Item
from ._ops import _EXTENDED_ARG, _LOAD_CONST, _Op


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
