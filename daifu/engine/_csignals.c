/* daifu.engine._csignals: the program's signal handlers, held back while
 * daifu's own code runs, in C.
 *
 * CPython runs a Python signal handler on the main thread at the next
 * "eval breaker" check: a call's return, a backward jump, a function's
 * start.  daifu's code runs in the middle of the program's -- the stubs of
 * a vaccinated frame, the barrier, the engine deciding whether an exception
 * is a crash -- so without this a handler could run there, and the
 * exception it raises (KeyboardInterrupt, a timeout's) would land in
 * daifu's code instead of the program's: lost, or reported as daifu's own
 * error.  So every Python-level handler the program installs is wrapped in
 * a ``Handler``.  Called outside daifu, it calls the program's handler
 * with the same arguments (a C call: no frame of daifu's is seen).  Called
 * while daifu's code runs -- ``hold()`` is in force (the engine decides on
 * the main thread), the interrupted frame is daifu's, or it stands at an
 * instruction with no line (a stub's) -- it holds the signal back and
 * schedules a pending call (``Py_AddPendingCall``), which the interpreter
 * runs at a later check on the main thread: the handler runs at the first
 * check that finds the program's own code again, with that frame, exactly
 * as the interpreter would have run it there.  ``live(mask)``: the signals
 * a human's wait must receive at once (Ctrl-C at the console, SIGTERM),
 * even while held.
 *
 * Public C API only (PyFrame_GetLasti, PyCode_Addr2Line, Py_AddPendingCall).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>  /* (T_OBJECT_EX, READONLY: 3.11) */
#include <signal.h>

#ifndef NSIG
#define NSIG 65
#endif

/* daifu's package directory, with its trailing separator */
static PyObject *prefix;
/* the real ``_signal.signal`` and ``_signal.getsignal`` */
static PyObject *real_signal, *getsignal;
/* > 0 while the engine holds signals back (``hold``/``release``) */
static long held;
/* signals a human's wait receives at once, held or not */
static unsigned long long live;
/* signals that came while held, to deliver at ``release`` */
static unsigned long long waiting;
/* signals with a pending call scheduled */
static unsigned long long scheduled;

typedef struct {
    PyObject_HEAD
    PyObject *handler;  /* the program's */
    vectorcallfunc vectorcall;
} Handler;

static PyTypeObject HandlerType;

/* Is the program's code running in ``frame`` (not daifu's)? */
static int
in_daifu(PyObject *frame)
{
    if (frame == NULL || !PyFrame_Check(frame)) {
        return 0;
    }
    PyCodeObject *code = PyFrame_GetCode((PyFrameObject *)frame);
    int lasti = PyFrame_GetLasti((PyFrameObject *)frame);
    int ours = (lasti >= 0 && PyCode_Addr2Line(code, lasti) < 0)  /* a stub: no line */
        || (prefix != NULL && PyUnicode_Check(code->co_filename)
            && PyUnicode_Tailmatch(code->co_filename, prefix, 0, PY_SSIZE_T_MAX, -1) == 1);
    Py_DECREF(code);
    if (PyErr_Occurred()) {
        PyErr_Clear();
    }
    return ours;
}

static int deliver(void *arg);

/* a handler as the program knows it (new reference) */
static PyObject *
unwrapped(PyObject *h)
{
    if (h != NULL && Py_IS_TYPE(h, &HandlerType)) {
        PyObject *inner = Py_NewRef(((Handler *)h)->handler);
        Py_DECREF(h);
        return inner;
    }
    return h;
}

static void
schedule(int signum)
{
    unsigned long long bit = 1ULL << signum;
    if (scheduled & bit) {
        return;
    }
    if (Py_AddPendingCall(deliver, (void *)(intptr_t)signum) == 0) {
        scheduled |= bit;
    }
    else {
        waiting |= bit;  /* (the queue is full: at the next release) */
    }
}

/* The program's handler for ``signum`` now (new reference), or NULL with
 * no error set when there is none to call (SIG_DFL, SIG_IGN). */
static PyObject *
current(int signum)
{
    PyObject *h = unwrapped(PyObject_CallFunction(getsignal, "i", signum));
    if (h == NULL) {
        return NULL;
    }
    if (!PyCallable_Check(h)) {
        Py_DECREF(h);
        return NULL;
    }
    return h;
}

/* A pending call: run the handler held back, once the program's code runs
 * again (until then, schedule it again). */
static int
deliver(void *arg)
{
    int signum = (int)(intptr_t)arg;
    unsigned long long bit = 1ULL << signum;
    scheduled &= ~bit;
    PyObject *frame = (PyObject *)PyEval_GetFrame();  /* borrowed */
    if (!(live & bit) && (held > 0 || in_daifu(frame))) {
        if (held > 0) {
            waiting |= bit;
        }
        else {
            schedule(signum);
        }
        return 0;
    }
    PyObject *h = current(signum);
    if (h == NULL) {
        return PyErr_Occurred() ? -1 : 0;
    }
    PyObject *res = PyObject_CallFunction(h, "iO", signum, frame ? frame : Py_None);
    Py_DECREF(h);
    if (res == NULL) {
        return -1;  /* raised where the program runs, as the interpreter raises it */
    }
    Py_DECREF(res);
    return 0;
}

static PyObject *
Handler_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (kwnames == NULL && n == 2 && PyLong_Check(args[0])) {
        long signum = PyLong_AsLong(args[0]);
        if (signum > 0 && signum < NSIG && signum < 64) {
            unsigned long long bit = 1ULL << signum;
            if (!(live & bit) && (held > 0 || in_daifu(args[1]))) {
                if (held > 0) {
                    waiting |= bit;
                }
                else {
                    schedule((int)signum);
                }
                Py_RETURN_NONE;
            }
        }
        PyErr_Clear();
    }
    return PyObject_Vectorcall(((Handler *)self)->handler, args, nargsf, kwnames);
}

