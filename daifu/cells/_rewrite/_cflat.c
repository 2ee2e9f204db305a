/* daifu.cells._rewrite._cflat: ``_flat.flat_start``, in C.
 *
 * Arming flat code (no exception table, no loop iterator, no jump into a
 * statement with values on the stack) needs one walk along its raw
 * instructions: their stack depths and, where the stack holds values, that
 * each instruction is in the statement of the one before it.  In Python the
 * walk cost ~1.5 us an instruction -- most of what arming a program's
 * functions cost at its first start.  This is the same walk through the C
 * API: the same opcode tables (``setup``, given by ``_flat`` from the
 * ``_decode`` tables), CPython's own stack effects, the code's positions,
 * and the statement index's ``locate`` (a Python call, once per
 * statement).  ``tests/test_transform.py`` checks that it answers as
 * the Python ``flat_start`` does for every code object of the standard
 * library.
 *
 * Optional: ``_flat`` uses the Python walk where this is not built (or
 * ``DAIFU_SPEEDUPS=0``).  Public C API only.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

/* per opcode (``setup``): bit 0 it takes an argument, bit 1 not in flat
 * code after its prologue, bit 2 no fall-through, bits 3-4 its jump (1
 * forward, 2 backward, 3 absolute); and its CACHE units */
#define F_ARG 1
#define F_REFUSED 2
#define F_ENDS 4
static unsigned char flags[256], caches[256];
static int resume_op = -1, extended_arg_op = -1;
static long not_flat_flags;
static PyObject *s_locate;

/* the four ints of ``t`` (a position or a span); 0 where one is None or
 * not an int (``*known`` cleared), -1 with an error set */
static int
four_ints(PyObject *t, long out[4], int *known)
{
    *known = 1;
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 4) {
        *known = 0;
        return 0;
    }
    for (int k = 0; k < 4; k++) {
        PyObject *v = PyTuple_GET_ITEM(t, k);
        if (!PyLong_Check(v)) {
            *known = 0;
            out[k] = 0;
            continue;
        }
        out[k] = PyLong_AsLong(v);
        if (out[k] == -1 && PyErr_Occurred()) {
            return -1;
        }
    }
    return 0;
}

/* skip ``n`` items of the iterator ``it``: 0, or -1 (an error set, or the
 * iterator ended: ``*ended``) */
static int
skip(PyObject *it, Py_ssize_t n, int *ended)
{
    for (; n > 0; n--) {
        PyObject *item = PyIter_Next(it);
        if (item == NULL) {
            *ended = !PyErr_Occurred();
            return -1;
        }
        Py_DECREF(item);
    }
    return 0;
}

