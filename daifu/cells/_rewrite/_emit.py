"""Emission: the original code pointed at the stubs, the retry copies, the
stubs, and the prologue of a continuation."""

from __future__ import annotations

from typing import cast

from bytecode import Compare, Instr, Label
from bytecode.instr import CellVar, InstrLocation

from ..._record import field, record
from .._cell import (
    CONTINUE_CODE,
    P_BARRIER,
    P_GETPROFILE,
    P_GETTRACE,
    P_QUICK,
    P_SYS,
    PASSING,
    RAISE_CODE,
    RETRY_CODE,
    SKIP_CODE,
    jump_answer,
    own_test,
)
from ._ops import (
    _BACKWARD,
    _FORWARD_ONLY,
    INLINED_CALLS,
    POP_JUMP_IF_FALSE,
    POP_JUMP_IF_NONE,
    POP_JUMP_IF_TRUE,
    PY,
    EntryKey,
)
from ._opsets import _TERMINAL
from ._runs import _Run


@record
class _Item:
    instr: Instr | None = None
    key: EntryKey | None = None
    label: Label | None = None
    #: the instruction's argument as the original code encodes it (an
    #: original instruction or its retry copy; see ``_Op.raw``)
    raw: int | None = None
    #: instead of an instruction: the shared part of a stub (``_Chunk``)
    chunk: _Chunk | None = None


def _instr(name: str, arg=None, loc: InstrLocation | None = None) -> Instr:
    """An instruction (``arg`` None: it takes none; ``LOAD_CONST None`` is
    ``_const(None)``).  daifu's own (no location, no label) are made once and
    shared: the stubs repeat the same few hundred, and nothing changes an
    emitted instruction."""
    if loc is not _NOWHERE or isinstance(arg, Label):
        return Instr(name, location=loc) if arg is None else Instr(name, arg, location=loc)
    key = (name, type(arg), arg)
    ins = _SHARED.get(key)
    if ins is None:
        ins = Instr(name, location=loc) if arg is None else Instr(name, arg, location=loc)
        _SHARED[key] = ins
    return ins


def _none_const() -> Instr:
    """daifu's ``LOAD_CONST None`` (shared, as ``_instr``'s)."""
    ins = _SHARED.get(_NONE_KEY)
    if ins is None:
        # (bytecode's InstrArg has no type for a constant's value)
        ins = _SHARED[_NONE_KEY] = Instr("LOAD_CONST", None, location=_NOWHERE)  # type: ignore[arg-type]
    return ins


_SHARED: dict[tuple, Instr] = {}
_NONE_KEY = ("LOAD_CONST", "None")


def _call(args_count: int, loc) -> list[Instr]:
    """(PRECALL and) CALL for a callable and NULL already placed under its
    arguments (see ``_callable``)."""
    if PY.precall:
        return [_instr("PRECALL", args_count, loc), _instr("CALL", args_count, loc)]
    return [_instr("CALL", args_count, loc)]


def _callable(load: list[Instr], loc) -> list[Instr]:
    """The callable ``load`` pushes, with the NULL a call needs beside it
    (3.11: NULL, callable; 3.13: callable, NULL)."""
    if PY.null_below_callable:
        return [_instr("PUSH_NULL", loc=loc), *load]
    return [*load, _instr("PUSH_NULL", loc=loc)]


