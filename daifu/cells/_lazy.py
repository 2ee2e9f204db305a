"""Vaccination at first call.

Rewriting a function costs milliseconds (most of it in ``bytecode``'s
assembler), and most functions of a program never crash -- many never run.
So besides the functions the selection names (``*``: those with a loop, which
are rewritten at import), every other function defined at the top of a module
or in a class body is given a *stub* at import: a tiny code object with the
function's own signature, name, file and first line, whose body is

    return first_call(PENDING)(a, b, *args, c=c, **kw)

``first_call`` (run once per function) rewrites the original code, installs
it as the function's ``__code__`` and hands the function back, so the stub
calls the vaccinated function with the very arguments it received.  From the
second call on the function *is* the vaccinated code: nothing is added to the
normal path.

The stub is made by ``code.replace`` of a template compiled once per
signature shape, so an import costs microseconds per function instead of
milliseconds.  The ``Pending`` constant holds the unmodified code (and the
rewritten code of its nested functions); ``original_code`` sees through it, so
the reload compares and replaces stubbed functions like any other.

Not stubbed (they keep today's rule, vaccinated at import only if selected):
generators and coroutines (a stub would change what ``inspect`` says they
are), nested functions, lambdas and comprehensions (a new function object per
evaluation would pay the first call each time).
"""

from __future__ import annotations

import gc
import sys
import threading
import types
import warnings
import weakref

from .._errors import NotVaccinatedWarning
from .._record import field
from .._runtime import RUNTIME, state_record
from ._cell import info_of
from ._dispatch import backend
from ._versions import current

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)
if TYPE_CHECKING:
    import ast
    from typing import Any

_CO_VARARGS, _CO_VARKEYWORDS = 0x04, 0x08
#: generators, coroutines, async generators, iterable coroutines
_CO_NOT_STUBBED = 0x20 | 0x80 | 0x200 | 0x100
_HELPER, _PENDING = "__daifu_first_call__", "__daifu_pending__"


@state_record
class _Wired:
    """The first-call stubs' process state (``RUNTIME.parts``)."""

    #: ``rewrite(pending)``: the rewrite of a function at its first call,
    #: given by ``_transform`` when it is imported (``use_rewrite``: this
    #: module never imports it back)
    rewrite: Any = None
    #: stubs made before TorchDynamo was imported (see ``_not_for_dynamo``)
    stubs: weakref.WeakSet[types.CodeType] = field(default_factory=weakref.WeakSet)
    #: TorchDynamo's ``skip_code`` once it is imported
    dynamo_skip: Any = None
    #: TorchDynamo's ``set_eval_frame`` once it is imported: ``first_call``
    #: runs the rewrite with Dynamo's frame callback off
    set_eval_frame: Any = None


_state = RUNTIME.part(__name__, _Wired())


def use_rewrite(rewrite: Any) -> None:
    """``rewrite(pending)``: the vaccinated code of a stubbed function, or None."""
    _state.rewrite = rewrite
_DOC = "__daifu_docstring__"


class Pending:
    """The constant of a first-call stub: the function's unmodified code, the
    rewritten code of the functions nested in it, and (once it has run) its
    vaccinated code."""

    __slots__ = ("original", "module", "children", "source", "_code", "_lock")

    def __init__(self, original: types.CodeType, module: str | None,
                 children: tuple = ()):
        self.original = original
        self.module = module
        #: ((plain nested code, its rewritten code), ...)
        self.children = children
        #: the ``LoadedFile`` the function was compiled from (set at import and
        #: when loaded from the cache; not pickled)
        self.source: Any = None
        self._code: types.CodeType | None = None
        self._lock = threading.Lock()

    def __reduce__(self):
        return Pending, (self.original, self.module, self.children)

    def __repr__(self) -> str:
        return f"<daifu first-call stub of {self.original.co_qualname}>"

    def code(self) -> types.CodeType:
        """The code to install: vaccinated (once), or the original where it
        cannot be (with the warning an import-time rewrite would give)."""
        with self._lock:
            if self._code is None:
                self._code = _rewrite(self)
            return self._code


def stubbable(code: types.CodeType, scope: ast.AST, parent: ast.AST | None) -> bool:
    """Can ``code`` (compiled from ``scope``, defined directly in ``parent``) get a stub?"""
    import ast  # (the rewrite's path, not the cache's)  # lazy: 1.3 ms

    if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    if not isinstance(parent, (ast.Module, ast.ClassDef)) or code.co_flags & _CO_NOT_STUBBED:
        return False
    return not {_HELPER, _PENDING} & set(code.co_varnames[:_nparams(code)])


