"""Would the program handle this exception itself?

Semantics daifu keeps: an exception the program catches never reaches the
engine.  The decision is made when the exception reaches a crash barrier, so
it is a prediction, made without running any user code:

* the crashed frame's own handlers are known precisely: the rewrite recorded
  them as guards, ``except`` clause types are looked up without invoking
  properties or ``__getattr__``, and the barrier receives the live ``__exit__``
  of every enclosing ``with`` -- known suppressors (``contextlib.suppress``,
  ``pytest.raises``, ``@contextmanager`` generators that catch, ``ExitStack``)
  are evaluated, and an ``__exit__`` that may return a true value counts as
  catching;
* callers are checked when their code belongs to a vaccinated module or the
  main script (*target files*); their ``with`` blocks are classified from the
  context expression;
* where the frame was entered from C (a builtin such as ``getattr`` or
  ``list``, a type call, a protocol slot), C code might catch: if a vaccinated
  caller is reachable through target-file frames only, the decision is left to
  its barrier (the exception reaches it only if nothing caught it); otherwise
  daifu takes it here, its last chance.

Anything daifu cannot classify counts as catching inside the frame (so it
never takes an exception the program may handle) and as not catching in
callers outside the target files.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import types
from collections.abc import Container

from ..cells import (
    MISSING,
    ExceptGuard,
    FinallyGuard,
    Guard,
    IdentityMemo,
    OpaqueGuard,
    Ref,
    WithGuard,
    armed_guards,
    backend,
    cell_at,
    cells_of,
    handlers_code,
    is_vaccinated,
    original_code,
    read_locals,
    route_catch,
    trap_of,
)

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)
if TYPE_CHECKING:
    from typing import Any

_UNKNOWN = object()
# (inspect's code flags; inspect itself is imported where it is used: it costs
# every start 1-2 ms)
_CO_GENERATOR, _CO_COROUTINE, _CO_ITERABLE_COROUTINE, _CO_ASYNC_GENERATOR = 0x20, 0x80, 0x100, 0x200
_CO_GENERATOR_LIKE = (_CO_GENERATOR | _CO_COROUTINE | _CO_ITERABLE_COROUTINE
                      | _CO_ASYNC_GENERATOR)


def _getattr_static(obj: Any, attr: str, *default: Any) -> Any:
    import inspect  # lazy: 7.3 ms

    return inspect.getattr_static(obj, attr, *default)


# -- reading expressions without side effects ----------------------------------------


class _Namespace:
    """Lazy access to a frame's variables (read only if needed, and without
    leaving a snapshot on the frame: see ``cells._context.read_locals``)."""

    def __init__(self, frame: types.FrameType):
        self.frame = frame
        self._locals: dict[str, Any] | None = None

    def lookup(self, name: str, scope: str) -> Any:
        frame = self.frame
        if scope in ("fast", "deref", "name"):
            if self._locals is None:
                self._locals = read_locals(frame)
            if name in self._locals:
                return self._locals[name]
            if scope != "name":
                return _UNKNOWN
        if name in frame.f_globals:
            return frame.f_globals[name]
        builtins = frame.f_builtins
        return builtins.get(name, _UNKNOWN) if isinstance(builtins, dict) else _UNKNOWN


def eval_ref(ref: Ref, ns: _Namespace) -> Any:
    """Value of a ``Ref`` or ``_UNKNOWN``; never runs user code."""
    if ref.is_const:
        return ref.const
    if ref.items is not None:
        values = tuple(eval_ref(item, ns) for item in ref.items)
        return _UNKNOWN if any(v is _UNKNOWN for v in values) else values
    value = ns.lookup(ref.name, ref.scope)
    for attr in ref.attrs:
        if value is _UNKNOWN:
            return _UNKNOWN
        try:
            value = _getattr_static(value, attr)
        except AttributeError:
            return _UNKNOWN
        if isinstance(value, (property, staticmethod, classmethod, types.MemberDescriptorType,
                              types.GetSetDescriptorType)):
            return _UNKNOWN
    return value


def _is_exception_spec(value: Any) -> bool:
    if isinstance(value, type):
        return issubclass(value, BaseException)
    return isinstance(value, tuple) and all(_is_exception_spec(v) for v in value)


def _classes(spec: Any) -> list[type]:
    return [c for item in spec for c in _classes(item)] if isinstance(spec, tuple) else [spec]


def _except_matches(exc: BaseException, spec: Any) -> bool:
    """What ``except spec:`` decides.  CPython matches on the class's MRO
    (``PyErr_GivenExceptionMatches``), never calling ``__instancecheck__`` or
    ``__subclasscheck__``: neither does daifu (no user code runs, and an ABC
    with registered "virtual" subclasses matches exactly as in CPython)."""
    mro = type(exc).__mro__
    return any(c in mro for c in _classes(spec))


def _subclass_verdict(exc: BaseException, spec: Any) -> bool | None:
    """``issubclass(type(exc), spec)`` as a context manager's ``__exit__``
    computes it (``contextlib.suppress``, ``pytest.raises``), without running
    user code: None (maybe) where a class with its own metaclass could
    answer differently through ``__subclasscheck__``."""
    if _except_matches(exc, spec):
        return True
    plain = all(type(c) is type for c in _classes(spec))
    return False if plain else None


# -- context managers -----------------------------------------------------------------


def suppresses(cm: Any, exc: BaseException, depth: int = 0) -> bool | None:
    """Would ``cm.__exit__`` swallow ``exc``?  True, False, or None (maybe)."""
    if cm is None or depth > 4:
        return None
    try:
        if isinstance(cm, contextlib.suppress):
            return _subclass_verdict(exc, getattr(cm, "_exceptions", ()))
        if isinstance(cm, contextlib._GeneratorContextManager):
            gen = cm.gen
            frame = getattr(gen, "gi_frame", None)
            if frame is None:
                return False
            return would_catch(guards_at(frame.f_code, frame.f_lasti), exc, frame, None)
        if isinstance(cm, (contextlib.ExitStack, contextlib.AsyncExitStack)):
            callbacks = getattr(cm, "_exit_callbacks", ())
            verdicts = [_callback_suppresses(cb, exc, depth) for _, cb in callbacks]
            if any(v is True for v in verdicts):
                return True
            return None if any(v is None for v in verdicts) else False
        cls = type(cm)
        mod, name = cls.__module__, cls.__name__
        if mod.startswith("_pytest") and name in ("RaisesContext", "RaisesExc", "RaisesGroup"):
            expected = getattr(cm, "expected_exception", None) or getattr(
                cm, "expected_exceptions", None)
            return True if expected is None else _subclass_verdict(exc, expected)
        if mod == "unittest.case" and name == "_AssertRaisesContext":
            return _subclass_verdict(exc, cm.expected)
        exit_fn = _getattr_static(cls, "__exit__", None)
        return _exit_may_suppress(exit_fn)
    except Exception:
        return None


def _callback_suppresses(cb: Any, exc: BaseException, depth: int) -> bool | None:
    owner = getattr(cb, "__self__", None)
    if owner is not None and not isinstance(owner, types.ModuleType):
        return suppresses(owner, exc, depth + 1)
    if getattr(cb, "__name__", "") == "_exit_wrapper":  # ExitStack.callback(): returns None
        return False
    return _exit_may_suppress(cb)


def _exit_may_suppress(exit_fn: Any) -> bool | None:
    """None if a Python ``__exit__`` can return something true; False if it
    only returns None/False or is implemented in C (assumed not to suppress)."""
    if isinstance(exit_fn, (staticmethod, classmethod)):
        exit_fn = exit_fn.__func__
    code = getattr(exit_fn, "__code__", None)
    if code is None:
        return False
    back, _ = backend()
    if back is None:
        return None
    return None if back.returns_truthy(original_code(code)) else False


def _context_verdict(guard: WithGuard, exc: BaseException, ns: _Namespace) -> bool | None:
    """Classify a caller's ``with`` from its context expression."""
    if guard.context is None:
        return None
    value = eval_ref(guard.context, ns)
    if value is _UNKNOWN:
        return None
    if not guard.called:  # `with cm:` -- the context manager object itself
        return suppresses(value, exc)
    if value is contextlib.suppress:
        args = tuple(eval_ref(a, ns) for a in guard.args)
        if not guard.args or any(a is _UNKNOWN for a in args):
            return None
        return _subclass_verdict(exc, args) if all(_is_exception_spec(a) for a in args) else None
    if isinstance(value, type):
        if issubclass(value, (contextlib.ExitStack, contextlib.AsyncExitStack)):
            return None  # its callbacks are not known until it runs
        return _exit_may_suppress(_getattr_static(value, "__exit__", None))
    if _raises_factory(getattr(value, "__func__", value)):
        # `with self.assertRaises(E):` -- catches E
        expected = eval_ref(guard.args[0], ns) if guard.args else _UNKNOWN
        if expected is _UNKNOWN or not _is_exception_spec(expected):
            return None
        return _subclass_verdict(exc, expected)
    wrapped = getattr(value, "__wrapped__", None)
    if isinstance(wrapped, types.FunctionType) and wrapped.__code__.co_flags & _CO_GENERATOR:
        # @contextmanager factory: may swallow only if the generator catches
        back, _ = backend()
        if back is None or back.has_except_handler(original_code(wrapped.__code__)):
            return None
        return False
    return False  # a factory function or builtin (open, ...): assumed not to suppress


