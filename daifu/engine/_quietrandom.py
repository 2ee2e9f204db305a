"""daifu's own imports never draw from the program's global ``random``.

A library daifu imports while the program runs (``rich.style`` calls
``random.getrandbits`` at import, when structlog builds its logger) would
otherwise consume the program's seeded random numbers: a seeded run would
draw different numbers under daifu, and a checkpoint's ``random.getstate()``
would not be the program's.  ``program_random_untouched()`` gives the
importing thread a private generator for as long as it runs.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from .._record import field
from .._runtime import RUNTIME, state_record

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)
if TYPE_CHECKING:
    from typing import Any


#: the ``random`` functions a module may call when it is imported
_RANDOM_FUNCTIONS = ("random", "getrandbits", "randint", "randrange", "choice", "choices",
                     "shuffle", "sample", "uniform", "gauss", "normalvariate", "randbytes",
                     "seed", "getstate", "setstate")


@state_record
class _Quiet:
    """The ``random`` wrappers' process state (``RUNTIME.parts``)."""

    #: thread ident -> [private generator, depth] while ``program_random_untouched`` runs in it
    private: dict[int, list[Any]] = field(default_factory=dict)
    #: the program's ``random`` functions, while the wrappers stand in for them
    originals: dict[str, Any] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


_state = RUNTIME.part(__name__, _Quiet())


def _random_wrapper(name: str, original: Any) -> Any:
    def wrapper(*args: Any, **kw: Any) -> Any:
        private = _state.private.get(threading.get_ident())
        if private is not None:
            return getattr(private[0], name)(*args, **kw)
        return original(*args, **kw)

    wrapper.__name__, wrapper.__doc__ = original.__name__, original.__doc__
    wrapper.__daifu_random__ = True  # type: ignore[attr-defined]
    return wrapper


@contextlib.contextmanager
def program_random_untouched() -> Iterator[None]:
    """Imports daifu makes (structlog, and through it ``rich``, whose
    ``rich.style`` calls ``random.getrandbits`` at import) must not draw from
    the program's global ``random`` generator: a seeded program would get
    other numbers under daifu than under python.  While the block runs, the
    module-level ``random`` functions give this thread a private generator
    and every other thread (the program's) the program's own, untouched.

    One set of wrappers serves every thread in such a block (the preload
    thread's and a crash's in the main thread can overlap, in any order):
    installed by the first to enter, removed by the last to leave.  Two
    independent swaps, left in the wrong order, would leave the main
    thread's wrapper installed for good -- and the program's ``random``, and
    the checkpoint's ``random.getstate()``, on a private generator."""
    import random  # lazy: 1.1 ms

    me = threading.get_ident()
    with _state.lock:
        if not _state.private:
            for name in _RANDOM_FUNCTIONS:
                original = getattr(random, name, None)
                if original is None or getattr(original, "__daifu_random__", False):
                    continue
                _state.originals[name] = original
                setattr(random, name, _random_wrapper(name, original))
        entry = _state.private.get(me)
        if entry is None:
            _state.private[me] = [random.Random(), 1]
        else:
            entry[1] += 1
    try:
        yield
    finally:
        with _state.lock:
            entry = _state.private[me]
            entry[1] -= 1
            if not entry[1]:
                del _state.private[me]
            if not _state.private:
                for name, original in _state.originals.items():
                    if getattr(getattr(random, name, None), "__daifu_random__", False):
                        setattr(random, name, original)
                _state.originals.clear()
