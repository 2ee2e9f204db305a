"""Reading rewritten code back: which cell, original or retry copy, an offset
is in.  Without the ``bytecode`` library (``opcode`` and the code's own tables):
an exception the program handles asks this of its callers, and a start whose
modules all came from the code cache has not imported ``bytecode``."""

from __future__ import annotations

import opcode
import types

from .._cell import ARMED_MARK, Cell, is_cell_ref, resolve
from .._exctable import exception_entries

_LOAD_CONST = opcode.opmap["LOAD_CONST"]
_EXTENDED_ARG = opcode.opmap["EXTENDED_ARG"]
_JUMP_FORWARD = opcode.opmap["JUMP_FORWARD"]
_CALL = opcode.opmap["CALL"]


def _cache_table() -> list[int]:
    caches = opcode._inline_cache_entries  # type: ignore[attr-defined]  # noqa: SLF001
    out = [0] * 256
    for name, op in opcode.opmap.items():
        if op < 256:
            out[op] = caches[op] if isinstance(caches, list) else caches.get(name, 0)
    return out


#: the CACHE entries after each opcode
_CACHES = _cache_table()


def cell_ranges(code: types.CodeType) -> list[tuple[int, int, Cell, bool]]:
    """(start, stop, cell, is the retry copy) in byte offsets of rewritten
    ``code``: the ranges of its exception table that lead to a cell's stub
    (whose first instruction loads the cell's constant, ``_cell.resolve``).
    A cell's first range is its original instructions; a later one is its
    retry copy (appended)."""
    raw, consts = code.co_code, code.co_consts
    found: list[tuple[int, int, Cell]] = []
    entries = exception_entries(code)
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


def _decode(raw: bytes, offset: int) -> tuple[int, int, int]:
    """(opcode, argument, offset of the next instruction) at ``offset``."""
    ext = 0
    while raw[offset] == _EXTENDED_ARG:
        ext = (ext | raw[offset + 1]) << 8
        offset += 2
    op = raw[offset]
    return op, ext | raw[offset + 1], offset + 2 + 2 * _CACHES[op]


def _entry_at(code: types.CodeType, offset: int):
    for entry in exception_entries(code):
        if entry.start <= offset < entry.end:
            return entry
    return None


def _call_in(raw: bytes, start: int) -> tuple[int, int, list[int]] | None:
    """(offset, end, the opcodes before it) of the first call with 4
    arguments from ``start``: the barrier's (or the upgrade's) in a stub's
    shared part (``_emit``)."""
    at, ops = start, list[int]()
    while at < len(raw) and len(ops) < 512:
        op, arg, after = _decode(raw, at)
        if op == _CALL and arg == 4:
            return at, after, ops
        ops.append(op)
        at = after
    return None


def trap_path(armed: types.CodeType, new: types.CodeType, lasti: int) -> tuple | None:
    """Where the trap of armed code that instruction ``lasti`` raised into
    calls the upgrade, and where the vaccinated code ``new`` made from the
    same original calls the barrier for the cell holding that instruction:
    (the cell's constant in ``new``, call and return offsets in ``armed``,
    the same in ``new``); None unless both codes are laid out alike -- the
    same instructions before the traps, the same shared stub part (``_emit``)."""
    offset = lasti * 2
    raw1, raw2 = armed.co_code, new.co_code
    e1, e2 = _entry_at(armed, offset), _entry_at(new, offset)
    if e1 is None or e2 is None or (e1.depth, e1.lasti) != (e2.depth, e2.lasti) or not e1.lasti:
        return None
    op, arg, head1 = _decode(raw1, e1.target)
    mark = armed.co_consts[arg] if op == _LOAD_CONST and arg < len(armed.co_consts) else None
    if type(mark) is not tuple or len(mark) != 3 or mark[0] != ARMED_MARK:
        return None
    op, arg, after = _decode(raw2, e2.target)
    ref = new.co_consts[arg] if op == _LOAD_CONST and arg < len(new.co_consts) else None
    if ref is None or not is_cell_ref(ref) or ref[1] != mark[1]:
        return None
    op, arg, after = _decode(raw2, after)
    if op != _JUMP_FORWARD:
        return None
    head2 = after + 2 * arg
    # the original instructions: the same bytes up to the traps
    end = armed_end(armed)
    if not end or raw1[:end] != raw2[:end]:
        return None
    # the same instructions up to the call (their arguments' sizes may
    # differ: a big code object's indices), the same stack there
    call1, call2 = _call_in(raw1, head1), _call_in(raw2, head2)
    if call1 is None or call2 is None or call1[2] != call2[2]:
        return None
    return ref, call1[0], call1[1], call2[0], call2[1]


def armed_end(armed: types.CodeType) -> int:
    """Where the original instructions of armed code end (its first trap):
    below it, armed code and its vaccinated code have the same instructions
    at the same offsets; 0 if it has no trap."""
    raw, consts = armed.co_code, armed.co_consts
    traps = []
    for entry in exception_entries(armed):
        op, arg, _ = _decode(raw, entry.target)
        const = consts[arg] if op == _LOAD_CONST and arg < len(consts) else None
        if entry.lasti and type(const) is tuple and len(const) == 3 and const[0] == ARMED_MARK:
            traps.append(entry.target)
    return min(traps) if traps else 0


def trap_at(armed: types.CodeType, offset: int) -> tuple | None:
    """The constant of the trap that byte ``offset`` of armed code leads to
    (``(ARMED_MARK, key, group)``), or None: no cell holds it."""
    entry = _entry_at(armed, offset)
    if entry is None or not entry.lasti:
        return None
    op, arg, _ = _decode(armed.co_code, entry.target)
    const = armed.co_consts[arg] if op == _LOAD_CONST and arg < len(armed.co_consts) else None
    if type(const) is tuple and len(const) == 3 and const[0] == ARMED_MARK:
        return const
    return None
