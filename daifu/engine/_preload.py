"""Import what the first crash needs before it happens, off the program's path.

Handling a crash imports structlog (and, through it, ``rich`` where it is
installed, ``asyncio``, ``ssl``...), ``json`` and ``hashlib`` for the
journal, the report, the console and the control socket, the bytecode
readers (and ``bytecode``) for the search for a handler: ~200 modules,
80-120 ms.  Paid at the first crash, that is the time from the raise to the
first rule.  Paid at start-up, it would make every ``python -m daifu`` start
as slow, crash or not.

So they are imported ``DELAY_S`` after daifu is installed: a program that
ends sooner (a script, a test run) never pays, a job that runs longer has
them before its first crash.  They are imported *on the main thread*, by no
Python thread of daifu's: a thread that imports races with the program (a
loop over ``sys.modules`` sees it change size, two imports deadlock on each
other's module locks), holds import locks a ``fork`` would leave the child
for good, and is one more thread in a test suite's count of leaked threads.
How: a timer in daifu's C module (``_csignals.timer_start``: a thread that is
no Python thread -- no thread state, all signals blocked -- waits, then asks
the interpreter for a *pending call*), which runs the imports at the main
thread's next check between instructions, between two of the program's
bytecodes, with its tracer and profiler off and its signals held back (a pdb
session or a profile sees nothing of them).  Not while the program is itself
importing (its module locks held), or inside daifu's own code (a barrier,
an event being written: its locks may be held), then again 50 ms later.  Around a
``fork()`` the timer stops and starts again (3.12+ warns of a fork in a
process with threads); a child has none.

A program that is blocked in C when the time comes (a ``time.sleep``, a
``join``) has the imports when it is back in Python.  Without daifu's C
module there is no preload: the first crash imports what it needs itself, as
with ``DAIFU_PRELOAD=0``.  Every failure is swallowed: the crash imports what
it needs itself then.
"""

from __future__ import annotations

import os
import sys
import threading

from .._record import field, prepare
from .._runtime import RUNTIME, state_record
from ..cells import complete_running, load_rewrite
from . import _decision, _engine, _queue, _repeats, _rules, _signals
from ._barrier import profiled
from ._events import warm

#: seconds after daifu is installed
DELAY_S = 2.0


@state_record
class _Preload:
    """The delayed imports' process state (``RUNTIME.parts``)."""

    #: set when the imports are done
    done: threading.Event = field(default_factory=threading.Event)
    #: set by ``settle``: no imports from now on
    stopped: bool = False
    #: the timer was started, in the process ``pid``
    started: bool = False
    pid: int = 0
    #: the seconds left when a fork stopped the timer
    left: float | None = None


_state = RUNTIME.part(__name__, _Preload())


def _imports(below=None) -> None:
    """The imports; then the armed functions running on the stack at
    ``below`` (the program's frame) are made vaccinated code, unless a
    profiler watches (3.12+'s sees daifu's Python: the first crash does that
    work then, as it did before the preload did it)."""
    try:
        ahead = not profiled()
        # the bytecode readers the search for a handler uses (and, with
        # them, ``bytecode``): a program whose modules came from the code
        # cache has not imported them (~9 ms at the crash); the rewrite run
        # once, warm
        load_rewrite(warm=ahead)

        warm()
        # the records the engine makes at a crash (a decision, what applying
        # it did, the repeats): their ``__init__`` is compiled at a class's
        # first instance, ~0.1 ms each, which the first crash would pay
        # between the rule's answer and the retried statement
        prepare(_decision, _engine, _queue, _repeats, _rules)
        # the training loop and its callers, armed (``cells._armed``): a
        # crash passes through them and the engine asks for their cells --
        # made now, not between the raise and the rule (~1.5 ms each)
        if below is not None and ahead:
            complete_running(below)
    except BaseException:  # never into the program: the crash imports them itself
        pass
    finally:
        _state.done.set()


_DAIFU_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _busy(frame) -> bool:
    """Is the main thread inside an import (its module locks held), or in
    daifu's own code called by the program (a stub's barrier, the engine, an
    event being written: its locks may be held -- the imports would wait for
    them in the thread that holds them)?  daifu's runner below the program
    does not count."""
    chain = []
    while frame is not None:
        chain.append(frame.f_code.co_filename)
        frame = frame.f_back
    program_below = False
    for filename in reversed(chain):  # (from the bottom of the stack up)
        if filename.startswith("<frozen importlib"):
            return True
        if filename.startswith(_DAIFU_DIR):
            if program_below:
                return True
        elif not filename.startswith("<frozen"):
            program_below = True
    return False


def _now() -> None:
    """The pending call, on the main thread between two instructions."""
    if _state.stopped or _state.done.is_set() or os.getpid() != _state.pid:  # (a fork: no)
        return
    try:
        below = sys._getframe(1)
    except ValueError:  # (no Python frame below: the interpreter's shutdown)
        return
    if _busy(below):
        _timer().timer_start(0.05, _now)
        return
    _imports(below)


def _timer():  # (daifu's C module, or None)

    return _signals._csignals


def delay_from_env() -> float | None:
    """``DAIFU_PRELOAD``: seconds (default ``DELAY_S``), ``0``: None (off)."""
    value = os.environ.get("DAIFU_PRELOAD", "").strip()
    if not value:
        return DELAY_S
    try:
        seconds = float(value)
    except ValueError:
        return DELAY_S
    return seconds if seconds > 0 else None


def start(delay: float | None = None) -> None:
    """Schedule the imports (once per process; not if they are done, nor
    without daifu's C module)."""
    delay = delay_from_env() if delay is None else delay
    timer = _timer()
    if _state.started or _state.done.is_set() or delay is None or timer is None:
        return
    if not timer.timer_start(delay, _now):
        return
    _state.started = True
    _state.pid = os.getpid()
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork)
    try:  # (ended before the interpreter's shutdown)
        threading._register_atexit(_stop_timer)  # type: ignore[attr-defined]
    except Exception:
        pass


def _before_fork() -> None:
    timer = _timer()
    if timer is not None and not _state.stopped and not _state.done.is_set():
        _state.left = timer.timer_stop()


def _after_fork() -> None:
    # (started again after os.fork() returns -- a pending call -- past its
    # check of the process's threads)
    if _state.left is not None:
        _timer().call_soon(_resume)


def _resume() -> None:
    left, _state.left = _state.left, None
    if left is not None and not _state.stopped and not _state.done.is_set():
        _timer().timer_start(left, _now)


def _stop_timer() -> None:
    timer = _timer()
    if timer is not None:
        timer.timer_stop()


def settle(timeout: float = 5.0) -> None:
    """No imports from now on (the runner, before a ``KeyboardInterrupt``'s
    exit: see ``hooks._runner._exit_by_sigint``)."""
    _state.stopped = True
    _stop_timer()


def wait(timeout: float | None = None) -> bool:
    """Wait for the imports (tests and the benchmark; not on the main thread,
    which runs them)."""
    return _state.done.wait(timeout)
