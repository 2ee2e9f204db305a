"""The resume point: the training state as it was at the start of the
iteration a checkpoint resumes, kept as the job runs, and ``daifu.resume``.

A crash happens in the middle of an iteration: the failed step has already
drawn random numbers (dropout, augmentation, ``random.random()`` in a
``Dataset``) and taken its batch from the ``DataLoader``.  Saving the RNG
as it is at the crash resumes into a different run.  What an exact resume
needs is the state at the last *consistent point*: a training-loop header
reached after an optimizer step returned.

* **The optimizer step.**  torch's global step hook
  (``register_optimizer_step_post_hook``) marks each ``optimizer.step()``
  (a ``GradScaler``'s, Lightning's and the HF Trainer's included), whatever
  the loop around it is (``for``, ``while``, ``while True`` with a
  ``break``, in a function or at module level, vaccinated or not).  The RNG
  states are kept there.  A nanoGPT-style gradient-accumulation loop steps
  once per outer iteration: its micro-steps are never a resume point.
* **The header.**  A loop over a ``DataLoader`` reaches its header when it
  asks for the next batch: the first ``__next__`` after a step keeps the
  RNG states again (what the program drew between the step and the header,
  and the new epoch's loader, are then part of the resumed state) together
  with how many batches each live loader iterator has handed out.
* **The loader.**  When an iterator is made, the torch RNG and the loader's
  and sampler's generators are kept as they were just before (what its
  shuffle order and worker seeds are drawn from).  ``daifu.resume(...,
  loader=...)`` arms the loader: its next ``iter()`` is made from those
  states, skips the batches already taken (by index, without loading them,
  for a map-style dataset in the main process; by loading them, so that each
  worker's RNG goes through the same draws, with workers or an iterable
  dataset), then puts the RNG back to the resume point.

What is kept costs a few microseconds per optimizer step: python's
``random`` and numpy's global state are copied as raw bytes (one
``memmove`` each; numpy's full state is asked for only when those bytes
changed), torch's CPU state with ``get_state()``.  Nothing of this runs
without torch, with ``--no-checkpoint``, or before the program imports
``torch.optim`` / ``torch.utils.data``.
"""

from __future__ import annotations

import array
import os
import random
import sys
import types
import weakref

from ..._record import field
from ..._runtime import RUNTIME, state_record
from ..._version import __version__
from ...cells import original_code, read_locals
from .._job import placeholders
from ._sharded import MARK, ShardError
from ._sharded import load as load_shards

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)
if TYPE_CHECKING:
    from typing import Any


_N = 624  # Mersenne Twister words


#: the format of a preempted job's manifest (``persist/_preempt`` writes it)
MANIFEST_FORMAT = 1


class ResumeError(Exception):
    """A checkpoint cannot be resumed into these objects (the message says
    what does not match)."""


class _RawMT:
    """A Mersenne Twister state read as raw bytes where it lies (one copy
    through a ctypes view: ~0.2 us, where ``random.getstate()`` builds 625
    ints, ~9 us), checked once against the state the object itself reports.
    The view holds its owner: the memory it reads stays that object's."""

    def __init__(self, owner: Any, address: int, size: int) -> None:
        import ctypes  # lazy: 1.9 ms

        self.owner = owner
        self._view = (ctypes.c_char * size).from_address(address)

    def read(self) -> bytes:
        return self._view.raw


def _python_reader() -> _RawMT | None:
    """``random._inst``'s state (CPython's ``RandomObject``: the object
    header, ``int index``, ``uint32_t state[624]``), or None where the bytes
    do not say what ``getstate()`` says (another layout: ``getstate()`` then)."""
    try:
        inst: Any = random._inst
        reader = _RawMT(inst, id(inst) + object.__basicsize__, 4 + 4 * _N)
        if _python_state(reader.read(), inst.gauss_next) != inst.getstate():
            return None
        return reader
    except Exception:
        return None


def _python_state(raw: bytes, gauss_next: Any) -> tuple:
    index = int.from_bytes(raw[:4], sys.byteorder, signed=True)
    words = array.array("I")
    words.frombytes(raw[4:])
    return (3, tuple(words) + (index,), gauss_next)


def _numpy_reader(numpy: Any) -> _RawMT | None:
    """numpy's global MT19937 (key and position) as raw bytes: a cheap
    test of "did the program draw from numpy since?" -- the full state
    (``get_state()``, ~50 us) is asked for only then."""
    try:
        state = numpy.random.mtrand._rand
        return _RawMT(state, state._bit_generator.ctypes.state_address, 4 * _N + 4)
    except Exception:
        return None


