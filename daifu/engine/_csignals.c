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
#include <time.h>
#include <pthread.h>

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

/* ``call_soon(fn)``: ``fn()`` on the main thread at the interpreter's next
 * check between instructions (a pending call), with the program's tracer
 * and profiler off and its signals held back meanwhile: daifu's own work
 * done in the program's thread but unseen by it (``_preload``).  What
 * ``fn`` raises is dropped. */
static int
run_soon(void *arg)
{
    PyObject *fn = (PyObject *)arg;  /* (a reference owned by this call) */
    if (fn == NULL) {
        return 0;
    }
    PyThreadState *tstate = PyThreadState_Get();
    Py_tracefunc trace = tstate->c_tracefunc, profile = tstate->c_profilefunc;
    PyObject *traceobj = Py_XNewRef(tstate->c_traceobj);
    PyObject *profileobj = Py_XNewRef(tstate->c_profileobj);
    if (trace != NULL) {
        PyEval_SetTrace(NULL, NULL);
    }
    if (profile != NULL) {
        PyEval_SetProfile(NULL, NULL);
    }
    held++;
    PyObject *res = PyObject_CallNoArgs(fn);
    Py_XDECREF(res);
    PyErr_Clear();
    Py_DECREF(fn);
    if (profile != NULL) {
        PyEval_SetProfile(profile, profileobj);
    }
    if (trace != NULL) {
        PyEval_SetTrace(trace, traceobj);
    }
    Py_XDECREF(traceobj);
    Py_XDECREF(profileobj);
    PyErr_Clear();
    PyObject *none = release(NULL, NULL);  /* (what came meanwhile: scheduled) */
    Py_XDECREF(none);
    PyErr_Clear();
    return 0;
}

static PyObject *
call_soon(PyObject *module, PyObject *fn)
{
    Py_INCREF(fn);
    if (Py_AddPendingCall(run_soon, fn) != 0) {
        Py_DECREF(fn);
        Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
}

/* ``timer_start(seconds, fn)``: ``call_soon(fn)`` once ``seconds`` have
 * passed, asked for by a thread of its own that is no Python thread (no
 * thread state, in no ``threading.enumerate()``, all signals blocked): it
 * waits on a condition and calls ``Py_AddPendingCall``, nothing else.
 * ``timer_stop()`` ends it (and joins it) and returns the seconds that were
 * left, or None where none was waiting: the preload stops it before a fork
 * (a 3.12+ ``fork()`` warns of a process with threads) and starts it again
 * after.  One at a time. */
static pthread_mutex_t timer_mutex = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t timer_cond;
static int timer_cond_ready = 0;
static pthread_t timer_thread;
static int timer_running = 0;  /* (a thread to join) */
static int timer_stopping = 0;
static double timer_due = 0.0;
static PyObject *timer_fn = NULL;  /* (owned; handed to the pending call) */

#if PY_VERSION_HEX < 0x030D0000
#define Py_IsFinalizing _Py_IsFinalizing
#endif

static double
monotonic(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *
timer_main(void *unused)
{
    pthread_mutex_lock(&timer_mutex);
    while (!timer_stopping && monotonic() < timer_due) {
        struct timespec ts;
        double due = timer_due;
        ts.tv_sec = (time_t)due;
        ts.tv_nsec = (long)((due - (double)ts.tv_sec) * 1e9);
        pthread_cond_timedwait(&timer_cond, &timer_mutex, &ts);
    }
    PyObject *fn = NULL;
    if (!timer_stopping) {
        fn = timer_fn;
        timer_fn = NULL;
    }
    pthread_mutex_unlock(&timer_mutex);
    if (fn != NULL && !Py_IsFinalizing()) {
        if (Py_AddPendingCall(run_soon, fn) != 0) {
            return NULL;  /* (the queue is full: dropped -- a reference leaked, no call) */
        }
#if PY_VERSION_HEX < 0x030D0000
        /* (before 3.13 a pending call asked for by another thread wakes the
         * main thread only when it next works out what it has to handle --
         * when it takes the GIL back after a switch: ask for one) */
        if (!Py_IsFinalizing()) {
            PyGILState_STATE gil = PyGILState_Ensure();
            PyGILState_Release(gil);
        }
#endif
    }
    return NULL;
}

static void
timer_join(void)
{
    /* (the GIL is released while joining: the thread takes no GIL, but
     * Py_AddPendingCall may wait for the pending calls' lock) */
    if (!timer_running) {
        return;
    }
    pthread_mutex_lock(&timer_mutex);
    timer_stopping = 1;
    pthread_cond_signal(&timer_cond);
    pthread_mutex_unlock(&timer_mutex);
    Py_BEGIN_ALLOW_THREADS
    pthread_join(timer_thread, NULL);
    Py_END_ALLOW_THREADS
    timer_running = 0;
}

static PyObject *
timer_stop(PyObject *module, PyObject *unused)
{
    timer_join();
    PyObject *fn = timer_fn;  /* (the thread has ended: nobody else touches it) */
    timer_fn = NULL;
    if (fn == NULL) {
        Py_RETURN_NONE;
    }
    Py_DECREF(fn);
    double left = timer_due - monotonic();
    return PyFloat_FromDouble(left > 0.0 ? left : 0.0);
}

/* (in a child of fork() -- any fork, os.fork() or C's -- the thread is not
 * there: nothing to join, no timer; its function's reference is left) */
static void
timer_atfork_child(void)
{
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    timer_mutex = fresh;
    timer_running = 0;
    timer_stopping = 0;
    timer_fn = NULL;
    timer_cond_ready = 0;
}

static int timer_atfork_set = 0;

static PyObject *
timer_start(PyObject *module, PyObject *args)
{
    double seconds;
    PyObject *fn;
    if (!PyArg_ParseTuple(args, "dO:timer_start", &seconds, &fn)) {
        return NULL;
    }
    timer_join();  /* (one that has fired: joined; one waiting: replaced) */
    Py_CLEAR(timer_fn);
    if (!timer_atfork_set) {
        if (pthread_atfork(NULL, NULL, timer_atfork_child) != 0) {
            Py_RETURN_FALSE;
        }
        timer_atfork_set = 1;
    }
    if (!timer_cond_ready) {
        pthread_condattr_t attr;
        pthread_condattr_init(&attr);
        pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
        pthread_cond_init(&timer_cond, &attr);
        pthread_condattr_destroy(&attr);
        timer_cond_ready = 1;
    }
    timer_fn = Py_NewRef(fn);
    timer_due = monotonic() + (seconds > 0.0 ? seconds : 0.0);
    timer_stopping = 0;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);  /* (the new thread inherits it) */
    int err = pthread_create(&timer_thread, NULL, timer_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (err != 0) {
        Py_CLEAR(timer_fn);
        Py_RETURN_FALSE;
    }
    timer_running = 1;
    Py_RETURN_TRUE;
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
    {"call_soon", call_soon, METH_O,
     "call_soon(fn) -> scheduled: fn() on the main thread at the next check between "
     "instructions, untraced, signals held"},
    {"timer_start", timer_start, METH_VARARGS,
     "timer_start(seconds, fn) -> started: call_soon(fn) once seconds have passed "
     "(a thread that is no Python thread waits)"},
    {"timer_stop", timer_stop, METH_NOARGS,
     "timer_stop() -> the seconds that were left, or None: the timer ended, its thread joined"},
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