def _raises_factory(fn: Any) -> bool:
    """unittest's ``assertRaises``/``assertRaisesRegex`` and ``pytest.raises``:
    called with the exception class(es) first, they return a context manager
    that catches exactly those (a test that expects the exception handles it)."""
    mod, name = getattr(fn, "__module__", None) or "", getattr(fn, "__qualname__", "")
    return (mod == "unittest.case" and name in ("TestCase.assertRaises",
                                                "TestCase.assertRaisesRegex")) or (
        mod in ("_pytest.raises", "_pytest.python_api") and name == "raises")


# -- the decision ---------------------------------------------------------------------


def would_catch(guards: tuple[Guard, ...], exc: BaseException, frame: types.FrameType,
                exits: list[Any] | None, specific_only: bool = False) -> bool | None:
    """Evaluate the guards innermost-first.  ``exits`` are the live ``__exit__``
    callables of the enclosing ``with`` statements (None in callers' frames).
    True: the frame catches it; False: it escapes; None: cannot tell.
    ``specific_only`` (a library's frame): only handlers that name the
    exception's class or a class below ``Exception`` count -- no bare
    ``except``, no ``except Exception``, nothing daifu cannot evaluate."""
    exit_iter = iter(exits) if exits is not None else None
    ns = _Namespace(frame)
    uncertain = False
    mro = type(exc).__mro__
    for guard in guards:
        if isinstance(guard, ExceptGuard):
            for clause in guard.clauses:
                test = clause.test
                if clause.bare or test is None:
                    matched: bool | None = not specific_only
                else:
                    if (test.scope == "global" and not test.attrs and test.items is None
                            and not test.is_const):
                        # the commonest, ``except KeyError``: a global or builtin
                        spec = frame.f_globals.get(test.name, _UNKNOWN)
                        if spec is _UNKNOWN:
                            spec = ns.lookup(test.name, "global")
                    else:
                        spec = eval_ref(test, ns)
                    if isinstance(spec, type) and issubclass(spec, BaseException):
                        matched = spec in mro and not (specific_only and spec in _CATCH_ALL)
                    elif not _is_exception_spec(spec):
                        matched = not specific_only
                    elif specific_only and any(c in _CATCH_ALL for c in _classes(spec)):
                        matched = False
                    else:
                        matched = _except_matches(exc, spec)
                if matched:
                    if clause.reraises:
                        break  # handled, then re-raised: it escapes all the same
                    return True
        elif isinstance(guard, WithGuard):
            if exit_iter is not None:
                exit_fn = next(exit_iter, None)
                verdict = suppresses(getattr(exit_fn, "__self__", None), exc)
            else:
                verdict = _context_verdict(guard, exc, ns)
            if verdict:
                return True
            if verdict is None and not specific_only:
                if exits is not None:
                    return True  # in the crashed frame: never take what may be handled
                uncertain = True
        elif isinstance(guard, FinallyGuard):
            if guard.swallows:
                return True
        elif isinstance(guard, OpaqueGuard) and not specific_only:
            return True
    return None if uncertain else False