class Keeper:
    """What the resume point needs, kept at each optimizer step and at the
    next loader header (one per process: ``KEEPER``)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        #: optimizer steps since the process started (counted on from the
        #: checkpoint's after ``resume``)
        self.steps = 0
        #: optimizer steps this process has taken (when to look for generators)
        self._taken = 0
        #: a step came, no header since (at the start too: the first header
        #: of the first iteration is a resume point)
        self._stepped = True
        #: the RNG states at the resume point, raw (``rng()`` formats them)
        self._rng: dict[str, Any] | None = None
        #: where it was kept: "optimizer-step" or "loader-header"
        self.at: str | None = None
        #: id(iterator) -> what it was made from (``_Made``), for the live
        #: loader iterators
        self._iters: dict[int, _Made] = {}
        #: at the resume point: (loader's weakref, batches handed out, the
        #: states its epoch was made from, the list of the epochs before
        #: (persistent workers: it only grows) and how many of them there
        #: were, a ``StatefulDataLoader``'s own ``state_dict()`` or None)
        self._loaders: list[tuple[Any, int, dict[str, Any], list, int, Any]] = []
        #: where the program called ``optimizer.step()`` (``_caller``)
        self._site: tuple[tuple[Any, int], ...] = ()
        self._py: Any = False  # (a _RawMT, None, or False: not looked for yet)
        self._np: Any = False
        self._np_raw: bytes | None = None
        self._np_state: Any = None
        #: the program's own generators (``_Own``), by where it holds them
        self._own: dict[str, _Own] = {}
        #: their states at the resume point
        self._own_states: dict[str, Any] = {}

    # -- keeping ---------------------------------------------------------------

    def _keep_rng(self) -> dict[str, Any]:
        torch = sys.modules["torch"]
        py = self._py
        if py is False or (py and py.owner is not random._inst):
            py = self._py = _python_reader()
        out: dict[str, Any] = {
            "python": (py.read(), random._inst.gauss_next) if py  # type: ignore[attr-defined]
            else random.getstate(),
            "torch": torch.get_rng_state(),
        }
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            if self._np is False or (self._np and self._np.owner is not numpy.random.mtrand._rand):
                self._np = _numpy_reader(numpy)
            raw = self._np.read() if self._np else None
            if raw is None or raw != self._np_raw:
                try:
                    self._np_state = numpy.random.get_state()
                except Exception:
                    self._np_state = None
                self._np_raw = raw
            if self._np_state is not None:
                out["numpy"] = self._np_state
        cuda = getattr(torch, "cuda", None)
        try:
            if cuda is not None and cuda.is_initialized():
                out["cuda"] = cuda.get_rng_state_all()
        except Exception:
            pass
        return out

    def _keep_loaders(self) -> None:
        self._loaders = [(made.loader, it._num_yielded, made.made, made.epochs,
                          len(made.epochs), _own_state(it) if made.own else None)
                         for made in self._iters.values() if (it := made.it()) is not None]

    def _keep_own(self) -> None:
        states = {}
        for name, own in list(self._own.items()):
            try:
                states[name] = own.state()
            except Exception:  # (gone, or it cannot say: not kept)
                del self._own[name]
        self._own_states = states

    def on_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """torch's global optimizer step post hook."""
        try:
            self.steps += 1
            self._stepped = True
            self._rng = self._keep_rng()
            self.at = "optimizer-step"
            self._keep_loaders()
            self._site = _caller()
            self._taken += 1
            if self._taken <= 2 or self._taken % _FIND_EVERY == 0:
                self._find_own()
            if self._own:
                self._keep_own()
        except Exception:  # (never the program's step)
            pass

    def _find_own(self) -> None:
        """The generators the program holds itself (``_own_generators``),
        looked for at the first steps and every ``_FIND_EVERY`` after."""

        scopes: list[dict[str, Any]] = []
        frame: Any = sys._getframe(2)
        while frame is not None:
            code = frame.f_code
            known = _library.get(id(code))
            if known is None or not known[1]:
                try:
                    scopes.append(read_locals(frame))
                except Exception:
                    pass
            frame = frame.f_back
        main = sys.modules.get("__main__")
        if main is not None:
            scopes.append(dict(vars(main)))
        self._own = _own_generators(reversed(scopes), self._own)

    def on_header(self, it: Any) -> None:
        """The first ``__next__`` of a loader iterator after a step."""
        try:
            self._rng = self._keep_rng()
            self.at = "loader-header"
            self._keep_loaders()
        except Exception:
            pass

    def generators(self) -> dict[str, Any]:
        """The program's own generators' states at the resume point, by name
        (as their own ``getstate``/``get_state``/``state`` say them)."""
        return {name: _python_state(state[1], state[2])
                if isinstance(state, tuple) and state and state[0] == "raw" else state
                for name, state in self._own_states.items()}

    def on_made(self, it: Any, loader: Any, made: dict[str, Any]) -> None:
        try:
            key = id(it)
            iters = self._iters

            def gone(_: Any) -> None:
                iters.pop(key, None)

            # (a ``StatefulDataLoader``'s with workers: its ``state_dict()``
            # comes from the snapshots the workers already sent, ~1 us)
            own = getattr(loader, "num_workers", 0) > 0 and _is_stateful(loader)
            iters[key] = _Made(weakref.ref(it, gone), weakref.ref(loader), made, own)
        except TypeError:
            pass

    def on_reset(self, it: Any, loader: Any) -> None:
        """A persistent-workers iterator starts its next epoch (``_reset``):
        the epoch that ends is kept, the new one's states taken."""
        known = self._iters.get(id(it))
        if known is None or known.it() is not it:
            return
        try:
            made = _states(loader)
        except Exception:  # (this loader is no longer kept)
            del self._iters[id(it)]
            return
        known.epochs.append((known.made, it._num_yielded))
        known.made = made

    # -- what the checkpoint gets ----------------------------------------------

    def rng(self) -> dict[str, Any] | None:
        """The RNG states at the resume point, as ``restore_rng`` takes them."""
        rng = self._rng
        if rng is None:
            return None
        out = dict(rng)
        if self._py and isinstance(rng["python"][0], bytes):
            out["python"] = _python_state(*rng["python"])
        return out

    def loader_state(self, loader: Any) -> dict[str, Any] | None:
        """``{"batches": n, "made": states, "workers": w}`` for ``loader`` at
        the resume point (None: it was not being iterated then); its last
        iterator's where it had several.  With ``"epochs"`` (a list of
        ``{"made", "batches"}``) where persistent workers went through
        earlier epochs, and a ``StatefulDataLoader``'s own ``"state_dict"``
        at that point."""
        out = None
        for ref, batches, made, every, count, own in self._loaders:
            if ref() is loader:
                epochs = every[:count]
                out = {"batches": batches, "made": made,
                       "workers": getattr(loader, "num_workers", 0)}
                if epochs:
                    out["epochs"] = [{"made": m, "batches": n} for m, n in epochs]
                if own is None and _is_stateful(loader) and not epochs:
                    own = _stateful_state(loader, made, batches)
                if own is not None:
                    out["state_dict"] = own
        return out

    def loop(self) -> dict[str, Any] | None:
        """The training-step loop: the innermost loop around the call of
        ``optimizer.step()`` (its file, function and header line) and the
        steps taken."""
        if not self._site:
            return None
        found = _training_loop(self._site)
        if found is None:
            return {"file": None, "function": None, "line": None, "steps": self.steps}
        code, line, _ = found
        return {"file": code.co_filename, "function": code.co_qualname, "line": line,
                "steps": self.steps}

    def loop_target(self) -> tuple[Any, set[int]] | None:
        """The training-step loop's original code and its header line (a
        line event there each iteration, ``while True:`` included), once a
        step was taken."""
        found = _training_loop(self._site) if self._site else None
        if found is None:
            return None
        code, header, _ = found
        return code, {header}