@record
class Continuation:
    """Asks ``rewrite`` for a *continuation* of new code: a variant entered at
    ``stmt`` (the statement corresponding to the one that failed in the old
    code) with ``nstack`` values pushed back onto the value stack.

    Every local variable becomes a positional parameter (``params``, filled by
    ``rewrite``), followed by hidden parameters for closure cells and for the
    stack values; ``unbound`` passed for a variable leaves it unbound.
    """

    stmt: object
    role: str
    nstack: int
    unbound: object
    target: object = None
    params: list[str] = field(default_factory=list)
    cell_params: dict[str, str] = field(default_factory=dict)  # hidden name -> cell var
    stack_params: list[str] = field(default_factory=list)

    def arguments(self, variables: dict, stack: tuple) -> tuple:
        """The continuation's arguments: each variable's value (or ``unbound``),
        the closure cells' contents, the saved value stack."""
        stack_at = {name: n for n, name in enumerate(self.stack_params)}
        args = []
        for name in self.params:
            if name in self.cell_params:
                args.append(variables.get(self.cell_params[name], self.unbound))
            elif name in stack_at:
                args.append(stack[stack_at[name]])
            else:
                args.append(variables.get(name, self.unbound))
        return tuple(args)

    def module_globals(self, stack: tuple) -> dict:
        """For module-level code: the stack items, as the globals the prologue reads."""
        return dict(zip(self.stack_params, stack))


def _emit_copy(items, run: _Run, ops, label_at, label_for) -> None:
    """The cell's *retry copy*: the same instructions, covered by the same
    stub, appended after the original code.  Retry jumps here, so a failure
    of the retried statement has its ``lasti`` in the copy: that is how the
    engine counts attempts, with nothing added to the normal path.  Exits
    jump back into the original code (backward: the copy lies after it)."""
    assert run.cell is not None  # set by ``rewrite`` before any emission
    if not run.cell.can_retry:
        return
    key = (run.stub, True, run.base)
    inner: dict[int, Label] = {i: Label() for i in range(run.start, run.stop)}
    tramp: dict[int, Label] = {}  # forward-only jumps out of the copy
    if PY.inline_call_unwind and ops[run.start].instr.name in INLINED_CALLS:
        # (see ``emit``: the instruction before an inlined generator resume
        # must be the cell's too)
        items.append(_Item(_instr("NOP", loc=_NOWHERE), key))
    items.append(_Item(label=run.copy))
    for i in range(run.start, run.stop):
        op = ops[i]
        if i != run.start:
            items.append(_Item(label=inner[i]))
        ins = op.instr.copy()
        if ins.has_jump():
            t = label_at[ins.arg]
            if t in run:
                ins.arg = inner[t] if t != run.start else run.copy
            elif ins.name in _FORWARD_ONLY:
                ins.arg = tramp.setdefault(t, Label())
            else:
                ins = Instr(_BACKWARD.get(ins.name, ins.name), label_for(t),
                            location=ins.location)
        items.append(_Item(ins, key, raw=op.raw))  # (a jump has no raw argument)
    if ops[run.stop - 1].instr.name not in _TERMINAL:  # falls through: straight back
        items.append(_Item(_instr("JUMP_BACKWARD", label_for(run.stop), _NOWHERE),
                           _target_key(ops, run.stop)))
    for t, lab in tramp.items():
        items.append(_Item(label=lab))
        if ops[t].instr.name == "END_FOR":
            # an exhausted FOR_ITER skips the END_FOR and POP_TOP it jumps to
            # (3.13): the same two here, then back after the original ones
            items.append(_Item(_instr("END_FOR", loc=_NOWHERE), None))
            items.append(_Item(_instr("POP_TOP", loc=_NOWHERE), None))
            t += 2
        items.append(_Item(_instr("JUMP_BACKWARD", label_for(t), _NOWHERE), _target_key(ops, t)))


def _target_key(ops, t: int) -> EntryKey | None:
    """The exception-table entry for a jump landing at instruction ``t``
    (``JUMP_BACKWARD`` checks for signals: a ``KeyboardInterrupt`` there
    belongs to the handler of where the jump goes)."""
    key = ops[t].entry if t < len(ops) else None
    if key is not None and (ops[t].depth is None or key[2] > ops[t].depth):
        return None
    return key


#: daifu's own instructions have no line: a tracer sees no line event for them
_NOWHERE = InstrLocation(None, None, None, None)