#: what a library's reporting boundary catches (pytest, IPython, thread pools)
_CATCH_ALL = (BaseException, Exception)


class _Memo(threading.local):
    #: the last sure catch ``handled_above`` found, for this thread: (type and
    #: id of the exception, id and code of the frame that catches it, then the
    #: traceback head at the barrier that last relied on it, by ``_mark``'s
    #: four fields: its address, its frame's, the code, the offset); see
    #: ``caught_above``
    caught: tuple | None = None
    #: the constant of the stub of the frame that surely catches the
    #: exception ``handled_above`` last looked at, when nothing between can
    #: catch it or keep it from getting there and that stub will see it,
    #: with the route to it when it can be remembered (``take_passing``,
    #: ``remember_route``)
    passing: tuple | None = None
    #: the call site (code, offset) of the first caller, where the
    #: exception ``handled_above`` last looked at leaves its frame into C
    #: code that may catch it, that caller vaccinated (``hasattr`` on a
    #: ``__getattr__`` that raises), when nothing above caught it: its route
    #: (``take_through``, ``remember_route``)
    through: tuple | None = None


_seen = _Memo()


def _mark(tb: types.TracebackType) -> tuple:
    """A traceback entry, by what a dead entry's reused address does not
    bring back with it: its address, its frame's, the code and the offset."""
    return (id(tb), id(tb.tb_frame), tb.tb_frame.f_code, tb.tb_lasti)