#: steps between two looks for the program's own generators
_FIND_EVERY = 4096


class _Made:
    """A live loader iterator, and the states its epochs were made from."""

    __slots__ = ("it", "loader", "made", "epochs", "own")

    def __init__(self, it: Any, loader: Any, made: dict[str, Any], own: bool) -> None:
        self.it = it  # (weakrefs, to the iterator and its loader)
        self.loader = loader
        #: the states the current epoch was drawn from
        self.made = made
        #: the epochs before, with persistent workers: (states, batches taken)
        self.epochs: list[tuple[dict[str, Any], int]] = []
        #: a ``StatefulDataLoader`` with workers: its own ``state_dict()`` is
        #: kept at the resume point
        self.own = own


class _Own:
    """One generator the program holds (a ``random.Random``, a numpy
    ``Generator`` or ``RandomState``, a ``torch.Generator``): its state,
    cheaply, as ``restore`` sets it back."""

    def __init__(self, gen: Any, kind: str) -> None:
        self.gen, self.kind = gen, kind
        self._raw: Any = None
        self._raw_bytes: bytes | None = None
        self._full: Any = None
        if kind == "random":
            raw = _RawMT(gen, id(gen) + object.__basicsize__, 4 + 4 * _N)
            if _python_state(raw.read(), gen.gauss_next) == gen.getstate():
                self._raw = raw
        elif kind == "randomstate":
            try:
                self._raw = _RawMT(gen, gen._bit_generator.ctypes.state_address, 4 * _N + 4)
            except Exception:
                self._raw = None

    def state(self) -> Any:
        gen, kind = self.gen, self.kind
        if kind == "random":
            return ("raw", self._raw.read(), gen.gauss_next) if self._raw else gen.getstate()
        if kind == "generator":
            return gen.bit_generator.state
        if kind == "torch":
            return gen.get_state()
        raw = self._raw.read() if self._raw else None  # randomstate: ~50 us when it moved
        if raw is None or raw != self._raw_bytes:
            self._full, self._raw_bytes = gen.get_state(), raw
        return self._full


