"""Flat code: armed without decoding it.

Most code objects -- three in four over the standard library -- have no
``try``, ``with`` or ``for``: no exception table, no loop iterator on the
stack.  Every statement of such code starts with nothing on the stack, and
where no jump lands inside a statement with values on the stack, every run
``_runs._build_runs`` finds starts at depth 0 outside any handler: arming
(``_core.arm``) makes one trap, of base depth 0 and no handler, and points
the runs at it.  ``flat_start`` finds such code from its raw instructions
alone -- their stack depths, read along them, no statement, no ``Instr``
object -- and ``_core.arm`` then points *every* instruction after the
prologue at that one trap, in one exception-table entry.

The entry covers a few instructions no run covers (a call being set up, the
implicit ``return None``): an exception there reaches the trap, whose
upgrade finds no cell at that instruction in the vaccinated code
(``_readback.trap_path``) and re-raises it where it was raised, as armed
code without the entry would.  ``tests/test_transform.py`` checks, over the
standard library, that flat code's exact arming has no other trap and no
entry of another depth."""

from __future__ import annotations

import opcode
import os
import types
from collections.abc import Callable
from itertools import accumulate, islice

from .._cell import ARMED_MARK
from .._exctable import encode
from ._opsets import _MACHINERY, _TERMINAL, PY
from ._readback import _CACHES
from ._readback import _decode as _read
from ._tables import CONST, NAME, Tables

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)
if TYPE_CHECKING:
    from .._cell import CodeInfo
    from .._source import ModuleSource

_FORWARD, _BACKWARD, _ABSOLUTE = 1, 2, 3  # (``_decode``'s jump kinds)


def _table() -> tuple:
    """Per opcode: (name, has an argument, -, jump kind, CACHE units): the
    columns of ``_decode._TABLE`` the walk reads, from ``opcode`` (the
    tests compare them with ``bytecode``'s)."""
    has_arg = frozenset(getattr(opcode, "hasarg", range(opcode.HAVE_ARGUMENT, 256)))
    absolute, relative, names = frozenset(opcode.hasjabs), frozenset(opcode.hasjrel), opcode.opname
    return tuple((names[op], op in has_arg, None,
                  _ABSOLUTE if op in absolute else 0 if op not in relative
                  else _BACKWARD if "BACKWARD" in names[op] else _FORWARD, _CACHES[op])
                 for op in range(256))


_TABLE = _table()
_EXTENDED_ARG = opcode.opmap["EXTENDED_ARG"]

_NOT_FLAT_FLAGS = 0x20 | 0x80 | 0x100 | 0x200  # generator, coroutines, async generator
_RESUME = opcode.opmap["RESUME"]
_FOR_ITER = opcode.opmap["FOR_ITER"]
#: per opcode: not in flat code after the prologue (the exception-handling
#: machinery, a loop's iterator)
_REFUSED = frozenset(op for op in range(256) if _TABLE[op][0] in _MACHINERY) | {_FOR_ITER}
_ENDS = frozenset(op for op in range(256) if _TABLE[op][0] in _TERMINAL)
#: (argument << 9 | opcode << 1 | jump taken) -> the stack effect
_effects: dict[int, int] = {}


def _effect(key: int) -> int:
    op, jump = key >> 1 & 0xFF, bool(key & 1)
    arg = key >> 9 if _TABLE[op][1] else None
    effect = _effects[key] = opcode.stack_effect(op, arg, jump=jump)
    return effect


def _after_prologue(code: types.CodeType) -> int | None:
    """The code unit after ``code``'s ``RESUME``; None if ``code`` cannot be
    flat (a handler, a generator or coroutine) or has nothing after it but
    a ``return`` (left to the exact arming)."""
    if code.co_exceptiontable or code.co_flags & _NOT_FLAT_FLAGS:
        return None
    raw, u = code.co_code, 0
    units = len(raw) // 2
    while u < units and raw[2 * u] != _RESUME:
        u += 1 + _TABLE[raw[2 * u]][4]
    start = u + 1 + _TABLE[_RESUME][4]
    return None if start >= units - 2 else start