static PyObject *
Handler_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *handler;
    if (!PyArg_ParseTuple(args, "O:Handler", &handler)) {
        return NULL;
    }
    Handler *self = (Handler *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->handler = Py_NewRef(handler);
    self->vectorcall = Handler_vectorcall;
    return (PyObject *)self;
}

static int
Handler_traverse(Handler *self, visitproc visit, void *arg)
{
    Py_VISIT(self->handler);
    return 0;
}

static int
Handler_clear(Handler *self)
{
    Py_CLEAR(self->handler);
    return 0;
}

static void
Handler_dealloc(Handler *self)
{
    PyObject_GC_UnTrack(self);
    Handler_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
Handler_repr(Handler *self)
{
    return PyUnicode_FromFormat("<daifu signal handler for %R>", self->handler);
}

static PyMemberDef Handler_members[] = {
    {"handler", T_OBJECT_EX, offsetof(Handler, handler), READONLY, "the program's handler"},
    {NULL}
};

static PyTypeObject HandlerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "daifu.engine._csignals.Handler",
    .tp_basicsize = sizeof(Handler),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = Handler_new,
    .tp_dealloc = (destructor)Handler_dealloc,
    .tp_traverse = (traverseproc)Handler_traverse,
    .tp_clear = (inquiry)Handler_clear,
    .tp_repr = (reprfunc)Handler_repr,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Handler, vectorcall),
    .tp_members = Handler_members,
    .tp_doc = "A program's signal handler, held back while daifu's own code runs.",
};

static PyObject *
setup(PyObject *module, PyObject *args)
{
    PyObject *dir, *set, *get;
    if (!PyArg_ParseTuple(args, "UOO:setup", &dir, &set, &get)) {
        return NULL;
    }
    Py_XSETREF(prefix, Py_NewRef(dir));
    Py_XSETREF(real_signal, Py_NewRef(set));
    Py_XSETREF(getsignal, Py_NewRef(get));
    Py_RETURN_NONE;
}

/* ``_signal.signal`` as ``signal.signal`` calls it: the program's handler
 * wrapped, the previous one given back as the program set it */
static PyObject *
shim_signal(PyObject *module, PyObject *args)
{
    PyObject *signalnum, *handler;
    if (!PyArg_ParseTuple(args, "OO:signal", &signalnum, &handler)) {
        return NULL;
    }
    PyObject *wrapped;
    if (PyCallable_Check(handler) && !Py_IS_TYPE(handler, &HandlerType)) {
        wrapped = PyObject_CallOneArg((PyObject *)&HandlerType, handler);
        if (wrapped == NULL) {
            return NULL;
        }
    }
    else {
        wrapped = Py_NewRef(handler);
    }
    PyObject *previous = PyObject_CallFunctionObjArgs(real_signal, signalnum, wrapped, NULL);
    Py_DECREF(wrapped);
    return unwrapped(previous);
}

static PyObject *
shim_getsignal(PyObject *module, PyObject *signalnum)
{
    return unwrapped(PyObject_CallOneArg(getsignal, signalnum));
}

static PyObject *
hold(PyObject *module, PyObject *unused)
{
    held++;
    Py_RETURN_NONE;
}

/* the end of a hold: what came meanwhile is scheduled (delivered once the
 * program's code runs again) */
static PyObject *
release(PyObject *module, PyObject *unused)
{
    if (held > 0) {
        held--;
    }
    if (held == 0 && waiting) {
        unsigned long long w = waiting;
        waiting = 0;
        for (int s = 1; s < 64; s++) {
            if (w & (1ULL << s)) {
                schedule(s);
            }
        }
    }
    Py_RETURN_NONE;
}

static PyObject *
set_live(PyObject *module, PyObject *arg)
{
    unsigned long long previous = live;
    live = PyLong_AsUnsignedLongLongMask(arg);
    if (PyErr_Occurred()) {
        return NULL;
    }
    if (held == 0 && waiting) {  /* (a live signal that waited) */
        unsigned long long w = waiting & live;
        waiting &= ~w;
        for (int s = 1; s < 64; s++) {
            if (w & (1ULL << s)) {
                schedule(s);
            }
        }
    }
    return PyLong_FromUnsignedLongLong(previous);
}

static PyObject *
state(PyObject *module, PyObject *unused)
{
    return Py_BuildValue("(lKKK)", held, live, waiting, scheduled);
}

static PyMethodDef methods[] = {
    {"setup", setup, METH_VARARGS,
     "setup(daifu_dir, signal, getsignal): daifu's package directory (frames there are "
     "daifu's) and the real _signal.signal and _signal.getsignal"},
    {"signal", shim_signal, METH_VARARGS,
     "signal(signalnum, handler): _signal.signal, the handler wrapped in a Handler"},
    {"getsignal", shim_getsignal, METH_O,
     "getsignal(signalnum): _signal.getsignal, the program's handler unwrapped"},
    {"hold", hold, METH_NOARGS, "hold the program's signals back (nested)"},
    {"release", release, METH_NOARGS, "end a hold; what came meanwhile is delivered"},
    {"set_live", set_live, METH_O,
     "set_live(mask) -> the previous mask: signals delivered at once even while held"},
    {"state", state, METH_NOARGS, "(held, live, waiting, scheduled), for tests"},
    {NULL, NULL, 0, NULL}
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "daifu.engine._csignals",
    "The program's signal handlers, held back while daifu's own code runs.", -1, methods,
};

PyMODINIT_FUNC
PyInit__csignals(void)
{
    if (PyType_Ready(&HandlerType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "Handler", (PyObject *)&HandlerType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