def caught_above(exc: BaseException, frame: types.FrameType) -> bool:
    """Is ``exc``, now at the barrier of ``frame``, on its way to the frame a
    barrier below already found to catch it surely?  (Then nothing needs to
    be looked at again: an exception the program catches N vaccinated frames
    up passes N barriers, and only the first searches its callers.)

    Ids alone cannot say "the same exception": in a loop that raises and
    catches, every exception, traceback and frame object is made at the
    address of the last iteration's.  So the exception must have travelled
    here from that barrier: its traceback, from its head (this frame) down,
    reaches the entry the last barrier saw -- strictly below the head, and
    the same by address, frame, code and offset -- without passing the
    catching frame on the way.  The catching frame may be this one (its own
    barrier sees the exception before its handler does); the memo is then
    used up: an exception that leaves the catching frame again (a bare
    ``raise`` in the handler, ``raise last_error`` after a retry loop) is
    judged anew.  Nothing is kept alive: a handled exception's frames and
    their locals are freed when the program is done with it, as without
    daifu.  (Asked at every barrier an exception passes: kept to a few
    comparisons, ``_mark`` written out.)"""
    caught = _seen.caught
    if caught is None or caught[1] != id(exc) or caught[0] is not type(exc):
        return False
    head = exc.__traceback__
    if head is None or head.tb_frame is not frame:
        return False
    _, _, catcher, catcher_code, mark_tb, mark_frame, mark_code, mark_lasti = caught
    tb = head.tb_next
    while tb is not None:
        f = tb.tb_frame
        if id(f) == catcher and f.f_code is catcher_code:
            return False  # it came back through the catching frame: look again
        if id(tb) == mark_tb:
            if id(f) != mark_frame or f.f_code is not mark_code or tb.tb_lasti != mark_lasti:
                return False  # (another entry at a dead one's address)
            if id(frame) == catcher and frame.f_code is catcher_code:
                _seen.caught = None  # at the catching frame: used up
            else:
                _seen.caught = (caught[0], caught[1], catcher, catcher_code, id(head),
                                id(frame), frame.f_code, head.tb_lasti)
            return True
        tb = tb.tb_next
    return False