static PyObject *
flat_start(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "flat_start(code, index)");
        return NULL;
    }
    if (resume_op < 0) {
        PyErr_SetString(PyExc_RuntimeError, "_cflat.setup was not called");
        return NULL;
    }
    PyObject *code = args[0], *index = args[1];
    PyObject *result = NULL, *table = NULL, *raw_obj = NULL, *positions = NULL;
    PyObject *last_pos = NULL, *stmt = NULL, *cur = NULL, *previous = NULL;
    unsigned char *landed = NULL, *seen = NULL;
    if (!PyCode_Check(code)) {
        PyErr_SetString(PyExc_TypeError, "flat_start: a code object");
        return NULL;
    }
    table = PyObject_GetAttrString(code, "co_exceptiontable");
    if (table == NULL) {
        goto done;
    }
    PyObject *co_flags = PyObject_GetAttrString(code, "co_flags");
    if (co_flags == NULL) {
        goto done;
    }
    long cflags = PyLong_AsLong(co_flags);
    Py_DECREF(co_flags);
    if (cflags == -1 && PyErr_Occurred()) {
        goto done;
    }
    if (!PyBytes_Check(table) || PyBytes_GET_SIZE(table) != 0 || (cflags & not_flat_flags)) {
        goto no;
    }
    raw_obj = PyObject_GetAttrString(code, "co_code");
    if (raw_obj == NULL) {
        goto done;
    }
    if (!PyBytes_Check(raw_obj)) {
        goto no;
    }
    const unsigned char *raw = (const unsigned char *)PyBytes_AS_STRING(raw_obj);
    Py_ssize_t units = PyBytes_GET_SIZE(raw_obj) / 2;
    Py_ssize_t u = 0;
    while (u < units && raw[2 * u] != resume_op) {
        u += 1 + caches[raw[2 * u]];
    }
    Py_ssize_t start = u + 1 + caches[resume_op];
    u = start;
    if (start >= units - 2) {  /* (a ``return`` and nothing else) */
        goto no;
    }
    landed = PyMem_Calloc(units + 1, 1);
    seen = PyMem_Calloc(units + 1, 1);
    if (landed == NULL || seen == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    positions = PyObject_CallMethod(code, "co_positions", NULL);
    if (positions == NULL) {
        goto done;
    }
    int ended = 0;
    if (skip(positions, start, &ended) < 0) {
        if (ended) {
            goto no;
        }
        goto done;
    }
    Py_ssize_t pos_at = start;
    long span[4] = {-1, -1, -1, -1};
    int found = 0, reachable = 1;
    long depth = 0;
    while (u < units) {
        Py_ssize_t at = u;
        int op = raw[2 * u];
        long arg = raw[2 * u + 1];
        while (op == extended_arg_op) {
            u++;
            if (u >= units) {
                goto no;
            }
            op = raw[2 * u];
            arg = (arg << 8) | raw[2 * u + 1];
        }
        if (flags[op] & F_REFUSED) {
            goto no;
        }
        if (landed[at]) {
            if (reachable && depth != 0) {
                goto no;
            }
            depth = 0;
            reachable = 1;
        }
        Py_ssize_t nxt = u + 1 + caches[op];
        if (!reachable) {  /* (dead code: never run) */
            u = nxt;
            continue;
        }
        if (u != pos_at && skip(positions, u - pos_at, &ended) < 0) {
            if (ended) {
                goto no;
            }
            goto done;
        }
        PyObject *pos = PyIter_Next(positions);
        if (pos == NULL) {
            if (PyErr_Occurred()) {
                goto done;
            }
            goto no;
        }
        pos_at = u + 1;
        int same = 0;
        if (last_pos != NULL) {
            same = PyObject_RichCompareBool(pos, last_pos, Py_EQ);
            if (same < 0) {
                Py_DECREF(pos);
                goto done;
            }
        }
        if (same) {
            Py_DECREF(pos);
        }
        else {
            Py_XSETREF(last_pos, pos);
            long p[4];
            int known;
            if (four_ints(pos, p, &known) < 0) {
                goto done;
            }
            /* (line, end line, column, end column) inside the statement
             * found last, before its nested statements */
            if (cur != NULL && known
                    && (span[0] < p[0] || (span[0] == p[0] && span[1] <= p[2]))
                    && (p[1] < span[2] || (p[1] == span[2] && p[3] <= span[3]))) {
                Py_XSETREF(stmt, Py_NewRef(cur));
            }
            else {
                PyObject *located = PyObject_CallMethodOneArg(index, s_locate, pos);
                if (located == NULL) {
                    goto done;
                }
                if (located == Py_None) {
                    Py_XSETREF(stmt, located);
                }
                else {
                    if (!PyTuple_Check(located) || PyTuple_GET_SIZE(located) != 5) {
                        Py_DECREF(located);
                        goto no;
                    }
                    PyObject *own = PyTuple_GetSlice(located, 1, 5);
                    if (own == NULL) {
                        Py_DECREF(located);
                        goto done;
                    }
                    int whole;
                    int bad = four_ints(own, span, &whole);
                    Py_DECREF(own);
                    found = 1;
                    Py_XSETREF(stmt, Py_NewRef(PyTuple_GET_ITEM(located, 0)));
                    Py_XSETREF(cur, Py_NewRef(stmt));
                    Py_DECREF(located);
                    if (bad < 0) {
                        goto done;
                    }
                    if (!whole) {
                        goto no;
                    }
                }
            }
        }
        if (depth == 0) {
            seen[at] = 1;
        }
        else if (stmt == NULL || stmt == Py_None || stmt != previous) {
            goto no;  /* (a run would start here, above values on the stack) */
        }
        Py_XSETREF(previous, Py_XNewRef(stmt));
        int a = (flags[op] & F_ARG) ? (int)arg : 0;
        int jump = (flags[op] >> 3) & 3;
        if (jump) {
            Py_ssize_t target = jump == 1 ? nxt + arg : jump == 2 ? nxt - arg : arg;
            int taken = PyCompile_OpcodeStackEffectWithJump(op, a, 1);
            if (taken == PY_INVALID_STACK_EFFECT || depth + taken != 0
                    || target < 0 || target > units
                    || (target <= at && !seen[target])) {
                goto no;  /* (a jump into a statement with values on the stack) */
            }
            landed[target] = 1;
        }
        if (flags[op] & F_ENDS) {
            reachable = 0;
        }
        else {
            int effect = PyCompile_OpcodeStackEffectWithJump(op, a, 0);
            if (effect == PY_INVALID_STACK_EFFECT) {
                goto no;
            }
            depth += effect;
        }
        u = nxt;
    }
    if (found) {
        result = PyLong_FromSsize_t(start);
        goto done;
    }
no:
    result = Py_NewRef(Py_None);
done:
    PyMem_Free(landed);
    PyMem_Free(seen);
    Py_XDECREF(table);
    Py_XDECREF(raw_obj);
    Py_XDECREF(positions);
    Py_XDECREF(last_pos);
    Py_XDECREF(stmt);
    Py_XDECREF(cur);
    Py_XDECREF(previous);
    return result;
}

/* setup(flags: bytes[256], caches: bytes[256], RESUME, EXTENDED_ARG,
 * the code flags that are never flat) */
static PyObject *
setup(PyObject *self, PyObject *args)
{
    Py_buffer f, c;
    int resume, ext;
    long never;
    if (!PyArg_ParseTuple(args, "y*y*iil", &f, &c, &resume, &ext, &never)) {
        return NULL;
    }
    if (f.len != 256 || c.len != 256 || resume < 0 || resume > 255 || ext < 0 || ext > 255) {
        PyBuffer_Release(&f);
        PyBuffer_Release(&c);
        PyErr_SetString(PyExc_ValueError, "setup: two tables of 256 bytes, two opcodes");
        return NULL;
    }
    memcpy(flags, f.buf, 256);
    memcpy(caches, c.buf, 256);
    PyBuffer_Release(&f);
    PyBuffer_Release(&c);
    resume_op = resume;
    extended_arg_op = ext;
    not_flat_flags = never;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"flat_start", (PyCFunction)(void (*)(void))flat_start, METH_FASTCALL,
     "The code unit after a flat code object's prologue, or None (``_flat``)."},
    {"setup", setup, METH_VARARGS, "The opcode tables ``flat_start`` reads."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "daifu.cells._rewrite._cflat",
    "flat_start in C (daifu.cells._rewrite._flat)", -1, methods,
};

PyMODINIT_FUNC
PyInit__cflat(void)
{
    s_locate = PyUnicode_InternFromString("locate");
    if (s_locate == NULL) {
        return NULL;
    }
    return PyModule_Create(&module);
}
