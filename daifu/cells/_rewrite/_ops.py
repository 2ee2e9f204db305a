"""The opcodes as the rewrite sees them (the running version's, from
``_versions``), and the decoded instruction."""

from __future__ import annotations

import dis
from typing import Any, cast

from bytecode import Instr, Label

from ._opsets import PY

_CO_OPTIMIZED = 0x1
_LOAD_CONST = dis.opmap["LOAD_CONST"]
_EXTENDED_ARG = dis.opmap["EXTENDED_ARG"]
_CALL_FUNCTION_EX = dis.opmap["CALL_FUNCTION_EX"]
_GET_ITER = dis.opmap["GET_ITER"]
#: instructions that call ``__next__`` through C that catches only
#: StopIteration (``_handlers.c_passes_through``)
_ITERATING = frozenset(dis.opmap[name] for name in ("FOR_ITER", "UNPACK_SEQUENCE", "UNPACK_EX"))
#: ``CALL_INTRINSIC_1`` argument of the StopIteration -> RuntimeError guard
#: that wraps every generator's body (PEP 479)
_INTRINSIC_STOPITERATION_ERROR = 3


class Unsupported(Exception):
    """This code object cannot be rewritten; the message says why.  ``kind``:
    ``"async"`` for a limitation documented as such (not warned of where a
    wildcard selected the function)."""

    kind = ""


class NothingToProtect(Unsupported):
    """The code has no statement of its own (``def f(): pass``): nothing in it
    can fail, so there is nothing to rewrite (and nothing to warn about)."""


# ``Instr.arg`` is typed as the union of every opcode's argument type: these
# only tell the type checker which one an instruction has (no runtime check).
def _int_arg(instr: Instr) -> int:
    return cast(int, instr.arg)


def _label_arg(instr: Instr) -> Label:
    return cast(Label, instr.arg)


#: instructions that can run a Python frame inline (3.13's specialisations
#: that push a frame: ``CALL_PY_*``, ``CALL_ALLOC_AND_ENTER_INIT``,
#: ``BINARY_SUBSCR_GETITEM``, ``LOAD_ATTR_PROPERTY``/``_GETATTRIBUTE_OVERRIDDEN``,
#: ``FOR_ITER_GEN``, ``SEND_GEN``): where ``PY.inline_call_unwind``, the
#: instruction before one must share its exception-table entry
INLINED_CALLS = frozenset({"BINARY_SUBSCR", "CALL", "CALL_KW", "CALL_FUNCTION_EX", "FOR_ITER",
                           "LOAD_ATTR", "SEND"})

_CONDITIONS = ("TRUE", "FALSE", "NONE", "NOT_NONE")
# 3.11 has backward conditional jumps; 3.12+ only forward ones: a retry copy
# (after the original code) leaves through a forward jump to a trampoline
# that jumps back
if PY.backward_conditionals:
    _BACKWARD = {"JUMP_FORWARD": "JUMP_BACKWARD",
                 **{f"POP_JUMP_FORWARD_IF_{c}": f"POP_JUMP_BACKWARD_IF_{c}" for c in _CONDITIONS}}
    _FORWARD_ONLY = frozenset({"FOR_ITER", "SEND", "JUMP_IF_TRUE_OR_POP",
                               "JUMP_IF_FALSE_OR_POP"})
else:
    _BACKWARD = {"JUMP_FORWARD": "JUMP_BACKWARD"}
    _FORWARD_ONLY = frozenset({"FOR_ITER", "SEND", *(f"POP_JUMP_IF_{c}" for c in _CONDITIONS)})
#: the names of the conditional forward jumps the rewrite emits
POP_JUMP_IF_TRUE, POP_JUMP_IF_FALSE = PY.pop_jump + "TRUE", PY.pop_jump + "FALSE"
POP_JUMP_IF_NONE = PY.pop_jump + "NONE"
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
     "POP_TOP", "RETURN_VALUE", "RETURN_CONST", "RERAISE", "RAISE_VARARGS", "JUMP_FORWARD",
     "JUMP_BACKWARD", "NOP", "PUSH_EXC_INFO", "POP_EXCEPT", "YIELD_VALUE", "FOR_ITER",
     "BEFORE_WITH", "TO_BOOL"}
)

EntryKey = tuple  # (handler Label, push_lasti: bool, depth: int)


class _Op:
    """One instruction of the code being rewritten and what the analysis
    found of it.  (Slots, not a record: a module of thousands of statements
    has one per instruction -- as dict-backed objects they were a fifth of
    its rewrite's peak memory.)"""

    __slots__ = ("instr", "entry", "depth", "nulls", "raw", "offset", "shape")

    def __init__(self, instr: Instr, entry: EntryKey | None, depth: int | None = None,
                 nulls: int = 0, raw: int | None = None, offset: int | None = None) -> None:
        self.instr = instr
        self.entry = entry
        #: the value-stack depth before it (None: not reached)
        self.depth = depth
        #: bit k set: stack slot k may hold NULL before the instruction
        self.nulls = nulls
        #: the argument as encoded in the original code (``_assemble.splice``
        #: reuses it), None for a jump or where it could not be read
        self.raw = raw
        #: its byte offset in the original code (its ``EXTENDED_ARG`` prefixes
        #: included), where it could be read (``_read_raw_args``)
        self.offset = offset
        #: what the analysis asks of it (``_analysis._Shape``), once reached
        self.shape: Any = None

    def __repr__(self) -> str:
        return (f"_Op(instr={self.instr!r}, entry={self.entry!r}, depth={self.depth!r}, "
                f"nulls={self.nulls!r}, raw={self.raw!r}, offset={self.offset!r})")


def _location(instr: Instr) -> tuple:
    loc = instr.location
    if loc is None:
        return (None, None, None, None)
    return (loc.lineno, loc.end_lineno, loc.col_offset, loc.end_col_offset)


def _pushed_nulls(instr: Instr) -> int:
    """Which of the values the instruction pushes may be NULL (bit 0: the
    first pushed).  ``PUSH_NULL``; 3.11: ``LOAD_GLOBAL`` with its NULL flag
    pushes NULL then the global, ``LOAD_METHOD`` NULL-or-method then the
    attribute-or-self; 3.13: ``LOAD_GLOBAL``/``LOAD_ATTR``/``LOAD_SUPER_ATTR``
    with their NULL/method flag push the value, then NULL (or self);
    ``LOAD_FAST_AND_CLEAR`` (inlined comprehensions) an unbound variable as
    NULL."""
    return _NULLS(instr)


def _nulls_311(instr: Instr) -> int:
    name = instr.name
    if name == "PUSH_NULL":
        return 1
    if name == "LOAD_GLOBAL":
        return 1 if cast("tuple[bool, str]", instr.arg)[0] else 0
    if name == "LOAD_METHOD":
        return 1
    return 0


def _nulls_313(instr: Instr) -> int:
    name = instr.name
    if name in ("PUSH_NULL", "LOAD_FAST_AND_CLEAR"):
        return 1
    if name in ("LOAD_GLOBAL", "LOAD_ATTR", "LOAD_SUPER_ATTR"):
        arg = instr.arg
        return 2 if isinstance(arg, tuple) and arg[0] else 0
    return 0


# (3.12 would need its own: NULL below the value, as 3.11, for the 3.12 opcodes)
_NULLS = _nulls_311 if PY.null_below_callable else _nulls_313
