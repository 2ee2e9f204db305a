"""``Crash``: everything a fix needs to know about one intercepted exception."""

from __future__ import annotations

import collections
import functools
import gc
import os
import sys
import types

from .._errors import PatchError
from ..cells import Capabilities, Cell, FrameContext, cell_range, cells_of, read_locals
from ._decision import Resolution
from ._queue import ExecPatch, PatchQueue

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


class Crash(Capabilities):
    """An exception stopped at a crash barrier, with its frame still alive.

    Attributes a rule reads:

    * ``exception`` -- the exception object (its traceback intact);
    * ``function`` (qualname), ``filename``, ``lineno``, ``statement`` (the
      failing statement's source), ``where`` (``file:line``);
    * ``vars`` -- a live, writable mapping of the function's variables;
    * ``globals`` -- the function's module globals;
    * ``attempt`` -- 1 for the first crash at this statement, 2 after one retry...;
    * ``can_retry``/``can_skip``/``can_continue`` and the matching
      ``retry_reason``/``skip_reason``/``continue_reason`` when not possible.

    The engine's own: ``patches`` (the queue), ``execs`` (exec patches
    applied), ``resolution`` (how it ends, ``_decision.Resolution``) and
    ``focus`` (the frame a console looks at: 0 = the crashed one).
    """

    def __init__(self, submit: Callable[[Any, Crash], Any], exc: BaseException, cell: Cell,
                 frame: types.FrameType, lasti: int, stack: tuple, attempt: int,
                 started: float):
        #: the engine's way to apply a patch to this crash now (``Engine.submit``)
        self._submit = submit
        #: patches for this crash (rules, console, attach, replay put them here;
        #: the engine applies them in order while the frame waits)
        self.patches = PatchQueue()
        #: the exec patches applied to this crash (``always`` re-applies them)
        self.execs: list[Any] = []
        #: how this crash ends, built up as patches are applied
        self.resolution = Resolution()
        #: the frame a console (or ``send``) looks at: 0 = the crashed one,
        #: N = its N-th caller (``up``/``down``); kept across consoles
        self.focus = 0
        self._frame: types.FrameType | None = frame
        self.exception = exc
        self.cell = cell
        self.lasti = lasti
        self.attempt = attempt
        self.started = started
        self.function = cell.info.qualname
        self.filename = cell.info.filename
        self.position = _position(frame.f_code, lasti)
        self.statement, self.lineno = cell.describe(self.position)
        self.kind = cell.role
        self.vars = FrameContext(frame)
        self.globals: dict[str, Any] = frame.f_globals
        self.stack = stack
        slot = cell.iterator_slot
        self.iterator = stack[slot] if slot is not None and slot < len(stack) else None
        dead = _dead_iterator(self.iterator)
        #: (replacement loop iterator, what it means): a pass-through wrapper
        #: generator (tqdm) died with the exception; the loop can go on over
        #: the iterator it was reading (``_loaders.rewrap``)
        self.rewrap: tuple[Any, str] | None = None
        if dead is not None and cell.role == "loop-header":
            from ._loaders import rewrap  # lazy: 3.4 ms

            try:
                self.rewrap = rewrap(self.iterator, exc)
            except Exception:  # never let an odd iterator break the crash handling
                self.rewrap = None
            if self.rewrap is not None:
                dead = None
        #: the DataLoader batch whose fetch failed at this loop header
        #: (``_loaders.LoaderFailure``): RETRY fetches it again
        self.batch: Any = None
        header = cell.role == "loop-header"
        if cell.role == "loop-header" and "torch.utils.data.dataloader" in sys.modules:
            from ._loaders import failure  # lazy: 3.4 ms

            try:
                self.batch = failure(exc)
            except Exception:
                self.batch = None
            if self.batch is not None and self.batch.index is None and dead is None:
                dead = (f"the failed batch cannot be fetched again: {self.batch.unknown} "
                        "(next/CONTINUE goes on with the next batch)")
        #: what a retry here may do besides re-executing the statement (said
        #: in the report and in ``crash.resumed``)
        self.retry_note: str | None = None
        #: the vaccinated frames below that passed this exception up unfixed
        #: (``file:line (function)``, innermost first)
        self.passed_through: list[str] = []
        if dead is None and header and self.batch is None and self.rewrap is None:
            dead, self.retry_note = _advanced(exc, frame, self.iterator)
        if dead is None and frame.f_code.co_flags & _CO_GENERATOR and "yield" in cell.source:
            dead = _yielded(cell, frame.f_code, lasti)
        self.retry_reason = cell.retry_reason or dead
        self.skip_reason = cell.skip_reason
        self.continue_reason = cell.continue_reason or (dead if header else None)

    # -- facts ---------------------------------------------------------------

    @property
    def where(self) -> str:
        return f"{self.filename}:{self.lineno}"

    @property
    def frame(self) -> types.FrameType:
        if self._frame is None:
            raise PatchError("this crash has been resolved; its frame is no longer available")
        return self._frame

    def frames(self) -> list[types.FrameType]:
        """The crashed frame, then its callers outward -- daifu's and runpy's
        frames left out (what the console's ``up``/``down``/``bt`` walk)."""
        out = []
        frame: types.FrameType | None = self.frame
        while frame is not None:
            if not is_plumbing(frame.f_code.co_filename):
                out.append(frame)
            frame = frame.f_back
        return out

    def vaccinated_caller(self, level: int) -> int | None:
        """The level of the nearest vaccinated caller of the frame at
        ``level`` in ``frames()`` (library frames between are passed), or None."""
        frames = self.frames()
        for up in range(level + 1, len(frames)):
            if cells_of(frames[up].f_code) is not None:
                return up
        return None

    def frame_at(self, level: int) -> types.FrameType:
        """``frames()[level]``; raises ``PatchError`` when there is none."""
        frames = self.frames()
        if not 0 <= level < len(frames):
            raise PatchError(f"no frame {level}: the crash has {len(frames)} "
                             f"(0 = the crashed frame, {len(frames) - 1} = the outermost)")
        return frames[level]

    # -- actions -------------------------------------------------------------

    def exec(self, code: str) -> None:
        """Run statements in the crashed frame's context.

        Assignments to the function's variables take effect when it resumes;
        new names that are not variables of the function become globals.
        Raises ``PatchError`` if the code does not compile or raises.
        """

        self._submit(ExecPatch(code), self)

    def eval(self, expr: str) -> Any:
        """Evaluate an expression in the crashed frame's context."""
        try:
            compiled = compile(expr, f"<daifu eval at {self.where}>", "eval")
        except SyntaxError as exc:
            raise PatchError(f"expression does not compile: {exc}") from None
        frame = self.frame
        namespace = read_locals(frame)
        # as pdb's: the exception, and a DataLoader worker's own error -- never
        # over a name of the program's, and never written into its namespace
        extra: dict[str, Any] = {"__exception__": self.exception}
        worker = getattr(self.batch, "worker", None)
        if worker is not None:
            extra["__worker__"] = worker
        return eval(compiled, frame.f_globals, collections.ChainMap(
            namespace if self.vars.is_module else dict(namespace), extra))

    def _release(self) -> None:
        self._frame = None
        self.vars = None  # type: ignore[assignment]
        # what was found for the loop header holds the program's objects
        self.batch = self.rewrap = None
        self.resolution.continuation = self.resolution.upward = None

    def __repr__(self) -> str:
        exc = self.exception
        return (f"<Crash {type(exc).__name__}: {exception_text(exc, 60)!r} in {self.function} at "
                f"{self.where} attempt={self.attempt}>")


