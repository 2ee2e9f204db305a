"""CPython 3.11's opcodes as the rewrite sees them, and the decoded instruction."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import cast

from bytecode import Instr, Label

assert sys.version_info[:2] == (3, 11), "daifu.cells._py311 is for CPython 3.11 only"

_CO_OPTIMIZED = 0x1
_LOAD_CONST = 100  # dis.opmap["LOAD_CONST"]
_EXTENDED_ARG = 144  # dis.opmap["EXTENDED_ARG"]


class Unsupported(Exception):
    """This code object cannot be rewritten; the message says why."""


class NothingToProtect(Unsupported):
    """The code has no statement of its own (``def f(): pass``): nothing in it
    can fail, so there is nothing to rewrite (and nothing to warn about)."""


# ``Instr.arg`` is typed as the union of every opcode's argument type: these
# only tell the type checker which one an instruction has (no runtime check).
def _int_arg(instr: Instr) -> int:
    return cast(int, instr.arg)


def _label_arg(instr: Instr) -> Label:
    return cast(Label, instr.arg)


# The exception-handling machinery: never part of a cell.
_MACHINERY = frozenset(
    {
        "PUSH_EXC_INFO",
        "POP_EXCEPT",
        "CHECK_EXC_MATCH",
        "CHECK_EG_MATCH",
        "PREP_RERAISE_STAR",
        "WITH_EXCEPT_START",
        "RERAISE",
        "END_ASYNC_FOR",
        "RETURN_GENERATOR",
        "COPY_FREE_VARS",
        "MAKE_CELL",
        "RESUME_QUICK",
    }
)
# No fall-through to the next instruction.
_TERMINAL = frozenset(
    {
        "RETURN_VALUE",
        "RAISE_VARARGS",
        "RERAISE",
        "JUMP_FORWARD",
        "JUMP_BACKWARD",
        "JUMP_BACKWARD_NO_INTERRUPT",
    }
)
_BACKWARD = {
    "JUMP_FORWARD": "JUMP_BACKWARD",
    "POP_JUMP_FORWARD_IF_TRUE": "POP_JUMP_BACKWARD_IF_TRUE",
    "POP_JUMP_FORWARD_IF_FALSE": "POP_JUMP_BACKWARD_IF_FALSE",
    "POP_JUMP_FORWARD_IF_NONE": "POP_JUMP_BACKWARD_IF_NONE",
    "POP_JUMP_FORWARD_IF_NOT_NONE": "POP_JUMP_BACKWARD_IF_NOT_NONE",
}
_FORWARD_ONLY = frozenset({"FOR_ITER", "SEND", "JUMP_IF_TRUE_OR_POP", "JUMP_IF_FALSE_OR_POP"})
# Cleanup code that a handler runs on its way to re-raising.
_PASS_THROUGH = frozenset(
    {
        "COPY",
        "POP_EXCEPT",
        "LOAD_CONST",
        "STORE_FAST",
        "STORE_NAME",
        "STORE_DEREF",
        "STORE_GLOBAL",
        "DELETE_FAST",
        "DELETE_NAME",
        "DELETE_DEREF",
        "DELETE_GLOBAL",
        "POP_TOP",
        "SWAP",
        "NOP",
    }
)
_CLAUSE_STOP = frozenset(
    {"STORE_FAST", "STORE_NAME", "STORE_DEREF", "STORE_GLOBAL", "STORE_ATTR", "STORE_SUBSCR",
     "POP_TOP", "RETURN_VALUE", "RERAISE", "RAISE_VARARGS", "JUMP_FORWARD", "JUMP_BACKWARD",
     "NOP", "PUSH_EXC_INFO", "POP_EXCEPT", "YIELD_VALUE", "FOR_ITER", "BEFORE_WITH"}
)

EntryKey = tuple  # (handler Label, push_lasti: bool, depth: int)


@dataclass
class _Op:
    instr: Instr
    entry: EntryKey | None
    depth: int | None = None
    #: bit k set: stack slot k may hold NULL before the instruction
    nulls: int = 0


def _location(instr: Instr) -> tuple:
    loc = instr.location
    if loc is None:
        return (None, None, None, None)
    return (loc.lineno, loc.end_lineno, loc.col_offset, loc.end_col_offset)


def _pushed_nulls(instr: Instr) -> int:
    """Which of the values the instruction pushes may be NULL (bit 0: the
    first pushed).  3.11: ``PUSH_NULL``; ``LOAD_GLOBAL`` with its NULL flag
    pushes NULL then the global; ``LOAD_METHOD`` NULL-or-method then the
    attribute-or-self."""
    name = instr.name
    if name == "PUSH_NULL":
        return 1
    if name == "LOAD_GLOBAL":
        return 1 if cast("tuple[bool, str]", instr.arg)[0] else 0
    if name == "LOAD_METHOD":
        return 1
    return 0
