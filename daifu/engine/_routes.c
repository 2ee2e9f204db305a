/* daifu.engine._routes: the barrier's first check, in C.
 *
 * An exception the program handles (EAFP: ``try: d[k]`` / ``except
 * KeyError`` a few calls up) reaches the stub of every vaccinated frame it
 * passes.  The first stub calls the barrier; when the exception takes the
 * route a search found to a sure catch before (``_guards.ROUTES``: the same
 * raising code, the same callers at the same offsets, the handler's name
 * still naming the same class), the barrier marks it as passing and answers
 * "re-raise" -- nothing else is asked.  That check is identity and offset
 * reads of frames; in Python each read is a descriptor call, and the check
 * cost more than the rest of a raise through two frames (CPython 3.13).
 * Here it is the same check through the C API; anything else -- no route,
 * another way, the engine not quiet, any error -- goes to the Python
 * barrier's judgement (``_barrier.judge``) exactly as before, with the
 * stub's frame.
 *
 * Optional: ``_barrier.entry`` uses ``barrier`` when this module is built
 * (``pip install`` builds it when a C compiler is there) and the Python
 * ``_barrier.barrier``, which makes the same check, when it is not.
 * Public C API only (CPython 3.11+: PyFrame_GetLasti, PyFrame_GetGlobals).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* what ``install`` was given: ``_guards.ROUTES``, ``_guards.passing``, the
 * judgement, the answer "re-raise" */
static PyObject *routes, *passing, *judge, *raise_code;

/* Does ``LOAD_GLOBAL name`` in ``f`` give ``cls`` (globals, then builtins)?
 * 0 with an error set when a lookup failed. */
static int
held_by(PyFrameObject *f, PyObject *name, PyObject *cls)
{
    if (!PyUnicode_Check(name)) {
        return 0;
    }
    PyObject *globals = PyFrame_GetGlobals(f);
    PyObject *value = PyDict_GetItemWithError(globals, name);  /* borrowed */
    Py_DECREF(globals);
    if (value == NULL && !PyErr_Occurred()) {
        PyObject *builtins = PyFrame_GetBuiltins(f);
        value = PyDict_Check(builtins) ? PyDict_GetItemWithError(builtins, name) : NULL;
        Py_DECREF(builtins);
    }
    return value != NULL && value == cls;
}

/* Does ``exc``, raised in the cell ``ref`` names, in ``frame``, take the
 * route remembered for that cell?  Then mark it as passing (``passing[0]``,
 * and the constant of the catching frame's stub in ``passing[1]``).  Route:
 * (exception class, raising code, ((code, offset) of each caller up to the
 * handler), the handler's name, the class it held -- or, for ``except (A,
 * B):``, a tuple of names and one of the classes they held -- the catching
 * stub's constant).  0 and no error set for "no" and for anything unexpected. */
static int
route_taken(PyObject *exc, PyObject *ref, PyFrameObject *frame)
{
    PyObject *route = PyDict_GetItemWithError(routes, ref);  /* borrowed */
    if (route == NULL) {
        PyErr_Clear();  /* (an unhashable ref: not one of daifu's) */
        return 0;
    }
    if (!PyTuple_Check(route) || PyTuple_GET_SIZE(route) != 6
            || PyTuple_GET_ITEM(route, 0) != (PyObject *)Py_TYPE(exc)
            || PyList_GET_ITEM(passing, 2) != Py_True) {  /* (the engine is quiet) */
        return 0;
    }
    PyCodeObject *code = PyFrame_GetCode(frame);
    int ok = (PyObject *)code == PyTuple_GET_ITEM(route, 1);
    Py_DECREF(code);
    PyObject *hops = PyTuple_GET_ITEM(route, 2);
    if (!ok || !PyTuple_Check(hops)) {
        return 0;
    }
    PyFrameObject *f = (PyFrameObject *)Py_NewRef(frame);
    for (Py_ssize_t i = 0; ok && i < PyTuple_GET_SIZE(hops); i++) {
        PyObject *hop = PyTuple_GET_ITEM(hops, i);
        PyFrameObject *back = PyFrame_GetBack(f);  /* (new reference, or NULL) */
        Py_DECREF(f);
        f = back;
        if (f == NULL || !PyTuple_Check(hop) || PyTuple_GET_SIZE(hop) != 2) {
            Py_XDECREF(f);
            PyErr_Clear();  /* (no caller: none set; a frame object not made: cleared) */
            return 0;
        }
        code = PyFrame_GetCode(f);
        ok = (PyObject *)code == PyTuple_GET_ITEM(hop, 0)
             && PyLong_AsLong(PyTuple_GET_ITEM(hop, 1)) == PyFrame_GetLasti(f);
        Py_DECREF(code);
    }
    if (ok) {  /* what ``LOAD_GLOBAL name`` gives in the catching frame now */
        PyObject *name = PyTuple_GET_ITEM(route, 3);
        PyObject *held = PyTuple_GET_ITEM(route, 4);
        if (name == Py_None) {
            /* into C code that may catch it at the caller's call, as before:
             * nothing passing, no handler of the program's to check */
        }
        else if (PyUnicode_Check(name)) {
            ok = held_by(f, name, held);
        }
        else if (PyTuple_Check(name) && PyTuple_Check(held)
                 && PyTuple_GET_SIZE(name) == PyTuple_GET_SIZE(held)) {
            /* ``except (A, B):``: each name */
            for (Py_ssize_t i = 0; ok && i < PyTuple_GET_SIZE(name); i++) {
                ok = held_by(f, PyTuple_GET_ITEM(name, i), PyTuple_GET_ITEM(held, i));
            }
        }
        else {
            ok = 0;
        }
    }
    Py_DECREF(f);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    if (!ok) {
        return 0;
    }
    if (PyTuple_GET_ITEM(route, 5) == Py_None) {
        return 1;  /* (left for C code: no stub of the program's lets it pass) */
    }
    /* (a list's items replaced by reference: the old ones are released) */
    PyList_SetItem(passing, 1, Py_NewRef(PyTuple_GET_ITEM(route, 5)));
    PyList_SetItem(passing, 0, Py_NewRef(exc));
    return 1;
}