def handled_above(frame: types.FrameType, exc: BaseException, targets: Container[str]) -> bool:
    """True if a caller would catch the exception -- or might, and a vaccinated
    caller reachable through target-file frames only will see it if nothing
    does (its barrier then decides with full knowledge).  Of the N barriers an
    exception caught N frames up passes, the first finds the catching frame;
    the others only check that it came from there (``caught_above``: linear
    in N).  Whether a frame was entered from C (which might catch) is read only
    where the answer depends on it: it can turn "nobody catches it" into "a
    vaccinated caller will decide", never the other way."""
    _seen.caught = _seen.passing = _seen.through = None  # (a search of its own)
    transparent = True  # every frame so far belongs to a target file
    plain = True  # every frame so far reached by a call, and surely not catching
    left: list[types.FrameType] = []  # frames left by a call (to their ``f_back``)
    deciding = 0  # a C boundary among the first ``deciding`` calls: a vaccinated caller decides
    f, fcode = frame, frame.f_code
    steps = None  # the general path (``_exception_path``), once a coroutine is met
    facts_of = _FACTS.entries.get
    bare = True  # no caller so far had a handler around its call
    first = None  # the first caller's site, left through C, vaccinated: (code, offset)
    while True:
        if steps is None and not fcode.co_flags & _CO_COROUTINE:
            caller = f.f_back  # (a plain call: the common case, walked here)
            if caller is None:
                break
            via_call = True
        else:
            if steps is None:
                steps = _exception_path(f)
            step = next(steps, None)
            if step is None:
                break
            f, caller, via_call = step
            if caller is None:
                return True  # the program keeps it (gather(..., return_exceptions=True))
            fcode = f.f_code
        code = caller.f_code
        lasti = caller.f_lasti
        hit = facts_of((id(code), lasti))  # (``_facts``, read in place)
        facts = hit[1] if hit is not None and hit[0] is code else _facts(code, lasti)
        if via_call:
            left.append(f)
            if plain:  # (is the call surely not through C? see ``_facts``)
                if facts[2] is not fcode:
                    facts[3] = _via_c(f)
                    facts[2] = fcode
                if facts[3] is not False:
                    plain = False
        else:
            plain = False
        guards = facts[1]
        f, fcode = caller, code
        library = code.co_filename not in targets
        if library:
            transparent = False
        vaccinated_here = transparent and facts[0]
        if vaccinated_here:
            deciding = len(left)
            if deciding == 1 and steps is None and facts[3] is True and not guards:
                first = (code, lasti)
        # a library frame's handlers count too when they name the exception
        # (argparse's ``except (TypeError, ValueError)`` around a ``type=``
        # function, unittest's assertRaises, torch.utils.checkpoint's own
        # internal exception); its catch-alls do not: ``except Exception`` in
        # pytest, IPython or a thread pool reports a crash, it does not fix it
        if guards:
            verdict = would_catch(guards, exc, caller, None, specific_only=library)
            if verdict:
                head = exc.__traceback__
                if head is not None and head.tb_frame is frame:
                    _remember_catch(frame, exc, caller, facts, head, plain and vaccinated_here,
                                    bare and steps is None)
                return True
            bare = False
            if verdict is None:
                if vaccinated_here:
                    return True
                plain = False
    _seen.through = first  # (left for C code at the first caller's call: so again next time)
    # C code in between may catch; if not, that caller's barrier decides
    return first is not None or (bool(deciding) and _through_c(left[:deciding]))


