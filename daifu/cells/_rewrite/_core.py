"""The rewrite itself (``daifu.cells._rewrite`` imports it on first use)."""

from __future__ import annotations

import types
from typing import cast

from bytecode import Bytecode, Instr, Label

from ..._record import field, record
from .._cell import ARMED_MARK, P_UPGRADE, Cell, CodeInfo, WithGuard, discard, own_test
from .._exctable import exception_entries
from .._source import ModuleSource
from ._analysis import _analyse_depths, _flatten
from ._assemble import (
    _CACHES,
    _PLAIN,
    _as_ops,
    _kind,
    _NotSpliced,
    _with_try_blocks,
    append,
    append_covering,
    expand,
    splice,
)
from ._decode import decode
from ._emit import (
    _NOWHERE,
    Continuation,
    _Chunk,
    _emit_continuation_prologue,
    _emit_copy,
    _emit_stubs,
    _instr,
    _Item,
    _reraise,
    stub_peak,
)
from ._flat import flat_start
from ._handlers import (
    _walk_to_reraise,
    c_passes_through,
    chain_for_code,
    effects,
    handler_chain,
    has_except_handler,
    returns_truthy,
)
from ._ops import (
    _EXTENDED_ARG,
    INLINED_CALLS,
    PY,
    NothingToProtect,
    Unsupported,
    _location,
    _Op,
)
from ._readback import cell_ranges, lasti_offset
from ._runs import (
    _build_runs,
    _drop_implicit_returns,
    _exits,
    _plan_continue,
    _plan_skip,
    _role,
    _Run,
)

PYTHON = PY.python
#: assemble with daifu's ``splice`` (False: with ``bytecode``; the tests
#: compare the two)
_SPLICE = True
#: flat code armed without its analysis (``_flat``; False: the tests' exact arming)
_FLAT = True

# (frame access, ctypes, is the package's: imported at the first crash)
__all__ = ["PYTHON", "Continuation", "NothingToProtect", "Unsupported", "c_passes_through",
           "cell_ranges", "chain_for_code", "effects", "has_except_handler", "lasti_offset",
           "returns_truthy", "rewrite"]


@record
class Plan:
    """What ``plan`` decided for one code object: its decoded instructions with
    their stack depths, the runs (each with its ``Cell``), and the labels the
    emitted jumps need."""

    code: types.CodeType
    #: ``bytecode``'s decoding of it, where that was used (a continuation)
    bc: Bytecode | None
    ops: list[_Op]
    label_at: dict[Label, int]
    runs: list[_Run]
    #: the deepest the original code's stack gets
    peak: int
    #: constant index -> its new value (``replace_consts``)
    const_updates: dict[int, object]
    label_of: dict[int, Label] = field(default_factory=dict)
    labels_at: dict[int, list[Label]] = field(default_factory=dict)
    #: instruction index -> the run whose stub takes its exception instead of
    #: its own handler (the re-raise of an inlined comprehension's cleanup)
    redirects: dict[int, _Run] = field(default_factory=dict)
    #: the code becomes a continuation (a prologue, new parameters): only
    #: ``bytecode`` assembles that
    continued: bool = False

    def label_for(self, i: int) -> Label:
        """The label of instruction ``i`` (made if nothing jumped there before)."""
        if i not in self.label_of:
            self.label_of[i] = Label()
        return self.label_of[i]


def rewrite(
    code: types.CodeType,
    info: CodeInfo,
    msrc: ModuleSource,
    scope,
    replace_consts: dict | None = None,
    continuation: Continuation | None = None,
) -> types.CodeType:
    """Rewrite one code object; raise ``Unsupported`` if it cannot be done.

    ``continuation`` asks for the continuation variant (see ``Continuation``)."""
    planned = plan(code, info, msrc, scope, replace_consts, continuation)
    return assemble(planned, emit(planned, continuation))