class _Statements:
    """The statement of each position (``index.locate``), the one found
    last remembered with its own span: most instructions are in the
    statement of the one before them."""

    __slots__ = ("index", "cur", "span", "found")

    def __init__(self, index) -> None:
        self.index, self.cur, self.span, self.found = index, None, (-1, -1, -1, -1), False

    def of(self, pos: tuple):
        line, end_line, col, end_col = pos
        s_line, s_col, e_line, e_col = self.span
        if self.cur is not None and None not in pos \
                and (s_line < line or s_line == line and s_col <= col) \
                and (end_line < e_line or end_line == e_line and end_col <= e_col):
            return self.cur
        found = self.index.locate(pos)
        if found is None:
            return None
        self.found, self.cur, self.span = True, found[0], found[1:]
        return self.cur


def _stack_effect(op: int, arg: int, has_arg: bool, jump: bool) -> int:
    key = (arg << 9 if has_arg else 0) | op << 1 | jump
    effect = _effects.get(key)
    return effect if effect is not None else _effect(key)


def py_flat_start(code: types.CodeType, index) -> int | None:
    """The code unit after ``code``'s prologue (its ``RESUME``) if ``code`` is
    flat (see the module), None otherwise -- or where it is nothing but its
    prologue and a ``return``, or has no statement (the exact arming says
    what that is).  ``index``: the statements of its scope
    (``_source.StatementIndex``)."""
    start = _after_prologue(code)
    if start is None:
        return None
    raw = code.co_code
    units = len(raw) // 2
    positions = iter(code.co_positions())
    next(islice(positions, start - 1, None))  # (up to the prologue's last unit)
    pos_at = u = start  # (``pos_at``: the code unit ``positions`` yields next)
    statements = _Statements(index)
    last_pos: tuple | None = None
    stmt = previous = None  # (the statements of this and of the instruction before it)
    depth_at: dict[int, int] = {}  # code unit -> the depth a forward jump brings there
    seen: set[int] = set()  # the code units of the instructions reached at depth 0
    depth: int | None = 0  # (None: unreachable from above)
    while u < units:
        at = u
        try:
            op, arg, after = _read(raw, 2 * at)
        except IndexError:  # (a prefix at the end: never compiled by CPython)
            return None
        if op in _REFUSED:
            return None
        landed = depth_at.get(at)
        if landed is not None:
            if depth is not None and depth != landed:
                return None
            depth = landed
        _, has_arg, _, jump, caches = _TABLE[op]
        nxt = after // 2
        u = nxt - 1 - caches  # (the instruction's own unit, after its prefixes)
        if depth is None:  # (dead code: never run)
            u = nxt
            continue
        if u != pos_at:  # (its prefixes', or the caches before it)
            next(islice(positions, u - pos_at - 1, None))
        pos = next(positions)
        pos_at = u + 1
        if pos != last_pos:
            last_pos, stmt = pos, statements.of(pos)
        if depth == 0:
            seen.add(at)
        elif stmt is None or stmt is not previous:
            return None  # (a run would start here, above values on the stack)
        previous = stmt
        if jump:
            target = nxt + arg if jump == _FORWARD else nxt - arg if jump == _BACKWARD else arg
            if depth + _stack_effect(op, arg, has_arg, True) != 0 or not 0 <= target <= units \
                    or (target <= at and target not in seen) \
                    or depth_at.setdefault(target, 0) != 0:
                return None  # (a jump into a statement with values on the stack)
        depth = None if op in _ENDS else depth + _stack_effect(op, arg, has_arg, False)
        u = nxt
    return start if statements.found else None


def _in_c():
    """``_cflat.flat_start`` (the same walk in C), set up with these tables;
    None where it is not built or ``DAIFU_SPEEDUPS=0``."""
    if os.environ.get("DAIFU_SPEEDUPS", "1") == "0":
        return None
    try:
        from ._cflat import flat_start, setup  # (C)  # lazy: 0.0 ms
    except ImportError:
        return None
    flags = bytes((1 if has_arg else 0) | (2 if op in _REFUSED else 0)
                  | (4 if op in _ENDS else 0) | jump << 3
                  for op, (_, has_arg, _, jump, _) in enumerate(_TABLE))
    setup(flags, bytes(row[4] for row in _TABLE), _RESUME, _EXTENDED_ARG, _NOT_FLAT_FLAGS)
    return flat_start


