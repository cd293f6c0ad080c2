/* Captured op sequences: the ops run between _capture_begin and _capture_end are kept on the
 * devices as a Capture, replayed on new inputs by one record per device. */
#include "dtpy.h"

typedef struct {
    PyObject_HEAD
    dt_capture *g;
    PyObject *meshes;  /* tuple: the Python DeviceMesh of each output */
} s_Capture;

static void s_Capture_dealloc(s_Capture *self)
{
    dt_capture_release(&self->g);
    Py_CLEAR(self->meshes);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* A list or tuple of DTensors as handles; n, or -1 with an exception. */
static Py_ssize_t s_tensor_list(const char *fn, PyObject *seq, dt_tensor **out, Py_ssize_t max)
{
    PyObject *fast = PySequence_Fast(seq, "expected a list of DTensors");
    if (!fast)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    if (n > max) {
        Py_DECREF(fast);
        PyErr_Format(PyExc_RuntimeError, "%s: %zd tensors; at most %zd", fn, n, max);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (dtpy_arg_tensor(fn, (int)i, PySequence_Fast_GET_ITEM(fast, i), &out[i]) != 0) {
            Py_DECREF(fast);
            return -1;
        }
    Py_DECREF(fast);
    return n;
}

static PyObject *s_Capture_replay(s_Capture *self, PyObject *inputs)
{
    dt_tensor *in[32], *out[32];
    Py_ssize_t n = s_tensor_list("replay", inputs, in, 32);
    if (n < 0)
        return NULL;
    if (dt_capture_replay(self->g, in, (int)n, out) != 0)
        return dtpy_raise();
    int nout = dt_capture_noutputs(self->g);
    PyObject *tuple = PyTuple_New(nout);
    for (int o = 0; o < nout; o++) {
        PyObject *t = tuple ? dtpy_tensor_wrap(out[o], PyTuple_GET_ITEM(self->meshes, o)) : NULL;
        out[o] = NULL;
        if (!t) {
            for (int p = o + 1; p < nout; p++)
                dt_tensor_release(&out[p]);
            Py_CLEAR(tuple);
            break;
        }
        PyTuple_SET_ITEM(tuple, o, t);
    }
    return tuple;
}

static PyObject *s_Capture_get_num_records(s_Capture *self, void *unused)
{
    return PyLong_FromUnsignedLongLong(dt_capture_nrecords(self->g));
}

static PyObject *s_Capture_get_num_devices(s_Capture *self, void *unused)
{
    return PyLong_FromLong(dt_capture_ndevices(self->g));
}

static PyMethodDef s_Capture_methods[] = {
    {"_replay", (PyCFunction)s_Capture_replay, METH_O, "Run the captured ops on new inputs: a tuple of outputs."},
    {NULL},
};

static PyGetSetDef s_Capture_getset[] = {
    {"num_records", (getter)s_Capture_get_num_records, NULL, "Op records the devices keep, over all of them.", NULL},
    {"num_devices", (getter)s_Capture_get_num_devices, NULL, "Devices that keep records of it.", NULL},
    {NULL},
};

static PyTypeObject s_CaptureType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dtorch._C.Capture",
    .tp_basicsize = sizeof(s_Capture),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)s_Capture_dealloc,
    .tp_methods = s_Capture_methods,
    .tp_getset = s_Capture_getset,
    .tp_doc = "Op records kept on the devices, replayed by one record per device.",
};

/* _capture_begin(name, inputs) */
static PyObject *s_capture_begin(PyObject *mod, PyObject *args)
{
    const char *name;
    PyObject *inputs;
    dt_tensor *in[32];
    if (!PyArg_ParseTuple(args, "sO", &name, &inputs))
        return NULL;
    Py_ssize_t n = s_tensor_list("capture", inputs, in, 32);
    if (n < 0)
        return NULL;
    if (dt_capture_begin(name, in, (int)n) != 0)
        return dtpy_raise();
    Py_RETURN_NONE;
}

/* _capture_end(outputs) -> Capture */
static PyObject *s_capture_end(PyObject *mod, PyObject *outputs)
{
    dt_tensor *out[32];
    Py_ssize_t n = s_tensor_list("capture", outputs, out, 32);
    if (n < 0) {
        dt_capture_abort();
        return NULL;
    }
    PyObject *fast = PySequence_Fast(outputs, "expected a list of DTensors");
    PyObject *meshes = fast ? PyTuple_New(n) : NULL;
    for (Py_ssize_t o = 0; meshes && o < n; o++)
        PyTuple_SET_ITEM(meshes, o, Py_NewRef(((dtpy_Tensor *)PySequence_Fast_GET_ITEM(fast, o))->mesh));
    Py_XDECREF(fast);
    s_Capture *self = meshes ? (s_Capture *)s_CaptureType.tp_alloc(&s_CaptureType, 0) : NULL;
    if (!self) {
        Py_XDECREF(meshes);
        dt_capture_abort();
        return NULL;
    }
    self->meshes = meshes;
    if (dt_capture_end(out, (int)n, &self->g) != 0) {
        Py_DECREF(self);
        return dtpy_raise();
    }
    return (PyObject *)self;
}

static PyObject *s_capture_abort(PyObject *mod, PyObject *unused)
{
    dt_capture_abort();
    Py_RETURN_NONE;
}

static PyObject *s_capture_made(PyObject *mod, PyObject *arg)
{
    dt_tensor *t;
    if (dtpy_arg_tensor("capture", 0, arg, &t) != 0)
        return NULL;
    return PyBool_FromLong(dt_capture_made(t));
}

static PyMethodDef s_methods[] = {
    {"_capture_begin", s_capture_begin, METH_VARARGS, "Start capturing: _capture_begin(name, inputs)."},
    {"_capture_end", s_capture_end, METH_O, "End the capture: _capture_end(outputs) -> Capture."},
    {"_capture_abort", s_capture_abort, METH_NOARGS, "End the capture, keeping nothing."},
    {"_capture_made", s_capture_made, METH_O, "Whether a DTensor was made inside a capture (holds no value)."},
    {NULL},
};

int dtpy_capture_init(PyObject *m)
{
    if (PyType_Ready(&s_CaptureType) < 0)
        return -1;
    return PyModule_AddFunctions(m, s_methods);
}
