"""Frame access for CPython 3.13: a suspended frame's variables (PEP 667's
write-through ``f_locals``), and the layout-checked reads of the interpreter
frame (entered from C? which function?)."""

from __future__ import annotations

import ctypes
import types

from ._frameread import decref as _decref
from ._frameread import interpreter_frame
from ._frameread import running_function as _running_function
from ._frameread import swap_code as _swap_code

_CO_OPTIMIZED = 0x1  # not set for module and class-body code


def read_locals(frame: types.FrameType) -> dict:
    """A new dict of a frame's variables.  3.13's ``f_locals`` of a function
    frame is a proxy that reads the frame when asked and keeps nothing (no
    snapshot stays on the frame, unlike 3.11).  Namespace frames (module,
    class body) return their namespace itself."""
    if not frame.f_code.co_flags & _CO_OPTIMIZED:
        return frame.f_locals
    return dict(frame.f_locals)


def write_locals(frame: types.FrameType, values: dict, deleted: tuple[str, ...] = ()) -> None:
    """Store into a suspended function frame's variables (closure cells
    included) through the write-through proxy; deleting a variable -- which
    the proxy refuses -- unbinds its slot (or empties its cell)."""
    proxy = frame.f_locals
    for name, value in values.items():
        proxy[name] = value
    for name in deleted:
        _unbind(frame, name)


class _InterpreterFrame(ctypes.Structure):  # CPython 3.13 Include/internal/pycore_frame.h
    _fields_ = [("f_executable", ctypes.c_void_p), ("previous", ctypes.c_void_p),
                ("f_funcobj", ctypes.c_void_p), ("f_globals", ctypes.c_void_p),
                ("f_builtins", ctypes.c_void_p), ("f_locals", ctypes.c_void_p),
                ("frame_obj", ctypes.c_void_p), ("instr_ptr", ctypes.c_void_p),
                ("stacktop", ctypes.c_int), ("return_offset", ctypes.c_uint16),
                ("owner", ctypes.c_char)]


_FRAME_OWNED_BY_CSTACK = 3
_LOCALSPLUS = ctypes.sizeof(_InterpreterFrame)  # localsplus[] follows the fixed part


def _interpreter_frame(frame: types.FrameType) -> _InterpreterFrame | None:
    """The interpreter frame behind a frame object, if its layout is the one we
    know (``_frameread.interpreter_frame``)."""
    return interpreter_frame(frame, _InterpreterFrame, "f_executable")  # type: ignore[return-value]


def called_from_c(frame: types.FrameType) -> bool | None:
    """Was this (executing) frame entered from C code -- a builtin such as
    ``getattr``/``list``, a type call, a protocol slot -- rather than by a
    Python-to-Python call?  In 3.12+ such a frame's previous frame is the
    interpreter's entry shim, owned by the C stack.  None if the layout check
    fails."""
    inner = _interpreter_frame(frame)
    if inner is None:
        return None
    if not inner.previous:
        return True
    try:
        previous = _InterpreterFrame.from_address(inner.previous)
        return previous.owner == bytes([_FRAME_OWNED_BY_CSTACK])
    except Exception:
        return None


def running_function(frame: types.FrameType) -> types.FunctionType | None:
    """The function object executing ``frame`` (the interpreter frame's
    ``f_funcobj``; checked against the frame's code)."""
    return _running_function(frame, _interpreter_frame(frame), "f_funcobj")


def _unbind(frame: types.FrameType, name: str) -> None:
    """``del name`` in a suspended function frame: its slot becomes NULL (a
    cell is emptied instead).  Raises ``ValueError`` when it cannot be done."""
    code = frame.f_code
    cells = [c for c in code.co_cellvars if c not in code.co_varnames]
    names = list(code.co_varnames) + cells + list(code.co_freevars)
    if name not in names:
        raise ValueError(f"{name} is not a variable of {code.co_qualname}()")
    inner = _interpreter_frame(frame)
    if inner is None:
        raise ValueError("the frame's layout is not the one daifu knows")
    slot = ctypes.c_void_p.from_address(ctypes.addressof(inner) + _LOCALSPLUS
                                        + ctypes.sizeof(ctypes.c_void_p) * names.index(name))
    if not slot.value:
        return  # already unbound
    value = ctypes.cast(slot.value, ctypes.py_object).value
    if type(value) is types.CellType and (name in code.co_cellvars or name in code.co_freevars):
        try:
            del value.cell_contents
        except ValueError:
            pass
        return
    slot.value = None  # the frame's reference ...
    _decref(value)  # ... is dropped; ours goes when this returns


def swap_code(frame: types.FrameType, new: types.CodeType, call_old: int, resume_old: int,
              call_new: int, resume_new: int) -> bool:
    """Make ``frame``, suspended in the Python call at byte ``call_old`` of its
    code (which returns to byte ``resume_old``), return into ``new`` at byte
    ``resume_new`` instead (``_frameread.swap_code``).  3.13 keeps the call
    itself in ``instr_ptr`` and the distance to where a return goes on in
    ``return_offset`` (code units)."""
    inner = _interpreter_frame(frame)
    if inner is None or resume_new - call_new != resume_old - call_old \
            or inner.return_offset != (resume_old - call_old) // 2:
        return False
    return _swap_code(frame, inner, "f_executable", "instr_ptr", new, call_old, call_new)
