"""The opcodes every part of the rewrite sorts by name (the running
version's, ``_versions``), without the ``bytecode`` library: the flat walk
(``_flat``) reads them at a program's first start, before anything needs
``bytecode``."""

from __future__ import annotations

from .._versions import current

#: the running interpreter's behaviours (``_dispatch`` imports this package
#: only for a supported version)
PY = current()

# The exception-handling machinery: never part of a cell.
_MACHINERY = frozenset(
    {
        "PUSH_EXC_INFO",
        "POP_EXCEPT",
        "CHECK_EXC_MATCH",
        "CHECK_EG_MATCH",
        "WITH_EXCEPT_START",
        "RERAISE",
        "END_ASYNC_FOR",
        "RETURN_GENERATOR",
        "COPY_FREE_VARS",
        "MAKE_CELL",
        *PY.machinery,
    }
)
# No fall-through to the next instruction.
_TERMINAL = frozenset(
    {
        "RETURN_VALUE",
        "RETURN_CONST",
        "RAISE_VARARGS",
        "RERAISE",
        "JUMP_FORWARD",
        "JUMP_BACKWARD",
        "JUMP_BACKWARD_NO_INTERRUPT",
    }
)