def _generator_types() -> tuple[type, ...]:
    """The classes ``_own_kind`` knows, for one ``isinstance`` per value."""
    out: list[type] = [random.Random]
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        out += [numpy.random.Generator, numpy.random.RandomState]
    torch = sys.modules.get("torch")
    if torch is not None:
        out.append(torch.Generator)
    return tuple(t for t in out if isinstance(t, type))


def _own_kind(value: Any) -> str | None:
    if isinstance(value, random.Random):
        return None if value is getattr(random, "_inst", None) else "random"
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        nprandom = numpy.random
        if isinstance(value, nprandom.Generator):
            return "generator"
        if isinstance(value, nprandom.RandomState):
            return None if value is nprandom.mtrand._rand else "randomstate"
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Generator):
        return None if value is torch.default_generator else "torch"
    return None


def _own_generators(scopes: Any, known: dict[str, _Own]) -> dict[str, _Own]:
    """``name -> _Own`` for the generators in ``scopes`` (outermost first)
    and one attribute below their objects (``env._np_random``,
    ``dataset.rng``); a generator once, under the first name it is found by.
    A loader's and its sampler's generators are the loader's (not here)."""
    found: dict[str, _Own] = {}
    seen: set[int] = set()
    by_id = {id(own.gen): own for own in known.values()}

    generators = _generator_types()

    def take(name: str, value: Any) -> None:
        if not isinstance(value, generators):  # (the commonest answer, in one call)
            return
        kind = _own_kind(value)
        if kind is None or id(value) in seen:
            return
        seen.add(id(value))
        own = by_id.get(id(value))
        if own is None or own.gen is not value:
            try:
                own = _Own(value, kind)
                own.state()
            except Exception:  # (a SystemRandom has no state to keep)
                return
        found[name] = own

    torch = sys.modules.get("torch")
    data = getattr(getattr(torch, "utils", None), "data", None)
    skip = tuple(t for t in (getattr(data, "DataLoader", None), getattr(data, "Sampler", None))
                 if isinstance(t, type))
    for names in scopes:
        for name, value in list(names.items())[:500]:
            if name.startswith("__") or isinstance(value, (type, types.ModuleType)):
                continue
            take(name, value)
            if skip and isinstance(value, skip):
                continue
            try:
                attrs = vars(value)
            except TypeError:
                continue
            if not isinstance(attrs, dict):
                continue
            for attr, inner in list(attrs.items())[:200]:
                if not attr.startswith("__"):
                    take(f"{name}.{attr}", inner)
    return found


def _set_own(gen: Any, state: Any) -> None:
    kind = _own_kind(gen)
    if kind == "random":
        gen.setstate(state)
    elif kind == "generator":
        gen.bit_generator.state = state
    elif kind == "torch":
        gen.set_state(state)
    elif kind == "randomstate":
        gen.set_state(state)
    else:
        raise TypeError(f"not a generator daifu keeps: {type(gen).__name__}")


KEEPER = Keeper()


def _caller() -> tuple[tuple[Any, int], ...]:
    """Where the program called ``optimizer.step()``: its frames (code,
    instruction) from the caller outwards, torch's and the frameworks' left
    out."""
    out: list[tuple[Any, int]] = []
    frame: Any = sys._getframe(2)
    library = _library
    while frame is not None and len(out) < 16:
        if len(out) == 1 and KEEPER._site[:1] == tuple(out):
            return KEEPER._site  # (called from where it was last time: the same loop)
        code = frame.f_code
        known = library.get(id(code))  # (a code object's hash reads all of it)
        if known is None or known[0] is not code:
            known = library[id(code)] = (code, any(part in code.co_filename
                                                   for part in _LIBRARIES))
        if not known[1]:
            out.append((code, frame.f_lasti))
        frame = frame.f_back
    return tuple(out)


#: id(code) -> (code, is it torch's or a framework's?) (``_caller``)
_library: dict[int, tuple[Any, bool]] = {}
_LIBRARIES = ("/torch/", "/lightning/", "/pytorch_lightning/", "/transformers/",
              "/accelerate/", "/daifu/")


