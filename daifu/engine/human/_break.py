"""``python -m daifu send PID break``: pause a running job at its next
statement in a vaccinated frame, with no exception of the program raised.

How (docs/architecture.md, "engine/human"):

1. the runner installs a Python handler for ``BREAK_SIGNAL`` (a real-time
   signal no program is likely to use) unless the program has its own;
2. the handler -- run by the interpreter in the main thread between two
   bytecodes -- arms a tracer, as pdb's ``set_trace`` does: ``sys.settrace``
   for calls from now on, ``f_trace`` on every frame of the stack;
3. the tracer watches "line" events of vaccinated frames only.  At the first
   one that stands at the *start* of a cell whose statement can be retried
   -- nothing of that statement has run yet -- it disarms and raises
   ``Break`` there.  The cell's barrier, the innermost handler of that
   instruction, takes it;
4. the engine treats a ``Break`` as a pause, not a crash: no rule, replay or
   standing answer sees it; a human does (the console on the job's terminal,
   else the control endpoint, waiting until told).  ``continue`` is a retry
   of the statement that had not started: nothing runs twice.  ``p``,
   ``exec``, ``up``, ``reload`` work as at a crash; whatever else happens
   (the wait ends, ``abort``) resumes the same way.

An armed break that reaches no such statement within ``ARMED_S`` seconds (a
program busy in code that is not vaccinated, or in one long C call) is
dropped at the next event its tracer sees after that, with a line on the
job's stderr: the tracer does not stay on for the rest of the run.

``Break`` derives from ``BaseException``: a program's ``except Exception``
between the paused frame and a caller that takes a decision never sees it.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import types

from ..._record import field
from ..._runtime import RUNTIME, state_record
from ...cells import cell_range, cells_of

TYPE_CHECKING = False  # (typing costs every start ~2 ms: type checkers only)
if TYPE_CHECKING:
    from typing import Any

#: the signal ``send PID break`` sends (``_rundir.STACKS_SIGNAL`` is +5)
BREAK_SIGNAL = getattr(signal, "SIGRTMIN", 34) + 6
#: seconds an armed break waits for a statement to pause at before it is dropped
ARMED_S = 60.0


class Break(BaseException):
    """Raised by daifu itself at a statement boundary to pause the job there
    (never by the program, never seen by it)."""

    def __init__(self, who: str = "python -m daifu send PID break") -> None:
        super().__init__(f"paused at your request ({who}); continue resumes here, "
                         "running nothing twice")


def is_break(exc: BaseException) -> bool:
    return type(exc) is Break


def _never_busy() -> bool:
    return False


@state_record
class _Break:
    """The pause's process state (``RUNTIME.parts``)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    #: given by the engine when it starts (``wire``): is this thread inside
    #: daifu's own handling? and the fast path's switches (``_fastpath.passing``)
    busy: Any = _never_busy
    passing: Any = None
    #: frames given an f_trace (cleared when disarmed)
    frames: list[types.FrameType] = field(default_factory=list)
    armed: bool = False
    until: float = 0.0


_state = RUNTIME.part(__name__, _Break())


def wire(busy: Any, passing: list) -> None:
    """What ``break`` needs of the engine: ``busy()`` (this thread is inside
    daifu's own handling) and its fast path's switches (``passing``)."""
    _state.busy, _state.passing = busy, passing


def serve_break() -> int | None:
    """Install the handler (main thread; the program's own handler for the
    signal is kept, and break is then not available).  Returns the signal,
    or None where it cannot be had."""
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        if signal.getsignal(BREAK_SIGNAL) not in (signal.SIG_DFL, None):
            return None
        signal.signal(BREAK_SIGNAL, _on_signal)
    except (OSError, ValueError, RuntimeError, AttributeError):
        return None
    os.register_at_fork(after_in_child=_not_in_children)
    return BREAK_SIGNAL


def _not_in_children() -> None:
    """A forked child (a DataLoader worker) is not the job a user pauses."""
    try:
        signal.signal(BREAK_SIGNAL, signal.SIG_DFL)
    except (OSError, ValueError):
        pass
    _disarm()


def _on_signal(signum: int, frame: types.FrameType | None) -> None:
    if sys.gettrace() is not None:  # a debugger, coverage, a profiler: theirs
        sys.stderr.write("daifu: break: a tracer is already active in this process "
                         "(a debugger or coverage), so daifu cannot pause it\n")
        return
    arm(frame)


def arm(frame: types.FrameType | None) -> None:
    """Pause at the next statement of a vaccinated frame of this thread."""

    passing = _state.passing
    with _state.lock:
        _state.armed = True
        _state.until = time.monotonic() + ARMED_S
        passing[2] = False  # (no stub may pass an exception on without its barrier now)
        f = frame
        while f is not None:
            if cells_of(f.f_code) is not None:
                f.f_trace = _local
                _state.frames.append(f)
            f = f.f_back
    sys.settrace(_global)


def armed() -> bool:
    """Is a pause requested (``arm``) and not yet over?"""
    return bool(_state.armed)


def _disarm() -> None:
    sys.settrace(None)
    with _state.lock:
        _state.armed = False
        for f in _state.frames:
            try:
                f.f_trace = None
            except Exception:
                pass
        _state.frames.clear()


def _expired() -> bool:
    """Past the deadline: drop the break (once), say so, trace no more."""
    if time.monotonic() < _state.until:
        return False
    if _state.armed:
        _disarm()
        try:
            sys.stderr.write(f"daifu: break: dropped: the main thread reached no statement of a "
                             f"vaccinated function within {ARMED_S:g}s of the request; "
                             "the job runs on (send break again to retry)\n")
        except Exception:
            pass
    return True


def _global(frame: types.FrameType, event: str, arg: Any):
    if _expired():
        return None
    if event == "call" and cells_of(frame.f_code) is not None:
        return _local
    return None


def _local(frame: types.FrameType, event: str, arg: Any):
    if not _state.armed or _expired():
        return None
    if event != "line":
        return _local
    if _at_a_statement_start(frame):
        _disarm()
        raise Break()
    return _local


def _at_a_statement_start(frame: types.FrameType) -> bool:
    if _state.busy():
        return False  # inside daifu's own handling (a rule calling the program)
    info = cells_of(frame.f_code)
    if info is None:
        return False
    found = cell_range(info, frame.f_code, frame.f_lasti)
    return (found is not None and found[0] == frame.f_lasti and not found[3]
            and found[2].can_retry)