#: the walk ``_core.arm`` calls: in C where built, else ``py_flat_start``
flat_start: Callable[[types.CodeType, object], int | None] = _in_c() or py_flat_start


def arm(code: types.CodeType, info: CodeInfo, msrc: ModuleSource, scope,
        replace_consts: dict | None = None) -> tuple[types.CodeType | None, bool]:
    """``code`` armed as ``_core.arm`` arms it if it is flat, its trap laid
    out from this version's ``_flattail.TAILS`` entry -- without
    ``bytecode``, which a start whose code is all flat never imports -- and
    whether it was walked (None, False: a version without an entry, or a
    generator; None, True: not flat -- the package's ``arm`` asks
    ``_core.arm`` then)."""
    if _TAIL is None or code.co_flags & 0x20:
        return None, False
    start = flat_start(code, msrc.statements(scope))
    if start is None:
        return None, True
    return _covered(code, info, start, replace_consts), False


def _covered(code: types.CodeType, info: CodeInfo, start: int,
             replace_consts: dict | None) -> types.CodeType:
    """``code`` with its instructions from code unit ``start`` on under one
    exception-table entry to the trap ``_TAIL`` lays out after them (what
    ``_assemble.append_covering`` makes of them)."""
    assert _TAIL is not None
    tail, slots, _, mark_at, _, ranges, trap, end, peak = _TAIL
    consts = list(code.co_consts)
    if replace_consts:
        for i, c in enumerate(consts):
            if type(c) is types.CodeType and id(c) in replace_consts:
                consts[i] = replace_consts[id(c)]
    mark = (ARMED_MARK, info.key, 0)
    tables = _grown(consts, code.co_names, mark, False)
    body = bytearray(tail)
    at_const, at_name = tables[2], tables[3]
    wide = shared = False
    for pos, kind, k in slots:
        arg = at_const[k] if kind == 0 else at_name[k] if kind == 1 else at_name[k] << 1 | kind - 2
        if arg > 0xFF:
            wide = True
            shared = shared or not (kind == 0 and k == mark_at)
        body[pos] = arg & 0xFF
    if shared:  # (the shared part's own index past a byte: ``append_covering``
        # lays out its instructions, the tables grown in their order)
        tables = _grown(consts, code.co_names, mark, True)
    if wide:  # (laid out again, with the EXTENDED_ARG prefixes its indices need)
        body, ranges, trap, end = _wide(tables[2], tables[3])  # type: ignore[assignment]
    base = len(code.co_code) // 2
    table = encode([(start, base, base + trap, 0, True)]
                   + [(s + base, e + base, t + base, d, lasti) for s, e, t, d, lasti in ranges])
    lines = bytearray(code.co_linetable)
    full, rest = divmod(end, 8)  # ("no location" entries of 8 units, then the rest)
    lines += bytes((0x80 | NO_LOCATION << 3 | 7,)) * full
    if rest:
        lines.append(0x80 | NO_LOCATION << 3 | (rest - 1))
    info.traps = [()]  # (one trap, no handler: no guard)
    info.armed = True
    return code.replace(co_code=code.co_code + body, co_consts=tuple(tables[0]),
                        co_names=tuple(tables[1]), co_exceptiontable=table,
                        co_linetable=bytes(lines), co_stacksize=max(code.co_stacksize, peak))


def _grown(consts: list, names: tuple[str, ...], mark: tuple, mark_first: bool
           ) -> tuple[list, list[str], list[int], list[int]]:
    """The constant and name tables with ``_TAIL``'s values, grown as the
    rewrite grows them (``_tables.Tables``): in the order of ``_TAIL``'s
    lookups (its shared part's first, then the trap's mark) or,
    ``mark_first``, in the order of its instructions (the mark's first:
    where the shared part is laid out as instructions); and each value's
    index."""
    assert _TAIL is not None
    new_consts, mark_at, new_names = _TAIL[2], _TAIL[3], _TAIL[4]
    tables = Tables(list(consts), list(names))
    at_const = [0] * len(new_consts)
    order = [mark_at] if mark_first else []
    for k in order + [k for k in range(len(new_consts)) if not (mark_first and k == mark_at)]:
        at_const[k] = tables.index(CONST, mark if k == mark_at else new_consts[k])
    at_name = [tables.index(NAME, (name, 0)) for name in new_names]
    return tables.consts, tables.names, at_const, at_name