def _training_loop(site: tuple[tuple[Any, int], ...]) -> tuple[Any, int, int] | None:
    """The innermost loop (of the original code) around the call of
    ``optimizer.step()``, from the caller outwards: (code, header line, its
    body's first line)."""
    import dis  # lazy: 1.9 ms

    for code, lasti in site:
        line = None
        for start, end, lineno in code.co_lines():
            if start <= lasti < end:
                line = lineno
                break
        if line is None:
            continue
        orig = original_code(code)
        lines: dict[int, int | None] = {}
        current = None
        best = None
        for ins in dis.get_instructions(orig):
            if ins.positions is not None and ins.positions.lineno is not None:
                current = ins.positions.lineno
            lines[ins.offset] = current
            if "BACKWARD" in ins.opname and isinstance(ins.argval, int):
                # (a ``while`` loop's condition, repeated at its end, has
                # the ``while`` line: the body's lines are the span's)
                span = [n for at, n in lines.items() if at >= ins.argval and n is not None]
                first = lines.get(ins.argval)
                if first is not None and span and min(span) <= line <= max(span) \
                        and (best is None or first > best):
                    best = first
        if best is not None:
            return orig, *_header_lines(orig, line, best)
    return None


def _header_lines(code: Any, line: int, first: int) -> tuple[int, int]:
    """The ``for``/``while`` line of the innermost loop around ``line`` in
    ``code``'s source, and its body's first line (the bytecode knows the
    loop's first line only: a ``while`` jumps back to its body); else
    ``first`` for both."""
    import ast  # lazy: 1.3 ms
    import linecache  # lazy: 1.8 ms

    try:
        tree = ast.parse("".join(linecache.getlines(code.co_filename)))
    except (SyntaxError, ValueError):
        return first, first
    best: Any = None
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.While, ast.AsyncFor)) \
                and node.lineno <= first and line <= (node.end_lineno or 0) \
                and node.lineno >= code.co_firstlineno \
                and (best is None or node.lineno > best.lineno):
            best = node
    if best is None:
        return first, first
    return best.lineno, best.body[0].lineno


# -- the hooks ---------------------------------------------------------------------------

@state_record
class _Hooked:
    """What this module did to torch's classes (``RUNTIME.parts``)."""

    #: the hooks installed ("steps", "loaders", "stateful"; once per process)
    installed: set[str] = field(default_factory=set)
    #: the loader classes whose ``_get_iterator`` is kept -> the original
    made_by: dict[type, Any] = field(default_factory=dict)


_state = RUNTIME.part(__name__, _Hooked())


def keep_steps(module: Any = None) -> None:
    """Once ``torch.optim.optimizer`` is imported: its global step hook."""
    if "steps" in _state.installed:
        return
    if module is None:
        import torch.optim.optimizer as module  # lazy: 1.3 s
    register = getattr(module, "register_optimizer_step_post_hook", None)
    if register is None:
        return
    register(KEEPER.on_step)
    _state.installed.add("steps")


def keep_loaders(module: Any = None) -> None:
    """Once ``torch.utils.data.dataloader`` is imported: the states a new
    iterator (or a persistent-workers iterator's next epoch) is made from,
    the first batch asked for after a step, and an armed loader's resume."""
    if "loaders" in _state.installed:
        return
    if module is None:
        import torch.utils.data.dataloader as module  # lazy: 1.4 s
    loader_cls = getattr(module, "DataLoader", None)
    base = getattr(module, "_BaseDataLoaderIter", None)
    if loader_cls is None or base is None or "__next__" not in base.__dict__ \
            or "_reset" not in base.__dict__:
        return
    next_ = base.__next__
    reset = base._reset

    def __next__(self):
        if not KEEPER._stepped:
            return next_(self)
        # the loop's header, after a step: kept; again at the next one until
        # a batch comes (an epoch's end: the next epoch's first batch is it)
        KEEPER.on_header(self)
        item = next_(self)
        KEEPER._stepped = False
        return item

    def _reset(self, loader, first_iter=False):
        if not first_iter:  # (persistent workers: the same iterator's next epoch)
            try:
                KEEPER.on_reset(self, loader)
            except Exception:  # (never the program's loop)
                pass
        return reset(self, loader, first_iter)

    __next__.__qualname__ = f"{base.__qualname__}.__next__"
    _reset.__qualname__ = f"{base.__qualname__}._reset"
    __next__._daifu = _reset._daifu = True  # type: ignore[attr-defined]
    _keep_iterators(loader_cls)
    base.__next__ = __next__
    base._reset = _reset
    _state.installed.add("loaders")


def keep_stateful_loaders(module: Any = None) -> None:
    """Once torchdata's ``StatefulDataLoader`` is imported: its iterators
    are kept as a ``DataLoader``'s (it makes its own)."""
    if "stateful" in _state.installed:
        return
    if module is None:
        import torchdata.stateful_dataloader.stateful_dataloader as module  # type: ignore[no-redef]  # lazy: 2.9 ms
    keep_loaders()
    loader_cls = getattr(module, "StatefulDataLoader", None)
    if isinstance(loader_cls, type) and "_get_iterator" in loader_cls.__dict__:
        _keep_iterators(loader_cls)
    _state.installed.add("stateful")