def _attr(name: str, loc) -> Instr:
    """``LOAD_ATTR name`` (3.12+: the plain, not the method, form)."""
    return _instr("LOAD_ATTR", (False, name) if PY.load_attr_method_flag else name, loc)


def _sys_callable(path: list[Instr], sys_at: int, loc=_NOWHERE) -> list[Instr]:
    """The callable ``path`` reads from the ``passing`` list (``sys_at``: its
    position from the top of the stack, 1 = top), with the NULL of the call
    beside it."""
    if PY.null_below_callable:
        return [_instr("PUSH_NULL", loc=loc), _instr("COPY", sys_at + 1, loc), *path]
    return [_instr("COPY", sys_at, loc), *path, _instr("PUSH_NULL", loc=loc)]


def _slot(index: int, loc=_NOWHERE) -> list[Instr]:
    """``passing`` -> ``passing[index]`` (``_cell.P_*``)."""
    return [_instr("LOAD_CONST", index, loc), _instr("BINARY_SUBSCR", loc=loc)]


def _sys(name: str, loc=_NOWHERE) -> list[Instr]:
    """``passing`` -> ``sys.<name>``."""
    return [*_slot(P_SYS, loc), _attr(name, loc)]


def _passing(guard_key, above_key, entry, own: tuple[str, str] | None = None) -> list[_Item]:
    """``[]`` -> ``[passing]``, or re-raise at once: the exception a barrier below
    found the program to catch, on its way to the frame that catches it,
    passes this stub without calling anything.  The engine's list
    ``passing = [exception, catching frame's stub constant, quiet, ...]``
    (``engine._guards``)
    is the builtin ``PASSING`` (one ``LOAD_GLOBAL``; in a process without
    daifu's engine the name is missing, and the stub re-raises the exception
    as if daifu were not there); the first two are set while such an
    exception travels, and the catching frame's own stub empties them.
    Attribute reads, subscripts and identity tests only: no call, no event
    for a profiler or tracer.  (``guard_key``: the stub's handler with the
    entry stack; ``above_key``: the same, with one value above it.)  The
    list stays on the stack for the rest of the stub: the barrier call reads
    ``sys`` and the barrier from it too.

    ``own`` (``own_test``: scope and name): the exception goes straight on to the
    function's own ``except own:`` when it is one, unless the engine has
    something to ask the barrier about (``passing[2]``, "quiet", false: a
    retry or a decision in flight, a pause requested) -- the barrier would
    answer "re-raise" all the same."""
    slow, pass_on, not_passing = Label(), Label(), Label()
    loc = _NOWHERE
    # stack: ..., lasti, exc, ref
    items = [_Item(_instr("LOAD_GLOBAL", (False, PASSING), loc), guard_key)]
    check = [  # ..., lasti, exc, ref, passing
        _instr("COPY", 1, loc), _instr("LOAD_CONST", 0, loc),
        _instr("BINARY_SUBSCR", loc=loc),  # passing, passing[0]
        _instr("COPY", 4, loc), _instr("IS_OP", 0, loc),
        _instr(POP_JUMP_IF_FALSE, not_passing, loc),
        # passing on: is this the stub of the frame that catches it?  (its
        # cell's constant is ``passing[1]``; a recursive frame between with
        # the same cell lets go of it early: its callers' barriers decide)
        _instr("COPY", 2, loc), _instr("COPY", 2, loc), _instr("LOAD_CONST", 1, loc),
        _instr("BINARY_SUBSCR", loc=loc),
        _instr("IS_OP", 0, loc), _instr(POP_JUMP_IF_FALSE, pass_on, loc),
        # arrived: nothing is kept for it any longer
        _none_const(), _instr("COPY", 2, loc), _instr("LOAD_CONST", 0, loc),
        _instr("STORE_SUBSCR", loc=loc),
        _none_const(), _instr("COPY", 2, loc), _instr("LOAD_CONST", 1, loc),
        _instr("STORE_SUBSCR", loc=loc),
    ]
    items += _items(check, above_key)
    items.append(_Item(label=pass_on))
    items += _reraise(entry)  # (passing, ref)
    items.append(_Item(label=not_passing))
    if own is not None:
        # the function's own ``except own:`` catches it, and the engine is quiet
        own_no = Label()
        items += _items([_instr("COPY", 1, loc), _instr("LOAD_CONST", 2, loc),
                         _instr("BINARY_SUBSCR", loc=loc), _instr(POP_JUMP_IF_FALSE, slow, loc),
                         _instr("COPY", 3, loc),
                         _instr("LOAD_GLOBAL", (False, own[1]), loc) if own[0] == "global"
                         else _instr("LOAD_NAME", own[1], loc),
                         _instr("CHECK_EXC_MATCH", loc=loc),
                         _instr(POP_JUMP_IF_FALSE, own_no, loc)], above_key)
        items += [_Item(_instr("POP_TOP", loc=loc), entry),  # (exc), then passing, ref
                  *_reraise(entry)]
        items.append(_Item(label=own_no))
        items.append(_Item(_instr("POP_TOP", loc=loc), above_key))
    items.append(_Item(label=slow))
    return items