NO_LOCATION = 15  # the location-table code of "no location" (3.11+)


def ext(arg: int) -> int:
    """The ``EXTENDED_ARG`` prefixes an argument needs."""
    return 0 if arg < 0x100 else 1 if arg < 0x10000 else 2 if arg < 0x1000000 else 3


def _instructions() -> tuple[list[tuple[int, int, int]], list[tuple], int]:
    """``_TAIL``'s instructions: (opcode, how its argument is had -- 0 as
    it is, 1 a constant, 2 a name, 3 a name and its flag bit, 4 a jump --,
    the argument, the constant's or name's number, or the jump's target
    instruction); its exception-table entries and trap by instruction."""
    assert _TAIL is not None
    tail, slots, *_, ranges, trap, _, _ = _TAIL
    by_pos = {pos: (kind, k) for pos, kind, k in slots}
    starts, decoded = [], []
    at = 0
    while at < len(tail):
        op, arg, after = _read(tail, at)
        assert tail[at] != _EXTENDED_ARG, "a laid-out trap has no prefix"
        starts.append(at // 2)
        decoded.append((op, arg, after // 2))
        at = after
    index = {unit: i for i, unit in enumerate(starts)}
    index[len(tail) // 2] = len(starts)
    out = []
    for i, (op, arg, after) in enumerate(decoded):
        kind, k = by_pos.get(2 * starts[i] + 1, (None, 0))
        jump = _TABLE[op][3]
        if kind is not None:
            out.append((op, 1 if kind == 0 else 2 if kind == 1 else 3, k << 1 | kind - 2
                        if kind >= 2 else k))
        elif jump:
            assert jump != _ABSOLUTE, "3.11+ has no absolute jump"
            out.append((op, 4, index[after + arg if jump == _FORWARD else after - arg]))
        else:
            out.append((op, 0, arg))
    return out, [(index[s], index[e], index[t], d, lasti) for s, e, t, d, lasti in ranges], \
        index[trap]


def _wide(at_const: list[int], at_name: list[int]) -> tuple[bytes, list[tuple], int, int]:
    """``_TAIL`` laid out where an index of its does not fit a byte: each
    instruction with the ``EXTENDED_ARG`` prefixes its argument needs, the
    jumps gaining theirs until nothing moves (as ``_assemble._Layout`` lays
    it out); its code, exception-table entries, trap and length in code
    units."""
    instrs, ranges, trap = _instructions()
    args, units = [], []
    for op, how, value in instrs:
        arg = (value if how == 0 else at_const[value] if how == 1 else at_name[value]
               if how == 2 else at_name[value >> 1] << 1 | value & 1 if how == 3 else 0)
        args.append(arg)
        units.append(_CACHES[op] + 1 + ext(arg))
    while True:
        starts = list(accumulate(units, initial=0))
        moved = False
        for i, (op, how, target) in enumerate(instrs):
            if how == 4:
                delta = abs(starts[target] - starts[i + 1])
                args[i] = delta
                need = _CACHES[op] + 1 + ext(delta)
                if need > units[i]:
                    units[i], moved = need, True
        if not moved:
            break
    out = bytearray()
    for (op, _, _), arg, size in zip(instrs, args, units, strict=True):
        for k in range(size - _CACHES[op] - 1, 0, -1):
            out += bytes((_EXTENDED_ARG, (arg >> (8 * k)) & 0xFF))
        out += bytes((op, arg & 0xFF)) + bytes(2 * _CACHES[op])
    return bytes(out), [(starts[s], starts[e], starts[t], d, lasti)
                        for s, e, t, d, lasti in ranges], starts[trap], starts[-1]


def _tail() -> tuple | None:
    from ._flattail import TAILS  # lazy: 0.1 ms

    return TAILS.get((*PY.python, magic()))


def magic() -> int:
    """The magic number of the running interpreter's bytecode (``.pyc``'s)."""
    from importlib.util import MAGIC_NUMBER  # (the finder's: loaded)  # lazy: 0.0 ms

    return int.from_bytes(MAGIC_NUMBER[:2], "little")


#: this version's flat trap, laid out (``_flattail``); None: none is known
_TAIL = _tail()
