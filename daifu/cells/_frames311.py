"""Frame access for CPython 3.11: a suspended frame's variables, read and
written without leaving anything behind, and the layout-checked reads of the
interpreter frame (entered from C? which function?)."""

from __future__ import annotations

import ctypes
import types

from ._frameread import decref as _decref
from ._frameread import interpreter_frame
from ._frameread import running_function as _running_function
from ._frameread import swap_code as _swap_code

_CO_OPTIMIZED = 0x1  # not set for module and class-body code

_locals_to_fast = ctypes.pythonapi.PyFrame_LocalsToFast
_locals_to_fast.argtypes = [ctypes.py_object, ctypes.c_int]
_locals_to_fast.restype = None




class _LocalsSnapshot:
    """``frame.f_locals`` of a function frame, taken so that the frame is left
    exactly as it was.

    3.11's ``f_locals`` (``PyFrame_FastToLocalsWithError``) builds a dict of
    the variables *into the frame* and keeps it there until the frame dies:
    every value it held -- the step's batch, an ``obj`` the program set to
    None -- would stay alive after the program let go of it.  If the frame had
    no such dict before (the usual case), it is detached again; if it had one
    (the program called ``locals()``, a tracer runs), its contents are put
    back."""

    def __init__(self, frame: types.FrameType):
        self.frame = frame
        self.inner = _interpreter_frame(frame)
        self.had = bool(self.inner.f_locals) if self.inner is not None else True
        self.previous: dict | None = None
        if self.inner is not None and self.had:
            self.previous = dict(ctypes.cast(self.inner.f_locals, ctypes.py_object).value)

    def __enter__(self) -> dict:
        self.snapshot = self.frame.f_locals
        return self.snapshot

    def __exit__(self, *exc) -> None:
        snapshot, inner = self.snapshot, self.inner
        if inner is None:
            return  # layout unknown: leave the dict on the frame (correct, not lean)
        if self.had:
            if self.previous is not None:
                snapshot.clear()
                snapshot.update(self.previous)
        elif inner.f_locals == id(snapshot):
            inner.f_locals = None  # the frame's reference ...
            _decref(snapshot)  # ... is dropped; ours goes when this returns
        else:  # pragma: no cover - someone replaced it in between
            snapshot.clear()


def read_locals(frame: types.FrameType) -> dict:
    """A new dict of a frame's variables, leaving the frame as it was (see
    ``_LocalsSnapshot``).  Namespace frames (module, class body) return
    their namespace itself."""
    if not frame.f_code.co_flags & _CO_OPTIMIZED:
        return frame.f_locals
    with _LocalsSnapshot(frame) as snapshot:
        return dict(snapshot)


def write_locals(frame: types.FrameType, values: dict, deleted: tuple[str, ...] = ()) -> None:
    """Store into a suspended function frame's fast locals (and cells).

    3.11 has no write-through ``f_locals``: refresh the snapshot dict, change
    it, and copy it back with ``PyFrame_LocalsToFast`` (what pdb relies on);
    the frame is then left without the snapshot as before."""
    with _LocalsSnapshot(frame) as snapshot:
        snapshot.update(values)
        for name in deleted:
            snapshot.pop(name, None)
        _locals_to_fast(frame, 1)


class _InterpreterFrame(ctypes.Structure):  # CPython 3.11 Include/internal/pycore_frame.h
    _fields_ = [("f_func", ctypes.c_void_p), ("f_globals", ctypes.c_void_p),
                ("f_builtins", ctypes.c_void_p), ("f_locals", ctypes.c_void_p),
                ("f_code", ctypes.c_void_p), ("frame_obj", ctypes.c_void_p),
                ("previous", ctypes.c_void_p), ("prev_instr", ctypes.c_void_p),
                ("stacktop", ctypes.c_int), ("is_entry", ctypes.c_bool)]


def _interpreter_frame(frame: types.FrameType) -> _InterpreterFrame | None:
    """The interpreter frame behind a frame object, if its layout is the one we
    know (``_frameread.interpreter_frame``)."""
    return interpreter_frame(frame, _InterpreterFrame, "f_code")  # type: ignore[return-value]


def called_from_c(frame: types.FrameType) -> bool | None:
    """Was this (executing) frame entered from C code -- a builtin such as
    ``getattr``/``list``, a type call, a protocol slot -- rather than by a
    Python-to-Python call?  None if the layout check fails."""
    inner = _interpreter_frame(frame)
    return None if inner is None else bool(inner.is_entry)


def running_function(frame: types.FrameType) -> types.FunctionType | None:
    """The function object executing ``frame`` (the interpreter frame's
    ``f_func``; checked against the frame's code)."""
    return _running_function(frame, _interpreter_frame(frame), "f_func")


def swap_code(frame: types.FrameType, new: types.CodeType, call_old: int, resume_old: int,
              call_new: int, resume_new: int) -> bool:
    """Make ``frame``, suspended in the Python call at byte ``call_old`` of its
    code (which returns to byte ``resume_old``), return into ``new`` at byte
    ``resume_new`` instead (``_frameread.swap_code``).  3.11 keeps the last
    code unit of the call in ``prev_instr``; a return goes on right after it."""
    if resume_new - call_new != resume_old - call_old:
        return False
    return _swap_code(frame, _interpreter_frame(frame), "f_code", "prev_instr", new,
                      resume_old - 2, resume_new - 2)