def plan(code: types.CodeType, info: CodeInfo, msrc: ModuleSource, scope,
         replace_consts: dict | None = None, continuation: Continuation | None = None) -> Plan:
    """Decode, analyse, and cut the code into cells (appended to ``info.cells``)."""
    p = _runs_of(code, msrc, scope, replace_consts, continuation)
    runs = p.runs
    for run in runs:
        run.role = _role(run, p.ops)
    if continuation is not None:
        target = next((r for r in runs if r.stmt is continuation.stmt
                       and r.role == continuation.role and r.base == continuation.nstack), None)
        if target is None:
            raise Unsupported(
                "the new code has no place to continue at: the failing statement's loops, "
                "with and try blocks must keep their structure")
        continuation.target = p.label_for(target.start)
    headers = {id(r.stmt): r for r in runs if r.role == "loop-header"}
    for n, run in enumerate(runs):
        run.cell = _cell(run, n, p, headers, info, msrc)
        info.cells.append(run.cell)
        if run.skip_target is not None:
            p.label_for(run.skip_target)
        if run.continue_target is not None:
            p.label_for(run.continue_target)
        for _, t, _ in _exits(run, p.ops, p.label_at):
            p.label_for(t)
            if p.ops[t].instr.name == "END_FOR":  # where an exhausted FOR_ITER goes on
                p.label_for(t + 2)
    return p


def _runs_of(code: types.CodeType, msrc: ModuleSource, scope, replace_consts: dict | None,
             continuation: Continuation | None = None, index=None) -> Plan:
    """Decode and analyse the code, and find its runs (``plan``, before the
    cells; what arming needs too)."""
    if code.co_flags & (0x80 | 0x100 | 0x200):  # COROUTINE, ITERABLE_COROUTINE, ASYNC_GENERATOR
        exc = Unsupported("async functions and async generators are not vaccinated yet")
        exc.kind = "async"  # (a known limitation: said aloud only for a function named)
        raise exc
    bc = None
    decoded = decode(code) if continuation is None else None
    if decoded is None:
        bc = Bytecode.from_code(code, conserve_exception_block_stackdepth=True)
        if continuation is not None and PY.unchecked_load_fast:
            _checked_loads(bc)
        decoded = _flatten(bc)
        if continuation is None:
            _read_raw_args(code, decoded[0])
    ops, label_at = decoded
    const_updates: dict[int, object] = {}
    if replace_consts:
        for op in ops:
            if op.instr.name == "LOAD_CONST" and isinstance(op.instr.arg, types.CodeType):
                new = replace_consts.get(id(op.instr.arg))
                if new is not None:
                    op.instr.arg = new
                    if op.raw is not None:
                        const_updates[op.raw] = new
    peak = _analyse_depths(ops, label_at)

    if index is None:
        index = msrc.statements(scope)
    stmts = _statements(ops, index)
    _drop_implicit_returns(ops, stmts)
    runs = _build_runs(ops, label_at, stmts)
    if not runs:
        if all(stmt is None for stmt in stmts):
            raise NothingToProtect("no statements")
        raise Unsupported("no statement could be made recoverable")
    p = Plan(code, bc, ops, label_at, runs, peak, const_updates)
    if PY.inlined_comprehensions:
        p.redirects = _comprehension_redirects(ops, label_at, runs, stmts)
    for label, i in label_at.items():
        p.label_of.setdefault(i, label)
        p.labels_at.setdefault(i, []).append(label)
    return p


def _statements(ops: list[_Op], index) -> list:
    """The statement of each instruction (None: none).  Consecutive
    instructions share their location object where they share a position
    (``_decode``): one lookup for them."""
    return index.lookup_all([op.instr._location for op in ops])  # noqa: SLF001


def _read_raw_args(code: types.CodeType, ops: list[_Op]) -> None:
    """Set every non-jump op's ``raw``: its argument as ``code`` encodes it
    (the ops are ``code``'s instructions in order; if they are not, none is
    set and ``splice`` leaves the assembly to ``bytecode``)."""
    raw, pos, n = code.co_code, 0, len(code.co_code)
    for op in ops:
        ext, op.offset = 0, pos
        while pos < n and raw[pos] == _EXTENDED_ARG:
            ext = (ext | raw[pos + 1]) << 8
            pos += 2
        if pos >= n or raw[pos] != op.instr._opcode:  # noqa: SLF001
            for other in ops:
                other.raw = other.offset = None
            return
        if not isinstance(op.instr.arg, Label):
            op.raw = ext | raw[pos + 1]
        pos += 2 + 2 * _CACHES[raw[pos]]