def _keep_iterators(loader_cls: type) -> None:
    get_iterator = loader_cls._get_iterator  # type: ignore[attr-defined]

    def _get_iterator(self):
        armed = self.__dict__.pop("_daifu_resume", None)
        if armed is not None:
            return _resumed_iterator(self, get_iterator, armed)
        try:
            made = _states(self)
        except Exception:  # (never the program's loop: this loader is not kept)
            return get_iterator(self)
        it = get_iterator(self)
        KEEPER.on_made(it, self, made)
        return it

    _get_iterator.__qualname__ = f"{loader_cls.__qualname__}._get_iterator"
    _get_iterator._daifu = True  # type: ignore[attr-defined]
    _state.made_by[loader_cls] = get_iterator
    loader_cls._get_iterator = _get_iterator  # type: ignore[attr-defined]


def _own_state(it: Any) -> Any:
    try:
        return it.state_dict()
    except Exception:  # (not kept: the checkpoint goes without it)
        return None


def _is_stateful(loader: Any) -> bool:
    """A loader with its own ``state_dict`` (torchdata's ``StatefulDataLoader``)."""
    return callable(getattr(loader, "state_dict", None)) \
        and callable(getattr(loader, "load_state_dict", None))


def _stateful_state(loader: Any, made: dict[str, Any], batches: int) -> Any:
    """A main-process ``StatefulDataLoader``'s own ``state_dict()`` at the
    resume point: that of an iterator made again from the same states with
    the same batches taken by index (nothing loaded); None where that
    cannot be had (its own ``state_dict()`` there costs ~65 us a batch)."""
    get_iterator = _state.made_by.get(type(loader))
    dataset = getattr(loader, "dataset", None)
    torch = sys.modules["torch"]
    if get_iterator is None or isinstance(dataset, torch.utils.data.IterableDataset):
        return None
    before = _states(loader)
    held = loader.__dict__.get("next_iter_state")
    try:
        loader.__dict__["next_iter_state"] = None
        _set_states(loader, made)
        it = get_iterator(loader)
        for _ in range(batches):
            it._next_index()
        it._num_yielded = batches
        return it.state_dict()
    except Exception:
        return None
    finally:
        loader.__dict__["next_iter_state"] = held
        _set_states(loader, before)


def _states(loader: Any) -> dict[str, Any]:
    """What a new iterator of ``loader`` draws from: torch's RNG, the
    loader's and its sampler's generators."""
    torch = sys.modules["torch"]
    made: dict[str, Any] = {"torch": torch.default_generator.get_state()}
    for key, owner in (("generator", loader), ("sampler_generator", _sampler(loader))):
        gen = getattr(owner, "generator", None)
        if isinstance(gen, torch.Generator):
            made[key] = gen.get_state()
    return made


def _sampler(loader: Any) -> Any:
    sampler = getattr(loader, "sampler", None)
    batch_sampler = getattr(loader, "batch_sampler", None)
    if batch_sampler is not None and getattr(batch_sampler, "sampler", None) is not None:
        sampler = batch_sampler.sampler
    return sampler


def _set_states(loader: Any, made: dict[str, Any]) -> None:
    torch = sys.modules["torch"]
    torch.default_generator.set_state(made["torch"])
    for key, owner in (("generator", loader), ("sampler_generator", _sampler(loader))):
        gen = getattr(owner, "generator", None)
        if key in made and isinstance(gen, torch.Generator):
            gen.set_state(made[key])


def _resumed_iterator(loader: Any, get_iterator: Any, armed: dict[str, Any]) -> Any:
    """The iterator ``loader`` had at the resume point: made from the same
    states, the batches it had handed out taken again (not loaded where that
    is safe), and the RNG put back as it is now (the resume point's).  With
    persistent workers, each epoch before is gone through again, from its
    own states, so that each worker's RNG is where it was."""
    torch = sys.modules["torch"]
    now = {"torch": torch.default_generator.get_state(), "python": random.getstate()}
    numpy: Any = sys.modules.get("numpy")
    if numpy is not None:
        now["numpy"] = numpy.random.get_state()
    epochs = [*armed.get("epochs", ()), {"made": armed["made"],
                                        "batches": int(armed.get("batches", 0))}]
    try:
        first = epochs[0]["made"]
        _set_states(loader, first)
        it = get_iterator(loader)
        KEEPER.on_made(it, loader, first)
        dataset = getattr(loader, "dataset", None)
        iterable = isinstance(dataset, torch.utils.data.IterableDataset)
        by_index = not iterable and getattr(loader, "num_workers", 0) == 0 \
            and hasattr(it, "_next_index")
        for n, epoch in enumerate(epochs):
            if n:  # (the ``_reset`` kept: the history is made again as it was)
                _set_states(loader, epoch["made"])
                it._reset(loader)
            skip = int(epoch["batches"])
            if by_index:
                for _ in range(skip):
                    it._next_index()  # (the sampler's order, nothing loaded)
                it._num_yielded = skip
            else:
                for _ in range(skip):
                    next(it)  # (each worker loads what it loaded before: its RNG follows)
    finally:
        KEEPER._stepped = True  # (the skipped batches' headers were not the program's)
        torch.default_generator.set_state(now["torch"])
        random.setstate(now["python"])
        if "numpy" in now:
            numpy.random.set_state(now["numpy"])
    return it


