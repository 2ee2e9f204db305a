"""Assembly of the emitted items into a code object (reading it back:
``_readback``)."""

from __future__ import annotations

import dis
import itertools
import types
from typing import cast

from bytecode import Compare, Label, TryBegin, TryEnd
from bytecode.instr import BITFLAG_OPCODES, UNSET

from .._exctable import encode
from ._emit import _NOWHERE, _Chunk, _group_items, _Item
from ._flat import NO_LOCATION as _NO_LOCATION
from ._flat import ext as _ext
from ._ops import _EXTENDED_ARG, PY, _Op
from ._readback import _CACHES
from ._tables import CONST as _CONST
from ._tables import FLAG_NAME as _FLAG_NAME
from ._tables import NAME as _NAME
from ._tables import PLAIN as _PLAIN
from ._tables import Tables


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


_HAS_CONST = frozenset(dis.hasconst)
_HAS_NAME = frozenset(dis.hasname)
_BACKWARD_JUMPS = frozenset(op for name, op in dis.opmap.items() if "BACKWARD" in name)
#: opcodes whose argument is ``name index << 1 | flag``
_FLAG_OPS = frozenset(BITFLAG_OPCODES)


def _compare_arg(arg: Compare) -> int:
    """``COMPARE_OP``'s argument, encoded as ``bytecode`` does."""
    if PY.python >= (3, 13):
        return arg._get_mask() + ((arg.value & 0b1111) << 5) + (arg.value & 16)  # noqa: SLF001
    if PY.python >= (3, 12):
        return arg._get_mask() + (arg.value << 4)  # noqa: SLF001
    return arg.value


def splice(items: list[_Item], code: types.CodeType, const_updates: dict[int, object],
           stacksize: int) -> types.CodeType:
    """Assemble ``items`` into a new version of ``code``: its code, exception
    table and location table are written here, its constants and names
    extended by what daifu's instructions use; everything else (variables,
    flags, names) stays the original's.

    The original instructions and their retry copies keep the arguments the
    original encodes (``_Item.raw``; the variable, name and constant tables
    are the original's); jumps are laid out here; daifu's own instructions
    (the stubs, most of the code) use a handful of opcodes with plain
    arguments, and the part of each stub that only depends on its shape
    (``_Chunk``) is copied from a template assembled once per process.
    Raises ``_NotSpliced`` for an instruction whose argument it cannot
    encode: the caller leaves all of it to ``bytecode``."""
    try:
        return _splice(items, code, const_updates, stacksize)
    except _Expand:  # (a constant or name of a template's past index 255: big code objects)
        return _splice(expand(items), code, const_updates, stacksize)


def expand(items: list[_Item]) -> list[_Item]:
    """``items`` with every ``_Chunk`` replaced by its instructions."""
    out: list[_Item] = []
    for it in items:
        chunk = it.chunk
        if chunk is None:
            out.append(it)
        else:
            b, generator, own, slot = chunk.shape
            out += _group_items(b, generator, own, chunk.fallback, chunk.entry, slot)
    return out


class _Expand(Exception):
    """A template's constant or name index does not fit its one byte here."""


def _tables(code: types.CodeType, const_updates: dict[int, object],
            items: list[_Item]) -> _Tables:
    """``code``'s constant and name tables, ``const_updates`` applied, and the
    chunks' constants and names first, right after the original's (the
    cells' constants come after them): a code object with many cells still
    has them in one byte; one past a byte is known before the layout
    (``_Expand``)."""
    consts, names = list(code.co_consts), list(code.co_names)
    for index, value in const_updates.items():
        consts[index] = value
    tables = _Tables(consts, names)
    for it in items:
        if it.chunk is not None:
            tables.chunk_code(it.chunk.shape)
    return tables


def _exception_table(ranges, place) -> bytes:
    """The exception table of (start, stop, (target, lasti, depth)) ranges,
    ``place(target)`` the code unit of a target."""
    return encode((start, stop, place(target), depth, lasti)
                  for start, stop, (target, lasti, depth) in _merged(ranges))