def always_key(crash: Crash) -> tuple:
    """What ``always`` remembers an answer by: the statement and the exception type."""
    return (crash.filename, crash.lineno, crash.statement, type(crash.exception).__qualname__)


def exception_text(exc: BaseException | None, limit: int = 500, with_type: bool = False,
                   one_line: bool = False) -> str:
    """``str(exc)`` that never raises (a broken ``__str__`` must not break a
    report, log line or journal record), at most ``limit`` characters."""
    if exc is None:
        return ""
    try:
        text = str(exc)
    except Exception:
        text = "<unprintable>"
    if one_line:
        text = " ".join(text.split())
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return f"{type(exc).__qualname__}: {text}" if with_type else text


_PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def is_plumbing(filename: str) -> bool:
    """A frame of daifu's own code or of runpy (hidden from the user's tracebacks)."""
    return (filename.startswith(_PKG + os.sep) or filename.endswith(os.sep + "runpy.py")
            or filename.startswith("<frozen runpy"))


@functools.cache  # (this interpreter's: computed once)
def _library_roots() -> tuple[str, ...]:
    import sysconfig  # lazy: 0.7 ms

    roots = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        try:
            roots.add(os.path.realpath(sysconfig.get_paths()[key]) + os.sep)
        except (KeyError, OSError):
            continue
    for path in sys.path:  # (site-packages of a venv, user site)
        if path.rstrip(os.sep).endswith(("site-packages", "dist-packages")):
            roots.add(os.path.realpath(path) + os.sep)
    return tuple(sorted(roots))


