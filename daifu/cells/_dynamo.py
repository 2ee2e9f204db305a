"""``torch.compile`` compiles the code python would run, not daifu's.

Every instruction of a vaccinated function sits in an exception-table range
(its cell's barrier).  TorchDynamo reads those ranges as ``try`` blocks, and
a graph break inside a ``try`` block is one it cannot resume from: the whole
function would run eagerly ("Failed to handle graph break gracefully.
Skipping the function and falling back to eager"), silently losing the
speed-up the program compiled for.  Other differences would follow the same
way (a traced ``raise`` would jump into the barrier's stub).

So TorchDynamo is given the *original* code of a vaccinated function to
trace, at the two places where it reads a function's instructions:

* ``convert_frame.compile_frame(code, ...)``: a frame Dynamo converts (the
  function ``torch.compile`` wraps, a function called at a graph break, a
  resume function).  The bytecode it returns -- the graphs, the guards, the
  resume functions of each graph break -- is made from the original code
  and is what python's Dynamo makes.  It runs in place of the frame (the
  frame's own code never starts), exactly as under python: the vaccinated
  code and the original have the same locals, cells and free variables
  (the rewrite only appends instructions and changes the exception table),
  which is what Dynamo's C code copies from the one frame into the other.
  Its cache lives on the frame's code object, the vaccinated one, as
  python's lives on the original: the same recompiles, limits and guards.
* ``InliningInstructionTranslator.__init__(parent, code, ...)``: a function
  inlined into another's graph (a compiled module's vaccinated ``forward``,
  a helper it calls).  Also the first-call stubs of ``--lazy``: Dynamo
  inlines the function's original code instead of tracing ``first_call``.

The compiled code carries no cells: an exception raised inside it (a graph
at run time, the eager code between two graphs, a resume function)
propagates as under python to the nearest vaccinated caller that runs
eagerly -- usually the training loop's ``loss = model(x)`` -- and is taken
there; a retry runs that statement again, and with it the compiled call
(from its start: Dynamo's guards choose the cached graphs again, or
recompile if a fix changed what they guard).  Code Dynamo does not compile
(a frame it skips, a function it cannot trace at all) runs vaccinated.

Both are patched when the program imports ``torch._dynamo.convert_frame``
(``hooks._install``: daifu never imports torch itself), each wrapper checked
against the parameter it replaces.  Where this torch's internals differ the
patch is not made, a warning says so once, and Dynamo traces vaccinated code
as before (a graph break in a vaccinated function runs it eagerly).  Inside
the wrappers, anything unexpected hands Dynamo the code it asked about.
"""

from __future__ import annotations

import sys
import types
import warnings

from .._errors import DaifuWarning
from .._record import field
from .._runtime import RUNTIME, state_record
from ._cell import info_of
from ._lazy import pending_of

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)
if TYPE_CHECKING:
    from typing import Any

_CO_VARARGS, _CO_VARKEYWORDS = 0x04, 0x08


@state_record
class _Patched:
    """What this module did to TorchDynamo (``RUNTIME.parts``)."""

    #: set once the patches are made (or known impossible): patch at most once
    done: bool = False
    #: the functions replaced (name -> the original function), for ``restore``
    replaced: dict[str, Any] = field(default_factory=dict)


_state = RUNTIME.part(__name__, _Patched())


def traced_code(code: Any, frame: bool = False) -> Any:
    """The code TorchDynamo should trace for ``code``: the original of a
    vaccinated code object, or (``frame`` False: inlining) of a first-call
    stub; ``code`` itself otherwise, or where the two would not bind the same
    arguments (and, for a frame, lay out the same locals)."""
    try:
        if type(code) is not types.CodeType:
            return code

        info = info_of(code)  # (armed code too: its original is known)
        original = info.original if info is not None else None
        if original is None and not frame:
            # (a stub's frame is never converted: ``_lazy`` marks it skipped;
            # its locals are not the function's)
            pending = pending_of(code)
            original = pending.original if pending is not None else None
        if original is None or original is code or not _same_signature(code, original):
            return code
        if frame and (code.co_varnames != original.co_varnames
                      or code.co_cellvars != original.co_cellvars
                      or code.co_nlocals != original.co_nlocals):
            return code
        return original
    except Exception:  # never fail a compile: trace what Dynamo asked for
        return code


