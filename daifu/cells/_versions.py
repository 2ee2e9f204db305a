"""What differs between CPython versions, as data (the rewrite is one).

The rewrite in ``cells/_rewrite`` is written once; where CPython versions
emit different bytecode, it asks this table by the name of the behaviour, in
the manner of coverage.py's ``env.PYBEHAVIOR``.  Frame access (the layout of
the interpreter frame, ``f_locals`` semantics) is one module per layout
family, named by ``frames``.

A version is supported when its entry is marked ``tested``: 3.11 and 3.13 are
(the whole test suite runs on both).  3.12 and 3.14 have entries written from
their documentation and ``dis`` changes; they are refused (the program runs
unmodified, with a warning) until the suite has run on them -- docs/
architecture.md ("cells: the rewrite") says what each would still need.
"""

from __future__ import annotations

import sys

from .._record import record, replace


@record(frozen=True)
class Behaviour:
    """One CPython version's bytecode, as far as the rewrite cares."""

    python: tuple[int, int]
    #: the whole test suite has run on this version: it is supported
    tested: bool
    #: the module (in ``daifu.cells``) that reads and writes its frames;
    #: None where none is written yet (a version that is not ``tested``)
    frames: str | None
    #: ``PRECALL n`` before every ``CALL n`` (3.11 only)
    precall: bool
    #: the NULL of a call goes below the callable (3.11, 3.12) or above it
    #: (3.13+: callable, self-or-NULL, arguments)
    null_below_callable: bool
    #: conditional jumps have backward forms (3.11's ``POP_JUMP_BACKWARD_IF_*``);
    #: 3.12+ only jump forward, so a retry copy leaves through trampolines
    backward_conditionals: bool
    #: the name of a conditional jump: ``POP_JUMP_FORWARD_IF_`` (3.11) or
    #: ``POP_JUMP_IF_``
    pop_jump: str
    #: what an exhausted ``FOR_ITER`` jumps to and skips: nothing (3.11: past
    #: the loop), or its ``END_FOR`` and the ``POP_TOP`` after it (3.13)
    end_for_skips: int
    #: comprehensions are inlined into the function (PEP 709, 3.12+)
    inlined_comprehensions: bool
    #: ``RETURN_CONST`` (3.12, 3.13)
    return_const: bool
    #: ``LOAD_FAST_LOAD_FAST``, ``STORE_FAST_LOAD_FAST``... (3.13+)
    superinstructions: bool
    #: ``LOAD_FAST`` does not check that the variable is bound (3.12+: the
    #: compiler proves it, ``LOAD_FAST_CHECK`` where it cannot)
    unchecked_load_fast: bool
    #: ``LOAD_ATTR``'s argument is ``(method form, name)`` (3.12+)
    load_attr_method_flag: bool
    #: an exception coming back from a Python frame that an instruction runs
    #: inline (``INLINED_CALLS``: a call, a ``__getitem__``, a property, a
    #: generator's ``FOR_ITER``/``SEND``) is looked up in the exception table
    #: one instruction *before* it (3.13: ``resume_with_error`` restarts at
    #: the instruction, ``exception_unwind`` looks at ``next_instr - 1``); so
    #: that instruction must have the same entry as the call (3.13)
    inline_call_unwind: bool
    #: keyword calls are ``CALL_KW`` (3.13+), not ``KW_NAMES`` + ``CALL``
    call_kw: bool
    #: every generator's body is wrapped in a ``CALL_INTRINSIC_1`` guard
    #: turning StopIteration into RuntimeError (3.12+)
    stopiteration_intrinsic: bool
    #: a ``NOT_TAKEN`` after each conditional jump (3.14)
    not_taken: bool = False
    #: the exception-handling instructions besides those every version has
    #: (never part of a cell): 3.11's ``PREP_RERAISE_STAR``, ``RESUME_QUICK``;
    #: 3.12+'s ``CLEANUP_THROW``, ``RESUME``
    machinery: tuple[str, ...] = ("CLEANUP_THROW", "RESUME")


_PY311 = Behaviour(
    python=(3, 11), tested=True, frames="_frames311", precall=True,
    null_below_callable=True, backward_conditionals=True,
    pop_jump="POP_JUMP_FORWARD_IF_", end_for_skips=0, inlined_comprehensions=False,
    return_const=False, superinstructions=False, load_attr_method_flag=False,
    unchecked_load_fast=False, inline_call_unwind=False, call_kw=False,
    stopiteration_intrinsic=False, machinery=("PREP_RERAISE_STAR", "RESUME_QUICK"))
# each later version: what changed from the one before it
_PY312 = replace(
    _PY311, python=(3, 12), tested=False, frames=None, precall=False,
    backward_conditionals=False, pop_jump="POP_JUMP_IF_", end_for_skips=1,
    inlined_comprehensions=True, return_const=True, load_attr_method_flag=True,
    unchecked_load_fast=True, stopiteration_intrinsic=True,
    machinery=("CLEANUP_THROW", "RESUME"))
_PY313 = replace(
    _PY312, python=(3, 13), tested=True, frames="_frames313", null_below_callable=False,
    end_for_skips=2, superinstructions=True, inline_call_unwind=True, call_kw=True)
_PY314 = replace(
    _PY313, python=(3, 14), tested=False, frames=None, return_const=False,
    not_taken=True)

TABLE: dict[tuple[int, int], Behaviour] = {b.python: b for b in (_PY311, _PY312, _PY313, _PY314)}


def supported() -> tuple[tuple[int, int], ...]:
    """The versions daifu rewrites."""
    return tuple(v for v, b in TABLE.items() if b.tested)


def running() -> Behaviour | None:
    """The entry of the running interpreter, if it is supported."""
    entry = TABLE.get(sys.version_info[:2])
    return entry if entry is not None and entry.tested else None


def current() -> Behaviour:
    """The entry of the running interpreter, supported or not (the rewrite
    is imported only where ``running()`` is not None)."""
    return TABLE[sys.version_info[:2]]