def _nparams(code: types.CodeType) -> int:
    return (code.co_argcount + code.co_kwonlyargcount
            + bool(code.co_flags & _CO_VARARGS) + bool(code.co_flags & _CO_VARKEYWORDS))


_templates: dict[tuple, tuple[types.CodeType, int, int]] = {}
_HELPER_MARK, _PENDING_MARK = object(), object()


def _template(code: types.CodeType) -> tuple[types.CodeType, int, int]:
    """The stub code for ``code``'s signature shape, with two placeholder
    constants (and their indices): compiled once per shape."""
    names = code.co_varnames[:_nparams(code)]
    key = (names, code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount,
           code.co_flags & (_CO_VARARGS | _CO_VARKEYWORDS), code.co_freevars)
    found = _templates.get(key)
    if found is not None:
        return found
    n, p, k = code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount
    pos, kwonly, rest = names[:n], names[n:n + k], list(names[n + k:])
    star = rest.pop(0) if code.co_flags & _CO_VARARGS else None
    starstar = rest.pop(0) if code.co_flags & _CO_VARKEYWORDS else None
    params = list(pos[:p]) + (["/"] if p else []) + list(pos[p:])
    args = list(pos)
    if star is not None:
        params.append("*" + star)
        args.append("*" + star)
    elif kwonly:
        params.append("*")
    params += kwonly
    args += [f"{name}={name}" for name in kwonly]
    if starstar is not None:
        params.append("**" + starstar)
        args.append("**" + starstar)
    free = list(code.co_freevars)
    # one line, so the stub's frame shows the function's ``def`` line; the
    # free variables are only named (after the return: never read), so the
    # stub has the closure the function's MAKE_FUNCTION builds
    body = f"return {_HELPER}({_PENDING})({', '.join(args)})" + "".join(f"; {v}" for v in free)
    # the docstring placeholder keeps constant 0 for the function's own: the
    # function object's ``__doc__`` is taken from there when it is made
    text = (f"def outer():\n    {' = '.join(free + ['None'])}\n" if free else "") + \
        ("    " if free else "") + f"def stub({', '.join(params)}): {_DOC!r}; {body}\n"
    module = compile(text, "<daifu stub>", "exec", dont_inherit=True)
    stub = next(c for c in module.co_consts if isinstance(c, types.CodeType))
    if free:
        stub = next(c for c in stub.co_consts if isinstance(c, types.CodeType))
    stub = _constants(stub)
    consts = stub.co_consts
    if consts[0] != _DOC:  # pragma: no cover - a compiler that orders constants otherwise
        raise RuntimeError("daifu: the stub template has no docstring slot")
    found = (stub.replace(co_firstlineno=1, co_freevars=code.co_freevars),
             consts.index(_HELPER_MARK), consts.index(_PENDING_MARK))
    _templates[key] = found
    return found


def _constants(stub: types.CodeType) -> types.CodeType:
    """The template with its two global loads turned into constant loads."""
    import bytecode  # lazy: 15.2 ms


    bc = bytecode.Bytecode.from_code(stub)
    out: list = []
    for instr in bc:
        if isinstance(instr, bytecode.Instr) and instr.name == "LOAD_GLOBAL":
            arg: Any = instr.arg
            push_null, name = arg
            mark: Any = _HELPER_MARK if name == _HELPER else _PENDING_MARK
            load = bytecode.Instr("LOAD_CONST", mark, location=instr.location)
            null = bytecode.Instr("PUSH_NULL", location=instr.location)
            if not push_null:
                out.append(load)
            elif current().null_below_callable:
                out += [null, load]
            else:
                out += [load, null]
        else:
            out.append(instr)
    bc[:] = out
    return bc.to_code()


def make_stub(code: types.CodeType, pending: Pending) -> types.CodeType:
    """The first-call stub of ``code`` (``pending`` holds ``code`` itself)."""
    template, helper_at, pending_at = _template(code)
    consts = list(template.co_consts)
    consts[helper_at], consts[pending_at] = first_call, pending
    # what MAKE_FUNCTION makes ``__doc__`` of: the original's first constant
    # if it is a string (its docstring), else None
    first = code.co_consts[0] if code.co_consts else None
    consts[0] = first if isinstance(first, str) else None
    # the line table is relative to the first line: the body is on the def line
    stub = template.replace(co_consts=tuple(consts), co_name=code.co_name,
                            co_qualname=code.co_qualname, co_filename=code.co_filename,
                            co_firstlineno=code.co_firstlineno)
    _not_for_dynamo(stub)
    return stub