# -- daifu.resume ------------------------------------------------------------------------

_KINDS = ("modules", "optimizers", "schedulers", "scalers")


def resume(path: str, map_location: Any = None, **objects: Any) -> dict[str, Any]:
    """Restore a checkpoint daifu wrote into the running program; returns
    the position to go on from (see ``daifu.resume``)."""
    from ._checkpoint import FORMAT, load_checkpoint, restore_rng  # lazy: 9.5 ms

    if os.fspath(path).endswith("-manifest.json"):  # a preempted job's: this rank's file
        path = _rank_file(os.fspath(path))
    try:
        ck = load_checkpoint(path, map_location=map_location)
    except FileNotFoundError:
        raise ResumeError(f"no checkpoint at {path}") from None
    if not isinstance(ck, dict) or "rng" not in ck or not any(k in ck for k in _KINDS):
        raise ResumeError(f"{path} is not a checkpoint daifu wrote")
    _readable(path, ck, "checkpoint", FORMAT)
    if not objects:
        objects = _by_saved_names(ck, sys._getframe(2))
    torch = sys.modules.get("torch")
    loader_cls = torch.utils.data.DataLoader if torch is not None else None
    plan: list[tuple[str, Any, Any]] = []
    sharded: dict[str, dict[str, Any]] = {}
    generators = ck.get("generators") or {}
    for name, obj in objects.items():
        if obj is None:
            continue
        plan += _generators_under(name, obj, generators)
        if _own_kind(obj) is not None or any(k.startswith(name + ".") for k in generators):
            continue
        if loader_cls is not None and isinstance(obj, loader_cls):
            entry = _pick(ck.get("loaders") or {}, name, "loaders", path)
            plan.append(("loader", obj, entry))
            continue
        kind = _kind(obj, torch)
        if kind is None:
            raise ResumeError(f"{name}={type(obj).__name__}: daifu restores modules, "
                              "optimizers, LR schedulers, GradScalers, DataLoaders and "
                              "the generators the checkpoint holds (none under this name)")
        saved_name = _pick_name(ck.get(kind) or {}, name, kind, path)
        state = (ck.get(kind) or {}).get(saved_name)
        if isinstance(state, dict) and MARK in state:  # (in the job's DCP directory)
            sharded.setdefault(kind, {})[saved_name] = obj
            continue
        if state is None:
            raise ResumeError(f"{name}: its state_dict() failed when {path} was saved: "
                              "nothing to restore it from")
        plan.append((kind, obj, state))
    # (every object checked before any is changed: a mismatch changes nothing;
    # but DCP fills the sharded ones in place: a failure there can leave
    # them half set)
    if sharded:
        _load_sharded(ck, path, sharded)
    for kind, obj, state in plan:
        if kind in ("loader", "generator"):
            continue
        try:
            obj.load_state_dict(state)
        except Exception as exc:
            raise ResumeError(f"{type(obj).__name__}.load_state_dict() refused the saved "
                              f"{kind[:-1]}: {type(exc).__name__}: {exc}".split("\n")[0]) \
                from exc
    keep_loaders()  # (plain python too: the armed loader needs its hook)
    stateful = sys.modules.get("torchdata.stateful_dataloader.stateful_dataloader")
    if stateful is not None:
        keep_stateful_loaders(stateful)
    restore_rng(ck)
    for kind, obj, entry in plan:
        if kind == "loader" and entry.get("batches") is not None:
            obj.__dict__["_daifu_resume"] = entry
        elif kind == "generator":
            _set_own(obj, entry)
    KEEPER.steps = int((ck.get("loop") or {}).get("steps") or 0)
    KEEPER._stepped = True  # (the first header from here is a resume point)
    position = dict(ck.get("position") or {})
    return position