def _invisible(name: str) -> list[Instr]:
    """``passing`` -> ``sys.<name>.__call__``: calling it emits no profile event."""
    return [*_sys(name), _attr("__call__", _NOWHERE)]


def _suspend_tracing() -> list:
    """``[passing]`` -> ``[passing, profile, trace]``: push ``sys.getprofile()`` and
    ``sys.gettrace()`` and switch both off, so that the Python code daifu
    calls next (the engine) produces no call or line events for a debugger,
    coverage or a profiler.  Builtins only, called through their ``__call__``
    (a method-wrapper, for which CPython emits no ``c_call`` event): a
    profiler sees nothing of daifu.  A plain ``sys.setprofile(None)`` showed
    a C profiler (3.11's cProfile) a ``c_call`` with no ``c_return``, and its
    stack of calls in progress went wrong (callers counted twice)."""
    no_profile, no_trace = Label(), Label()
    return [
        *_sys_callable(_slot(P_GETPROFILE), 1),
        *_call(0, _NOWHERE),  # passing, profile
        _instr("COPY", 1, _NOWHERE),
        _instr(POP_JUMP_IF_NONE, no_profile, _NOWHERE),
        *_sys_callable(_invisible("setprofile"), 2),
        _none_const(),
        *_call(1, _NOWHERE),
        _instr("POP_TOP", loc=_NOWHERE),
        no_profile,
        *_sys_callable(_slot(P_GETTRACE), 2),
        *_call(0, _NOWHERE),  # passing, profile, trace
        _instr("COPY", 1, _NOWHERE),
        _instr(POP_JUMP_IF_NONE, no_trace, _NOWHERE),
        *_sys_callable(_invisible("settrace"), 3),
        _none_const(),
        *_call(1, _NOWHERE),
        _instr("POP_TOP", loc=_NOWHERE),
        no_trace,
    ]