def _comprehension_redirects(ops: list[_Op], label_at: dict[Label, int], runs: list[_Run],
                             stmts: list) -> dict[int, _Run]:
    """3.12+ inlines comprehensions into the function: their instructions are
    no cells (a stub would copy the NULL an unbound iteration variable leaves
    on the stack), and an exception in one goes to a cleanup block that puts
    the saved variable back and re-raises.  That re-raise is handed to the
    stub of the statement's first cell -- as on 3.11, where the comprehension
    was a call inside that statement: a retry re-runs the statement."""
    out: dict[int, _Run] = {}
    cleanups: dict[int, int] = {}  # handler index -> its RERAISE index
    first_in: dict[int, int] = {}  # handler index -> first instruction it covers
    for i, op in enumerate(ops):
        if op.entry is None:
            continue
        h = label_at[op.entry[0]]
        first_in.setdefault(h, i)
        if h not in cleanups and ops[h].instr.name == "SWAP":
            k = _walk_to_reraise(ops, h)
            if k is not None and ops[k].instr.arg == 0 and any(
                    ops[x].instr.name == "STORE_FAST" for x in range(h, k)):
                cleanups[h] = k
    for h, k in cleanups.items():
        outer = ops[k].entry
        if outer is not None and label_at[outer[0]] in cleanups:
            continue  # a nested comprehension: the outer one's cleanup hands it on
        r = first_in[h]
        stmt = stmts[r]
        depth = ops[k].depth
        candidates = [run for run in runs if run.stmt is stmt and run.start < r
                      and run.entry == outer and depth is not None and run.base < depth]
        if candidates:
            out[k] = min(candidates, key=lambda run: run.start)
    return out


def _checked_loads(bc: Bytecode) -> None:
    """A continuation enters the code in the middle, where variables the
    compiler knows to be bound may not be: every ``LOAD_FAST`` (which does not
    check, in 3.12+) becomes ``LOAD_FAST_CHECK``, superinstructions split."""
    out: list = []
    for item in bc:
        if not isinstance(item, Instr):
            out.append(item)
        elif item.name == "LOAD_FAST":
            out.append(Instr("LOAD_FAST_CHECK", item.arg, location=item.location))
        elif item.name in _SPLIT:
            first, second = cast("tuple[str, str]", item.arg)
            kinds = _SPLIT[item.name]
            out += [Instr(kinds[0], first, location=item.location),
                    Instr(kinds[1], second, location=item.location)]
        else:
            out.append(item)
    bc[:] = out


_SPLIT = {"LOAD_FAST_LOAD_FAST": ("LOAD_FAST_CHECK", "LOAD_FAST_CHECK"),
          "STORE_FAST_LOAD_FAST": ("STORE_FAST", "LOAD_FAST_CHECK"),
          "STORE_FAST_STORE_FAST": ("STORE_FAST", "STORE_FAST")}


def _cell(run: _Run, n: int, p: Plan, headers: dict, info: CodeInfo,
          msrc: ModuleSource) -> Cell:
    role = run.role
    skip_reason, skip_effect = _plan_skip(run, role, p.ops, p.label_at)
    continue_reason = _plan_continue(run, headers, msrc)
    guards = handler_chain(p.ops, p.label_at, run.entry, msrc, p.code)
    _line, _end_line, col, end_col = _location(p.ops[run.start].instr)
    stmt = run.stmt
    return Cell(
        info=info,
        index=n,
        lineno=stmt.lineno,
        end_lineno=stmt.end_lineno,
        col=getattr(stmt, "col_offset", col),
        end_col=getattr(stmt, "end_col_offset", end_col),
        stmt=type(stmt).__name__,
        role=role,
        source=msrc.text(stmt),
        retry_reason="a raise statement always raises" if role == "raise" else None,
        skip_reason=skip_reason,
        skip_effect=skip_effect,
        guards=guards,
        continue_reason=continue_reason,
        with_slots=tuple(g.slot for g in guards if isinstance(g, WithGuard)),
        iterator_slot=run.base - 1 if role == "loop-header" else None,
        depth=run.base,
        cases=msrc.cases(stmt) if role == "match" else (),
    )


def emit(p: Plan, continuation: Continuation | None = None) -> list[_Item]:
    """The new instruction stream: the original code with the cells pointed at
    their stubs, then the retry copies and the stubs (and a continuation's
    prologue)."""
    items = _emit_original(p, lambda run: run.stub)
    generator = bool(p.code.co_flags & 0x20)
    # an unreachable NOP outside every exception-table entry: without it the
    # last cell's range and its retry copy (appended right after, same stub)
    # would merge into one entry, and a failed retry would look like a first
    # attempt (``cell_ranges``) -- a rule answering RETRY would never stop
    items.append(_Item(_instr("NOP", loc=_NOWHERE), None))
    for run in p.runs:
        _emit_copy(items, run, p.ops, p.label_at, p.label_for)
    p.continued = continuation is not None
    _emit_stubs(items, p.runs, p.ops, p.label_for, generator,
                chunks=_SPLICE and continuation is None)
    if continuation is not None:
        assert p.bc is not None  # (a continuation is decoded by ``bytecode``)
        _emit_continuation_prologue(items, p.bc, p.code, p.runs, continuation, p.label_for)
    return items


