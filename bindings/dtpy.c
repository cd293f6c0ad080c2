/* dtorch._C — the Python face of the C API: DTensor and TensorFuture handles, meshes, the
 * factories, the ops of the registry and the runtime calls. Every argument a Python caller
 * gives is checked and converted in C (dtpy_arg.c), with torch's messages; Python in dtorch/
 * keeps torch's signatures and printing. This file is the module itself: its errors, the wait
 * hooks, _register and PyInit__C, which has each file add its part (dtpy.h lists them).
 *
 * Blocking waits release the GIL (wait hooks) and turn Ctrl-C into KeyboardInterrupt. */
#include "dtpy.h"

/* ---- errors ------------------------------------------------------------------------------ */

/* Bad values and bad types are ValueError and TypeError to a Python user, and RuntimeError to
 * code written against PyTorch (which raises RuntimeError for shape and dtype mismatches): the
 * exceptions are both. Likewise a piece that does not fit in memory is a MemoryError and a
 * RuntimeError (torch.OutOfMemoryError is one). */
PyObject *dtpy_value_error, *dtpy_type_error;
static PyObject *s_memory_error;

PyObject *dtpy_raise(void)
{
    int code = dt_last_error_code();
    if (code == DT_EINTR && PyErr_Occurred())
        return NULL; /* the signal handler's exception (KeyboardInterrupt) is already set */
    PyObject *type = PyExc_RuntimeError;
    switch (code) {
    case DT_EINVAL: type = dtpy_value_error; break;
    case DT_ETYPE: type = dtpy_type_error; break;
    case DT_EINDEX: type = PyExc_IndexError; break;
    case DT_ETIMEDOUT: type = PyExc_TimeoutError; break;
    case DT_ENOMEM: type = s_memory_error; break;
    case DT_EINTR: type = PyExc_KeyboardInterrupt; break;
    default: break;
    }
    PyErr_SetString(type, dt_last_error()[0] ? dt_last_error() : "dtorch: unknown error");
    return NULL;
}

/* ---- wait hooks: the GIL is released while the runtime makes us wait ----------------------- */

static _Thread_local PyThreadState *s_saved;

static void s_wait_enter(void) { s_saved = PyEval_SaveThread(); }
static void s_wait_leave(void) { PyEval_RestoreThread(s_saved); }
static bool s_wait_interrupt(void) { return PyErr_CheckSignals() != 0; }

/* ---- the Python classes dtorch registers -------------------------------------------------- */

/* _register(TensorFuture, DeviceMesh, Placement, dtype_code): the classes futures are made as and
 * arguments checked against, and dtype_code(x) -> the code of a dtype-like x (DTensors are made as
 * the C type itself, dtpy_tensor_type) */
static PyObject *s_register(PyObject *mod, PyObject *args)
{
    PyTypeObject *future_cls;
    PyObject *mesh_cls, *placement_cls, *dtype_code;
    if (!PyArg_ParseTuple(args, "O!O!O!O", &PyType_Type, &future_cls, &PyType_Type, &mesh_cls, &PyType_Type,
                          &placement_cls, &dtype_code))
        return NULL;
    if (dtpy_future_set_class(future_cls) != 0)
        return NULL;
    dtpy_arg_set_classes(mesh_cls, placement_cls, dtype_code);
    Py_RETURN_NONE;
}

static PyMethodDef s_methods[] = {
    {"_register", s_register, METH_VARARGS, NULL},
    {NULL},
};

static struct PyModuleDef s_module = {
    PyModuleDef_HEAD_INIT, .m_name = "dtorch._C", .m_doc = "DTorch's C runtime.", .m_size = -1, .m_methods = s_methods,
};

/* dtorch.DTorchValueError, dtorch.DTorchTypeError and dtorch.OutOfMemoryError into m */
static int s_errors_init(PyObject *m)
{
    PyObject *value_bases = PyTuple_Pack(2, PyExc_ValueError, PyExc_RuntimeError);
    PyObject *type_bases = PyTuple_Pack(2, PyExc_TypeError, PyExc_RuntimeError);
    dtpy_value_error = value_bases ? PyErr_NewExceptionWithDoc("dtorch.DTorchValueError",
        "A bad argument value or shape (a ValueError, and a RuntimeError as PyTorch raises).", value_bases, NULL) : NULL;
    dtpy_type_error = type_bases ? PyErr_NewExceptionWithDoc("dtorch.DTorchTypeError",
        "A bad dtype or argument type (a TypeError, and a RuntimeError as PyTorch raises).", type_bases, NULL) : NULL;
    PyObject *memory_bases = PyTuple_Pack(2, PyExc_MemoryError, PyExc_RuntimeError);
    s_memory_error = memory_bases ? PyErr_NewExceptionWithDoc("dtorch.OutOfMemoryError",
        "Not enough memory on a device (a MemoryError, and a RuntimeError as PyTorch raises).", memory_bases, NULL)
                                  : NULL;
    Py_XDECREF(value_bases);
    Py_XDECREF(type_bases);
    Py_XDECREF(memory_bases);
    if (!dtpy_value_error || !dtpy_type_error || !s_memory_error ||
        PyModule_AddObjectRef(m, "DTorchValueError", dtpy_value_error) < 0 ||
        PyModule_AddObjectRef(m, "DTorchTypeError", dtpy_type_error) < 0 ||
        PyModule_AddObjectRef(m, "OutOfMemoryError", s_memory_error) < 0)
        return -1;
    return 0;
}

/* The errors first: the other parts raise them. DTensor comes before the ops, which the registry
 * defines as its methods. */
PyMODINIT_FUNC PyInit__C(void)
{
    PyObject *m = PyModule_Create(&s_module);
    if (!m)
        return NULL;
    if (s_errors_init(m) != 0 || dtpy_mesh_init(m) != 0 || dtpy_future_init(m) != 0 || dtpy_tensor_init(m) != 0 ||
        dtpy_ops_init(m) != 0 || dtpy_factory_init(m) != 0 || dtpy_redistribute_init(m) != 0 ||
        dtpy_capture_init(m) != 0 || dtpy_runtime_init(m) != 0 || dtpy_profiler_init(m) != 0) {
        Py_DECREF(m);
        return NULL;
    }
    dt_set_wait_hooks(s_wait_enter, s_wait_leave, s_wait_interrupt);
    return m;
}
