/* daifu.hooks._cmain: run the program's main module at the bottom of the
 * stack, as ``python script.py`` runs it.
 *
 * ``python -m daifu script.py`` reaches the script through runpy and
 * daifu's runner: without this, its ``<module>`` frame's ``f_back`` would be
 * the runner's (``python``: None), and everything that walks the stack would
 * show runpy and daifu -- ``inspect.stack()``, ``traceback.format_stack()``,
 * logging's ``stack_info``, faulthandler and tracemalloc, a ``warnings``
 * stack level past the script (python: ``sys:1``), pdb's ``where`` and its
 * ``step`` off the end of the module -- and ``RecursionError`` would come
 * that many frames sooner.
 *
 * ``run(code, globals)`` evaluates ``code`` with the thread's current frame
 * set to none for the time of the call, so that the module's frame has no
 * Python frame below it, and with the Python recursion depth of the frames
 * below (runpy's, daifu's) taken off the count, as if the interpreter had
 * started the script itself.  Both are put back when the code returns or
 * raises: the runner's frames below were never gone, only out of reach.
 *
 * Uses the thread state's fields of CPython 3.11 (``cframe->current_frame``,
 * ``recursion_remaining``) and 3.12+ (``current_frame``,
 * ``py_recursion_remaining``): built per version, like every extension.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *
run(PyObject *module, PyObject *args)
{
    PyObject *code, *globals;
    if (!PyArg_ParseTuple(args, "O!O!:run", &PyCode_Type, &code, &PyDict_Type, &globals)) {
        return NULL;
    }
    PyThreadState *tstate = PyThreadState_Get();
#if PY_VERSION_HEX >= 0x030C0000
    struct _PyInterpreterFrame *below = tstate->current_frame;
    int depth = tstate->py_recursion_limit - tstate->py_recursion_remaining;
    tstate->current_frame = NULL;
    tstate->py_recursion_remaining = tstate->py_recursion_limit;
#else
    struct _PyInterpreterFrame *below = tstate->cframe->current_frame;
    int depth = tstate->recursion_limit - tstate->recursion_remaining;
    tstate->cframe->current_frame = NULL;
    tstate->recursion_remaining = tstate->recursion_limit;
#endif
    PyObject *result = PyEval_EvalCode(code, globals, globals);
#if PY_VERSION_HEX >= 0x030C0000
    tstate->current_frame = below;
    /* (the program may have changed the limit: the depth below is kept) */
    tstate->py_recursion_remaining = tstate->py_recursion_limit - depth;
#else
    tstate->cframe->current_frame = below;
    tstate->recursion_remaining = tstate->recursion_limit - depth;
#endif
    return result;
}

static PyMethodDef methods[] = {
    {"run", run, METH_VARARGS,
     "run(code, globals): exec the main module's code with no Python frame below it"},
    {NULL, NULL, 0, NULL}
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "daifu.hooks._cmain",
    "Run the program's main module at the bottom of the stack.", -1, methods,
};

PyMODINIT_FUNC
PyInit__cmain(void)
{
    return PyModule_Create(&module_def);
}