def _same_signature(a: types.CodeType, b: types.CodeType) -> bool:
    n = (a.co_argcount + a.co_kwonlyargcount + bool(a.co_flags & _CO_VARARGS)
         + bool(a.co_flags & _CO_VARKEYWORDS))
    return (a.co_argcount == b.co_argcount and a.co_posonlyargcount == b.co_posonlyargcount
            and a.co_kwonlyargcount == b.co_kwonlyargcount
            and (a.co_flags ^ b.co_flags) & (_CO_VARARGS | _CO_VARKEYWORDS) == 0
            and a.co_varnames[:n] == b.co_varnames[:n] and a.co_freevars == b.co_freevars)


def trace_original() -> bool:
    """``torch._dynamo.convert_frame`` was imported: make Dynamo trace the
    original code of vaccinated functions (see the module's docstring).
    True if patched (now or before); False, with a warning, if this torch's
    Dynamo is not the one these patches were written for."""
    if _state.done:
        return bool(_state.replaced)
    _state.done = True
    convert: Any = sys.modules.get("torch._dynamo.convert_frame")
    symbolic = sys.modules.get("torch._dynamo.symbolic_convert")
    try:
        compile_frame = getattr(convert, "compile_frame", None)
        inliner: Any = getattr(symbolic, "InliningInstructionTranslator", None)
        init = inliner.__dict__.get("__init__") if isinstance(inliner, type) else None
        if getattr(compile_frame, "__daifu_traces_original__", False):
            return True  # (by a copy of this module: daifu imported anew)
        problem = (_first_params(compile_frame, ["code"]) if convert is not None
                   else "torch._dynamo.convert_frame is not imported") or \
            _first_params(init, ["self", "parent", "code"])
    except Exception as exc:  # pragma: no cover - a torch too different to inspect
        problem = f"{type(exc).__name__}: {exc}"
    if problem:
        warnings.warn("daifu: torch.compile traces vaccinated functions with daifu's "
                      "barriers (a graph break in one runs the whole function eagerly): "
                      f"this torch's TorchDynamo is not the one daifu knows ({problem})",
                      DaifuWarning, stacklevel=2)
        return False

    def compile_original(code, *args, **kwargs):
        return compile_frame(traced_code(code, frame=True), *args, **kwargs)

    def init_original(self, parent, code, *args, **kwargs):
        return init(self, parent, traced_code(code), *args, **kwargs)

    _state.replaced["compile_frame"], _state.replaced["__init__"] = compile_frame, init
    convert.compile_frame = _like(compile_original, compile_frame)
    inliner.__init__ = _like(init_original, init)
    return True


def _like(wrapper: Any, wrapped: Any) -> Any:
    """``wrapper``, named and documented as ``wrapped`` (Dynamo's logs name it)."""
    wrapper.__name__, wrapper.__qualname__ = wrapped.__name__, wrapped.__qualname__
    wrapper.__doc__, wrapper.__wrapped__ = wrapped.__doc__, wrapped
    wrapper.__daifu_traces_original__ = True
    return wrapper


def _first_params(fn: Any, names: list[str]) -> str:
    """'' if ``fn`` is a plain function whose first parameters are ``names``
    (positional), else what is wrong."""
    import inspect  # lazy: 7.3 ms

    if type(fn) is not types.FunctionType:
        return f"no function where {names[-1]!r} is read"
    params = list(inspect.signature(fn).parameters.values())[:len(names)]
    ok = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if ok != names:
        return f"{fn.__qualname__}{inspect.signature(fn)} does not take {', '.join(names)} first"
    return ""


def restore() -> None:
    """Undo ``trace_original`` (tests)."""
    convert = sys.modules.get("torch._dynamo.convert_frame")
    symbolic = sys.modules.get("torch._dynamo.symbolic_convert")
    if "compile_frame" in _state.replaced and convert is not None:
        convert.compile_frame = _state.replaced.pop("compile_frame")  # type: ignore[attr-defined]
    if "__init__" in _state.replaced and symbolic is not None:
        symbolic.InliningInstructionTranslator.__init__ = _state.replaced.pop("__init__")
    _state.replaced.clear()
    _state.done = False