def _not_for_dynamo(stub: types.CodeType) -> None:
    """``torch.compile`` must run a stub's frame as it is (TorchDynamo cannot
    trace its constants) and compile what it calls, the vaccinated function:
    with Dynamo imported, the stub's code is marked "skip this frame, not the
    frames it calls"; before that, it is remembered for ``use_dynamo``."""
    if _state.dynamo_skip is not None:
        _state.dynamo_skip(stub)
    elif "torch._dynamo.eval_frame" in sys.modules:
        use_dynamo()
        _not_for_dynamo(stub)
    else:
        _state.stubs.add(stub)


def use_dynamo() -> None:
    """TorchDynamo was imported: mark every stub made so far (and, from now
    on, each new one) as a frame it skips.  ``first_call`` is skipped too,
    and runs the rewrite with Dynamo's frame callback off: a first call made
    by compiled code (at a graph break) would otherwise have Dynamo look at
    every frame of the rewrite (``counters["frames"]`` would count them)."""
    try:
        from torch._dynamo.eval_frame import skip_code  # lazy: 2.7 s
    except Exception:  # another torch: stubs are traced (a graph break at worst)
        return
    _state.dynamo_skip = skip_code
    for stub in list(_state.stubs):
        skip_code(stub)
    _state.stubs.clear()
    try:
        from torch._C._dynamo.eval_frame import set_eval_frame  # lazy: 1.3 s

        skip_code(first_call.__code__)
        _state.set_eval_frame = set_eval_frame
    except Exception:  # another torch: Dynamo looks at the rewrite's frames
        pass


def original_code(code: types.CodeType) -> types.CodeType:
    """The unmodified code a vaccinated code object (or a first-call stub)
    was made from (or itself)."""
    info = info_of(code)
    if info is not None and info.original is not None:
        return info.original
    pending = pending_of(code)
    return pending.original if pending is not None else code


def pending_of(code: Any) -> Pending | None:
    """The ``Pending`` of a first-call stub, or None."""
    if isinstance(code, types.CodeType):
        for const in code.co_consts:
            if type(const) is Pending:
                return const
    return None


def first_call(pending: Pending) -> types.FunctionType:
    """Run by a stub: install the function's vaccinated code and return the
    function (the stub then calls it with its arguments)."""
    frame = sys._getframe(1)
    stub = frame.f_code
    set_eval_frame = _state.set_eval_frame
    prior = set_eval_frame(None) if set_eval_frame is not None else None
    try:
        code = pending.code()

        back, _ = backend()
        func = back.running_function(frame) if back is not None else None
        if func is None:
            func = _the_function(frame, stub)
    finally:
        if set_eval_frame is not None:
            set_eval_frame(prior)
    del frame
    if func.__code__ is stub:
        func.__code__ = code
    return func


def _the_function(frame: types.FrameType, stub: types.CodeType) -> types.FunctionType:
    """The function running ``frame`` when the interpreter frame could not be
    read: every function with this stub gets the new code; the one whose
    closure holds what the frame sees is the one being called."""
    candidates = [f for f in gc.get_referrers(stub)
                  if type(f) is types.FunctionType and f.__code__ is stub]
    if not candidates:
        if stub.co_freevars:
            raise RuntimeError(f"daifu: cannot find the function running {stub.co_qualname}")
        return types.FunctionType(stub, frame.f_globals)  # (every argument is passed)
    if len(candidates) == 1 or not stub.co_freevars:
        return candidates[0]
    seen = frame.f_locals
    for func in candidates:
        cells = func.__closure__ or ()
        if all(_content(c) is seen.get(n, _content(c))
               for n, c in zip(stub.co_freevars, cells)):
            return func
    return candidates[0]


def _content(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:
        return None


def _rewrite(pending: Pending) -> types.CodeType:
    original = pending.original
    try:
        new = _state.rewrite(pending)
    except Exception as exc:  # a daifu bug must not fail the call: run the original
        warnings.warn(f"daifu: {original.co_qualname} ({original.co_filename}:"
                      f"{original.co_firstlineno}) is not vaccinated and runs unmodified: "
                      f"internal error: {type(exc).__name__}: {exc}",
                      NotVaccinatedWarning, stacklevel=4)
        return _with_children(pending)
    return new if new is not None else _with_children(pending)


def _with_children(pending: Pending) -> types.CodeType:
    """The original code, with its nested functions' rewritten code."""
    if not pending.children:
        return pending.original
    swap = {id(p): n for p, n in pending.children}
    return pending.original.replace(
        co_consts=tuple(swap.get(id(c), c) for c in pending.original.co_consts))


def attach(code: types.CodeType, source: Any) -> None:
    """Give every stub inside ``code`` (a module loaded from the cache) the
    ``LoadedFile`` it was compiled from."""
    todo = [code]
    while todo:
        co = todo.pop()
        for const in co.co_consts:
            if type(const) is types.CodeType:
                todo.append(const)
            elif type(const) is Pending:
                const.source = source