def _restore_tracing() -> list:
    """``[passing, profile, trace, result]`` -> ``[result]``, the tracer and
    profiler set back exactly as they were (after daifu's frame has returned,
    so neither sees its return)."""
    trace_off, profile_off, c_profiler = Label(), Label(), Label()
    return [
        _instr("SWAP", 2, _NOWHERE),  # passing, profile, result, trace
        _instr("COPY", 1, _NOWHERE),
        _instr(POP_JUMP_IF_NONE, trace_off, _NOWHERE),
        *_sys_callable(_sys("settrace"), 4),
        _instr("COPY", 3, _NOWHERE),
        *_call(1, _NOWHERE),
        _instr("POP_TOP", loc=_NOWHERE),
        trace_off,
        _instr("POP_TOP", loc=_NOWHERE),
        _instr("SWAP", 2, _NOWHERE),  # passing, result, profile
        _instr("COPY", 1, _NOWHERE),
        _instr(POP_JUMP_IF_NONE, profile_off, _NOWHERE),
        # a C profiler (3.11's cProfile) is not a callable: sys.getprofile()
        # gives its object, and sys.setprofile(obj) would install the object
        # as a Python profile function ("'Profile' object is not callable" at
        # the next event); ``obj.enable()`` puts it back as it was
        *_sys_callable([*_sys("modules"), _instr("LOAD_CONST", "builtins", _NOWHERE),
                        _instr("BINARY_SUBSCR", loc=_NOWHERE), _attr("callable", _NOWHERE)], 3),
        _instr("COPY", 3, _NOWHERE),
        *_call(1, _NOWHERE),
        _instr(POP_JUMP_IF_FALSE, c_profiler, _NOWHERE),
        *_sys_callable(_sys("setprofile"), 3),
        _instr("COPY", 3, _NOWHERE),
        *_call(1, _NOWHERE),
        _instr("POP_TOP", loc=_NOWHERE),
        _instr("JUMP_FORWARD", profile_off, _NOWHERE),
        c_profiler,
        *_sys_callable([_attr("enable", _NOWHERE)], 1),
        *_call(0, _NOWHERE),
        _instr("POP_TOP", loc=_NOWHERE),
        profile_off,
        _instr("POP_TOP", loc=_NOWHERE),
        _instr("SWAP", 2, _NOWHERE),  # result, passing
        _instr("POP_TOP", loc=_NOWHERE),
    ]


def _items(seq: list, key) -> list[_Item]:
    return [_Item(label=x) if isinstance(x, Label) else _Item(x, key) for x in seq]


def _emit_stubs(items, runs: list[_Run], ops, label_for, generator: bool,
                chunks: bool = False) -> None:
    """The stubs: every cell's exception-table entry leads to two
    instructions of its own (load the cell's constant, jump) and on to the
    code its group shares -- the cells with the same base depth and outer
    handler -- which calls the barrier with tracing suspended and dispatches
    on the answer.  The constant ``(CELL_MARK, key, index)`` names the cell
    (``_cell.resolve``): that is how ``cell_ranges`` finds it, too.

    ``chunks``: the part of a group's code that is the same for every group
    of its shape (``_group_items``) is one ``_Chunk`` item, which ``splice``
    copies from a pre-assembled template; otherwise its instructions."""
    groups: dict[tuple, list[_Run]] = {}
    for run in runs:
        groups.setdefault((run.base, run.entry), []).append(run)
    for (base, entry), members in groups.items():
        head = Label()
        for run in members:
            assert run.cell is not None  # set by ``rewrite`` before any emission
            items.append(_Item(label=run.stub))
            # (the cell's own constant: made for it, not shared)
            items.append(_Item(Instr("LOAD_CONST", run.cell.info.ref(run.cell),
                                     location=_NOWHERE), None))
            items.append(_Item(_instr("JUMP_FORWARD", head, _NOWHERE), None))
        items.append(_Item(label=head))
        _emit_group(items, base, entry, members, ops, label_for, generator, chunks)


def stub_peak(base: int) -> int:
    """The deepest the stack gets in the stub of a group with base depth
    ``base`` (``_group_items``): the barrier call's arguments.  On entry
    lasti, exc and the cell's constant (base + 3); passing, profile, trace (+ 3);
    the barrier and its NULL (+ 2); exc, cell, lasti again (base + 11); then
    the ``base`` stack values copied (2 base + 11) and built into one tuple
    (base + 12).  (The tests compare it with a full analysis.)"""
    return max(2 * base + 11, base + 12)


@record(eq=False)
class _Chunk:
    """The shared part of one group's stub (``_group_items`` for ``shape``),
    with the group's own ``fallback`` label and outer handler (``entry``)."""

    shape: tuple
    fallback: Label
    entry: EntryKey | None


