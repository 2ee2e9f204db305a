"""Decoding a code object into the rewrite's instructions in one pass.

``bytecode``'s ``Bytecode.from_code`` builds a concrete instruction per code
unit, strips the ``EXTENDED_ARG`` prefixes in a second list, converts to
abstract instructions with pseudo-instructions for the exception table, and
the rewrite flattened that again (``_analysis._flatten``): half of what arming
a function cost.  ``decode`` goes from ``co_code`` to the same ``_Op`` list
directly -- the same ``Instr`` objects (their arguments converted as
``bytecode`` converts them, with its own opcode tables), the same labels,
each instruction's exception-table entry -- and reads each one's encoded
argument and offset on the way (``_Op.raw``, ``_Op.offset``).

Code whose exception table or jumps do not fall on instruction boundaries
(never compiled by CPython) is left to ``bytecode`` (``decode`` answers None);
``tests/test_transform.py`` checks the two agree on the standard library."""

from __future__ import annotations

import types
from itertools import islice
from typing import Any

from bytecode import Instr, Label
from bytecode import concrete as _concrete
from bytecode import instr as _instr
from bytecode.instr import (
    BinaryOp,
    CellVar,
    CommonConstant,
    Compare,
    FormatValue,
    FreeVar,
    InstrLocation,
    Intrinsic1Op,
    Intrinsic2Op,
    SpecialMethod,
)

from .._exctable import exception_entries
from ._ops import PY, _Op
from ._readback import _CACHES

_PY313 = PY.python >= (3, 13)
_PY312 = PY.python >= (3, 12)

# argument kinds, in the order ``ConcreteBytecode.to_bytecode`` tests them
(_RAW, _CONST, _LOCAL, _DUAL_LOCAL, _NAME, _FLAG_NAME, _FLAG2_NAME, _FREE, _COMPARE,
 _INTRINSIC1, _INTRINSIC2, _BINARY, _COMMON, _SPECIAL, _FLAG_FORMAT, _FORMAT) = range(16)
_FORWARD, _BACKWARD, _ABSOLUTE = 1, 2, 3


def _kind(op: int) -> int:
    c = _concrete
    if op in c.HAS_CONST:
        return _CONST
    if op in c._opcode.haslocal:  # noqa: SLF001
        return _DUAL_LOCAL if op in c.DUAL_ARG_OPCODES else _LOCAL
    if op in c.HAS_NAME:
        return (_FLAG_NAME if op in c.BITFLAG_OPCODES
                else _FLAG2_NAME if op in c.BITFLAG2_OPCODES else _NAME)
    if op in c.HAS_FREE:
        return _FREE
    if op in c.HAS_COMPARE:
        return _COMPARE
    for kind, ops in ((_INTRINSIC1, c.INTRINSIC_1OP), (_INTRINSIC2, c.INTRINSIC_2OP),
                      (_BINARY, c.BINARY_OPS), (_COMMON, c.COMMON_CONSTANT_OPS),
                      (_SPECIAL, c.SPECIAL_OPS)):
        if op in ops:
            return kind
    if op in c.FORMAT_VALUE_OPS:
        return _FLAG_FORMAT if op in c.BITFLAG_OPCODES else _FORMAT
    return _RAW


def _jump(op: int) -> int:
    return (_FORWARD if op in _instr.HAS_FORWARD_RELATIVE_JUMP
            else _BACKWARD if op in _instr.HAS_BACKWARD_RELATIVE_JUMP
            else _ABSOLUTE if op in _instr.HAS_ABSOLUTE_JUMP else 0)


#: per opcode: (name, has an argument, argument kind, jump kind, CACHE units)
_TABLE = tuple((_concrete._opcode.opname[op], _instr.opcode_has_argument(op), _kind(op),  # noqa: SLF001
                _jump(op), _CACHES[op]) for op in range(256))
_EXTENDED_ARG = _instr.EXTENDEDARG_OPCODE
_NOP = _instr.NOP_OPCODE
_CACHE = _instr.CACHE_OPCODE
_UNSET = _instr.UNSET
def _compare(arg: int) -> Compare:
    return Compare((arg >> 5) + ((1 << 4) if (arg & 16) else 0) if _PY313
                   else (arg >> 4) if _PY312 else arg)


_ENUMS = {_COMPARE: _compare, _INTRINSIC1: Intrinsic1Op, _INTRINSIC2: Intrinsic2Op,
          _BINARY: BinaryOp, _COMMON: CommonConstant, _SPECIAL: SpecialMethod}
#: (kind, argument) -> the enum member (calling an enum is slow)
_MEMO: dict[tuple[int, int], object] = {}
_from_trusted = Instr._from_trusted  # noqa: SLF001
_location = InstrLocation._from_tuple  # noqa: SLF001


