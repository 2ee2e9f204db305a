"""A code object's exception table, read without raising.

``dis._parse_exception_table`` (private; the same in 3.11 to 3.14) ends its
loop on the ``StopIteration`` of reading past the table's last byte: an
exception raised and unwound in Python at every call, which a
``sys.monitoring`` tool sees (``RAISE``, ``PY_UNWIND`` of a frame of
``dis``).  daifu reads tables on paths the program's own handled exceptions
take (an armed function's trap asks whether its handler takes the
exception): a tool that answers ``DISABLE`` to such an event has its
callback removed by CPython -- and would miss the program's own event that
follows.  This reads the same entries, in one loop that raises nothing."""

from __future__ import annotations

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)
if TYPE_CHECKING:
    import types


class Entry:
    """One entry, as ``dis`` gives it: byte offsets ``start`` to ``end``
    (exclusive) lead to ``target`` at stack ``depth``, ``lasti`` pushed or not."""

    __slots__ = ("start", "end", "target", "depth", "lasti")

    def __init__(self, start: int, end: int, target: int, depth: int, lasti: bool) -> None:
        self.start, self.end, self.target, self.depth, self.lasti = (start, end, target,
                                                                     depth, lasti)

    def __iter__(self):
        return iter((self.start, self.end, self.target, self.depth, self.lasti))

    def __repr__(self) -> str:
        return f"Entry{tuple(self)}"


def exception_entries(code: types.CodeType) -> list[Entry]:
    """The entries of ``code``'s exception table, in its order (what
    ``dis._parse_exception_table`` returns, a truncated last entry left out
    as it does)."""
    table = code.co_exceptiontable
    out: list[Entry] = []
    i, n = 0, len(table)
    while i < n:
        values = [0, 0, 0, 0]
        for k in range(4):
            if i >= n:
                return out
            b = table[i]
            i += 1
            val = b & 63
            while b & 64:
                if i >= n:
                    return out
                b = table[i]
                i += 1
                val = (val << 6) | (b & 63)
            values[k] = val
        start, length, target, dl = values
        out.append(Entry(2 * start, 2 * (start + length), 2 * target, dl >> 1, bool(dl & 1)))
    return out


def varint(out: bytearray, value: int, msb: int) -> None:
    """One exception-table item: 6-bit groups, most significant first, bit 6
    set on all but the last, ``msb`` (bit 7) on the first."""
    if value < 0x40:
        out.append(value | msb)
        return
    shift = 24
    while shift and value < 1 << shift:
        shift -= 6
    while shift:
        out.append(((value >> shift) & 0x3F) | 0x40 | msb)
        msb = 0
        shift -= 6
    out.append((value & 0x3F) | msb)


def encode(entries) -> bytes:
    """An exception table of ``(start, stop, target, depth, lasti)`` entries,
    in code units (what ``exception_entries`` reads back, in bytes)."""
    table = bytearray()
    append = table.append
    for start, stop, target, depth, lasti in entries:
        # (each item in one or two bytes, mostly: written at once; ``varint``
        # otherwise)
        for value, msb in ((start, 0x80), (stop - start, 0), (target, 0),
                           (depth << 1 | int(lasti), 0)):
            if value < 0x40:
                append(value | msb)
            elif value < 0x1000:
                append((value >> 6) | 0x40 | msb)
                append(value & 0x3F)
            else:
                varint(table, value, msb)
    return bytes(table)