def _reraise(entry) -> list[_Item]:
    """``..., lasti, exc, ref, answer`` -> re-raise ``exc`` as it was."""
    return [_Item(_instr("POP_TOP", loc=_NOWHERE), entry),
            _Item(_instr("POP_TOP", loc=_NOWHERE), entry),
            _Item(_instr("RERAISE", 1, _NOWHERE), entry)]


def _barrier_call(b: int, loc, slot: int = P_BARRIER) -> list:
    """The call of the barrier (``slot``: or what upgrades armed code) in a
    group's stub, with a stack of base depth ``b`` (stack: ..., lasti, exc,
    ref, passing, profile, trace; the barrier's answer pushed)."""
    call = [
        *_sys_callable(_slot(slot, loc), 3, loc),
        _instr("COPY", 7, loc),  # exc
        _instr("COPY", 7, loc),  # ref
        _instr("COPY", 10, loc),  # lasti
    ]
    for _ in range(b):  # the whole stack below the cell, slot 0 first
        call.append(_instr("COPY", b + 11, loc))
    call.append(_instr("BUILD_TUPLE", b, loc))
    return call + _call(4, loc)


def _continuation_call(loc) -> list:
    """Call the continuation the barrier answered (``(function, args)``) and
    return what it returns."""
    return [
        _instr("SWAP", 4, loc), _instr("POP_TOP", loc=loc), _instr("POP_TOP", loc=loc),
        _instr("POP_TOP", loc=loc),
        _instr("UNPACK_SEQUENCE", 2, loc),  # (fn, args) -> args, fn
        *([_instr("PUSH_NULL", loc=loc), _instr("SWAP", 3, loc)]  # NULL, fn, args
          if PY.null_below_callable else
          [_instr("SWAP", 2, loc), _instr("PUSH_NULL", loc=loc),
           _instr("SWAP", 2, loc)]),  # fn, NULL, args
        _instr("CALL_FUNCTION_EX", 0, loc),
        _instr("RETURN_VALUE", loc=loc),
    ]


def _quick_check(sys_key, entry) -> list[_Item]:
    """``[passing]`` -> ``[passing]``, or re-raise at once: the quick check
    (``passing[P_QUICK]``, the C ``_routes.quick`` through its ``__call__``:
    no event for a profiler, no Python code run) answers "re-raise" for an
    exception taking a remembered route; then nothing else is called --
    tracing stays as it is.  Any other answer: on to the barrier."""
    slow = Label()
    loc = _NOWHERE
    items = _items([*_sys_callable(_slot(P_QUICK, loc), 1, loc),
                    _instr("COPY", 5, loc),  # exc
                    _instr("COPY", 5, loc),  # ref
                    *_call(2, loc),
                    _instr("LOAD_CONST", RAISE_CODE, loc), _instr("IS_OP", 0, loc),
                    _instr(POP_JUMP_IF_FALSE, slow, loc)], sys_key)
    items += _reraise(entry)  # (passing, ref)
    items.append(_Item(label=slow))
    return items