def _emit_original(p: Plan, target) -> list[_Item]:
    """The original instructions, each cell's pointed at ``target(run)`` (its
    stub; an armed function's trap) with the cell's base depth and lasti.
    Armed and vaccinated code lay them out alike: the same instructions at
    the same offsets (``_readback.trap_path`` checks)."""
    owner = _owners(p)
    items: list[_Item] = []
    last_stub = None  # the stub the instruction emitted last would have
    for i, op in enumerate(p.ops):
        owner_run = owner[i]
        if (PY.inline_call_unwind and owner_run is not None and owner_run.start == i
                and op.instr.name in INLINED_CALLS):
            # an exception coming back from the generator a specialised
            # FOR_ITER/SEND runs in this frame is looked up one instruction
            # before it (3.13's exception_unwind uses next_instr - 1): a NOP of
            # the cell's there, outside the loop (it runs once, on entry; on the
            # loop's line, so a tracer sees no line event of its own)
            last_stub = (owner_run.stub, True, owner_run.base)
            items.append(_Item(Instr("NOP", location=op.instr.location),
                               (target(owner_run), True, owner_run.base)))
        if i in p.label_of:
            items.append(_Item(label=p.label_of[i]))
        for extra in p.labels_at.get(i, ()):
            if extra is not p.label_of.get(i):
                items.append(_Item(label=extra))
        run = p.redirects.get(i, owner_run)
        stub = (run.stub, True, run.base) if run is not None else op.entry
        if PY.inline_call_unwind and i and stub != last_stub and op.instr.name in INLINED_CALLS:
            # (``_before_inlined_calls`` and the NOP above keep this from
            # happening; were it to, CPython would unwind this frame's stack
            # to another handler's depth and crash: better not vaccinated)
            raise Unsupported(f"the instruction before {op.instr.name} at {i} has another "
                              f"exception handler (3.13 looks it up there)")
        last_stub = stub
        key = (target(run), True, run.base) if run is not None else op.entry
        items.append(_Item(op.instr, key, raw=op.raw))
    for lb in p.labels_at.get(len(p.ops), ()):  # trailing labels (none expected)
        items.append(_Item(label=lb))
    return items


def _owners(p: Plan) -> list[_Run | None]:
    """The run each instruction belongs to (None: none)."""
    owner: list[_Run | None] = [None] * len(p.ops)
    for run in p.runs:
        for i in range(run.start, run.stop):
            owner[i] = run
    return owner


def arm(code: types.CodeType, info: CodeInfo, msrc: ModuleSource, scope,
        replace_consts: dict | None = None, walked: bool = False) -> types.CodeType:
    """Armed code (``cells._armed``): the original instructions, each cell's
    pointed at a *trap* shared by the cells of one base depth and handler --
    the shared part of a vaccinated group's stub (``_group_items``), which
    calls the upgrade instead of the barrier -- and nothing else.  Its
    vaccinated code (``rewrite``, the same instructions at the same offsets)
    is made when an exception first reaches a trap.  ``info`` stays without
    cells till then.  Raises ``Unsupported`` (a generator: rewrite it now).
    ``walked``: ``_flat.arm`` found that ``code`` is not flat.  (The package's
    ``arm`` is ``_flat.arm``: this is what it does not do itself.)"""
    if code.co_flags & 0x20:
        raise Unsupported("a generator's frame is not upgraded: vaccinated at once")
    index = msrc.statements(scope)
    start = flat_start(code, index) if _FLAT and not walked else None
    if start is not None:  # (``_flat``: one trap, every instruction pointed at it)
        tail = _trap_tail(info, {(0, None): _FLAT_TRAP}, lambda entry: (), _FLAT_FALLBACK)
        updates = {i: replace_consts[id(c)] for i, c in enumerate(code.co_consts)
                   if type(c) is types.CodeType and replace_consts and id(c) in replace_consts}
        info.armed = True
        return append_covering(code, start, (_FLAT_TRAP, True, 0), updates, tail,
                               max(code.co_stacksize, stub_peak(0)))
    p = _runs_of(code, msrc, scope, replace_consts, index=index)
    traps: dict[tuple, Label] = {}
    for run in p.runs:
        traps.setdefault((run.base, run.entry), Label())
    tail = _trap_tail(info, traps, lambda entry: handler_chain(p.ops, p.label_at, entry, msrc,
                                                               code))
    stacksize = max(p.peak, code.co_stacksize, *(stub_peak(base) for base, _ in traps))
    owner = _owners(p)
    # (one key object per run: ``append`` merges an instruction's range into
    # the one before when they are the same object)
    keys: list = [op.entry for op in p.ops]
    run_key = {id(run): (traps[(run.base, run.entry)], True, run.base) for run in p.runs}
    for run in p.runs:
        keys[run.start:run.stop] = [run_key[id(run)]] * (run.stop - run.start)
    for i, run in p.redirects.items():
        keys[i] = run_key[id(run)]
    # the original instructions as they are, where nothing is inserted among
    # them (3.13: a NOP before a cell's FOR_ITER/SEND)
    new = None
    if not (PY.inline_call_unwind and any(run is not None and run.start == i
                                           and op.instr.name in INLINED_CALLS
                                           for i, (op, run) in enumerate(zip(p.ops, owner)))):
        new = append(p.ops, keys, p.label_at, code, p.const_updates, tail, stacksize)
    if new is None:
        items = _emit_original(p, lambda run: traps[(run.base, run.entry)]) + tail
        try:
            new = splice(items, code, p.const_updates, stacksize)
        except _NotSpliced as exc:
            raise Unsupported(f"not armed: {exc}") from exc
    info.armed = True
    return new


