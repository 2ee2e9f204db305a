"""The fast path's state: what the stubs and the barrier read before the
engine is asked anything.  Its C twin is ``_routes.c``, which reads the same
two objects.

* ``passing``: the list every stub reads (as the builtin ``__daifu_passing__``)
  before it calls its barrier -- an exception on its way to a handler found
  for sure, and whether the engine is quiet;
* ``ROUTES``: per raising cell, the last route an exception took to its
  handler (``_guards`` finds it; ``remember_route`` keeps it), checked first
  by every barrier call.
"""

from __future__ import annotations

import types

from .._runtime import RUNTIME

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)
if TYPE_CHECKING:
    pass


#: ``[exception, stub, quiet]`` (then what ``cells.use_barrier`` adds), read
#: by every stub, as the builtin ``cells._cell.PASSING``, before it calls its
#: barrier (``cells._rewrite._emit._passing``):
#:
#: * the exception a barrier found the program to catch surely, in a frame
#:   with nothing between that could catch it or keep it from getting there
#:   (``take_passing``), and the constant of the stub it reaches there: the
#:   stubs of the frames between re-raise it without calling anything, and
#:   the stub that loads that constant empties both slots -- so does every
#:   barrier call (slots that still hold something then hold an exception
#:   that went another way);
#: * quiet: no retry or decision in flight and no pause requested -- a stub
#:   whose function's own ``except Name:`` catches the exception re-raises it
#:   to that handler without a call (the barrier would answer "re-raise").
#:   The engine clears it whenever it starts to keep such state; the barrier
#:   sets it again when it has none.
class _Shared(list):
    """The list ``passing`` is: a builtin the program can reach, so a copy of
    it is the list itself (``copy.copy``, ``copy.deepcopy``): it holds the
    ``sys`` module, which cannot be copied, and a program's
    ``copy.deepcopy(vars(builtins))`` (or of an ``exec`` namespace holding
    ``__builtins__``) failed under daifu (CPython's test_getpath)."""

    __slots__ = ()

    def __copy__(self) -> _Shared:
        return self

    def __deepcopy__(self, memo: dict) -> _Shared:
        return self


passing: list = _Shared([None, None, True])


#: cell's constant -> (exception class, raising code, ((code, offset) of
#: each caller up to the handler), the handler's name, the class it held, the
#: constant of the handler's frame's stub): the last route of each raising
#: cell, keyed by the constant's value (which hashes faster than ``id()`` is
#: called).  Read first of all by the barrier the stubs call -- the C
#: ``_routes.barrier``, or ``_barrier.barrier`` where it is not built, which
#: writes the check out (a call to a checking function would cost a third
#: of it).
ROUTES: dict[tuple, tuple] = {}
RUNTIME.on_reset(ROUTES.clear)
RUNTIME.on_drop(ROUTES.clear)


def remember_route(ref: tuple, exc: BaseException, frame: types.FrameType,
                   stub: tuple | None, route: tuple) -> None:
    """Keep the route ``take_passing`` gave for exceptions like ``exc``
    raised in the cell ``ref`` names, in ``frame`` (whose cell has no
    handler of its own around it: the caller's check makes it so), to the
    frame whose stub loads ``stub``; or (``stub`` and the handler's name
    None) the call site where ``take_through`` found it to leave for C
    code that may catch it."""
    hops, name, cls = route
    ROUTES[ref] = (type(exc), frame.f_code, hops, name, cls, stub)