def _group_items(b: int, generator: bool, own: tuple[str, str] | None, fallback: Label, entry,
                 slot: int = P_BARRIER) -> list[_Item]:
    """The part of a group's stub that depends only on its shape: base depth
    ``b``, whether the code is a generator's, the class its own handler
    catches (``own_test``) (labels of its own but
    ``fallback``; ``entry``, the outer handler, for its re-raises).  From
    the stub's entry (stack: ``..., lasti, exc, ref``) through the barrier
    call and the answers every group has -- re-raise, raise another
    exception here, continue in new code -- to the point where the
    group's own answers (its cells' retry, skip, continue) are told apart,
    which follows it."""
    fallback_sys, traced_fallback, answered = Label(), Label(), Label()
    not_raise, on_other, own_answers = Label(), Label(), Label()
    guard_key = (fallback, False, b + 3)  # any failure in the stub: re-raise the original
    sys_key = (fallback_sys, False, b + 4)  # (the same, with ``passing`` on the stack)
    traced_key = (traced_fallback, False, b + 6)  # the barrier call, tracing suspended
    loc = _NOWHERE  # the stub has no line: a tracer sees no event for it
    call = _barrier_call(b, loc, slot)
    items = _passing(guard_key, sys_key, entry, own)
    items += _quick_check(sys_key, entry)
    items += _items(_suspend_tracing(), sys_key)
    items += _items(call, traced_key)
    # ..., lasti, exc, ref, passing, profile, trace, answer -> ..., lasti, exc, ref, answer
    items += _items([answered, *_restore_tracing()], sys_key)
    # re-raise first, straight on: the answer to every exception the program handles
    items += _items([_instr("COPY", 1, loc), _instr("LOAD_CONST", RAISE_CODE, loc),
                     _instr("COMPARE_OP", Compare.EQ, loc),
                     _instr(POP_JUMP_IF_FALSE, not_raise, loc)], guard_key)
    items += _reraise(entry)
    # the barrier call failed (RecursionError at the limit): answer "re-raise"
    items.append(_Item(label=traced_fallback))
    items += _items([_instr("POP_TOP", loc=loc), _instr("LOAD_CONST", RAISE_CODE, loc),
                     _instr("JUMP_BACKWARD", answered, loc)], guard_key)
    items.append(_Item(label=fallback_sys))
    items.append(_Item(_instr("POP_TOP", loc=loc), entry))
    items.append(_Item(label=fallback))
    items += _reraise(entry)
    # a number: one of the group's own answers (after this); a tuple:
    # (exception,) raises it here, (function, args) continues in new code
    items.append(_Item(label=not_raise))
    items += _items([_instr("MATCH_SEQUENCE", loc=loc),
                     _instr(POP_JUMP_IF_FALSE, own_answers, loc),
                     _instr("GET_LEN", loc=loc), _instr("LOAD_CONST", 1, loc),
                     _instr("COMPARE_OP", Compare.EQ, loc),
                     _instr(POP_JUMP_IF_TRUE, on_other, loc)], guard_key)
    if generator:  # no continuation in new code for a generator's frame
        items += _reraise(entry)
    else:
        # continue in new code (a reload changed this very function).  Not
        # covered by any handler: the continuation runs the user's
        # with/finally exits itself, and its exception must leave this frame
        # untouched.
        items += _items(_continuation_call(loc), None)
    # (exception,): raised where the statement failed (the barrier gave it a
    # traceback entry for this frame at the failing instruction); the user's
    # handlers, with exits and finally blocks see it as if the statement had
    # raised it
    items.append(_Item(label=on_other))
    items += _items([_instr("UNPACK_SEQUENCE", 1, loc),  # ..., lasti, exc, ref, new
                     _instr("SWAP", 3, loc), _instr("POP_TOP", loc=loc),
                     _instr("POP_TOP", loc=loc)], guard_key)
    items.append(_Item(_instr("RERAISE", 1, loc), entry))
    items.append(_Item(label=own_answers))
    return items