#: the labels of flat armed code's one trap and of its stub part's fallback
#: (the same objects in every flat code object: ``append_covering`` lays its
#: tail out once)
_FLAT_TRAP, _FLAT_FALLBACK = Label(), Label()


def flat_tail() -> tuple:
    """This version's entry of ``_flattail.TAILS``: the trap ``arm`` lays out
    after flat code, read off two layouts after code whose tables differ
    only in what they held before the trap's (one constant and one name, or
    five and nine): an index of the trap's that moves by 4 is a constant's,
    by 8 a name's, by 16 a name's with its flag bit."""
    layouts = []
    base = compile("x = y\n", "<flat>", "exec")
    for n_consts, n_names in ((1, 1), (5, 9)):
        code = base.replace(co_consts=tuple(object() for _ in range(n_consts)),
                            co_names=tuple(f"\0{i}" for i in range(n_names)))
        info = CodeInfo("<module>", "<flat>", 1, None, original=code)
        tail = _trap_tail(info, {(0, None): _FLAT_TRAP}, lambda entry: (), _FLAT_FALLBACK)
        new = append_covering(code, 1, (_FLAT_TRAP, True, 0), {}, tail, stub_peak(0))
        assert info.traps == [()]
        # (only the mark is looked up outside the shared part: ``_flat._grown``)
        assert [_kind(it.instr)[3] for it in tail if it.instr is not None
                and _kind(it.instr)[2] != _PLAIN] == [(ARMED_MARK, info.key, 0)]
        layouts.append((new, (ARMED_MARK, info.key, 0), n_consts, n_names))
    (one, mark, n_consts, n_names), (other, _, _, _) = layouts
    at = len(base.co_code)
    laid, slots = bytearray(one.co_code[at:]), []
    for pos, (a, b) in enumerate(zip(laid, other.co_code[at:], strict=True)):
        if a != b:
            kind = {4: 0, 8: 1, 16: 2 + (a & 1)}[b - a]
            slots.append((pos, kind, (a >> (kind >= 2)) - (n_consts if kind == 0 else n_names)))
            laid[pos] = 0
    consts = one.co_consts[n_consts:]
    mark_at = consts.index(mark)
    units = at // 2
    entries = exception_entries(one)
    assert (entries[0].start, entries[0].end, entries[0].depth, entries[0].lasti) \
        == (2, at, 0, True)
    ranges = tuple((e.start // 2 - units, e.end // 2 - units, e.target // 2 - units, e.depth,
                    e.lasti) for e in entries[1:])
    return (bytes(laid), tuple(slots), consts[:mark_at] + (None,) + consts[mark_at + 1:],
            mark_at, one.co_names[n_names:], ranges, entries[0].target // 2 - units,
            len(laid) // 2, stub_peak(0))


def _trap_tail(info: CodeInfo, traps: dict[tuple, Label], guards_of,
               fallback: Label | None = None) -> list[_Item]:
    """Armed code's tail: a trap per (base depth, handler entry) of
    ``traps``, at its label, its guards (``guards_of(entry)``) in
    ``info.traps`` (``fallback``: the label of its stub part's fallback, a
    new one for each trap where None)."""
    tail = [_Item(_instr("NOP", loc=_NOWHERE), None)]  # (as ``emit``'s)
    info.traps = []
    for (base, entry), label in traps.items():
        guards = guards_of(entry)
        own = own_test(guards)
        tail.append(_Item(label=label))
        mark = (ARMED_MARK, info.key, len(info.traps))
        info.traps.append(guards)
        # (bytecode's InstrArg has no type for a constant's value)
        tail.append(_Item(Instr("LOAD_CONST", mark, location=_NOWHERE), None))  # type: ignore[arg-type]
        tail.append(_Item(chunk=_Chunk((base, False, own, P_UPGRADE), fallback or Label(), entry)))
        tail += _reraise(entry)  # (whatever the upgrade did not take over)
    return tail


def assemble(p: Plan, items: list[_Item]) -> types.CodeType:
    """A code object from the emitted items: assembled by daifu
    (``splice``), or by ``bytecode`` for a continuation or what ``splice``
    cannot encode.  The stack size is daifu's either way (``bytecode`` gets
    the depths of the stub entries wrong)."""
    if not p.continued and _SPLICE:
        # the original code's depths (the retry copies have the same ones),
        # and the stubs' deepest points, known from their shape
        stacksize = max(p.peak, p.code.co_stacksize, *(stub_peak(r.base) for r in p.runs))
        try:
            return splice(items, p.code, p.const_updates, stacksize)
        except _NotSpliced:
            pass  # (bytecode assembles the whole of it below)
        except Exception as exc:  # bytecode refused what we built: a daifu bug
            raise Unsupported(f"bytecode assembly failed: {exc}") from exc
    items = expand(items)
    final_ops, final_labels = _as_ops(items)
    stacksize = max(_analyse_depths(final_ops, final_labels, track_nulls=False),
                    p.code.co_stacksize)
    out = p.bc.copy() if p.bc is not None else Bytecode.from_code(p.code)
    out.clear()
    out.extend(_with_try_blocks(items))
    try:
        # (every EXTENDED_ARG a long jump gains moves the others: a function
        # with many cells can take more than bytecode's default 10 passes --
        # sizes only grow, so this converges)
        return out.to_code(stacksize=stacksize,
                           compute_exception_stack_depths=False, compute_jumps_passes=200)
    except Exception as exc:  # bytecode refused what we built: a daifu bug
        raise Unsupported(f"bytecode assembly failed: {exc}") from exc


#: what ``warm`` rewrites: loops one and two deep (the stubs' templates of
#: the base depths most cells have), a handler, a ``with`` block
_SAMPLE = """\
def sample(rows, out, lock):
    for row in rows:
        for value in row:
            try:
                with lock:
                    out.append(value[0])
            except KeyError:
                continue
    return out
"""


def warm() -> None:
    """Rewrite a sample function once and forget it: what the first rewrite
    of a process builds (the stubs' templates, the records' ``__init__``)
    is built now.  Armed code's first crash rewrites its function in full;
    without this it would pay ~2 ms more than later ones
    (``engine._preload``: what comes after it there must not be skipped, so
    this never raises)."""
    filename = "<daifu: the rewrite warmed>"
    try:
        msrc = ModuleSource(_SAMPLE, filename)
        module = compile(_SAMPLE, filename, "exec")
        code = next(c for c in module.co_consts if isinstance(c, types.CodeType))
        info = CodeInfo(code.co_qualname, filename, code.co_firstlineno, None, original=code)
    except Exception:  # pragma: no cover - (never: the sample compiles)
        return
    try:
        rewrite(code, info, msrc, msrc.scope_for(code))
    except Exception:  # (the first crash builds what it needs itself)
        pass
    finally:
        discard(info)


if __name__ == "__main__":  # (the running version's entry of ``_flattail.TAILS``)
    import pprint
    import sys

    code, *rest = flat_tail()
    from ._flat import magic

    print(f"    {(*sys.version_info[:2], magic())}: (")
    print("        bytes.fromhex(")
    for i in range(0, len(code), 44):
        print(f'            "{code[i:i + 44].hex()}"')
    print("        ),")
    for item in rest:
        print(" " * 8 + pprint.pformat(item, width=88, compact=True).replace("\n", "\n" + " " * 8)
              + ",")
    print("    ),")