def _remember_catch(frame: types.FrameType, exc: BaseException, caller: types.FrameType,
                    facts: list, head: types.TracebackType, reachable: bool,
                    routable: bool) -> None:
    """The catch ``handled_above`` found, for the barriers above to trust
    (``_seen.caught``); where the catcher's stub is reached by plain calls
    (``reachable``), the stub and, for a walk of plain calls with no handler
    between (``routable``), the route to remember (``_seen.passing``)."""
    code = caller.f_code
    _seen.caught = (type(exc), id(exc), id(caller), code, *_mark(head))
    if reachable:
        stub = facts[4]
        if stub is MISSING:
            stub = facts[4] = _stub_const(code, caller.f_lasti)
        if stub is not None:  # (the exception reaches the catcher's stub)
            _seen.passing = (stub, _route(frame, caller, facts[1], exc) if routable else None)


def _through_c(left: list[types.FrameType]) -> bool:
    """Was one of these frames entered from C (which might catch)?"""
    back, _ = backend()
    return back is not None and any(_via_c(f, back) for f in left)


def _facts(code: types.CodeType, offset: int) -> list:
    """What the walk asks of a caller stopped at byte ``offset`` of ``code``,
    kept in ``_FACTS``: [is ``code`` vaccinated, the handlers around
    ``offset`` (``guards_at``), the code this call site was last seen to
    enter, whether through C (``_via_c``), and the constant of the stub that
    an exception from there reaches (``_stub_const``; ``MISSING`` until
    asked)].  The last two only let an
    exception pass the stubs between (``passing``): a site that enters the
    same code both directly and through C code that catches (``hasattr`` one
    time, a plain call the next) would, at worst, leave the last such
    exception held until the next barrier call."""
    facts = _FACTS.find((id(code), offset), code)
    if facts is MISSING:
        try:
            guards = _guards_at(code, offset)
        except (RecursionError, MemoryError):  # (at the limit: not kept, asked again later)
            return [is_vaccinated(code), (), None, None, MISSING]
        except Exception:
            guards = ()
        facts = [is_vaccinated(code), guards, None, None, MISSING]
        _FACTS.keep((id(code), offset), code, facts)
    return facts


#: (id(code), offset) -> ``_facts``, by identity (as ``cells_of``)
_FACTS = IdentityMemo()


def _stub_const(code: types.CodeType, offset: int) -> tuple | None:
    """The constant that the stub of the cell holding byte ``offset`` of
    ``code`` loads (the very object in ``co_consts``: the stubs compare it
    by identity, ``passing[1]``), or None when no cell holds it (the
    exception would not reach a stub there); of armed code, the constant
    of its trap."""
    mark = trap_of(code, offset)
    if mark is not None:
        return mark
    info = cells_of(code)
    cell = cell_at(info, code, offset) if info is not None else None
    if cell is None:
        return None
    want = info.ref(cell)  # type: ignore[union-attr]
    for const in code.co_consts:
        if type(const) is tuple and const == want:
            return const
    return None


def take_through() -> tuple | None:
    """The first caller's site ``handled_above`` last found the exception
    to leave for C code through (``_Memo.through``); forgotten once asked."""
    taken, _seen.through = _seen.through, None
    return taken


def take_passing() -> tuple | None:
    """``(stub, route)``: the constant of the stub of the frame
    ``handled_above`` last found to catch the exception surely, with
    nothing between (see ``_Memo.passing``), and what ``remember_route``
    keeps of the way there (or None); forgotten once
    asked, and with it the memo ``caught_above`` reads: the stubs between
    let the exception pass instead, and the catching frame's stub lets go of
    it, so that an exception leaving that frame again is judged anew."""
    taken = _seen.passing
    if taken is not None:
        _seen.passing = _seen.caught = None
    return taken