/* Is "re-raise" the answer for ``exc`` in the cell ``ref`` names, in
 * ``frame``, with nothing judged?  The end of an iteration (a class's
 * ``__next__`` ending a ``for``: never a crash) while the engine is quiet,
 * or a remembered route taken (``route_taken``, which marks it passing). */
static int
answered(PyObject *exc, PyObject *ref, PyFrameObject *frame)
{
    PyTypeObject *type = Py_TYPE(exc);
    if ((type == (PyTypeObject *)PyExc_StopIteration
            || type == (PyTypeObject *)PyExc_StopAsyncIteration)
            && PyList_GET_ITEM(passing, 2) == Py_True) {
        return 1;
    }
    return route_taken(exc, ref, frame);
}

/* quick(exc, ref): what a stub calls first, tracing left as it is (a call
 * of this C function through its ``__call__`` is no event for a profiler,
 * and it runs no Python code): the answer "re-raise" where no judgement is
 * needed -- the end of an iteration while the engine is quiet, a remembered
 * route taken -- else False, and the stub suspends tracing and calls
 * ``barrier``.  The stubs of a process without this module call a builtin
 * that answers False (``_barrier.entry``). */
static PyObject *
quick(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || judge == NULL) {
        Py_RETURN_FALSE;
    }
    PyFrameObject *frame = PyEval_GetFrame();  /* the stub's frame (borrowed) */
    if (frame == NULL) {
        Py_RETURN_FALSE;
    }
    if (answered(args[0], args[1], frame)) {
        return Py_NewRef(raise_code);
    }
    Py_RETURN_FALSE;
}

/* barrier(exc, ref, lasti, stack): what the stubs call (tracing suspended) */
static PyObject *
barrier(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || judge == NULL) {
        PyErr_SetString(PyExc_TypeError, "daifu barrier: called with the wrong arguments");
        return NULL;  /* (the stub answers "re-raise" for a failed call) */
    }
    PyFrameObject *frame = PyEval_GetFrame();  /* the stub's frame (borrowed) */
    if (frame == NULL) {
        PyErr_SetString(PyExc_SystemError, "daifu barrier: no Python frame");
        return NULL;
    }
    if (answered(args[0], args[1], frame)) {
        return Py_NewRef(raise_code);
    }
    PyObject *call[5] = {args[0], args[1], args[2], args[3], (PyObject *)frame};
    return PyObject_Vectorcall(judge, call, 5, NULL);
}

static PyObject *
install(PyObject *module, PyObject *args)
{
    PyObject *r, *p, *j, *code;
    if (!PyArg_ParseTuple(args, "O!O!OO:install", &PyDict_Type, &r, &PyList_Type, &p, &j,
                          &code)) {
        return NULL;
    }
    if (PyList_GET_SIZE(p) < 3) {
        PyErr_SetString(PyExc_ValueError, "install: passing needs at least 3 slots");
        return NULL;
    }
    Py_XSETREF(routes, Py_NewRef(r));
    Py_XSETREF(passing, Py_NewRef(p));
    Py_XSETREF(judge, Py_NewRef(j));
    Py_XSETREF(raise_code, Py_NewRef(code));
    PyObject *b = PyObject_GetAttrString(module, "barrier");
    PyObject *q = b == NULL ? NULL : PyObject_GetAttrString(module, "quick");
    PyObject *out = q == NULL ? NULL : PyTuple_Pack(2, b, q);
    Py_XDECREF(b);
    Py_XDECREF(q);
    return out;
}

static PyMethodDef methods[] = {
    {"barrier", (PyCFunction)(void (*)(void))barrier, METH_FASTCALL,
     "barrier(exc, ref, lasti, stack): the remembered route's check, then judge(..., frame)"},
    {"quick", (PyCFunction)(void (*)(void))quick, METH_FASTCALL,
     "quick(exc, ref): raise_code where the remembered route is taken, else False"},
    {"install", install, METH_VARARGS,
     "install(routes, passing, judge, raise_code) -> (barrier, quick)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "daifu.engine._routes",
    "The barrier's check of remembered routes, in C (see _barrier.entry).", -1, methods,
};

PyMODINIT_FUNC
PyInit__routes(void)
{
    return PyModule_Create(&module);
}
