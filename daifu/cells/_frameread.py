"""Reading an interpreter frame behind a frame object, for every layout.

What differs between CPython versions is only the layout of the interpreter
frame (``_frames311``/``_frames313`` each declare theirs, with the names of
the two fields read here); how it is found and checked -- against the
frame's own code and frame object, nothing else read when they do not
match -- is the same, and written once here.
"""

from __future__ import annotations

import ctypes
import gc
import types

from ._consts import _decref, _incref

__all__ = ["FrameObject", "decref", "interpreter_frame", "running_function", "swap_code"]

#: (one private ``Py_DecRef`` pointer for the frame modules: ``_consts``)
decref = _decref


class FrameObject(ctypes.Structure):
    """The head of a frame object (``PyFrameObject``), the same in 3.11-3.13."""

    _fields_ = [("ob_refcnt", ctypes.c_ssize_t), ("ob_type", ctypes.c_void_p),
                ("f_back", ctypes.c_void_p), ("f_frame", ctypes.c_void_p)]


def interpreter_frame(frame: types.FrameType, layout: type[ctypes.Structure],
                      code_field: str) -> ctypes.Structure | None:
    """The interpreter frame behind ``frame``, read as ``layout``, if the
    layout is the one we know: its ``code_field`` is the frame's code and its
    ``frame_obj`` the frame itself; None otherwise."""
    try:
        outer = FrameObject.from_address(id(frame))
        if not outer.f_frame:
            return None
        inner = layout.from_address(outer.f_frame)
        if getattr(inner, code_field) != id(frame.f_code) or inner.frame_obj != id(frame):
            return None
        return inner
    except Exception:
        return None


def running_function(frame: types.FrameType, inner: ctypes.Structure | None,
                     func_field: str) -> types.FunctionType | None:
    """The function object executing ``frame``: the interpreter frame's
    ``func_field`` (checked against the frame's code), else the one function
    the garbage collector finds with that code."""
    address = getattr(inner, func_field, None) if inner is not None else None
    if address:
        func = ctypes.cast(address, ctypes.py_object).value
        if isinstance(func, types.FunctionType) and func.__code__ is frame.f_code:
            return func
    candidates = [r for r in gc.get_referrers(frame.f_code)
                  if isinstance(r, types.FunctionType) and r.__code__ is frame.f_code]
    return candidates[0] if len(candidates) == 1 else None


def swap_code(frame: types.FrameType, inner: ctypes.Structure | None, code_field: str,
              ip_field: str, new: types.CodeType, ip_old: int, ip_new: int) -> bool:
    """Make ``frame``, suspended in a Python function it called (which
    returns into it through its interpreter frame, ``_armed``), go on in
    ``new``: the interpreter frame's code (``code_field``) becomes ``new``
    and its instruction pointer (``ip_field``), now at byte ``ip_old`` of its
    code, byte ``ip_new`` of ``new``.  Refused (False, nothing changed) unless
    the layout is the one we know and the pointer is where the caller says.
    The two codes must lay out the frame alike (variables, stack size: the
    caller checks)."""
    if inner is None:
        return False
    old = frame.f_code
    base = getattr(inner, ip_field) - frame.f_lasti  # (the old code's first instruction)
    at = base - id(old)  # (where a code object's instructions start, inside it)
    if not 0 < at < 4096 or frame.f_lasti != ip_old or getattr(inner, code_field) != id(old):
        return False
    _incref(new)
    setattr(inner, code_field, id(new))
    setattr(inner, ip_field, id(new) + at + ip_new)
    _decref(old)
    return True