# -- routes: the same exception from the same cell to the same handler ------------------
#
# EAFP code raises the same exception from the same place to the same handler
# again and again (``try: lookup(d, k)`` / ``except KeyError`` in a loop).  The
# first time, ``handled_above`` walks the callers and finds the handler; what
# decided it is then kept per raising cell (``remember_route``): the code and
# offset of every frame up to the handler -- none with a handler around its
# call, each reached by a plain call -- and the handler's ``except Name:``
# with the class the name held.  The next such exception at that cell's
# barrier is checked against it frame by frame (``_barrier.barrier``, first
# thing: identity and offset reads, no evaluation) and passed on to the
# handler at once.  Every
# fact the walk would use is a function of what is compared: the handlers
# around a call are a function of the code and offset (``_facts``), whether a
# call site enters its callee through C is read once per site and callee
# code (``_facts``), which files are targets changes only by growing (the
# routes are forgotten when a file is dropped: ``RUNTIME.on_drop``), and the
# name is looked up again.


def _route(frame: types.FrameType, catcher: types.FrameType, guards: tuple[Guard, ...],
           exc: BaseException) -> tuple | None:
    """What ``remember_route`` keeps of the way from ``frame`` to
    ``catcher``, whose innermost handler catches ``exc``: None unless that
    handler is an ``except Name:`` whose class matches, or an ``except (A,
    B):`` of names one of which does (``route_catch``)."""
    name = route_catch(guards)
    if name is None:
        return None
    mro = type(exc).__mro__
    if isinstance(name, tuple):
        cls: Any = tuple(_global(catcher, n) for n in name)
        if not (all(isinstance(c, type) for c in cls) and any(c in mro for c in cls)):
            return None
    else:
        cls = _global(catcher, name)
        if not (isinstance(cls, type) and cls in mro):
            return None
    hops = []
    f: types.FrameType | None = frame
    while f is not catcher and f is not None:
        f = f.f_back
        if f is None:
            return None
        hops.append((f.f_code, f.f_lasti))
    return tuple(hops), name, cls


def _global(frame: types.FrameType, name: str) -> Any:
    """What ``LOAD_GLOBAL name`` gives in ``frame`` (or ``_UNKNOWN``)."""
    value = frame.f_globals.get(name, _UNKNOWN)
    if value is _UNKNOWN:
        builtins = frame.f_builtins
        value = builtins.get(name, _UNKNOWN) if isinstance(builtins, dict) else _UNKNOWN
    return value


def _exception_path(frame: types.FrameType):
    """The frames an exception escaping ``frame`` reaches, nearest first, as
    ``(frame it leaves, frame it reaches, reached by a call)`` -- the
    callers, except that the root coroutine of an asyncio task gives its
    exception to the task, which hands it to whoever awaits the task: the
    awaiting coroutines (suspended, not on this stack) instead of the event
    loop's frames.  ``(.., None, ..)`` means the program keeps the exception
    as a value."""
    f = frame
    while True:
        if f.f_code.co_flags & _CO_COROUTINE:
            task = _task_of(f)
            if task is not None:
                yield from _awaiters(task, f, set())
                return
        caller = f.f_back
        if caller is None:
            return
        yield f, caller, True
        f = caller


def _task_of(frame: types.FrameType) -> Any:
    """The running asyncio task whose root coroutine runs in ``frame``, or None."""
    asyncio = sys.modules.get("asyncio")
    if asyncio is None:
        return None
    try:
        task = asyncio.current_task()
    except Exception:  # no running loop
        return None
    coro = task.get_coro() if task is not None else None
    return task if getattr(coro, "cr_frame", None) is frame else None


def _suspended(coro: Any) -> list[types.FrameType]:
    """The frames of a suspended coroutine and of what it awaits, innermost first."""
    frames: list[types.FrameType] = []
    while coro is not None and len(frames) < 256:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is None:
            break
        frames.append(frame)
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return frames[::-1]