def is_library(frame: types.FrameType) -> bool:
    """A frame of installed code -- the standard library, site-packages
    (torch's ``Module._call_impl``, Lightning's loops, ipykernel, asyncio) --
    that daifu did not vaccinate: collapsed in the report and ``bt``, and
    passed by ``up``/``down``."""

    return _installed(frame.f_code.co_filename) and cells_of(frame.f_code) is None


@functools.lru_cache(maxsize=1024)
def _installed(filename: str) -> bool:
    if filename.startswith("<frozen"):
        return True
    roots = _library_roots()
    return filename.startswith(roots) or os.path.realpath(filename).startswith(roots)


def library_package(filename: str) -> str:
    """``torch``, ``lightning``, ``asyncio``: the top package of an installed file."""
    real = os.path.realpath(filename)
    for root in sorted(_library_roots(), key=len, reverse=True):  # (site-packages inside lib/)
        if real.startswith(root):
            rest = real[len(root):]
            return rest.split(os.sep, 1)[0].removesuffix(".py")
    return os.path.basename(filename)


def _position(code: types.CodeType, lasti: int) -> tuple | None:
    """(line, end line, column, end column) of the instruction at ``lasti``."""
    try:
        for n, pos in enumerate(code.co_positions()):
            if n == lasti:
                return pos
    except Exception:
        pass
    return None


_CO_GENERATOR = 0x20


def _yielded(cell: Cell, code: types.CodeType, lasti: int) -> str | None:
    """Why a retry cannot re-execute a statement that yielded before it
    failed (``total = total + (yield total) + need(1)``): the value sent in
    would be lost, and the generator would yield once more.  None when no
    ``yield`` of the statement had run yet."""
    import dis  # lazy: 1.9 ms

    found = cell_range(cell.info, code, 2 * lasti)
    if found is None:
        return None
    start = found[0]
    if not any(ins.opname == "YIELD_VALUE" and start <= ins.offset < 2 * lasti
               for ins in dis.get_instructions(code)):
        return None
    return ("the statement had already yielded when it failed: re-executing it would yield "
            "again and lose the value sent in (skip it, or fix the code after the yield)")


def _advanced(exc: BaseException, frame: types.FrameType,
              it: Any) -> tuple[str | None, str | None]:
    """(why not, what it may do) for retrying ``next()`` at a loop header
    whose exception came out of Python code the iterator ran (a class's
    ``__next__``, the function ``map`` applies ...): that code may have moved
    the iterator on before it raised, which daifu cannot know.  Vaccinated
    code took the crash first, where its failing statement can be retried or
    its ``raise`` skipped: the header refuses.  Other code (a library's
    iterator) can only be retried from here: allowed, with the risk said.
    (None, None) when ``next()`` ran no Python code (a C iterator)."""

    tb = exc.__traceback__
    while tb is not None and tb.tb_frame is not frame:
        tb = tb.tb_next
    inner = tb.tb_next if tb is not None else None
    if inner is None:
        return None, None
    while inner.tb_next is not None and inner.tb_frame.f_code.co_filename.startswith("<frozen"):
        inner = inner.tb_next
    code = inner.tb_frame.f_code
    ran = (f"next() on the loop's iterator ({type(it).__qualname__}) ran {code.co_qualname} "
           f"({code.co_filename}:{inner.tb_lineno}), which raised")
    if cells_of(code) is not None:
        return (f"{ran} after its crash there was not fixed: it may have moved past the item "
                "it was producing, so calling next() again could skip it. Fix it where it "
                "failed (retry its failing statement, or skip a raise), or go on with the "
                "next item (next/CONTINUE), knowing this one is dropped"), None
    return None, (f"{ran}: if it had moved on before raising, calling next() again skips "
                  "the item it was producing")


def _dead_iterator(it: Any) -> str | None:
    """Why retrying ``next()`` on ``it`` would silently end the loop, or None."""
    if it is None:
        return None
    for obj in _iterator_chain(it):
        if isinstance(obj, types.GeneratorType) and obj.gi_frame is None:
            return (
                f"the loop's iterator is a finished generator ({obj.__qualname__}): it died with "
                "the exception, so retrying next() would silently end the loop. Vaccinate the "
                "generator function (DAIFU_ENTRY) to recover inside it, or skip/abort"
            )
    return None


def _iterator_chain(it: Any, limit: int = 8) -> list[Any]:
    """The iterator and the iterators wrapped by builtin adapters around it
    (``enumerate``, ``zip``, ``map``, ``itertools.*``)."""
    seen: set[int] = set()
    out: list[Any] = []
    todo = [it]
    while todo and len(out) < limit:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        out.append(obj)
        if type(obj).__module__ in ("builtins", "itertools") and not isinstance(
            obj, types.GeneratorType
        ):
            todo.extend(r for r in gc.get_referents(obj) if hasattr(r, "__next__"))
    return out
