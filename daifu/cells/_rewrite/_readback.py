"""Reading rewritten code back: which cell, original or retry copy, an offset
is in.  Without the ``bytecode`` library (``dis`` and the code's own tables):
an exception the program handles asks this of its callers, and a start whose
modules all came from the code cache has not imported ``bytecode``."""

from __future__ import annotations

import dis
import types

from .._cell import Cell, resolve

_LOAD_CONST = dis.opmap["LOAD_CONST"]
_EXTENDED_ARG = dis.opmap["EXTENDED_ARG"]


def cell_ranges(code: types.CodeType) -> list[tuple[int, int, Cell, bool]]:
    """(start, stop, cell, is the retry copy) in byte offsets of rewritten
    ``code``: the ranges of its exception table that lead to a cell's stub
    (whose first instruction loads the cell's constant, ``_cell.resolve``).
    A cell's first range is its original instructions; a later one is its
    retry copy (appended)."""
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
