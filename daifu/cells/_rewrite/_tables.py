"""A code object's constant and name tables, extended as daifu's
instructions need -- without the ``bytecode`` library: the layout of the
rewrite (``_assemble``) and of flat code's trap laid out ahead of time
(``_flat``) grow them the same way."""

from __future__ import annotations

#: how an instruction's argument is encoded: as it is, a constant's index, a
#: name's, a name's with a flag bit (``index << 1 | flag``)
PLAIN, CONST, NAME, FLAG_NAME = range(4)


class Tables:
    """A code object's constant and name tables, extended as daifu's
    instructions need (a plain value or a name: its first index)."""

    def __init__(self, consts: list, names: list[str]) -> None:
        self.consts, self.names = consts, names
        self.const_at: dict = {}  # (type, value) -> index
        for i, value in enumerate(consts):
            if value is None or type(value) in (int, str):
                self.const_at.setdefault((type(value), value), i)
        self.name_at = {name: i for i, name in enumerate(names)}

    def index(self, how: int, value) -> int:
        """The argument encoding ``value`` (``CONST``, ``NAME``, ``FLAG_NAME``)."""
        if how == CONST:
            const_key = (type(value), value)
            at = self.const_at.get(const_key)
            if at is None:
                at = self.const_at[const_key] = len(self.consts)
                self.consts.append(value)
            return at
        name, flag = value
        at = self.name_at.get(name)
        if at is None:
            at = self.name_at[name] = len(self.names)
            self.names.append(name)
        return at << 1 | flag if how == FLAG_NAME else at
