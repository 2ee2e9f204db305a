"""Import what the first crash needs before it happens, off the program's path.

Handling a crash imports structlog (and, through it, ``rich`` where it is
installed, ``asyncio``, ``ssl``...), ``json`` and ``hashlib`` for the
journal, the report, the console and the control socket, the bytecode
readers (and ``bytecode``) for the search for a handler: ~200 modules,
80-120 ms.  Paid at the first crash, that is the time from the raise to the
first rule.  Paid at start-up, it would make every ``python -m daifu`` start
as slow, crash or not.

So a thread imports them ``DELAY_S`` after daifu is installed: a program
that ends sooner (a script, a test run) never pays, a job that runs longer
has them before its first crash.  It is a bare ``_thread`` thread, not a
``threading.Thread``: while it waits, ``threading.enumerate()`` and
``active_count()`` do not list it (a test suite that checks for leaked
threads, CPython's own among them, would count it); while it imports
(~0.1 s) it is listed as ``daifu-preload``, then not again.  Hazards, all
handled:

* ``fork`` while the thread holds an import lock would leave the child a lock
  no thread of it will ever release (a DataLoader worker that then imports
  one of those modules at its first crash would hang): a before-fork hook
  waits for the imports to finish (milliseconds, once per process) -- for a
  second at most, since another before-fork hook may hold a lock they need
  (logging's): a child forked before they finished drops the locks and the
  half-imported modules of the thread, which is not in it;
* the thread must never raise into the program or print: every failure is
  swallowed (the crash imports what it needs itself then, as without it);
* a program that dies of Ctrl-C must still die of SIGINT: CPython records an
  uncaught ``KeyboardInterrupt`` in a flag that every ``exec`` of a string
  clears (``run_eval_code_obj``), and imports do that (dataclasses,
  namedtuples).  ``settle`` stops or waits for the thread, so that the
  runner's excepthook can set the flag again after it (``hooks._runner``).

``DAIFU_PRELOAD=S`` sets the delay in seconds; ``0`` turns it off.
"""

from __future__ import annotations

import _thread
import os
import threading
import time

#: seconds after daifu is installed
DELAY_S = 2.0
#: held while the thread imports
_busy = threading.Lock()
#: the thread was started in this process
_started = False
_done = threading.Event()
#: set by ``settle``: the thread, if it has not begun, does nothing
_stopped = False


def _imports() -> None:
    with _busy:
        if _stopped:
            return
        try:
            import dis  # noqa: F401
            import hashlib  # noqa: F401
            import json  # noqa: F401

            # the bytecode readers the search for a handler uses (and, with
            # them, ``bytecode``): a program whose modules came from the code
            # cache has not imported them (~9 ms at the crash)
            from ..cells._rewrite import _core  # noqa: F401
            from . import _console, _control, _journal, _report, _waiter  # noqa: F401
            from ._events import warm

            warm()
        except BaseException:  # never into the program: the crash imports them itself
            pass
        finally:
            _done.set()


#: how long a fork waits for the thread's imports to finish (seconds)
FORK_WAIT_S = 1.0
#: the thread's id (the child clears the import locks it held at a fork)
_ident: int | None = None


def _before_fork() -> None:
    """Let the imports finish before a fork -- for a while only: another
    before-fork hook (logging's takes its lock) may hold what they wait for,
    and waiting for good would hang the program (a DataLoader starting its
    workers).  A child forked meanwhile clears what the thread held
    (``_in_child``)."""
    if _busy.locked() and not _done.is_set():
        if _busy.acquire(timeout=FORK_WAIT_S):
            _busy.release()


def _in_child() -> None:
    global _started, _busy
    _started = False
    if _busy.locked() and not _done.is_set() and _ident is not None:
        # forked while the thread imported: it is not in the child, and the
        # module locks it held would block any import of those modules there
        # for good; its half-imported modules go (imported again when needed)
        _busy = threading.Lock()
        _forget_imports_of(_ident)


def _forget_imports_of(ident: int) -> None:
    """Drop the import locks held by the thread ``ident`` (gone, in a forked
    child) and the modules it was importing (never finished)."""
    try:
        import sys
        from importlib import _bootstrap

        locks = _bootstrap._module_locks  # type: ignore[attr-defined]
        held = []
        for name, ref in list(locks.items()):
            lock = ref() if callable(ref) else ref
            if getattr(lock, "owner", None) == ident:
                held.append(name)
        for name in held:
            locks.pop(name, None)
            module = sys.modules.get(name)
            spec = getattr(module, "__spec__", None)
            if module is not None and getattr(spec, "_initializing", False):
                del sys.modules[name]
        blocking = getattr(_bootstrap, "_blocking_on", None)
        if blocking is not None:
            blocking.pop(ident, None)
    except Exception:  # (an importlib daifu does not know: as before, nothing cleared)
        pass


def _run(delay: float) -> None:
    """The thread: wait, then import -- listed by ``threading`` (as
    ``daifu-preload``) only while it imports."""
    global _ident
    _ident = _thread.get_ident()
    try:
        time.sleep(delay)
        if _stopped:
            return
        threading.current_thread().name = "daifu-preload"  # (a _DummyThread, until the end)
        _imports()
    except BaseException:  # never into the program (nor printed at exit)
        pass
    finally:
        try:
            with threading._active_limbo_lock:  # type: ignore[attr-defined]
                threading._active.pop(_thread.get_ident(), None)  # type: ignore[attr-defined]
        except BaseException:
            pass


_hooked = False


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
    """Schedule the imports (once per process; not if they are done)."""
    global _started, _hooked
    delay = delay_from_env() if delay is None else delay
    if _started or _done.is_set() or delay is None:
        return
    if not _hooked and hasattr(os, "register_at_fork"):
        os.register_at_fork(before=_before_fork, after_in_child=_in_child)
        _hooked = True
    _thread.start_new_thread(_run, (delay,))
    _started = True


def settle(timeout: float = 5.0) -> None:
    """Make sure the thread imports nothing from now on: if it has not begun
    it never will; if it has, wait for it (at most ``timeout`` s)."""
    global _stopped
    _stopped = True
    if _busy.acquire(timeout=timeout):
        _busy.release()


def wait(timeout: float | None = None) -> bool:
    """Wait for the imports (tests and the benchmark)."""
    return _done.wait(timeout)