def _entries(code: types.CodeType) -> list[tuple[int, int, int, int, bool]] | None:
    """The exception table: (start, stop, target, depth, lasti) in code
    units, ``stop`` exclusive; None unless sorted and disjoint."""
    out: list[tuple[int, int, int, int, bool]] = []
    last = 0
    for entry in exception_entries(code):
        start, stop = entry.start // 2, entry.end // 2
        if stop <= start or start < last:
            return None
        last = stop
        out.append((start, stop, entry.target // 2, entry.depth, entry.lasti))
    return out


def decode(code: types.CodeType) -> tuple[list[_Op], dict[Label, int]] | None:
    """``code``'s instructions as ``_flatten(Bytecode.from_code(code,
    conserve_exception_block_stackdepth=True))`` has them, with ``raw`` and
    ``offset`` set; None where that needs ``bytecode`` (see the module)."""
    raw = code.co_code
    units = len(raw) // 2
    # (read in step with the code units, not listed: a tuple per unit,
    # caches included, was a quarter of a big module's peak memory)
    positions = iter(code.co_positions())
    at = 0  # the code unit ``positions`` yields next
    consts, names, varnames = code.co_consts, code.co_names, code.co_varnames
    cells = list(varnames) + [CellVar(n) for n in code.co_cellvars if n not in varnames]
    ncells = len(cells)
    locals_ = cells + [FreeVar(n) for n in code.co_freevars if n not in varnames] \
        if _PY313 else varnames
    table = _TABLE
    ops: list[_Op] = []
    starts: dict[int, int] = {}  # code unit of an instruction (its prefixes') -> index
    jumps: list[tuple[int, int]] = []  # (index, target unit)
    last_pos: tuple | None = None
    loc = None
    u = 0
    while u < units:
        start = u
        op, arg = raw[2 * u], raw[2 * u + 1]
        while op == _EXTENDED_ARG:
            u += 1
            if u >= units:
                return None
            op, arg = raw[2 * u], (arg << 8) | raw[2 * u + 1]
        if op == _CACHE:
            return None
        name, has_arg, kind, jump, caches = table[op]
        if u != at:  # (its prefixes', or a previous instruction's caches)
            if u - at == 1:
                next(positions)
            else:
                next(islice(positions, u - at - 1, None))
        pos = next(positions)  # (the instruction's own)
        at = u + 1
        if pos != last_pos:
            loc, last_pos = _location(*pos), pos
        nxt = u + 1 + caches
        entry: _Op
        if jump:
            target = nxt + arg if jump == _FORWARD else nxt - arg if jump == _BACKWARD else arg
            jumps.append((len(ops), target))
            # (its label, once every target is known: ``_link``)
            entry = _Op(_from_trusted(name, op, _UNSET, loc), None, None, 0, None, 2 * start)
        else:
            value: Any
            if not has_arg or (start != u and op == _NOP):
                value = _UNSET
            elif kind == _LOCAL:  # (the commonest kinds here, the rest in ``_value``)
                value = locals_[arg]
            elif kind == _CONST:
                value = consts[arg]
            elif kind == _RAW:
                value = arg
            else:
                value = _value(kind, arg, consts, names, locals_, cells, ncells,
                               code.co_freevars)
            entry = _Op(_from_trusted(name, op, value, loc), None, None, 0, arg, 2 * start)
        starts[start] = len(ops)
        ops.append(entry)
        u = nxt
    return _link(ops, starts, jumps, code, u)


def _value(kind: int, arg: int, consts, names, locals_, cells, ncells: int, freevars):
    if kind == _RAW:
        return arg
    if kind == _CONST:
        return consts[arg]
    if kind == _LOCAL:
        return locals_[arg]
    if kind == _DUAL_LOCAL:
        return (locals_[arg >> 4], locals_[arg & 15])
    if kind == _NAME:
        return names[arg]
    if kind == _FLAG_NAME:
        return (bool(arg & 1), names[arg >> 1])
    if kind == _FLAG2_NAME:
        return (bool(arg & 1), bool(arg & 2), names[arg >> 2])
    if kind == _FREE:
        if arg < ncells:
            cell = cells[arg]
            return cell if isinstance(cell, CellVar) else CellVar(cell)
        return FreeVar(freevars[arg - ncells])
    enum = _ENUMS.get(kind)
    if enum is not None:
        value = _MEMO.get((kind, arg))
        if value is None:
            value = _MEMO[(kind, arg)] = enum(arg)
        return value
    return (bool(arg & 1), FormatValue(arg >> 1)) if kind == _FLAG_FORMAT else FormatValue(arg)


def _link(ops: list[_Op], starts: dict[int, int], jumps: list[tuple[int, int]],
          code: types.CodeType, end: int) -> tuple[list[_Op], dict[Label, int]] | None:
    """The labels (one per jump or handler target, in code order) and each
    instruction's exception-table entry."""
    entries = _entries(code)
    if entries is None:
        return None
    targets = {t for _, t in jumps} | {e[2] for e in entries}
    labels: dict[int, Label] = {}
    label_at: dict[Label, int] = {}
    for unit in sorted(targets):
        index = starts.get(unit)
        if index is None:
            return None
        label = labels[unit] = Label()
        label_at[label] = index
    for index, unit in jumps:
        ops[index].instr._arg = labels[unit]  # noqa: SLF001
    for start, stop, target, depth, lasti in entries:
        first = starts.get(start)
        if first is None or (stop != end and stop not in starts):
            return None
        key = (labels[target], lasti, depth)
        for i in range(first, starts[stop] if stop != end else len(ops)):
            ops[i].entry = key
    return ops, label_at
