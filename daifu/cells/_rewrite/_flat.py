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

import dis
import os
import types
from collections.abc import Callable
from itertools import islice

from .._cell import ARMED_MARK
from .._exctable import encode
from ._opsets import _MACHINERY, _TERMINAL, PY
from ._readback import _CACHES
from ._readback import _decode as _read

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)
if TYPE_CHECKING:
    from .._cell import CodeInfo
    from .._source import ModuleSource

_FORWARD, _BACKWARD, _ABSOLUTE = 1, 2, 3  # (``_decode``'s jump kinds)


def _has_arg(op: int) -> bool:
    return op in dis.hasarg if hasattr(dis, "hasarg") else op >= dis.HAVE_ARGUMENT


def _jump(op: int) -> int:
    if op in dis.hasjabs:
        return _ABSOLUTE
    if op in dis.hasjrel:
        return _BACKWARD if "BACKWARD" in dis.opname[op] else _FORWARD
    return 0


#: per opcode: (name, has an argument, -, jump kind, CACHE units): the
#: columns of ``_decode._TABLE`` the walk reads, from ``dis`` (the tests
#: compare them with ``bytecode``'s)
_TABLE = tuple((dis.opname[op], _has_arg(op), None, _jump(op), _CACHES[op]) for op in range(256))
_EXTENDED_ARG = dis.opmap["EXTENDED_ARG"]

_NOT_FLAT_FLAGS = 0x20 | 0x80 | 0x100 | 0x200  # generator, coroutines, async generator
_RESUME = dis.opmap["RESUME"]
_FOR_ITER = dis.opmap["FOR_ITER"]
#: per opcode: not in flat code after the prologue (the exception-handling
#: machinery, a loop's iterator)
_REFUSED = frozenset(op for op in range(256) if _TABLE[op][0] in _MACHINERY) | {_FOR_ITER}
_ENDS = frozenset(op for op in range(256) if _TABLE[op][0] in _TERMINAL)
#: (argument << 9 | opcode << 1 | jump taken) -> the stack effect
_effects: dict[int, int] = {}


def _effect(key: int) -> int:
    op, jump = key >> 1 & 0xFF, bool(key & 1)
    arg = key >> 9 if _TABLE[op][1] else None
    effect = _effects[key] = dis.stack_effect(op, arg, jump=jump)
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
    generator; None, True: not flat; an index past one byte: None, False --
    the package's ``arm`` asks ``_core.arm`` then)."""
    if _TAIL is None or code.co_flags & 0x20:
        return None, False
    start = flat_start(code, msrc.statements(scope))
    if start is None:
        return None, True
    return _covered(code, info, start, replace_consts), False


def _covered(code: types.CodeType, info: CodeInfo, start: int,
             replace_consts: dict | None) -> types.CodeType | None:
    """``code`` with its instructions from code unit ``start`` on under one
    exception-table entry to the trap ``_TAIL`` lays out after them (what
    ``_assemble.append_covering`` makes of them, byte for byte); None where
    an index of the trap's does not fit its byte."""
    assert _TAIL is not None
    tail, slots, new_consts, mark_at, new_names, ranges, trap, end, peak = _TAIL
    consts = list(code.co_consts)
    if replace_consts:
        for i, c in enumerate(consts):
            if type(c) is types.CodeType and id(c) in replace_consts:
                consts[i] = replace_consts[id(c)]
    # (the tables grow as ``_assemble._Tables`` grows them)
    const_at: dict = {}
    for i, value in enumerate(consts):
        if value is None or type(value) in (int, str):
            const_at.setdefault((type(value), value), i)
    at_const = []
    for k, value in enumerate(new_consts):
        if k == mark_at:
            value = (ARMED_MARK, info.key, 0)
        at = const_at.get((type(value), value))
        if at is None:
            at = const_at[(type(value), value)] = len(consts)
            consts.append(value)
        at_const.append(at)
    names = list(code.co_names)
    name_at = {name: i for i, name in enumerate(names)}
    at_name = []
    for name in new_names:
        at = name_at.get(name)
        if at is None:
            at = name_at[name] = len(names)
            names.append(name)
        at_name.append(at)
    body = bytearray(tail)
    for pos, kind, k in slots:
        arg = at_const[k] if kind == 0 else at_name[k] if kind == 1 else at_name[k] << 1 | kind - 2
        if arg > 0xFF:
            return None
        body[pos] = arg
    base = len(code.co_code) // 2
    table = encode([(start, base, base + trap, 0, True)]
                   + [(s + base, e + base, t + base, d, lasti) for s, e, t, d, lasti in ranges])
    lines = bytearray(code.co_linetable)
    full, rest = divmod(end, 8)  # ("no location" entries of 8 units, then the rest)
    lines += bytes((0x80 | 15 << 3 | 7,)) * full
    if rest:
        lines.append(0x80 | 15 << 3 | (rest - 1))
    info.traps = [()]  # (one trap, no handler: no guard)
    info.armed = True
    return code.replace(co_code=code.co_code + body, co_consts=tuple(consts),
                        co_names=tuple(names), co_exceptiontable=table,
                        co_linetable=bytes(lines), co_stacksize=max(code.co_stacksize, peak))


def _tail() -> tuple | None:
    from ._flattail import TAILS  # lazy: 0.1 ms

    return TAILS.get(PY.python)


#: this version's flat trap, laid out (``_flattail``); None: none is known
_TAIL = _tail()