def _splice(items: list[_Item], code: types.CodeType, const_updates: dict[int, object],
            stacksize: int) -> types.CodeType:
    tables = _tables(code, const_updates, items)
    lay = _Layout(items, tables)
    label_off = lay.label_off
    table = _exception_table(lay.ranges(), lambda target: target if type(target) is int
                             else label_off[target])
    lines = _location_table(code.co_firstlineno, lay.starts, lay.locations)
    return code.replace(co_code=lay.code(), co_consts=tuple(tables.consts),
                        co_names=tuple(tables.names), co_exceptiontable=table,
                        co_linetable=lines, co_stacksize=stacksize)


def append(ops: list[_Op], keys: list, label_at: dict[Label, int], code: types.CodeType,
           const_updates: dict[int, object], tail: list[_Item],
           stacksize: int) -> types.CodeType | None:
    """``code`` with its own instructions as they are -- ``ops``, each
    under the exception-table entry ``keys`` gives it -- and ``tail`` laid
    out after them (armed code: ``_core.arm``).  Its location table is the
    original's and "no location" for the tail.  None where the ops' offsets
    are not known (``splice`` does it then)."""
    offsets = [op.offset for op in ops]
    if not ops or None in offsets:
        return None
    at = cast("list[int]", offsets)
    tables, lay, tail, base = _tail_laid_out(code, const_updates, tail)
    place = {label: base + off for label, off in lay.label_off.items()}
    for label, i in label_at.items():  # (the original's handlers)
        place[label] = base if i >= len(ops) else at[i] // 2
    # (the ops' ranges merged where consecutive ones share their entry: the
    # cells' keys are one object per run, ``_core.arm``)
    ranges = []
    n, i = len(ops), 0
    while i < n:
        key, j = keys[i], i + 1
        while j < n and keys[j] is key:
            j += 1
        ranges.append((at[i] // 2, at[j] // 2 if j < n else base, key))
        i = j
    return _appended(code, tables, (lay.code(), list(lay.ranges()), lay.label_off, lay.end),
                     ranges, place, stacksize)


def append_covering(code: types.CodeType, start: int, key: tuple, const_updates: dict[int, object],
                    tail: list[_Item], stacksize: int) -> types.CodeType:
    """``code`` with its own instructions as they are, those from code unit
    ``start`` on under the one exception-table entry ``key``, and ``tail``
    laid out after them (flat armed code: ``_flat``).  ``tail``'s labels and
    chunks are the same objects for every code object (``_core``'s flat
    trap): it is laid out once per the table indices it uses."""
    try:
        tables = _tables(code, const_updates, tail)
    except _Expand:  # (its constants or names past a byte: laid out as in ``append``)
        tables, lay, tail, base = _tail_laid_out(code, const_updates, tail)
        laid = (lay.code(), list(lay.ranges()), lay.label_off, lay.end)
    else:
        signature = _signature(tail, tables)
        laid = _COVERING_TAILS.get(signature)  # type: ignore[assignment]
        if laid is None:
            lay = _Layout(tail, tables)
            laid = (lay.code(), list(lay.ranges()), lay.label_off, lay.end)
            if len(_COVERING_TAILS) >= 1024:  # (~1 MB: begun again)
                _COVERING_TAILS.clear()
            _COVERING_TAILS[signature] = laid
    base = len(code.co_code) // 2
    place = {label: base + off for label, off in laid[2].items()}
    return _appended(code, tables, laid, [(start, base, key)], place, stacksize)


#: a tail ``append_covering`` laid out, per ``_signature``: its code, its
#: exception ranges, where its labels are, its length in code units
_COVERING_TAILS: dict[tuple, tuple[bytes, list, dict, int]] = {}


def _signature(tail: list[_Item], tables: _Tables) -> tuple:
    """What the layout of ``tail`` depends on: each item's label, chunk
    (with its code, the tables' indices filled in) or instruction (its
    argument as encoded, an index into the tables looked up as ``_Layout``
    does: in the order it does), and exception-table entry."""
    out: list = []
    for it in tail:
        if it.label is not None:
            out.append(id(it.label))
        elif it.chunk is not None:
            chunk = it.chunk
            out.append((id(chunk.fallback), chunk.entry, chunk.shape,
                        bytes(tables.chunk_code(chunk.shape))))
        else:
            instr = it.instr
            kind = _KINDS.get(id(instr))
            if kind is None or kind[0] is not instr:
                kind = _kind(instr)
            _, opcode, how, arg = kind
            out.append((opcode, tables.index(how, arg) if how != _PLAIN else arg, it.key))
    return tuple(out)


def _tail_laid_out(code: types.CodeType, const_updates: dict[int, object],
                   tail: list[_Item]) -> tuple[_Tables, _Layout, list[_Item], int]:
    """The tables and layout of ``tail`` after ``code``'s own instructions
    (its chunks expanded where their constants or names do not fit a byte),
    and the code unit it starts at."""
    try:
        tables = _tables(code, const_updates, tail)
    except _Expand:  # (its constants or names past a byte: the traps' own instructions)
        tail = expand(tail)
        tables = _tables(code, const_updates, tail)
    return tables, _Layout(tail, tables), tail, len(code.co_code) // 2


def _appended(code: types.CodeType, tables: _Tables, laid: tuple[bytes, list, dict, int],
              ranges: list, place: dict, stacksize: int) -> types.CodeType:
    """``code`` and its tail (``laid``: its code, exception ranges, labels
    and length), the own instructions' exception-table ``ranges`` (code
    units) first, the tail's after them."""
    tail_code, tail_ranges, _, end = laid
    base = len(code.co_code) // 2
    ranges += [(start + base, stop + base, key) for start, stop, key in tail_ranges]
    # (a target that is an int: a place in the tail's chunks; a label: placed above)
    table = _exception_table(ranges, lambda target: target + base if type(target) is int
                             else place[target])
    lines = bytearray(code.co_linetable)
    full, rest = divmod(end, 8)  # ("no location" entries of 8 units, then the rest)
    lines += bytes((0x80 | _NO_LOCATION << 3 | 7,)) * full
    if rest:
        lines.append(0x80 | _NO_LOCATION << 3 | (rest - 1))
    return code.replace(co_code=code.co_code + tail_code, co_consts=tuple(tables.consts),
                        co_names=tuple(tables.names), co_exceptiontable=table,
                        co_linetable=bytes(lines), co_stacksize=stacksize)


def _merged(ranges):
    """The exception table's entries: (start, stop, entry) ranges, the
    consecutive ones with the same entry merged, those with none left out."""
    run_start, run_stop = 0, 0
    run_key = None
    for start, stop, key in ranges:
        if key == run_key and start == run_stop:
            run_stop = stop
            continue
        if run_key is not None:
            yield run_start, run_stop, run_key
        run_start, run_stop, run_key = start, stop, key
    if run_key is not None:
        yield run_start, run_stop, run_key


class _Tables(Tables):
    """``Tables`` with the code of each chunk shape filled in for them."""

    def __init__(self, consts: list, names: list[str]) -> None:
        super().__init__(consts, names)
        #: a chunk's shape -> its template's code with these tables' indices
        self.filled: dict[tuple, bytearray] = {}

    def chunk_code(self, shape: tuple) -> bytearray:
        """The code of a chunk of ``shape``: its template's, with these
        tables' indices (``_Expand`` when one does not fit in a byte)."""
        body = self.filled.get(shape)
        if body is None:
            body = self.filled[shape] = _filled(_template_of(shape), self)
        return body


_CHUNK = -1  # (the opcode of a chunk among the laid-out instructions)


def _filled(tpl: _Template, tables: _Tables) -> bytearray:
    """A chunk's template code with its table indices filled in (``_Expand``
    when one does not fit in a byte).  Each value is looked up once, in the
    order the template first uses it (the order the tables grow in)."""
    at = [tables.index(how, value) for how, value in tpl.values]
    if at and max(at) > 0xFF:
        raise _Expand
    body = bytearray(tpl.code)
    for pos, k in tpl.slots:
        body[pos] = at[k]
    return body


def _resolve_jumps(jumps: list[int], opcodes: list[int], args: list, starts: list[int],
                   label_off: dict) -> None:
    """Each jump's argument: the distance to its label, in code units."""
    for j in jumps:
        dest = label_off[args[j]]
        args[j] = starts[j + 1] - dest if opcodes[j] in _BACKWARD_JUMPS else dest - starts[j + 1]


class _Layout:
    """Items encoded and laid out: per instruction (a chunk counts as one)
    its opcode, argument, exception-table entry, location, size in code
    units and start; where each label is.  ``patches`` (for a template):
    the instructions whose argument is an index into the tables, as (index
    among the instructions, how it is encoded, the value)."""

    def __init__(self, items: list[_Item], tables: _Tables, patches: list | None = None) -> None:
        opcodes: list[int] = []
        args: list = []
        keys: list = []
        locations: list = []
        units: list[int] = []
        jumps: list[int] = []  # indices of the jumps among them
        labels: list[tuple[Label, int]] = []  # label -> index of the op after it
        inner: list[tuple[Label, int, int]] = []  # a chunk's label: (label, op index, units in)
        location = _NOWHERE
        for it in items:
            if it.label is not None:
                labels.append((it.label, len(opcodes)))
                continue
            instr = it.instr
            if instr is None:  # a chunk: its template, its indices filled in
                chunk = it.chunk
                assert chunk is not None  # an item is a label, an instruction or a chunk
                tpl = _template(chunk)
                body = tables.chunk_code(chunk.shape)
                inner.append((chunk.fallback, len(opcodes), tpl.fallback_at))
                opcodes.append(_CHUNK)
                args.append(body)
                keys.append(_Placed(chunk, tpl))
                location = _NOWHERE
                locations.append(location)
                units.append(tpl.units)
                continue
            loc = instr._location  # noqa: SLF001
            if loc is not None and loc is not UNSET:
                location = loc  # (none given: the one before it, as bytecode does)
            if it.raw is not None:
                opcode, arg = instr._opcode, it.raw  # noqa: SLF001
            else:
                kind = _KINDS.get(id(instr))
                if kind is None or kind[0] is not instr:
                    kind = _kind(instr)
                _, opcode, how, arg = kind
                if how != _PLAIN:
                    if patches is not None:
                        patches.append((len(opcodes), how, arg))
                    arg = tables.index(how, arg)
                elif type(arg) is not int:
                    jumps.append(len(opcodes))
            opcodes.append(opcode)
            args.append(arg)
            keys.append(it.key)
            locations.append(location)
            units.append(_CACHES[opcode] + (1 if type(arg) is not int or arg < 0x100
                                            else 1 + _ext(arg)))
        # the jumps start without prefixes and gain them until nothing moves
        label_off: dict[Label, int] = {}
        starts: list[int] = []
        for _ in range(200):
            starts = list(itertools.accumulate(units, initial=0))
            for label, index in labels:
                label_off[label] = starts[index]
            moved = False
            for j in jumps:
                opcode = opcodes[j]
                after = starts[j + 1]
                dest = label_off[args[j]]
                delta = after - dest if opcode in _BACKWARD_JUMPS else dest - after
                if delta < 0:
                    raise _NotSpliced("a jump in the wrong direction")
                need = _CACHES[opcode] + 1 + _ext(delta)
                if need > units[j]:
                    units[j] = need
                    moved = True
            if not moved:
                break
        else:
            raise _NotSpliced("jumps did not settle")
        for label, index, offset in inner:
            label_off[label] = starts[index] + offset
        _resolve_jumps(jumps, opcodes, args, starts, label_off)
        self.opcodes, self.args, self.keys, self.locations = opcodes, args, keys, locations
        self.units, self.starts, self.label_off = units, starts, label_off
        self.end = starts[len(opcodes)]

    def code(self) -> bytes:
        out = bytearray()
        for opcode, arg, size in zip(self.opcodes, self.args, self.units):
            if opcode == _CHUNK:
                out += arg
                continue
            caches = _CACHES[opcode]
            if size > caches + 1:
                for k in range(size - caches - 1, 0, -1):
                    out += bytes((_EXTENDED_ARG, (arg >> (8 * k)) & 0xFF))
            out += bytes((opcode, arg & 0xFF))
            if caches:
                out += bytes(2 * caches)
        return bytes(out)

    def ranges(self):
        """(start, stop, exception-table entry) of each instruction, a
        chunk's as its template's ranges."""
        starts = self.starts
        for n, key in enumerate(self.keys):
            if type(key) is not _Placed:
                yield starts[n], starts[n + 1], key
                continue
            at, fallback, entry = starts[n], key.chunk.fallback, key.chunk.entry
            for start, stop, target, lasti, depth in key.template.ranges:
                if target is _OUTER:
                    yield at + start, at + stop, entry
                else:  # (the group's fallback label, or a place in the chunk)
                    yield at + start, at + stop, (fallback if target is None else at + target,
                                                  lasti, depth)


class _Template:
    """A chunk's code assembled once (``_Layout`` of ``_group_items``): its
    bytes, where to write the constant and name indices, its exception
    ranges (relative; the target ``None``: the group's fallback label,
    ``_OUTER``: the group's outer handler is the whole entry), its size and
    where its fallback label is."""

    code: bytes
    values: list[tuple[int, object]]
    slots: list[tuple[int, int]]
    ranges: list[tuple]
    units: int
    fallback_at: int

    def __init__(self, shape: tuple[int, bool, tuple[str, str] | None, int]) -> None:
        fallback = Label()
        patches: list = []
        b, generator, own, slot = shape
        lay = _Layout(_group_items(b, generator, own, fallback, _OUTER_KEY, slot),
                      _Tables([], []), patches)
        self.code = lay.code()
        #: the (encoding, value) pairs its instructions' arguments index, each
        #: once, in the order of first use; where each is written (byte
        #: offset, index among them)
        self.values: list[tuple[int, object]] = []
        self.slots: list[tuple[int, int]] = []
        first: dict[tuple[int, object], int] = {}
        for n, how, value in patches:
            if lay.units[n] != _CACHES[lay.opcodes[n]] + 1:  # (small tables: no prefix)
                raise AssertionError("a template instruction with an EXTENDED_ARG")
            key = (how, (type(value), value))
            if key not in first:
                first[key] = len(self.values)
                self.values.append((how, value))
            self.slots.append((2 * lay.starts[n] + 1, first[key]))
        self.ranges = []
        for start, stop, key in _merged(lay.ranges()):
            if key is _OUTER_KEY:
                self.ranges.append((start, stop, _OUTER, False, 0))
            else:
                target, lasti, depth = key
                self.ranges.append((start, stop, None if target is fallback
                                    else lay.label_off[target], lasti, depth))
        self.units, self.fallback_at = lay.end, lay.label_off[fallback]


class _Placed:
    """A laid-out chunk's exception-table key: the chunk and its template."""

    __slots__ = ("chunk", "template")

    def __init__(self, chunk: _Chunk, template: _Template) -> None:
        self.chunk, self.template = chunk, template


_OUTER = object()
#: stands for the group's outer handler in a template's items
_OUTER_KEY = (Label(), False, 0)
_TEMPLATES: dict[tuple, _Template] = {}


def _template(chunk: _Chunk) -> _Template:
    return _template_of(chunk.shape)


def _template_of(shape: tuple) -> _Template:
    tpl = _TEMPLATES.get(shape)
    if tpl is None:
        tpl = _TEMPLATES[shape] = _Template(shape)
    return tpl


def _location_table(firstlineno: int, starts: list[int], locations: list) -> bytes:
    """The location table (3.11+ ``co_linetable``) of instructions starting at
    ``starts`` (code units; one more: the end) at ``locations``: an entry per
    run of instructions at the same location, at most 8 units each, in the
    long form (line delta, end line, columns), "no columns" where the columns
    are unknown, or "no location"."""
    out = bytearray()
    line = firstlineno
    n = len(locations)
    i = 0
    while i < n:
        loc = locations[i]
        lineno, end_line, col, end_col = here = (loc.lineno, loc.end_lineno, loc.col_offset,
                                                 loc.end_col_offset)
        j = i + 1
        while j < n:
            other = locations[j]
            if other is not loc and (other.lineno, other.end_lineno, other.col_offset,
                                     other.end_col_offset) != here:
                break
            j += 1
        length = starts[j] - starts[i]
        i = j
        if lineno is None:
            while length > 0:
                chunk = min(length, 8)
                out.append(0x80 | _NO_LOCATION << 3 | (chunk - 1))
                length -= chunk
            continue
        columns = not (col is None or end_col is None or end_line is None)
        head = 0x80 | (_LONG if columns else _NO_COLUMNS) << 3
        delta = lineno - line
        line = lineno
        while length > 0:
            chunk = min(length, 8)
            out.append(head | (chunk - 1))
            _uvarint_to(out, (-delta) << 1 | 1 if delta < 0 else delta << 1)
            if columns:
                _uvarint_to(out, end_line - lineno)
                _uvarint_to(out, col + 1)
                _uvarint_to(out, end_col + 1)
            delta = 0
            length -= chunk
    return bytes(out)


def _uvarint_to(out: bytearray, value: int) -> None:
    """A location-table varint: 6-bit groups, least significant first, bit 6
    set on all but the last."""
    while value >= 0x40:
        out.append((value & 0x3F) | 0x40)
        value >>= 6
    out.append(value)


_NO_COLUMNS, _LONG = 13, 14  # (location-table codes, 3.11+)


#: how one of daifu's own instructions is encoded, by its id (they are
#: shared, ``_emit._instr``): (instr, opcode, how, value)
_KINDS: dict[int, tuple] = {}


def _kind(instr) -> tuple:
    """(instr, opcode, how its argument is encoded, the value to encode)."""
    opcode, arg = instr._opcode, instr._arg  # noqa: SLF001
    if isinstance(arg, Label):
        return (instr, opcode, _PLAIN, arg)  # (not remembered: labels are per function)
    if opcode in _HAS_CONST:
        if not (arg is None or type(arg) in (int, str, tuple)):
            raise _NotSpliced(f"constant {arg!r}")
        out = (instr, opcode, _CONST, arg)
    elif opcode in _HAS_NAME:
        flag = 0
        if isinstance(arg, tuple):  # (method form, name): 3.12+ LOAD_ATTR
            flag, arg = (1 if arg[0] else 0), arg[1]
        if not isinstance(arg, str):
            raise _NotSpliced(f"name {arg!r}")
        out = (instr, opcode, _FLAG_NAME if opcode in _FLAG_OPS else _NAME, (arg, flag))
    elif isinstance(arg, Compare):
        out = (instr, opcode, _PLAIN, _compare_arg(arg))
    elif arg is UNSET:
        out = (instr, opcode, _PLAIN, 0)
    elif type(arg) is int:
        out = (instr, opcode, _PLAIN, arg)
    else:
        raise _NotSpliced(f"argument {arg!r} of {instr.name}")
    if len(_KINDS) < 4096 and type(arg) is not tuple:  # (a cell's constant is its own)
        _KINDS[id(instr)] = out  # (the entry keeps the instruction, and so its id, alive)
    return out
