"""The program's signals reach the program, never daifu's own code.

CPython runs a Python-level signal handler on the main thread at its next
check between instructions -- wherever that thread is.  daifu's code runs in
the middle of the program's (a vaccinated frame's stub, the barrier, the
engine judging an exception the program may handle), so a handler could run
there, and what it raises (``KeyboardInterrupt``, an alarm's timeout) would
be raised in daifu's code: lost in one of its ``except`` clauses, or
reported as daifu's own failure, while the program never sees it.

``install()`` (by ``daifu.install`` and ``python -m daifu``) wraps every
Python-level handler -- those set now, and those the program sets later
through ``signal.signal`` -- in a ``Handler``:

* outside daifu's code it calls the program's handler, with the same
  arguments, at the same moment;
* while the engine holds signals back (``hold()``/``release()``: the barrier
  judging an exception on the main thread), or when the interrupted frame is
  daifu's own or stands at a stub's instruction (which carry no line), it
  holds the signal back; it is delivered at the first check that finds the
  program's own code running again, with that frame, as the interpreter
  would have delivered it there (the C module schedules a pending call,
  ``Py_AddPendingCall``).

``signal.getsignal`` and the value ``signal.signal`` returns give the
program's handler, never the wrapper.  ``live(...)``: the signals a human's
wait must receive at once (Ctrl-C at the console, SIGTERM) even while held.

With the C module (``_csignals.c``, built with daifu where a C compiler
is) the wrapper is C: it adds no frame to a handler's stack.  Without it the
wrapper is ``_PyHandler`` (one frame of daifu's under the handler) and a
signal held back is delivered when the barrier returns, raised at the
failing statement in place of the exception judged there.
"""

from __future__ import annotations

import _signal
import contextlib
import os
import signal
import sys
import threading
import types
from collections.abc import Callable, Iterable, Iterator

from .._record import field
from .._runtime import RUNTIME, state_record

#: frames of daifu's own code (its package directory)
_DAIFU = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep

_csignals: types.ModuleType | None = None
if os.environ.get("DAIFU_SPEEDUPS", "1") != "0" \
        and getattr(sys, "_is_gil_enabled", lambda: True)() is not False:
    try:  # (not on a free-threaded build: the module keeps its state under the GIL)
        from . import _csignals  # type: ignore[attr-defined,no-redef,unused-ignore]  # (C)
    except ImportError:  # (not built: no C compiler at install)
        pass


class _PyHandler:
    """``_csignals.Handler`` where the C module is not built."""

    __slots__ = ("handler",)

    def __init__(self, handler: Callable) -> None:
        self.handler = handler

    def __call__(self, signum: int, frame: types.FrameType | None):
        if not (1 << signum) & _state.live_set and (_state.held or _in_daifu(frame)):
            _state.waiting.add(signum)
            return None
        return self.handler(signum, frame)

    def __repr__(self) -> str:
        return f"<daifu signal handler for {self.handler!r}>"


@state_record
class _Held:
    """The Python signal hold's state, where the C module is not built
    (``RUNTIME.parts``; the C module keeps its own)."""

    #: how many holds are open (nested ``hold``s)
    held: int = 0
    #: the signals that reach daifu's code at once, held or not (a bit mask)
    live_set: int = 0
    #: the signals that came while held, delivered at ``release``
    waiting: set[int] = field(default_factory=set)


_state = RUNTIME.part(__name__, _Held())


def _in_daifu(frame: types.FrameType | None) -> bool:
    if frame is None:
        return False
    code = frame.f_code
    return frame.f_lineno is None or code.co_filename.startswith(_DAIFU)


Handler: type = _csignals.Handler if _csignals is not None else _PyHandler


def _unwrapped(handler):
    return handler.handler if isinstance(handler, Handler) else handler


class _Shim(types.ModuleType):
    """``_signal`` as ``signal.signal`` and ``signal.getsignal`` see it."""

    signal: Callable
    getsignal: Callable

    def __getattr__(self, name: str):
        return getattr(_signal, name)


def _py_signal(signalnum, handler):
    if callable(handler) and not isinstance(handler, Handler):
        handler = Handler(handler)
    return _unwrapped(_signal.signal(signalnum, handler))


def _py_getsignal(signalnum):
    return _unwrapped(_signal.getsignal(signalnum))


_shim = _Shim("_signal")
if _csignals is not None:
    _csignals.setup(_DAIFU, _signal.signal, _signal.getsignal)
    _shim.signal, _shim.getsignal = _csignals.signal, _csignals.getsignal
else:
    _shim.signal, _shim.getsignal = _py_signal, _py_getsignal


def install() -> bool:
    """Wrap the program's signal handlers (main thread only; once)."""
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.__dict__.get("_signal") is _shim:
        return True
    for signum in _signal.valid_signals():
        try:
            handler = _signal.getsignal(signum)
            if callable(handler) and not isinstance(handler, Handler):
                _signal.signal(signum, Handler(handler))
        except (OSError, ValueError, RuntimeError):
            continue
    signal._signal = _shim  # type: ignore[attr-defined]
    return True


def uninstall() -> None:
    """Give the program's handlers back unwrapped (tests)."""
    if signal.__dict__.get("_signal") is not _shim:
        return
    signal._signal = _signal  # type: ignore[attr-defined]
    for signum in _signal.valid_signals():
        try:
            handler = _signal.getsignal(signum)
            if isinstance(handler, Handler):
                _signal.signal(signum, _unwrapped(handler))
        except (OSError, ValueError, RuntimeError):
            continue


def hold() -> None:
    """Hold the program's signals back (the engine, on the main thread)."""
    if _csignals is not None:
        _csignals.hold()
    else:
        _state.held += 1


def release() -> list[int]:
    """End a hold.  With the C module what came meanwhile is delivered
    where the program runs next ([] returned); without it, the signals to
    deliver now (``deliver``)."""
    if _csignals is not None:
        _csignals.release()
        return []
    _state.held = max(_state.held - 1, 0)
    if _state.held or not _state.waiting:
        return []
    late = sorted(_state.waiting)
    _state.waiting.clear()
    return late


def deliver(signums: Iterable[int], frame: types.FrameType) -> BaseException | None:
    """Run the program's handlers of ``signums`` now, for ``frame``; the
    exception one raised (the rest wait for the next release), or None."""
    pending = list(signums)
    while pending:
        signum = pending.pop(0)
        handler = _unwrapped(_signal.getsignal(signum))
        if not callable(handler):
            continue
        try:
            handler(signum, frame)
        except BaseException as exc:
            _state.waiting.update(pending)
            return exc
    return None


@contextlib.contextmanager
def live(*signums: int) -> Iterator[None]:
    """While a human waits: these signals reach daifu's waiting code at once
    (Ctrl-C at the console, SIGTERM), held or not."""
    mask = 0
    for signum in signums:
        mask |= 1 << int(signum)
    if _csignals is not None:
        before = _csignals.set_live(mask)
        try:
            yield
        finally:
            _csignals.set_live(before)
        return
    before, _state.live_set = _state.live_set, mask
    try:
        yield
    finally:
        _state.live_set = before