def _generators_under(name: str, obj: Any, generators: dict[str, Any]) -> list[tuple]:
    """The generators the checkpoint holds under ``name`` or below it (``env``
    -> ``env._np_random``), to set on the objects found there."""
    out: list[tuple] = []
    for saved, state in generators.items():
        if saved == name or saved.startswith(name + "."):
            gen = obj
            for attr in saved[len(name) + 1:].split(".") if saved != name else ():
                gen = getattr(gen, attr, None)
            if _own_kind(gen) is None:
                raise ResumeError(f"{saved}: the checkpoint holds a generator there, "
                                  f"this program holds {type(gen).__name__}")
            out.append(("generator", gen, state))
    return out


def _load_sharded(ck: dict[str, Any], path: str, sharded: dict[str, dict[str, Any]]) -> None:
    """Set the objects whose state is in the job's DCP directory from it."""
    entry = ck.get("sharded") or {}
    directory = str(entry.get("dir") or "")
    if not os.path.isdir(directory):  # (the checkpoints moved together)
        directory = os.path.join(os.path.dirname(os.path.abspath(path)),
                                 os.path.basename(directory))
    try:
        load_shards(entry, directory, sharded.get("modules", {}), sharded.get("optimizers", {}))
    except ShardError as exc:
        raise ResumeError(f"{path}: {exc}") from None


def _readable(path: str, written: dict[str, Any], what: str, newest: int) -> None:
    """Refuse a file of a format newer than this daifu reads (``what``:
    "checkpoint" or "manifest")."""
    fmt = written.get("format", 0)
    if not isinstance(fmt, int) or fmt > newest:
        raise ResumeError(f"{path} was written by daifu {written.get('daifu', '?')} ({what} "
                          f"format {fmt}); this daifu ({__version__}) reads formats up to "
                          f"{newest}: resume with that daifu or a newer one")


def _rank_file(manifest_path: str) -> str:
    """This rank's checkpoint in a preempted job's manifest
    (``persist/_preempt``): the job must have as many ranks as the one
    that saved it."""
    import json  # lazy: 2.5 ms

    try:
        with open(manifest_path, encoding="utf-8") as fh:
            manifest = json.load(fh)
    except FileNotFoundError:
        raise ResumeError(f"no manifest at {manifest_path}") from None
    except (OSError, ValueError) as exc:
        raise ResumeError(f"{manifest_path} is not a manifest daifu wrote: {exc}") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("ranks"), dict):
        raise ResumeError(f"{manifest_path} is not a manifest daifu wrote")
    _readable(manifest_path, manifest, "manifest", MANIFEST_FORMAT)
    where = placeholders()
    rank, world = where["rank"], where["world_size"]
    if manifest.get("world_size") != world:
        raise ResumeError(f"{manifest_path} holds a job of {manifest.get('world_size')} ranks; "
                          f"this one has {world}: resume with as many ranks")
    path = manifest["ranks"].get(str(rank))
    if not path:
        raise ResumeError(f"{manifest_path}: rank {rank} saved no checkpoint "
                          f"({manifest.get('states', {}).get(str(rank), 'not saved')})")
    if not os.path.isabs(path):
        path = os.path.join(os.path.dirname(os.path.abspath(manifest_path)), path)
    return str(path)


def _kind(obj: Any, torch: Any) -> str | None:
    from ._checkpoint import _kind_of, _kinds  # lazy: 9.5 ms

    if torch is None:
        return None
    return _kind_of(obj, _kinds(torch))


def _pick(saved: dict[str, Any], name: str, kind: str, path: str) -> Any:
    return saved[_pick_name(saved, name, kind, path)]


def _pick_name(saved: dict[str, Any], name: str, kind: str, path: str) -> str:
    """The name in the checkpoint of what the program passes as ``name``:
    the same, or the only one of its kind."""
    if name in saved:
        return name
    if len(saved) == 1:
        return next(iter(saved))
    held = ", ".join(sorted(saved)) or "none"
    raise ResumeError(f"{name}: {path} holds no {kind[:-1]} by that name "
                      f"(its {kind}: {held}); pass it by one of those names")


def _by_saved_names(ck: dict[str, Any], frame: Any) -> dict[str, Any]:
    """``daifu.resume(path)``: the objects the checkpoint names, found under
    the same names where ``resume`` was called (``model``, ``trainer.opt``)."""
    scope = {**frame.f_globals, **frame.f_locals}
    found: dict[str, Any] = {}
    missing = []
    for kind in (*_KINDS, "loaders", "generators"):
        for name in ck.get(kind) or {}:
            head, *rest = name.split("#")[0].split(".")
            obj = scope.get(head)
            for attr in rest:
                obj = getattr(obj, attr, None)
            if obj is None:
                missing.append(name)
            else:
                found[name] = obj
    if not found:
        raise ResumeError("none of the objects the checkpoint holds ("
                          + ", ".join(missing) + ") is here by that name: pass them, "
                          "daifu.resume(path, model=model, optimizer=opt, ...)")
    return found
