"""New code for the ``def`` statements of code that is running.

A reload gives every function object the new code, but a frame that keeps
running its old code -- module-level code on the crashed stack, a caller that
does not continue in its new code -- still holds the *old* code objects of the
functions it defines: a ``def`` in its loop (an LBFGS closure written at the top
level of a script) would make the old function again at the next iteration,
and the fix would be lost there.

``set_const`` points one constant of a live code object at another object.  A
code object's constants are a tuple that only the code object holds (the
compiler and daifu's rewrite each build one per code object), and the
interpreter reads an item of it at each ``LOAD_CONST``, so the running frame
makes its next function from the new code.  The write is checked against the
layout first (the slot must hold the old object), and refused otherwise.
"""

from __future__ import annotations

import ctypes
import sys
import types

# private function pointers (``pythonapi.Py_IncRef`` is one object shared by
# every user, argtypes included)
_incref = ctypes.pythonapi["Py_IncRef"]
_incref.argtypes = [ctypes.py_object]
_incref.restype = None
_decref = ctypes.pythonapi["Py_DecRef"]
_decref.argtypes = [ctypes.py_object]
_decref.restype = None

#: byte offset of ``ob_item[0]`` in a tuple (``PyTupleObject``: a var-object
#: header, then the items) -- the same from 3.11 to 3.13 (GIL builds)
_ITEMS = tuple.__basicsize__
_FREE_THREADED = bool(getattr(sys, "_is_gil_enabled", lambda: True)() is False)


def set_const(code: types.CodeType, index: int, new: object) -> bool:
    """Make ``code.co_consts[index]`` be ``new``; False (nothing changed)
    where that cannot be done safely."""
    consts = code.co_consts
    if _FREE_THREADED or not 0 <= index < len(consts) or tuple.__itemsize__ != ctypes.sizeof(
            ctypes.c_void_p):
        return False
    old = consts[index]
    slot = ctypes.c_void_p.from_address(id(consts) + _ITEMS + index * tuple.__itemsize__)
    if slot.value != id(old):
        return False  # not the layout this was written for
    _incref(new)
    slot.value = id(new)
    _decref(old)  # (``old`` is still held here: freed, if at all, when this returns)
    return True