def _awaiters(future: Any, leaving: types.FrameType, seen: set[int]):
    """Where a finished future's exception goes next (see ``_exception_path``):
    the first of its done-callbacks that daifu knows."""
    if id(future) in seen or len(seen) > 64:
        return
    seen.add(id(future))
    for callback, _context in list(getattr(future, "_callbacks", None) or ()):
        name = getattr(callback, "__name__", "")
        owner = getattr(callback, "__self__", None)
        if name in ("task_wakeup", "__wakeup", "_Task__wakeup") and owner is not None:
            # a task awaits it: the exception is thrown into its coroutines
            # where they are suspended, innermost first
            for frame in _suspended(owner.get_coro()):
                yield leaving, frame, False
                leaving = frame
            yield from _awaiters(owner, leaving, seen)
            return
        if name == "_run_until_complete_cb":
            # loop.run_until_complete (asyncio.run) raises it again: its callers
            f: types.FrameType | None = leaving
            while f is not None and not (f.f_code.co_name == "run_until_complete"
                                         and "asyncio" in f.f_code.co_filename):
                f = f.f_back
            if f is not None:
                yield from _exception_path(f)
            return
        code = getattr(callback, "__code__", None)
        if name == "_done_callback" and code is not None and "outer" in code.co_freevars:
            cells = dict(zip(code.co_freevars, callback.__closure__ or ()))
            try:
                if cells["return_exceptions"].cell_contents:
                    yield leaving, None, False  # gather() returns it as a result
                    return
                outer = cells["outer"].cell_contents
            except (KeyError, ValueError):
                return
            if outer is not None:  # asyncio.gather(): its future gets the exception
                yield from _awaiters(outer, leaving, seen)
            return
    # no known awaiter (asyncio.wait, TaskGroup, callbacks ...): nothing more is known


def _via_c(frame: types.FrameType, back=None) -> bool | None:
    """Was ``frame`` entered from C code that may catch, rather than by a
    plain Python call from its ``f_back``?  None: not known -- a generator
    or coroutine resumed by ``next()``/``send()`` (no C code that catches,
    but StopIteration; yet not a plain call), or a frame layout daifu cannot
    read.  ``f(*args, **kw)``, a ``for`` loop's ``__next__`` and the other
    ways of iterating go through C that catches no crash: False (the frame
    takes its crash itself, where its failing statement can be retried;
    the caller's retry would call ``next()`` again on an iterator that has
    moved on)."""
    if frame.f_code.co_flags & _CO_GENERATOR_LIKE:
        return None
    if back is None:
        back, _ = backend()
        if back is None:
            return None
    caller = frame.f_back
    entry = back.called_from_c(frame)
    if not entry or caller is None:
        return entry
    return not back.c_passes_through(caller.f_code, caller.f_lasti, frame.f_code.co_name)


def guards_at(code: types.CodeType, offset: int) -> tuple[Guard, ...]:
    """The handlers around byte ``offset`` of ``code``, innermost first."""
    return _facts(code, offset)[1]


def _guards_at(code: types.CodeType, offset: int) -> tuple[Guard, ...]:
    guards = armed_guards(code, offset)  # (armed code: its cells are not made for this)
    if guards is not None:
        return guards
    info = cells_of(code) if handlers_code(code) is code else None
    if info is not None:
        cell = cell_at(info, code, offset)
        if cell is not None:
            return cell.guards
    back, _ = backend()
    code = handlers_code(code)  # (armed code: its own handlers, not its traps)
    if back is None or not _covered(code, offset):
        return ()  # no handler around it: nothing to decode (or parse)
    from ..cells import source_for_file  # lazy: 17.3 ms

    return back.chain_for_code(code, offset, source_for_file(code.co_filename))


def _covered(code: types.CodeType, offset: int) -> bool:
    """Is byte ``offset`` of ``code`` inside an exception-table entry?"""
    if not code.co_exceptiontable:
        return False
    from ..cells import exception_entries  # lazy: 0.5 ms

    return any(e.start <= offset < e.end for e in exception_entries(code))