def _emit_group(items, b: int, entry, members: list[_Run], ops, label_for,
                generator: bool, chunks: bool) -> None:
    fallback = Label()
    assert members[0].cell is not None  # set by ``rewrite`` before any emission
    own = own_test(members[0].cell.guards)  # (the group's cells share their handlers)
    if chunks:
        items.append(_Item(chunk=_Chunk((b, generator, own, P_BARRIER), fallback, entry)))
    else:
        items += _group_items(b, generator, own, fallback, entry)
    guard_key = (fallback, False, b + 3)
    loc = _NOWHERE
    # (label, values to pop, where to go, the jump's exception-table entry)
    jumps: list[tuple[Label, int, Label, EntryKey | None]] = []
    branches: list = []
    for run in members:
        cell = run.cell
        assert cell is not None
        targets = []
        if cell.can_retry:
            targets.append((RETRY_CODE, 4, run.copy, run.entry))
        if run.skip_target is not None and cell.can_skip:
            targets.append((SKIP_CODE, 4 + run.skip_pops, label_for(run.skip_target),
                            _target_key(ops, run.skip_target)))
        if run.continue_target is not None:
            targets.append((CONTINUE_CODE, 4, label_for(run.continue_target), run.entry))
        for code, pops, dest, key in targets:
            lab = Label()
            jumps.append((lab, pops, dest, key))
            branches += [_instr("COPY", 1, loc), _instr("LOAD_CONST", jump_answer(cell.index, code),
                                                        loc),
                         _instr("COMPARE_OP", Compare.EQ, loc),
                         _instr(POP_JUMP_IF_TRUE, lab, loc)]
    items += _items(branches, guard_key)
    items += _reraise(entry)  # (an answer none of the group's cells has: none is given)
    for lab, pops, dest, key in jumps:
        items.append(_Item(label=lab))
        for _ in range(pops):
            items.append(_Item(_instr("POP_TOP", loc=loc), None))
        items.append(_Item(_instr("JUMP_BACKWARD", dest, loc), key))


def _emit_continuation_prologue(items, bc, code, runs, spec: Continuation, label_for) -> None:
    """Turn the rewritten code into a continuation (see ``Continuation``)."""
    from bytecode import CompilerFlags  # lazy: 15.2 ms

    module = not code.co_flags & 0x1  # not CO_OPTIMIZED: module-level code
    prologue: list[Instr | Label] = []
    stack_names = [f".daifu_stack{i}" for i in range(spec.nstack)]
    spec.stack_params = stack_names
    if module:
        for name in stack_names:  # the engine puts them in the globals first
            prologue += [Instr("LOAD_NAME", name), ]
        for name in stack_names:
            prologue += [Instr("DELETE_NAME", name)]
    else:
        varnames = list(code.co_varnames)
        cell_only = [c for c in code.co_cellvars if c not in varnames]
        spec.cell_params = {f".daifu_cell_{c}": c for c in cell_only}
        spec.params = varnames + list(spec.cell_params) + stack_names
        cellvars = set(code.co_cellvars)
        for name in varnames:
            skip = Label()
            if name in cellvars:  # a cell argument: its slot holds the cell now
                load, delete = Instr("LOAD_DEREF", CellVar(name)), Instr("DELETE_DEREF",
                                                                        CellVar(name))
            else:
                load, delete = Instr("LOAD_FAST", name), Instr("DELETE_FAST", name)
            # (bytecode's InstrArg has no type for a constant's value)
            prologue += [load, Instr("LOAD_CONST", spec.unbound),  # type: ignore[arg-type]
                         Instr("IS_OP", 0), Instr(POP_JUMP_IF_FALSE, skip), delete, skip]
        for hidden, cell in spec.cell_params.items():
            skip = Label()
            prologue += [Instr("LOAD_FAST", hidden),
                         Instr("LOAD_CONST", spec.unbound),  # type: ignore[arg-type]
                         Instr("IS_OP", 0), Instr(POP_JUMP_IF_TRUE, skip),
                         Instr("LOAD_FAST", hidden), Instr("STORE_DEREF", CellVar(cell)), skip]
        prologue += [Instr("LOAD_FAST", name) for name in stack_names]
        bc.argnames = spec.params
        bc.argcount = len(spec.params)
        bc.posonlyargcount = 0
        bc.kwonlyargcount = 0
        bc.flags = CompilerFlags(int(bc.flags) & ~(0x4 | 0x8))  # no *args / **kwargs
    prologue.append(Instr("JUMP_FORWARD", cast(Label, spec.target)))  # set by ``rewrite``
    # insert right after the first RESUME (cells and free variables are set up)
    at = next(n for n, it in enumerate(items) if it.instr is not None and it.instr.name == "RESUME")
    items[at + 1 : at + 1] = [_Item(label=ins) if isinstance(ins, Label) else _Item(ins, None)
                              for ins in prologue]
